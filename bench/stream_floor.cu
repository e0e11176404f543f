// The bandwidth floor under quant_qkv: how fast can any kernel read a bf16 Q, K and V and
// write one byte per element (what the quantization must at least move), on this GPU?
// quant_qkv's time is compared with this, not with the datasheet's 3.35 TB/s.
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a bench/stream_floor.cu -o /tmp/sf
//   /tmp/sf B H N D [reps]          e.g. /tmp/sf 4 32 1024 128
//
// Each row: the median over `reps` timed launches, each after a 256 MiB write that evicts L2
// (as triton's do_bench does), in microseconds and in TB/s of bytes read plus bytes written:
//   memcpy      cudaMemcpyAsync of Q, K and V (three copies: read 2 bytes, write 2 per element)
//   read        every 16-byte chunk of Q, K and V loaded and folded into one word per CTA
//   cast-1      one launch, CTAs of 256 threads, each thread converts U chunks of 8 values
//               (all loads issued before the first store) to int8 with one scale
//   cast-3      the same, one launch per tensor (three launches back to back)
//   cast-kv     cast-1's kernel on K and V only (what remains to stream if Q were quantized
//               inside the attention kernel for free)
//   cast-grid   cast-1's work on a persistent grid (k CTAs per SM, grid-stride loop)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"
#include "event_timing.h"


constexpr int kThreads = 256;

// 8 bf16 values (one 16-byte chunk) times s, rounded to int8 with saturation, as 8 bytes.
__device__ __forceinline__ uint2 to_s8x8(uint4 c, float s) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t h = (w[i / 2] >> (16 * (i & 1))) & 0xffffu;
    const float x = __uint_as_float(h << 16) * s;
    int r = __float2int_rn(x);
    r = max(-127, min(127, r));
    out[i / 4] |= (static_cast<uint32_t>(r) & 0xffu) << (8 * (i & 3));
  }
  return make_uint2(out[0], out[1]);
}

struct Three {
  const uint4* in[3];
  uint2* out[3];
};

// One CTA: U * kThreads consecutive chunks of the concatenation of tensors first ..
// first + count - 1 (each `chunks` long).
template <int U>
__global__ void __launch_bounds__(kThreads) cast_once(Three t, int64_t chunks, int first, int count, float s) {
  const int64_t total = count * chunks;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * U * kThreads + threadIdx.x;
  uint4 c[U];
  int64_t idx[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    idx[u] = base + static_cast<int64_t>(u) * kThreads;
    if (idx[u] < total) {
      const int k = static_cast<int>(idx[u] / chunks);
      c[u] = __ldcs(t.in[first + k] + (idx[u] - k * chunks));
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u) {
    if (idx[u] < total) {
      const int k = static_cast<int>(idx[u] / chunks);
      t.out[first + k][idx[u] - k * chunks] = to_s8x8(c[u], s);
    }
  }
}

// cast_once's work from a persistent grid: CTA b takes rounds b, b + gridDim.x, ...
template <int U>
__global__ void __launch_bounds__(kThreads) cast_grid(Three t, int64_t chunks, float s) {
  const int64_t total = 3 * chunks, per = static_cast<int64_t>(U) * kThreads;
  for (int64_t r = blockIdx.x; r * per < total; r += gridDim.x) {
    uint4 c[U];
    int64_t idx[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      idx[u] = r * per + threadIdx.x + static_cast<int64_t>(u) * kThreads;
      if (idx[u] < total) c[u] = __ldcs(t.in[idx[u] / chunks] + idx[u] % chunks);
    }
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (idx[u] < total) t.out[idx[u] / chunks][idx[u] % chunks] = to_s8x8(c[u], s);
  }
}

// Reads only: each thread folds its chunks with XOR, one word per CTA written.
template <int U>
__global__ void __launch_bounds__(kThreads) read_once(Three t, int64_t chunks, uint32_t* sink) {
  const int64_t total = 3 * chunks;
  const int64_t base = static_cast<int64_t>(blockIdx.x) * U * kThreads + threadIdx.x;
  uint32_t acc = 0u;
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t i = base + static_cast<int64_t>(u) * kThreads;
    if (i < total) {
      const uint4 c = __ldcs(t.in[i / chunks] + i % chunks);
      acc ^= c.x ^ c.y ^ c.z ^ c.w;
    }
  }
  acc = __reduce_xor_sync(0xffffffffu, acc);
  if (threadIdx.x % 32 == 0 && acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // (keeps the loads)
}

__global__ void fill(uint4* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    // bf16 values in about [-4, 4]: sign, exponent 126-129, random mantissa
    uint32_t w[4];
    for (int j = 0; j < 4; ++j) {
      x = x * 1664525u + 1013904223u;
      const uint32_t lo = ((x >> 9) & 0x8000u) | ((126u + ((x >> 3) & 3u)) << 7) | (x & 0x7fu);
      x = x * 1664525u + 1013904223u;
      const uint32_t hi = ((x >> 9) & 0x8000u) | ((126u + ((x >> 3) & 3u)) << 7) | (x & 0x7fu);
      w[j] = lo | (hi << 16);
    }
    p[i] = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

int main(int argc, char** argv) {
  if (argc < 5) {
    std::fprintf(stderr, "usage: %s B H N D [reps]\n", argv[0]);
    return 2;
  }
  const int64_t B = std::atoll(argv[1]), H = std::atoll(argv[2]), N = std::atoll(argv[3]), D = std::atoll(argv[4]);
  const int reps = argc > 5 ? std::atoi(argv[5]) : 30;
  const int64_t elems = B * H * N * D;
  if (elems % 8 != 0) {
    std::fprintf(stderr, "B*H*N*D must be a multiple of 8\n");
    return 2;
  }
  const int64_t chunks = elems / 8;
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));

  Three t{};
  std::vector<void*> bufs;
  for (int i = 0; i < 3; ++i) {
    void *in = nullptr, *out = nullptr;
    CHECK(cudaMalloc(&in, elems * 2));
    CHECK(cudaMalloc(&out, elems));
    fill<<<4 * sms, 256>>>(static_cast<uint4*>(in), chunks, 0x1234u + i);
    t.in[i] = static_cast<const uint4*>(in);
    t.out[i] = static_cast<uint2*>(out);
    bufs.push_back(in), bufs.push_back(out);
  }
  void* copy = nullptr;
  CHECK(cudaMalloc(&copy, elems * 2));
  uint32_t* sink = nullptr;
  CHECK(cudaMalloc(&sink, 4 << 20));
  CHECK(cudaDeviceSynchronize());

  const L2Evict evict;
  auto timed = [&](const char* name, double bytes, auto&& launch) {
    const double us = 1e3 * median_ms(reps, evict, launch, 3);
    std::printf("| %lld | %lld | %lld | %lld | %-16s | %9.1f | %6.2f |\n", (long long)B, (long long)H,
                (long long)N, (long long)D, name, us, bytes / us * 1e-6);
    std::fflush(stdout);
  };
  const double in_b = 3.0 * elems * 2, out_b = 3.0 * elems;
  const float s = 25.f;
  std::printf("| B | H | N | D | kernel | us | TB/s |\n|---|---|---|---|---|---|---|\n");
  timed("memcpy", 2 * in_b, [&] {
    for (int i = 0; i < 3; ++i)
      CHECK(cudaMemcpyAsync(copy, t.in[i], elems * 2, cudaMemcpyDeviceToDevice));
  });
  timed("read U=4", in_b, [&] {
    const int64_t per = 4 * kThreads;
    read_once<4><<<static_cast<unsigned>((3 * chunks + per - 1) / per), kThreads>>>(t, chunks, sink);
  });
  auto cast1 = [&](auto u, int first = 0, int count = 3) {
    constexpr int U = decltype(u)::value;
    const int64_t per = static_cast<int64_t>(U) * kThreads;
    cast_once<U><<<static_cast<unsigned>((count * chunks + per - 1) / per), kThreads>>>(t, chunks, first, count, s);
  };
  timed("cast-1 U=2", in_b + out_b, [&] { cast1(std::integral_constant<int, 2>{}); });
  timed("cast-1 U=4", in_b + out_b, [&] { cast1(std::integral_constant<int, 4>{}); });
  timed("cast-1 U=8", in_b + out_b, [&] { cast1(std::integral_constant<int, 8>{}); });
  timed("cast-3 U=4", in_b + out_b, [&] {
    const int64_t per = 4 * kThreads;
    for (int i = 0; i < 3; ++i)
      cast_once<4><<<static_cast<unsigned>((chunks + per - 1) / per), kThreads>>>(t, chunks, i, 1, s);
  });
  for (auto u : {4, 8}) {
    char name[32];
    std::snprintf(name, sizeof name, "cast-kv U=%d", u);
    timed(name, (in_b + out_b) * 2 / 3, [&] {
      if (u == 4) cast1(std::integral_constant<int, 4>{}, 1, 2);
      else cast1(std::integral_constant<int, 8>{}, 1, 2);
    });
  }
  for (int k : {4, 8}) {
    char name[32];
    std::snprintf(name, sizeof name, "cast-grid %dx U=4", k);
    timed(name, in_b + out_b, [&] { cast_grid<4><<<k * sms, kThreads>>>(t, chunks, s); });
  }
  for (void* p : bufs) CHECK(cudaFree(p));
  return 0;
}

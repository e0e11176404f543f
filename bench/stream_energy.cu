// Joules of a memory-bound pass against the number of SMs it runs on (bench/stream_energy.py).
//
// The question: quant_qkv streams Q, K and V once (bf16 in, one byte per element out) and on an
// H100 draws about the board's 700 W cap while it does (bench/NOTES.md, "where the joules go"),
// far more than DRAM traffic alone costs. If most of that is SMs clocked and waiting, the same
// bytes moved by fewer SMs in the same time would cost fewer joules, and under the power cap
// those joules are the attention's clock.
//
// One kernel: each CTA (1024 threads, one per SM: it asks for most of the shared memory) walks
// 16-byte chunks of three bf16 tensors at a grid stride, U chunks per thread loaded before the
// first store, converts each 8 values to int8 with one scale and stores 8 bytes. A C entry point
// for ctypes (no torch headers):
//
//   nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode arch=compute_90a,code=sm_90a \
//        bench/stream_energy.cu -o /tmp/stream_energy.so
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 1024;

__device__ __forceinline__ uint2 to_s8x8(uint4 c, float s) {
  const uint32_t w[4] = {c.x, c.y, c.z, c.w};
  uint32_t out[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const uint32_t h = (w[i / 2] >> (16 * (i & 1))) & 0xffffu;
    int r = __float2int_rn(__uint_as_float(h << 16) * s);
    r = max(-127, min(127, r));
    out[i / 4] |= (static_cast<uint32_t>(r) & 0xffu) << (8 * (i & 3));
  }
  return make_uint2(out[0], out[1]);
}

struct Three {
  const uint4* in[3];
  uint2* out[3];
};

template <int U>
__global__ void __launch_bounds__(kThreads, 1) cast_sms(Three t, int64_t chunks, float s) {
  const int64_t total = 3 * chunks, per = static_cast<int64_t>(U) * kThreads;
  for (int64_t r = blockIdx.x; r * per < total; r += gridDim.x) {
    uint4 c[U];
    int64_t idx[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      idx[u] = r * per + u * kThreads + threadIdx.x;
      if (idx[u] < total) {
        const int w = static_cast<int>(idx[u] / chunks);
        const uint4* src = w == 0 ? t.in[0] : w == 1 ? t.in[1] : t.in[2];  // no local copy of t
        c[u] = src[idx[u] - w * chunks];
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      if (idx[u] < total) {
        const int w = static_cast<int>(idx[u] / chunks);
        uint2* dst = w == 0 ? t.out[0] : w == 1 ? t.out[1] : t.out[2];
        dst[idx[u] - w * chunks] = to_s8x8(c[u], s);
      }
    }
  }
}

}  // namespace

// q, k, v: bf16, `elements` each (a multiple of 8); outputs: int8, as many. `ctas` CTAs, one per
// SM. Returns a cudaError_t.
extern "C" int stream_cast(const void* q, const void* k, const void* v, void* oq, void* ok, void* ov,
                           long long elements, int ctas, int unroll, long long stream) {
  Three t{{static_cast<const uint4*>(q), static_cast<const uint4*>(k), static_cast<const uint4*>(v)},
          {static_cast<uint2*>(oq), static_cast<uint2*>(ok), static_cast<uint2*>(ov)}};
  const int64_t chunks = elements / 8;
  const int smem = 160 * 1024;  // dynamic shared memory, unused: no second CTA fits beside it
  auto s = reinterpret_cast<cudaStream_t>(stream);
  cudaError_t e;
  if (unroll == 4) {
    e = cudaFuncSetAttribute(cast_sms<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) cast_sms<4><<<ctas, kThreads, smem, s>>>(t, chunks, 0.5f);
  } else {
    e = cudaFuncSetAttribute(cast_sms<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e == cudaSuccess) cast_sms<8><<<ctas, kThreads, smem, s>>>(t, chunks, 0.5f);
  }
  return e != cudaSuccess ? static_cast<int>(e) : static_cast<int>(cudaGetLastError());
}

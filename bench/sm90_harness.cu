// Times the Hopper attention kernel alone, without torch or the quantization (with the tile
// counter where the op would use one, zeroed before each launch): random int8 Q
// and K, e4m3 V^T and scales in the layouts quant_qkv writes, then the median of N launches.
// For kernel experiments (build variants with -D flags and compare them in one device call):
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DSAGE_SM90 -DSAGE_FP8 \
//     -Icsrc/kernels bench/sm90_harness.cu csrc/kernels/attn_sm90_host.cu \
//     csrc/kernels/attn_sm90_d64.cu csrc/kernels/attn_sm90_d96.cu csrc/kernels/attn_sm90_d128.cu \
//     csrc/kernels/attn_sm90_d192.cu csrc/kernels/attn_sm90_d256.cu -o /tmp/h
//   /tmp/h D B H N [causal] [iters]      e.g. /tmp/h 128 1 32 16384
//
// Prints the kernel's median time and TOPS (4*B*H*N^2*D operations, halved when causal).
// SAGE_HARNESS_DOUT=96 with D=128 (or 192 with D=256): a head dim of 96 zero-padded to 128, as
// sageattn passes it (the kernel then computes 96 columns, or all 128 with
// SAGEATTN_SM90_NARROW=0: same checksum; likewise 192 of 256).
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "launch.h"
#include "cuda_check.h"
#include "event_timing.h"
#include "harness_args.h"
#include "hash_mix.cuh"

// bytes: mode 0 int8 in [-127, 127]; mode 1 e4m3 with |x| <= 2^7 (never the NaN pattern)
__global__ void fill_bytes(uint8_t* x, int64_t n, uint64_t seed, int mode) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint32_t r = mix(i * 0x9e3779b97f4a7c15ull + seed);
    x[i] = mode == 0 ? static_cast<uint8_t>(static_cast<int8_t>(int(r % 255) - 127)) : static_cast<uint8_t>(r & 0xf7);
  }
}

// zero the padding of a head dim dout < D: columns dout.. of rows of D bytes (Q, K), or whole
// rows r % D >= dout of V^T (rows of `cols` bytes)
__global__ void zero_cols(uint8_t* x, int64_t rows, int d, int dout) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * d; i += int64_t(gridDim.x) * blockDim.x)
    if (i % d >= dout) x[i] = 0;
}
__global__ void zero_rows(uint8_t* x, int64_t rows, int64_t cols, int d, int dout) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < rows * cols; i += int64_t(gridDim.x) * blockDim.x)
    if ((i / cols) % d >= dout) x[i] = 0;
}

__global__ void fill_f32(float* x, int64_t n, float v) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) x[i] = v;
}

// v times a factor in [3/4, 5/4) that differs from index to index: scales that tell a kernel
// reading another block's scale from one reading its own (the checksum below moves)
__global__ void fill_f32_spread(float* x, int64_t n, float v, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    x[i] = v * (0.75f + 0.5f * float(mix(i * 0x9e3779b97f4a7c15ull + seed) & 0xffffu) / 65536.f);
}

int main(int argc, char** argv) {
  const HarnessArgs args = harness_args(argc, argv, "causal", 20);
  const int D = args.d, B = args.b, H = args.h, N = args.n, causal = args.sw, iters = args.iters;
  const char* dout_env = std::getenv("SAGE_HARNESS_DOUT");
  const int DO = dout_env && std::atoi(dout_env) > 0 && std::atoi(dout_env) < D ? std::atoi(dout_env) : D;
  const int nq_pad = (N + 127) / 128 * 128, nk_pad = nq_pad;
  const int64_t nqk = int64_t(B) * H * nq_pad * D;
  int8_t *q, *k;
  uint8_t* v;
  float *qs, *ks, *vs;
  uint16_t* o;
  CHECK(cudaMalloc(&q, nqk));
  CHECK(cudaMalloc(&k, nqk));
  // SAGE_HARNESS_VTERMS=2: V^T as two e4m3 terms (the kernel's VX = 2)
  const char* vt_env = std::getenv("SAGE_HARNESS_VTERMS");
  const int vterms = vt_env && std::atoi(vt_env) == 2 ? 2 : 1;
  CHECK(cudaMalloc(&v, int64_t(B) * H * vterms * D * nk_pad));
  const int64_t nqs = int64_t(B) * H * (nq_pad / sage::kAttnWarpQ) * 8, nks = int64_t(B) * H * (nk_pad / sage::kAttnBlockK) * 4;
  CHECK(cudaMalloc(&qs, nqs * 4));
  CHECK(cudaMalloc(&ks, nks * 4));
  CHECK(cudaMalloc(&vs, int64_t(B) * H * D * 4));
  CHECK(cudaMalloc(&o, int64_t(B) * H * N * DO * 2));
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(q), nqk, 1, 0);
  fill_bytes<<<1024, 256>>>(reinterpret_cast<uint8_t*>(k), nqk, 2, 0);
  fill_bytes<<<1024, 256>>>(v, int64_t(B) * H * vterms * D * nk_pad, 3, 1);
  // scores of a few units in the log2 domain: std(q.k) ~ sqrt(D) * 127^2 / 3
  const float sc = std::sqrt(3.f / (std::sqrt(float(D)) * 127.f * 127.f / 3.f));
  fill_f32<<<256, 256>>>(qs, nqs, sc);
  fill_f32_spread<<<256, 256>>>(ks, nks, sc, 4);
  fill_f32<<<256, 256>>>(vs, int64_t(B) * H * D, 1.f / 448.f);
  if (DO < D) {
    zero_cols<<<1024, 256>>>(reinterpret_cast<uint8_t*>(q), nqk / D, D, DO);
    zero_cols<<<1024, 256>>>(reinterpret_cast<uint8_t*>(k), nqk / D, D, DO);
    zero_rows<<<1024, 256>>>(v, int64_t(B) * H * vterms * D, nk_pad, D, DO);
  }
  CHECK(cudaDeviceSynchronize());

  sage::AttnParams p{};
  p.q = q, p.k = k, p.v = v, p.v_dtype = sage::DType::kBFloat16;
  p.q_scale = qs, p.k_scale = ks, p.q_groups = 8, p.k_groups = 4, p.v_scale = vs, p.v_mean = nullptr;
  p.o = o, p.o_dtype = sage::DType::kBFloat16;
  p.o_stride_n = DO, p.o_stride_h = int64_t(N) * DO, p.o_stride_b = int64_t(H) * N * DO, p.d_out = DO;
  p.lse = nullptr, p.lse_add = nullptr;
  p.batch = B, p.heads_q = H, p.heads_kv = H, p.nq = N, p.nk = N, p.nq_pad = nq_pad, p.nk_pad = nk_pad;
  p.causal = causal, p.accum = sage::PVAccum::kFp32Fp32, p.v_terms = vterms;

  // the dynamic schedule's counter, where the call would use one (zeroed before each launch)
  const int ints = sage::attn_sm90_scratch_ints(p, D);
  if (ints > 0) CHECK(cudaMalloc(&p.tile_counter, ints * sizeof(int)));
  auto reset = [&]() {
    if (ints > 0) CHECK(cudaMemsetAsync(p.tile_counter, 0, ints * sizeof(int)));
  };

  reset();
  CHECK(sage::attn_sm90(p, D, nullptr));  // warm-up
  CHECK(cudaDeviceSynchronize());
  const double t = median_ms(iters, [&](int) { reset(); }, [&] { CHECK(sage::attn_sm90(p, D, nullptr)); }) * 1e-3;
  const double ops = 4.0 * B * H * double(N) * N * DO * (causal ? 0.5 : 1.0);
  // a checksum, to tell a variant that computes something else from one that is faster
  std::vector<uint16_t> host(static_cast<size_t>(B) * H * N * DO);
  CHECK(cudaMemcpy(host.data(), o, host.size() * 2, cudaMemcpyDeviceToHost));
  double sum = 0;
  for (uint16_t x : host) {
    const uint32_t f = static_cast<uint32_t>(x) << 16;
    float v;
    std::memcpy(&v, &f, 4);
    sum += std::fabs(v);
  }
  std::printf("D=%d (of %d) B=%d H=%d N=%d causal=%d v_terms=%d: %.1f us, %.0f TOPS, mean |o| %.6g\n", DO, D, B, H, N, causal, vterms, t * 1e6,
              ops / t * 1e-12, sum / host.size());
  return 0;
}

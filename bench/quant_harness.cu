// Times quant_qkv alone (all of its launches), or followed by the Hopper attention kernel as in
// a sageattn call, without torch: bf16 Q, K and V with Gaussian-like values (K with a
// per-channel bias, as the baseline inputs), the op's outputs in the layouts the Hopper path
// asks for (Q groups 8, K groups 4, K smoothed, V's scale sampled), then the median of N calls,
// each after a 256 MiB write that evicts L2. For quantization experiments (build variants with
// -D flags and compare them in one device call):
//
//   nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -DSAGE_SM90 -DSAGE_FP8 \
//     -Icsrc/kernels bench/quant_harness.cu csrc/kernels/quant_qkv.cu csrc/kernels/attn_sm90_host.cu \
//     csrc/kernels/attn_sm90_d64.cu csrc/kernels/attn_sm90_d96.cu csrc/kernels/attn_sm90_d128.cu \
//     csrc/kernels/attn_sm90_d192.cu csrc/kernels/attn_sm90_d256.cu -o /tmp/qh
//   /tmp/qh D B H N [v_full] [iters]      e.g. /tmp/qh 128 4 32 1024
//
// v_full: 1 = the statistics read all of V, 0 (default, what sageattn asks for) = the sample
// only (V's fallback, if any, in the quantization kernel).
// Prints, in µs (medians): the op; the attention alone (on the op's outputs); both back to back
// as sageattn runs them (the attention launched with programmatic dependent launch, so it may
// start while the op ends) and with an L2-evicting write between them, then the bytes the op
// moves over its time and a checksum of every output (equal checksums: the same bytes,
// whatever the variant).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cuda_check.h"
#include "event_timing.h"
#include "harness_args.h"
#include "hash_mix.cuh"
#include "launch.h"

// x[i] ~ the sum of four uniforms in [-1, 1) (mean 0, variance 4/3), plus bias * (channel % 7)
__global__ void fill_bf16(uint16_t* x, int64_t n, int d, uint64_t seed, float bias) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    float s = bias * static_cast<float>((i % d) % 7);
    for (int u = 0; u < 4; ++u) s += static_cast<float>(mix((i * 4 + u) * 0x9e3779b97f4a7c15ull + seed) >> 8) * 0x1p-23f - 1.f;
    const uint32_t f = __float_as_uint(s);
    x[i] = static_cast<uint16_t>((f + 0x7fffu + ((f >> 16) & 1u)) >> 16);  // round to nearest even
  }
}

// the GPU's clock (ns) into t[i]: one thread, a plain launch, so it runs once all before it is done
__global__ void stamp(uint64_t* t, int i) {
  uint64_t x;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(x));
  t[i] = x;
}

template <typename T>
static T* alloc(int64_t count) {
  T* p = nullptr;
  CHECK(cudaMalloc(&p, std::max<int64_t>(count, 1) * sizeof(T)));
  return p;
}

template <typename T>
static double checksum(const T* dev, int64_t count) {
  std::vector<T> h(static_cast<size_t>(count));
  CHECK(cudaMemcpy(h.data(), dev, count * sizeof(T), cudaMemcpyDeviceToHost));
  double s = 0;
  for (int64_t i = 0; i < count; ++i) s += static_cast<double>(h[i]) * static_cast<double>(1 + i % 13);
  return s;
}

int main(int argc, char** argv) {
  const HarnessArgs args = harness_args(argc, argv, "v_full: 0/1", 30);
  const int D = args.d, B = args.b, H = args.h, N = args.n, vf = args.sw, iters = args.iters;
  const int dp = D <= 64 ? 64 : (D <= 128 ? 128 : 256);
  const int n_pad = (N + 127) / 128 * 128;
  const int64_t elems = int64_t(B) * H * N * D, bh = int64_t(B) * H;
  const bool v_full = vf != 0;

  uint16_t *q = alloc<uint16_t>(elems), *k = alloc<uint16_t>(elems), *v = alloc<uint16_t>(elems);
  fill_bf16<<<1024, 256>>>(q, elems, D, 1, 0.f);
  fill_bf16<<<1024, 256>>>(k, elems, D, 2, 1.f);
  fill_bf16<<<1024, 256>>>(v, elems, D, 3, 0.f);

  sage::QuantQKVParams p{};
  const sage::Input4D in{nullptr, sage::DType::kBFloat16, int64_t(H) * N * D, int64_t(N) * D, D, B, H, N, D};
  p.q = in, p.k = in, p.v = in;
  p.q.data = q, p.k.data = k, p.v.data = v;
  p.nq_pad = n_pad, p.nk_pad = n_pad, p.d_pad = dp;
  p.q_prescale = 1.4426950f / std::sqrt(static_cast<float>(D));
  p.q_groups = 8, p.k_groups = 4, p.v_scale_max = 448.f, p.v_terms = 1;
  p.q_out = alloc<int8_t>(bh * n_pad * dp);
  p.q_scale = alloc<float>(bh * n_pad / sage::kAttnWarpQ * 8);
  p.q_rowdot = nullptr;
  p.k_out = alloc<int8_t>(bh * n_pad * dp);
  p.k_scale = alloc<float>(bh * n_pad / sage::kAttnBlockK * 4);
  p.k_mean = alloc<float>(bh * D);
  p.v_out = alloc<uint8_t>(bh * dp * n_pad);
  p.v_scale = alloc<float>(bh * dp);
  p.v_mean = nullptr;
  p.v_inv = alloc<float>(bh * dp);
  p.v_full = v_full;
  p.v_over = v_full ? nullptr : alloc<uint32_t>(bh * dp * 33 / 32);

  // the attention kernel on the op's outputs, as _cuda.forward calls it (non-causal, HND)
  sage::AttnParams a{};
  a.q = p.q_out, a.k = p.k_out, a.v = p.v_out, a.v_dtype = sage::DType::kBFloat16;
  a.q_scale = p.q_scale, a.k_scale = p.k_scale, a.q_groups = 8, a.k_groups = 4, a.v_scale = p.v_scale;
  a.v_terms = 1, a.v_mean = nullptr;
  a.o = alloc<uint16_t>(elems), a.o_dtype = sage::DType::kBFloat16;
  a.o_stride_n = D, a.o_stride_h = int64_t(N) * D, a.o_stride_b = int64_t(H) * N * D, a.d_out = D;
  a.lse = nullptr, a.lse_add = nullptr;
  a.batch = B, a.heads_q = H, a.heads_kv = H, a.nq = N, a.nk = N, a.nq_pad = n_pad, a.nk_pad = n_pad;
  a.causal = 0, a.accum = sage::PVAccum::kFp32Fp32, a.tile_counter = nullptr;
  if (sage::attn_sm90_scratch_ints(a, dp) > 0) {
    std::fprintf(stderr, "this shape wants the attention's tile counter; not modelled here\n");
    return 2;
  }

  const L2Evict evict;
  auto median_us = [&](bool op, bool attn, bool flush_between = false) {
    return 1e3 * median_ms(iters, evict, [&] {
      if (op) CHECK(sage::quant_qkv(p, nullptr));
      if (flush_between) evict(1);  // (alone: its time)
      if (attn) CHECK(sage::attn_sm90(a, dp, nullptr));
    });
  };
  CHECK(sage::quant_qkv(p, nullptr));  // warm-up
  CHECK(sage::attn_sm90(a, dp, nullptr));
  CHECK(cudaDeviceSynchronize());
  const double t_op = median_us(true, false), t_attn = median_us(false, true), t_call = median_us(true, true);
  // the same with a 256 MiB write between the two (no overlap, and the attention's inputs out of
  // L2), less that write's time alone
  const double t_flush = median_us(false, false, true), t_sep = median_us(true, true, true) - t_flush;
  const double t = t_op * 1e-6;
  // QH_STAMPS=1: the op's and the attention's times from GPU clock stamps between them (plain
  // one-thread launches), when alone and when one follows the other
  if (const char* st = std::getenv("QH_STAMPS"); st && std::atoi(st)) {
    uint64_t* ts = alloc<uint64_t>(4);
    cudaEvent_t e0, e1;  // (events around the stamps: both clocks on the same run)
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    std::vector<double> alone(iters), alone_ev(iters), op_seq(iters), attn_seq(iters);
    for (int i = 0; i < iters; ++i) {
      uint64_t h[4];
      float ms = 0.f;
      evict(i);
      CHECK(cudaEventRecord(e0));
      stamp<<<1, 1>>>(ts, 0);
      CHECK(sage::quant_qkv(p, nullptr));
      stamp<<<1, 1>>>(ts, 1);
      CHECK(cudaEventRecord(e1));
      CHECK(cudaMemcpy(h, ts, 16, cudaMemcpyDeviceToHost));
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      alone[i] = (h[1] - h[0]) * 1e-3, alone_ev[i] = ms * 1e3;
      evict(i);
      stamp<<<1, 1>>>(ts, 0);
      CHECK(sage::quant_qkv(p, nullptr));
      stamp<<<1, 1>>>(ts, 1);
      CHECK(sage::attn_sm90(a, dp, nullptr));
      stamp<<<1, 1>>>(ts, 2);
      CHECK(cudaMemcpy(h, ts, 24, cudaMemcpyDeviceToHost));
      op_seq[i] = (h[1] - h[0]) * 1e-3, attn_seq[i] = (h[2] - h[1]) * 1e-3;
    }
    for (auto* v : {&alone, &alone_ev, &op_seq, &attn_seq}) std::sort(v->begin(), v->end());
    std::printf("stamps: op alone %.1f (events around its two stamps %.1f); op then attn %.1f + %.1f us\n",
                alone[iters / 2], alone_ev[iters / 2], op_seq[iters / 2], attn_seq[iters / 2]);
  }
  const double bytes = 3.0 * elems * 2 + 3.0 * elems;  // read bf16 Q, K, V; write a byte per element
  const double sum = checksum(p.q_out, bh * n_pad * dp) + checksum(p.k_out, bh * n_pad * dp) +
                     checksum(p.v_out, bh * dp * n_pad) + checksum(p.q_scale, bh * n_pad / sage::kAttnWarpQ * 8) +
                     checksum(p.k_scale, bh * n_pad / sage::kAttnBlockK * 4) + checksum(p.v_scale, bh * dp) +
                     checksum(p.k_mean, bh * D);
  std::printf("D=%d B=%d H=%d N=%d v_full=%d: op %.1f, attn %.1f, op+attn %.1f us (overlap %.1f; with a flush "
              "between %.1f); op %.2f TB/s, checksum %.10g\n", D, B, H, N, int(v_full), t_op, t_attn, t_call,
              t_op + t_attn - t_call, t_sep, bytes / t * 1e-12, sum);
  return 0;
}

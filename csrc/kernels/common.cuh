// Small device helpers shared by the quantization and attention kernels.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <utility>

#include <cuda_runtime.h>

#include "launch.h"
#include "ptx.cuh"

namespace sage {

// Launches `kernel` with programmatic dependent launch allowed: on sm_90 and newer it may
// start (and run up to its pdl_wait()) while the previous kernel of the stream finishes. Only
// for kernels that call pdl_wait() before any global-memory access. SAGEATTN_NO_PDL=1 in the
// environment (read once per process) launches them plainly, for comparisons and debugging.
// launch_pdl_cluster also groups the CTAs in clusters of `cluster` along x (1: none).
inline cudaLaunchAttribute cluster_attr(unsigned x) {
  cudaLaunchAttribute a{};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x, a.val.clusterDim.y = 1, a.val.clusterDim.z = 1;
  return a;
}
template <typename... Params, typename... Args>
cudaError_t launch_pdl_cluster(unsigned cluster, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                               cudaStream_t stream, Args&&... args) {
  static const bool off = [] {
    const char* e = std::getenv("SAGEATTN_NO_PDL");
    return e != nullptr && *e != '\0' && *e != '0';
  }();
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid, cfg.blockDim = block, cfg.dynamicSmemBytes = smem, cfg.stream = stream;
  cudaLaunchAttribute attrs[2]{};
  unsigned n = 0;
  if (!off) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster > 1) attrs[n++] = cluster_attr(cluster);
  cfg.attrs = attrs, cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                       Args&&... args) {
  return launch_pdl_cluster(1u, kernel, grid, block, smem, stream, std::forward<Args>(args)...);
}

// n / d and n % d for 0 <= n < 2^31 by a multiply-high, an add and a shift instead of a
// division (~25 instructions, more for 64-bit operands), with d >= 1 fixed at launch: m and s
// as in Granlund and Montgomery's division by invariant integers, s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1, so that n / d = (mulhi(n, m) + n) >> s. Built on the host
// (FastDiv::of, 1 <= d <= 2^31), used on the device; tests/cpp/fast_div.cu checks it.
struct FastDiv {
  uint32_t d, m, s;
  static FastDiv of(uint32_t d) {
    uint32_t s = 0;
    while ((uint64_t{1} << s) < d) ++s;
    return {d, static_cast<uint32_t>((uint64_t{1} << 32) * ((uint64_t{1} << s) - d) / d + 1), s};
  }
  __host__ __device__ __forceinline__ uint32_t div(uint32_t n) const {
#ifdef __CUDA_ARCH__
    const uint32_t hi = __umulhi(n, m);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
    return (hi + n) >> s;
  }
  __host__ __device__ __forceinline__ uint32_t mod(uint32_t n, uint32_t q) const { return n - q * d; }
};

constexpr float kAmaxEps = 1e-12f;  // an all-zero group still gets a finite scale
constexpr float kLn2 = 0.6931471805599453f;

// Symmetric INT8 of t (a value times its group's inverse scale): round half away from zero,
// saturated to +-127, NaN to +-127 by its sign bit. Two spellings of one function, equal on
// every float (tests/cpp/int8_round.cu runs all 2^32 of them): int8_round, the plain one
// (quant_int8.cu; the reference's arithmetic: floor(|t| + 0.5) with that add rounded to
// nearest), and int8_code, the code as the low byte of a word from five full-rate fp32 / logic
// instructions, no FRND or F2I (quant_qkv.cu).
__device__ __forceinline__ int8_t int8_round(float t) {
  const float r = fminf(floorf(__fadd_rn(fabsf(t), 0.5f)), 127.f);
  return static_cast<int8_t>(static_cast<int>(copysignf(r, t)));
}
__device__ __forceinline__ uint32_t int8_code(float t) {
  constexpr float k3p22 = 12582912.f;                         // 1.5 * 2^23
  const float a = fminf(__fadd_rn(fabsf(t), 0.5f), 127.5f);  // floor(a) = min(floor(|t| + 0.5), 127)
  // a + k rounded down is k + floor(a), where k = 1.5 * 2^23 with t's sign: for t < 0 that is
  // -(1.5 * 2^23 - floor(a)). Its magnitude lies in [2^23, 2^24), where floats are the integers
  // and the low mantissa bits count them, so the word's low byte is floor(a) for t >= 0 and
  // -floor(a) in two's complement for t < 0.
  return __float_as_uint(__fadd_rd(a, copysignf(k3p22, t))) & 0xffu;
}

// Eight consecutive elements of a row as floats; columns >= d read as zero. `vec` says the
// row pointer and d allow one 16-byte load per eight elements.
template <typename T>
__device__ __forceinline__ void load8(const T* row, int col0, int d, bool vec, float (&v)[8]) {
  if (vec && col0 + 8 <= d) {
    const uint4 u = *reinterpret_cast<const uint4*>(row + col0);
    const T* e = reinterpret_cast<const T*>(&u);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = (col0 + i < d) ? to_float(row[col0 + i]) : 0.f;
  }
}

// True when 16-byte loads of eight elements at any row start are aligned.
template <typename T>
__device__ __forceinline__ bool vec_ok(const void* base, int64_t sb, int64_t sh, int64_t sn, int d) {
  constexpr int per16 = 16 / sizeof(T);
  return (reinterpret_cast<uintptr_t>(base) % 16 == 0) && sb % per16 == 0 && sh % per16 == 0 &&
         sn % per16 == 0 && d % per16 == 0;
}

// Batch entry b of an input: the element offset of its first row and its row count (packed
// sequences: Input4D::seqs; counts outside [0, n] are clamped, so no row past n is read).
__device__ __forceinline__ int64_t entry_offset(const Input4D& in, int b) {
  return in.seqs ? static_cast<int64_t>(in.seqs[b]) * in.stride_n : static_cast<int64_t>(b) * in.stride_b;
}
__device__ __forceinline__ int entry_rows(const Input4D& in, int b) {
  return in.seqs ? min(max(in.seqs[in.batch + b], 0), in.n) : in.n;
}

// Combines eight per-channel partials across the lanes 4, 8 and 16 apart (the eight token
// chains of a warp whose lane % 4 picks the channel group), with `op` (sum, max or min).
template <typename Op>
__device__ __forceinline__ void reduce_token_chains(float (&a)[8], Op op) {
#pragma unroll
  for (int off = 4; off < 32; off <<= 1)
#pragma unroll
    for (int i = 0; i < 8; ++i) a[i] = op(a[i], __shfl_xor_sync(0xffffffffu, a[i], off));
}
struct OpAdd {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct OpMax {
  __device__ float operator()(float x, float y) const { return fmaxf(x, y); }
};
struct OpMin {
  __device__ float operator()(float x, float y) const { return fminf(x, y); }
};

// Per-channel statistics of a CTA whose threads hold 8-channel partials of token chains
// (lane % 4 picks the channel group; quant_fp8.cu, quant_qkv.cu), in two steps around the
// caller's __syncthreads:
//  1. chains_to_shared: the warp's chains combined (reduce_token_chains), lanes 0-3 store the
//     warp's 32 channels in row `warp` of `red`;
//  2. warps_in_order: channel c's total over the warps, from `init` and warp 0 upwards (a
//     fixed order: the sums are the same bits in every kernel that uses these).
template <int kChannels, typename Op>
__device__ __forceinline__ void chains_to_shared(float (&a)[8], Op op, float (*red)[kChannels], int warp, int lane) {
  reduce_token_chains(a, op);
  if (lane < 4) {
#pragma unroll
    for (int i = 0; i < 8; ++i) red[warp][lane * 8 + i] = a[i];
  }
}
template <int kChannels, typename Op>
__device__ __forceinline__ float warps_in_order(const float (*red)[kChannels], int warps, int c, float init, Op op) {
  for (int w = 0; w < warps; ++w) init = op(init, red[w][c]);
  return init;
}

__device__ __forceinline__ float warp_max_quad(float x) {
  x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
  return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float warp_sum_quad(float x) {
  x += __shfl_xor_sync(0xffffffffu, x, 1);
  return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

// ---- attention epilogue, shared by the mma.sync and the wgmma kernels ----

// Whether two adjacent output elements of a row (a pair starts at an even column) can be
// written with one 4-byte store: d_out even, so that a pair lies wholly inside or wholly outside
// the row (store_out2_bounded skips those outside), and 4-byte aligned rows.
__device__ __forceinline__ bool out_pairs_even(const AttnParams& p) {
  return p.d_out % 2 == 0 && p.o_stride_b % 2 == 0 && p.o_stride_h % 2 == 0 && p.o_stride_n % 2 == 0 &&
         reinterpret_cast<uintptr_t>(p.o) % 4 == 0;
}
// The same where the kernel computes exactly the output's columns (store_out2 checks no bound).
__device__ __forceinline__ bool out_pairs_ok(const AttnParams& p, int head_dim) {
  return p.d_out == head_dim && out_pairs_even(p);
}

// Writes the natural-log LSE of one query row from its base-2 running maximum `m` and sum
// `l` (P was computed as 2^(s - m + off)), plus the K-smoothing correction when present.
// `at`: the row's index in lse; lse_add is read at bh * nq + row.
__device__ __forceinline__ void write_lse(const AttnParams& p, int64_t at, int64_t bh, int row, float m, float l,
                                          float off) {
  float val = l > 0.f ? (m + __log2f(l) - off) * kLn2 : -INFINITY;
  if (p.lse_add) val += p.lse_add[bh * p.nq + row] * p.lse_add_scale;
  p.lse[at] = val;
}

// Stores output columns col and col + 1 of one row (those below d_out when not `pairs`).
template <typename OutT>
__device__ __forceinline__ void store_out2(OutT* orow, int col, float v0, float v1, bool pairs, int d_out) {
  if (pairs) {
    *reinterpret_cast<uint32_t*>(orow + col) = pack2<OutT>(v0, v1);
  } else {
    if (col < d_out) orow[col] = from_float<OutT>(v0);
    if (col + 1 < d_out) orow[col + 1] = from_float<OutT>(v1);
  }
}
// With pairs from out_pairs_even: columns past d_out are skipped, pair by pair.
template <typename OutT>
__device__ __forceinline__ void store_out2_bounded(OutT* orow, int col, float v0, float v1, bool pairs, int d_out) {
  if (pairs) {
    if (col < d_out) *reinterpret_cast<uint32_t*>(orow + col) = pack2<OutT>(v0, v1);
  } else {
    store_out2(orow, col, v0, v1, false, d_out);
  }
}

}  // namespace sage

// Q, K and V quantized for the fp8 attention kernels in two launches, instead of a torch K
// mean, quant_int8 for Q, quant_int8 for K and quant_v_fp8's two passes over V:
//
//   1. qkv_stats_kernel, one CTA per (batch, kv head, 32 channels): the K sum over the
//      sample's rows (-> K mean) and V's scale: from the sample's largest |v| times
//      kVAmaxMargin, or, when V is smoothed, from V's sum, max and min over all keys (-> V
//      scale, inverse scale and mean; quant_fp8.cu's pass-1 thread layout and summation
//      order, so those statistics are bit-identical to quant_v_fp8's). With v_full (the
//      caller's choice; sageattn does not ask for it since the fallback below costs no launch:
//      bench/NOTES.md) it also reads all of V unsmoothed and decides the fallback itself: same
//      results. The sample-only build holds fewer registers, so its CTAs take one wave and
//      leave room for the Q blocks that run beside it.
//   2. qkv_quant_kernel, a 1-D grid in three ranges: Q blocks (one warp per 16-row scale
//      block), V tiles (one warp per 64 tokens x 32 channels) and K blocks (one CTA per 64-row
//      scale block). Every warp loads its rows into registers once, reduces the
//      maxima with shuffles, quantizes and writes 16-byte stores; the arithmetic per element
//      is quant_int8.cu's and quant_fp8.cu's. On Hopper (programmatic dependent launch) the Q
//      blocks, which need no statistics unless q . (K mean) is asked for, run while the
//      statistics kernel still does; V and K wait for it. A V tile that finds a value the
//      sampled scale would push past v_scale_max flags its channel (it is still written,
//      saturated), and the last tile written of each 32-channel group (a counter per group)
//      gives flagged channels the exact scale and writes the group again (v_fix_group). That
//      used to be a third launch, which cost 2.5-6 us even when empty
//      (bench/results/...-20eaf00-v-sample.md).
//
// (A one-grid variant that held each K/V chunk in shared memory while its head's statistics
// were combined across CTAs was slower at every length once K's mean came from a sample, and
// so was one grid of statistics, Q, V and K CTAs waiting on per-head counters; bench/NOTES.md.)
#include <algorithm>
#include <cstring>
#include <type_traits>

#include "common.cuh"

namespace sage {
namespace {

// ---- statistics kernel ----
constexpr int kStatThreads = 256;
constexpr int kStatChannels = 32;                                  // channels per CTA
constexpr int kStatChains = kStatThreads / (kStatChannels / 8);   // 64 token chains per channel
// K is smoothed by the mean of a sample of its keys (k_sample_row), not of all of them: the
// output does not depend on which vector is subtracted (q . mean is constant along a softmax
// row; the LSE adds it back), only the INT8 error does, and a 128-key sample removes a
// per-channel bias as well as the full mean (bench/NOTES.md) without reading all of K
// before K, Q (q . mean) and the attention can start.
constexpr int kKSampleRows = 128;
static_assert(kKSampleRows % kStatChains == 0, "each token chain adds the same number of sample rows");
// V's per-channel fp8 scale, unless V is smoothed, comes from the same sample: its largest
// |v| times this margin (a power of two, so the product is exact). Values up to 8x the
// sample's maximum fit; the scale's only cost is e4m3's subnormal range starting 8x higher
// (bench/NOTES.md). A channel with a larger value anywhere falls back to the exact maximum
// (v_fix_group).
constexpr float kVAmaxMargin = 8.f;

// ---- quantization kernel ----
constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kWarpRows = 16;        // rows one warp quantizes: a Q scale block, a quarter K block
constexpr int kVTokens = 64;         // V tile of one warp: 64 tokens x 32 channels
constexpr int kVChannels = 32;
static_assert(kAttnWarpQ == kWarpRows && kAttnBlockK == kWarps * kWarpRows,
              "Q scale blocks are one warp's rows, K scale blocks one CTA's");

__device__ __forceinline__ uint16_t bits_of(__half x) { return __half_as_ushort(x); }
__device__ __forceinline__ uint16_t bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }

// Eight consecutive elements of a row as their 16-bit patterns, two per word; columns >= d
// read as +0. `vec`: the row start and d allow one 16-byte load.
template <typename T>
__device__ __forceinline__ uint4 load_bits8(const T* row, int col0, int d, bool vec) {
  if (vec && col0 + 8 <= d) return *reinterpret_cast<const uint4*>(row + col0);
  uint32_t w[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int i = 0; i < 8; ++i)
    if (col0 + i < d) w[i / 2] |= static_cast<uint32_t>(bits_of(row[col0 + i])) << (16 * (i % 2));
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Four consecutive elements as 16-bit patterns (load_bits8's, for half a chunk).
template <typename T>
__device__ __forceinline__ uint2 load_bits4(const T* row, int col0, int d, bool vec) {
  if (vec && col0 + 4 <= d) return *reinterpret_cast<const uint2*>(row + col0);
  uint32_t w[2] = {0u, 0u};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    if (col0 + i < d) w[i / 2] |= static_cast<uint32_t>(bits_of(row[col0 + i])) << (16 * (i % 2));
  return make_uint2(w[0], w[1]);
}

// The low (hi = 0) or high 16-bit element of a word, as float.
template <typename T>
__device__ __forceinline__ float half_of(uint32_t w, int hi) {
  const uint32_t h = hi ? (w >> 16) : (w & 0xffffu);
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __uint_as_float(h << 16);
  } else {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(h)));
  }
}

// Element i (a compile-time index after unrolling) of eight / four packed 16-bit values.
template <typename T>
__device__ __forceinline__ float elem(const uint4& u, int i) {
  return half_of<T>(i < 2 ? u.x : (i < 4 ? u.y : (i < 6 ? u.z : u.w)), i & 1);
}
template <typename T>
__device__ __forceinline__ float elem(const uint2& u, int i) {
  return half_of<T>(i < 2 ? u.x : u.y, i & 1);
}

// max(m, |x|) of two packed 16-bit pairs (m non-negative), exact in the input type; a NaN
// in x leaves m (as fmaxf does).
template <typename T>
__device__ __forceinline__ uint32_t max_abs2(uint32_t m, uint32_t x) {
  x &= 0x7fff7fffu;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    __nv_bfloat162 a, b;
    memcpy(&a, &m, 4), memcpy(&b, &x, 4);
    a = __hmax2(a, b);
    memcpy(&m, &a, 4);
  } else {
    __half2 a, b;
    memcpy(&a, &m, 4), memcpy(&b, &x, 4);
    a = __hmax2(a, b);
    memcpy(&m, &a, 4);
  }
  return m;
}

// V's per-channel outputs of head bh, channel c: the scale for `amax` (clamped), its inverse
// (returned) and the mean when smoothing.
__device__ __forceinline__ float v_scale_out(const QuantQKVParams& p, int64_t bh, int c, float amax, float mean) {
  amax = fmaxf(amax, kAmaxEps);
  const float inv = __fdiv_rn(p.v_scale_max, amax);
  p.v_scale[bh * p.d_pad + c] = __fdiv_rn(amax, p.v_scale_max);
  p.v_inv[bh * p.d_pad + c] = inv;
  if (p.v_mean) p.v_mean[bh * p.d_pad + c] = mean;
  return inv;
}

// The sampled scale's amax from the sample's largest |v| (`smax`), when V is not smoothed;
// given the largest |v| of all keys (`full`, >= 0), the exact one instead where a value
// would overflow it: fl(|v| * inv) grows with |v|, so that is fl(full * inv) > v_scale_max.
__device__ __forceinline__ float v_sampled_amax(const QuantQKVParams& p, float smax, float full = -1.f) {
  const float est = fmaxf(__fmul_rn(smax, kVAmaxMargin), kAmaxEps);
  if (full < 0.f) return est;
  return __fmul_rn(full, __fdiv_rn(p.v_scale_max, est)) > p.v_scale_max ? full : est;
}

// With a sampled V scale (p.v_over), the count of V tiles of head bh's 32-channel group from
// channel c0 that are written: the tile that completes it applies the group's fallback
// (v_fix_group). Zeroed by the statistics kernel, after the flags in p.v_over.
__device__ __forceinline__ uint32_t* v_tiles_done(const QuantQKVParams& p, int64_t bh, int c0) {
  const int64_t bhs = static_cast<int64_t>(p.v.batch) * p.v.heads;
  return p.v_over + bhs * p.d_pad + bh * (p.d_pad / kStatChannels) + c0 / kStatChannels;
}

// ============================== 1. statistics ==============================

// Row i of the K sample (i < k_sample_rows(n)): evenly spaced, the middle of each of the
// sample's n / S stretches of keys; all rows when n <= kKSampleRows.
__device__ __forceinline__ int k_sample_rows(int n) { return n < kKSampleRows ? n : kKSampleRows; }
__device__ __forceinline__ int k_sample_row(int i, int n, int rows) {
  return static_cast<int>(((2 * static_cast<int64_t>(i) + 1) * n) / (2 * rows));
}

// V's sum, maximum and minimum over the token chain r (tokens r, r + 64, r + 128, ... in this
// order: quant_fp8.cu's pass 1) for the eight channels from col0; kAhead tokens are loaded
// before their adds.
template <typename T>
__device__ __forceinline__ void v_chain_all(const T* v, int64_t stride_n, int n, int r, int col0, int d, bool vec,
                                            float (&s)[8], float (&mx)[8], float (&mn)[8]) {
  constexpr int kAhead = 4;
  int t = r;
  for (; t + (kAhead - 1) * kStatChains < n; t += kAhead * kStatChains) {
    uint4 xv[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) xv[u] = load_bits8(v + (t + u * kStatChains) * stride_n, col0, d, vec);
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x = elem<T>(xv[u], i);
        s[i] += x, mx[i] = fmaxf(mx[i], x), mn[i] = fminf(mn[i], x);
      }
    }
  }
  for (; t < n; t += kStatChains) {
    const uint4 xv = load_bits8(v + t * stride_n, col0, d, vec);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x = elem<T>(xv, i);
      s[i] += x, mx[i] = fmaxf(mx[i], x), mn[i] = fminf(mn[i], x);
    }
  }
}

// kFull: V over all keys is read (p.v_mean or p.v_full); otherwise only the sample, and the
// kernel is built for more CTAs per SM (fewer registers: one wave, and room beside it for the
// quantization grid's Q blocks, which start before it ends).
template <typename T, bool kFull>
__global__ void __launch_bounds__(kStatThreads, kFull ? 2 : 4) qkv_stats_kernel(const QuantQKVParams p) {
  __shared__ float red[5][kStatThreads / 32][kStatChannels];  // V sum, max, min, K sum, sample max |v|
  pdl_launch_dependents();  // the quantization grid may be scheduled (it waits for this one)
  const int c0 = blockIdx.x * kStatChannels, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cg = tid & 3, r = tid >> 2;  // 8 channels (cg) of the token chain r per thread
  const int n = entry_rows(p.v, b), d = p.v.d, col0 = c0 + cg * 8;
  const T* v = static_cast<const T*>(p.v.data) + entry_offset(p.v, b) + h * p.v.stride_h;
  const T* k = static_cast<const T*>(p.k.data) + entry_offset(p.k, b) + h * p.k.stride_h;
  const bool vvec = vec_ok<T>(p.v.data, p.v.stride_b, p.v.stride_h, p.v.stride_n, d);
  const bool kvec = vec_ok<T>(p.k.data, p.k.stride_b, p.k.stride_h, p.k.stride_n, d);
  const bool ksum = p.k_mean != nullptr;
  // V over all keys: smoothing (its mean and range), or the caller's choice (the fallback
  // decided here, and the quantization finds V in L2); V's sample unless smoothing
  constexpr bool vfull = kFull;
  const bool vsample = p.v_mean == nullptr;

  // the sample's rows r and r + 64 of K and, for V's sampled scale, of V (loaded first)
  const int srows = k_sample_rows(n);
  uint4 xk[kKSampleRows / kStatChains], xs[kKSampleRows / kStatChains];
#pragma unroll
  for (int u = 0; u < kKSampleRows / kStatChains; ++u) {
    const int i = r + u * kStatChains;
    const int64_t row = i < srows ? k_sample_row(i, n, srows) : 0;
    xk[u] = ksum && i < srows ? load_bits8(k + row * p.k.stride_n, col0, d, kvec) : make_uint4(0u, 0u, 0u, 0u);
    xs[u] = vsample && i < srows ? load_bits8(v + row * p.v.stride_n, col0, d, vvec) : make_uint4(0u, 0u, 0u, 0u);
  }

  float s[8], mx[8], mn[8], sk[8], sa[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = 0.f, mx[i] = -INFINITY, mn[i] = INFINITY, sk[i] = 0.f, sa[i] = 0.f;
  if (vfull) v_chain_all<T>(v, p.v.stride_n, n, r, col0, d, vvec, s, mx, mn);
#pragma unroll
  for (int u = 0; u < kKSampleRows / kStatChains; ++u) {  // rows past the sample were loaded as zeros
#pragma unroll
    for (int i = 0; i < 8; ++i) sa[i] = fmaxf(sa[i], fabsf(elem<T>(xs[u], i)));
  }
#pragma unroll
  for (int u = 0; u < kKSampleRows / kStatChains; ++u) {
#pragma unroll
    for (int i = 0; i < 8; ++i) sk[i] += elem<T>(xk[u], i);
  }
  // the eight chains of a warp: lanes 4 apart hold neighbouring chains of the same channels
  if constexpr (kFull) {
    chains_to_shared(s, OpAdd(), red[0], warp, lane);
    chains_to_shared(mx, OpMax(), red[1], warp, lane);
    chains_to_shared(mn, OpMin(), red[2], warp, lane);
  }
  chains_to_shared(sk, OpAdd(), red[3], warp, lane);
  chains_to_shared(sa, OpMax(), red[4], warp, lane);
  __syncthreads();
  if (tid >= kStatChannels) return;
  constexpr int kW = kStatThreads / 32;
  const float ts = kFull ? warps_in_order(red[0], kW, tid, 0.f, OpAdd()) : 0.f;
  const float tmx = kFull ? warps_in_order(red[1], kW, tid, -INFINITY, OpMax()) : 0.f;
  const float tmn = kFull ? warps_in_order(red[2], kW, tid, INFINITY, OpMin()) : 0.f;
  const float tk = warps_in_order(red[3], kW, tid, 0.f, OpAdd());
  const float tsa = warps_in_order(red[4], kW, tid, 0.f, OpMax());
  const int64_t bh = static_cast<int64_t>(b) * p.v.heads + h;
  const int c = c0 + tid;
  const bool has = c < d && n > 0;
  if (kFull && p.v_mean) {
    const float mean = has ? __fdiv_rn(ts, static_cast<float>(n)) : 0.f;
    v_scale_out(p, bh, c, has ? fmaxf(__fsub_rn(tmx, mean), __fsub_rn(mean, tmn)) : 0.f, mean);
  } else if (kFull) {  // p.v_full
    v_scale_out(p, bh, c, v_sampled_amax(p, has ? tsa : 0.f, has ? fmaxf(tmx, -tmn) : 0.f), 0.f);
  } else {
    v_scale_out(p, bh, c, v_sampled_amax(p, has ? tsa : 0.f), 0.f);
    p.v_over[bh * p.d_pad + c] = 0u;  // set by the quantization on overflow
    if (tid == 0) *v_tiles_done(p, bh, c0) = 0u;
  }
  if (ksum && c0 + tid < d) p.k_mean[bh * d + c0 + tid] = srows > 0 ? __fdiv_rn(tk, static_cast<float>(srows)) : 0.f;
}

// ============================== 2. quantization ==============================

// The launch's divisors, so that the Q and K paths decode unit and block numbers into heads and
// blocks without division instructions (about 25 each, a tenth of a Q job's set-up). (V keeps
// its divisions: with FastDiv there, ptxas spilled 8-16 bytes in its general tile at D=128.)
struct QuantDivs {
  FastDiv q_blocks;  // Q scale blocks per head (nq_pad / 16, at least 1)
  FastDiv q_heads;   // Hq
  FastDiv q_group;   // Hq / Hkv
  FastDiv kv_bhs;    // B * Hkv
  FastDiv kv_heads;  // Hkv
};

// A warp's 16 rows at head dim DP: a lane owns 16 consecutive columns of every
// kRowsPerIter-th row; its rows fall in kSlots classes of (row % 8).
template <int DP>
struct RowShape {
  static constexpr int kLanesPerRow = DP / 16;              // 4, 8, 16
  static constexpr int kRowsPerIter = 32 / kLanesPerRow;    // 8, 4, 2
  static constexpr int kIters = kWarpRows / kRowsPerIter;   // 2, 4, 8
  static constexpr int kSlots = 8 / kRowsPerIter;           // 1, 2, 4: iteration it is in slot it % kSlots
};

// One warp's 16 rows of a head (Q or K), quantized to INT8 with G scale groups (row r of the
// scale block uses group 0, r % 8 or (r % 8) / 2 for G = 1, 8, 4).
struct RowJob {
  const void* x;          // the head's rows
  int64_t stride_n;
  int n, d;
  bool vec;
  int row0;               // first of the warp's 16 rows
  float prescale;         // multiplied first (Q: quant_rows's kScaled)
  const float* mean;      // [d] subtracted, or null
  const float* dot_mean;  // [d]: rowdot[row] = x . dot_mean, or null
  float* rowdot;
  int8_t* out;            // the head's [n_pad, DP] output
  float* scale;           // the scale block's G scales
};

// The rows of head (b, h) of a [B, H, N, D] input.
template <typename T>
__device__ __forceinline__ RowJob rows_of(const Input4D& in, int b, int h) {
  RowJob j;
  j.x = static_cast<const T*>(in.data) + entry_offset(in, b) + h * in.stride_h;
  j.stride_n = in.stride_n, j.n = entry_rows(in, b), j.d = in.d;
  j.vec = vec_ok<T>(in.data, in.stride_b, in.stride_h, in.stride_n, in.d);
  return j;
}

// `red` (shared, [kWarps][4]): the CTA's four warps share one scale block (K) and synchronize
// on __syncthreads; null: the warp's own block (Q). All four warps call it in the first case.
// kScaled: the rows are multiplied by j.prescale (Q; a prescale of 1 gives the same bits, since
// x * 1 is x and the NaN of any product with a NaN gets the same code), otherwise not (K).
template <typename T, int DP, int G, bool kScaled>
__device__ __forceinline__ void quant_rows(const RowJob& j, float (*red)[4]) {
  using S = RowShape<DP>;
  const int lane = threadIdx.x & 31, warp = (threadIdx.x >> 5) % kWarps;
  const int lr = lane / S::kLanesPerRow, col0 = (lane % S::kLanesPerRow) * 16;
  const T* x = static_cast<const T*>(j.x);

  uint4 raw[S::kIters][2];
#pragma unroll
  for (int it = 0; it < S::kIters; ++it) {
    const int row = j.row0 + it * S::kRowsPerIter + lr;
    raw[it][0] = raw[it][1] = make_uint4(0u, 0u, 0u, 0u);
    if (row < j.n) {
      const T* src = x + row * j.stride_n;
      raw[it][0] = load_bits8(src, col0, j.d, j.vec);
      raw[it][1] = load_bits8(src, col0 + 8, j.d, j.vec);
    }
  }
  float mu[16];
#pragma unroll
  for (int i = 0; i < 16; ++i) mu[i] = (j.mean && col0 + i < j.d) ? j.mean[col0 + i] : 0.f;
  auto value = [&](int it, int i) {
    float y = elem<T>(raw[it][i / 8], i % 8);
    if (kScaled) y = __fmul_rn(y, j.prescale);
    if (j.mean) y = __fsub_rn(y, mu[i]);
    return y;
  };

  // q . mean per row (for the LSE correction): 16 columns per lane, then the row's lanes
  if (j.dot_mean) {
    float dm[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) dm[i] = col0 + i < j.d ? j.dot_mean[col0 + i] : 0.f;
#pragma unroll
    for (int it = 0; it < S::kIters; ++it) {
      float dot = 0.f;
#pragma unroll
      for (int i = 0; i < 16; ++i) dot = fmaf(elem<T>(raw[it][i / 8], i % 8), dm[i], dot);
#pragma unroll
      for (int off = 1; off < S::kLanesPerRow; off <<= 1) dot += __shfl_xor_sync(0xffffffffu, dot, off);
      const int row = j.row0 + it * S::kRowsPerIter + lr;
      if (lane % S::kLanesPerRow == 0 && row < j.n) j.rowdot[row] = dot;
    }
  }

  // |y| maxima of the row classes this lane holds (rows past n do not count)
  float am[S::kSlots];
  if (j.mean) {
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s) am[s] = 0.f;
#pragma unroll
    for (int it = 0; it < S::kIters; ++it) {
      if (j.row0 + it * S::kRowsPerIter + lr < j.n) {
#pragma unroll
        for (int i = 0; i < 16; ++i) am[it % S::kSlots] = fmaxf(am[it % S::kSlots], fabsf(value(it, i)));
      }
    }
  } else {
    // max |x * prescale| = max |x| * |prescale| (rounding is monotonic): the maxima of the
    // raw pairs, then one multiply; rows past n were loaded as zeros
    uint32_t m2[S::kSlots];
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s) m2[s] = 0u;
#pragma unroll
    for (int it = 0; it < S::kIters; ++it) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t& m = m2[it % S::kSlots];
        m = max_abs2<T>(max_abs2<T>(m, raw[it][h].x), raw[it][h].y);
        m = max_abs2<T>(max_abs2<T>(m, raw[it][h].z), raw[it][h].w);
      }
    }
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s) {
      const float m = fmaxf(half_of<T>(m2[s], 0), half_of<T>(m2[s], 1));
      am[s] = kScaled ? __fmul_rn(m, fabsf(j.prescale)) : m;
    }
  }
  // over the lanes of a row: slot s of lane group lr is then the class s * kRowsPerIter + lr
#pragma unroll
  for (int s = 0; s < S::kSlots; ++s) {
#pragma unroll
    for (int off = 1; off < S::kLanesPerRow; off <<= 1) am[s] = fmaxf(am[s], __shfl_xor_sync(0xffffffffu, am[s], off));
  }
  if constexpr (G == 4) {  // classes 2g and 2g + 1: neighbouring lane groups (kRowsPerIter is even)
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s) am[s] = fmaxf(am[s], __shfl_xor_sync(0xffffffffu, am[s], S::kLanesPerRow));
  } else if constexpr (G == 1) {
    float a = am[0];
#pragma unroll
    for (int s = 1; s < S::kSlots; ++s) a = fmaxf(a, am[s]);
#pragma unroll
    for (int off = S::kLanesPerRow; off < 32; off <<= 1) a = fmaxf(a, __shfl_xor_sync(0xffffffffu, a, off));
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s) am[s] = a;
  }
  auto group = [&](int s) { return G == 8 ? s * S::kRowsPerIter + lr : (G == 4 ? (s * S::kRowsPerIter + lr) >> 1 : 0); };
  // one lane per group writes it
  auto writer = [&](int s) {
    return lane % S::kLanesPerRow == 0 && (G == 8 || (G == 4 ? (lr & 1) == 0 : (lr == 0 && s == 0)));
  };
  if (red) {
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s)
      if (writer(s)) red[warp][group(s)] = am[s];
    __syncthreads();
#pragma unroll
    for (int s = 0; s < S::kSlots; ++s) {
      float a = red[0][group(s)];
#pragma unroll
      for (int w = 1; w < kWarps; ++w) a = fmaxf(a, red[w][group(s)]);
      am[s] = a;
    }
  }
  float inv[S::kSlots];
#pragma unroll
  for (int s = 0; s < S::kSlots; ++s) {
    const float amax = fmaxf(am[s], kAmaxEps);
    inv[s] = __fdiv_rn(127.f, amax);
    if (writer(s) && (!red || warp == 0)) j.scale[group(s)] = __fdiv_rn(amax, 127.f);
  }

  // quantize; rows past n (to n_pad) and columns past d are zeros
#pragma unroll
  for (int it = 0; it < S::kIters; ++it) {
    const int row = j.row0 + it * S::kRowsPerIter + lr;
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (row < j.n) {
#pragma unroll
      for (int i = 0; i < 16; ++i) w[i / 4] |= int8_code(__fmul_rn(value(it, i), inv[it % S::kSlots])) << (8 * (i % 4));
    }
    *reinterpret_cast<uint4*>(j.out + static_cast<int64_t>(row) * DP + col0) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// quant_rows with the scale-group count known at run time: G (Q: 8, K: 4) or 1.
template <typename T, int DP, int G, bool kScaled>
__device__ __forceinline__ void quant_rows_g(const RowJob& j, int groups, float (*red)[4]) {
  if (groups == G)
    quant_rows<T, DP, G, kScaled>(j, red);
  else
    quant_rows<T, DP, 1, kScaled>(j, red);
}

// The fields of a K job of kv head bh: no prescale, no q . mean, the head's output rows; the
// caller sets the rows' source, row0 and scale.
template <int DP>
__device__ __forceinline__ RowJob k_job(const QuantQKVParams& p, int64_t bh, const float* mean) {
  RowJob j;
  j.prescale = 1.f;
  j.mean = mean;
  j.dot_mean = nullptr, j.rowdot = nullptr;
  j.out = p.k_out + bh * p.nk_pad * DP;
  return j;
}

// One warp's V tile: 64 tokens x 32 channels of kv head bh, from token n0t and channel c0t,
// written as e4m3 [channel][token] with the tokens of each 16-token group in the MMA's order
// 0,1,8,9,2,3,10,11,...,6,7,14,15 (quant_fp8.cu's permuted_pos). Lane (cgrp, tg) owns channels
// cgrp*4.. +4 of tokens tg*16.. +16: it holds a whole permuted group of each of its channels,
// one 16-byte store each. `rows`: token n0t's row, n_left: the tokens from n0t on that exist
// (the rest are zeros); inv and mean (null: no smoothing) are the head's per-channel values.
// `check`: a channel with a value past v_scale_max is flagged in v_over.
// kFull: the caller found all 64 tokens and 32 channels present, 16-byte aligned rows (vec) and
// one V term; the tile then runs without the per-token bounds tests and per-load 64-bit address
// arithmetic, which were most of the kernel's instructions on V (an H200 under ncu: 24 per
// element, ~480 of a lane's 1,537 per tile in the loads' arithmetic; bench/NOTES.md), and kMean
// says whether V is smoothed (otherwise mean_g decides at run time). The same bytes either way.
// (The test `kFull ? kMean : mean_g != nullptr` is spelled out where used: held in a local, it
// changed ptxas's schedule of the general instance.)
template <typename T, int DP, bool kFull = false, bool kMean = false>
__device__ __forceinline__ void quant_v_tile(const QuantQKVParams& p, const T* rows, int64_t stride_n, bool vec,
                                             int n_left, int64_t bh, int n0t, int c0t, const float* inv_g,
                                             const float* mean_g, bool check) {
  const int lane = threadIdx.x & 31, cgrp = lane >> 2, tg = lane & 3;
  const int d = p.v.d, t0 = tg * 16, c0 = c0t + cgrp * 4;
  uint2 raw[16];
  if constexpr (kFull) {
    const T* src = rows + t0 * stride_n + c0;
#pragma unroll
    for (int t = 0; t < 16; ++t) raw[t] = *reinterpret_cast<const uint2*>(src + t * stride_n);
  } else {
#pragma unroll
    for (int t = 0; t < 16; ++t) {
      raw[t] = make_uint2(0u, 0u);
      if (t0 + t < n_left && c0 < d) raw[t] = load_bits4(rows + (t0 + t) * stride_n, c0, d, vec);
    }
  }
  inv_g += c0;
  if (kFull ? kMean : mean_g != nullptr) mean_g += c0;
  uint8_t* out = p.v_out + (bh * (kFull ? 1 : p.v_terms) * DP + c0) * p.nk_pad + n0t + t0;
  const bool two = !kFull && p.v_terms == 2;  // also the rounding of what e4m3 left, DP rows further on
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t w[4] = {0u, 0u, 0u, 0u}, wl[4] = {0u, 0u, 0u, 0u};
    if (kFull || c0 + i < d) {
      const float inv = inv_g[i], mu = (kFull ? kMean : mean_g != nullptr) ? mean_g[i] : 0.f;
      float y[16], big = 0.f;
#pragma unroll
      for (int t = 0; t < 16; ++t) {
        const float x = elem<T>(raw[t], i);
        y[t] = kFull || t0 + t < n_left
                   ? __fmul_rn((kFull ? kMean : mean_g != nullptr) ? __fsub_rn(x, mu) : x, inv)
                   : 0.f;
        big = fmaxf(big, fabsf(y[t]));
      }
      if (check && big > p.v_scale_max) atomicOr(p.v_over + bh * DP + c0 + i, 1u);  // rare: v_fix_group
      // word q holds tokens 2q, 2q + 1 (low half) and 2q + 8, 2q + 9 (high half)
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        const uint16_t a = to_e4m3x2(y[2 * q], y[2 * q + 1]), b = to_e4m3x2(y[2 * q + 8], y[2 * q + 9]);
        w[q] = static_cast<uint32_t>(a) | (static_cast<uint32_t>(b) << 16);
        if (two) {  // y - e4m3(y) is exact in fp32
          const float2 ra = from_e4m3x2(a), rb = from_e4m3x2(b);
          wl[q] = static_cast<uint32_t>(to_e4m3x2(__fsub_rn(y[2 * q], ra.x), __fsub_rn(y[2 * q + 1], ra.y))) |
                  (static_cast<uint32_t>(to_e4m3x2(__fsub_rn(y[2 * q + 8], rb.x), __fsub_rn(y[2 * q + 9], rb.y))) << 16);
        }
      }
    }
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(i) * p.nk_pad) = make_uint4(w[0], w[1], w[2], w[3]);
    if (two)
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(DP + i) * p.nk_pad) = make_uint4(wl[0], wl[1], wl[2], wl[3]);
  }
}

// The fallback of a sampled V scale, by one warp, for head bh's channels c0 .. c0 + 31 once all
// of their tiles are written: nothing unless a channel was flagged (a value past what the
// sampled scale allows); then each flagged channel gets the exact scale, its largest |v| over
// all keys (as quant_v_fp8), and the group is quantized again (unflagged channels: the same
// bytes). Real V stays well inside 8x its sample's maximum, so this runs for adversarial
// inputs only, and no value is ever clipped.
// Inlined, it costs the sm_90 builds nothing; on sm_100 / sm_120 ptxas then spills more in the
// whole quantization kernel (532 bytes against 328 as a call, at DP 64 and 128), so there it is a
// call, made only on the rare path.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 1000
#define SAGE_V_FIX_INLINE __noinline__
#else
#define SAGE_V_FIX_INLINE __forceinline__
#endif
template <typename T, int DP>
__device__ SAGE_V_FIX_INLINE void v_fix_group(const QuantQKVParams& p, int64_t bh, int c0) {
  const int lane = threadIdx.x & 31;
  const bool flagged = __ldcg(p.v_over + bh * DP + c0 + lane) != 0u;  // channel c0 + lane
  if (!__any_sync(0xffffffffu, flagged)) return;
  const int b = static_cast<int>(bh / p.v.heads), h = static_cast<int>(bh % p.v.heads), n = entry_rows(p.v, b), d = p.v.d;
  const T* v = static_cast<const T*>(p.v.data) + entry_offset(p.v, b) + h * p.v.stride_h;
  const bool vec = vec_ok<T>(p.v.data, p.v.stride_b, p.v.stride_h, p.v.stride_n, d);
  // max |v| of 8 channels (lane % 4) over the token chain lane / 4 (tokens lane / 4 + 8 i)
  const int cg = lane & 3;
  float m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = 0.f;
  for (int t = lane >> 2; t < n; t += 8) {
    const uint4 x = load_bits8(v + t * p.v.stride_n, c0 + cg * 8, d, vec);
#pragma unroll
    for (int i = 0; i < 8; ++i) m[i] = fmaxf(m[i], fabsf(elem<T>(x, i)));
  }
  reduce_token_chains(m, OpMax());  // every lane: its channel group's maxima
  float amax = 0.f;                  // channel c0 + lane's, from lane lane / 8
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float x = __shfl_sync(0xffffffffu, m[i], lane >> 3);
    if ((lane & 7) == i) amax = x;
  }
  if (flagged) v_scale_out(p, bh, c0 + lane, c0 + lane < d && n > 0 ? amax : 0.f, 0.f);
  __syncwarp();  // the new inverse scales are visible to the warp
  for (int n0t = 0; n0t < p.nk_pad; n0t += kVTokens)
    quant_v_tile<T, DP>(p, v + n0t * p.v.stride_n, p.v.stride_n, vec, n - n0t, bh, n0t, c0, p.v_inv + bh * DP,
                        nullptr, false);
}

// V tile `unit`, read from global memory: the last token tiles first,
// every head in turn (what the statistics kernel read last may still be in L2).
template <typename T, int DP>
__device__ __forceinline__ void quant_v_unit(const QuantQKVParams& p, int64_t unit) {
  constexpr int kTilesC = DP / kVChannels;
  const int64_t bhs = static_cast<int64_t>(p.v.batch) * p.v.heads;
  const int tiles_n = p.nk_pad / kVTokens;
  const int tc = static_cast<int>(unit % kTilesC);
  const int64_t rest = unit / kTilesC;
  const int64_t bh = rest % bhs;
  const int tn = tiles_n - 1 - static_cast<int>(rest / bhs);
  const int b = static_cast<int>(bh / p.v.heads), h = static_cast<int>(bh % p.v.heads);
  const T* v = static_cast<const T*>(p.v.data) + entry_offset(p.v, b) + h * p.v.stride_h;
  const bool vec = vec_ok<T>(p.v.data, p.v.stride_b, p.v.stride_h, p.v.stride_n, p.v.d);
  const int n0t = tn * kVTokens, n_left = entry_rows(p.v, b) - n0t, c0t = tc * kVChannels;
  const T* rows = v + n0t * p.v.stride_n;
  const bool check = p.v_over != nullptr;
  if (vec && n_left >= kVTokens && c0t + kVChannels <= p.v.d && p.v_terms == 1) {  // uniform per warp
    if (p.v_mean)
      quant_v_tile<T, DP, true, true>(p, rows, p.v.stride_n, vec, n_left, bh, n0t, c0t, p.v_inv + bh * DP,
                                      p.v_mean + bh * DP, check);
    else
      quant_v_tile<T, DP, true, false>(p, rows, p.v.stride_n, vec, n_left, bh, n0t, c0t, p.v_inv + bh * DP, nullptr,
                                       check);
  } else {
    quant_v_tile<T, DP>(p, rows, p.v.stride_n, vec, n_left, bh, n0t, c0t, p.v_inv + bh * DP,
                        p.v_mean ? p.v_mean + bh * DP : nullptr, check);
  }
  if (p.v_over) {
    // the group's tile count, released after the warp's stores (and flags); the tile that
    // completes it acquires the others' and applies the fallback
    __syncwarp();
    uint32_t last = 0u;
    if ((threadIdx.x & 31) == 0) {
      __threadfence();
      last = atomicAdd(v_tiles_done(p, bh, tc * kVChannels), 1u) == static_cast<uint32_t>(tiles_n - 1);
      if (last) __threadfence();
    }
    if (__shfl_sync(0xffffffffu, last, 0)) v_fix_group<T, DP>(p, bh, tc * kVChannels);
  }
}

// Q scale block `unit` (16 rows of one head) for one warp.
template <typename T, int DP>
__device__ __forceinline__ void quant_q_unit(const QuantQKVParams& p, const QuantDivs& dv, int64_t unit) {
  const int nblk = p.nq_pad / kAttnWarpQ;
  if (unit >= static_cast<int64_t>(p.q.batch) * p.q.heads * nblk) return;
  const uint32_t u = static_cast<uint32_t>(unit), bq = dv.q_blocks.div(u);  // below 2^31 (launch)
  const int64_t bh = bq;
  const int rb = static_cast<int>(dv.q_blocks.mod(u, bq));
  const uint32_t b32 = dv.q_heads.div(bq);
  const int b = static_cast<int>(b32), h = static_cast<int>(dv.q_heads.mod(bq, b32));
  const int hkv = static_cast<int>(dv.q_group.div(static_cast<uint32_t>(h)));
  RowJob j = rows_of<T>(p.q, b, h);
  j.row0 = rb * kAttnWarpQ;
  j.prescale = p.q_prescale;
  j.mean = nullptr;
  j.dot_mean = p.q_rowdot ? p.k_mean + (static_cast<int64_t>(b) * p.k.heads + hkv) * p.k.d : nullptr;
  j.rowdot = p.q_rowdot ? p.q_rowdot + bh * p.q.n : nullptr;
  j.out = p.q_out + bh * p.nq_pad * DP;
  j.scale = p.q_scale + (bh * nblk + rb) * p.q_groups;
  quant_rows_g<T, DP, 8, true>(j, p.q_groups, nullptr);
}

// Blocks [0, q_ctas): Q; [q_ctas, q_ctas + v_ctas): V; the rest: K. Q first: unless its rows'
// q . (K mean) is asked for, it does not wait for the statistics (with programmatic dependent
// launch its blocks run beside the statistics kernel, which is bound by latency, not by
// bandwidth). Then V: the statistics kernel has just read all of it, and on short sequences
// it may still be in L2.
template <typename T, int DP>
__global__ void __launch_bounds__(kThreads, DP == 256 ? 4 : 6)
    qkv_quant_kernel(const QuantQKVParams p, int q_ctas, int v_ctas, const QuantDivs dv) {
  __shared__ float red[kWarps][4];
  const int warp = threadIdx.x >> 5;
  int64_t blk = blockIdx.x;
  if (blk < q_ctas) {
    if (p.q_rowdot) pdl_wait();  // q . (K mean) needs the statistics
    pdl_launch_dependents();     // the attention kernel may be scheduled (it waits for this grid)
    quant_q_unit<T, DP>(p, dv, blk * kWarps + warp);  // one 16-row scale block per warp
    return;
  }
  pdl_wait();                // the statistics are complete
  pdl_launch_dependents();
  blk -= q_ctas;
  if (blk < v_ctas) {
    const int64_t unit = blk * kWarps + warp;
    const int64_t units = static_cast<int64_t>(p.v.batch) * p.v.heads * (p.nk_pad / kVTokens) * (DP / kVChannels);
    if (unit < units) quant_v_unit<T, DP>(p, unit);
    return;
  }
  blk -= v_ctas;
  // K: one 64-row scale block per CTA, the last row blocks of every head first (as V)
  const int nblk = p.nk_pad / kAttnBlockK;
  const uint32_t kb = static_cast<uint32_t>(blk), tq = dv.kv_bhs.div(kb);
  const int64_t bh = dv.kv_bhs.mod(kb, tq);
  const int rb = nblk - 1 - static_cast<int>(tq);
  const uint32_t bq = dv.kv_heads.div(static_cast<uint32_t>(bh));
  const int b = static_cast<int>(bq), h = static_cast<int>(dv.kv_heads.mod(static_cast<uint32_t>(bh), bq));
  const RowJob src = rows_of<T>(p.k, b, h);
  RowJob j = k_job<DP>(p, bh, p.k_mean ? p.k_mean + bh * p.k.d : nullptr);
  j.x = src.x, j.stride_n = src.stride_n, j.n = src.n, j.d = src.d, j.vec = src.vec;
  j.row0 = rb * kAttnBlockK + warp * kWarpRows;
  j.scale = p.k_scale + (bh * nblk + rb) * p.k_groups;
  quant_rows_g<T, DP, 4, false>(j, p.k_groups, red);
}

template <typename T, int DP>
cudaError_t launch(const QuantQKVParams& p, cudaStream_t stream) {
  const int64_t bhk = static_cast<int64_t>(p.k.batch) * p.k.heads;
  const int64_t k_ctas = bhk * (p.nk_pad / kAttnBlockK);
  const int64_t v_ctas = (bhk * (p.nk_pad / kVTokens) * (DP / kVChannels) + kWarps - 1) / kWarps;
  const int64_t q_units = static_cast<int64_t>(p.q.batch) * p.q.heads * (p.nq_pad / kAttnWarpQ);
  const int64_t q_ctas = (q_units + kWarps - 1) / kWarps;
  // Q units below 2^31, for QuantDivs (far past any memory: 2^31 Q blocks are 4 TB)
  if (k_ctas + v_ctas + q_ctas > 0x7fffffff || q_units > 0x7fffffff) return cudaErrorInvalidValue;
  if (k_ctas + v_ctas + q_ctas == 0) return cudaSuccess;
  QuantDivs dv;
  dv.q_blocks = FastDiv::of(static_cast<uint32_t>(std::max(p.nq_pad / kAttnWarpQ, 1)));
  dv.q_heads = FastDiv::of(static_cast<uint32_t>(p.q.heads));
  dv.q_group = FastDiv::of(static_cast<uint32_t>(p.q.heads / p.k.heads));
  dv.kv_bhs = FastDiv::of(static_cast<uint32_t>(bhk));
  dv.kv_heads = FastDiv::of(static_cast<uint32_t>(p.k.heads));
  const dim3 stat_grid(DP / kStatChannels, p.k.heads, p.k.batch);
  if (p.v_mean || p.v_full)
    qkv_stats_kernel<T, true><<<stat_grid, kStatThreads, 0, stream>>>(p);
  else
    qkv_stats_kernel<T, false><<<stat_grid, kStatThreads, 0, stream>>>(p);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
#if defined(SAGE_SM90)
  // Hopper module: programmatic dependent launch, as for the attention kernel after these.
  // The Q blocks may skip pdl_wait: they read only Q, which the kernels before the statistics
  // kernel (a plain launch: it starts once they are done) left complete, and write only
  // q_out and q_scale, which nothing running touches.
  return launch_pdl(qkv_quant_kernel<T, DP>, dim3(static_cast<unsigned>(k_ctas + v_ctas + q_ctas)), dim3(kThreads), 0,
                    stream, p, static_cast<int>(q_ctas), static_cast<int>(v_ctas), dv);
#else
  qkv_quant_kernel<T, DP><<<static_cast<unsigned>(k_ctas + v_ctas + q_ctas), kThreads, 0, stream>>>(
      p, static_cast<int>(q_ctas), static_cast<int>(v_ctas), dv);
  return cudaGetLastError();
#endif
}

template <typename T>
cudaError_t launch_d(const QuantQKVParams& p, cudaStream_t stream) {
  switch (p.d_pad) {
    case 64: return launch<T, 64>(p, stream);
    case 128: return launch<T, 128>(p, stream);
    default: return launch<T, 256>(p, stream);
  }
}

bool valid(const QuantQKVParams& p) {
  const bool shapes = p.k.batch == p.q.batch && p.v.batch == p.q.batch && p.v.heads == p.k.heads &&
                      p.v.n == p.k.n && p.v.seqs == p.k.seqs && p.k.d == p.q.d && p.v.d == p.q.d && p.k.heads > 0 &&
                      p.q.heads % p.k.heads == 0 && p.q.dtype == p.k.dtype && p.v.dtype == p.q.dtype;
  const bool pads = (p.d_pad == 64 || p.d_pad == 128 || p.d_pad == 256) && p.d_pad >= p.q.d &&
                    p.nq_pad % kAttnWarpQ == 0 && p.nq_pad >= p.q.n && p.nk_pad % kAttnBlockK == 0 &&
                    p.nk_pad >= p.k.n;
  const bool groups = (p.q_groups == 1 || p.q_groups == 8) && (p.k_groups == 1 || p.k_groups == 4) &&
                     (p.v_terms == 1 || p.v_terms == 2);
  // v_over: exactly when V's scale is sampled and not decided by the statistics over all keys
  return shapes && pads && groups && (!p.q_rowdot || p.k_mean) && ((p.v_mean || p.v_full) == (p.v_over == nullptr));
}

}  // namespace

cudaError_t quant_qkv(const QuantQKVParams& p, cudaStream_t stream) {
  if (!valid(p)) return cudaErrorInvalidValue;
  if (p.q.batch == 0 || p.q.heads == 0) return cudaSuccess;
  return p.q.dtype == DType::kHalf ? launch_d<__half>(p, stream) : launch_d<__nv_bfloat16>(p, stream);
}

}  // namespace sage

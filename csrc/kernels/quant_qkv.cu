// Q, K and V quantized for the fp8 attention kernels in one launch, instead of a torch K
// mean, quant_int8 for Q, quant_int8 for K and quant_v_fp8's two passes over V. A persistent
// grid takes units of work in ticket order (section 3):
//
//   S  statistics of one token chunk of a kv head: K sum, V sum, max and min per channel; the
//      last S unit of a head combines the chunks' partials in chunk order and publishes the K
//      mean and the V scale, inverse scale and mean.
//   Z  K row blocks (64 rows, one scale block per pass of the CTA) and V tiles (one warp per
//      64 tokens x 32 channels) of one chunk, once its head's statistics are published.
//   Q  Q row blocks of one query head (one warp per 16-row scale block).
//
// Z follows S of the same head a bounded number of tickets later, so that K and V are read
// from DRAM once and again from L2. Every warp loads its rows into registers once, reduces the
// maxima with shuffles, quantizes and writes 16-byte stores; the arithmetic per element is
// quant_int8.cu's and quant_fp8.cu's.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common.cuh"

namespace sage {
namespace {

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

// Symmetric INT8 of x * inv, round half away from zero, saturated to +-127: quant_int8.cu's
// arithmetic and results (NaN -> +-127 included), with the floor and the conversion to an
// integer done by full-rate fp32 adds instead of the quarter-rate FRND and F2I. The code is
// the low byte of the result.
__device__ __forceinline__ uint32_t int8_bits(float x, float inv) {
  constexpr float k2p23 = 8388608.f;     // ulp 1 from here: x + 2^23 rounded toward zero is 2^23 + floor(x)
  constexpr float k3p22 = 12582912.f;    // 1.5 * 2^23: m + it holds m (|m| <= 127) in its low bits
  const float t = __fmul_rn(x, inv);
  const float a = __fadd_rn(fabsf(t), 0.5f);                 // 0.5 <= a (or NaN), below 2^23
  const float f = __fsub_rn(__fadd_rz(a, k2p23), k2p23);     // floor(a), exact
  const float m = copysignf(fminf(f, 127.f), t);
  return __float_as_uint(__fadd_rn(m, k3p22)) & 0xffu;       // two's complement byte of m
}

// ============================== 2. quantization ==============================

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
  float prescale;         // multiplied first when != 1
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
  j.x = static_cast<const T*>(in.data) + b * in.stride_b + h * in.stride_h;
  j.stride_n = in.stride_n, j.n = in.n, j.d = in.d;
  j.vec = vec_ok<T>(in.data, in.stride_b, in.stride_h, in.stride_n, in.d);
  return j;
}

// `red` (shared, [kWarps][4]): the warps of a CTA share one scale block (K); null: the
// warp's own block (Q). All threads of the CTA call it in the first case.
template <typename T, int DP, int G>
__device__ __forceinline__ void quant_rows(const RowJob& j, float (*red)[4]) {
  using S = RowShape<DP>;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int lr = lane / S::kLanesPerRow, col0 = (lane % S::kLanesPerRow) * 16;
  const T* x = static_cast<const T*>(j.x);
  const bool scaled = j.prescale != 1.f;

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
    if (scaled) y = __fmul_rn(y, j.prescale);
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
      am[s] = scaled ? __fmul_rn(m, fabsf(j.prescale)) : m;
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
      for (int i = 0; i < 16; ++i) w[i / 4] |= int8_bits(value(it, i), inv[it % S::kSlots]) << (8 * (i % 4));
    }
    *reinterpret_cast<uint4*>(j.out + static_cast<int64_t>(row) * DP + col0) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// One warp's V tile: 64 tokens (from n0) x 32 channels (from c0) of kv head bh, written as
// e4m3 [channel][token] with the tokens of each 16-token group in the MMA's order
// 0,1,8,9,2,3,10,11,...,6,7,14,15 (quant_fp8.cu's permuted_pos). Lane (cgrp, tg) owns
// channels cgrp*4.. +4 of tokens tg*16.. +16: it holds a whole permuted group of each of its
// channels, one 16-byte store each. inv, mean: the head's [DP] V statistics (mean may be null).
template <typename T, int DP>
__device__ __forceinline__ void quant_v_tile(const QuantQKVParams& p, int64_t bh, int n0, int c0,
                                             const float* inv_h, const float* mean_h) {
  const int lane = threadIdx.x & 31, cgrp = lane >> 2, tg = lane & 3;
  const int b = static_cast<int>(bh / p.v.heads), h = static_cast<int>(bh % p.v.heads);
  const int n = p.v.n, d = p.v.d;
  n0 += tg * 16, c0 += cgrp * 4;
  const T* v = static_cast<const T*>(p.v.data) + b * p.v.stride_b + h * p.v.stride_h;
  const bool vec = vec_ok<T>(p.v.data, p.v.stride_b, p.v.stride_h, p.v.stride_n, d);

  uint2 raw[16];
#pragma unroll
  for (int t = 0; t < 16; ++t) {
    raw[t] = make_uint2(0u, 0u);
    if (n0 + t < n && c0 < d) raw[t] = load_bits4(v + (n0 + t) * p.v.stride_n, c0, d, vec);
  }
  uint8_t* out = p.v_out + (bh * DP + c0) * p.nk_pad + n0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t w[4] = {0u, 0u, 0u, 0u};
    if (c0 + i < d) {
      const float inv = inv_h[c0 + i], mu = mean_h ? mean_h[c0 + i] : 0.f;
      float y[16];
#pragma unroll
      for (int t = 0; t < 16; ++t) {
        const float x = elem<T>(raw[t], i);
        y[t] = n0 + t < n ? __fmul_rn(mean_h ? __fsub_rn(x, mu) : x, inv) : 0.f;
      }
      // word q holds tokens 2q, 2q + 1 (low half) and 2q + 8, 2q + 9 (high half)
#pragma unroll
      for (int q = 0; q < 4; ++q)
        w[q] = static_cast<uint32_t>(to_e4m3x2(y[2 * q], y[2 * q + 1])) |
               (static_cast<uint32_t>(to_e4m3x2(y[2 * q + 8], y[2 * q + 9])) << 16);
    }
    *reinterpret_cast<uint4*>(out + static_cast<int64_t>(i) * p.nk_pad) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// ============================== 3. the one kernel ==============================
//
// A persistent grid takes work units from an atomic ticket counter, in ticket order. Per kv
// head j (b-major) there are P statistics units S(j, c), P quantization units Z(j, c) (K and V
// of token chunk c) and the Q units of its G = Hq / Hkv query heads. The tickets run
//   S(0) .. S(lag-1), then for j = 0, 1, ...: S(j + lag), Z(j), Q(j)
// so that K and V are read again by Z while the reads of S are still in L2, and Q's streaming
// fills the time in between. The last S unit of a head to finish combines the P partials in
// chunk order (the statistics are the same whichever CTA does it) and publishes them; Z units,
// and Q units that need the K mean, wait for that. A unit only ever waits for S units with
// smaller tickets, and those never wait and are held by running CTAs (tickets are handed out
// in order, and a CTA holds at most one ticket besides the unit it runs), so the grid cannot
// deadlock whatever its size and however its CTAs are scheduled.

struct Sched {
  int bh;      // kv heads (B * Hkv)
  int chunks;  // P: token chunks per kv head
  int chunk;   // tokens per chunk (a multiple of 64)
  int q_units; // Q units per kv head: G heads x ceil(nq_pad / chunk)
  int lag;     // kv heads between a head's S units and its Z units
  int64_t total;
};

// Counters in the workspace: [0] the ticket, [1 + j] S units of head j done, [1 + bh + j] the
// statistics of head j published.
struct Counters {
  int* ticket;
  int* done;
  int* ready;
};

__device__ __forceinline__ int ld_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Thread 0 waits until `flag` is set; then the CTA goes on (CUTLASS's semaphore pattern: one
// acquiring thread, then a CTA barrier).
__device__ __forceinline__ void wait_flag(const int* flag) {
  if (threadIdx.x == 0) {
    while (ld_acquire(flag) == 0) __nanosleep(128);
  }
  __syncthreads();
}

// S unit: K sum and V sum, max and min per channel over tokens [t0, t1) of head bh, reduced in
// a fixed order and written to partial [4][DP] (V sum, V max, V min, K sum).
template <typename T, int DP>
__device__ __forceinline__ void stats_unit(const QuantQKVParams& p, int64_t bh, int t0, int t1, float* partial,
                                           float (*red)[kWarps][DP]) {
  constexpr int kCG = DP / 8;              // threads per token row (8 channels each)
  constexpr int kChains = kThreads / kCG;  // token rows per pass
  constexpr int kAhead = 2;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int cg = tid % kCG, r = tid / kCG, col0 = cg * 8;
  const int b = static_cast<int>(bh / p.v.heads), h = static_cast<int>(bh % p.v.heads);
  const int d = p.v.d;
  const T* v = static_cast<const T*>(p.v.data) + b * p.v.stride_b + h * p.v.stride_h;
  const T* k = static_cast<const T*>(p.k.data) + b * p.k.stride_b + h * p.k.stride_h;
  const bool vvec = vec_ok<T>(p.v.data, p.v.stride_b, p.v.stride_h, p.v.stride_n, d);
  const bool kvec = vec_ok<T>(p.k.data, p.k.stride_b, p.k.stride_h, p.k.stride_n, d);
  const bool ksum = p.k_mean != nullptr;

  float s[8], mx[8], mn[8], sk[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = 0.f, mx[i] = -INFINITY, mn[i] = INFINITY, sk[i] = 0.f;
  int t = t0 + r;
  for (; t + (kAhead - 1) * kChains < t1; t += kAhead * kChains) {
    uint4 xv[kAhead], xk[kAhead];
#pragma unroll
    for (int u = 0; u < kAhead; ++u) xv[u] = load_bits8(v + (t + u * kChains) * p.v.stride_n, col0, d, vvec);
    if (ksum) {
#pragma unroll
      for (int u = 0; u < kAhead; ++u) xk[u] = load_bits8(k + (t + u * kChains) * p.k.stride_n, col0, d, kvec);
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const float x = elem<T>(xv[u], i);
        s[i] += x, mx[i] = fmaxf(mx[i], x), mn[i] = fminf(mn[i], x);
      }
    }
    if (ksum) {
#pragma unroll
      for (int u = 0; u < kAhead; ++u) {
#pragma unroll
        for (int i = 0; i < 8; ++i) sk[i] += elem<T>(xk[u], i);
      }
    }
  }
  for (; t < t1; t += kChains) {
    const uint4 xv = load_bits8(v + t * p.v.stride_n, col0, d, vvec);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x = elem<T>(xv, i);
      s[i] += x, mx[i] = fmaxf(mx[i], x), mn[i] = fminf(mn[i], x);
    }
    if (ksum) {
      const uint4 xk = load_bits8(k + t * p.k.stride_n, col0, d, kvec);
#pragma unroll
      for (int i = 0; i < 8; ++i) sk[i] += elem<T>(xk, i);
    }
  }
  // the chains of a warp that share channels: lanes kCG, 2 kCG, ... apart
#pragma unroll
  for (int off = kCG; off < 32; off <<= 1) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      s[i] += __shfl_xor_sync(0xffffffffu, s[i], off);
      mx[i] = fmaxf(mx[i], __shfl_xor_sync(0xffffffffu, mx[i], off));
      mn[i] = fminf(mn[i], __shfl_xor_sync(0xffffffffu, mn[i], off));
      sk[i] += __shfl_xor_sync(0xffffffffu, sk[i], off);
    }
  }
  if (lane < kCG) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      red[0][warp][col0 + i] = s[i], red[1][warp][col0 + i] = mx[i];
      red[2][warp][col0 + i] = mn[i], red[3][warp][col0 + i] = sk[i];
    }
  }
  __syncthreads();
  // the warps in order; partial is [stat][DP]
  for (int e = tid; e < 4 * DP; e += kThreads) {
    const int st = e / DP, c = e % DP;
    float a = red[st][0][c];
#pragma unroll
    for (int w = 1; w < kWarps; ++w) a = st == 1 ? fmaxf(a, red[st][w][c]) : (st == 2 ? fminf(a, red[st][w][c]) : a + red[st][w][c]);
    partial[e] = a;
  }
}

// The last S unit of head bh: the P partials in chunk order -> K mean, V scale, inverse scale
// and mean (the formulas of quant_fp8.cu), written to the outputs.
template <int DP>
__device__ __forceinline__ void publish_stats(const QuantQKVParams& p, int64_t bh, int chunks, const float* partial) {
  const int n = p.v.n, d = p.v.d;
  for (int c = threadIdx.x; c < DP; c += kThreads) {
    float ts = 0.f, tmx = -INFINITY, tmn = INFINITY, tk = 0.f;
    for (int i = 0; i < chunks; ++i) {
      const float* pi = partial + static_cast<int64_t>(i) * 4 * DP;
      ts += __ldcg(pi + c), tmx = fmaxf(tmx, __ldcg(pi + DP + c));
      tmn = fminf(tmn, __ldcg(pi + 2 * DP + c)), tk += __ldcg(pi + 3 * DP + c);
    }
    const bool real = c < d && n > 0;
    float mean = 0.f, amax = 0.f;
    if (real) {
      if (p.v_mean) {
        mean = __fdiv_rn(ts, static_cast<float>(n));
        amax = fmaxf(__fsub_rn(tmx, mean), __fsub_rn(mean, tmn));
      } else {
        amax = fmaxf(tmx, -tmn);
      }
    }
    amax = fmaxf(amax, kAmaxEps);
    p.v_scale[bh * DP + c] = __fdiv_rn(amax, p.v_scale_max);
    p.v_inv[bh * DP + c] = __fdiv_rn(p.v_scale_max, amax);
    if (p.v_mean) p.v_mean[bh * DP + c] = mean;
    if (p.k_mean && c < d) p.k_mean[bh * d + c] = __fdiv_rn(tk, static_cast<float>(n));
  }
}

// The published statistics of head bh into shared memory (L2 reads: they were written by
// another CTA in this launch); K mean zero-padded to DP.
template <int DP>
__device__ __forceinline__ void load_stats(const QuantQKVParams& p, int64_t bh, float* kmean, float* vinv,
                                           float* vmean) {
  for (int c = threadIdx.x; c < DP; c += kThreads) {
    kmean[c] = p.k_mean && c < p.k.d ? __ldcg(p.k_mean + bh * p.k.d + c) : 0.f;
    vinv[c] = __ldcg(p.v_inv + bh * DP + c);
    vmean[c] = p.v_mean ? __ldcg(p.v_mean + bh * DP + c) : 0.f;
  }
  __syncthreads();
}

template <typename T, int DP>
__global__ void __launch_bounds__(kThreads, 4) qkv_kernel(const QuantQKVParams p, const Sched s, Counters cnt,
                                                          float* partials) {
  __shared__ float red[4][kWarps][DP];  // statistics unit: per-warp partials
  __shared__ float kred[kWarps][4];     // K scale blocks: per-warp maxima
  __shared__ float kmean[DP], vinv[DP], vmean[DP];
  __shared__ int64_t s_ticket;
  __shared__ int s_last;
  const int tid = threadIdx.x, warp = tid >> 5;
  const int G = p.q.heads / p.k.heads;
  const int64_t per_head = 2 * s.chunks + s.q_units;  // tickets of one j after the prefix
  const int lag = s.lag < s.bh ? s.lag : s.bh;
  const int64_t prefix = static_cast<int64_t>(lag) * s.chunks;
  const int64_t full = static_cast<int64_t>(s.bh - lag) * per_head;  // blocks with an S part

  int64_t next = 0;
  if (tid == 0) next = atomicAdd(reinterpret_cast<unsigned long long*>(cnt.ticket), 1ull);
  for (;;) {
    if (tid == 0) {
      s_ticket = next;
      next = atomicAdd(reinterpret_cast<unsigned long long*>(cnt.ticket), 1ull);
    }
    __syncthreads();
    int64_t t = s_ticket;
    if (t >= s.total) break;

    // decode: kind 0 = S, 1 = Z, 2 = Q; head j; index within the kind
    int kind;
    int64_t j, idx;
    if (t < prefix) {
      kind = 0, j = t / s.chunks, idx = t % s.chunks;
    } else {
      t -= prefix;
      int64_t o;
      if (t < full) {
        j = t / per_head, o = t % per_head;
        if (o < s.chunks) {
          kind = 0, j += lag, idx = o;
        } else {
          o -= s.chunks;
          kind = o < s.chunks ? 1 : 2, idx = o < s.chunks ? o : o - s.chunks;
        }
      } else {
        t -= full;
        j = (s.bh - lag) + t / (per_head - s.chunks), o = t % (per_head - s.chunks);
        kind = o < s.chunks ? 1 : 2, idx = o < s.chunks ? o : o - s.chunks;
      }
    }
    const int c0 = static_cast<int>(idx) * s.chunk;

    if (kind == 0) {
      float* part = partials + j * s.chunks * 4 * DP;
      const int t1 = min(c0 + s.chunk, p.v.n);
      stats_unit<T, DP>(p, j, c0, t1, part + idx * 4 * DP, red);
      __syncthreads();
      if (tid == 0) {
        __threadfence();
        s_last = atomicAdd(cnt.done + j, 1) == s.chunks - 1;
      }
      __syncthreads();
      if (s_last) {
        __threadfence();
        publish_stats<DP>(p, j, s.chunks, part);
        __syncthreads();
        if (tid == 0) {
          __threadfence();
          st_release(cnt.ready + j, 1);
        }
      }
    } else if (kind == 1) {
      wait_flag(cnt.ready + j);
      load_stats<DP>(p, j, kmean, vinv, vmean);
      const int b = static_cast<int>(j / p.k.heads), h = static_cast<int>(j % p.k.heads);
      const int nblk = p.nk_pad / kAttnBlockK;
      const int blocks = min(s.chunk, p.nk_pad - c0) / kAttnBlockK;
      for (int i = 0; i < blocks; ++i) {
        const int rb = c0 / kAttnBlockK + i;
        RowJob jb = rows_of<T>(p.k, b, h);
        jb.row0 = rb * kAttnBlockK + warp * kWarpRows;
        jb.prescale = 1.f;
        jb.mean = p.k_mean ? kmean : nullptr;
        jb.dot_mean = nullptr, jb.rowdot = nullptr;
        jb.out = p.k_out + j * p.nk_pad * DP;
        jb.scale = p.k_scale + (j * nblk + rb) * p.k_groups;
        if (p.k_groups == 4)
          quant_rows<T, DP, 4>(jb, kred);
        else
          quant_rows<T, DP, 1>(jb, kred);
        __syncthreads();  // kred is reused by the next block
      }
      constexpr int kTilesC = DP / kVChannels;
      for (int u = warp; u < blocks * kTilesC; u += kWarps)
        quant_v_tile<T, DP>(p, j, c0 + (u / kTilesC) * kVTokens, (u % kTilesC) * kVChannels, vinv,
                            p.v_mean ? vmean : nullptr);
    } else {
      const int per_q = s.q_units / G;  // units per query head
      const int hq = static_cast<int>(j % p.k.heads) * G + static_cast<int>(idx / per_q);
      const int b = static_cast<int>(j / p.k.heads);
      const int r0 = static_cast<int>(idx % per_q) * s.chunk;
      if (p.q_rowdot) {
        wait_flag(cnt.ready + j);
        load_stats<DP>(p, j, kmean, vinv, vmean);
      }
      const int64_t bhq = static_cast<int64_t>(b) * p.q.heads + hq;
      const int nblk = p.nq_pad / kAttnWarpQ;
      for (int row0 = r0 + warp * kWarpRows; row0 < min(r0 + s.chunk, p.nq_pad); row0 += kWarps * kWarpRows) {
        const int rb = row0 / kAttnWarpQ;
        RowJob jq = rows_of<T>(p.q, b, hq);
        jq.row0 = row0;
        jq.prescale = p.q_prescale;
        jq.mean = nullptr;
        jq.dot_mean = p.q_rowdot ? kmean : nullptr;
        jq.rowdot = p.q_rowdot ? p.q_rowdot + bhq * p.q.n : nullptr;
        jq.out = p.q_out + bhq * p.nq_pad * DP;
        jq.scale = p.q_scale + (bhq * nblk + rb) * p.q_groups;
        if (p.q_groups == 8)
          quant_rows<T, DP, 8>(jq, nullptr);
        else
          quant_rows<T, DP, 1>(jq, nullptr);
      }
    }
    __syncthreads();  // shared memory and s_ticket are reused by the next unit
  }
}

// Tokens per chunk: 128 (two K scale blocks, the attention kernels' key tile at most), more
// for long sequences so that a head has at most kMaxChunks partials.
constexpr int kMaxChunks = 64;
int chunk_tokens(int nk_pad) {
  const int blocks = (nk_pad / kAttnBlockK + kMaxChunks - 1) / kMaxChunks;
  return kAttnBlockK * (blocks > 2 ? blocks : 2);
}
int chunk_count(int nk_pad) {
  const int c = chunk_tokens(nk_pad);
  return nk_pad > 0 ? (nk_pad + c - 1) / c : 1;
}
// the 64-bit ticket, then done[bh] and ready[bh]; the partials start 256-byte aligned
size_t counter_bytes(int64_t bh) { return ((2 + 2 * bh) * sizeof(int) + 255) / 256 * 256; }

constexpr int kMaxDevices = 64;

int env_int(const char* name, int fallback) {
  const char* s = std::getenv(name);
  return s && *s ? std::atoi(s) : fallback;
}

template <typename T, int DP>
cudaError_t launch(const QuantQKVParams& p, cudaStream_t stream) {
  Sched s{};
  const int64_t bh = static_cast<int64_t>(p.k.batch) * p.k.heads;
  const int G = p.q.heads / p.k.heads;
  if (bh > 0x3fffffff) return cudaErrorInvalidValue;
  s.bh = static_cast<int>(bh);
  s.chunk = chunk_tokens(p.nk_pad);
  s.chunks = chunk_count(p.nk_pad);
  s.q_units = G * ((p.nq_pad + s.chunk - 1) / s.chunk);
  const int64_t per_head = 2 * s.chunks + s.q_units;
  s.total = bh * per_head;

  // SMs x resident CTAs per SM, looked up once per device
  static std::atomic<int> resident[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  int sms = 0, per_sm = 0;
  const int cached = dev < kMaxDevices ? resident[dev].load(std::memory_order_relaxed) : 0;
  if (cached > 0) {
    sms = cached >> 8, per_sm = cached & 0xff;
  } else {
    err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
    if (err == cudaSuccess) err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, qkv_kernel<T, DP>, kThreads, 0);
    if (err != cudaSuccess) return err;
    if (dev < kMaxDevices) resident[dev].store((sms << 8) | std::min(per_sm, 255), std::memory_order_relaxed);
  }
  per_sm = std::min(per_sm, env_int("SAGE_QKV_CTAS_PER_SM", 4));
  const int64_t ctas = std::min<int64_t>(static_cast<int64_t>(sms) * std::max(per_sm, 1), s.total);
  // the lag: enough tickets between a head's S and Z units for the CTAs in flight to finish
  // the S units first
  const int lag = static_cast<int>((ctas * env_int("SAGE_QKV_LAG_PCT", 100) / 100 + per_head - 1) / per_head);
  s.lag = std::max(lag, 1);

  // workspace: the counters (zeroed here), then the partials
  char* ws = static_cast<char*>(p.workspace);
  Counters cnt;
  cnt.ticket = reinterpret_cast<int*>(ws);  // 64-bit ticket in the first 8 bytes
  cnt.done = cnt.ticket + 2;
  cnt.ready = cnt.done + bh;
  float* partials = reinterpret_cast<float*>(ws + counter_bytes(bh));
  err = cudaMemsetAsync(ws, 0, counter_bytes(bh), stream);
  if (err != cudaSuccess) return err;
  qkv_kernel<T, DP><<<static_cast<unsigned>(ctas), kThreads, 0, stream>>>(p, s, cnt, partials);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_d(const QuantQKVParams& p, cudaStream_t stream) {
  switch (p.d_pad) {
    case 64: return launch<T, 64>(p, stream);
    case 128: return launch<T, 128>(p, stream);
    default: return launch<T, 256>(p, stream);
  }
}

}  // namespace

size_t quant_qkv_workspace_bytes(int64_t bh, int nk_pad, int d_pad) {
  return counter_bytes(bh) + static_cast<size_t>(bh) * chunk_count(nk_pad) * 4 * d_pad * sizeof(float);
}

cudaError_t quant_qkv(const QuantQKVParams& p, cudaStream_t stream) {
  const bool shapes = p.k.batch == p.q.batch && p.v.batch == p.q.batch && p.v.heads == p.k.heads &&
                      p.v.n == p.k.n && p.k.d == p.q.d && p.v.d == p.q.d && p.k.heads > 0 &&
                      p.q.heads % p.k.heads == 0 && p.q.dtype == p.k.dtype && p.v.dtype == p.q.dtype;
  const bool pads = (p.d_pad == 64 || p.d_pad == 128 || p.d_pad == 256) && p.d_pad >= p.q.d &&
                    p.nq_pad % kAttnWarpQ == 0 && p.nq_pad >= p.q.n && p.nk_pad % kAttnBlockK == 0 &&
                    p.nk_pad >= p.k.n;
  const bool groups = (p.q_groups == 1 || p.q_groups == 8) && (p.k_groups == 1 || p.k_groups == 4);
  if (!shapes || !pads || !groups || (p.q_rowdot && !p.k_mean) || !p.workspace) return cudaErrorInvalidValue;
  if (p.q.batch == 0 || p.q.heads == 0) return cudaSuccess;
  return p.q.dtype == DType::kHalf ? launch_d<__half>(p, stream) : launch_d<__nv_bfloat16>(p, stream);
}

}  // namespace sage

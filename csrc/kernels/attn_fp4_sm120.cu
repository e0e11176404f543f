// FP4 (SageAttention3-style) attention forward for consumer Blackwell, sm_120a / sm_121a, on the
// warp-level block-scaled MMA
//   mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3
// for both GEMMs. The number format, operand layouts and the exact math are those of fp4.h.
//
// Structure. One CTA = kFp4BlockQ (128) query rows of one (batch, head), 8 warps x 16 rows; grid
// (q blocks, heads, batch), the q blocks reversed so that the longest causal blocks start first.
// Each warp keeps its Q codes/scales in registers (D/64 k64 steps). K/V tiles of kFp4BlockK (128)
// keys -- K codes, V^T codes, their E4M3 scales, gk and the delta slice of this q block -- are
// staged into shared memory with cp.async, double-buffered. Per tile and warp:
//   S (16 x 128) = Q K^T          16 key blocks of 8 x D/64 MMAs (A = Q, B = K rows, "col")
//   t = (S gq gk + delta) c, masks, online softmax (fp32, unquantized row sums)
//   P^ = two-level FP4 quantization of 2688 p per 16 keys, done in registers; the E4M3 group
//        scale is reduced over the quad as a byte max (round-up and E4M3 encoding are monotonic)
//   C-fragment -> A-fragment: one 4x4 byte transpose per quad and 64-key chunk (3 shuffles)
//   O (16 x D) += P^ V^           D/8 channel blocks of 8 x 2 MMAs (B = V^T rows, "col")
// Epilogue: out = o gv / (2688 l), lse = (m + log2 l) ln 2, rows < nq, channels < d_out.
//
// Fragment layouts relied on (PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions"):
// lane = 4 * g + t (g = groupID = lane >> 2, t = threadID_in_group = lane & 3).
//  * "Matrix Fragments for mma.m16n8k64" (.e2m1, packed: 8 elements per .b32, element k in bits
//    4k..4k+3, i.e. little-endian bytes, low nibble first -- the storage order of fp4.h):
//      A (16 x 64, row): a0 = row g, k 8t..8t+7;  a1 = row g+8, same k;
//                        a2 = row g, k 32+8t..;    a3 = row g+8, k 32+8t..
//      B (64 x 8, col):  b0 = col g, k 8t..8t+7;  b1 = col g, k 32+8t..
//      C/D (16 x 8 f32): c0, c1 = row g, cols 2t, 2t+1;  c2, c3 = row g+8, cols 2t, 2t+1
//    So a0 is the 4 bytes at byte offset 4t of a 16-byte chunk of row g: rows of a K tile /
//    V^T tile are loaded with ldmatrix (b16 8x8: lane gets row lane/4, bytes 4(lane%4)..+3, "Warp-
//    level matrix load instruction: ldmatrix"), one 8x8 matrix per 16-byte chunk = 32 elements.
//  * "Block Scaling for mma.sync" (scale_vec::4X, .ue4m3): scale-a-data / scale-b-data are .b32
//    registers; with scale_vec::4X all 4 bytes are used and byte-id must be 0; byte i scales
//    k = 16i..16i+15 of the k64 step. thread-id-a = 0: lane 4r supplies row r of A, lane 4r+1
//    row r+8 (lanes 4r+2, 4r+3 are ignored); thread-id-b = 0: lane 4n supplies column n of B.
//    Every lane of this kernel loads the scales of the row (g + 8 (lane & 1)) / column g, so the
//    selected lanes hold the right ones whatever the others hold.
//  * ue4m3 is the E4M3 bit pattern of fp4.h's scale bytes (sign bit always 0).
//  * cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in d[7:4] and b in d[3:0] (cuda_fp4.hpp's
//    __nv_cvt_float2_to_fp4x2 relies on the same), rounding as fp4::e2m1_code.
// Shared tiles are stored row-major as in global memory (K: key rows of D/2 bytes, V^T: channel
// rows of 64 bytes), 16-byte chunks XOR-swizzled within 128-byte lines so that every ldmatrix
// phase (8 rows, one chunk) hits 8 distinct bank groups.
//
// Status: not yet run on sm_120 hardware. Everything but the two instructions above (the MMA's
// fragment / scale-selector semantics and the cvt) was checked on an H100, with both replaced
// by software versions of the layouts described here, against a CPU model of fp4.h (GQA,
// causal, tails, d_out < d, both layouts and dtypes): those layouts are what a first run on
// Blackwell has to confirm.
#include <cstdint>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "common.cuh"
#include "fp4.h"
#include "fp4_common.cuh"

// The instruction exists on the arch-specific (sm_120a, sm_121a) and family-specific (sm_120f,
// sm_121f) targets; nvcc 13 defines __CUDA_ARCH_FEAT_SM12x_ALL for the former and
// __CUDA_ARCH_FAMILY_SPECIFIC__ (1200 / 1210) for both. Elsewhere the kernel compiles to a trap.
#if defined(__CUDA_ARCH__) &&                                                          \
    (defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) ||     \
     (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) &&                                        \
      (__CUDA_ARCH_FAMILY_SPECIFIC__ == 1200 || __CUDA_ARCH_FAMILY_SPECIFIC__ == 1210)))
#define SAGE_FP4_SM120_DEVICE 1
#endif

namespace sage {
namespace {

constexpr int kFp4Warps = kFp4BlockQ / 16;
constexpr int kFp4Threads = kFp4Warps * 32;
static_assert(kFp4BlockQ == 128 && kFp4BlockK == 128, "the fragment code assumes 128 x 128 tiles");
static_assert(kFp4Group == 16, "scale_vec::4X of k64: one scale per 16 elements");

// Shared-memory layout of one pipeline stage (byte offsets, all multiples of 16).
template <int D>
struct Fp4Stage {
  static constexpr int kKChunks = D / 32;                  // 16-byte chunks per K row (D/2 bytes)
  static constexpr int kKBytes = kFp4BlockK * D / 2;       // K codes   [128 keys][D/2]
  static constexpr int kVBytes = D * kFp4BlockK / 2;       // V^T codes [D][64]
  static constexpr int kSkBytes = kFp4BlockK * D / 16;     // K scales  [128 keys][D/16]
  static constexpr int kSvBytes = D * kFp4BlockK / 16;     // V scales  [D][8]
  static constexpr int kOffK = 0;
  static constexpr int kOffV = kOffK + kKBytes;
  static constexpr int kOffSk = kOffV + kVBytes;
  static constexpr int kOffSv = kOffSk + kSkBytes;
  static constexpr int kOffGk = kOffSv + kSvBytes;         // float[128]
  static constexpr int kOffDelta = kOffGk + kFp4BlockK * 4;  // float[128]
  static constexpr int kBytes = kOffDelta + kFp4BlockK * 4;
  static_assert(kSkBytes / 16 <= 64, "K scales are copied by threads 0..63");
  static_assert(D <= 128, "V scales are copied by threads 128..128+D-1");
};

#if defined(SAGE_FP4_SM120_DEVICE)

// Byte offset of 16-byte chunk `chunk` of row `row` in a tile whose rows hold CHUNKS chunks: the
// chunk's slot within its 128-byte line is XORed with the line index. For rows 8k + r (r < 8) the
// offset is 128 k CHUNKS + (chunk_off(r, chunk) ^ (((k CHUNKS) & 7) << 4)), so the ldmatrix loops
// below add compile-time offsets to one of two per-lane bases.
template <int CHUNKS>
__device__ __forceinline__ int chunk_off(int row, int chunk) {
  const int u = row * CHUNKS + chunk;
  return ((u & ~7) | ((u ^ (u >> 3)) & 7)) * 16;
}

// ldmatrix .x4 at a shared-space address (lanes 8i..8i+7 give the row addresses of matrix i).
__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void cp_async8(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(dst)), "l"(src));
}

__device__ __forceinline__ uint32_t ldg_u32(const uint8_t* p) {
  return __ldg(reinterpret_cast<const unsigned int*>(p));
}

// D += (A * scale_A) (B * scale_B), m16n8k64, E2M1 operands, one UE4M3 scale per 16 of k.
__device__ __forceinline__ void mma_fp4(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1,
                                        uint32_t sfa, uint32_t sfb) {
  asm("mma.sync.aligned.m16n8k64.row.col.kind::mxf4nvf4.block_scale.scale_vec::4X.f32.e2m1.e2m1.f32.ue4m3 "
      "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3}, %10, {0, 0}, %11, {0, 0};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(sfa), "r"(sfb));
}


// The E4M3 byte of the smallest E4M3 value >= min(v, 448), v >= 0 (0 for v <= 0 or NaN): the
// same value as fp4::e4m3_round_up, without divisions. Monotonic in v.
__device__ __forceinline__ uint32_t e4m3_ceil_byte(float v) {
  if (!(v > 0.f)) return 0u;
  if (v >= 448.f) return 0x7eu;                                    // 448 = 1.75 * 2^8
  if (v < 0.015625f) return static_cast<uint32_t>(ceilf(v * 512.f));  // subnormal step 2^-9; 8 -> 2^-6
  const uint32_t bits = __float_as_uint(v) + 0xfffffu;            // round the mantissa up to 3 bits
  return (((bits >> 23) - 120u) << 3) | ((bits >> 20) & 7u);       // exponent bias 127 -> 7
}

// Value of a non-negative E4M3 byte (<= 0x7e).
__device__ __forceinline__ float e4m3_byte_value(uint32_t b) {
  const uint32_t e = b >> 3, m = b & 7u;
  return e ? __uint_as_float(((e + 120u) << 23) | (m << 20)) : static_cast<float>(m) * (1.f / 512.f);
}

// x / y, rounded to nearest (the same result as the IEEE division in all but rare hard-to-round
// cases, and exactly x / y whenever that is representable), for y a normal float and inv an
// approximation of 1 / y within a few ulp: one correction step on the exact FMA remainder.
// fp4.h's divisions (p~ / scale, o gv / (2688 l)) are IEEE divisions; this avoids the slow-path
// subroutine of div.rn.f32 (register pressure) at the price of those rare 1-ulp differences.
__device__ __forceinline__ float div_corrected(float x, float y, float inv) {
  const float q = x * inv;
  return fmaf(fmaf(-y, q, x), inv, q);
}

__device__ __forceinline__ float rcp_approx(float y) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;\n" : "=f"(r) : "f"(y));
  return r;
}

__device__ __forceinline__ uint32_t quad_max_u8x4(uint32_t w) {
  w = __vmaxu4(w, __shfl_xor_sync(0xffffffffu, w, 1));
  return __vmaxu4(w, __shfl_xor_sync(0xffffffffu, w, 2));
}

template <typename OutT>
__device__ __forceinline__ void store2(OutT* row, int col, float v0, float v1, bool pairs, int d_out) {
  if (pairs) {
    if (col < d_out) *reinterpret_cast<uint32_t*>(row + col) = pack2<OutT>(v0, v1);
  } else {
    if (col < d_out) row[col] = from_float<OutT>(v0);
    if (col + 1 < d_out) row[col + 1] = from_float<OutT>(v1);
  }
}

#endif  // SAGE_FP4_SM120_DEVICE

template <int D, typename OutT>
__global__ void __launch_bounds__(kFp4Threads, 1) attn_fp4_sm120_kernel(const AttnFp4Params p) {
#if defined(SAGE_FP4_SM120_DEVICE)
  using St = Fp4Stage<D>;
  constexpr int kKSteps = D / 64;            // k64 steps of Q K^T
  constexpr int kKeyBlocks = kFp4BlockK / 8;  // n8 blocks of S
  constexpr int kChBlocks = D / 8;            // n8 blocks of O
  __shared__ __align__(128) uint8_t smem[2 * St::kBytes];

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int qb = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int hkv = h / (p.heads / p.heads_kv);
  const int64_t bh = static_cast<int64_t>(b) * p.heads + h;
  const int64_t bhkv = static_cast<int64_t>(b) * p.heads_kv + hkv;
  const int nk_pad = p.nk_pad;

  const uint8_t* k_g = p.k + bhkv * nk_pad * (D / 2);
  const uint8_t* sk_g = p.sk + bhkv * nk_pad * (D / 16);
  const float* gk_g = p.gk + bhkv * nk_pad;
  const uint8_t* v_g = p.v + bhkv * D * (nk_pad / 2);
  const uint8_t* sv_g = p.sv + bhkv * D * (nk_pad / 16);
  const float* delta_g =
      p.delta ? p.delta + (bh * (p.nq_pad / kFp4BlockQ) + qb) * static_cast<int64_t>(nk_pad) : nullptr;

  int n_tiles = (p.nk + kFp4BlockK - 1) / kFp4BlockK;
  if (p.causal) n_tiles = min(n_tiles, qb + 1);  // key tile kt has a visible key iff kt <= qb

  // Stage key tile kt into buffer st (every thread issues its share of cp.async).
  auto load_tile = [&](int kt, int st) {
    uint8_t* s = smem + st * St::kBytes;
    const uint8_t* k_src = k_g + static_cast<int64_t>(kt) * (kFp4BlockK * D / 2);
#pragma unroll
    for (int c = tid; c < St::kKBytes / 16; c += kFp4Threads)
      cp_async16(s + St::kOffK + chunk_off<St::kKChunks>(c / St::kKChunks, c % St::kKChunks), k_src + c * 16, 16);
#pragma unroll
    for (int c = tid; c < D * 4; c += kFp4Threads) {
      const int ch = c >> 2, chunk = c & 3;
      cp_async16(s + St::kOffV + chunk_off<4>(ch, chunk),
                 v_g + static_cast<int64_t>(ch) * (nk_pad / 2) + kt * (kFp4BlockK / 2) + chunk * 16, 16);
    }
    if (tid < St::kSkBytes / 16)
      cp_async16(s + St::kOffSk + tid * 16, sk_g + static_cast<int64_t>(kt) * (kFp4BlockK * D / 16) + tid * 16, 16);
    else if (tid >= 64 && tid < 96)
      cp_async16(s + St::kOffGk + (tid - 64) * 16, gk_g + kt * kFp4BlockK + (tid - 64) * 4, 16);
    else if (tid >= 96 && tid < 128 && delta_g)
      cp_async16(s + St::kOffDelta + (tid - 96) * 16, delta_g + kt * kFp4BlockK + (tid - 96) * 4, 16);
    else if (tid >= 128 && tid < 128 + D)
      cp_async8(s + St::kOffSv + (tid - 128) * 8,
                sv_g + static_cast<int64_t>(tid - 128) * (nk_pad / 16) + kt * (kFp4BlockK / 16));
  };

  if (n_tiles > 0) load_tile(0, 0);
  cp_async_commit();
  if (!delta_g && tid < 2 * kFp4BlockK) {  // no Q-smoothing correction: delta reads as 0
    reinterpret_cast<float*>(smem + (tid >> 7) * St::kBytes + St::kOffDelta)[tid & 127] = 0.f;
  }

  // Q fragments of this warp's 16 rows (A operand of S, one set per k64 step) and their scales.
  const int row0 = qb * kFp4BlockQ + warp * 16;
  uint32_t qa[kKSteps][4], qsf[kKSteps];
  {
    const uint8_t* qr = p.q + (bh * p.nq_pad + row0 + g) * (D / 2) + 4 * t;
    const uint8_t* sr = p.sq + (bh * p.nq_pad + row0 + g + 8 * (lane & 1)) * (D / 16);
#pragma unroll
    for (int ks = 0; ks < kKSteps; ++ks) {
      qa[ks][0] = ldg_u32(qr + ks * 32);
      qa[ks][1] = ldg_u32(qr + 8 * (D / 2) + ks * 32);
      qa[ks][2] = ldg_u32(qr + ks * 32 + 16);
      qa[ks][3] = ldg_u32(qr + 8 * (D / 2) + ks * 32 + 16);
      qsf[ks] = ldg_u32(sr + ks * 4);
    }
  }
  const float gq0 = __ldg(p.gq + bh * p.nq_pad + row0 + g);
  const float gq1 = __ldg(p.gq + bh * p.nq_pad + row0 + g + 8);
  const float c = p.sm_scale_log2;

  // Per-lane ldmatrix offsets (see chunk_off): K rows 8nb + (lane & 7) (D = 128) or
  // 8 (2np + (lane >> 4)) + (lane & 7) (D = 64), V rows 8cb + (lane & 7); even / odd block.
  const uint32_t ld_off0 = D == 128 ? chunk_off<4>(lane & 7, lane >> 3)
                                    : chunk_off<2>(8 * (lane >> 4) + (lane & 7), (lane >> 3) & 1);
  const uint32_t ld_off1 = ld_off0 ^ 64u;
  const uint32_t lv_off0 = chunk_off<4>(lane & 7, lane >> 3);
  const uint32_t lv_off1 = lv_off0 ^ 64u;

  float o[kChBlocks][4];
#pragma unroll
  for (int cb = 0; cb < kChBlocks; ++cb) o[cb][0] = o[cb][1] = o[cb][2] = o[cb][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY};  // running max of t per row (g, g + 8)
  float l[2] = {0.f, 0.f};              // this thread's part of the row sums

  for (int kt = 0; kt < n_tiles; ++kt) {
    if (kt + 1 < n_tiles) load_tile(kt + 1, (kt + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint8_t* st = smem + (kt & 1) * St::kBytes;
    const uint32_t st_addr = smem_addr(st);

    // ---- S = Q K^T (block-scaled FP4) ----
    float s[kKeyBlocks][4];
#pragma unroll
    for (int nb = 0; nb < kKeyBlocks; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
    if constexpr (D == 128) {
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) {
        // matrices 0..3 = chunks 0..3 of keys 8nb..8nb+7 = (b0, b1) of k step 0, then of k step 1
        uint32_t r[4];
        ldsm_x4(r, st_addr + St::kOffK + 512 * nb + ((nb & 1) ? ld_off1 : ld_off0));
        const uint2 sf = *reinterpret_cast<const uint2*>(st + St::kOffSk + (nb * 8 + g) * 8);
        mma_fp4(s[nb], qa[0], r[0], r[1], qsf[0], sf.x);
        mma_fp4(s[nb], qa[1], r[2], r[3], qsf[1], sf.y);
      }
    } else {
#pragma unroll
      for (int np = 0; np < kKeyBlocks / 2; ++np) {
        // matrices 0..3 = (chunk 0, chunk 1) of key block 2np, then of key block 2np+1
        uint32_t r[4];
        ldsm_x4(r, st_addr + St::kOffK + 512 * np + ((np & 1) ? ld_off1 : ld_off0));
        const uint32_t sf0 = *reinterpret_cast<const uint32_t*>(st + St::kOffSk + (2 * np * 8 + g) * 4);
        const uint32_t sf1 = *reinterpret_cast<const uint32_t*>(st + St::kOffSk + ((2 * np + 1) * 8 + g) * 4);
        mma_fp4(s[2 * np], qa[0], r[0], r[1], qsf[0], sf0);
        mma_fp4(s[2 * np + 1], qa[0], r[2], r[3], qsf[0], sf1);
      }
    }

    // ---- t = (S gq gk + delta) c, masked ----
    {
      const float* gk_s = reinterpret_cast<const float*>(st + St::kOffGk);
      const float* dl_s = reinterpret_cast<const float*>(st + St::kOffDelta);
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) {
        const float2 gk2 = *reinterpret_cast<const float2*>(gk_s + nb * 8 + 2 * t);
        const float2 dl2 = *reinterpret_cast<const float2*>(dl_s + nb * 8 + 2 * t);
        s[nb][0] = (s[nb][0] * gq0 * gk2.x + dl2.x) * c;
        s[nb][1] = (s[nb][1] * gq0 * gk2.y + dl2.y) * c;
        s[nb][2] = (s[nb][2] * gq1 * gk2.x + dl2.x) * c;
        s[nb][3] = (s[nb][3] * gq1 * gk2.y + dl2.y) * c;
      }
    }
    if ((kt + 1) * kFp4BlockK > p.nk || (p.causal && kt == qb)) {
      const int i0 = row0 + g;
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = kt * kFp4BlockK + nb * 8 + 2 * t + (e & 1);
          const int i = i0 + 8 * (e >> 1);
          if (j >= p.nk || (p.causal && j > i)) s[nb][e] = -INFINITY;
        }
      }
    }

    // ---- online softmax: p = exp2(t - m), unquantized row sums ----
    float mu[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = -INFINITY;
#pragma unroll
      for (int nb = 0; nb < kKeyBlocks; ++nb) mx = fmaxf(mx, fmaxf(s[nb][2 * hh], s[nb][2 * hh + 1]));
      mx = warp_max_quad(mx);
      const float m_new = fmaxf(m[hh], mx);
      mu[hh] = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet uses 0 as max
      const float alpha = exp2f(m[hh] - mu[hh]);  // 0 while m[hh] is -inf
      m[hh] = m_new;
      l[hh] *= alpha;
#pragma unroll
      for (int cb = 0; cb < kChBlocks; ++cb) {
        o[cb][2 * hh] *= alpha;
        o[cb][2 * hh + 1] *= alpha;
      }
    }
#pragma unroll
    for (int nb = 0; nb < kKeyBlocks; ++nb) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        s[nb][e] = exp2f(s[nb][e] - mu[e >> 1]);
        l[e >> 1] += s[nb][e];
      }
    }

    // ---- P quantization: per row and 16 keys (key blocks 2G, 2G+1 = 4 values per lane of the
    // quad), scale = round-up(max(2688 p) * fp32(1/6)) in E4M3, codes = E2M1(2688 p / scale) ----
    // scw[hh][kc] byte i: scale of group 4kc + i of row g + 8hh, identical over the quad.
    uint32_t scw[2][2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
      for (int kc = 0; kc < 2; ++kc) {
        uint32_t w = 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int G = 4 * kc + i;
          const float mx = fmaxf(fmaxf(s[2 * G][2 * hh], s[2 * G][2 * hh + 1]),
                                 fmaxf(s[2 * G + 1][2 * hh], s[2 * G + 1][2 * hh + 1]));
          w |= e4m3_ceil_byte((kFp4PMax * mx) * (1.f / 6.f)) << (8 * i);  // fp4.h: 1/6 multiplies
        }
        scw[hh][kc] = quad_max_u8x4(w);
      }
    }
    // pw[hh][kc][half] byte j: codes of keys (2t, 2t+1) of key block 8kc + 4half + j, row g + 8hh
    uint32_t pw[2][2][2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
      for (int kc = 0; kc < 2; ++kc) {
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          float x[8];
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const int G = 4 * kc + 2 * half + q;
            const uint32_t sb = (scw[hh][kc] >> (8 * (2 * half + q))) & 0xffu;
            const float sc = sb ? e4m3_byte_value(sb) : 1.f;  // scale 0: all p are 0, codes 0
            const float inv = rcp_approx(sc);
            x[4 * q + 0] = div_corrected(kFp4PMax * s[2 * G][2 * hh], sc, inv);
            x[4 * q + 1] = div_corrected(kFp4PMax * s[2 * G][2 * hh + 1], sc, inv);
            x[4 * q + 2] = div_corrected(kFp4PMax * s[2 * G + 1][2 * hh], sc, inv);
            x[4 * q + 3] = div_corrected(kFp4PMax * s[2 * G + 1][2 * hh + 1], sc, inv);
          }
          pw[hh][kc][half] = fp4::e2m1x8(x);
        }
      }
    }
    // C layout -> A layout. For the 64-key chunk kc, lane t of a quad needs a0 = row g keys
    // 8t..8t+7 of the chunk = key block 8kc + t, whose byte s (keys 8t+2s, 8t+2s+1) lane s holds:
    // a 4x4 byte transpose over the quad, done for a0..a3 at once (a2: block 8kc+4+t; a1, a3: row
    // g+8). In round r lane t sends bytes u = t^r of its words and receives them from lane u.
    uint32_t pa[2][4];
#pragma unroll
    for (int kc = 0; kc < 2; ++kc) {
      pa[kc][0] = pa[kc][1] = pa[kc][2] = pa[kc][3] = 0u;
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const uint32_t u = static_cast<uint32_t>(t ^ r);
        const uint32_t sel = u | ((u + 4u) << 4);
        const uint32_t x = __byte_perm(__byte_perm(pw[0][kc][0], pw[0][kc][1], sel),
                                       __byte_perm(pw[1][kc][0], pw[1][kc][1], sel), 0x5410);
        const uint32_t v = r == 0 ? x : __shfl_xor_sync(0xffffffffu, x, r);
        const uint32_t sh = 8u * u;
        pa[kc][0] |= (v & 0xffu) << sh;
        pa[kc][2] |= ((v >> 8) & 0xffu) << sh;
        pa[kc][1] |= ((v >> 16) & 0xffu) << sh;
        pa[kc][3] |= (v >> 24) << sh;
      }
    }
    // thread-id-a 0: lane 4g supplies row g, lane 4g+1 row g+8
    const uint32_t sfa0 = (lane & 1) ? scw[1][0] : scw[0][0];
    const uint32_t sfa1 = (lane & 1) ? scw[1][1] : scw[0][1];

    // ---- O += P^ V^ ----
#pragma unroll
    for (int cb = 0; cb < kChBlocks; ++cb) {
      // matrices 0..3 = chunks 0..3 (keys 32i..32i+31) of channels 8cb..8cb+7 = (b0, b1) of kc 0, kc 1
      uint32_t r[4];
      ldsm_x4(r, st_addr + St::kOffV + 512 * cb + ((cb & 1) ? lv_off1 : lv_off0));
      const uint2 sf = *reinterpret_cast<const uint2*>(st + St::kOffSv + (cb * 8 + g) * 8);
      mma_fp4(o[cb], pa[0], r[0], r[1], sfa0, sf.x);
      mma_fp4(o[cb], pa[1], r[2], r[3], sfa1, sf.y);
    }
    __syncthreads();  // the next iteration's prefetch overwrites this stage
  }
  cp_async_wait<0>();

  // ---- epilogue ----
  const int64_t out_elem = sizeof(OutT);
  const bool pairs = (p.d_out % 2 == 0) && p.o_stride_b % 2 == 0 && p.o_stride_h % 2 == 0 &&
                     p.o_stride_n % 2 == 0 && reinterpret_cast<uintptr_t>(p.o) % (2 * out_elem) == 0;
  const float* gv_g = p.gv + bhkv * D;
#pragma unroll
  for (int hh = 0; hh < 2; ++hh) {
    const float lsum = warp_sum_quad(l[hh]);
    const int row = row0 + g + 8 * hh;
    if (row >= p.nq) continue;
    const float den = kFp4PMax * lsum;  // >= 2688 when a key was seen (the max has p = 1)
    const float inv = rcp_approx(den);
    OutT* orow = reinterpret_cast<OutT*>(p.o) + b * p.o_stride_b + h * p.o_stride_h +
                 static_cast<int64_t>(row) * p.o_stride_n;
#pragma unroll
    for (int cb = 0; cb < kChBlocks; ++cb) {
      const int col = cb * 8 + 2 * t;
      const float2 gv2 = *reinterpret_cast<const float2*>(gv_g + col);
      const float v0 = lsum > 0.f ? div_corrected(o[cb][2 * hh] * gv2.x, den, inv) : 0.f;
      const float v1 = lsum > 0.f ? div_corrected(o[cb][2 * hh + 1] * gv2.y, den, inv) : 0.f;
      store2<OutT>(orow, col, v0, v1, pairs, p.d_out);
    }
    if (p.lse && t == 0)
      p.lse[bh * p.nq + row] = lsum > 0.f ? (m[hh] + log2f(lsum)) * kLn2 : -INFINITY;
  }
#else
#if defined(__CUDA_ARCH__)
  __trap();  // built for an arch without the block-scaled FP4 mma.sync
#endif
#endif  // SAGE_FP4_SM120_DEVICE
}

bool aligned(const void* ptr, uintptr_t n) { return reinterpret_cast<uintptr_t>(ptr) % n == 0; }

template <int D, typename OutT>
cudaError_t launch(const AttnFp4Params& p, cudaStream_t stream) {
  const dim3 grid((p.nq + kFp4BlockQ - 1) / kFp4BlockQ, p.heads, p.batch);
  attn_fp4_sm120_kernel<D, OutT><<<grid, kFp4Threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t attn_fp4_sm120(const AttnFp4Params& p, cudaStream_t stream) {
  if (p.d != 64 && p.d != 128) return cudaErrorInvalidValue;
  if (p.d_out < 1 || p.d_out > p.d) return cudaErrorInvalidValue;
  if (p.o_dtype != DType::kHalf && p.o_dtype != DType::kBFloat16) return cudaErrorInvalidValue;
  if (p.batch < 0 || p.heads < 0 || p.heads_kv < 1 || p.heads % p.heads_kv != 0) return cudaErrorInvalidValue;
  if (p.batch > 65535 || p.heads > 65535) return cudaErrorInvalidValue;
  if (p.nq < 0 || p.nk < 0 || p.nq > p.nq_pad || p.nk > p.nk_pad) return cudaErrorInvalidValue;
  if (p.nq_pad % kFp4BlockQ != 0 || p.nk_pad % kFp4BlockK != 0) return cudaErrorInvalidValue;
  if (!p.q || !p.k || !p.v || !p.sq || !p.sk || !p.sv || !p.gq || !p.gk || !p.gv || !p.o)
    return cudaErrorInvalidValue;
  // cp.async sources (16-byte chunks; V scales in 8-byte pieces) and the 4/8-byte register loads.
  if (!aligned(p.k, 16) || !aligned(p.v, 16) || !aligned(p.sk, 16) || !aligned(p.gk, 16) ||
      !aligned(p.sv, 8) || !aligned(p.q, 4) || !aligned(p.sq, 4) || !aligned(p.gq, 4) || !aligned(p.gv, 8) ||
      (p.delta && !aligned(p.delta, 16)) || (p.lse && !aligned(p.lse, 4)) || !aligned(p.o, 2))
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.heads == 0 || p.nq == 0) return cudaSuccess;

  const bool bf16 = p.o_dtype == DType::kBFloat16;
  if (p.d == 64) return bf16 ? launch<64, __nv_bfloat16>(p, stream) : launch<64, __half>(p, stream);
  return bf16 ? launch<128, __nv_bfloat16>(p, stream) : launch<128, __half>(p, stream);
}

}  // namespace sage

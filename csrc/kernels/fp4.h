// Plain C++ interface of the FP4 (SageAttention3-style) kernels: parameter structs, the exact
// number format and the launch functions. Included by csrc/binding/ops_fp4.cpp; no torch header.
//
// The scheme (sageattention3_blackwell/emulation.py is the pure-torch model of it, and the
// oracle the kernel tests compare against):
//
// Operands. Q, K (quantized along the head dim D) and V (transposed, quantized along tokens)
// are stored as
//   codes   uint8, two E2M1 values per byte, the even element in the low nibble;
//           E2M1 magnitudes {0, 0.5, 1, 1.5, 2, 3, 4, 6} are codes 0..7, bit 3 is the sign
//   scale   uint8 E4M3 (fn), one per 16 consecutive elements along the reduction axis
//   gscale  fp32, one per row (Q, K: per token) or per channel (V)
// and an element is  e2m1(code) * e4m3(scale) * gscale.
//   gscale = amax(row) * (1/2688) (2688 = 6 * 448; 1 for an all-zero row), so that the group
//   holding the row's maximum gets the largest E4M3 scale: no E4M3 underflow or overflow
//   whatever the input's magnitude.
//   scale  = the smallest E4M3 value >= min((amax(group) / gscale) * (1/6), 448) ("round up":
//            a group's values do not saturate)
//   The constants 1/2688 and 1/6 are fp32 values and multiply; the two divisions (by gscale
//   and by scale * gscale) are IEEE divisions: so the emulation (torch, whose CUDA division by
//   a scalar is a multiplication by its reciprocal) and the kernels agree bit for bit.
//   code   = E2M1 round-to-nearest-even of x / (scale * gscale), saturating at +-6 (0 when
//            scale is 0).
// Q is smoothed per block of kFp4BlockQ rows (x - mean of its block), K per head (x - mean
// over all tokens); the means are fp32 inputs computed by the caller. The exact correction
// of Q smoothing, delta[i_block, j] = mean_q(block) . (k_j - mean_k), is an fp32 input.
//
// Attention, per (batch, head, block of kFp4BlockQ query rows), key tiles of kFp4BlockK:
//   c       = sm_scale * log2(e)
//   t_ij    = (S_ij * gq_i * gk_j + delta_ij) * c,  S = the block-scaled FP4 product q . k
//             (-inf where j >= nk, or j > i when causal: top-left aligned)
//   m_i     running max of t over the tiles so far (a row with no key yet uses 0 as max)
//   p_ij    = exp2(t_ij - m_i);  l_i = l_i * exp2(m_old - m_i) + sum_j p_ij   (fp32, unquantized)
//   P quantization (two-level): p~ = 2688 * p in [0, 2688]; per 16 consecutive keys
//             (aligned to multiples of 16) the E4M3 scale = round-up(max p~ * (1/6)) and the
//             E2M1 codes of p~ / scale, as above with gscale = 1
//   o_i     = o_i * exp2(m_old - m_i) + sum_j P^_ij V^_jd  (fp32; V^ without its gscale)
//   out_id  = o_id * gv_d / (2688 * l_i)   (0 when l_i == 0)
//   lse_i   = (m_i + log2(l_i)) * ln(2)    (-inf when l_i == 0): the LSE of the smoothed scores
//             t / log2(e); the caller adds what K smoothing removed (sm_scale * q_i . mean_k)
// Output strides are in elements. Causal is top-left aligned (query i sees keys j <= i), as
// torch's SDPA with is_causal=True.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

#include "launch.h"  // DType, Input4D

namespace sage {

constexpr int kFp4BlockQ = 128;  // query rows per CTA, and the Q-smoothing block
constexpr int kFp4BlockK = 128;  // keys per tile: the online-softmax block and the K/V padding
constexpr int kFp4Group = 16;    // elements per E4M3 scale
constexpr float kFp4PMax = 2688.f;  // 6 * 448
constexpr float kFp4InvPMax = 1.f / 2688.f;  // fp32 constants of the format (see above)
constexpr float kFp4InvE2M1Max = 1.f / 6.f;

// Quantize Q or K ([B, H, N, D] -> codes [B, H, n_pad, d_pad/2], scale [B, H, n_pad, d_pad/16],
// gscale [B, H, n_pad]) or, with `transpose`, V ([B, H, N, D] -> codes [B, H, d_pad, n_pad/2],
// scale [B, H, d_pad, n_pad/16], gscale [B, H, d_pad]). Rows n >= N and columns d >= D are
// zero (codes 0, scale 0, gscale 1).
struct QuantFp4Params {
  Input4D in;
  int n_pad;             // multiple of kFp4BlockK (and of kFp4BlockQ)
  int d_pad;             // 64 or 128
  int transpose;         // 0: Q/K layout, 1: V layout
  const float* mean;     // [B, H, n_pad / mean_rows, D] fp32, subtracted, or null (not with transpose)
  int mean_rows;         // rows sharing one mean: kFp4BlockQ for Q, n_pad for K
  uint8_t* codes;
  uint8_t* scale;
  float* gscale;
};
cudaError_t quant_fp4(const QuantFp4Params& p, cudaStream_t stream);

// The attention kernel's inputs: the quantized operands above, for GQA K/V may have fewer
// heads (query head h reads K/V head h / (heads / heads_kv)).
struct AttnFp4Params {
  const uint8_t* q;      // [B, H, nq_pad, d/2]      codes
  const uint8_t* k;      // [B, Hkv, nk_pad, d/2]
  const uint8_t* v;      // [B, Hkv, d, nk_pad/2]
  const uint8_t* sq;     // [B, H, nq_pad, d/16]     E4M3 scales
  const uint8_t* sk;     // [B, Hkv, nk_pad, d/16]
  const uint8_t* sv;     // [B, Hkv, d, nk_pad/16]
  const float* gq;       // [B, H, nq_pad]
  const float* gk;       // [B, Hkv, nk_pad]
  const float* gv;       // [B, Hkv, d]
  const float* delta;    // [B, H, nq_pad / kFp4BlockQ, nk_pad] fp32, or null
  void* o;               // output rows: o + b*o_stride_b + h*o_stride_h + i*o_stride_n, d_out columns
  DType o_dtype;
  int64_t o_stride_b, o_stride_h, o_stride_n;
  int d_out;             // <= d: the caller's head dim (the rest is zero padding)
  float* lse;            // [B, H, nq] fp32, or null
  int batch, heads, heads_kv;
  int nq, nk, nq_pad, nk_pad;
  int d;                 // 64 or 128
  float sm_scale_log2;   // sm_scale * log2(e)
  int causal;
};

#if defined(SAGE_FP4_SM120)
// sm_120a / sm_121a: warp-level block-scaled MMA (mma.sync ... kind::mxf4nvf4.block_scale).
cudaError_t attn_fp4_sm120(const AttnFp4Params& p, cudaStream_t stream);
#endif
#if defined(SAGE_FP4_SM100)
// sm_100a: tcgen05.mma ... kind::mxf4nvf4.block_scale, accumulators in tensor memory.
cudaError_t attn_fp4_sm100(const AttnFp4Params& p, cudaStream_t stream);
#endif

}  // namespace sage

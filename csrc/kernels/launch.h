// Plain C++ interface of the kernels: parameter structs and launch functions.
// Included by the torch binding layer; includes no torch header itself.
#pragma once

#include <cstdint>
#include <cuda_runtime.h>

namespace sage {

enum class DType : int { kHalf = 0, kBFloat16 = 1 };

// INT8 quantization of Q or K.
// Rows are grouped in blocks of `block_rows`; each block has `groups` scales:
//   groups == 1: one scale per block (per-warp Q, per-block K)
//   groups == 8: row r of the block uses scale r % 8 (per-thread Q)
//   groups == 4: row r uses scale (r % 8) / 2 (per-thread K)
// A [B, H, N, D] fp16/bf16 input with arbitrary strides (unit stride on D).
// Packed sequences (varlen; quant_qkv only): with `seqs`, batch entry b is the rows
// seqs[b] .. seqs[b] + seqs[batch + b] - 1 (int32 row starts, then row counts, each count at
// most n) of one [rows, H, D] tensor; stride_b is then unused.
struct Input4D {
  const void* data;
  DType dtype;
  int64_t stride_b, stride_h, stride_n;
  int batch, heads, n, d;
  const int* seqs;
};

struct QuantInt8Params {
  Input4D in;
  int n_pad, d_pad;            // output sizes (multiples of block_rows / 16); padding is zero
  int block_rows, groups;
  float prescale;              // x is multiplied by this first (sm_scale*log2(e) for Q, 1 for K)
  const float* mean;           // [B, H, d] fp32, subtracted (K smoothing), or null
  const float* dot_mean;       // [B, heads_kv, d] fp32: also write rowdot = x . mean[h / (heads/heads_kv)]
  int heads_kv;
  int8_t* out;                 // [B, H, n_pad, d_pad]
  float* scale;                // [B, H, n_pad / block_rows * groups]
  float* rowdot;               // [B, H, n] or null
};
cudaError_t quant_int8(const QuantInt8Params& p, cudaStream_t stream);

#if defined(SAGE_FP8)
// FP8 e4m3 per-channel quantization of V ([B, H, N, D], unit stride on D) into the
// transposed, token-permuted layout the FP8 PV MMA reads: out[B, H, d_pad, n_pad].
struct QuantVFp8Params {
  Input4D in;
  int n_pad, d_pad;            // n_pad multiple of 64, d_pad multiple of 32
  float scale_max;             // 448, or 2.25 for the fp16-accumulating PV
  uint8_t* out;
  float* scale;                // [B, H, d_pad]
  float* mean;                 // [B, H, d_pad] when smoothing, else null
};
cudaError_t quant_v_fp8(const QuantVFp8Params& p, cudaStream_t stream);

// Q, K and V quantized together: per-channel statistics over a sample of 128 evenly spaced
// keys (every key up to 128): the K mean and V's largest |v| (V's scale: 8x that, or, when
// smoothing V, its sum/max/min over all keys -> scale and mean), then one grid whose blocks
// quantize V tiles, K row blocks and Q row blocks, then (sampled V scale without v_full only)
// a grid that gives each channel with a value past its sampled scale the exact scale and
// quantizes it again. Same outputs
// as quant_int8 (Q with block_rows kAttnWarpQ, K with kAttnBlockK and the K mean), given that
// K mean (this kernel's own fixed-order fp32 sum / rows), and, when smoothing V, quant_v_fp8.
struct QuantQKVParams {
  Input4D q;                   // [B, Hq, Nq, D]
  Input4D k, v;                // [B, Hkv, Nk, D] each, Hkv dividing Hq
  int nq_pad, nk_pad, d_pad;   // nq_pad multiple of 16, nk_pad of 64; d_pad 64, 128 or 256
  float q_prescale;            // Q is multiplied by this first (sm_scale * log2(e))
  int q_groups, k_groups;      // 1 or 8, 1 or 4 (see QuantInt8Params)
  float v_scale_max;           // 448, or 2.25 for the fp16-accumulating PV
  int8_t* q_out;               // [B, Hq, nq_pad, d_pad]
  float* q_scale;              // [B, Hq, nq_pad / 16 * q_groups]
  float* q_rowdot;             // [B, Hq, Nq]: q . k_mean[h / (Hq / Hkv)], or null (needs k_mean)
  int8_t* k_out;               // [B, Hkv, nk_pad, d_pad]
  float* k_scale;              // [B, Hkv, nk_pad / 64 * k_groups]
  float* k_mean;               // [B, Hkv, D]: written, then subtracted from K; null: no smoothing
  uint8_t* v_out;              // e4m3 [B, Hkv, v_terms * d_pad, nk_pad], token-permuted as quant_v_fp8
  int v_terms;                 // 1, or 2: the d_pad rows of each value's e4m3 rounding, then d_pad rows
                               // of the rounding of what it left (hi + lo: about bf16's precision)
  float* v_scale;              // [B, Hkv, d_pad]
  float* v_mean;               // [B, Hkv, d_pad] when smoothing V, else null
  float* v_inv;                // [B, Hkv, d_pad] workspace: v_scale_max / amax
  bool v_full;                 // not smoothing V: the statistics read all of V and decide V's
                               // fallback themselves (same results; for a V that fits in L2)
  uint32_t* v_over;            // [B * Hkv * d_pad * 33 / 32] workspace: channels whose sampled scale a
                               // value overflowed, then per 32-channel group its V tiles written
                               // (null when smoothing V or v_full)
};
cudaError_t quant_qkv(const QuantQKVParams& p, cudaStream_t stream);
#endif

// How P*V is accumulated.
enum class PVAccum : int {
  kFp32 = 0,      // straight into the fp32 accumulator
  kFp16Fp32 = 1,  // fp16 per KV block (fp16 PV) then fp32
  kFp32Fp32 = 2,  // fresh fp32 per KV block (fp8 PV) then fp32
  kFp32Fp16 = 3,  // fp16 per KV block with the fp16-accumulating fp8 MMA, then fp32
};

struct AttnParams {
  const int8_t* q;             // [B, Hq, nq_pad, D]
  const int8_t* k;             // [B, Hkv, nk_pad, D]
  const void* v;               // fp16/bf16: [B, Hkv, nk, D] strided; fp8: [B, Hkv, D, nk_pad]
  DType v_dtype;               // fp16 PV only
  int64_t v_stride_b, v_stride_h, v_stride_n;
  const float* q_scale;        // [B, Hq, nq_pad / warp_q * q_groups]
  const float* k_scale;        // [B, Hkv, nk_pad / 64 * k_groups]
  int q_groups, k_groups;      // 1 or 8, 1 or 4
  const float* v_scale;        // fp8: [B, Hkv, D]
  int v_terms;                 // sm90 fp8: V^T [B, Hkv, v_terms * D, nk_pad], each value the sum of
                               // v_terms e4m3 numbers (2: hi then lo rows; 0 or 1: one)
  const float* v_mean;         // [B, Hkv, D] (added to the output) or null
  void* o;                     // output, fp16/bf16
  DType o_dtype;
  int64_t o_stride_b, o_stride_h, o_stride_n;
  int d_out;                   // channels written (<= D)
  float* lse;                  // [B, Hq, nq] natural log, or null
  const float* lse_add;        // [B, Hq, nq] added to lse times lse_add_scale, or null
  float lse_add_scale;
  int batch, heads_q, heads_kv, nq, nk, nq_pad, nk_pad;
  int causal;
  PVAccum accum;
  int* tile_counter;           // sm90: zeroed ints for the dynamic work-tile schedule (the
                               // counter, then each CTA's tile indices), or null; see below
  // Packed sequences (varlen; sm90 only, which then needs tile_counter): int32 [2, batch], the
  // row starts then the row counts of each batch entry's queries in the packed output
  // o [total_q, Hq, d_out] (o_stride_b unused; lse [Hq, total_q]) and of its keys (counts of
  // at most nq / nk); q, k, v, the scales and lse_add stay in the padded [B, H, n_pad]
  // layouts. Null: every entry has nq queries and nk keys.
  const int* seq_q;
  const int* seq_k;
  int total_q;
};

// Query rows per CTA, per warp (the per-warp/per-thread Q scale layout depends on it) and keys per block.
constexpr int kAttnWarpQ = 16;
constexpr int kAttnBlockQ = 128;
constexpr int kAttnBlockK = 64;

// head_dim is 64, 128 or 256. Returns cudaErrorInvalidValue for a combination not built.
#if defined(SAGE_FP16_PV)
cudaError_t attn_fp16_pv(const AttnParams& p, int head_dim, cudaStream_t stream);
#endif
#if defined(SAGE_FP8)
cudaError_t attn_fp8_pv(const AttnParams& p, int head_dim, cudaStream_t stream);
#endif

#if defined(SAGE_SM90)
// Hopper (sm_90a) kernel: fp8 V^T from quant_v_fp8 with nk_pad a multiple of kSm90BlockK,
// accum kFp32Fp32 only, head_dim 64 or 128.
constexpr int kSm90BlockK = 128;
cudaError_t attn_sm90(const AttnParams& p, int head_dim, cudaStream_t stream);
// Zeroed ints attn_sm90 wants in p.tile_counter for this call: 1 + 2 x its grid where the
// persistent CTAs take work tiles from a counter (causal calls with more tiles than SMs, and
// packed sequences), else 0 (a fixed tile stride; causal calls without a counter launch one
// CTA per tile). SAGEATTN_SM90_SCHED=0 or 1 forces the fixed stride or the counter on every
// call but packed ones (tests, A/B runs).
int attn_sm90_scratch_ints(const AttnParams& p, int head_dim);
#endif

}  // namespace sage

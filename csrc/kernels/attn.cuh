// INT8 QK^T attention on mma.sync (m16n8k32 s8), P*V in fp16/bf16 (m16n8k16) or fp8 e4m3
// (m16n8k32), online softmax in base 2. FlashAttention-2 structure: a CTA owns 128 query
// rows (warps of 16*MT rows, Q fragments kept in registers) and walks the keys in blocks of
// 64 with a two-stage cp.async pipeline.
//
// Scales: Q was multiplied by sm_scale*log2(e) before quantization, so S arrives in log2
// units after dequantization with one q scale and one k scale per thread (per-thread
// groups are the rows/columns a thread's MMA fragments hold; per-warp is the same code
// with one group).
#pragma once

#include <cfloat>
#include <type_traits>
#include "common.cuh"

namespace sage {

enum PVKind : int { kPVHalf = 0, kPVBf16 = 1, kPVFp8 = 2 };

template <int D, int MT, int PVK>
struct AttnShape {
  static constexpr int kWarpQ = 16 * MT;
  static constexpr int kWarps = kAttnBlockQ / kWarpQ;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBK = kAttnBlockK;
  static constexpr bool kFp8 = PVK == kPVFp8;
  static constexpr int kQKChunks = D / 16;                      // 16-byte chunks per int8 row
  static constexpr int kVChunks = kFp8 ? kBK / 16 : D * 2 / 16;  // per V row (fp8: a channel)
  static constexpr int kVRows = kFp8 ? D : kBK;
  static constexpr int kKBytes = kBK * D;
  static constexpr int kVBytes = kVRows * kVChunks * 16;
  static constexpr int kBufBytes = kKBytes + kVBytes;
  static constexpr int kQBytes = kAttnBlockQ * D;
  static_assert(kQBytes <= kBufBytes, "the Q tile lives in the second K/V buffer");
  static constexpr int kSmem = 2 * kBufBytes;
};

// Two-level accumulation: add a per-block fp16 accumulator fragment (rows g and g+8, two
// columns each) into the fp32 one.
__device__ __forceinline__ void add_f16_block(float (&acc)[4], const uint32_t (&blk)[2]) {
  const float2 lo = __half22float2(*reinterpret_cast<const __half2*>(&blk[0]));
  const float2 hi = __half22float2(*reinterpret_cast<const __half2*>(&blk[1]));
  acc[0] += lo.x, acc[1] += lo.y, acc[2] += hi.x, acc[3] += hi.y;
}

template <int D, int MT, int PVK, int ACC, typename OutT>
__global__ void __launch_bounds__(AttnShape<D, MT, PVK>::kThreads, 1)
    attn_kernel(const AttnParams p) {
  using S = AttnShape<D, MT, PVK>;
  using VT = typename std::conditional<PVK == kPVBf16, __nv_bfloat16, __half>::type;
  constexpr int BK = S::kBK, WQ = S::kWarpQ, NT = S::kThreads, QC = S::kQKChunks, VC = S::kVChunks;
  constexpr int NTILE = BK / 8;  // n8 tiles of S per block
  constexpr float OFF = S::kFp8 ? 8.807354922057604f : 0.f;  // log2(448): P scaled into e4m3 range

  extern __shared__ __align__(128) uint8_t smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3, mi = lane >> 3;
  const int bx = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.heads_q / p.heads_kv);
  const int q0 = bx * kAttnBlockQ;

  const int8_t* qg = p.q + ((static_cast<int64_t>(b) * p.heads_q + h) * p.nq_pad + q0) * D;
  const int8_t* kg = p.k + (static_cast<int64_t>(b) * p.heads_kv + hk) * p.nk_pad * D;
  uint8_t* sQ = smem + S::kBufBytes;

  auto load_kv = [&](int kb, int buf) {
    uint8_t* sK = smem + buf * S::kBufBytes;
    uint8_t* sV = sK + S::kKBytes;
    const int8_t* ks = kg + static_cast<int64_t>(kb) * BK * D;
    for (int c = tid; c < BK * QC; c += NT) {
      const int r = c / QC, ch = c % QC;
      cp_async16(sK + swz<QC>(r, ch), ks + r * D + ch * 16, 16);
    }
    if constexpr (S::kFp8) {
      const uint8_t* vs = static_cast<const uint8_t*>(p.v) +
                          (static_cast<int64_t>(b) * p.heads_kv + hk) * D * p.nk_pad + kb * BK;
      for (int c = tid; c < D * VC; c += NT) {
        const int r = c / VC, ch = c % VC;
        cp_async16(sV + swz<VC>(r, ch), vs + static_cast<int64_t>(r) * p.nk_pad + ch * 16, 16);
      }
    } else {
      const VT* vs = static_cast<const VT*>(p.v) + b * p.v_stride_b + hk * p.v_stride_h;
      for (int c = tid; c < BK * VC; c += NT) {
        const int r = c / VC, ch = c % VC, tok = kb * BK + r;
        const bool ok = tok < p.nk;
        cp_async16(sV + swz<VC>(r, ch), vs + static_cast<int64_t>(ok ? tok : 0) * p.v_stride_n + ch * 8, ok ? 16 : 0);
      }
    }
  };

  // keys this CTA needs
  int kv_lim = p.nk;
  if (p.causal) kv_lim = min(kv_lim, q0 + kAttnBlockQ);
  const int nkb = (kv_lim + BK - 1) / BK;

  for (int c = tid; c < kAttnBlockQ * QC; c += NT) {
    const int r = c / QC, ch = c % QC;
    cp_async16(sQ + swz<QC>(r, ch), qg + r * D + ch * 16, 16);
  }
  cp_async_commit();
  if (nkb > 0) load_kv(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[MT][D / 32][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int s = 0; s < D / 32; ++s)
      ldmatrix_x4(qf[mt][s], sQ + swz<QC>(warp * WQ + mt * 16 + (mi & 1) * 8 + (lane & 7), 2 * s + (mi >> 1)));
  __syncthreads();  // sQ is overwritten by the second K/V buffer

  const int nwb = p.nq_pad / WQ;
  const float qsc = p.q_scale[((static_cast<int64_t>(b) * p.heads_q + h) * nwb + bx * S::kWarps + warp) * p.q_groups +
                              (p.q_groups == 8 ? g : 0)];
  const float* ksp = p.k_scale + (static_cast<int64_t>(b) * p.heads_kv + hk) * (p.nk_pad / BK) * p.k_groups +
                     (p.k_groups == 4 ? t : 0);
  const int row0 = q0 + warp * WQ;  // first query row of this warp

  float o[MT][D / 8][4];
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.f;
  }

  for (int kb = 0; kb < nkb; ++kb) {
    const int buf = kb & 1;
    if (kb + 1 < nkb) load_kv(kb + 1, buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint8_t* cK = smem + buf * S::kBufBytes;
    const uint8_t* cV = cK + S::kKBytes;

    // S = Q K^T (int32)
    int32_t sacc[MT][NTILE][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NTILE; ++j) sacc[mt][j][0] = sacc[mt][j][1] = sacc[mt][j][2] = sacc[mt][j][3] = 0;
#pragma unroll
    for (int s = 0; s < D / 32; ++s) {
#pragma unroll
      for (int jp = 0; jp < NTILE / 2; ++jp) {
        uint32_t kf[4];
        ldmatrix_x4(kf, cK + swz<QC>(8 * (2 * jp + (mi >> 1)) + (lane & 7), 2 * s + (mi & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt) {
          mma_s8(sacc[mt][2 * jp], qf[mt][s], kf[0], kf[1]);
          mma_s8(sacc[mt][2 * jp + 1], qf[mt][s], kf[2], kf[3]);
        }
      }
    }

    // dequantize, mask, online softmax (row g and g+8 of each m tile)
    const float f = qsc * ksp[static_cast<int64_t>(kb) * p.k_groups];
    const bool masked = (kb + 1) * BK > p.nk || (p.causal && (kb + 1) * BK - 1 > row0);
    float sf[MT][NTILE][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int j = 0; j < NTILE; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = static_cast<float>(sacc[mt][j][e]) * f;
          if (masked) {
            const int col = kb * BK + 8 * j + 2 * t + (e & 1);
            const int row = row0 + mt * 16 + g + 8 * (e >> 1);
            if (col >= p.nk || (p.causal && col > row)) x = -INFINITY;
          }
          sf[mt][j][e] = x;
        }
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < NTILE; ++j) mx = fmaxf(mx, fmaxf(sf[mt][j][2 * hr], sf[mt][j][2 * hr + 1]));
        mx = warp_max_quad(mx);
        const float m_new = fmaxf(m[mt][hr], mx);
        // a row that has seen no key yet keeps m = -inf: guard the -inf - -inf cases
        const float alpha = m[mt][hr] == -INFINITY ? 0.f : ex2(m[mt][hr] - m_new);
        const float mo = m_new == -INFINITY ? 0.f : m_new - OFF;
        m[mt][hr] = m_new;
        float rs = 0.f;
#pragma unroll
        for (int j = 0; j < NTILE; ++j)
#pragma unroll
          for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
            const float pe = ex2(sf[mt][j][e] - mo);
            sf[mt][j][e] = pe;
            rs += pe;
          }
        l[mt][hr] = l[mt][hr] * alpha + rs;
#pragma unroll
        for (int n = 0; n < D / 8; ++n) o[mt][n][2 * hr] *= alpha, o[mt][n][2 * hr + 1] *= alpha;
      }

    // O += P V
    if constexpr (!S::kFp8) {
      uint32_t pa[MT][BK / 16][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int s = 0; s < BK / 16; ++s) {
          pa[mt][s][0] = pack2<VT>(sf[mt][2 * s][0], sf[mt][2 * s][1]);
          pa[mt][s][1] = pack2<VT>(sf[mt][2 * s][2], sf[mt][2 * s][3]);
          pa[mt][s][2] = pack2<VT>(sf[mt][2 * s + 1][0], sf[mt][2 * s + 1][1]);
          pa[mt][s][3] = pack2<VT>(sf[mt][2 * s + 1][2], sf[mt][2 * s + 1][3]);
        }
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t vf[BK / 16][4];
#pragma unroll
        for (int s = 0; s < BK / 16; ++s)
          ldmatrix_x4_trans(vf[s], cV + swz<VC>(16 * s + (mi & 1) * 8 + (lane & 7), 2 * np + (mi >> 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            float(&acc)[4] = o[mt][2 * np + hh];
            if constexpr (ACC == static_cast<int>(PVAccum::kFp16Fp32)) {
              uint32_t blk[2] = {0u, 0u};
#pragma unroll
              for (int s = 0; s < BK / 16; ++s) mma_f16_f16(blk, pa[mt][s], vf[s][2 * hh], vf[s][2 * hh + 1]);
              add_f16_block(acc, blk);
            } else {
#pragma unroll
              for (int s = 0; s < BK / 16; ++s) mma_f16_f32<VT>(acc, pa[mt][s], vf[s][2 * hh], vf[s][2 * hh + 1]);
            }
          }
      }
    } else {
#if defined(SAGE_FP8)
      // P's k order inside each 32-token step matches the permuted V layout (quant_fp8.cu)
      uint32_t pa[MT][BK / 32][4];
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int s = 0; s < BK / 32; ++s) {
          const int j = 4 * s;
          pa[mt][s][0] = to_e4m3x4(sf[mt][j][0], sf[mt][j][1], sf[mt][j + 1][0], sf[mt][j + 1][1]);
          pa[mt][s][1] = to_e4m3x4(sf[mt][j][2], sf[mt][j][3], sf[mt][j + 1][2], sf[mt][j + 1][3]);
          pa[mt][s][2] = to_e4m3x4(sf[mt][j + 2][0], sf[mt][j + 2][1], sf[mt][j + 3][0], sf[mt][j + 3][1]);
          pa[mt][s][3] = to_e4m3x4(sf[mt][j + 2][2], sf[mt][j + 2][3], sf[mt][j + 3][2], sf[mt][j + 3][3]);
        }
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t vf[BK / 32][4];
#pragma unroll
        for (int s = 0; s < BK / 32; ++s)
          ldmatrix_x4(vf[s], cV + swz<VC>(8 * (2 * np + (mi >> 1)) + (lane & 7), 2 * s + (mi & 1)));
#pragma unroll
        for (int mt = 0; mt < MT; ++mt)
#pragma unroll
          for (int hh = 0; hh < 2; ++hh) {
            float(&acc)[4] = o[mt][2 * np + hh];
            if constexpr (ACC == static_cast<int>(PVAccum::kFp32)) {
#pragma unroll
              for (int s = 0; s < BK / 32; ++s) mma_e4m3_f32(acc, pa[mt][s], vf[s][2 * hh], vf[s][2 * hh + 1]);
            } else if constexpr (ACC == static_cast<int>(PVAccum::kFp32Fp32)) {
              float blk[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
              for (int s = 0; s < BK / 32; ++s) mma_e4m3_f32(blk, pa[mt][s], vf[s][2 * hh], vf[s][2 * hh + 1]);
              acc[0] += blk[0], acc[1] += blk[1], acc[2] += blk[2], acc[3] += blk[3];
            } else {
              uint32_t blk[2] = {0u, 0u};
#pragma unroll
              for (int s = 0; s < BK / 32; ++s) mma_e4m3_f16(blk, pa[mt][s], vf[s][2 * hh], vf[s][2 * hh + 1]);
              add_f16_block(acc, blk);
            }
          }
      }
#endif
    }
    __syncthreads();  // this buffer is refilled by the next iteration's prefetch
  }

  // epilogue: normalize, V scale and mean, store; LSE
  const int64_t bh = static_cast<int64_t>(b) * p.heads_q + h;
  const int64_t bhk = static_cast<int64_t>(b) * p.heads_kv + hk;
  const float* vsc = S::kFp8 ? p.v_scale + bhk * D : nullptr;
  const float* vmn = p.v_mean ? p.v_mean + bhk * D : nullptr;
  OutT* ob = static_cast<OutT*>(p.o) + b * p.o_stride_b + h * p.o_stride_h;
  // 4-byte column pairs wherever d_out is even, also where the head dim is padded to D (80 and 96
  // run D=128's kernel): pairs past d_out are skipped (bench/NOTES.md, the same rule at sm90's D=256)
  const bool pairs = out_pairs_even(p);
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int hr = 0; hr < 2; ++hr) {
      const float lt = warp_sum_quad(l[mt][hr]);
      const float inv = lt > 0.f ? 1.f / lt : 0.f;
      const int row = row0 + mt * 16 + g + 8 * hr;
      if (row >= p.nq) continue;
      if (p.lse && t == 0) write_lse(p, bh * p.nq + row, bh, row, m[mt][hr], lt, OFF);
      OutT* orow = ob + static_cast<int64_t>(row) * p.o_stride_n;
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const int col = 8 * n + 2 * t;
        float v0 = o[mt][n][2 * hr] * inv, v1 = o[mt][n][2 * hr + 1] * inv;
        if (vsc) v0 *= vsc[col], v1 *= vsc[col + 1];
        if (vmn) v0 += vmn[col], v1 += vmn[col + 1];
        store_out2_bounded(orow, col, v0, v1, pairs, p.d_out);
      }
    }
}

// Launch one instantiation (sets the dynamic shared memory limit on first use).
template <int D, int MT, int PVK, int ACC, typename OutT>
cudaError_t launch_attn(const AttnParams& p, cudaStream_t stream) {
  using S = AttnShape<D, MT, PVK>;
  auto kernel = attn_kernel<D, MT, PVK, ACC, OutT>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem);
  if (err != cudaSuccess) return err;
  if (p.batch == 0 || p.heads_q == 0 || p.nq_pad == 0) return cudaSuccess;
  const dim3 grid(p.nq_pad / kAttnBlockQ, p.heads_q, p.batch);
  kernel<<<grid, S::kThreads, S::kSmem, stream>>>(p);
  return cudaGetLastError();
}

// One m16 tile per warp: with two, the fp32 output tile of D=128 no longer fits in registers.
template <int D>
constexpr int attn_mt() {
  static_assert(16 * 1 == kAttnWarpQ, "the Q scale layout assumes 16 rows per warp");
  return 1;
}

// fp16/bf16 PV instantiations for one head dim
template <int D>
cudaError_t attn_fp16_pv_d(const AttnParams& p, cudaStream_t stream) {
  constexpr int MT = attn_mt<D>();
  constexpr int F32 = static_cast<int>(PVAccum::kFp32), F16 = static_cast<int>(PVAccum::kFp16Fp32);
  const bool out_bf16 = p.o_dtype == DType::kBFloat16;
  if (p.accum == PVAccum::kFp32 && p.v_dtype == DType::kHalf && !out_bf16)
    return launch_attn<D, MT, kPVHalf, F32, __half>(p, stream);
  if (p.accum == PVAccum::kFp32 && p.v_dtype == DType::kBFloat16 && out_bf16)
    return launch_attn<D, MT, kPVBf16, F32, __nv_bfloat16>(p, stream);
  if (p.accum == PVAccum::kFp16Fp32 && p.v_dtype == DType::kHalf)
    return out_bf16 ? launch_attn<D, MT, kPVHalf, F16, __nv_bfloat16>(p, stream)
                    : launch_attn<D, MT, kPVHalf, F16, __half>(p, stream);
  return cudaErrorInvalidValue;
}

#if defined(SAGE_FP8)
template <int D>
cudaError_t attn_fp8_pv_d(const AttnParams& p, cudaStream_t stream) {
  constexpr int MT = attn_mt<D>();
  const bool bf = p.o_dtype == DType::kBFloat16;
  switch (p.accum) {
    case PVAccum::kFp32:
      return bf ? launch_attn<D, MT, kPVFp8, 0, __nv_bfloat16>(p, stream) : launch_attn<D, MT, kPVFp8, 0, __half>(p, stream);
    case PVAccum::kFp32Fp32:
      return bf ? launch_attn<D, MT, kPVFp8, 2, __nv_bfloat16>(p, stream) : launch_attn<D, MT, kPVFp8, 2, __half>(p, stream);
    case PVAccum::kFp32Fp16:
      return bf ? launch_attn<D, MT, kPVFp8, 3, __nv_bfloat16>(p, stream) : launch_attn<D, MT, kPVFp8, 3, __half>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
#endif

}  // namespace sage

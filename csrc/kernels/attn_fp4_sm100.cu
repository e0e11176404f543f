// FP4 (SageAttention3-style) attention for data-center Blackwell (sm_100a): both GEMMs on the
// 5th-generation tensor core, tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X
// (E2M1 x E2M1, UE4M3 scale per 16 elements along K, fp32 accumulators in tensor memory).
// The number format and the exact math are those of fp4.h; this file follows them literally.
//
// ============================================================================================
// KERNEL STRUCTURE
// ============================================================================================
// One CTA = 128 query rows (kFp4BlockQ) of one (batch, head); grid (ceil(nq/128), heads, batch),
// causal launches the longest rows first. 192 threads, six warps:
//   warps 0-3  softmax / epilogue. Thread t owns query row t = TMEM lane t (warp w may only
//              touch TMEM lanes 32w..32w+31, PTX ISA 9.7.16.8.1 "Access restrictions"; the
//              32x32b tcgen05.ld shape gives lane i of the warp's quadrant to thread i).
//   warp 4     loader: cp.async of Q + its scales once, then K, V^T, their scales, gk and
//              delta per 128-key tile into a 2-deep ring of shared-memory stages.
//   warp 5     allocates/frees tensor memory; its lane 0 issues every tcgen05.cp/mma/commit.
//
// Per key tile j (stage st = j % 2):
//   MMA thread: wait full[st]; tcgen05.cp sk -> TMEM; S[st] = Q K^T (D/64 MMAs, K = 64 each);
//               commit -> s_full[st]. Then, for the previous tile j-1: wait p_full;
//               tcgen05.cp P scales + sv -> TMEM; O += P^ V^ (2 MMAs of K = 64 keys);
//               commit -> o_done (and -> empty[st] when a later tile needs the stage).
//               So QK^T of tile j runs while the softmax of tile j-1 finishes and PV of j-1
//               runs during the softmax of tile j.
//   softmax:    wait s_full[st]; tcgen05.ld its row of S (128 fp32); t = (S*gq*gk + delta)*c
//               with the masks; online max / sum in fp32 (fp4.h); P quantized to E2M1 codes
//               with a UE4M3 scale per 16 keys; then wait o_done (PV of j-1 finished: the P
//               buffer and O are free), rescale O in TMEM if the row max grew (tcgen05.ld,
//               multiply, tcgen05.st; skipped when no row of the warp changed its max), write
//               the P codes and scales to shared memory, arrive p_full.
//   Epilogue:   wait o_done of the last tile, tcgen05.ld O, out = O * gv / (2688 * l), lse.
//
// O is kept in tensor memory for the whole CTA and rescaled there in place ("O = O * alpha"
// before the next "O += P^ V^"), exactly the order of fp4.h. The first PV MMA of the CTA has
// enable_input_d = false, so O never needs clearing.
//
// Tensor memory (512 columns allocated, fp32 cells; address = lane << 16 | column, PTX ISA
// 9.7.16.1.1): S0 cols [0,128), S1 [128,256), O [256, 256+D), scale factors from col 384:
//   SFQ 8 cols, SFK 2 x 8, SFP 2 x 8, SFV 2 x 8 (double-buffered by tile parity).
// The M = 128, cta_group::1 accumulator layout assumed: D[m][n] -> lane m, column base + n.
//
// ============================================================================================
// SYNCHRONISATION (mbarriers in shared memory; parity waits)
// ============================================================================================
//   q_full    count 32   loader lanes (after cp.async.wait_all + fence.proxy.async)
//   full[s]   count 32   loader lanes, once per tile using stage s; waited by the MMA thread
//                        and by the softmax threads (gk / delta of the stage)
//   empty[s]  count 1    tcgen05.commit after PV(j) (covers QK(j), PV(j) and their cps);
//                        waited by the loader before refilling stage s with tile j+2
//   s_full[b] count 1    tcgen05.commit after QK(j) into S[b], b = j % 2
//   p_full    count 128  softmax threads: P(j) codes/scales in smem, O rescaled, S(j) read
//   o_done    count 1    tcgen05.commit after PV(j)
// Ordering rules used (PTX ISA 9.7.16.6 "Memory consistency model for tcgen05"):
//   * generic-proxy writes to shared memory (cp.async, st.shared) that tcgen05.mma / tcgen05.cp
//     read (async proxy) are followed, in the writing thread, by fence.proxy.async.shared::cta
//     before the mbarrier arrive (release); the reader waits (acquire).
//   * every tcgen05 access ordered by a thread synchronisation uses
//     tcgen05.fence::before_thread_sync before the arrive and tcgen05.fence::after_thread_sync
//     after the wait; tcgen05.st is completed with tcgen05.wait::st and tcgen05.ld with
//     tcgen05.wait::ld before the registers are used (an empty asm ties the registers to it).
//   * tcgen05.cp -> tcgen05.mma from the same thread are implicitly pipelined (9.7.16.6.2.1),
//     so the MMA thread copies scales and issues the MMAs back to back. mma -> cp is NOT in
//     that list, hence the scale-factor columns are double-buffered and a buffer is only
//     rewritten once the MMAs that read it are known complete (through empty[] / o_done).
//   * every tcgen05.commit is eventually waited on (no async arrive left when the CTA exits).
//
// ============================================================================================
// DESCRIPTORS AND LAYOUTS (PTX ISA 9.7.16.4 "Matrix Descriptors")
// ============================================================================================
// Instruction descriptor, .kind::mxf4 / .kind::mxf4nvf4 (9.7.16.4.2, the block-scaled table):
//   [0,2) sparsity selector 0    [2] dense 0              [4,6) SFB_ID = 0 (must be 0 for 4X)
//   [7,10) atype E2M1 = 1         [10,12) btype E2M1 = 1   [13],[14] no negate
//   [15] A K-major 0              [16] B K-major 0         [17,23) N >> 3
//   [23] scale type UE4M3 = 0     [24,29) M >> 4 (= 8 for M = 128, i.e. bit 27)
//   [29,31) SFA_ID = 0            [31] K = 64 dense (0)
// Shared memory (operand) descriptor, 64 bits (9.7.16.4.1):
//   [0,14) start address >> 4   [16,30) LBO >> 4   [32,46) SBO >> 4   [46,49) fixed 0b001
//   [49,52) base offset 0       [52] LBO mode 0 (relative)   [61,64) swizzle 0 (none)
// Operands (all K-major, as fp4 MMAs require): the canonical no-swizzle K-major layout made of
// "core matrices" of 8 rows x 16 bytes (= 8 rows x 32 packed E2M1), each 128 contiguous bytes
// (row r of the core matrix at +16r). LBO = distance between the two K-adjacent core matrices
// one MMA reads (K = 64 fp4 = 32 bytes = 2 core matrices), SBO = distance between consecutive
// 8-row groups. This kernel stores a tile of R rows x B bytes per row as
//   byte offset(row, chunk16) = (row / 8) * (B / 16) * 128 + chunk16 * 128 + (row % 8) * 16
// so LBO = 128 and SBO = (B / 16) * 128, and the k-th K-step of 64 elements starts at +256*k.
//   Q, K:  B = D/2 (32 or 64 bytes), SBO = 4*D     (A of S = Q K^T, resp. B with N = 128 keys)
//   P, V^T: B = 64 (128 keys),       SBO = 512     (A of O += P V, resp. B with N = D channels)
// Packed E2M1: element 2i in the low nibble of byte i (as the quantizer writes them and as
// cvt.rn.satfinite.e2m1x2.f32 d, hi, lo produces).
// Scale factors in tensor memory for scale_vec::4X (9.7.16.10.7 "Block Scaling"): 4 UE4M3 per
// row per K = 64 step, one 32-bit word; row m of A (or column n of B) -> lane m % 32, column
// (sf_base + m / 32), byte k = scale of elements 16k..16k+15 of the K-step; the data must be
// "duplicated to all 32 lane partitions". They are put there with
//   tcgen05.cp.cta_group::1.32x128b.warpx4 [sf_base], sdesc
// which copies 32 rows x 16 bytes from shared memory to lanes 0-31 of 4 columns and multicasts
// them to the four lane quadrants. Source layout per K-step (512 contiguous bytes):
//   byte (m % 32) * 16 + (m / 32) * 4 + k  =  scale k of row m
// described by a no-swizzle descriptor with SBO = 128 (8 rows x 16 bytes), LBO = 0.
// For PV with D = 64 (N = 64), B's scales occupy columns 0-1 of the 4 copied (words 2-3 of
// each 16-byte row are zero).
//
// Requirements checked by the launcher: d in {64, 128}, nq_pad / nk_pad multiples of 128,
// nq <= nq_pad, nk <= nk_pad, heads % heads_kv == 0, 0 < d_out <= d, 16-byte aligned q, k, v,
// gk, delta and 4-byte aligned sq, sk, sv (cp.async sizes).
#include <cstdint>
#include <cuda_runtime.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "common.cuh"
#include "fp4.h"
#include "fp4_common.cuh"
#include "sm90.cuh"

#if defined(__CUDA_ARCH__) && (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL))
#define SAGE_FP4_SM100_DEVICE 1
#else
#define SAGE_FP4_SM100_DEVICE 0
#endif

namespace sage {
namespace {

template <int D>
struct Fp4Sm100Cfg {
  static_assert(D == 64 || D == 128, "head dim 64 or 128");
  static constexpr int kBQ = kFp4BlockQ, kBK = kFp4BlockK;
  static_assert(kBQ == 128 && kBK == 128, "M = 128 MMAs and 128-key tiles");
  static constexpr int kThreads = 192;
  static constexpr int kKSteps = D / 64;        // K = 64 MMAs of S = Q K^T
  static constexpr int kQkRow = D / 2;          // bytes per Q / K row
  static constexpr int kQkChunks = D / 32;      // 16-byte chunks per Q / K row
  static constexpr int kQkSbo = kQkChunks * 128;
  static constexpr int kPvSbo = 512;            // P / V^T rows: 128 keys = 64 bytes = 4 chunks
  static constexpr int kSfBlock = 512;          // scale factors of one K = 64 step, 128 rows
  static_assert(kQkSbo == 4 * D && kPvSbo == (kBK / 2 / 16) * 128 && kSfBlock == 32 * 16, "operand layouts");

  // shared memory (byte offsets from a 1024-aligned base)
  static constexpr int kOffQ = 0;
  static constexpr int kOffSQ = kOffQ + kBQ * kQkRow;
  static constexpr int kOffStage = kOffSQ + kKSteps * kSfBlock;
  static constexpr int kStK = 0;
  static constexpr int kStV = kStK + kBK * kQkRow;
  static constexpr int kStSK = kStV + D * (kBK / 2);
  static constexpr int kStSV = kStSK + kKSteps * kSfBlock;
  static constexpr int kStGK = kStSV + 2 * kSfBlock;
  static constexpr int kStDL = kStGK + kBK * 4;
  static constexpr int kStageBytes = kStDL + kBK * 4;
  static constexpr int kOffP = kOffStage + 2 * kStageBytes;
  static constexpr int kOffSP = kOffP + kBQ * (kBK / 2);
  static constexpr int kOffBar = kOffSP + 2 * kSfBlock;
  static constexpr int kNumBars = 9;
  static constexpr int kOffTmemPtr = kOffBar + kNumBars * 8;
  static constexpr int kSmemUsed = kOffTmemPtr + 16;
  static constexpr int kSmem = kSmemUsed + 1024;  // slack to align the base to 1024

  // tensor memory columns
  static constexpr uint32_t kTmemCols = 512;
  static constexpr uint32_t kColS = 0;    // + 128 * buffer
  static constexpr uint32_t kColO = 256;
  static constexpr uint32_t kColSFQ = 384;
  static constexpr uint32_t kColSFK = 392;  // + 8 * buffer
  static constexpr uint32_t kColSFP = 408;
  static constexpr uint32_t kColSFV = 424;
  static_assert(kColS + 256 <= kColO && kColO + D <= kColSFQ && kColSFQ + 4 * kKSteps <= kColSFK &&
                    kColSFK + 16 <= kColSFP && kColSFP + 16 <= kColSFV && kColSFV + 16 <= kTmemCols,
                "tensor memory map");
  static_assert(kOffStage % 128 == 0 && kStageBytes % 128 == 0 && kOffP % 128 == 0 && kOffBar % 8 == 0,
                "alignment of the shared-memory regions");
};

#if SAGE_FP4_SM100_DEVICE

// ---- tcgen05 wrappers (PTX ISA 9.7.16) ----
__device__ __forceinline__ void tmem_alloc(uint32_t* dst, uint32_t ncols) {
  asm volatile("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%0], %1;\n" ::"r"(smem_addr(dst)), "r"(ncols)
               : "memory");
}
__device__ __forceinline__ void tmem_relinquish() {
  asm volatile("tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void tmem_dealloc(uint32_t taddr, uint32_t ncols) {
  asm volatile("tcgen05.dealloc.cta_group::1.sync.aligned.b32 %0, %1;\n" ::"r"(taddr), "r"(ncols) : "memory");
}
__device__ __forceinline__ void tc_fence_before() { asm volatile("tcgen05.fence::before_thread_sync;\n" ::: "memory"); }
__device__ __forceinline__ void tc_fence_after() { asm volatile("tcgen05.fence::after_thread_sync;\n" ::: "memory"); }
__device__ __forceinline__ void tc_wait_ld() { asm volatile("tcgen05.wait::ld.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void tc_wait_st() { asm volatile("tcgen05.wait::st.sync.aligned;\n" ::: "memory"); }
// Arrives (once) on `bar` when every tcgen05.mma / tcgen05.cp issued so far by this thread is done.
__device__ __forceinline__ void tc_commit(uint64_t* bar) {
  asm volatile("tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [%0];\n" ::"r"(smem_addr(bar))
               : "memory");
}
// 32 rows x 128 bits of shared memory -> lanes 0-31, 4 columns at taddr, multicast to all 4 quadrants.
__device__ __forceinline__ void tc_cp_sf(uint32_t taddr, uint64_t sdesc) {
  asm volatile("tcgen05.cp.cta_group::1.32x128b.warpx4 [%0], %1;\n" ::"r"(taddr), "l"(sdesc) : "memory");
}
// D[tmem] (+)= (A * SFA) (B * SFB), A and B E2M1 in shared memory, UE4M3 scales per 16 along K.
__device__ __forceinline__ void tc_mma_fp4(uint32_t d_tmem, uint64_t adesc, uint64_t bdesc, uint32_t idesc,
                                           uint32_t sfa_tmem, uint32_t sfb_tmem, uint32_t accumulate) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
      "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X [%0], %1, %2, %3, [%4], [%5], p;\n}\n" ::"r"(
          d_tmem),
      "l"(adesc), "l"(bdesc), "r"(idesc), "r"(sfa_tmem), "r"(sfb_tmem), "r"(accumulate)
      : "memory");
}

#define SAGE_R32(x)                                                                                                  \
  x(0), x(1), x(2), x(3), x(4), x(5), x(6), x(7), x(8), x(9), x(10), x(11), x(12), x(13), x(14), x(15), x(16), x(17), \
      x(18), x(19), x(20), x(21), x(22), x(23), x(24), x(25), x(26), x(27), x(28), x(29), x(30), x(31)
#define SAGE_OUT_R(i) "=r"(r[i])
#define SAGE_IN_R(i) "r"(r[i])
#define SAGE_INOUT_R(i) "+r"(r[i])
#define SAGE_REGLIST32                                                                                            \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, " \
  "%24, %25, %26, %27, %28, %29, %30, %31}"

// The warp's 32 lanes (quadrant of taddr) x 32 consecutive 32-bit columns; thread i gets lane i.
__device__ __forceinline__ void tc_ld32(uint32_t taddr, uint32_t* r) {
  asm volatile("tcgen05.ld.sync.aligned.32x32b.x32.b32 " SAGE_REGLIST32 ", [%32];\n"
               : SAGE_R32(SAGE_OUT_R)
               : "r"(taddr)
               : "memory");
}
__device__ __forceinline__ void tc_st32(uint32_t taddr, const uint32_t* r) {
  asm volatile("tcgen05.st.sync.aligned.32x32b.x32.b32 [%0], {%1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, "
               "%13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32};\n" ::"r"(
                   taddr),
               SAGE_R32(SAGE_IN_R)
               : "memory");
}
// Ties 32 registers to this point of the instruction stream (placed after tcgen05.wait::ld, so
// that no use of a tcgen05.ld result can be scheduled before the wait).
__device__ __forceinline__ void reg_fence32(uint32_t* r) { asm volatile("" : SAGE_R32(SAGE_INOUT_R)::"memory"); }

#undef SAGE_REGLIST32
#undef SAGE_INOUT_R
#undef SAGE_IN_R
#undef SAGE_OUT_R
#undef SAGE_R32

// ---- descriptors ----
__device__ __forceinline__ uint64_t desc_field(uint32_t bytes) { return static_cast<uint64_t>((bytes & 0x3FFFFu) >> 4); }
// No-swizzle K-major operand / scale-source descriptor (see the header comment).
__device__ __forceinline__ uint64_t smem_desc(uint32_t saddr, uint32_t lbo, uint32_t sbo) {
  return desc_field(saddr) | (desc_field(lbo) << 16) | (desc_field(sbo) << 32) | (uint64_t{1} << 46);
}
// Block-scaled instruction descriptor: E2M1 x E2M1, UE4M3 scales, K-major A and B, M = 128, dense K = 64.
__host__ __device__ constexpr uint32_t fp4_idesc(int n) {
  return (1u << 7) | (1u << 10) | (static_cast<uint32_t>(n >> 3) << 17) | (0u << 23) |
         (static_cast<uint32_t>(128 >> 4) << 24);
}
static_assert(fp4_idesc(128) == 0x08200480u, "instruction descriptor, N = 128");

// ---- misc PTX ----
__device__ __forceinline__ void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async4(void* dst, const void* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

// E4M3 bytes of two exactly representable values (lo in the low byte).
__device__ __forceinline__ uint32_t e4m3x2_bytes(float lo, float hi) {
  uint16_t r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
}

template <typename OutT>
__device__ __forceinline__ uint32_t pack_out(float a, float b) {
  return pack2<OutT>(a, b);
}

#endif  // SAGE_FP4_SM100_DEVICE

template <int D, typename OutT>
__global__ void __launch_bounds__(192, 1) attn_fp4_sm100_kernel(const __grid_constant__ AttnFp4Params p) {
#if SAGE_FP4_SM100_DEVICE
  using C = Fp4Sm100Cfg<D>;
  constexpr int BK = C::kBK;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint8_t* sQ = smem + C::kOffQ;
  uint8_t* sSQ = smem + C::kOffSQ;
  uint8_t* sP = smem + C::kOffP;
  uint8_t* sSP = smem + C::kOffSP;
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + C::kOffBar);
  uint64_t* q_full = bars + 0;
  uint64_t* full = bars + 1;    // [2]
  uint64_t* empty = bars + 3;   // [2]
  uint64_t* s_full = bars + 5;  // [2]
  uint64_t* p_full = bars + 7;
  uint64_t* o_done = bars + 8;
  uint32_t* tmem_ptr = reinterpret_cast<uint32_t*>(smem + C::kOffTmemPtr);
  auto stage = [&](int s) { return smem + C::kOffStage + s * C::kStageBytes; };

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int bx = p.causal ? static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x) : static_cast<int>(blockIdx.x);
  const int h = blockIdx.y, b = blockIdx.z;
  const int hk = h / (p.heads / p.heads_kv);
  const int q0 = bx * C::kBQ;
  const int64_t bh = static_cast<int64_t>(b) * p.heads + h;
  const int64_t bhk = static_cast<int64_t>(b) * p.heads_kv + hk;
  const int kv_lim = p.causal ? min(p.nk, q0 + C::kBQ) : p.nk;
  const int nt = kv_lim > 0 ? (kv_lim + BK - 1) / BK : 0;
  const bool has_delta = p.delta != nullptr;

  // ---- set-up: barriers, tensor memory ----
  if (tid == 0) {
    mbar_init(q_full, 32);
    for (int s = 0; s < 2; ++s) {
      mbar_init(&full[s], 32);
      mbar_init(&empty[s], 1);
      mbar_init(&s_full[s], 1);
    }
    mbar_init(p_full, 128);
    mbar_init(o_done, 1);
    mbar_fence_init();
  }
  if (warp == 5) {
    tmem_alloc(tmem_ptr, C::kTmemCols);
    tmem_relinquish();
  }
  tc_fence_before();
  __syncthreads();
  tc_fence_after();
  const uint32_t tm = *tmem_ptr;

  if (warp == 4) {
    // ================= loader =================
    if (D == 64) {
      // B's scales of PV with N = 64 use words 0-1 of each 16-byte row; keep words 2-3 zero.
      for (int s = 0; s < 2; ++s)
        for (int i = lane; i < 2 * C::kSfBlock / 16; i += 32)
          *reinterpret_cast<uint4*>(stage(s) + C::kStSV + 16 * i) = make_uint4(0, 0, 0, 0);
    }
    {
      const uint8_t* qg = p.q + (bh * p.nq_pad + q0) * C::kQkRow;
      for (int idx = lane; idx < C::kBQ * C::kQkChunks; idx += 32) {
        const int r = idx / C::kQkChunks, c = idx % C::kQkChunks;
        cp_async16(sQ + (r >> 3) * C::kQkSbo + c * 128 + (r & 7) * 16, qg + r * C::kQkRow + c * 16, 16);
      }
      const uint8_t* sqg = p.sq + (bh * p.nq_pad + q0) * (D / 16);
      for (int idx = lane; idx < C::kBQ * C::kKSteps; idx += 32) {
        const int r = idx / C::kKSteps, s = idx % C::kKSteps;
        cp_async4(sSQ + s * C::kSfBlock + (r & 31) * 16 + (r >> 5) * 4, sqg + r * (D / 16) + 4 * s);
      }
      cp_async_wait_all();
      fence_proxy_async_smem();
      mbar_arrive(q_full);
    }
    const int64_t vrow = static_cast<int64_t>(p.nk_pad) / 2, svrow = p.nk_pad / 16;
    for (int j = 0; j < nt; ++j) {
      const int st = j & 1;
      if (j >= 2) mbar_wait(&empty[st], ((j >> 1) + 1) & 1);
      uint8_t* sg = stage(st);
      const int j0 = j * BK;
      const int64_t krow0 = bhk * p.nk_pad + j0;
      const uint8_t* kg = p.k + krow0 * C::kQkRow;
      for (int idx = lane; idx < BK * C::kQkChunks; idx += 32) {
        const int n = idx / C::kQkChunks, c = idx % C::kQkChunks;
        cp_async16(sg + C::kStK + (n >> 3) * C::kQkSbo + c * 128 + (n & 7) * 16, kg + n * C::kQkRow + c * 16, 16);
      }
      const uint8_t* vg = p.v + bhk * D * vrow + j0 / 2;
      for (int idx = lane; idx < D * 4; idx += 32) {
        const int c = idx >> 2, kc = idx & 3;
        cp_async16(sg + C::kStV + (c >> 3) * C::kPvSbo + kc * 128 + (c & 7) * 16, vg + c * vrow + kc * 16, 16);
      }
      const uint8_t* skg = p.sk + krow0 * (D / 16);
      for (int idx = lane; idx < BK * C::kKSteps; idx += 32) {
        const int n = idx / C::kKSteps, s = idx % C::kKSteps;
        cp_async4(sg + C::kStSK + s * C::kSfBlock + (n & 31) * 16 + (n >> 5) * 4, skg + n * (D / 16) + 4 * s);
      }
      const uint8_t* svg = p.sv + bhk * D * svrow + j0 / 16;
      for (int idx = lane; idx < D * 2; idx += 32) {
        const int c = idx >> 1, s = idx & 1;
        cp_async4(sg + C::kStSV + s * C::kSfBlock + (c & 31) * 16 + (c >> 5) * 4, svg + c * svrow + 4 * s);
      }
      cp_async16(sg + C::kStGK + 16 * lane, p.gk + krow0 + 4 * lane, 16);
      if (has_delta) {
        const float* dg = p.delta + (bh * (p.nq_pad / C::kBQ) + bx) * p.nk_pad + j0;
        cp_async16(sg + C::kStDL + 16 * lane, dg + 4 * lane, 16);
      }
      cp_async_wait_all();
      fence_proxy_async_smem();
      mbar_arrive(&full[st]);
    }
  } else if (warp == 5) {
    // ================= MMA issue (one thread) =================
    if (lane == 0 && nt > 0) {
      constexpr uint32_t idesc_qk = fp4_idesc(128);
      constexpr uint32_t idesc_pv = fp4_idesc(D);
      const uint32_t aQ = smem_addr(sQ), aSQ = smem_addr(sSQ), aP = smem_addr(sP), aSP = smem_addr(sSP);
      mbar_wait(q_full, 0);
      tc_fence_after();
#pragma unroll
      for (int s = 0; s < C::kKSteps; ++s) tc_cp_sf(tm + C::kColSFQ + 4 * s, smem_desc(aSQ + s * C::kSfBlock, 0, 128));
      for (int j = 0; j <= nt; ++j) {
        if (j < nt) {
          const int st = j & 1;
          const uint32_t aSt = smem_addr(stage(st));
          mbar_wait(&full[st], (j >> 1) & 1);
          tc_fence_after();
          const uint32_t sfk = tm + C::kColSFK + 8 * st;
#pragma unroll
          for (int s = 0; s < C::kKSteps; ++s) tc_cp_sf(sfk + 4 * s, smem_desc(aSt + C::kStSK + s * C::kSfBlock, 0, 128));
#pragma unroll
          for (int s = 0; s < C::kKSteps; ++s)
            tc_mma_fp4(tm + C::kColS + 128 * st, smem_desc(aQ + 256 * s, 128, C::kQkSbo),
                       smem_desc(aSt + C::kStK + 256 * s, 128, C::kQkSbo), idesc_qk, tm + C::kColSFQ + 4 * s, sfk + 4 * s,
                       s > 0 ? 1u : 0u);
          tc_commit(&s_full[st]);
        }
        if (j >= 1) {
          const int jj = j - 1, st = jj & 1;
          const uint32_t aSt = smem_addr(stage(st));
          mbar_wait(p_full, jj & 1);
          tc_fence_after();
          const uint32_t sfp = tm + C::kColSFP + 8 * st, sfv = tm + C::kColSFV + 8 * st;
#pragma unroll
          for (int s = 0; s < 2; ++s) {
            tc_cp_sf(sfp + 4 * s, smem_desc(aSP + s * C::kSfBlock, 0, 128));
            tc_cp_sf(sfv + 4 * s, smem_desc(aSt + C::kStSV + s * C::kSfBlock, 0, 128));
          }
#pragma unroll
          for (int s = 0; s < 2; ++s)
            tc_mma_fp4(tm + C::kColO, smem_desc(aP + 256 * s, 128, C::kPvSbo),
                       smem_desc(aSt + C::kStV + 256 * s, 128, C::kPvSbo), idesc_pv, sfp + 4 * s, sfv + 4 * s,
                       (jj > 0 || s > 0) ? 1u : 0u);
          tc_commit(o_done);
          if (jj + 2 < nt) tc_commit(&empty[st]);  // the stage is refilled with tile jj + 2
        }
      }
    }
  } else {
    // ================= softmax / epilogue: thread = query row = TMEM lane =================
    const int r = tid;
    const uint32_t lane_base = static_cast<uint32_t>(warp * 32) << 16;
    const int qrow = q0 + r;
    const int key_lim = p.causal ? min(p.nk, qrow + 1) : p.nk;  // keys j < key_lim are visible
    const float gq_r = p.gq[bh * p.nq_pad + qrow];
    const float cs = p.sm_scale_log2;
    float m = -INFINITY, l = 0.f;

    for (int j = 0; j < nt; ++j) {
      const int st = j & 1;
      mbar_wait(&s_full[st], (j >> 1) & 1);
      mbar_wait(&full[st], (j >> 1) & 1);  // gk / delta of the tile (already complete)
      tc_fence_after();
      float sv[BK];
      {
        uint32_t u[BK];
#pragma unroll
        for (int c = 0; c < BK / 32; ++c) tc_ld32(tm + lane_base + C::kColS + 128 * st + 32 * c, u + 32 * c);
        tc_wait_ld();
#pragma unroll
        for (int c = 0; c < BK / 32; ++c) reg_fence32(u + 32 * c);
#pragma unroll
        for (int i = 0; i < BK; ++i) sv[i] = __uint_as_float(u[i]);
      }
      const uint8_t* sg = stage(st);
      const float* gks = reinterpret_cast<const float*>(sg + C::kStGK);
      const float* dls = reinterpret_cast<const float*>(sg + C::kStDL);
      const int j0 = j * BK;

      // t = (S * gq * gk + delta) * c, masked to -inf; running max.
      float mx = -INFINITY;
#pragma unroll
      for (int i = 0; i < BK; i += 4) {
        const float4 g4 = *reinterpret_cast<const float4*>(gks + i);
        const float4 d4 = has_delta ? *reinterpret_cast<const float4*>(dls + i) : make_float4(0.f, 0.f, 0.f, 0.f);
        const float g[4] = {g4.x, g4.y, g4.z, g4.w};
        const float dl[4] = {d4.x, d4.y, d4.z, d4.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float t = __fmul_rn(__fadd_rn(__fmul_rn(__fmul_rn(sv[i + e], gq_r), g[e]), dl[e]), cs);
          t = (j0 + i + e < key_lim) ? t : -INFINITY;
          sv[i + e] = t;
          mx = fmaxf(mx, t);
        }
      }
      const float m_new = fmaxf(m, mx);
      const float m_use = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet uses 0
      const float alpha = (m == m_use) ? 1.f : ex2(m - m_use);  // m = -inf -> 0
      m = m_new;
      float sum = 0.f;
#pragma unroll
      for (int i = 0; i < BK; ++i) {
        const float pv = ex2(sv[i] - m_use);
        sum += pv;
        sv[i] = pv;
      }
      l = l * alpha + sum;

      // P quantization: p~ = 2688 p; per 16 keys scale = round-up(max * fp32(1/6)), codes of p~ / scale.
      uint32_t codes[BK / 8];
      uint32_t sfw[2];
#pragma unroll
      for (int g = 0; g < BK / 16; g += 2) {
        float scl[2];
#pragma unroll
        for (int gg = 0; gg < 2; ++gg) {
          const int base = (g + gg) * 16;
          float pt[16];
          float gm = 0.f;
#pragma unroll
          for (int e = 0; e < 16; ++e) {
            pt[e] = __fmul_rn(sv[base + e], kFp4PMax);
            gm = fmaxf(gm, pt[e]);
          }
          const float sc = fp4::e4m3_round_up(gm * kFp4InvE2M1Max);
          scl[gg] = sc;
#pragma unroll
          for (int h8 = 0; h8 < 2; ++h8) {
            float qv[8];
#pragma unroll
            for (int e = 0; e < 8; ++e) qv[e] = sc > 0.f ? __fdiv_rn(pt[8 * h8 + e], sc) : 0.f;
            codes[(g + gg) * 2 + h8] = fp4::e2m1x8(qv);
          }
        }
        const uint32_t two = e4m3x2_bytes(scl[0], scl[1]);
        if ((g & 3) == 0) sfw[g >> 2] = two;
        else sfw[g >> 2] |= two << 16;
      }

      if (j > 0) {
        // PV of tile j-1 has finished: the P buffer and O may be touched.
        mbar_wait(o_done, (j - 1) & 1);
        tc_fence_after();
        if (__any_sync(0xffffffffu, alpha != 1.f)) {
#pragma unroll 1
          for (int c = 0; c < D / 32; ++c) {
            uint32_t o[32];
            const uint32_t ta = tm + lane_base + C::kColO + 32 * c;
            tc_ld32(ta, o);
            tc_wait_ld();
            reg_fence32(o);
#pragma unroll
            for (int e = 0; e < 32; ++e) o[e] = __float_as_uint(__uint_as_float(o[e]) * alpha);
            tc_st32(ta, o);
          }
          tc_wait_st();
        }
      }
      // P codes: row r, 16-byte chunk kc (keys 32kc..32kc+31) in the K-major core-matrix layout.
#pragma unroll
      for (int kc = 0; kc < 4; ++kc)
        *reinterpret_cast<uint4*>(sP + (r >> 3) * C::kPvSbo + kc * 128 + (r & 7) * 16) =
            make_uint4(codes[4 * kc], codes[4 * kc + 1], codes[4 * kc + 2], codes[4 * kc + 3]);
      // P scales: K-step s (keys 64s..64s+63), 4 bytes, in the tcgen05.cp 32x128b source layout.
#pragma unroll
      for (int s = 0; s < 2; ++s)
        *reinterpret_cast<uint32_t*>(sSP + s * C::kSfBlock + (r & 31) * 16 + (r >> 5) * 4) = sfw[s];
      fence_proxy_async_smem();
      tc_fence_before();
      mbar_arrive(p_full);
    }

    // ---- epilogue ----
    if (nt > 0) {
      mbar_wait(o_done, (nt - 1) & 1);
      tc_fence_after();
    }
    const bool row_ok = qrow < p.nq;
    const float inv = l > 0.f ? 1.f / (kFp4PMax * l) : 0.f;
    const float* gv = p.gv + bhk * D;
    OutT* orow = reinterpret_cast<OutT*>(p.o) + static_cast<int64_t>(b) * p.o_stride_b +
                 static_cast<int64_t>(h) * p.o_stride_h + static_cast<int64_t>(qrow) * p.o_stride_n;
    const bool vec = p.d_out == D && reinterpret_cast<uintptr_t>(p.o) % 16 == 0 && p.o_stride_b % 8 == 0 &&
                     p.o_stride_h % 8 == 0 && p.o_stride_n % 8 == 0;
#pragma unroll 1
    for (int c = 0; c < D / 32; ++c) {
      uint32_t o[32];
      if (nt > 0) {
        tc_ld32(tm + lane_base + C::kColO + 32 * c, o);
        tc_wait_ld();
        reg_fence32(o);
      }
      float ov[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) ov[e] = l > 0.f ? __uint_as_float(o[e]) * __ldg(gv + 32 * c + e) * inv : 0.f;
      if (row_ok) {
        if (vec) {
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int e = 8 * q;
            *reinterpret_cast<uint4*>(orow + 32 * c + e) =
                make_uint4(pack_out<OutT>(ov[e], ov[e + 1]), pack_out<OutT>(ov[e + 2], ov[e + 3]),
                           pack_out<OutT>(ov[e + 4], ov[e + 5]), pack_out<OutT>(ov[e + 6], ov[e + 7]));
          }
        } else {
#pragma unroll
          for (int e = 0; e < 32; ++e)
            if (32 * c + e < p.d_out) orow[32 * c + e] = from_float<OutT>(ov[e]);
        }
      }
    }
    if (row_ok && p.lse != nullptr)
      p.lse[bh * p.nq + qrow] = l > 0.f ? (m + log2f(l)) * kLn2 : -INFINITY;
  }

  // ---- teardown: every tensor-memory access is complete before the free ----
  tc_fence_before();
  __syncthreads();
  if (warp == 5) {
    __syncwarp();
    tc_fence_after();
    tmem_dealloc(tm, C::kTmemCols);
  }
#elif defined(__CUDA_ARCH__)
  __trap();  // built for an arch without tcgen05 block-scaled fp4 MMAs
#endif
}

template <int D, typename OutT>
cudaError_t launch_fp4_sm100(const AttnFp4Params& p, cudaStream_t stream) {
  using C = Fp4Sm100Cfg<D>;
  auto kernel = attn_fp4_sm100_kernel<D, OutT>;
  cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmem);
  if (err != cudaSuccess) return err;
  const dim3 grid((p.nq + C::kBQ - 1) / C::kBQ, p.heads, p.batch);
  kernel<<<grid, C::kThreads, C::kSmem, stream>>>(p);
  return cudaGetLastError();
}

bool misaligned(const void* ptr, uintptr_t a) { return reinterpret_cast<uintptr_t>(ptr) % a != 0; }

}  // namespace

cudaError_t attn_fp4_sm100(const AttnFp4Params& p, cudaStream_t stream) {
  if (p.d != 64 && p.d != 128) return cudaErrorInvalidValue;
  if (p.batch < 0 || p.heads < 0 || p.heads_kv <= 0 || p.heads % p.heads_kv != 0) return cudaErrorInvalidValue;
  if (p.nq < 0 || p.nk < 0 || p.nq_pad < p.nq || p.nk_pad < p.nk || p.nq_pad % kFp4BlockQ != 0 ||
      p.nk_pad % kFp4BlockK != 0)
    return cudaErrorInvalidValue;
  if (p.d_out <= 0 || p.d_out > p.d) return cudaErrorInvalidValue;
  if (p.o_dtype != DType::kHalf && p.o_dtype != DType::kBFloat16) return cudaErrorInvalidValue;
  if (p.batch == 0 || p.heads == 0 || p.nq == 0) return cudaSuccess;
  if (!p.q || !p.k || !p.v || !p.sq || !p.sk || !p.sv || !p.gq || !p.gk || !p.gv || !p.o) return cudaErrorInvalidValue;
  if (misaligned(p.q, 16) || misaligned(p.k, 16) || misaligned(p.v, 16) || misaligned(p.gk, 16) ||
      (p.delta && misaligned(p.delta, 16)) || misaligned(p.sq, 4) || misaligned(p.sk, 4) || misaligned(p.sv, 4) ||
      misaligned(p.gq, 4) || misaligned(p.gv, 4))
    return cudaErrorInvalidValue;
  const bool half = p.o_dtype == DType::kHalf;
  if (p.d == 64) return half ? launch_fp4_sm100<64, __half>(p, stream) : launch_fp4_sm100<64, __nv_bfloat16>(p, stream);
  return half ? launch_fp4_sm100<128, __half>(p, stream) : launch_fp4_sm100<128, __nv_bfloat16>(p, stream);
}

}  // namespace sage

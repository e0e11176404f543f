// Hopper (sm_90a) attention: INT8 QK^T and FP8 e4m3 PV on wgmma, tiles brought in by TMA.
//
// Persistent: one CTA per SM walks work tiles of 64 x NC query rows (sm90_tile), at a fixed
// stride, or (causal: tiles of different lengths) taking the next unclaimed tile from a counter
// (see attn_sm90_scratch_ints). A CTA has NC + 1 warpgroups (NC = 3 at
// D=64 and at D=128 on long sequences, else 2):
//   - warpgroup 0, the producer: one thread issues the TMA loads (Q of each work tile into
//     one of two buffers, then K and V^T tiles of 128 keys into a kStages-deep ring of
//     shared-memory buffers, each buffer guarded by "full" mbarriers (bytes landed) and an
//     "empty" mbarrier (consumers done). It runs ahead across work tiles, so the loads of
//     the next tile overlap the last GEMMs and the epilogue of this one;
//   - warpgroups 1 to NC, the consumers: 64 query rows each. Per key tile: S = Q K^T
//     (wgmma s8, both operands in shared memory), dequantize with the q and k scales,
//     online softmax in base 2, P scaled by 448 into e4m3 and kept in registers as the A
//     operand of O_blk = P V (wgmma e4m3, fp32), then O = O * alpha + O_blk (two-level
//     accumulation: the tensor core sums only 128 keys in its reduced-precision fp8
//     accumulator). The PV product runs over D + 8 rows of V^T, the last 8 all ones, so its
//     last columns are the row sums l of the e4m3 P (no adds for them in the softmax; O is
//     normalized by the sum of the weights it was actually given). The V scale and 1/l are
//     applied in the epilogue, which writes O through shared memory and TMA stores (plain
//     stores where the output's strides do not allow TMA).
//     Overlap: in one turn a consumer issues the PV product of tile kb-1, waits for it, and
//     issues QK^T of tile kb; it folds O_blk into O while QK^T runs (with three consumers at
//     D=128, PV goes in two halves folded in the turn: registers), then runs tile kb's
//     softmax while the other consumers' GEMMs keep the tensor cores busy (they take turns
//     in a ring: ping-pong). Running a consumer's softmax during its own GEMMs was measured
//     slower (bench/NOTES.md).
// setmaxnreg moves registers from the producer (which needs few) to the consumers.
// At D=64 a consumer whose rows all lie past the end of a head's last tile keeps its turns but
// computes nothing, and those last tiles come after all full ones (kTail, sm90_tile).
// At D=128 with three consumers, non-causal, CTAs may run in clusters of two that share each
// K and V tile: every producer loads half of it and multicasts it to both (CL = 2 below;
// a pair whose two work tiles read different K/V heads loads whole tiles, each its own).
//
// With VX = 2 (v_fp8_terms=2) V^T comes as two e4m3 terms per value and the PV product runs
// over both into one accumulator (Sm90Shape's comment).
//
// D=256 (head dims 129-256, zero-padded) is the same kernel with two consumers, the PV product
// in two halves, Q and K rows loaded as two 128-byte spans, and a 2-deep K/V ring whose K slots
// are freed as soon as S is read (Sm90Shape: kSplitPV, kSpans, kSepK).
//
// Inputs are the outputs of quant_int8 (Q: 16-row scale blocks, K: 64-row blocks) and
// quant_v_fp8 (V^T with tokens permuted inside 16-token groups so that the accumulator
// layout of S is directly the A-fragment layout of P; see quant_fp8.cu).
#pragma once

#include <cuda.h>
#include <cstdlib>
#include "attn_sm90_tiles.cuh"
#include "common.cuh"
#include "sm90.cuh"
#include "wgmma_ops.cuh"

namespace sage {

// NC consumer warpgroups per CTA, 64 query rows each: two with 240 registers each, or three
// with 160, which hide more of each consumer's softmax latency (bench/NOTES.md). D=64 always
// runs three; D=128 runs three from SAGE_SM90_NC3_KEYS keys on (causal: _CAUSAL) and two
// below (sm90_consumers in attn_sm90_host.cu), but for the rounds rule further down: three are
// slower on short sequences (fewer, longer work tiles, and the split PV product below) unless
// they save rounds of work tiles.
// Measured end to end on the H100 (bench/waves.py, 9b1ba9c): three 7 % faster at 1536 keys
// (4 x 32 and 1 x 32), 0-12 % slower at 1024; causal, 2-6 % faster from 3072 keys (4 x 32,
// 2 x 40, 8 x 16; head dim 96 5-11 %), level at 2048. Before the causal tile counter the
// causal switch-over was 8192 (three were 2-4 % slower at 2k-4k then). With V in two terms the
// non-causal switch-over is the same 1536 (three 4.5-12 % faster there on an H200 since the
// K-scale load in the turn, f53f835; it was 2048 before), causal keeps its own, 8192
// (_CAUSAL_V2): three were 4-8 % slower at 3072-4096 keys on the H100 and still 1-4 % slower up
// to 4096 on an H200 after f53f835 (bench/results/…-fe1e537-v2-switch-session.md).
// Both counts give the same bits (tests/test_cuda.py), so packed sequences of any lengths
// share a launch and each still gets the bits of its own call.
#ifndef SAGE_SM90_NC3_KEYS
#define SAGE_SM90_NC3_KEYS 1536
#endif
#ifndef SAGE_SM90_NC3_KEYS_CAUSAL
#define SAGE_SM90_NC3_KEYS_CAUSAL 3072
#endif
#ifndef SAGE_SM90_NC3_KEYS_CAUSAL_V2
#define SAGE_SM90_NC3_KEYS_CAUSAL_V2 8192
#endif
// Below SAGE_SM90_NC3_KEYS, non-causal calls with V in one term run three from
// SAGE_SM90_NC3_ROUNDS_KEYS keys where the persistent grid takes enough fewer rounds of 192-row
// tiles than of 128-row ones: ROUNDS / 1000 times the first under the second. On an H200 three
// cost 0.857 of two per row and round at 4 x 32 x 1024 (158 against 164 us end to end for 6
// rounds against 8, f0cfacc): 1.5 x 0.857 = 1.286. On 27 shapes at 512-1408 keys (many queries on
// few keys among them) the rule picked the faster count on 24, 3-14 % faster than two where it
// takes three; the misses were two shapes at 1.25x fewer rounds, where three were 2 % faster
// (bench/results/…-2b17f9a-session.md). Not packed calls: their tiles differ in length; not two
// V terms: three were 2 % slower at 4 x 32 x 1024 with them (…-fe1e537-v2-switch-session.md).
#ifndef SAGE_SM90_NC3_ROUNDS
#define SAGE_SM90_NC3_ROUNDS 1286
#endif
#ifndef SAGE_SM90_NC3_ROUNDS_KEYS
#define SAGE_SM90_NC3_ROUNDS_KEYS 512
#endif

// CTA pairs sharing K and V (CL = 2 below) from SAGE_SM90_PAIR_KEYS keys on (sm90_cluster_ok).
// Measured end to end on an H200 (bench/pairs_ab.py --power 2, 96beac2), time per call with
// pairs against without: 2048 keys +0.4 %, 2304 0.0, 3072 -0.2, 4096 -0.2, 8192 -0.6 to -0.8,
// 16384-45000 -0.8 to -0.9 % (`…-96beac2-pairs-power*.md`).
#ifndef SAGE_SM90_PAIR_KEYS
#define SAGE_SM90_PAIR_KEYS 2304
#endif

// DA: the columns computed, D's buffers otherwise. Head dims 65-96 arrive zero-padded to 128
// (the quantized Q, K and V^T buffers and their tensor maps are D=128's) and run with DA = 96:
// QK^T over 3 of the 4 32-byte k-steps (the fourth would add the padding's zeros), V^T tiles
// of 96 rows (then the ones), O and the PV product 96 columns wide. Same results as D=128,
// bit for bit: only products with zeros are left out. Head dims 129-192, zero-padded to 256,
// run D=256's kernel the same way with DA = 192 (6 of 8 k-steps, the PV halves 96 and 96 + 8).
template <int D, int NC, int VX = 1, int DA = D>
struct Sm90Shape {
  static_assert(D == 64 || D == 128 || D == 256, "native head dims");
  static_assert(DA == D || (D == 128 && DA == 96 && VX == 1) || (D == 256 && DA == 192),
                "96 of D=128's columns (one V term) or 192 of D=256's");
  static_assert(NC == 2 || NC == 3, "two or three consumer warpgroups");
  static_assert(VX == 1 || VX == 2, "V as one e4m3 term or two");
  static_assert(D != 256 || (NC == 2 && VX == 1), "D=256: two consumers (O alone is 128 registers), one V term");
  static constexpr int kNC = NC, kVX = VX;
  // The PV product in two halves of D/2 columns, each waited for and folded before the next
  // GEMM, so that O_blk is never live whole beside O: three consumers at D=128 (160
  // registers), and D=256 (O alone takes 128 of a consumer's 240)
  static constexpr bool kSplitPV = (D == 128 && kNC == 3) || D == 256;
  static constexpr int kKbu = kSplitPV ? 1 : 2;  // the key loop's unroll (2 spills 476 bytes with kSplitPV)
  // K/V ring depth: what fits beside two Q buffers (D=256: one K and one V tile are 65 KiB)
  static constexpr int kBQ = 64 * kNC, kBK = kSm90BlockK, kStages = D == 64 ? 4 : D == 128 ? 3 : 2,
                       kThreads = 128 * (kNC + 1);
  // With two stages a K slot is refilled as soon as every consumer has its S (empty_k), not
  // after the PV product of the same tile, so the next K tile loads during a whole turn
  static constexpr bool kSepK = kStages == 2;
  // O leaves through a shared-memory stage and TMA, except with V in two terms at D=128 and
  // three consumers (the stage's 48 KiB then hold the second V terms of a 3-deep ring) and at
  // D=256 (no room)
  static constexpr bool kOStage = !(VX == 2 && D == 128 && NC == 3) && D != 256;
  // registers per consumer thread after setmaxnreg (the producer keeps 24): 65536 in all
  static constexpr int kConsRegs = kNC == 2 ? 240 : 160;
  static constexpr int kQBufs = 2;    // Q of the next work tile lands while this one runs
  // Q and K rows are loaded in spans of kSpan bytes (a 64- or 128-byte swizzle span): one span
  // per row at D <= 128; at D=256 two, each span of a tile a [rows, 128] block of its own
  static constexpr int kSpan = D == 64 ? 64 : 128, kSpans = D / kSpan;
  static constexpr int kQKSwizzle = kSpan;
  static constexpr int kQBytes = kBQ * D, kKBytes = kBK * D, kVBytes = DA * kBK;
  // Each V^T stage is followed by 8 rows of e4m3 ones (written once): the PV product over
  // D + 8 rows gives O and, in its last 8 columns, the row sums of the e4m3 P it multiplied.
  // With V in two terms (VX = 2) the stage holds V^T's e4m3 rounding and those ones, then the
  // rounding of the remainder followed by 8 rows of zeros: P times both, summed by the tensor
  // cores, is P V with V to about bf16's precision (and the sums counted once).
  static constexpr int kOnesBytes = 8 * kBK, kVTerm = kVBytes + kOnesBytes, kVStride = VX * kVTerm;
  static constexpr int kOffK = kQBufs * kQBytes;
  static constexpr int kOffV = kOffK + kStages * kKBytes;
  // O of a work tile on its way out: per consumer 64 rows in D/64 boxes of 64x64 16-bit values,
  // 128-byte swizzled (TMA's layout, and conflict-free for the accumulator's row pattern)
  static constexpr int kOBox = 64 * 128, kOBytes = (D / 64) * kOBox;
  static constexpr int kOffO = kOffV + kStages * kVStride;
  static_assert(kOffO % 1024 == 0, "TMA's 128-byte swizzle needs 1024-byte aligned boxes");
  static constexpr int kOffBar = kOffO + (kOStage ? kNC * kOBytes : 0);
  static constexpr int kBars = 2 * kQBufs + 5 * kStages;
  static constexpr int kSmem = kOffBar + 8 * kBars + 1024;  // + slack to align the base to 1024
  static_assert(kSmem <= 227 * 1024, "sm_90's shared memory per CTA");
};

// 2^x on the FMA pipe, for a share of the softmax's exponentials: the MUFU unit does 16 per
// clock per SM and is otherwise the busiest unit after the tensor cores. Round-to-nearest
// splits x into n + f, f in [-1/2, 1/2] (the 1.5*2^23 addition leaves n in the low mantissa
// bits), a degree-3 polynomial gives 2^f (relative error <= 7.5e-5; degree 2, at 1.7e-3,
// moved enough P values to the next e4m3 step to fail the tests against the reference) and n
// is added to the exponent. x is clamped at -125 so that the result stays a normal float
// (it then rounds to 0 in e4m3 like the exact value; masked -inf scores land there too).
constexpr float kMagic = 12582912.f;  // 1.5 * 2^23: adding it rounds to an integer kept in the low mantissa bits

__device__ __forceinline__ float ex2_fma(float x) {
  x = fmaxf(x, -125.f);
  const float t = x + kMagic;
  const float f = x - (t - kMagic);
  const float p = fmaf(fmaf(fmaf(0.055171154f, f, 0.24261014f), f, 0.69326097f), f, 0.9999281f);
  return __int_as_float(__float_as_int(p) + (__float_as_int(t) << 23));
}

// Which exponentials go to ex2_fma: in each thread's row, those of every kPoly-th column pair
// (0: none). With three consumers none, as they leave no issue slots to spare (0 against 1/16,
// 1/8 and 1/3; measured on the H100, bench/NOTES.md). With two (D=128, short sequences) 5 of 16
// (every third) were the fastest of 0, 1/8, 1/4, 1/3 and 1/2, by 1-2 % of the kernel alone (v12),
// but they round those exponentials differently from MUFU's, so a call's bits would depend on
// its consumer count, and a packed launch (which takes its longest sequence's count) would not
// give each sequence its own call's bits: none since the three-consumer switch-overs moved.
// SAGE_SM90_POLY2 / SAGE_SM90_POLY3 override, for experiments.
#ifndef SAGE_SM90_POLY2
#define SAGE_SM90_POLY2 0
#endif
#ifndef SAGE_SM90_POLY3
#define SAGE_SM90_POLY3 0
#endif

// x of lane 0, through an opaque shfl.sync (NVVM folds __shfl_sync of a value it can see is the
// same in every lane): ptxas then treats the result as uniform, which a value derived from the
// thread index is not to it
__device__ __forceinline__ int warp_bcast(int x) {
  int r;
  asm volatile("shfl.sync.idx.b32 %0, %1, 0, 0x1f, 0xffffffff;" : "=r"(r) : "r"(x));
  return r;
}

// gridDim.x CTAs (one per SM, or one per tile) take work tiles w: blockIdx.x first, then
// blockIdx.x + i * gridDim.x or, with p.tile_counter, gridDim.x + the counter's next value.
// CL = 2: clusters of two CTAs whose work tiles are always two neighbouring tiles w and w ^ 1
// (fixed stride, an even grid and an even tile count: sm90_cluster_ok). Where both read the
// same K/V head (one query head's tiles, or the two query heads around a head boundary when
// they are in one GQA group), each CTA's producer loads half of every K and V tile and
// multicasts it to both, so the pair reads K and V from L2 once instead of twice (at the power
// cap that traffic costs clock: bench/NOTES.md); a pair straddling two K/V heads loads its own.
// The consumers are the same.
// VL: packed sequences (p.seq_q, p.seq_k), built apart so that the other instances keep their
// registers (per-tile key counts cost the D=128 three-consumer loop 52 bytes more spill).
// DA < D: the columns computed (Sm90Shape).
template <int D, int NCONS, typename OutT, int CL = 1, int VX = 1, bool VL = false, int DA = D>
__global__ void __launch_bounds__(Sm90Shape<D, NCONS, VX, DA>::kThreads, 1) attn_sm90_kernel(const __grid_constant__ Sm90Args a, const int tiles) {
  static_assert(CL == 1 || CL == 2, "one CTA, or a pair sharing K and V");
  static_assert(!VL || (CL == 1 && VX == 1), "packed sequences: no clusters, one V term");
  using S = Sm90Shape<D, NCONS, VX, DA>;
  constexpr int ST = S::kStages, BK = S::kBK, NC = S::kNC;
  constexpr int NACC = BK / 2;                         // S accumulator registers per thread
  static_assert(BK == 128, "the row maxima below take 16 scores per row and 64-key half");
  constexpr float OFF = 8.807354922057604f;            // log2(448): P scaled into e4m3 range
  // the heads' last tiles (Sm90Args::skip_idle, head_full): D=64 only. In D=128's three-consumer
  // key loop the same code made ptxas spill more (766 -> 776 instructions, 15 -> 24 local-memory
  // ones per key tile), which the split-tile rows of bench/NOTES.md measured as a loss.
  constexpr bool kTail = D == 64;
  constexpr int kPoly = NC == 2 ? SAGE_SM90_POLY2 : SAGE_SM90_POLY3;
  const AttnParams& p = a.p;

  extern __shared__ uint8_t smem_raw[];
  uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + S::kOffBar);
  uint64_t* full_q = bars;                    // [kQBufs]
  uint64_t* empty_q = bars + S::kQBufs;       // [kQBufs]
  uint64_t* full_k = bars + 2 * S::kQBufs;    // [ST]
  uint64_t* full_v = full_k + ST;             // [ST]
  uint64_t* empty = full_v + ST;              // [ST]
  uint64_t* peer_empty = empty + ST;          // [ST] (CL = 2) the other CTA's slot is free too
  uint64_t* empty_k = peer_empty + ST;        // [ST] (kSepK) K of the slot is consumed; `empty` then means V
  // With the tile counter, the index of the work tile in each Q buffer goes from the producer to
  // the consumers through p.tile_counter[1 + 2 * blockIdx.x + buffer], written before the
  // producer's arrival on that buffer's full_q barrier and read after the consumers' wait on it
  // (an index >= tiles: no more work). (Global memory: the sanitizer's race checker, which
  // does not model mbarriers, watches shared memory only.) Without it, the fixed stride.
  volatile int* const chan = p.tile_counter ? p.tile_counter + 1 + 2 * blockIdx.x : nullptr;
  auto tile_at = [&](int it) {
    return chan ? chan[it % S::kQBufs] : static_cast<int>(blockIdx.x) + it * static_cast<int>(gridDim.x);
  };

  const int tid = threadIdx.x, wg = tid / 128;
  const int hpk = p.heads_q / p.heads_kv;

  if (tid == 0) {
    for (int i = 0; i < S::kQBufs; ++i) {
      mbar_init(&full_q[i], 1);
      mbar_init(&empty_q[i], 4 * NC);  // one arrival per consumer warp
    }
    for (int s = 0; s < ST; ++s) {
      mbar_init(&full_k[s], 1);
      mbar_init(&full_v[s], 1);
      mbar_init(&empty[s], 4 * NC);
      if constexpr (CL == 2) mbar_init(&peer_empty[s], 1);
      if constexpr (S::kSepK) mbar_init(&empty_k[s], 4 * NC);
    }
    mbar_fence_init();
  }
  for (int i = tid; i < ST * S::kOnesBytes / 4; i += S::kThreads) {
    const int st = i / (S::kOnesBytes / 4), w = i % (S::kOnesBytes / 4);
    uint32_t* rows = reinterpret_cast<uint32_t*>(smem + S::kOffV + st * S::kVStride + S::kVBytes);
    rows[w] = 0x38383838u;  // e4m3 1.0
    if constexpr (VX == 2) rows[S::kVTerm / 4 + w] = 0u;  // after the second term: zeros
  }
  fence_proxy_async();  // the ones are read by wgmma (the async proxy)
  __syncthreads();
  // the other CTA's loads land on this one's barriers: none before they are initialised
  if constexpr (CL == 2) cluster_sync();
  // launched with launch_pdl: the set-up above overlaps the end of quant_qkv; every global
  // access (TMA loads, scales, O, LSE) comes after this
  pdl_wait();

  if (wg == 0) {
    // ---------------- producer ----------------
    regs_dealloc<24>();
    if (tid == 0) {
      tma_prefetch_desc(&a.tq);
      tma_prefetch_desc(&a.tk);
      tma_prefetch_desc(&a.tv);
      int c = 0;  // K/V tiles loaded so far by this CTA: ring slot c % ST, use c / ST
      const uint32_t rank = CL == 2 ? cluster_rank() : 0u;  // its part of each K/V tile
      // A K or V tile of slot `dst`, at tensor coordinates (c0, c1): whole (CL = 1); with CL = 2,
      // where the pair's two work tiles read the same K/V head (`shared`), this CTA's half
      // (part `rank`: `part` bytes on, rows c1 + rank * rows) into both CTAs, else both halves
      // into this CTA only (the pair's tiles straddle two K/V heads; the maps' boxes are halves).
      bool shared = true;
      auto load_kv = [&](uint8_t* dst, const CUtensorMap* map, int c0, int c1, int part, int rows, uint64_t* bar) {
        if constexpr (CL == 1) {
          tma_load_2d(dst, map, c0, c1, bar);
        } else if (shared) {
          tma_load_2d_multicast(dst + rank * part, map, c0, c1 + static_cast<int>(rank) * rows, bar, 3);
        } else {
          tma_load_2d(dst, map, c0, c1, bar);
          tma_load_2d(dst + part, map, c0, c1 + rows, bar);
        }
      };
      // The CTA's work tiles: blockIdx.x first, then every gridDim.x-th, or (tile_counter) the
      // next unclaimed one, claimed when this tile's loads are all issued (a few key tiles
      // before the consumers finish it), so CTAs that finish early take more. The end is
      // signalled on the next Q buffer's barrier too.
      auto next_tile = [&](int w) {
        return p.tile_counter ? static_cast<int>(gridDim.x) + atomicAdd(p.tile_counter, 1) : w + static_cast<int>(gridDim.x);
      };
      for (int w = blockIdx.x, it = 0;; ++it) {
        // packed sequences: tiles past their sequence's end (or of a sequence without keys)
        // are never handed to the consumers, which then take the index from `chan`
        if constexpr (VL)
          while (w < tiles && sm90_tile<S::kBQ, VL, kTail>(a, w).nkb == 0) w = next_tile(w);
        const int qb = it % S::kQBufs;
        if (it >= S::kQBufs) mbar_wait(&empty_q[qb], ((it / S::kQBufs) & 1) ^ 1);
        if (chan) chan[qb] = w;  // released to the consumers by the arrival below
        if (w >= tiles) {
          mbar_arrive(&full_q[qb]);
          break;
        }
        const Sm90Tile tl = sm90_tile<S::kBQ, VL, kTail>(a, w);
        const int64_t bh = static_cast<int64_t>(tl.b) * p.heads_q + tl.h;
        const int64_t bhk = static_cast<int64_t>(tl.b) * p.heads_kv + tl.h / hpk;
        if constexpr (CL == 2) {
          // the other CTA of the pair runs tile w ^ 1 (fixed stride, even grid and tile count):
          // the same K/V head within a query head, or across two query heads of one GQA group
          const Sm90Tile pt = sm90_tile<S::kBQ, VL, kTail>(a, w ^ 1);
          shared = static_cast<int64_t>(pt.b) * p.heads_kv + pt.h / hpk == bhk;
        }
        mbar_expect_tx(&full_q[qb], S::kQBytes);
#pragma unroll
        for (int sp = 0; sp < S::kSpans; ++sp)
          tma_load_2d(smem + qb * S::kQBytes + sp * S::kBQ * S::kSpan, &a.tq, sp * S::kSpan,
                      static_cast<int>(bh * p.nq_pad + tl.q0), &full_q[qb]);
        for (int kb = 0; kb < tl.nkb; ++kb, ++c) {
          const int st = c % ST;
          if constexpr (S::kSepK) {
            // K's slot is free once every consumer has S of the tile it held; V's (below) once
            // every consumer has folded its PV product
            if (c >= ST) mbar_wait(&empty_k[st], ((c / ST) & 1) ^ 1);
            mbar_expect_tx(&full_k[st], S::kKBytes);
#pragma unroll
            for (int sp = 0; sp < S::kSpans; ++sp)
              tma_load_2d(smem + S::kOffK + st * S::kKBytes + sp * BK * S::kSpan, &a.tk, sp * S::kSpan,
                          static_cast<int>(bhk * p.nk_pad + kb * BK), &full_k[st]);
          }
          if (c >= ST) {
            mbar_wait(&empty[st], ((c / ST) & 1) ^ 1);
            if constexpr (CL == 2) {
              // slot st may be rewritten in both CTAs: tell the other CTA this one's consumers
              // are done with it, and wait for its word that its consumers are done too (also
              // for tiles the pair does not share, so that both keep the barrier's phases)
              mbar_arrive_cluster(&peer_empty[st], rank ^ 1);
              mbar_wait(&peer_empty[st], ((c / ST) & 1) ^ 1);
            }
          }
          // the whole tile lands here; with CL = 2 and a shared tile this CTA loads its half
          // (the other CTA's half may come first) into both CTAs
          if constexpr (!S::kSepK) {
            static_assert(S::kSpans == 1, "K rows in one span");
            mbar_expect_tx(&full_k[st], S::kKBytes);
            load_kv(smem + S::kOffK + st * S::kKBytes, &a.tk, 0, static_cast<int>(bhk * p.nk_pad + kb * BK),
                    S::kKBytes / CL, BK / CL, &full_k[st]);
          }
          mbar_expect_tx(&full_v[st], VX * S::kVBytes);
#pragma unroll
          for (int tm = 0; tm < VX; ++tm)  // V^T rows of term tm: (bhk * VX + tm) * D on, DA of them
            load_kv(smem + S::kOffV + st * S::kVStride + tm * S::kVTerm, &a.tv, kb * BK,
                    static_cast<int>((bhk * VX + tm) * D), S::kVBytes / CL, DA / CL, &full_v[st]);
        }
        w = next_tile(w);
      }
    }
  } else {
    // ---------------- consumers ----------------
    regs_alloc<S::kConsRegs>();
    const int cw = wg - 1, warp = (tid / 32) % 4, lane = tid % 32, g = lane >> 2, t = lane & 3;
    const int nwb = p.nq_pad / kAttnWarpQ;
    const int k_groups = p.k_groups;
    const bool causal = p.causal != 0;
    // (D=256, which writes O by plain stores: 4-byte pairs also where it computes more columns
    // than the output has, even head dims 130-254; full-width-only pairs made those 2-byte stores,
    // 7-10 % of the kernel at N=2048, bench/NOTES.md. D=64 and 128 keep full-width pairs: their
    // plain stores serve outputs TMA cannot store (head dims that are not multiples of 8) and
    // packed sequences (all of D=64's, D=128's partial last boxes), and the same change made
    // ptxas spill more in the dense instances, 12 -> 16 bytes at D=64 and 68 -> 84 in D=128's
    // three-consumer one (the packed ones unchanged), -Xptxas=-v at 36c270a; not measured on a GPU.)
    const bool pairs = D == 256 ? out_pairs_even(p) : out_pairs_ok(p, DA);

    // Ping-pong: the consumers take turns issuing their GEMMs in a ring (named barriers 1 to
    // NC; consumer cw waits on barrier 1 + cw, which the consumer before it arrives on), so
    // one warpgroup's softmax runs while another's GEMMs keep the tensor cores busy.
    // A turn issues PV of tile kb-1, waits for it and issues QK^T of tile kb; the PV result is
    // folded into O while QK^T runs. The last turn of a work tile is the PV of its last key
    // tile. All consumers take nkb + 1 turns per work tile; consumer 0 goes first (the last consumer
    // arrives once ahead), and the last consumer leaves out its very last hand-over so every
    // barrier phase completes.
    // Waiting for PV inside the turn, before QK^T goes out, measured faster than issuing both
    // and waiting for both (+2-3 % at D=128; at D=64 it is what makes three consumers pay):
    // the fold runs under QK^T instead of after it, and P's registers are free again before
    // S is written, so P, S, O_blk and O are never all live (at D=64 three consumers' 160
    // registers then spill 12 bytes, not 316; D=128 with two consumers no longer spills at all).
    // (Issuing QK^T of tile kb+1 before the softmax of tile kb would need S, PV and O live at
    // once: more than the 240 registers a consumer thread has.)
    const int my_turn = 1 + cw, other_turn = NC == 2 ? 2 - cw : (cw + 1 == NC ? 1 : cw + 2);
    if (cw == NC - 1) named_bar_arrive<256>(1);

    int c = 0;  // K/V tiles consumed so far (the producer's counter)
    for (int it = 0;; ++it) {
      const int qb = it % S::kQBufs;
      mbar_wait(&full_q[qb], (it / S::kQBufs) & 1);
      // (broadcast from lane 0: ptxas then treats the value as uniform; a branch on a plain
      // load ahead of the wgmmas makes it serialize them all, C7520)
      const int w = __shfl_sync(0xffffffffu, tile_at(it), 0);
      if (w >= tiles) break;
      // Whether this is the CTA's last work tile (asked by the last consumer only, at its last
      // hand-over): the next tile's index, published with its Q buffer after this tile's last
      // K/V loads went out.
      auto last_tile = [&]() {
        if (chan) mbar_wait(&full_q[(it + 1) % S::kQBufs], ((it + 1) / S::kQBufs) & 1);
        return __shfl_sync(0xffffffffu, tile_at(it + 1), 0) >= tiles;
      };
      const Sm90Tile tl = sm90_tile<S::kBQ, VL, kTail>(a, w);
      const int h = tl.h, b = tl.b, nkb = tl.nkb, nk = VL ? tl.nk : p.nk, c0 = c;
      const int64_t bh = static_cast<int64_t>(b) * p.heads_q + h;
      const int64_t bhk = static_cast<int64_t>(b) * p.heads_kv + h / hpk;
      const int row_w = tl.q0 + cw * 64 + warp * 16;  // first query row of this warp
      // (192-row tiles: the rows of the last tile past nq_pad are computed and dropped; their
      // Q scale is read from the head's last block so that the load stays inside the buffer)
      const int qwb = NC == 2 ? row_w / kAttnWarpQ : min(row_w / kAttnWarpQ, nwb - 1);
      const float qsc = p.q_scale[(bh * nwb + qwb) * p.q_groups + (p.q_groups == 8 ? g : 0)];
      const float* ksp = p.k_scale + bhk * (p.nk_pad / kAttnBlockK) * k_groups + (k_groups == 4 ? t : 0);
      const uint32_t dq = kmajor_desc_lo<S::kQKSwizzle>(smem_addr(smem + qb * S::kQBytes + cw * 64 * S::kSpan));

      float o[DA / 2];
      float blk[DA / 2 + 4];  // (unused with kSplitPV) PV of one tile and the row sums of its P (written by the tensor cores)
      int32_t sacc[NACC];  // S of one tile (written by the tensor cores)
#pragma unroll
      for (int i = 0; i < DA / 2; ++i) o[i] = 0.f;
      float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2] = {1.f, 1.f};
      uint32_t pa[BK / 32][4];  // P of the previous tile, the A operand of its PV product
#pragma unroll
      for (int s = 0; s < BK / 32; ++s)
        if constexpr (kTail) pa[s][0] = pa[s][1] = pa[s][2] = pa[s][3] = 0u;  // (idle: zeros)

      // Ring slot and phase of key tile kb, advanced once per tile (no divisions by kStages
      // in the loop), and the slot of tile kb-1. Descriptors of slot st: base + st * bytes/16.
      int st = c0 % ST, ph = (c0 / ST) & 1, pst = 0;
      const uint32_t dk0 = kmajor_desc_lo<S::kQKSwizzle>(smem_addr(smem + S::kOffK));
      const uint32_t dv0 = kmajor_desc_lo<128>(smem_addr(smem + S::kOffV));

      // O_blk = P V for key tile kb-1 (ring slot pst), issued inside a turn: the columns of V^T
      // rows row0 .. row0 + N - 1 into acc (N / 2 registers), committed as one group; with two
      // V terms, P times the second term's same rows is added in the same accumulator.
      auto issue_pv = [&](auto& acc, int row0) {
        constexpr int N = 2 * static_cast<int>(sizeof(acc) / sizeof(acc[0]));
        const uint32_t dv = dv0 + pst * (S::kVStride >> 4) + ((row0 * BK) >> 4);
#pragma unroll
        for (int tm = 0; tm < VX; ++tm)
#pragma unroll
          for (int s = 0; s < BK / 32; ++s) {
            const uint64_t db = kmajor_desc_at<128>(dv + tm * (S::kVTerm >> 4) + 2 * s);
            if (tm == 0 && s == 0) wgmma_e4m3_rs_zero<N>(acc, pa[s], db);
            else wgmma_e4m3_rs<N>(acc, pa[s], db, 1);
          }
        wgmma_commit();
      };
      // O = O * alpha + acc, acc (complete) holding output columns from 2 * o0 on. The part
      // that ends in the ones columns (last) also gives the row sums (columns DA + 2t and
      // DA + 2t + 1, equal: rows g and g + 8), and then P and the V slot are done with.
      auto fold = [&](auto& acc, int o0, bool last) {
        constexpr int L = static_cast<int>(sizeof(acc) / sizeof(acc[0]));
#pragma unroll
        for (int i = 0; i < L; ++i) reg_fence(acc[i]);
        if (last) {
#pragma unroll
          for (int s = 0; s < BK / 32; ++s)
#pragma unroll
            for (int r = 0; r < 4; ++r) reg_fence(pa[s][r]);
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[pst]);  // K and V of this slot are consumed
        }
#pragma unroll
        for (int i = 0; i < L && o0 + i < DA / 2; ++i) o[o0 + i] = o[o0 + i] * alpha[(i >> 1) & 1] + acc[i];
        if (last) {
          l[0] = l[0] * alpha[0] + acc[L - 4];
          l[1] = l[1] * alpha[1] + acc[L - 2];
        }
      };
      // Split PV (kSplitPV): columns 0 to DA/2 - 1 waited for and folded, then the rest and the sums.
      auto split_pv = [&]() {
        constexpr int H = S::kSplitPV ? DA / 2 : 64;  // (a width with a wrapper where it is not used)
        float ba[H / 2], bb[H / 2 + 4];
        issue_pv(ba, 0);
        wgmma_wait<0>();
        fold(ba, 0, false);
        wgmma_fence();
        issue_pv(bb, H);
        wgmma_wait<0>();
        fold(bb, H / 2, true);
      };

      // K scales of the two 64-key halves of a tile, loaded one tile ahead so that the load's
      // latency is not on the path from S to the softmax; but in D=128's three-consumer kernel
      // loaded in the turn, under the tile's own QK^T: there the two values held across the
      // loop made ptxas spill (15 local-memory instructions per key tile, none without them),
      // and the late load measured 3-4 % faster, where at D=64 it cost 21 % and at 1k 3 %
      // (the QK^T too short to hide the load; bench/NOTES.md, "K scales in the turn")
      constexpr bool kLateKs = NC == 3 && DA == 128;
      float kn0 = kLateKs ? 0.f : ksp[0], kn1 = kLateKs ? 0.f : ksp[k_groups];
      const float* ksn = kLateKs ? ksp : ksp + 2 * k_groups;  // the scales of the next key tile
      // Idle (a.skip_idle): all 64 rows of this consumer lie past the end (a head's last tile).
      // It takes the first nkb turns here, releasing each K/V slot where a working consumer
      // would (in the turn after its QK^T), runs no key tile below, and takes the last turn
      // like the others: a PV product of zeros whose fold releases the last slot. It stores
      // nothing (its rows are past nq). Its releases are ordered by consumer 0, which always
      // works (sm90_q_tiles) and waits for each slot before the idle consumers' turn that
      // frees it; with every consumer idle nothing would wait, the ring would run ahead of the
      // loads, and the kernel fault. No branch around the key loop: ptxas spills in it when
      // there is one (bench/NOTES.md).
      const int nidle = kTail ? warp_bcast(a.skip_idle && tl.q0 + cw * 64 >= (VL ? tl.nq : p.nq) ? nkb : 0) : 0;
      int pph = 0;
      for (int kb = 0; kb < nidle; ++kb) {
        named_bar_sync<256>(my_turn);
        if (kb > 0) {
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty[pst]);
        }
        named_bar_arrive<256>(other_turn);
        pph = ph, pst = st, st = st + 1 == ST ? 0 : st + 1, ph = st == 0 ? ph ^ 1 : ph;
      }
      // (idle: the last V tile, which its zero PV product reads, has landed)
      if (nidle == 0) mbar_wait(&full_k[st], ph);
      else mbar_wait(&full_v[pst], pph);
      // Unrolled by two: ptxas schedules two tiles' softmax and turns together better (measured
      // +2-5 % from 4k keys up, equal at 1k; bench/NOTES.md)
#pragma unroll (S::kKbu)
      for (int kb = 0; kb < nkb - nidle; ++kb) {
        float ks0 = kn0, ks1 = kn1;
        if (!kLateKs && kb + 1 < nkb) {
          kn0 = ksn[0];
          kn1 = ksn[k_groups];
          ksn += 2 * k_groups;
        }
        const uint32_t dk = dk0 + st * (S::kKBytes >> 4);
        const int nst = st + 1 == ST ? 0 : st + 1, nph = nst == 0 ? ph ^ 1 : ph;

        // K of this tile and V of the previous one have landed: waited for during the
        // previous tile's GEMMs (below), off the path from one softmax to the next GEMMs
        named_bar_sync<256>(my_turn);
        wgmma_fence();
        if (kb > 0) {
          if constexpr (S::kSplitPV) {
            split_pv();
          } else {
            issue_pv(blk, 0);
            wgmma_wait<0>();
          }
        }
        wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < DA / 32; ++ks) {
          // 32 bytes of each row per step; past the first span, the next [rows, kSpan] block
          constexpr int SW = S::kQKSwizzle, KPS = S::kSpan / 32;
          const uint32_t oq = 2 * (ks % KPS) + (ks / KPS) * ((S::kBQ * S::kSpan) >> 4);
          const uint32_t ok = 2 * (ks % KPS) + (ks / KPS) * ((BK * S::kSpan) >> 4);
          if (ks == 0) wgmma_s8_ss_zero<BK>(sacc, kmajor_desc_at<SW>(dq), kmajor_desc_at<SW>(dk));
          else wgmma_s8_ss<BK>(sacc, kmajor_desc_at<SW>(dq + oq), kmajor_desc_at<SW>(dk + ok), 1);
        }
        wgmma_commit();
        named_bar_arrive<256>(other_turn);
        if constexpr (kLateKs) {
          ks0 = ksn[0];
          ks1 = ksn[k_groups];
          ksn += 2 * k_groups;
        }
        // The operands of the next turn, while this turn's GEMMs run. No deadlock: the
        // producer refills K slot kb+1 once PV of tile kb+1-kStages is done, in all
        // consumers' earlier turns, which wait on nothing this consumer still holds.
        if (kb + 1 < nkb) mbar_wait(&full_k[nst], nph);
        mbar_wait(&full_v[st], ph);

        // Fold the previous tile's PV in (waited for in the turn) while QK^T runs, then wait for
        // S. (Issuing both and waiting for the PV group alone would make ptxas serialize the
        // wgmmas, C7514.)
        if constexpr (!S::kSplitPV) {
          if (kb > 0) fold(blk, 0, true);
        }
        wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < NACC; ++i) reg_fence(sacc[i]);
        if constexpr (S::kSepK) {
          __syncwarp();
          if (lane == 0) mbar_arrive(&empty_k[st]);  // K of this slot is consumed
        }

        // Softmax, few instructions per element. An int32 s becomes the float 1.5*2^23 + s
        // exactly (|s| < 2^22) with one integer add; that float is monotone in s, so the row
        // maximum is taken on it, and one FFMA gives the log2-domain score minus the running
        // maximum: b * f - (1.5*2^23 * f + m). f = q scale * k scale differs between the two
        // 64-key halves of the tile (K scales come per 64 keys).
        const float f0 = qsc * ks0, f1 = qsc * ks1;
        float xb[NACC];
#pragma unroll
        for (int i = 0; i < NACC; ++i) xb[i] = __int_as_float(sacc[i] + 0x4B400000);
        if ((kb + 1) * BK > nk || (causal && (kb + 1) * BK - 1 > row_w)) {
#pragma unroll
          for (int i = 0; i < NACC; ++i) {
            const int col = kb * BK + 8 * (i / 4) + 2 * t + (i & 1);
            const int row = row_w + g + 8 * ((i >> 1) & 1);
            if (col >= nk || (causal && col > row)) xb[i] = -INFINITY;
          }
        }
        float alpha_new[2];
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          // Row maxima of the two 64-key halves (as offset floats). The offset floats are
          // positive and -inf is negative as an int32, so their bit patterns order like them:
          // three at a time with the sm_90 DPX 3-way integer max, 8 instructions for 16
          // scores, as a shallow tree
          int32_t bi[2];
#pragma unroll
          for (int u = 0; u < 2; ++u) {
            auto v = [&](int k) { return __float_as_int(xb[4 * (8 * u + k / 2) + 2 * hr + (k & 1)]); };
            const int32_t a0 = __vimax3_s32(v(0), v(1), v(2)), a1 = __vimax3_s32(v(3), v(4), v(5));
            const int32_t a2 = __vimax3_s32(v(6), v(7), v(8)), a3 = __vimax3_s32(v(9), v(10), v(11));
            const int32_t a4 = __vimax3_s32(v(12), v(13), v(14));
            bi[u] = __vimax3_s32(__vimax3_s32(a0, a1, a2), a3, max(a4, v(15)));
          }
          const float b0 = __int_as_float(bi[0]), b1 = __int_as_float(bi[1]);
          const float mx = warp_max_quad(fmaxf(b0 == -INFINITY ? -INFINITY : (b0 - kMagic) * f0,
                                               b1 == -INFINITY ? -INFINITY : (b1 - kMagic) * f1));
          const float m_new = fmaxf(m[hr], mx);
          alpha_new[hr] = m[hr] == -INFINITY ? 0.f : ex2(m[hr] - m_new);
          const float mo = m_new == -INFINITY ? 0.f : m_new - OFF;
          m[hr] = m_new;
          const float e0 = -fmaf(kMagic, f0, mo), e1 = -fmaf(kMagic, f1, mo);
#pragma unroll
          for (int j = 0; j < BK / 8; ++j)
#pragma unroll
            for (int e = 2 * hr; e < 2 * hr + 2; ++e) {
              const float xe = fmaf(xb[4 * j + e], j < BK / 16 ? f0 : f1, j < BK / 16 ? e0 : e1);
              const float pe = kPoly > 0 && j % (kPoly > 0 ? kPoly : 1) == kPoly - 1 ? ex2_fma(xe) : ex2(xe);
              xb[4 * j + e] = pe;
            }
        }

        // P of this tile as e4m3 A fragments (k order of the permuted V^T rows)
#pragma unroll
        for (int s = 0; s < BK / 32; ++s) {
          const int i = 16 * s;
          pa[s][0] = to_e4m3x4(xb[i + 0], xb[i + 1], xb[i + 4], xb[i + 5]);
          pa[s][1] = to_e4m3x4(xb[i + 2], xb[i + 3], xb[i + 6], xb[i + 7]);
          pa[s][2] = to_e4m3x4(xb[i + 8], xb[i + 9], xb[i + 12], xb[i + 13]);
          pa[s][3] = to_e4m3x4(xb[i + 10], xb[i + 11], xb[i + 14], xb[i + 15]);
        }
        alpha[0] = alpha_new[0], alpha[1] = alpha_new[1];
        pst = st, st = nst, ph = nph;
      }
      // the last turn of this work tile: PV of its last key tile (its V waited for above)
      named_bar_sync<256>(my_turn);
      wgmma_fence();
      if constexpr (S::kSplitPV) split_pv();
      else issue_pv(blk, 0);
      if (cw != NC - 1 || !last_tile()) named_bar_arrive<256>(other_turn);
      // The V scales of this thread's output columns, loaded while that PV runs (split: after
      // it), all at once:
      // loaded in the store loop below, each load waited behind the previous store (which
      // may alias it), one L2 round trip per column pair, ~9 us per work tile in all (ncu).
      float2 vs[DA / 8];
      const float* vsc = p.v_scale + bhk * D;
#pragma unroll
      for (int j = 0; j < DA / 8; ++j) vs[j] = __ldg(reinterpret_cast<const float2*>(vsc + 8 * j + 2 * t));
      if constexpr (!S::kSplitPV) {
        wgmma_wait<0>();
        fold(blk, 0, true);
      }
      c = c0 + nkb;
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty_q[qb]);  // Q of this work tile is consumed
      // epilogue: 1/l, V scale, store; LSE. Runs while the other consumer's GEMMs of the next
      // work tile go on.
      float inv[2];
#pragma unroll
      for (int hr = 0; hr < 2; ++hr) {
        const float lt = l[hr];  // the whole row's sum (from the PV product)
        inv[hr] = lt > 0.f ? 1.f / lt : 0.f;
        const int row = row_w + g + 8 * hr;
        if (p.lse && t == 0 && row < (VL ? tl.nq : p.nq)) {
          const int64_t at = VL ? static_cast<int64_t>(h) * p.total_q + p.seq_q[b] + row : bh * p.nq + row;
          write_lse(p, at, bh, row, m[hr], lt, OFF);
        }
      }
      // output columns 8j + 2t and 8j + 2t + 1 of row g + 8 hr, scaled
      auto out2 = [&](int j, int hr) {
        return make_float2(o[4 * j + 2 * hr] * inv[hr] * vs[j].x, o[4 * j + 2 * hr + 1] * inv[hr] * vs[j].y);
      };
      // (packed sequences, D=128: TMA for a consumer whose 64 rows all belong to the entry; its
      // map spans all packed rows, so a box running past the entry's last row would write the
      // next entry's first rows. The entry's last, partial box takes the plain stores below.
      // At D=64 the packed instance keeps plain stores: with the TMA path ptxas spilled in its
      // key loop, 8 local-memory instructions per iteration against none.)
      if (S::kOStage && a.o_tma && (!VL || (D == 128 && tl.q0 + cw * 64 + 64 <= tl.nq))) {
        // O through shared memory and one TMA store per 64 columns: 32-bit global stores from
        // the accumulator layout write 16 bytes per row and hold their source registers.
        // First, the previous work tile's store has read this consumer's staging buffer.
        if (tid % 128 == 0) bulk_wait_read();
        named_bar_sync<128>(1 + NC + cw);
        uint8_t* ostage = smem + S::kOffO + cw * S::kOBytes;
        const uint32_t ostage_s = smem_addr(ostage);
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          // row r of this consumer's 64 (r % 8 == g): its 16-byte chunk c sits at chunk c ^ g
          const uint32_t rbase = ostage_s + (warp * 16 + g + 8 * hr) * 128 + 16 * g + 4 * t;
#pragma unroll
          for (int j = 0; j < DA / 8; ++j) {
            const float2 v = out2(j, hr);
            st_shared_xor(rbase + (j / 8) * S::kOBox, 16 * (j % 8), pack2<OutT>(v.x, v.y));
          }
        }
        fence_proxy_async();
        named_bar_sync<128>(1 + NC + cw);
        if (tid % 128 == 0 && (NC == 2 || tl.q0 + cw * 64 < p.nq)) {
#pragma unroll
          for (int bx = 0; bx < (DA + 63) / 64; ++bx)  // (DA = 96: columns past d_out are clipped)
            tma_store_4d(&a.to, ostage + bx * S::kOBox, 64 * bx, (VL ? p.seq_q[b] : 0) + tl.q0 + cw * 64, h, VL ? 0 : b);
          bulk_commit();
        }
      } else {
        // (packed sequences: the entry's rows start at row seq_q[b] of o [total_q, Hq, d_out])
        OutT* ob = static_cast<OutT*>(p.o) + (VL ? p.seq_q[b] * p.o_stride_n : b * p.o_stride_b) + h * p.o_stride_h;
#pragma unroll
        for (int hr = 0; hr < 2; ++hr) {
          const int row = row_w + g + 8 * hr;
          if (row >= (VL ? tl.nq : p.nq)) continue;
          OutT* orow = ob + static_cast<int64_t>(row) * p.o_stride_n;
#pragma unroll
          for (int j = 0; j < DA / 8; ++j) {
            const float2 v = out2(j, hr);
            if constexpr (D == 256)
              store_out2_bounded(orow, 8 * j + 2 * t, v.x, v.y, pairs, p.d_out);
            else
              store_out2(orow, 8 * j + 2 * t, v.x, v.y, pairs, p.d_out);
          }
        }
      }
    }
    if (S::kOStage && a.o_tma && tid % 128 == 0) bulk_wait();  // shared memory stays until the stores are done
  }
}

// Host side (attn_sm90_host.cu): the tensor maps of one call (K and V in boxes of 1 / kv_parts
// of a tile: kv_parts CTAs load one tile together), the persistent grid size (the SMs of the
// current device, at most `tiles`; 0 on error), the consumer count, and whether a call may run
// on clusters of two (the kernel's CL = 2; SAGEATTN_SM90_CLUSTER=0 or 1 decides, for A/B runs).
// (v_rows: the V^T rows of a head the kernel reads, DA)
cudaError_t sm90_make_maps(const AttnParams& p, int head_dim, int v_rows, int q_rows, int kv_parts, Sm90Args& a);
int sm90_grid(int64_t tiles);
int sm90_consumers(const AttnParams& p, int head_dim);
bool sm90_cluster_ok(const AttnParams& p, int64_t tiles, int grid);

template <int D, int NC, int CL, int VX, bool VL = false, int DA = D>
cudaError_t attn_sm90_run(const AttnParams& p, cudaStream_t stream, int grid, int tiles) {
  using S = Sm90Shape<D, NC, VX, DA>;
  Sm90Args a;
  a.p = p;
  cudaError_t err = sm90_make_maps(p, D, DA, S::kBQ, CL, a);
  if (err != cudaSuccess) return err;
  sm90_tail(p, D, S::kBQ, VL, a);
  auto kernel = p.o_dtype == DType::kBFloat16 ? attn_sm90_kernel<D, NC, __nv_bfloat16, CL, VX, VL, DA>
                                              : attn_sm90_kernel<D, NC, __half, CL, VX, VL, DA>;
  err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem);
  if (err != cudaSuccess) return err;
  return launch_pdl_cluster(CL, kernel, dim3(grid), dim3(S::kThreads), S::kSmem, stream, a, tiles);
}

// How many two-CTA clusters of the CL = 2 kernel fit on the current device at once (cached per
// device; 0 when the driver says none or cannot say): the persistent grid needs all its pairs
// resident (the SMs of a GPC pair up; a GPC with an odd count leaves one SM out).
template <int D, int NC, int VX, int DA = D>
int sm90_resident_pairs() {
  using S = Sm90Shape<D, NC, VX, DA>;
  static int cached[64];  // pairs + 1; 0: not asked yet
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 0;
  if (dev < 64 && cached[dev] > 0) return cached[dev] - 1;
  auto kernel = attn_sm90_kernel<D, NC, __nv_bfloat16, 2, VX, false, DA>;  // the __half one has the same resources
  int n = 0;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(2), cfg.blockDim = dim3(S::kThreads), cfg.dynamicSmemBytes = S::kSmem;
  cudaLaunchAttribute attr = cluster_attr(2);
  cfg.attrs = &attr, cfg.numAttrs = 1;
  if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, S::kSmem) != cudaSuccess ||
      cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
    n = 0;
    (void)cudaGetLastError();  // this refusal only means: no clusters
  }
  if (dev < 64) cached[dev] = n + 1;
  return n;
}

template <int D, int NC, int VX, int DA = D>
cudaError_t attn_sm90_launch(const AttnParams& p, cudaStream_t stream) {
  using S = Sm90Shape<D, NC, VX, DA>;
  const int64_t tiles = sm90_tiles(p, S::kBQ);
  if (tiles > INT32_MAX) return cudaErrorInvalidValue;
  // Causal tiles differ in length (1 to nk/128 key tiles): a fixed stride over the SMs leaves
  // some SMs with far more work (measured: 531 against 559 TOPS at 16k). With a tile counter
  // the persistent CTAs balance them; without one every causal tile gets its own CTA and the
  // hardware balances them as CTAs finish.
  const int grid = p.causal && !p.tile_counter ? static_cast<int>(tiles) : sm90_grid(tiles);
  if (grid <= 0) return cudaErrorInvalidDevice;
  if (p.seq_q) {  // packed sequences (attn_sm90 checked: the tile counter, one V term)
    if constexpr (VX == 1) return attn_sm90_run<D, NC, 1, 1, true, DA>(p, stream, grid, static_cast<int>(tiles));
    else return cudaErrorInvalidValue;
  }
  // pairs of CTAs sharing K and V: D=128 with three consumers (long sequences), the only shape
  // where it was measured to pay (bench/NOTES.md)
  if constexpr (D == 128 && NC == 3) {
    if (sm90_cluster_ok(p, tiles, grid) && 2 * sm90_resident_pairs<D, NC, VX, DA>() >= grid)
      return attn_sm90_run<D, NC, 2, VX, false, DA>(p, stream, grid, static_cast<int>(tiles));
  }
  return attn_sm90_run<D, NC, 1, VX, false, DA>(p, stream, grid, static_cast<int>(tiles));
}

template <int D, int VX, int DA = D>
cudaError_t attn_sm90_dv(const AttnParams& p, cudaStream_t stream) {
  if constexpr (D == 64) {
    return attn_sm90_launch<D, 3, VX>(p, stream);
  } else if constexpr (D == 256) {
    return attn_sm90_launch<D, 2, VX, DA>(p, stream);
  } else {
    return sm90_consumers(p, D) == 3 ? attn_sm90_launch<D, 3, VX, DA>(p, stream)
                                     : attn_sm90_launch<D, 2, VX, DA>(p, stream);
  }
}

// head dims 65-96: D=128's buffers, 96 columns computed, one V term (attn_sm90_d96.cu); head
// dims 129-192: D=256's buffers, 192 columns computed (attn_sm90_d192.cu)
cudaError_t attn_sm90_d96(const AttnParams& p, cudaStream_t stream);
cudaError_t attn_sm90_d192(const AttnParams& p, cudaStream_t stream);

template <int D>
cudaError_t attn_sm90_d(const AttnParams& p, cudaStream_t stream) {
  if constexpr (D == 256) {  // V in two terms does not fit D=256's shared memory
    return p.v_terms == 2 ? cudaErrorInvalidValue : attn_sm90_dv<D, 1>(p, stream);
  } else {
    return p.v_terms == 2 ? attn_sm90_dv<D, 2>(p, stream) : attn_sm90_dv<D, 1>(p, stream);
  }
}

}  // namespace sage

// Host side of the Hopper kernel: TMA tensor maps (encoded through the driver entry point
// the runtime hands out, so nothing links libcuda directly) and the head-dim dispatch.
#include <cuda.h>
#include <cudaTypedefs.h>

#include "attn_sm90.cuh"

namespace sage {

// instantiated in attn_sm90_d{64,128,256}.cu; attn_sm90_d96 and attn_sm90_d192 are defined in
// attn_sm90_d96.cu and attn_sm90_d192.cu
extern template cudaError_t attn_sm90_d<64>(const AttnParams&, cudaStream_t);
extern template cudaError_t attn_sm90_d<128>(const AttnParams&, cudaStream_t);
extern template cudaError_t attn_sm90_d<256>(const AttnParams&, cudaStream_t);

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
#if CUDART_VERSION >= 12050
    const cudaError_t err = cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q);
#else
    const cudaError_t err = cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &f, cudaEnableDefault, &q);
#endif
    return (err == cudaSuccess && q == cudaDriverEntryPointSuccess) ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f)
                                                                      : nullptr;
  }();
  return fn;
}

// A row-major byte matrix [rows, cols] read in boxes of [box_rows, box_cols] bytes.
bool encode_2d(CUtensorMap* m, const void* base, uint64_t rows, uint64_t cols, uint32_t box_rows, uint32_t box_cols,
               CUtensorMapSwizzle swizzle) {
  const auto fn = encode_fn();
  if (!fn) return false;
  const cuuint64_t dims[2] = {cols, rows};
  const cuuint64_t strides[1] = {cols};
  const cuuint32_t box[2] = {box_cols, box_rows};
  const cuuint32_t elem[2] = {1, 1};
  return fn(m, CU_TENSOR_MAP_DATA_TYPE_UINT8, 2, const_cast<void*>(base), dims, strides, box, elem,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// O [batch, heads, nq, d_out] of 16-bit values with the call's strides, written in boxes of
// 64 rows x 64 columns (128 bytes, swizzled); packed sequences: o [total_q, heads, d_out] as
// one batch entry of total_q rows (the kernel stores only boxes inside one sequence there).
// False where TMA cannot take the layout (an address or a stride that is not a multiple of
// 16 bytes): the kernel then stores directly.
bool encode_o(CUtensorMap* m, const AttnParams& p) {
  const auto fn = encode_fn();
  const bool packed = p.seq_q != nullptr;
  const uint64_t sn = p.o_stride_n * 2, sh = p.o_stride_h * 2, sb = packed ? sn * p.total_q : p.o_stride_b * 2;
  if (!fn || reinterpret_cast<uintptr_t>(p.o) % 16 != 0 || sn % 16 != 0 || sh % 16 != 0 || sb % 16 != 0 ||
      p.o_stride_n <= 0 || p.o_stride_h <= 0 || (!packed && p.o_stride_b <= 0) || (packed && p.total_q <= 0))
    return false;
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(p.d_out), static_cast<cuuint64_t>(packed ? p.total_q : p.nq),
                              static_cast<cuuint64_t>(p.heads_q), static_cast<cuuint64_t>(packed ? 1 : p.batch)};
  const cuuint64_t strides[3] = {sn, sh, sb};
  const cuuint32_t box[4] = {64, 64, 1, 1};
  const cuuint32_t elem[4] = {1, 1, 1, 1};
  const auto type = p.o_dtype == DType::kBFloat16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
  return fn(m, type, 4, p.o, dims, strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
            CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

cudaError_t sm90_make_maps(const AttnParams& p, int d, int v_box_rows, int q_box_rows, int kv_parts, Sm90Args& a) {
  // Q and K rows in spans of 64 bytes (D=64) or 128 (D=128; D=256 in two boxes per tile)
  const uint32_t span = d == 64 ? 64 : 128;
  const CUtensorMapSwizzle qk_swizzle = span == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B;
  const uint64_t q_rows = static_cast<uint64_t>(p.batch) * p.heads_q * p.nq_pad;
  const uint64_t kv_rows = static_cast<uint64_t>(p.batch) * p.heads_kv * p.nk_pad;
  const uint64_t v_rows = static_cast<uint64_t>(p.batch) * p.heads_kv * (p.v_terms == 2 ? 2 : 1) * d;
  const bool ok = encode_2d(&a.tq, p.q, q_rows, d, q_box_rows, span, qk_swizzle) &&
                  encode_2d(&a.tk, p.k, kv_rows, d, kSm90BlockK / kv_parts, span, qk_swizzle) &&
                  encode_2d(&a.tv, p.v, v_rows, p.nk_pad, v_box_rows / kv_parts, kSm90BlockK, CU_TENSOR_MAP_SWIZZLE_128B);
  if (!ok) return cudaErrorNotSupported;
  a.o_tma = encode_o(&a.to, p) ? 1 : 0;
#ifdef SAGE_SM90_NO_OTMA  // experiments: the plain-store epilogue everywhere
  a.o_tma = 0;
#endif
  return cudaSuccess;
}

static int sm_count() {
  int dev = 0, sms = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
    return 0;
  return sms;
}

int sm90_grid(int64_t tiles) {
  const int sms = sm_count();
  return static_cast<int>(tiles < sms ? tiles : sms);  // one CTA per SM (__launch_bounds__(kThreads, 1))
}

int sm90_consumers(const AttnParams& p, int head_dim) {
  if (head_dim == 64) return 3;
  if (head_dim == 256) return 2;
  // SAGEATTN_SM90_NC3_KEYS moves both switch-overs of D=128 and turns the rounds rule below off,
  // for tests and A/B runs (1: always three; read per call, like the switches below)
  const char* e = std::getenv("SAGEATTN_SM90_NC3_KEYS");
  const int env_keys = e && *e ? std::atoi(e) : 0;
  if (env_keys > 0) return p.nk >= env_keys ? 3 : 2;
  const int nc3_keys = !p.causal      ? SAGE_SM90_NC3_KEYS  // one V term or two
                       : p.v_terms == 2 ? SAGE_SM90_NC3_KEYS_CAUSAL_V2
                                        : SAGE_SM90_NC3_KEYS_CAUSAL;
  if (p.nk >= nc3_keys) return 3;
  // Shorter non-causal calls with V in one term (not packed: their sequences' tiles differ):
  // three where their rounds of 192-row tiles are enough fewer than those of 128-row tiles to
  // pay for 1.5x the rows per round (SAGE_SM90_NC3_ROUNDS in attn_sm90.cuh)
  if (p.causal || p.v_terms == 2 || p.seq_q || p.nk < SAGE_SM90_NC3_ROUNDS_KEYS) return 2;
  const int64_t sms = sm_count();
  if (sms <= 0) return 2;
  const int64_t r2 = (sm90_tiles(p, 128) + sms - 1) / sms, r3 = (sm90_tiles(p, 192) + sms - 1) / sms;
  return SAGE_SM90_NC3_ROUNDS * r3 < 1000 * r2 ? 3 : 2;
}

bool sm90_cluster_ok(const AttnParams& p, int64_t tiles, int grid) {
  // SAGEATTN_SM90_CLUSTER: 0 never pairs, 1 pairs whatever the key count
  const int forced = env_digit("SAGEATTN_SM90_CLUSTER", 1);
  if (forced == 0) return false;
  // below SAGE_SM90_PAIR_KEYS keys the pair's handshake per ring slot costs more than the L2
  // traffic it saves (the board is less held by its power cap on short calls)
  if (forced < 0 && p.nk < SAGE_SM90_PAIR_KEYS) return false;
  // the fixed stride (no tile counter) with an even grid and an even tile count gives CTAs 2i
  // and 2i + 1 the tiles w and w + 1, w even, always both: neighbours in one head, or the last
  // tile of one query head and the first of the next (when a head has an odd number of tiles),
  // which share K and V under GQA within a group and load their own otherwise (the kernel's
  // producer decides per tile)
  return !p.causal && !p.tile_counter && tiles % 2 == 0 && grid % 2 == 0;
}

int attn_sm90_scratch_ints(const AttnParams& p, int head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256) return 0;
  const int forced = env_digit("SAGEATTN_SM90_SCHED", 1);
  const int64_t tiles = sm90_tiles(p, 64 * sm90_consumers(p, head_dim));
  const int grid = sm90_grid(tiles);  // the launch's grid (each CTA gets two tile-index slots below)
  // causal tiles differ in length; equal tiles take a fixed stride, and one tile per CTA
  // needs no balancing. Packed sequences always take the counter: their tiles differ in
  // length, and the consumers learn which tiles are not empty through its slots.
  const bool counter = p.seq_q || (forced >= 0 ? forced == 1 : p.causal && tiles > grid);
  return counter && grid > 0 ? 1 + 2 * grid : 0;  // the counter, then two tile indices per CTA
}

// Head dims 65-96 (zero-padded to 128) and 129-192 (zero-padded to 256) skip the padding's
// columns (attn_sm90_d96, attn_sm90_d192), except with V in two terms. SAGEATTN_SM90_NARROW=0
// runs them on the full width, for A/B runs and the tests that hold both to the same bits (read
// per call).
static bool narrow_ok(const AttnParams& p, int head_dim) {
  if (p.d_out > head_dim * 3 / 4 || p.v_terms == 2) return false;
  return env_digit("SAGEATTN_SM90_NARROW", 0) != 0;
}

cudaError_t attn_sm90(const AttnParams& p, int head_dim, cudaStream_t stream) {
  if (p.accum != PVAccum::kFp32Fp32 || p.v_mean != nullptr || p.v_scale == nullptr || p.nk_pad % kSm90BlockK != 0 ||
      p.nq_pad % 128 != 0 || p.nq <= 0 || p.nq > p.nq_pad || p.v_terms < 0 || p.v_terms > 2 || !p.seq_q != !p.seq_k ||
      (p.seq_q && (!p.tile_counter || p.v_terms == 2)))
    return cudaErrorInvalidValue;
  if (p.batch == 0 || p.heads_q == 0 || p.nq_pad == 0) return cudaSuccess;
  switch (head_dim) {
    case 64: return attn_sm90_d<64>(p, stream);
    case 128: return narrow_ok(p, 128) ? attn_sm90_d96(p, stream) : attn_sm90_d<128>(p, stream);
    case 256: return narrow_ok(p, 256) ? attn_sm90_d192(p, stream) : attn_sm90_d<256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace sage

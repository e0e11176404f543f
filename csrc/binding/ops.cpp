// Torch binding of the kernels: registers custom ops with TORCH_LIBRARY (schema + CUDA
// implementation; the fake implementations for torch.compile are in sageattention/_cuda.py).
// No pybind11: the Python module only exists so that `import` loads this library, and it
// is built against the Python limited API (abi3).
//
// Built once per extension: SAGE_EXT/SAGE_OPS name the extension and its op namespace,
// SAGE_FP16_PV / SAGE_FP8 / SAGE_SM90 select the kernel family (scripts/cuda_archs.py).
#include "common.h"

#include <ATen/ops/mean.h>

namespace {

// Packed sequences (varlen): int32 [2, B] on x's device, row starts then row counts, or null.
// The values are the caller's to check (sageattn_varlen reads them on the host); the kernels
// clamp each count to the padded tensors' row count.
[[maybe_unused]] const int* seqs_of(const std::optional<Tensor>& t, const char* op, const char* arg, int64_t B, const Tensor& x) {
  if (!t) return nullptr;
  TORCH_CHECK(t->scalar_type() == at::kInt && t->is_contiguous() && t->device() == x.device() && t->dim() == 2 &&
                  t->size(0) == 2 && t->size(1) == B,
              kOps, "::", op, ": ", arg, " must be a contiguous int32 [2, ", B, "] tensor on ", x.device(), ", got ",
              t->scalar_type(), " ", t->sizes(), " on ", t->device());
  return t->data_ptr<int>();
}

std::tuple<Tensor, Tensor, Tensor> quant_int8(const Tensor& x, const std::optional<Tensor>& mean,
                                              const std::optional<Tensor>& dot_mean, double prescale,
                                              int64_t block_rows, int64_t groups, int64_t n_pad, int64_t d_pad) {
  const char* op = "quant_int8";
  check_input(x, op, "x");
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3);
  TORCH_CHECK(n_pad >= N && block_rows > 0 && n_pad % block_rows == 0 && d_pad >= D && d_pad % 16 == 0,
              kOps, "::", op, ": bad padding n_pad=", n_pad, " d_pad=", d_pad, " block_rows=", block_rows);
  TORCH_CHECK(groups == 1 || groups == 4 || groups == 8, kOps, "::", op, ": groups must be 1, 4 or 8, got ", groups);
  c10::cuda::CUDAGuard guard(x.device());
  auto f32 = x.options().dtype(at::kFloat);
  Tensor out = at::empty({B, H, n_pad, d_pad}, x.options().dtype(at::kChar));
  Tensor scale = at::empty({B, H, n_pad / block_rows * groups}, f32);
  Tensor rowdot = at::empty({dot_mean ? B : 0, dot_mean ? H : 0, dot_mean ? N : 0}, f32);
  sage::QuantInt8Params p{};
  p.in = input_of(x, op, "x");
  p.n_pad = n_pad, p.d_pad = d_pad;
  p.block_rows = block_rows, p.groups = groups, p.prescale = static_cast<float>(prescale);
  p.heads_kv = H;
  if (mean) {
    check_f32(*mean, op, "mean", {B, H, D});
    p.mean = mean->data_ptr<float>();
  }
  if (dot_mean) {
    const int64_t hkv = dot_mean->dim() == 3 ? dot_mean->size(1) : 0;
    TORCH_CHECK(hkv > 0 && H % hkv == 0, kOps, "::", op, ": dot_mean heads must divide x heads");
    check_f32(*dot_mean, op, "dot_mean", {B, hkv, D});
    p.dot_mean = dot_mean->data_ptr<float>();
    p.heads_kv = hkv;
    p.rowdot = rowdot.data_ptr<float>();
  }
  p.out = out.data_ptr<int8_t>();
  p.scale = scale.data_ptr<float>();
  check_cuda(sage::quant_int8(p, c10::cuda::getCurrentCUDAStream()), op);
  return {out, scale, rowdot};
}

#if defined(SAGE_FP8)
std::tuple<Tensor, Tensor, Tensor> quant_v_fp8(const Tensor& v, double scale_max, bool smooth, int64_t n_pad,
                                               int64_t d_pad) {
  const char* op = "quant_v_fp8";
  check_input(v, op, "v");
  const int64_t B = v.size(0), H = v.size(1), N = v.size(2), D = v.size(3);
  TORCH_CHECK(n_pad >= N && n_pad % 64 == 0 && d_pad >= D && d_pad % 32 == 0, kOps, "::", op,
              ": bad padding n_pad=", n_pad, " d_pad=", d_pad);
  c10::cuda::CUDAGuard guard(v.device());
  auto f32 = v.options().dtype(at::kFloat);
  Tensor out = at::empty({B, H, d_pad, n_pad}, v.options().dtype(at::kFloat8_e4m3fn));
  Tensor scale = at::empty({B, H, d_pad}, f32);
  Tensor mean = at::empty({smooth ? B : 0, smooth ? H : 0, smooth ? d_pad : 0}, f32);
  sage::QuantVFp8Params p{};
  p.in = input_of(v, op, "v");
  p.n_pad = n_pad, p.d_pad = d_pad;
  p.scale_max = static_cast<float>(scale_max);
  p.out = reinterpret_cast<uint8_t*>(out.data_ptr());
  p.scale = scale.data_ptr<float>();
  p.mean = smooth ? mean.data_ptr<float>() : nullptr;
  check_cuda(sage::quant_v_fp8(p, c10::cuda::getCurrentCUDAStream()), op);
  return {out, scale, mean};
}

// quant_int8(Q), quant_int8(K, K mean) and V's fp8 quantization in one op (statistics of a
// key sample, quantization, and the rare V scale fallback: quant_qkv.cu); the K mean (of a
// 128-key sample) is computed here (fp32, [B, Hkv, D]) and returned.

// quant_qkv's buffers: its nine outputs in return order, then a V work area it keeps
enum QkvBuf { kQ8, kQScale, kQRowdot, kK8, kKScale, kKMean, kV8, kVScale, kVMean, kVWork, kQkvBufs };

struct BufShape {
  int rank = 0;
  int64_t dims[4] = {};
  at::ScalarType dtype = at::kFloat;
  at::IntArrayRef sizes() const { return {dims, static_cast<size_t>(rank)}; }
  int64_t bytes() const {
    int64_t n = static_cast<int64_t>(c10::elementSize(dtype));
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
};

BufShape buf_shape(at::ScalarType dtype, std::initializer_list<int64_t> dims) {
  BufShape s;
  s.dtype = dtype;
  for (int64_t d : dims) s.dims[s.rank++] = d;
  return s;
}

// quant_qkv's checks, its parameters but the output pointers, and the shapes of its buffers
// (quant_qkv allocates each; quant_attn carves them out of one allocation)
struct QkvPlan {
  sage::QuantQKVParams p{};
  BufShape buf[kQkvBufs];
  bool rowdot = false, smooth_k = false, smooth_v = false, flags = false;
};

QkvPlan plan_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, double q_prescale,
                 int64_t q_groups, int64_t k_groups, bool smooth_k, bool smooth_v, bool rowdot, double v_scale_max,
                 int64_t nq_pad, int64_t nk_pad, int64_t d_pad, bool v_full_stats, int64_t v_terms,
                 const std::optional<Tensor>& seq_q, const std::optional<Tensor>& seq_k) {
  QkvPlan pl;
  sage::QuantQKVParams& p = pl.p;
  p.q = input_of(q, op, "q");
  p.k = input_of(k, op, "k");
  p.v = input_of(v, op, "v");
  const int64_t B = q.size(0), Hq = q.size(1), Nq = q.size(2), D = q.size(3);
  const int64_t Hkv = k.size(1), Nk = k.size(2);
  TORCH_CHECK(k.device() == q.device() && v.device() == q.device(), kOps, "::", op,
              ": q, k and v must be on one device");
  TORCH_CHECK(k.scalar_type() == q.scalar_type() && v.scalar_type() == q.scalar_type(), kOps, "::", op,
              ": q, k and v must have one dtype, got ", q.scalar_type(), ", ", k.scalar_type(), ", ",
              v.scalar_type());
  TORCH_CHECK(k.size(0) == B && k.size(3) == D, kOps, "::", op, ": k has shape ", k.sizes(), ", q ", q.sizes());
  TORCH_CHECK(v.sizes() == k.sizes(), kOps, "::", op, ": v has shape ", v.sizes(), ", k ", k.sizes());
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0, kOps, "::", op, ": k heads (", Hkv, ") must divide q heads (", Hq, ")");
  TORCH_CHECK((d_pad == 64 || d_pad == 128 || d_pad == 256) && d_pad >= D, kOps, "::", op,
              ": d_pad must be 64, 128 or 256 and at least the head dim, got ", d_pad);
  TORCH_CHECK(nq_pad >= Nq && nq_pad % sage::kAttnWarpQ == 0, kOps, "::", op, ": bad padding nq_pad=", nq_pad);
  TORCH_CHECK(nk_pad >= Nk && nk_pad % sage::kAttnBlockK == 0, kOps, "::", op, ": bad padding nk_pad=", nk_pad);
  TORCH_CHECK((q_groups == 1 || q_groups == 8) && (k_groups == 1 || k_groups == 4), kOps, "::", op,
              ": q_groups must be 1 or 8 and k_groups 1 or 4");
  TORCH_CHECK(!rowdot || smooth_k, kOps, "::", op, ": rowdot (q . K mean) needs smooth_k");
  TORCH_CHECK(v_terms == 1 || v_terms == 2, kOps, "::", op, ": v_terms must be 1 or 2, got ", v_terms);
  TORCH_CHECK(!seq_q == !seq_k, kOps, "::", op, ": seq_q and seq_k come together");
  p.q.seqs = seqs_of(seq_q, op, "seq_q", B, q);
  p.k.seqs = p.v.seqs = seqs_of(seq_k, op, "seq_k", B, q);
  const auto f32 = at::kFloat;
  pl.buf[kQ8] = buf_shape(at::kChar, {B, Hq, nq_pad, d_pad});
  pl.buf[kQScale] = buf_shape(f32, {B, Hq, nq_pad / sage::kAttnWarpQ * q_groups});
  pl.buf[kQRowdot] = buf_shape(f32, {rowdot ? B : 0, rowdot ? Hq : 0, rowdot ? Nq : 0});
  pl.buf[kK8] = buf_shape(at::kChar, {B, Hkv, nk_pad, d_pad});
  pl.buf[kKScale] = buf_shape(f32, {B, Hkv, nk_pad / sage::kAttnBlockK * k_groups});
  pl.buf[kKMean] = buf_shape(f32, {smooth_k ? B : 0, smooth_k ? Hkv : 0, smooth_k ? D : 0});
  pl.buf[kV8] = buf_shape(at::kFloat8_e4m3fn, {B, Hkv, v_terms * d_pad, nk_pad});
  pl.buf[kVScale] = buf_shape(f32, {B, Hkv, d_pad});
  pl.buf[kVMean] = buf_shape(f32, {smooth_v ? B : 0, smooth_v ? Hkv : 0, smooth_v ? d_pad : 0});
  // v_inv, then (a sampled V scale, checked by the quantization) the overflow flags, as many
  // 32-bit words, and a tile count per 32-channel group
  pl.flags = !smooth_v && !v_full_stats;
  pl.buf[kVWork] = buf_shape(f32, {B * Hkv * d_pad + (pl.flags ? B * Hkv * d_pad * 33 / 32 : 0)});
  pl.rowdot = rowdot, pl.smooth_k = smooth_k, pl.smooth_v = smooth_v;
  p.nq_pad = nq_pad, p.nk_pad = nk_pad, p.d_pad = d_pad;
  p.q_prescale = static_cast<float>(q_prescale);
  p.q_groups = q_groups, p.k_groups = k_groups;
  p.v_scale_max = static_cast<float>(v_scale_max);
  p.v_terms = static_cast<int>(v_terms);
  p.v_full = v_full_stats;
  return pl;
}

// Points the plan's outputs at its buffers (those not asked for stay null).
void set_qkv_outputs(QkvPlan& pl, void* const (&ptr)[kQkvBufs]) {
  sage::QuantQKVParams& p = pl.p;
  p.q_out = static_cast<int8_t*>(ptr[kQ8]), p.q_scale = static_cast<float*>(ptr[kQScale]);
  p.q_rowdot = pl.rowdot ? static_cast<float*>(ptr[kQRowdot]) : nullptr;
  p.k_out = static_cast<int8_t*>(ptr[kK8]), p.k_scale = static_cast<float*>(ptr[kKScale]);
  p.k_mean = pl.smooth_k ? static_cast<float*>(ptr[kKMean]) : nullptr;
  p.v_out = static_cast<uint8_t*>(ptr[kV8]);
  p.v_scale = static_cast<float*>(ptr[kVScale]);
  p.v_mean = pl.smooth_v ? static_cast<float*>(ptr[kVMean]) : nullptr;
  p.v_inv = static_cast<float*>(ptr[kVWork]);
  // the flags follow v_inv's B * Hkv * d_pad floats (as many as v_scale has)
  p.v_over = pl.flags ? reinterpret_cast<uint32_t*>(p.v_inv + pl.buf[kVScale].bytes() / sizeof(float)) : nullptr;
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor> quant_qkv(
    const Tensor& q, const Tensor& k, const Tensor& v, double q_prescale, int64_t q_groups, int64_t k_groups,
    bool smooth_k, bool smooth_v, bool rowdot, double v_scale_max, int64_t nq_pad, int64_t nk_pad, int64_t d_pad,
    bool v_full_stats, int64_t v_terms, const std::optional<Tensor>& seq_q, const std::optional<Tensor>& seq_k) {
  const char* op = "quant_qkv";
  QkvPlan pl = plan_qkv(op, q, k, v, q_prescale, q_groups, k_groups, smooth_k, smooth_v, rowdot, v_scale_max, nq_pad,
                        nk_pad, d_pad, v_full_stats, v_terms, seq_q, seq_k);
  c10::cuda::CUDAGuard guard(q.device());
  Tensor t[kQkvBufs];
  void* ptr[kQkvBufs];
  for (int i = 0; i < kQkvBufs; ++i) {
    t[i] = at::empty(pl.buf[i].sizes(), q.options().dtype(pl.buf[i].dtype));
    ptr[i] = t[i].data_ptr();
  }
  set_qkv_outputs(pl, ptr);
  check_cuda(sage::quant_qkv(pl.p, c10::cuda::getCurrentCUDAStream()), op);
  return {t[kQ8], t[kQScale], t[kQRowdot], t[kK8], t[kKScale], t[kKMean], t[kV8], t[kVScale], t[kVMean]};
}
#endif

// fp16/bf16 V as the kernel reads it: unit stride, 16-byte aligned rows, head dim d_pad.
Tensor prepare_v(const Tensor& v, int64_t d_pad) {
  const int64_t D = v.size(3);
  const bool aligned = D == d_pad && v.stride(3) == 1 && v.stride(0) % 8 == 0 && v.stride(1) % 8 == 0 &&
                       v.stride(2) % 8 == 0 && reinterpret_cast<uintptr_t>(v.data_ptr()) % 16 == 0;
  if (aligned) return v;
  Tensor out = at::zeros({v.size(0), v.size(1), v.size(2), d_pad}, v.options());
  out.narrow(3, 0, D).copy_(v);
  return out;
}

// attn's and quant_attn's check of packed sequences (seq_q, seq_k): only the Hopper kernel
// takes them, with V as one e4m3 term (`fp8_one_term`), the fp32+fp32 mode, no V mean, the packed
// output (`nhd`: o [total_q, Hq, D]) and total_q >= 0.
void check_packed(const char* op, const std::optional<Tensor>& seq_q, const std::optional<Tensor>& seq_k,
                  bool fp8_one_term, int64_t accum, bool v_mean, bool nhd, int64_t total_q) {
#if defined(SAGE_SM90)
  TORCH_CHECK(seq_q.has_value() == seq_k.has_value(), kOps, "::", op, ": seq_q and seq_k come together");
  TORCH_CHECK(!seq_q || (fp8_one_term && accum == static_cast<int64_t>(sage::PVAccum::kFp32Fp32) && !v_mean && nhd &&
                         total_q >= 0),
              kOps, "::", op, ": packed sequences (seq_q, seq_k) take v as one e4m3 term, fp32+fp32, no v mean, "
              "nhd and total_q >= 0");
#else
  (void)fp8_one_term, (void)accum, (void)v_mean, (void)nhd, (void)total_q;
  TORCH_CHECK(!seq_q && !seq_k, kOps, "::", op, ": packed sequences (seq_q, seq_k) need the sm90 kernel");
#endif
}

// attn's and quant_attn's tail, on checked parameters: o and the LSE allocated and pointed
// to, the Hopper kernel's work-tile counter where it takes one (`counter`: zeroed ints already
// on the stream, or null to allocate them here), the launch.
std::tuple<Tensor, Tensor> attn_run(const char* op, sage::AttnParams& p, const at::TensorOptions& opts, bool fp8,
                                    int64_t Dp, bool packed, bool nhd, bool return_lse, at::ScalarType out_dtype,
                                    at::ScalarType v_dtype, int* counter) {
  const int64_t B = p.batch, Hq = p.heads_q, nq = p.nq, d_out = p.d_out, total_q = p.total_q;
  Tensor o = packed ? at::empty({total_q, Hq, d_out}, opts.dtype(out_dtype))
             : nhd  ? at::empty({B, nq, Hq, d_out}, opts.dtype(out_dtype))
                    : at::empty({B, Hq, nq, d_out}, opts.dtype(out_dtype));
  Tensor lse = packed ? at::empty({return_lse ? Hq : 0, return_lse ? total_q : 0}, opts.dtype(at::kFloat))
                      : at::empty({return_lse ? B : 0, return_lse ? Hq : 0, return_lse ? nq : 0},
                                  opts.dtype(at::kFloat));
  p.o = o.data_ptr();
  p.o_dtype = out_dtype == at::kBFloat16 ? sage::DType::kBFloat16 : sage::DType::kHalf;
  p.o_stride_b = packed ? 0 : o.stride(0);
  p.o_stride_h = packed ? o.stride(1) : nhd ? o.stride(2) : o.stride(1);
  p.o_stride_n = packed ? o.stride(0) : nhd ? o.stride(1) : o.stride(2);
  p.lse = return_lse ? lse.data_ptr<float>() : nullptr;
  cudaError_t err = cudaErrorInvalidValue;
  auto stream = c10::cuda::getCurrentCUDAStream();
#if defined(SAGE_SM90)
  Tensor tile_counter;  // the dynamic work-tile schedule's counter, where the kernel takes one
  if (fp8) {
    const int ints = sage::attn_sm90_scratch_ints(p, static_cast<int>(Dp));
    if (ints > 0 && counter == nullptr) {
      tile_counter = at::zeros({ints}, opts.dtype(at::kInt));
      counter = tile_counter.data_ptr<int>();
    }
    p.tile_counter = ints > 0 ? counter : nullptr;
    err = sage::attn_sm90(p, static_cast<int>(Dp), stream);
  }
#elif defined(SAGE_FP8)
  (void)counter;
  if (fp8) err = sage::attn_fp8_pv(p, static_cast<int>(Dp), stream);
#else
  (void)counter;
#endif
#if defined(SAGE_FP16_PV)
  if (!fp8) err = sage::attn_fp16_pv(p, static_cast<int>(Dp), stream);
#endif
  TORCH_CHECK(err != cudaErrorInvalidValue, kOps, "::", op, ": no kernel built for v dtype ", v_dtype, ", output ",
              out_dtype, ", accum ", static_cast<int>(p.accum), " in this extension");
  check_cuda(err, op);
  return {o, lse};
}

std::tuple<Tensor, Tensor> attn(const Tensor& q8, const Tensor& k8, const Tensor& v, const Tensor& q_scale,
                                const Tensor& k_scale, const std::optional<Tensor>& v_scale,
                                const std::optional<Tensor>& v_mean, const std::optional<Tensor>& lse_add,
                                int64_t q_groups, int64_t k_groups, int64_t nq, int64_t nk, int64_t d_out,
                                bool causal, int64_t accum, bool nhd, bool return_lse, double lse_add_scale,
                                at::ScalarType out_dtype, const std::optional<Tensor>& seq_q,
                                const std::optional<Tensor>& seq_k, int64_t total_q) {
  const char* op = "attn";
  TORCH_CHECK(q8.is_cuda() && q8.scalar_type() == at::kChar && k8.scalar_type() == at::kChar && q8.dim() == 4 &&
                  k8.dim() == 4 && q8.is_contiguous() && k8.is_contiguous(),
              kOps, "::", op, ": q8 and k8 must be contiguous 4-D int8 CUDA tensors");
  const int64_t B = q8.size(0), Hq = q8.size(1), nq_pad = q8.size(2), Dp = q8.size(3);
  const int64_t Hkv = k8.size(1), nk_pad = k8.size(2);
#if defined(SAGE_SM90)
  TORCH_CHECK(Dp == 64 || Dp == 128 || Dp == 256, kOps, "::", op, ": head dim must be padded to 64, 128 or 256, got ", Dp);
  const int64_t kv_block = sage::kSm90BlockK;
#else
  TORCH_CHECK(Dp == 64 || Dp == 128 || Dp == 256, kOps, "::", op, ": head dim must be padded to 64, 128 or 256, got ", Dp);
  const int64_t kv_block = sage::kAttnBlockK;
#endif
  TORCH_CHECK(k8.size(0) == B && k8.size(3) == Dp && Hkv > 0 && Hq % Hkv == 0, kOps, "::", op, ": q8/k8 shapes ",
              q8.sizes(), " and ", k8.sizes(), " do not match");
  TORCH_CHECK(nq_pad % sage::kAttnBlockQ == 0 && nq <= nq_pad && nq > 0 && nk_pad % kv_block == 0 &&
                  nk <= nk_pad && nk > 0 && d_out > 0 && d_out <= Dp,
              kOps, "::", op, ": bad sizes nq=", nq, " nk=", nk, " d_out=", d_out);
  TORCH_CHECK((q_groups == 1 || q_groups == 8) && (k_groups == 1 || k_groups == 4), kOps, "::", op,
              ": q_groups must be 1 or 8 and k_groups 1 or 4");
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16, kOps, "::", op, ": out_dtype must be float16 or bfloat16");
  check_f32(q_scale, op, "q_scale", {B, Hq, nq_pad / sage::kAttnWarpQ * q_groups});
  check_f32(k_scale, op, "k_scale", {B, Hkv, nk_pad / sage::kAttnBlockK * k_groups});
  c10::cuda::CUDAGuard guard(q8.device());

  sage::AttnParams p{};
  const bool fp8 = v.scalar_type() == at::kFloat8_e4m3fn;
  Tensor vk = v;
  if (fp8) {
#if defined(SAGE_SM90)
    // [B, Hkv, 2 * D, nk_pad]: each value as two e4m3 terms, hi rows then lo rows (quant_qkv's v_terms=2)
    const int64_t terms = v.dim() == 4 && v.size(2) == 2 * Dp ? 2 : 1;
    const char* shapes = "[B, Hkv, D, nk_pad] or [B, Hkv, 2 * D, nk_pad]";
#else
    const int64_t terms = 1;
    const char* shapes = "[B, Hkv, D, nk_pad]";
#endif
    TORCH_CHECK(v.is_contiguous() && v.sizes() == at::IntArrayRef({B, Hkv, terms * Dp, nk_pad}), kOps, "::", op,
                ": fp8 v must be contiguous ", shapes, ", got ", v.sizes());
    p.v_terms = static_cast<int>(terms);
    TORCH_CHECK(terms == 1 || Dp <= 128, kOps, "::", op, ": v as two e4m3 terms needs a head dim of at most 128, got ", Dp);
    TORCH_CHECK(v_scale.has_value(), kOps, "::", op, ": fp8 v needs v_scale");
    check_f32(*v_scale, op, "v_scale", {B, Hkv, Dp});
    p.v_scale = v_scale->data_ptr<float>();
  } else {
    check_input(v, op, "v");
    TORCH_CHECK(v.size(0) == B && v.size(1) == Hkv && v.size(2) == nk, kOps, "::", op, ": v has shape ", v.sizes());
    p.v_dtype = dtype_of(v, op, "v");
    vk = prepare_v(v, Dp);
  }
  if (v_mean) {
    check_f32(*v_mean, op, "v_mean", {B, Hkv, Dp});
    p.v_mean = v_mean->data_ptr<float>();
  }
  // packed sequences: o [total_q, Hq, d_out] and lse [Hq, total_q] (the Hopper kernel only)
  const bool packed = seq_q.has_value();
  check_packed(op, seq_q, seq_k, fp8 && p.v_terms == 1, accum, v_mean.has_value(), nhd, total_q);
#if defined(SAGE_SM90)
  p.seq_q = seqs_of(seq_q, op, "seq_q", B, q8);
  p.seq_k = seqs_of(seq_k, op, "seq_k", B, q8);
  p.total_q = static_cast<int>(total_q);
#endif
  p.q = q8.data_ptr<int8_t>(), p.k = k8.data_ptr<int8_t>(), p.v = vk.data_ptr();
  p.v_stride_b = vk.stride(0), p.v_stride_h = vk.stride(1), p.v_stride_n = vk.stride(2);
  p.q_scale = q_scale.data_ptr<float>(), p.k_scale = k_scale.data_ptr<float>();
  p.q_groups = q_groups, p.k_groups = k_groups;
  p.d_out = d_out;
  if (return_lse && lse_add) {
    check_f32(*lse_add, op, "lse_add", {B, Hq, nq});
    p.lse_add = lse_add->data_ptr<float>();
    p.lse_add_scale = static_cast<float>(lse_add_scale);
  }
  p.batch = B, p.heads_q = Hq, p.heads_kv = Hkv, p.nq = nq, p.nk = nk, p.nq_pad = nq_pad, p.nk_pad = nk_pad;
  p.causal = causal ? 1 : 0;
  TORCH_CHECK(accum >= 0 && accum <= 3, kOps, "::", op, ": accum must be 0..3, got ", accum);
  p.accum = static_cast<sage::PVAccum>(accum);
  return attn_run(op, p, q8.options(), fp8, Dp, packed, nhd, return_lse, out_dtype, v.scalar_type(), nullptr);
}

// quant_attn's and quant_attn_fp16's shared start: q and k checked as [B, H, N, D], the head
// dim and the row counts, and the sizes the separate ops are given from Python
// (_cuda.padded_head_dim, queries padded to kAttnBlockQ, keys to the attention's key block).
struct CallShape {
  int64_t D, nq, nk, Dp, nq_pad, nk_pad;
};

CallShape call_shape(const char* op, const Tensor& q, const Tensor& k, int64_t kv_block) {
  check_input(q, op, "q");
  check_input(k, op, "k");
  CallShape c{};
  c.D = q.size(3), c.nq = q.size(2), c.nk = k.size(2);
  TORCH_CHECK(c.D >= 1 && c.D <= 256, kOps, "::", op, ": head dim must be 1 to 256, got ", c.D);
  TORCH_CHECK(c.nq > 0 && c.nk > 0, kOps, "::", op, ": q and k need a row each, got ", c.nq, " and ", c.nk);
  c.Dp = c.D <= 64 ? 64 : c.D <= 128 ? 128 : 256;
  c.nq_pad = (c.nq + sage::kAttnBlockQ - 1) / sage::kAttnBlockQ * sage::kAttnBlockQ;
  c.nk_pad = (c.nk + kv_block - 1) / kv_block * kv_block;
  return c;
}

// log2(e): Q's prescale is sm_scale times this, the same double product Python forms
constexpr double kLog2e = 1.4426950408889634;

#if defined(SAGE_FP8)
// quant_qkv then attn in one op, for the fp8 families' calls: what a call through both ops
// computes, bit for bit, with one op call instead of two, one allocation for the nine
// intermediate tensors and the V work area, and the work-tile counter
// zeroed by a memset in that allocation (the two op calls took ~47 µs of host time per call on
// an H200 machine, the Python around them ~15: bench/results/…-db4fa04-host-split.md). q, k, v are
// [B, H, N, D] (the caller passes NHD inputs transposed; `nhd` is the output's layout); Q is
// prescaled by sm_scale * log2(e), and with return_lse and smooth_k the LSE gets q . (K mean)
// back, as the two ops are called. v_terms 2: the Hopper kernel only. Packed sequences (the
// Hopper kernel, V in one term, fp32+fp32, nhd): seq_q and seq_k as quant_qkv and attn take
// them, q, k, v the [B, H, max_len, D] views of _cuda.packed_view, o [total_q, Hq, D] and the
// LSE [Hq, total_q].
std::tuple<Tensor, Tensor> quant_attn(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale,
                                      int64_t q_groups, int64_t k_groups, bool smooth_k, bool smooth_v,
                                      double v_scale_max, int64_t v_terms, bool causal, int64_t accum, bool nhd,
                                      bool return_lse, const std::optional<Tensor>& seq_q,
                                      const std::optional<Tensor>& seq_k, int64_t total_q) {
  const char* op = "quant_attn";
  const bool packed = seq_q.has_value();
#if defined(SAGE_SM90)
  constexpr int64_t kv_block = sage::kSm90BlockK;
#else
  constexpr int64_t kv_block = sage::kAttnBlockK;
#endif
  const auto [D, nq, nk, Dp, nq_pad, nk_pad] = call_shape(op, q, k, kv_block);
#if defined(SAGE_SM90)
  TORCH_CHECK(v_terms == 1 || D <= 128, kOps, "::", op, ": v as two e4m3 terms needs a head dim of at most 128, got ", D);
#else
  TORCH_CHECK(v_terms == 1, kOps, "::", op, ": v as two e4m3 terms needs the sm90 kernel");
#endif
  TORCH_CHECK(accum >= 0 && accum <= 3, kOps, "::", op, ": accum must be 0..3, got ", accum);
  check_packed(op, seq_q, seq_k, v_terms == 1, accum, smooth_v, nhd, total_q);
  const bool rowdot = return_lse && smooth_k;
  // (plan_qkv checks that seq_q and seq_k are [2, B] int32 on q's device)
  QkvPlan pl = plan_qkv(op, q, k, v, sm_scale * kLog2e, q_groups, k_groups, smooth_k, smooth_v, rowdot, v_scale_max,
                        nq_pad, nk_pad, Dp, false, v_terms, seq_q, seq_k);
  // (before the work-tile count: the grid is sized by the SM count of the current device)
  c10::cuda::CUDAGuard guard(q.device());
  sage::AttnParams a{};
  a.batch = q.size(0), a.heads_q = q.size(1), a.heads_kv = k.size(1);
  a.nq = nq, a.nk = nk, a.nq_pad = nq_pad, a.nk_pad = nk_pad, a.d_out = D;
  a.causal = causal ? 1 : 0;
  a.accum = static_cast<sage::PVAccum>(accum);
  a.q_groups = q_groups, a.k_groups = k_groups;
  a.v_terms = static_cast<int>(v_terms);
#if defined(SAGE_SM90)
  // (before the work-tile count: packed calls always take the counter)
  a.seq_q = pl.p.q.seqs, a.seq_k = pl.p.k.seqs;
  a.total_q = static_cast<int>(total_q);
#endif
  // one allocation: the buffers at 512-byte offsets (the caching allocator's own alignment,
  // which the separate tensors get), then the counter's ints
  int64_t off[kQkvBufs + 1];
  int64_t bytes = 0;
  for (int i = 0; i < kQkvBufs; ++i) {
    off[i] = bytes;
    bytes += (pl.buf[i].bytes() + 511) / 512 * 512;
  }
  off[kQkvBufs] = bytes;
#if defined(SAGE_SM90)
  const int ints = sage::attn_sm90_scratch_ints(a, static_cast<int>(Dp));
#else
  const int ints = 0;
#endif
  bytes += static_cast<int64_t>(ints) * sizeof(int);
  Tensor work = at::empty({bytes}, q.options().dtype(at::kByte));
  uint8_t* base = work.data_ptr<uint8_t>();
  void* ptr[kQkvBufs];
  for (int i = 0; i < kQkvBufs; ++i) ptr[i] = base + off[i];
  set_qkv_outputs(pl, ptr);
  auto stream = c10::cuda::getCurrentCUDAStream();
  // The counter is zeroed first, before quant_qkv's statistics kernel (a plain launch), so that
  // the attention kernel still follows the quantization kernel directly and may start early
  // (programmatic dependent launch: CONTRIBUTING.md); through the two ops, attn's at::zeros sits
  // between them.
  int* counter = ints > 0 ? reinterpret_cast<int*>(base + off[kQkvBufs]) : nullptr;
  if (counter) check_cuda(cudaMemsetAsync(counter, 0, static_cast<size_t>(ints) * sizeof(int), stream), op);
  check_cuda(sage::quant_qkv(pl.p, stream), op);
  a.q = pl.p.q_out, a.k = pl.p.k_out, a.v = pl.p.v_out;
  const int64_t v_rows = v_terms * Dp;  // V^T [B, Hkv, v_terms * Dp, nk_pad], contiguous
  a.v_stride_b = a.heads_kv * v_rows * nk_pad, a.v_stride_h = v_rows * nk_pad, a.v_stride_n = nk_pad;
  a.q_scale = pl.p.q_scale, a.k_scale = pl.p.k_scale, a.v_scale = pl.p.v_scale;
  a.v_mean = pl.p.v_mean;  // null unless smooth_v
  if (rowdot) a.lse_add = pl.p.q_rowdot, a.lse_add_scale = static_cast<float>(sm_scale);
  // `work` is freed on return: the caching allocator hands its memory out again only to work
  // queued after these kernels on this stream
  return attn_run(op, a, q.options(), true, Dp, packed, nhd, return_lse, q.scalar_type(), at::kFloat8_e4m3fn, counter);
}
#endif

#if defined(SAGE_FP16_PV)
// The fp16-PV family's call in one op: K's mean over all keys (torch's mean, fp32) when
// smoothing K, quant_int8 of Q and of K, V converted to fp16 for the fp16-accumulating mode,
// then attn: what four to five op calls from Python computed, bit for bit, with one (the host
// time of the Hopper route's two op calls: bench/results/…-9e0672a-quant-attn.md). q, k, v
// are [B, H, N, D] (the caller passes NHD inputs transposed; `nhd` is the output's layout).
std::tuple<Tensor, Tensor> quant_attn_fp16(const Tensor& q, const Tensor& k, const Tensor& v, double sm_scale,
                                           int64_t q_groups, int64_t k_groups, bool smooth_k, bool causal,
                                           int64_t accum, bool nhd, bool return_lse) {
  const char* op = "quant_attn_fp16";
  const auto [D, nq, nk, Dp, nq_pad, nk_pad] = call_shape(op, q, k, sage::kAttnBlockK);
  c10::cuda::CUDAGuard guard(q.device());
  std::optional<Tensor> km;
  if (smooth_k) km = at::mean(k, at::IntArrayRef{2}, false, at::kFloat);
  auto [q8, q_scale, q_dot] = quant_int8(q, std::nullopt, return_lse ? km : std::nullopt, sm_scale * kLog2e,
                                         sage::kAttnWarpQ, q_groups, nq_pad, Dp);
  auto [k8, k_scale, unused] = quant_int8(k, km, std::nullopt, 1.0, sage::kAttnBlockK, k_groups, nk_pad, Dp);
  (void)unused;
  // fp16 accumulation needs fp16 operands; fp32 accumulation keeps V's own dtype
  const Tensor v_op = accum == static_cast<int64_t>(sage::PVAccum::kFp16Fp32) ? v.to(at::kHalf) : v;
  const std::optional<Tensor> lse_add = return_lse && smooth_k ? std::optional<Tensor>(q_dot) : std::nullopt;
  return attn(q8, k8, v_op, q_scale, k_scale, std::nullopt, std::nullopt, lse_add, q_groups, k_groups, nq, nk, D,
              causal, accum, nhd, return_lse, sm_scale, q.scalar_type(), std::nullopt, std::nullopt, 0);
}
#endif

}  // namespace

TORCH_LIBRARY(SAGE_OPS, m) {
  m.def("quant_int8(Tensor x, Tensor? mean, Tensor? dot_mean, float prescale, int block_rows, int groups, "
        "int n_pad, int d_pad) -> (Tensor, Tensor, Tensor)");
#if defined(SAGE_FP8)
  m.def("quant_v_fp8(Tensor v, float scale_max, bool smooth, int n_pad, int d_pad) -> (Tensor, Tensor, Tensor)");
  m.def("quant_qkv(Tensor q, Tensor k, Tensor v, float q_prescale, int q_groups, int k_groups, bool smooth_k, "
        "bool smooth_v, bool rowdot, float v_scale_max, int nq_pad, int nk_pad, int d_pad, bool v_full_stats=False, "
        "int v_terms=1, Tensor? seq_q=None, Tensor? seq_k=None) "
        "-> (Tensor, Tensor, "
        "Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor)");
  m.def("quant_attn(Tensor q, Tensor k, Tensor v, float sm_scale, int q_groups, int k_groups, bool smooth_k, "
        "bool smooth_v, float v_scale_max, int v_terms, bool causal, int accum, bool nhd, bool return_lse, "
        "Tensor? seq_q=None, Tensor? seq_k=None, int total_q=0) -> (Tensor, Tensor)");
#endif
  m.def("attn(Tensor q8, Tensor k8, Tensor v, Tensor q_scale, Tensor k_scale, Tensor? v_scale, Tensor? v_mean, "
        "Tensor? lse_add, int q_groups, int k_groups, int nq, int nk, int d_out, bool causal, int accum, bool nhd, "
        "bool return_lse, float lse_add_scale, ScalarType out_dtype, Tensor? seq_q=None, Tensor? seq_k=None, "
        "int total_q=0) -> (Tensor, Tensor)");
#if defined(SAGE_FP16_PV)
  m.def("quant_attn_fp16(Tensor q, Tensor k, Tensor v, float sm_scale, int q_groups, int k_groups, bool smooth_k, "
        "bool causal, int accum, bool nhd, bool return_lse) -> (Tensor, Tensor)");
#endif
}

TORCH_LIBRARY_IMPL(SAGE_OPS, CUDA, m) {
  m.impl("quant_int8", &quant_int8);
#if defined(SAGE_FP8)
  m.impl("quant_v_fp8", &quant_v_fp8);
  m.impl("quant_qkv", &quant_qkv);
  m.impl("quant_attn", &quant_attn);
#endif
  m.impl("attn", &attn);
#if defined(SAGE_FP16_PV)
  m.impl("quant_attn_fp16", &quant_attn_fp16);
#endif
}

SAGE_DEFINE_MODULE()

// Torch binding of the FP4 kernels (sageattention3_blackwell): custom ops registered with
// TORCH_LIBRARY; fake implementations for torch.compile are in sageattention3_blackwell/_kernels.py.
//
// Built once per extension (scripts/cuda_archs.py): SAGE_FP4_QUANT registers quant_fp4 (every
// arch), SAGE_FP4_SM120 / SAGE_FP4_SM100 register attn for their arch-specific kernel.
#include "common.h"

#include "../kernels/fp4.h"

namespace {

[[maybe_unused]] const Tensor& check_u8(const Tensor& t, const char* op, const char* arg, std::initializer_list<int64_t> shape) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == at::kByte && t.is_contiguous(), kOps, "::", op, ": ", arg,
              " must be a contiguous uint8 CUDA tensor");
  TORCH_CHECK(t.sizes() == at::IntArrayRef(shape), kOps, "::", op, ": ", arg, " has shape ", t.sizes(),
              ", expected ", at::IntArrayRef(shape));
  return t;
}

#if defined(SAGE_FP4_QUANT)
std::tuple<Tensor, Tensor, Tensor> quant_fp4(const Tensor& x, const std::optional<Tensor>& mean, int64_t mean_rows,
                                             int64_t n_pad, int64_t d_pad, bool transpose) {
  const char* op = "quant_fp4";
  sage::QuantFp4Params p{};
  p.in = input_of(x, op, "x");
  const int64_t B = x.size(0), H = x.size(1), N = x.size(2), D = x.size(3);
  TORCH_CHECK(N >= 1 && n_pad >= N && n_pad % sage::kFp4BlockK == 0 && n_pad % sage::kFp4BlockQ == 0, kOps, "::", op,
              ": n_pad must be a multiple of 128 and >= N=", N, ", got ", n_pad);
  TORCH_CHECK((d_pad == 64 || d_pad == 128) && D >= 1 && D <= d_pad, kOps, "::", op,
              ": d_pad must be 64 or 128 and >= D=", D, ", got ", d_pad);
  TORCH_CHECK(B * H <= 65535, kOps, "::", op, ": batch * heads must be at most 65535, got ", B * H);
  c10::cuda::CUDAGuard guard(x.device());
  const int64_t rows = transpose ? d_pad : n_pad, cols = transpose ? n_pad : d_pad;
  Tensor codes = at::empty({B, H, rows, cols / 2}, x.options().dtype(at::kByte));
  Tensor scale = at::empty({B, H, rows, cols / sage::kFp4Group}, x.options().dtype(at::kByte));
  Tensor gscale = at::empty({B, H, rows}, x.options().dtype(at::kFloat));
  p.n_pad = static_cast<int>(n_pad), p.d_pad = static_cast<int>(d_pad), p.transpose = transpose ? 1 : 0;
  if (mean) {
    TORCH_CHECK(!transpose, kOps, "::", op, ": mean is not supported with transpose (V is not smoothed)");
    TORCH_CHECK(mean_rows > 0 && n_pad % mean_rows == 0, kOps, "::", op, ": mean_rows must divide n_pad=", n_pad,
                ", got ", mean_rows);
    check_f32(*mean, op, "mean", {B, H, n_pad / mean_rows, D});
    p.mean = mean->data_ptr<float>();
    p.mean_rows = static_cast<int>(mean_rows);
  }
  p.codes = codes.data_ptr<uint8_t>(), p.scale = scale.data_ptr<uint8_t>(), p.gscale = gscale.data_ptr<float>();
  check_cuda(sage::quant_fp4(p, c10::cuda::getCurrentCUDAStream()), op);
  return {codes, scale, gscale};
}
#endif

#if defined(SAGE_FP4_SM120) || defined(SAGE_FP4_SM100)
std::tuple<Tensor, Tensor> attn(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& sq, const Tensor& sk,
                                const Tensor& sv, const Tensor& gq, const Tensor& gk, const Tensor& gv,
                                const std::optional<Tensor>& delta, int64_t nq, int64_t nk, int64_t d_out,
                                bool causal, bool nhd, bool return_lse, double sm_scale, at::ScalarType out_dtype) {
  const char* op = "attn";
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4, kOps, "::", op, ": q and k must be 4-D code tensors");
  const int64_t B = q.size(0), H = q.size(1), nq_pad = q.size(2), D = q.size(3) * 2;
  const int64_t Hkv = k.size(1), nk_pad = k.size(2);
  TORCH_CHECK(D == 64 || D == 128, kOps, "::", op, ": head dim must be padded to 64 or 128, got ", D);
  TORCH_CHECK(Hkv > 0 && H % Hkv == 0, kOps, "::", op, ": query heads ", H, " are not a multiple of K/V heads ", Hkv);
  TORCH_CHECK(nq >= 1 && nq <= nq_pad && nq_pad % sage::kFp4BlockQ == 0 && nk >= 1 && nk <= nk_pad &&
                  nk_pad % sage::kFp4BlockK == 0 && d_out >= 1 && d_out <= D,
              kOps, "::", op, ": bad sizes nq=", nq, " nk=", nk, " d_out=", d_out, " for padded ", nq_pad, "/",
              nk_pad, "/", D);
  TORCH_CHECK(out_dtype == at::kHalf || out_dtype == at::kBFloat16, kOps, "::", op,
              ": out_dtype must be float16 or bfloat16, got ", out_dtype);
  constexpr int64_t G = sage::kFp4Group;
  check_u8(q, op, "q", {B, H, nq_pad, D / 2});
  check_u8(k, op, "k", {B, Hkv, nk_pad, D / 2});
  check_u8(v, op, "v", {B, Hkv, D, nk_pad / 2});
  check_u8(sq, op, "sq", {B, H, nq_pad, D / G});
  check_u8(sk, op, "sk", {B, Hkv, nk_pad, D / G});
  check_u8(sv, op, "sv", {B, Hkv, D, nk_pad / G});
  check_f32(gq, op, "gq", {B, H, nq_pad});
  check_f32(gk, op, "gk", {B, Hkv, nk_pad});
  check_f32(gv, op, "gv", {B, Hkv, D});
  c10::cuda::CUDAGuard guard(q.device());

  sage::AttnFp4Params p{};
  if (delta) {
    check_f32(*delta, op, "delta", {B, H, nq_pad / sage::kFp4BlockQ, nk_pad});
    p.delta = delta->data_ptr<float>();
  }
  Tensor o = nhd ? at::empty({B, nq, H, d_out}, q.options().dtype(out_dtype))
                 : at::empty({B, H, nq, d_out}, q.options().dtype(out_dtype));
  Tensor lse = at::empty({return_lse ? B : 0, return_lse ? H : 0, return_lse ? nq : 0}, q.options().dtype(at::kFloat));
  p.q = q.data_ptr<uint8_t>(), p.k = k.data_ptr<uint8_t>(), p.v = v.data_ptr<uint8_t>();
  p.sq = sq.data_ptr<uint8_t>(), p.sk = sk.data_ptr<uint8_t>(), p.sv = sv.data_ptr<uint8_t>();
  p.gq = gq.data_ptr<float>(), p.gk = gk.data_ptr<float>(), p.gv = gv.data_ptr<float>();
  p.o = o.data_ptr();
  p.o_dtype = out_dtype == at::kBFloat16 ? sage::DType::kBFloat16 : sage::DType::kHalf;
  p.o_stride_b = o.stride(0);
  p.o_stride_h = nhd ? o.stride(2) : o.stride(1);
  p.o_stride_n = nhd ? o.stride(1) : o.stride(2);
  p.d_out = static_cast<int>(d_out);
  p.lse = return_lse ? lse.data_ptr<float>() : nullptr;
  p.batch = B, p.heads = H, p.heads_kv = Hkv;
  p.nq = nq, p.nk = nk, p.nq_pad = nq_pad, p.nk_pad = nk_pad, p.d = D;
  p.sm_scale_log2 = static_cast<float>(sm_scale * 1.4426950408889634);
  p.causal = causal ? 1 : 0;
  auto stream = c10::cuda::getCurrentCUDAStream();
#if defined(SAGE_FP4_SM120)
  check_cuda(sage::attn_fp4_sm120(p, stream), op);
#else
  check_cuda(sage::attn_fp4_sm100(p, stream), op);
#endif
  return {o, lse};
}
#endif

}  // namespace

TORCH_LIBRARY(SAGE_OPS, m) {
#if defined(SAGE_FP4_QUANT)
  m.def("quant_fp4(Tensor x, Tensor? mean, int mean_rows, int n_pad, int d_pad, bool transpose) "
        "-> (Tensor, Tensor, Tensor)");
#else
  m.def("attn(Tensor q, Tensor k, Tensor v, Tensor sq, Tensor sk, Tensor sv, Tensor gq, Tensor gk, Tensor gv, "
        "Tensor? delta, int nq, int nk, int d_out, bool causal, bool nhd, bool return_lse, float sm_scale, "
        "ScalarType out_dtype) -> (Tensor, Tensor)");
#endif
}

TORCH_LIBRARY_IMPL(SAGE_OPS, CUDA, m) {
#if defined(SAGE_FP4_QUANT)
  m.impl("quant_fp4", &quant_fp4);
#else
  m.impl("attn", &attn);
#endif
}

SAGE_DEFINE_MODULE()

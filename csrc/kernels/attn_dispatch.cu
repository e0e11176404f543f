// Head-dim dispatch over the per-head-dim instantiation files. SAGE_FP16_PV and SAGE_FP8
// say which kernel family the extension being built holds.
#include "launch.h"

namespace sage {

#if defined(SAGE_FP16_PV)
template <int D>
cudaError_t attn_fp16_pv_d(const AttnParams&, cudaStream_t);
#endif
#if defined(SAGE_FP8)
template <int D>
cudaError_t attn_fp8_pv_d(const AttnParams&, cudaStream_t);
#endif

#if defined(SAGE_FP16_PV)
cudaError_t attn_fp16_pv(const AttnParams& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return attn_fp16_pv_d<64>(p, stream);
    case 128: return attn_fp16_pv_d<128>(p, stream);
    case 256: return attn_fp16_pv_d<256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}
#endif

#if defined(SAGE_FP8)
cudaError_t attn_fp8_pv(const AttnParams& p, int head_dim, cudaStream_t stream) {
  switch (head_dim) {
    case 64: return attn_fp8_pv_d<64>(p, stream);
    case 128: return attn_fp8_pv_d<128>(p, stream);
    case 256: return attn_fp8_pv_d<256>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}
#endif

}  // namespace sage

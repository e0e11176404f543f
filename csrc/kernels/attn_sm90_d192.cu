// Hopper kernel instantiation for head dims 129-192: the D=256 kernel computing 192 of its
// columns (Sm90Shape's DA), in a file of its own so that it builds beside the others.
#include "attn_sm90.cuh"

namespace sage {
cudaError_t attn_sm90_d192(const AttnParams& p, cudaStream_t stream) { return attn_sm90_dv<256, 1, 192>(p, stream); }
}  // namespace sage

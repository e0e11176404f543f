// Hopper kernel instantiation for head dims 65-96: the D=128 kernel computing 96 of its columns
// (Sm90Shape's DA), in a file of its own so that it builds beside the others.
#include "attn_sm90.cuh"

namespace sage {
cudaError_t attn_sm90_d96(const AttnParams& p, cudaStream_t stream) { return attn_sm90_dv<128, 1, 96>(p, stream); }
}  // namespace sage

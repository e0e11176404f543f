// Hopper kernel instantiation for head dim 256 (one file per head dim: parallel builds).
#include "attn_sm90.cuh"

namespace sage {
template cudaError_t attn_sm90_d<256>(const AttnParams&, cudaStream_t);
}

// fp8-PV attention kernels for head dim 128 (one file per head dim: parallel builds).
#include "attn.cuh"

namespace sage {
template cudaError_t attn_fp8_pv_d<128>(const AttnParams&, cudaStream_t);
}

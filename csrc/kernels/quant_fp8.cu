// FP8 e4m3 per-channel quantization of V, written transposed ([channel][token]) with the
// tokens of every 16-token group permuted so that the FP8 PV MMA can take P straight from
// the QK^T accumulator registers. One launch: channel statistics, then the quantized tiles.
#include "common.cuh"

namespace sage {
namespace {

constexpr int kThreads = 256;
constexpr int kChannels = 32;  // channels per CTA
constexpr int kTokens = 64;    // tokens per tile (= attention KV block)

// Position inside a 16-token group that holds token t (inverse of the MMA's k order
// 0,1,8,9,2,3,10,11,4,5,12,13,6,7,14,15).
__device__ __forceinline__ int permuted_pos(int t) {
  const int low = t & 7, hi = (t >> 3) & 1;
  return (t & ~15) + 4 * (low >> 1) + 2 * hi + (low & 1);
}

template <typename T>
__global__ void __launch_bounds__(kThreads) quant_v_fp8_kernel(const QuantVFp8Params p) {
  __shared__ float red[3][kThreads / 32][kChannels];
  __shared__ float mean_s[kChannels], inv_s[kChannels];
  __shared__ __align__(16) uint8_t tile[kChannels * kTokens];
  const int c0 = blockIdx.x * kChannels, h = blockIdx.y, b = blockIdx.z;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int cg = tid & 3, r = tid >> 2;  // 8 channels (cg), one token row (r) per thread
  const T* v = static_cast<const T*>(p.in.data) + b * p.in.stride_b + h * p.in.stride_h;
  const bool vec = vec_ok<T>(p.in.data, p.in.stride_b, p.in.stride_h, p.in.stride_n, p.in.d);
  const int col0 = c0 + cg * 8;

  // pass 1: per-channel sum, max, min over the real tokens
  float s[8], mx[8], mn[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) s[i] = 0.f, mx[i] = -INFINITY, mn[i] = INFINITY;
  for (int n = r; n < p.in.n; n += kTokens) {
    float x[8];
    load8(v + n * p.in.stride_n, col0, p.in.d, vec, x);
#pragma unroll
    for (int i = 0; i < 8; ++i) s[i] += x[i], mx[i] = fmaxf(mx[i], x[i]), mn[i] = fminf(mn[i], x[i]);
  }
  chains_to_shared(s, OpAdd(), red[0], warp, lane);
  chains_to_shared(mx, OpMax(), red[1], warp, lane);
  chains_to_shared(mn, OpMin(), red[2], warp, lane);
  __syncthreads();
  const int64_t bh = static_cast<int64_t>(b) * p.in.heads + h;
  if (tid < kChannels) {
    constexpr int kW = kThreads / 32;
    const float ts = warps_in_order(red[0], kW, tid, 0.f, OpAdd());
    const float tmx = warps_in_order(red[1], kW, tid, -INFINITY, OpMax());
    const float tmn = warps_in_order(red[2], kW, tid, INFINITY, OpMin());
    const bool real = c0 + tid < p.in.d && p.in.n > 0;
    float mean = 0.f, amax = 0.f;
    if (real) {
      if (p.mean) {
        mean = __fdiv_rn(ts, static_cast<float>(p.in.n));
        amax = fmaxf(__fsub_rn(tmx, mean), __fsub_rn(mean, tmn));
      } else {
        amax = fmaxf(tmx, -tmn);
      }
    }
    amax = fmaxf(amax, kAmaxEps);
    mean_s[tid] = mean;
    inv_s[tid] = __fdiv_rn(p.scale_max, amax);
    p.scale[bh * p.d_pad + c0 + tid] = __fdiv_rn(amax, p.scale_max);
    if (p.mean) p.mean[bh * p.d_pad + c0 + tid] = mean;
  }
  __syncthreads();

  // pass 2: quantize tile by tile, transpose through shared memory
  uint8_t* out = p.out + (bh * p.d_pad + c0) * p.n_pad;
  const int pos = permuted_pos(r);
  for (int n0 = 0; n0 < p.n_pad; n0 += kTokens) {
    const int n = n0 + r;
    float x[8];
    if (n < p.in.n) {
      load8(v + n * p.in.stride_n, col0, p.in.d, vec, x);
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const int c = cg * 8 + i;
        const float y = p.mean ? __fsub_rn(x[i], mean_s[c]) : x[i];
        x[i] = (c0 + c < p.in.d) ? __fmul_rn(y, inv_s[c]) : 0.f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) x[i] = 0.f;
    }
#pragma unroll
    for (int i = 0; i < 8; i += 2) {
      const uint16_t two = to_e4m3x2(x[i], x[i + 1]);
      tile[(cg * 8 + i) * kTokens + pos] = static_cast<uint8_t>(two & 0xff);
      tile[(cg * 8 + i + 1) * kTokens + pos] = static_cast<uint8_t>(two >> 8);
    }
    __syncthreads();
    if (tid < kChannels * kTokens / 16) {
      const int c = tid / (kTokens / 16), part = tid % (kTokens / 16);
      *reinterpret_cast<uint4*>(out + static_cast<int64_t>(c) * p.n_pad + n0 + part * 16) =
          *reinterpret_cast<const uint4*>(tile + c * kTokens + part * 16);
    }
    __syncthreads();
  }
}

}  // namespace

cudaError_t quant_v_fp8(const QuantVFp8Params& p, cudaStream_t stream) {
  if (p.n_pad % kTokens != 0 || p.d_pad % kChannels != 0 || p.n_pad < p.in.n || p.d_pad < p.in.d)
    return cudaErrorInvalidValue;
  if (p.in.batch == 0 || p.in.heads == 0) return cudaSuccess;
  const dim3 grid(p.d_pad / kChannels, p.in.heads, p.in.batch);
  if (p.in.dtype == DType::kHalf)
    quant_v_fp8_kernel<__half><<<grid, kThreads, 0, stream>>>(p);
  else
    quant_v_fp8_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sage

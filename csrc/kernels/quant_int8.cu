// INT8 quantization of Q and K with per-warp or per-thread scale groups, the K mean
// subtraction and the Q pre-scale fused in. One launch per tensor.
#include "common.cuh"

namespace sage {
namespace {

constexpr int kThreads = 128;
constexpr int kMaxBlockRows = 64;

__device__ __forceinline__ int group_of(int r, int groups) {
  return groups == 1 ? 0 : (groups == 8 ? (r & 7) : ((r & 7) >> 1));
}

template <typename T>
__global__ void __launch_bounds__(kThreads) quant_int8_kernel(const QuantInt8Params p) {
  __shared__ unsigned amax_bits[8];
  __shared__ float inv_s[8];
  __shared__ float rdot[kMaxBlockRows];
  const int blk = blockIdx.x, h = blockIdx.y, b = blockIdx.z, tid = threadIdx.x;
  const int R = p.block_rows, G = p.groups, cpr = p.d_pad / 8, nchunks = R * cpr;
  const T* x = static_cast<const T*>(p.in.data) + b * p.in.stride_b + h * p.in.stride_h;
  const bool vec = vec_ok<T>(p.in.data, p.in.stride_b, p.in.stride_h, p.in.stride_n, p.in.d);
  const float* mean = p.mean ? p.mean + (static_cast<int64_t>(b) * p.in.heads + h) * p.in.d : nullptr;
  const float* dm = p.dot_mean
                        ? p.dot_mean + (static_cast<int64_t>(b) * p.heads_kv + h / (p.in.heads / p.heads_kv)) * p.in.d
                        : nullptr;
  const bool scaled = p.prescale != 1.f;
  if (tid < 8) amax_bits[tid] = 0u;
  for (int r = tid; r < R; r += kThreads) rdot[r] = 0.f;
  __syncthreads();

  // pass 1: group maxima (and q . mean for the LSE correction)
  for (int c = tid; c < nchunks; c += kThreads) {
    const int r = c / cpr, col0 = (c % cpr) * 8, row = blk * R + r;
    if (row >= p.in.n || col0 >= p.in.d) continue;
    float v[8];
    load8(x + row * p.in.stride_n, col0, p.in.d, vec, v);
    float a = 0.f, dot = 0.f;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      if (dm && col0 + i < p.in.d) dot = fmaf(v[i], dm[col0 + i], dot);
      float y = scaled ? __fmul_rn(v[i], p.prescale) : v[i];
      if (mean && col0 + i < p.in.d) y = __fsub_rn(y, mean[col0 + i]);
      a = fmaxf(a, fabsf(y));
    }
    atomicMax(&amax_bits[group_of(r, G)], __float_as_uint(a));
    if (dm) atomicAdd(&rdot[r], dot);
  }
  __syncthreads();
  const int64_t bh = static_cast<int64_t>(b) * p.in.heads + h;
  if (tid < G) {
    const float amax = fmaxf(__uint_as_float(amax_bits[tid]), kAmaxEps);
    inv_s[tid] = __fdiv_rn(127.f, amax);
    p.scale[(bh * (p.n_pad / R) + blk) * G + tid] = __fdiv_rn(amax, 127.f);
  }
  if (dm) {
    for (int r = tid; r < R; r += kThreads) {
      const int row = blk * R + r;
      if (row < p.in.n) p.rowdot[bh * p.in.n + row] = rdot[r];
    }
  }
  __syncthreads();

  // pass 2: quantize (padding rows and columns become zeros)
  int8_t* out = p.out + (bh * p.n_pad + static_cast<int64_t>(blk) * R) * p.d_pad;
  for (int c = tid; c < nchunks; c += kThreads) {
    const int r = c / cpr, col0 = (c % cpr) * 8, row = blk * R + r;
    uint32_t w[2] = {0u, 0u};
    if (row < p.in.n && col0 < p.in.d) {
      float v[8];
      load8(x + row * p.in.stride_n, col0, p.in.d, vec, v);
      const float inv = inv_s[group_of(r, G)];
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        float y = scaled ? __fmul_rn(v[i], p.prescale) : v[i];
        if (mean && col0 + i < p.in.d) y = __fsub_rn(y, mean[col0 + i]);
        const uint32_t q = static_cast<uint8_t>(int8_round(__fmul_rn(y, inv)));
        w[i / 4] |= q << (8 * (i % 4));
      }
    }
    *reinterpret_cast<uint2*>(out + static_cast<int64_t>(r) * p.d_pad + col0) = make_uint2(w[0], w[1]);
  }
}

}  // namespace

cudaError_t quant_int8(const QuantInt8Params& p, cudaStream_t stream) {
  if (p.block_rows < 1 || p.block_rows > kMaxBlockRows || p.n_pad % p.block_rows != 0 || p.d_pad % 16 != 0 ||
      !(p.groups == 1 || p.groups == 4 || p.groups == 8) || p.heads_kv < 1 || p.in.heads % p.heads_kv != 0)
    return cudaErrorInvalidValue;
  if (p.in.batch == 0 || p.in.heads == 0 || p.n_pad == 0) return cudaSuccess;
  const dim3 grid(p.n_pad / p.block_rows, p.in.heads, p.in.batch);
  if (p.in.dtype == DType::kHalf)
    quant_int8_kernel<__half><<<grid, kThreads, 0, stream>>>(p);
  else
    quant_int8_kernel<__nv_bfloat16><<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace sage

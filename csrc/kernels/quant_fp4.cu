// FP4 quantization of Q, K (along the head dim) and V (transposed, along tokens) into the
// format of csrc/kernels/fp4.h. Plain arithmetic (fp4_common.cuh), no arch-specific
// instruction: it is built for every arch and its results are bit-identical everywhere, which
// lets the tests check it exactly against sageattention3_blackwell/emulation.py on any GPU.
#include "common.cuh"
#include "fp4.h"
#include "fp4_common.cuh"

namespace sage {
namespace {

constexpr int kThreads = 256;

// Quantizes one group of 16 values already divided into codes: writes 8 code bytes.
__device__ __forceinline__ void store_codes(uint8_t* dst, const float (&x)[16], float denom) {
  uint32_t w[2] = {0u, 0u};
  if (denom > 0.f) {
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i / 8] |= fp4::e2m1_code(__fdiv_rn(x[i], denom)) << (4 * (i % 8));
  }
  *reinterpret_cast<uint2*>(dst) = make_uint2(w[0], w[1]);
}

__device__ __forceinline__ float group_amax(const float (&x)[16]) {
  float a = 0.f;
#pragma unroll
  for (int i = 0; i < 16; ++i) a = fmaxf(a, fabsf(x[i]));
  return a;
}

// Q/K: one thread per group of 16 along D; the d_pad/16 threads of a row are adjacent lanes.
template <typename T, int kGroups>
__global__ void __launch_bounds__(kThreads) quant_rows_kernel(QuantFp4Params p) {
  constexpr int kRowsPerBlock = kThreads / kGroups;
  const int bh = blockIdx.y;
  const int b = bh / p.in.heads, h = bh % p.in.heads;
  const int row = blockIdx.x * kRowsPerBlock + threadIdx.x / kGroups;
  const int grp = threadIdx.x % kGroups;
  const int col0 = grp * kFp4Group;
  const int64_t out_row = static_cast<int64_t>(bh) * p.n_pad + row;

  float x[16];
  if (row < p.in.n) {
    const T* src = static_cast<const T*>(p.in.data) + b * p.in.stride_b + h * p.in.stride_h + row * p.in.stride_n;
    const bool vec = vec_ok<T>(p.in.data, p.in.stride_b, p.in.stride_h, p.in.stride_n, p.in.d);
    float lo[8], hi[8];
    load8(src, col0, p.in.d, vec, lo);
    load8(src, col0 + 8, p.in.d, vec, hi);
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = lo[i], x[i + 8] = hi[i];
    if (p.mean) {
      const float* mean = p.mean + (static_cast<int64_t>(bh) * (p.n_pad / p.mean_rows) + row / p.mean_rows) * p.in.d;
#pragma unroll
      for (int i = 0; i < 16; ++i)
        if (col0 + i < p.in.d) x[i] -= mean[col0 + i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < 16; ++i) x[i] = 0.f;
  }
  const float amax_g = group_amax(x);
  float amax = amax_g;
#pragma unroll
  for (int off = 1; off < kGroups; off <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const float g = amax > 0.f ? amax * kFp4InvPMax : 1.f;
  const float s = fp4::e4m3_round_up(__fdiv_rn(amax_g, g) * kFp4InvE2M1Max);
  store_codes(p.codes + out_row * (p.d_pad / 2) + col0 / 2, x, s * g);
  p.scale[out_row * kGroups + grp] = static_cast<uint8_t>(fp4::e4m3_byte(s));
  if (grp == 0) p.gscale[out_row] = g;
}

// V: one CTA per (batch*head, 32 channels). Pass 1: each channel's amax over all tokens;
// pass 2: one thread per (channel, 16 tokens), codes along tokens.
template <typename T>
__global__ void __launch_bounds__(kThreads) quant_v_kernel(QuantFp4Params p) {
  constexpr int kCh = 32, kLanes = kThreads / kCh;
  __shared__ float red[kLanes][kCh];
  const int bh = blockIdx.y;
  const int b = bh / p.in.heads, h = bh % p.in.heads;
  const int c = blockIdx.x * kCh + threadIdx.x % kCh;
  const int lane = threadIdx.x / kCh;
  const T* src = static_cast<const T*>(p.in.data) + b * p.in.stride_b + h * p.in.stride_h + c;
  const bool real = c < p.in.d;

  float amax = 0.f;
  if (real)
    for (int n = lane; n < p.in.n; n += kLanes) amax = fmaxf(amax, fabsf(to_float(src[n * p.in.stride_n])));
  red[lane][threadIdx.x % kCh] = amax;
  __syncthreads();
#pragma unroll
  for (int i = 0; i < kLanes; ++i) amax = fmaxf(amax, red[i][threadIdx.x % kCh]);
  const float g = amax > 0.f ? amax * kFp4InvPMax : 1.f;
  if (c >= p.d_pad) return;
  const int64_t out_row = static_cast<int64_t>(bh) * p.d_pad + c;
  if (lane == 0) p.gscale[out_row] = g;
  const int groups = p.n_pad / kFp4Group;
  for (int grp = lane; grp < groups; grp += kLanes) {
    float x[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const int n = grp * kFp4Group + i;
      x[i] = (real && n < p.in.n) ? to_float(src[n * p.in.stride_n]) : 0.f;
    }
    const float s = fp4::e4m3_round_up(__fdiv_rn(group_amax(x), g) * kFp4InvE2M1Max);
    store_codes(p.codes + out_row * (p.n_pad / 2) + grp * (kFp4Group / 2), x, s * g);
    p.scale[out_row * groups + grp] = static_cast<uint8_t>(fp4::e4m3_byte(s));
  }
}

template <typename T>
cudaError_t launch(const QuantFp4Params& p, cudaStream_t stream) {
  const int bh = p.in.batch * p.in.heads;
  if (p.transpose) {
    quant_v_kernel<T><<<dim3((p.d_pad + 31) / 32, bh), kThreads, 0, stream>>>(p);
  } else if (p.d_pad == 64) {
    quant_rows_kernel<T, 4><<<dim3(p.n_pad / (kThreads / 4), bh), kThreads, 0, stream>>>(p);
  } else {
    quant_rows_kernel<T, 8><<<dim3(p.n_pad / (kThreads / 8), bh), kThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace

cudaError_t quant_fp4(const QuantFp4Params& p, cudaStream_t stream) {
  const bool ok = (p.d_pad == 64 || p.d_pad == 128) && p.in.d >= 1 && p.in.d <= p.d_pad && p.in.n >= 1 &&
                  p.n_pad >= p.in.n && p.n_pad % kFp4BlockK == 0 && p.n_pad % kFp4BlockQ == 0 &&
                  (!p.mean || (!p.transpose && p.mean_rows > 0 && p.n_pad % p.mean_rows == 0)) &&
                  p.in.batch >= 1 && p.in.heads >= 1 && p.in.batch * p.in.heads <= 65535 && p.codes && p.scale && p.gscale;
  if (!ok) return cudaErrorInvalidValue;
  return p.in.dtype == DType::kBFloat16 ? launch<__nv_bfloat16>(p, stream) : launch<__half>(p, stream);
}

}  // namespace sage

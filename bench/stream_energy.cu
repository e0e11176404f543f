// Joules of a memory-bound pass against the number of SMs it runs on (bench/stream_energy.py).
//
// The question: quant_qkv streams Q, K and V once (bf16 in, one byte per element out) and on an
// H100 draws about the board's 700 W cap while it does (bench/NOTES.md, "where the joules go"),
// far more than DRAM traffic alone costs. If most of that is SMs clocked and waiting, the same
// bytes moved by fewer SMs in the same time would cost fewer joules, and under the power cap
// those joules are the attention's clock.
//
// One kernel: each CTA (1024 threads, one per SM: it asks for most of the shared memory) walks
// 16-byte chunks of three bf16 tensors at a grid stride, U chunks per thread loaded before the
// first store, converts each 8 values to int8 with one scale (or, as "copy", keeps each value's
// high byte: the fewest instructions per byte moved) and stores 8 bytes. A C entry point for
// ctypes (no torch headers):
//
//   nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode arch=compute_90a,code=sm_90a \
//        bench/stream_energy.cu -o /tmp/stream_energy.so
#include <cuda_runtime.h>

#include <cstdint>

namespace {

constexpr int kThreads = 1024;

// 8 bf16 values times s, rounded to int8 with saturation (one cvt each), packed by byte permutes
__device__ __forceinline__ uint32_t s8(float x) {
  uint32_t r;
  asm("cvt.rni.sat.s8.f32 %0, %1;" : "=r"(r) : "f"(x));
  return r;
}

__device__ __forceinline__ uint32_t pack4(uint32_t w0, uint32_t w1, float s) {
  const uint32_t a = s8(__uint_as_float(w0 << 16) * s), b = s8(__uint_as_float(w0 & 0xffff0000u) * s);
  const uint32_t c = s8(__uint_as_float(w1 << 16) * s), d = s8(__uint_as_float(w1 & 0xffff0000u) * s);
  return __byte_perm(__byte_perm(a, b, 0x0040), __byte_perm(c, d, 0x0040), 0x5410);
}

// kCast: int8 as above; else the high byte of each bf16 (the fewest instructions per byte moved)
template <bool kCast>
__device__ __forceinline__ uint2 convert(uint4 c, float s) {
  if constexpr (kCast) return make_uint2(pack4(c.x, c.y, s), pack4(c.z, c.w, s));
  return make_uint2(__byte_perm(c.x, c.y, 0x7531), __byte_perm(c.z, c.w, 0x7531));
}

struct Three {
  const uint4* in[3];
  uint2* out[3];
};

// Q, then K, then V, each at a grid stride in rounds of U * kThreads chunks of 16 bytes
template <int U, bool kCast>
__global__ void __launch_bounds__(kThreads, 1) cast_sms(Three t, int64_t chunks, float s) {
  const int64_t per = static_cast<int64_t>(U) * kThreads;
#pragma unroll
  for (int w = 0; w < 3; ++w) {
    const uint4* src = t.in[w];
    uint2* dst = t.out[w];
    for (int64_t r = blockIdx.x; r * per < chunks; r += gridDim.x) {
      uint4 c[U];
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = r * per + u * kThreads + threadIdx.x;
        if (i < chunks) c[u] = src[i];
      }
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int64_t i = r * per + u * kThreads + threadIdx.x;
        if (i < chunks) dst[i] = convert<kCast>(c[u], s);
      }
    }
  }
}

template <int U, bool kCast>
cudaError_t launch(const Three& t, int64_t chunks, int ctas, cudaStream_t stream) {
  const int smem = 160 * 1024;  // dynamic shared memory, unused: no second CTA fits beside it
  cudaError_t e = cudaFuncSetAttribute(cast_sms<U, kCast>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  cast_sms<U, kCast><<<ctas, kThreads, smem, stream>>>(t, chunks, 0.5f);
  return cudaGetLastError();
}

}  // namespace

// q, k, v: bf16, `elements` each (a multiple of 8); outputs: one byte per element. `ctas` CTAs,
// one per SM; unroll 4 or 8; cast 1: int8 (x 0.5, rounded, saturated), 0: each value's high byte.
// Returns a cudaError_t.
extern "C" int stream_cast(const void* q, const void* k, const void* v, void* oq, void* ok, void* ov,
                           long long elements, int ctas, int unroll, int cast, long long stream) {
  const Three t{{static_cast<const uint4*>(q), static_cast<const uint4*>(k), static_cast<const uint4*>(v)},
                {static_cast<uint2*>(oq), static_cast<uint2*>(ok), static_cast<uint2*>(ov)}};
  const int64_t chunks = elements / 8;
  auto s = reinterpret_cast<cudaStream_t>(stream);
  const cudaError_t e = unroll == 4 ? (cast ? launch<4, true>(t, chunks, ctas, s) : launch<4, false>(t, chunks, ctas, s))
                                    : (cast ? launch<8, true>(t, chunks, ctas, s) : launch<8, false>(t, chunks, ctas, s));
  return static_cast<int>(e);
}

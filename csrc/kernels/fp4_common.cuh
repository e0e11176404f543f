// Device helpers of the FP4 format (csrc/kernels/fp4.h): E2M1 and E4M3 encoding, shared by
// the quantization kernel and the attention kernels. Plain arithmetic, so every arch builds
// and runs it; plus e2m1x8, the hardware conversion (same rounding), on Blackwell targets.
#pragma once

#include <cstdint>

#include "fp4.h"

namespace sage {
namespace fp4 {

// E2M1 code (sign in bit 3) of x, round to nearest even, saturating at +-6. The tie points
// go to the even code: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
__device__ __forceinline__ uint32_t e2m1_code(float x) {
  const float a = fabsf(x);
  uint32_t c;
  if (a <= 0.25f) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.f) c = 6;
  else c = 7;  // also NaN-free saturation of anything larger
  return c | (x < 0.f ? 8u : 0u);
}

__device__ __forceinline__ float e2m1_value(uint32_t code) {
  const uint32_t m = code & 7u;
  const float mag = m < 4 ? 0.5f * m : (m == 4 ? 2.f : m == 5 ? 3.f : m == 6 ? 4.f : 6.f);
  return (code & 8u) ? -mag : mag;
}

// The smallest E4M3 (fn) value >= min(t, 448), for t >= 0. Exact: E4M3 has 3 mantissa bits,
// so within a binade [2^e, 2^(e+1)) the step is 2^(e-3); below 2^-6 (subnormals) it is 2^-9.
__device__ __forceinline__ float e4m3_round_up(float t) {
  t = fminf(t, 448.f);
  if (!(t > 0.f)) return 0.f;
  int e;
  frexpf(t, &e);  // t = f * 2^e, f in [0.5, 1): the binade is [2^(e-1), 2^e)
  const float step = ldexpf(1.f, max(e - 4, -9));
  return fminf(ceilf(t / step) * step, 448.f);
}

// The E4M3 (fn) byte of a value that is exactly representable (as e4m3_round_up returns).
__device__ __forceinline__ uint32_t e4m3_byte(float s) {
  if (!(s > 0.f)) return 0u;
  int e;
  const float f = frexpf(s, &e);  // s = f * 2^e, unbiased exponent of s is e - 1
  const int exp = e - 1 + 7;
  if (exp <= 0) return static_cast<uint32_t>(s * 512.f);  // subnormal: s = m * 2^-9
  return (static_cast<uint32_t>(exp) << 3) | static_cast<uint32_t>(f * 16.f - 8.f);
}

__device__ __forceinline__ float e4m3_value(uint32_t b) {
  const uint32_t exp = (b >> 3) & 15u, man = b & 7u;
  const float mag = exp == 0 ? man * (1.f / 512.f) : ldexpf(1.f + man * 0.125f, static_cast<int>(exp) - 7);
  return (b & 0x80u) ? -mag : mag;
}


// The hardware E2M1 conversion exists on the Blackwell arch- and family-specific targets.
#if defined(__CUDA_ARCH__) &&                                                                   \
    (defined(__CUDA_ARCH_FEAT_SM100_ALL) || defined(__CUDA_ARCH_FEAT_SM103_ALL) ||              \
     defined(__CUDA_ARCH_FEAT_SM120_ALL) || defined(__CUDA_ARCH_FEAT_SM121_ALL) ||              \
     (defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000))
#define SAGE_FP4_HW_CVT 1
// Eight floats -> eight E2M1 codes, element 0 in the low nibble, rounded as e2m1_code.
// cvt.rn.satfinite.e2m1x2.f32 d, a, b puts a in d[7:4] and b in d[3:0] (cuda_fp4.hpp's
// __nv_cvt_float2_to_fp4x2 relies on the same order).
__device__ __forceinline__ uint32_t e2m1x8(const float (&v)[8]) {
  uint32_t r;
  asm("{\n.reg .b8 b0, b1, b2, b3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b0, %2, %1;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b1, %4, %3;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b2, %6, %5;\n"
      "cvt.rn.satfinite.e2m1x2.f32 b3, %8, %7;\n"
      "mov.b32 %0, {b0, b1, b2, b3};\n}\n"
      : "=r"(r)
      : "f"(v[0]), "f"(v[1]), "f"(v[2]), "f"(v[3]), "f"(v[4]), "f"(v[5]), "f"(v[6]), "f"(v[7]));
  return r;
}
#endif

}  // namespace fp4
}  // namespace sage

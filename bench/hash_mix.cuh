// mix(i): a 64-bit to 32-bit integer hash (two multiply-xorshift rounds) for the standalone
// harnesses' deterministic random inputs (sm90_harness.cu, quant_harness.cu).
#pragma once

#include <cstdint>

__device__ __forceinline__ uint32_t mix(uint64_t i) {
  i ^= i >> 33;
  i *= 0xff51afd7ed558ccdull;
  i ^= i >> 33;
  i *= 0xc4ceb9fe1a85ec53ull;
  return static_cast<uint32_t>(i ^ (i >> 33));
}

// int8_code (quant_qkv.cu's INT8 rounding) against int8_round (quant_int8.cu's, the reference's
// arithmetic) on every one of the 2^32 float bit patterns: NaNs, infinities, subnormals, both
// zeros and every finite value. Both functions come from csrc/kernels/common.cuh, so this
// checks the code that ships. Built and run by tests/test_int8_round.py on a GPU; by hand:
//
//   nvcc -O3 -std=c++17 -arch=native -I csrc/kernels -o /tmp/irc tests/int8_round_check.cu && /tmp/irc
//
// Prints the number of inputs checked and of mismatches (with the first few); exit status 0
// only when every input matched.
#include <cstdio>

#include "common.cuh"

namespace {

constexpr int kShow = 8;

__global__ void check(uint32_t base, unsigned long long* mismatches, uint32_t* shown) {
  const uint32_t bits = base + blockIdx.x * blockDim.x + threadIdx.x;
  const float t = __uint_as_float(bits);
  const uint32_t fast = sage::int8_code(t);
  const uint32_t plain = static_cast<uint8_t>(sage::int8_round(t));
  if (fast != plain) {
    const unsigned long long i = atomicAdd(mismatches, 1ull);
    if (i < kShow) shown[3 * i] = bits, shown[3 * i + 1] = fast, shown[3 * i + 2] = plain;
  }
}

}  // namespace

int main() {
  unsigned long long* mismatches = nullptr;
  uint32_t* shown = nullptr;
  if (cudaMallocManaged(&mismatches, sizeof(*mismatches)) != cudaSuccess ||
      cudaMallocManaged(&shown, 3 * kShow * sizeof(*shown)) != cudaSuccess) {
    std::fprintf(stderr, "cudaMallocManaged failed\n");
    return 2;
  }
  *mismatches = 0;
  constexpr uint32_t kThreads = 256, kBlocks = 1u << 22;  // 2^30 inputs per launch
  for (uint32_t part = 0; part < 4; ++part)
    check<<<kBlocks, kThreads>>>(part << 30, mismatches, shown);
  const cudaError_t err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::fprintf(stderr, "CUDA error: %s\n", cudaGetErrorString(err));
    return 2;
  }
  std::printf("inputs 4294967296 mismatches %llu\n", *mismatches);
  for (unsigned long long i = 0; i < *mismatches && i < kShow; ++i)
    std::printf("  t bits 0x%08x: int8_code 0x%02x, int8_round 0x%02x\n", shown[3 * i], shown[3 * i + 1],
                shown[3 * i + 2]);
  return *mismatches == 0 ? 0 : 1;
}

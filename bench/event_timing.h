// Event timing shared by the standalone nvcc programs in bench/ (sm90_harness.cu,
// quant_harness.cu, stream_floor.cu).
//
//   median_ms(runs, before, timed, warmup): `before(i)` (outside the timed region: an L2
//   eviction, a counter reset), then `timed()` between two CUDA events, `warmup + runs` times;
//   returns the median of the last `runs` times in ms.
//   L2Evict: a 256 MiB buffer written with cudaMemsetAsync, which evicts the H100's 50 MiB L2
//   (it does not leave it clean: bench/NOTES.md, "what the L2 flush leaves").
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <vector>

#include "cuda_check.h"

template <class Before, class Timed>
double median_ms(int runs, Before&& before, Timed&& timed, int warmup = 0) {
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));
  std::vector<float> ms;
  for (int i = 0; i < warmup + runs; ++i) {
    before(i);
    CHECK(cudaEventRecord(e0));
    timed();
    CHECK(cudaEventRecord(e1));
    CHECK(cudaEventSynchronize(e1));
    CHECK(cudaGetLastError());
    float x = 0.f;
    CHECK(cudaEventElapsedTime(&x, e0, e1));
    if (i >= warmup) ms.push_back(x);
  }
  CHECK(cudaEventDestroy(e0));
  CHECK(cudaEventDestroy(e1));
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

struct L2Evict {
  static constexpr size_t kBytes = size_t(256) << 20;
  void* buf = nullptr;
  L2Evict() { CHECK(cudaMalloc(&buf, kBytes)); }
  void operator()(int i) const { CHECK(cudaMemsetAsync(buf, i & 0xff, kBytes)); }
};

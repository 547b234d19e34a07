// Shared by the CUDA bench tools: a median of CUDA-event timings on the engine's stream.
#pragma once
#include <algorithm>
#include <vector>

#include "kernels/cuda/cuda_common.h"

namespace ms::cuda {

// Median of `reps` timings (ms) of fn, after `warm` untimed calls.
template <class Fn>
float median_ms(Fn fn, int warm, int reps) {
  cudaEvent_t a, b;
  MS_CUDA(cudaEventCreate(&a));
  MS_CUDA(cudaEventCreate(&b));
  for (int i = 0; i < warm; ++i) fn();
  std::vector<float> t;
  for (int i = 0; i < reps; ++i) {
    MS_CUDA(cudaEventRecord(a, stream()));
    fn();
    MS_CUDA(cudaEventRecord(b, stream()));
    MS_CUDA(cudaEventSynchronize(b));
    float ms = 0;
    MS_CUDA(cudaEventElapsedTime(&ms, a, b));
    t.push_back(ms);
  }
  MS_CUDA(cudaEventDestroy(a));
  MS_CUDA(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace ms::cuda

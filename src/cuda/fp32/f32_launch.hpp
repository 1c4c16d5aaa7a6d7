// fp32 path of the CUDA backend: kernel launchers (fwd_f32.cu, bwd_f32.cu), called by f32.cu.
#pragma once

#include <cuda_runtime.h>

#include "cuda/fp32/f32_kernels.cuh"

namespace sinkattn::cuda_f32 {

// Head-dim tile: the smallest of 64, 128, 256 that holds max(d, d_v); 0 when none does.
inline int head_dim_tile(int64_t d, int64_t d_v) {
  const int64_t m = d > d_v ? d : d_v;
  if (m <= 64) return 64;
  if (m <= 128) return 128;
  if (m <= 256) return 256;
  return 0;
}

// Forward: forward rows -> [rng_state] (varlen rows of no sequence are never written, SPEC.md 1). Stops at the first launch error.
cudaError_t launch_forward(const KParams& p, int tile, cudaStream_t stream, const char** what);

// Backward: preprocess -> [d_sinks] -> dq (+ dS) -> dk dv -> [d_bias reduce].
cudaError_t launch_backward(const KParams& p, int tile, cudaStream_t stream, const char** what);

}  // namespace sinkattn::cuda_f32

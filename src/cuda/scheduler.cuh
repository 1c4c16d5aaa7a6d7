// CUDA backend: tile scheduler. Grid = (row blocks, heads, batch). Under a causal / bottom-right mask the
// last row blocks of a sequence do the most work, so they are launched first (longest-processing-time
// order) to shorten the tail of the launch.
#pragma once

namespace sinkattn::cuda {

__device__ __forceinline__ int scheduled_block(bool heavy_last) {
  return heavy_last ? static_cast<int>(gridDim.x - 1 - blockIdx.x) : static_cast<int>(blockIdx.x);
}

}  // namespace sinkattn::cuda

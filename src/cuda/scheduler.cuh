// CUDA backend: tile scheduler (scheduler.hpp has the order and why): the tile of this block from blockIdx.
#pragma once

#include "cuda/scheduler.hpp"

namespace sinkattn::cuda {

__device__ __forceinline__ TileCoord scheduled_tile(bool heavy_last) {
  const unsigned long long pairs = tile_pairs(gridDim.y, gridDim.z);
  const unsigned long long linear =
      blockIdx.x + static_cast<unsigned long long>(gridDim.x) * (blockIdx.y + static_cast<unsigned long long>(gridDim.y) * blockIdx.z);
  return tile_of_linear(linear, pairs, gridDim.x, gridDim.y, heavy_last);
}

}  // namespace sinkattn::cuda

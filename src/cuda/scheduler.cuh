// CUDA backend: tile scheduler. Grid = (row blocks, heads, batch), launched in linear order (x fastest). The
// linear block id is remapped so that the row-block index varies slowest: every (head, batch) pair of the
// heaviest row block runs first (longest-processing-time order over the whole grid, not per head), which
// shortens the tail of causal launches where one block does up to 2x the average work.
//   forward / dq: under a causal / bottom-right mask the last query blocks see the most keys (heavy_last);
//   dK dV:        the first key blocks are seen by the most queries (heavy_last = false).
#pragma once

namespace sinkattn::cuda {

struct TileCoord {
  int block, head, batch;
};

__device__ __forceinline__ TileCoord scheduled_tile(bool heavy_last) {
  const unsigned long long pairs = static_cast<unsigned long long>(gridDim.y) * gridDim.z;
  const unsigned long long linear =
      blockIdx.x + static_cast<unsigned long long>(gridDim.x) * (blockIdx.y + static_cast<unsigned long long>(gridDim.y) * blockIdx.z);
  const unsigned long long order = linear / pairs, r = linear % pairs;
  TileCoord t;
  t.head = static_cast<int>(r % gridDim.y);
  t.batch = static_cast<int>(r / gridDim.y);
  t.block = heavy_last ? static_cast<int>(gridDim.x - 1 - order) : static_cast<int>(order);
  return t;
}

}  // namespace sinkattn::cuda

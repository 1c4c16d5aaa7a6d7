// CUDA backend: tile scheduler arithmetic (host + device, so tests check it on the CPU). Grid = (row blocks, heads,
// batch), launched in linear order (x fastest). The linear block id is remapped so that the row-block index varies
// slowest: every (head, batch) pair of the heaviest row block runs first (longest-processing-time order over the
// whole grid, not per head), which shortens the tail of causal launches where one block does up to 2x the average
// work.
//   forward / dq: under a causal / bottom-right mask the last query blocks see the most keys (heavy_last);
//   dK dV:        the first key blocks are seen by the most queries (heavy_last = false).
// scheduler.cuh applies it to blockIdx; the deterministic Hopper backward applies it to a ticket (dq_order.hpp).
#pragma once

#include "common/hd.hpp"

namespace sinkattn::cuda {

// The tile (row block, head, batch) of linear position `linear` in a grid of gx x gy x gz (pairs = gy * gz): every
// (head, batch) pair of the first row block first, then of the next, ...
struct TileCoord {
  int block, head, batch;
};
SINKATTN_HD unsigned long long tile_pairs(unsigned gy, unsigned gz) { return static_cast<unsigned long long>(gy) * gz; }
SINKATTN_HD TileCoord tile_of_linear(unsigned long long linear, unsigned long long pairs, unsigned gx, unsigned gy,
                                     bool heavy_last) {
  const unsigned long long order = linear / pairs, r = linear % pairs;
  TileCoord t;
  t.head = static_cast<int>(r % gy);
  t.batch = static_cast<int>(r / gy);
  t.block = heavy_last ? static_cast<int>(gx - 1 - order) : static_cast<int>(order);
  return t;
}

}  // namespace sinkattn::cuda

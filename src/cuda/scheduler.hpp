// CUDA backend: tile scheduler arithmetic (host + device, so tests check it on the CPU). Grid = (row blocks, heads,
// batch), launched in linear order (x fastest). The linear block id is remapped so that the row-block index varies
// slowest: every (head, batch) pair of the heaviest row block runs first (longest-processing-time order), which
// shortens the tail of causal launches where one block does up to 2x the average work.
//   forward / dq: under a causal / bottom-right mask the last query blocks see the most keys (heavy_last);
//   dK dV:        the first key blocks are seen by the most queries (heavy_last = false).
// L2 sections (the warp-specialised forward, fwd_sm90_ws.cuh): the pairs are cut into sections of `section`
// consecutive pairs, taken one after another, each in that longest-first order. The blocks running at once then share
// the K / V of a few heads, which stay in L2, instead of streaming every head's from memory: with all 64 pairs of the
// MHA layer at once the forward's K / V working set is 128 MiB, 2.6x the H200's L2. The section size is the
// dispatch's (dispatch.cpp, fwd_section_pairs; l2_section_pairs below); section 0 (or >= pairs) is one section, the
// plain order. The idea is FlashAttention-3's L2-aware longest-first scheduler. The dK dV kernel keeps the plain
// order: in sections of 9 or 11 pairs its backward measured slower, the deterministic one by 7-11% (more blocks of
// one pair at once wait for each other's dq turns and reduce-adds: bench/log/2026-12-03-forward-l2-sections.md).
// scheduler.cuh applies the plain order to blockIdx; the deterministic Hopper backward applies it to a ticket
// (dq_order.hpp).
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn::cuda {

// The tile (row block, head, batch) of linear position `linear` in a grid of gx x gy x gz (pairs = gy * gz): every
// (head, batch) pair of the first row block first, then of the next, ...
struct TileCoord {
  int block, head, batch;
};
SINKATTN_HD unsigned long long tile_pairs(unsigned gy, unsigned gz) { return static_cast<unsigned long long>(gy) * gz; }
// The tile of row-block position `order` (0: the heaviest) and pair r (head fastest).
SINKATTN_HD TileCoord tile_of_order_pair(unsigned long long order, unsigned long long r, unsigned gx, unsigned gy,
                                         bool heavy_last) {
  TileCoord t;
  t.head = static_cast<int>(r % gy);
  t.batch = static_cast<int>(r / gy);
  t.block = heavy_last ? static_cast<int>(gx - 1 - order) : static_cast<int>(order);
  return t;
}
SINKATTN_HD TileCoord tile_of_linear(unsigned long long linear, unsigned long long pairs, unsigned gx, unsigned gy,
                                     bool heavy_last) {
  return tile_of_order_pair(linear / pairs, linear % pairs, gx, gy, heavy_last);
}

// The same in L2 sections of `section` pairs: the pairs of section 0 (pairs 0 .. section - 1, head fastest) in that
// order over the row blocks, then section 1, ... (the last section may be narrower); section 0 or >= pairs: one
// section, tile_of_linear.
SINKATTN_HD TileCoord tile_of_linear_sectioned(unsigned long long linear, unsigned long long pairs, unsigned gx,
                                               unsigned gy, bool heavy_last, unsigned long long section) {
  if (section == 0 || section >= pairs) return tile_of_linear(linear, pairs, gx, gy, heavy_last);
  const unsigned long long per = section * gx;  // tiles of a full section
  const unsigned long long sec = linear / per, first = sec * section;
  const unsigned long long width = pairs - first < section ? pairs - first : section;
  const unsigned long long within = linear - sec * per;
  return tile_of_order_pair(within / width, first + within % width, gx, gy, heavy_last);
}

// Pairs per L2 section: as many as have their tensors within `budget` bytes, at least one and about `min_pairs` (the
// dispatch asks for two waves of blocks per section: a section's heaviest tiles, which start first, then finish well
// before its lightest, so the launch still ends on light tiles), in whole `unit`s (the forward's pairs are query
// heads, and the `group` query heads of one KV head read the same K / V), then evened out over the sections that
// takes (64 pairs at 15 a section: 5 sections of 13, not a last one of 4 whose heavy tiles would start last); every
// pair (one section) when all fit or when budget or pair_bytes is 0.
inline int64_t l2_section_pairs(int64_t pairs, int64_t pair_bytes, int64_t budget, int64_t unit = 1,
                                int64_t min_pairs = 1) {
  if (pairs <= 0 || pair_bytes <= 0 || budget <= 0) return pairs;
  if (unit < 1) unit = 1;
  int64_t section = budget / pair_bytes * unit;
  if (section < min_pairs) section = min_pairs;
  section = (section + unit - 1) / unit * unit;
  if (section < unit) section = unit;
  if (section >= pairs) return pairs;
  const int64_t sections = (pairs + section - 1) / section, even = (pairs + sections - 1) / sections;
  return (even + unit - 1) / unit * unit;
}

}  // namespace sinkattn::cuda

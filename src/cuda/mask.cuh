// CUDA backend: the mask of SPEC.md section 2 ("Masks") for one sequence of a call (common/mask.hpp, BandMask, is the
// definition: visible(i, j), the key range of a block of rows, the row range of a block of keys, whole-tile
// visibility). Key blocks (forward, dq) / query blocks (dK dV) outside the visible band are never visited, so a
// sliding window costs O(s * window); only blocks on the band's edges apply the per-element mask. 32-bit indices:
// the window clamp (common/mask.hpp) and the backend's s_q + s_kv < 2^30 keep every expression in range.
#pragma once

#include "common/mask.hpp"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

struct Mask : BandMask<int> {
  __device__ __forceinline__ Mask(const Params& p, const SeqInfo& s)
      : BandMask<int>(p.align_bottom_right != 0, p.window_left, p.window_right, s.len_q, s.len_kv) {}
};

}  // namespace sinkattn::cuda

// CUDA backend: the mask of SPEC.md section 2 ("Masks") and the block ranges it implies.
//   off = len_kv - len_q (bottom_right) or 0 (top_left), per sequence, with actual lengths;
//   key j is visible to query i iff j < len_kv and
//     (window_left  < 0 or j >= i + off - window_left) and (window_right < 0 or j <= i + off + window_right).
// Key blocks (forward, dq) / query blocks (dK dV) outside the visible band are never visited, so a sliding
// window costs O(s * window); only blocks on the band's edges apply the per-element mask.
#pragma once

#include "cuda/params.cuh"

namespace sinkattn::cuda {

struct Mask {
  int off, wl, wr, len_q, len_kv;

  __device__ __forceinline__ Mask(const Params& p, const SeqInfo& s)
      : off(p.align_bottom_right ? s.len_kv - s.len_q : 0),
        wl(p.window_left),
        wr(p.window_right),
        len_q(s.len_q),
        len_kv(s.len_kv) {}

  __device__ __forceinline__ bool visible(int i, int j) const {
    return j < len_kv && (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
  }

  // Keys [lo, hi) visible to some query row of [i0, i1) (i1 > i0, rows clipped to len_q by the caller).
  __device__ __forceinline__ void key_range(int i0, int i1, int& lo, int& hi) const {
    lo = 0;
    hi = len_kv;
    if (wl >= 0) lo = max(lo, i0 + off - wl);
    if (wr >= 0) hi = min(hi, (i1 - 1) + off + wr + 1);
    if (hi < lo) hi = lo;
  }

  // Query rows [lo, hi) that see some key of [j0, j1) (j1 > j0, keys clipped to len_kv by the caller).
  __device__ __forceinline__ void query_range(int j0, int j1, int& lo, int& hi) const {
    lo = 0;
    hi = len_q;
    if (wr >= 0) lo = max(lo, j0 - off - wr);
    if (wl >= 0) hi = min(hi, (j1 - 1) - off + wl + 1);
    if (hi < lo) hi = lo;
  }

  // True when every (i, j) of rows [i0, i0 + bm) x keys [j0, j0 + bn) is visible (no per-element mask).
  __device__ __forceinline__ bool tile_all_visible(int i0, int bm, int j0, int bn) const {
    if (j0 + bn > len_kv) return false;
    if (wl >= 0 && j0 < (i0 + bm - 1) + off - wl) return false;
    if (wr >= 0 && j0 + bn - 1 > i0 + off + wr) return false;
    return true;
  }
};

}  // namespace sinkattn::cuda

// The mask of SPEC.md section 2 ("Masks"), the window clamp, and the visible ranges the mask implies, as every path
// uses them (CPU backend, CUDA sm_80 and sm_90 kernels, the CUDA fp32 path, the deterministic dq order of the Hopper
// backward): one definition.
//   off = len_kv - len_q (bottom_right) or 0 (top_left), per sequence, with actual lengths (common/seq.hpp);
//   key j (0 <= j < len_kv) is visible to query row i (0 <= i < len_q) iff
//     (window_left  < 0 or j >= i + off - window_left) and (window_right < 0 or j <= i + off + window_right).
// The visible keys of a row, and the visible rows of a key, are one contiguous range (a band), so a block of rows
// sees one contiguous range of keys and a block of keys is seen by one contiguous range of rows.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn {

// The window clamp, applied once when a call is resolved (core/validate.cpp): a negative window is unbounded (-1);
// a window of s_q + s_kv or more (s_q, s_kv: the extents, or max_seqlen_q / max_seqlen_kv for varlen) restricts no
// key of any row (i + off - w < 0 and i + off + w >= len_kv for every row of every sequence), so it is replaced by
// s_q + s_kv, which changes no result. With s_q + s_kv < 2^30 (the CUDA backend's limit) every expression
// i + off +- w + 1 of the masks below then fits a 32-bit int (|.| <= 2 (s_q + s_kv) + 1).
SINKATTN_HD int64_t clamp_window(int64_t window, int64_t s_q, int64_t s_kv) {
  if (window < 0) return -1;
  const int64_t cap = s_q + s_kv;
  return window < cap ? window : cap;
}

// The mask of one sequence. I: int in the CUDA kernels, int64_t on the host and in the fp32 path.
template <typename I>
struct BandMask {
  I off, wl, wr, len_q, len_kv;

  SINKATTN_HD BandMask(bool bottom_right, I window_left, I window_right, I len_q_, I len_kv_)
      : off(bottom_right ? len_kv_ - len_q_ : I(0)),
        wl(window_left),
        wr(window_right),
        len_q(len_q_),
        len_kv(len_kv_) {}
  // The same mask in another index type (the CUDA kernels widen to 64 bits for per-row ranges).
  template <typename J>
  SINKATTN_HD explicit BandMask(const BandMask<J>& o)
      : off(o.off), wl(o.wl), wr(o.wr), len_q(o.len_q), len_kv(o.len_kv) {}

  // Key j visible to row i (the caller keeps i < len_q).
  SINKATTN_HD bool visible(I i, I j) const {
    return j < len_kv && (wl < 0 || j >= i + off - wl) && (wr < 0 || j <= i + off + wr);
  }

  // Keys [lo, hi) visible to some row of [i0, i1) (i1 > i0, rows clipped to len_q by the caller); hi = lo when
  // none (lo may then exceed len_kv). Row i alone: key_range(i, i + 1).
  SINKATTN_HD void key_range(I i0, I i1, I& lo, I& hi) const {
    lo = 0;
    hi = len_kv;
    if (wl >= 0) lo = hd_max(lo, i0 + off - wl);
    if (wr >= 0) hi = hd_min(hi, (i1 - 1) + off + wr + 1);
    if (hi < lo) hi = lo;
  }

  // Rows [lo, hi) that see some key of [j0, j1) (j1 > j0, keys clipped to len_kv by the caller); hi = lo when
  // none. Key j alone: query_range(j, j + 1).
  SINKATTN_HD void query_range(I j0, I j1, I& lo, I& hi) const {
    lo = 0;
    hi = len_q;
    if (wr >= 0) lo = hd_max(lo, j0 - off - wr);
    if (wl >= 0) hi = hd_min(hi, (j1 - 1) - off + wl + 1);
    if (hi < lo) hi = lo;
  }

  // True when every (i, j) of rows [i0, i0 + bm) x keys [j0, j0 + bn) is visible (no per-element mask needed;
  // rows past len_q are the caller's to exclude).
  SINKATTN_HD bool tile_all_visible(I i0, I bm, I j0, I bn) const {
    if (j0 + bn > len_kv) return false;
    if (wl >= 0 && j0 < (i0 + bm - 1) + off - wl) return false;
    if (wr >= 0 && j0 + bn - 1 > i0 + off + wr) return false;
    return true;
  }
};

// ---- block ranges (kernels that walk tiles of BM rows x BN keys) ----

// Query blocks of BM rows that see some key of the key block [j0, j0 + BN): blocks qb_lo .. qb_lo + nq - 1 (nq = 0
// when the key block lies past len_kv or no row sees it).
template <int BM, int BN, typename I>
SINKATTN_HD void query_blocks_of_key_block(const BandMask<I>& mk, I j0, I& qb_lo, I& nq) {
  I q_lo = 0, q_hi = 0;
  if (j0 < mk.len_kv) mk.query_range(j0, hd_min(j0 + BN, mk.len_kv), q_lo, q_hi);
  qb_lo = q_lo / BM;
  const I qb_hi = (q_hi + BM - 1) / BM;
  nq = q_hi > q_lo ? qb_hi - qb_lo : 0;
}

// Key blocks of BN keys seen by some row of the query block [i0, i1) (i0 < i1 <= len_q): blocks kb_lo .. kb_hi - 1
// (kb_hi = kb_lo when no row sees a key). These are exactly the key blocks whose query_blocks_of_key_block range
// holds the query block: both say "some (i, j) of the two blocks is visible", and the band makes both ranges
// contiguous (tests/test_mask_order.cpp checks it against brute force).
template <int BN, typename I>
SINKATTN_HD void key_blocks_of_query_block(const BandMask<I>& mk, I i0, I i1, I& kb_lo, I& kb_hi) {
  I k_lo, k_hi;
  mk.key_range(i0, i1, k_lo, k_hi);
  kb_lo = k_lo / BN;
  kb_hi = k_hi > k_lo ? (k_hi + BN - 1) / BN : kb_lo;
}

}  // namespace sinkattn

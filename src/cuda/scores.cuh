// CUDA backend: from raw Q.K products to base-2 logits, SPEC.md section 2:
//   S_ij = softmax_scale * dot(q_i, k_j) + bias_ij;  S_ij = -inf where the mask excludes (i, j)
// kept as x_ij = S_ij * log2(e). The bias is read only for visible (i, j) inside the sequence, so it is never
// read out of bounds and masked positions never contribute (even a NaN bias).
// Fragment element (nt, e) of a warp's 16 x (NT * 8) tile is (row g + 8 * (e >= 2), col nt * 8 + 2t + (e & 1)).
// Rows are queries and columns keys, or the transpose (dK dV kernel: rows are keys).
#pragma once

#include "cuda/common.cuh"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

// The two 16-bit bias elements of a word (low half first) as floats.
template <typename T>
__device__ __forceinline__ void unpack_bias_word(uint32_t v, float& b0, float& b1) {
  const uint16_t lo = static_cast<uint16_t>(v & 0xffffu), hi = static_cast<uint16_t>(v >> 16);
  b0 = ElemTraits<T>::to_float(*reinterpret_cast<const T*>(&lo));
  b1 = ElemTraits<T>::to_float(*reinterpret_cast<const T*>(&hi));
}

// Two adjacent elements of the bias (or any T / fp32 row) as one 4-byte (fp32: 8-byte) load.
template <typename E>
struct alignas(2 * sizeof(E)) ElemPair {
  E x, y;
};

template <typename T>
__device__ __forceinline__ float bias_load(const Params& p, int64_t off) {
  if (p.bias_f32) return __ldg(static_cast<const float*>(p.bias) + off);
  return ElemTraits<T>::to_float(static_cast<const T*>(p.bias)[off]);
}

template <typename T>
__device__ __forceinline__ void bias_load_pair(const Params& p, int64_t off, float& b0, float& b1) {
  if (p.bias_f32) {
    const ElemPair<float> v = *reinterpret_cast<const ElemPair<float>*>(static_cast<const float*>(p.bias) + off);
    b0 = v.x;
    b1 = v.y;
  } else {
    const ElemPair<T> v = *reinterpret_cast<const ElemPair<T>*>(static_cast<const T*>(p.bias) + off);
    b0 = ElemTraits<T>::to_float(v.x);
    b1 = ElemTraits<T>::to_float(v.y);
  }
}

// The bias of one thread's fragment of a tile, loaded into registers before the tile's S (S^T) product is waited
// for, so that the loads' latency hides behind the tensor cores (the kBias variants of the warp-specialised Hopper
// forward and of the Hopper dK dV kernel). A 16-bit bias only: one 32-bit word per (nt, fragment row) holding
// elements (nt, 2 rr) and (nt, 2 rr + 1); elements past the sequence read as 0 (never visible). Rows are queries
// (one paired load where the keys have unit stride and the offsets are even, else two) or keys (kTransposed: two
// loads). `on` is false for an fp32 bias, whose elements make_logits loads itself.
template <typename T, int NT, bool kTransposed = false>
struct BiasPrefetch {
  uint32_t w[NT][2];
  bool on = false;

  __device__ __forceinline__ void load(const Params& p, int n, int h, int row0, int col0, int len_q, int len_kv,
                                       int lane) {
    on = !p.bias_f32;
    if (!on) return;
    const int g = lane >> 2, t = lane & 3;
    const int64_t rs = kTransposed ? p.bias_j : p.bias_i, cs = kTransposed ? p.bias_i : p.bias_j;
    const int len_r = kTransposed ? len_kv : len_q, len_c = kTransposed ? len_q : len_kv;
    const bool pair = !kTransposed && cs == 1 && ((p.bias_b | p.bias_h | p.bias_i) & 1) == 0 &&
                      (reinterpret_cast<uintptr_t>(p.bias) & 3) == 0;
    const T* base = static_cast<const T*>(p.bias) + n * p.bias_b + h * p.bias_h;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = row0 + g + 8 * rr;
      const T* row = base + static_cast<int64_t>(r) * rs;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int c = col0 + nt * 8 + 2 * t;
        uint32_t v = 0u;
        if (r < len_r && pair && c + 1 < len_c) {
          v = *reinterpret_cast<const uint32_t*>(row + c);
        } else if (r < len_r) {
          const T* e = row + static_cast<int64_t>(c) * cs;
          uint16_t lo = 0, hi = 0;
          if (c < len_c) lo = __ldg(reinterpret_cast<const unsigned short*>(e));
          if (c + 1 < len_c) hi = __ldg(reinterpret_cast<const unsigned short*>(e + cs));
          v = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
        }
        w[nt][rr] = v;
      }
    }
  }
  // The same words from a bias tile staged in shared memory (BiasSmemView below: the TMA-staged bias of the Hopper
  // kernels), all read here, after the tile's S is issued.
  template <typename View>
  __device__ __forceinline__ void load_smem(const View& view) {
    on = true;
#pragma unroll
    for (int k = 0; k < NT / 2; ++k) {
      uint32_t q[4];
      view.words4(k, q);
#pragma unroll
      for (int m = 0; m < 4; ++m) w[2 * k + (m >> 1)][m & 1] = q[m];
    }
  }
  // Words (2k, 0), (2k, 1), (2k + 1, 0), (2k + 1, 1): make_logits reads them four at a time (a staged tile's come
  // from one ldmatrix).
  __device__ __forceinline__ void words4(int k, uint32_t (&q)[4]) const {
#pragma unroll
    for (int m = 0; m < 4; ++m) q[m] = w[2 * k + (m >> 1)][m & 1];
  }
};

// A bias tile staged in shared memory (the TMA-staged bias of the Hopper kernels: rows = queries, columns = keys, the
// bias's own layout, 16-bit elements), read where make_logits uses it: for kernels with no registers to hold the
// tile's words (the Hopper dK dV kernel at head dim 128); the others read every word first
// (BiasPrefetch::load_smem). Both read four words per ldmatrix (words4). Off: the staged tile's
// element offset of (r, c), e.g. sm90::sw_offset, evaluated per 16-byte chunk (c a multiple of 8: its swizzle is not
// linear in the column, chunk ^ (row % 8), but keeps a chunk's 8 elements together). Elements outside
// the tensor were zero-filled by TMA; those past a sequence's end are the bias's own (make_logits never uses them:
// they are masked).
template <typename T, int NT, bool kTransposed, typename Off>
struct BiasSmemView {
  Off off;
  const unsigned short* u = nullptr;
  int fr0 = 0, fc0 = 0, lane_ = 0;
  bool on = false;

  __device__ __forceinline__ explicit BiasSmemView(Off o) : off(o) {}
  // This warp's first fragment row / column within the tile (kTransposed: fragment rows are the tile's columns).
  __device__ __forceinline__ void bind(const T* tile, int fr0_, int fc0_, int lane) {
    on = true;
    u = reinterpret_cast<const unsigned short*>(tile);
    fr0 = fr0_;
    fc0 = fc0_;
    lane_ = lane;
  }
  // Words (2k, 0), (2k, 1), (2k + 1, 0), (2k + 1, 1) (word (nt, rr): fragment elements (nt, 2 rr) and (nt, 2 rr + 1),
  // low half first) by one ldmatrix of four 8 x 8 matrices, matrix m = (nt = 2k + m / 2, rr = m % 2); lane l gives
  // the address of row l % 8 of matrix l / 8, a 16-byte chunk of the tile (fr0, fc0 and 8 nt are multiples of 8).
  //   rows = queries: matrix m is the tile's rows fr0 + 8 rr + 0..7, columns fc0 + 8 nt + 0..7; thread (g, t)
  //     receives its row g, columns 2t, 2t + 1: the fragment's elements;
  //   kTransposed (rows = keys = the tile's columns): matrix m is the tile's rows (queries) fc0 + 8 nt + 0..7,
  //     columns (keys) fr0 + 8 rr + 0..7, loaded .trans: thread (g, t) receives rows 2t, 2t + 1 of its column g.
  __device__ __forceinline__ void words4(int k, uint32_t (&q)[4]) const {
    const int m = lane_ >> 3, r = lane_ & 7, nt = 2 * k + (m >> 1), rr = m & 1;
    if constexpr (!kTransposed)
      ldmatrix_x4(q, u + off(fr0 + 8 * rr + r, fc0 + 8 * nt));
    else
      ldmatrix_x4_trans(q, u + off(fc0 + 8 * nt + r, fr0 + 8 * rr));
  }
};

// The visible columns [lo[rr], hi[rr]) of fragment rows r0 and r0 + 8 (the mask of SPEC 2 is a band,
// common/mask.hpp), in 64 bits: rows are queries (their keys) or, kTransposed, keys (their queries).
template <bool kTransposed>
__device__ __forceinline__ void fragment_row_ranges(const Mask& mk, int r0, int (&lo)[2], int (&hi)[2]) {
  const BandMask<int64_t> wide(mk);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = r0 + 8 * rr;
    int64_t a = 0, b = 0;
    if (!kTransposed && r < mk.len_q) wide.key_range(r, r + 1, a, b);         // row = query i: its keys
    else if (kTransposed && r < mk.len_kv) wide.query_range(r, r + 1, a, b);  // row = key j: its queries
    lo[rr] = static_cast<int>(a);
    hi[rr] = static_cast<int>(b);
  }
}

// kMayBias = false: the caller's kernel variant has no bias (compiled out of the common path). pre: the tile's bias,
// prefetched (a BiasPrefetch) or staged (a BiasSmemView) (nullptr, or pre->on false: loaded here).
// sc_out (callers whose exp2 takes a factor sc: the forward's OnlineSoftmax::step, the Hopper dK dV kernel's P^T):
// non-null lets a fully visible prefetched / staged bias fragment stay in natural units, s = softmax_scale * s + b
// (one FFMA per element), with *sc_out = log2(e) for the caller to apply; untouched (the caller's 1) otherwise.
template <typename T, int NT, bool kTransposed, bool kMayBias = true, typename Pre = BiasPrefetch<T, NT, kTransposed>>
__device__ __forceinline__ void make_logits(float (&s)[NT][4], const Params& p, const Mask& mk, bool need_mask, int n,
                                            int h, int row0, int col0, int lane, const Pre* pre = nullptr,
                                            float* sc_out = nullptr) {
  const int g = lane >> 2, t = lane & 3;
  const bool has_bias = kMayBias && p.bias != nullptr;
  if (!need_mask && !has_bias) {  // common path (interior tile, no bias): branch-free scaling only
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= p.scale_log2;
    return;
  }
  if (!has_bias) {
    // Edge tile without bias: each of the thread's two fragment rows sees one contiguous column range
    // [lo, hi) (the mask of SPEC 2 is a band, common/mask.hpp), computed once per row in 64 bits; then two
    // compares per element.
    int lo[2], hi[2];
    fragment_row_ranges<kTransposed>(mk, row0 + g, lo, hi);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = col0 + nt * 8 + 2 * t + (e & 1);
        const int rr = e >> 1;
        s[nt][e] = (c >= lo[rr] && c < hi[rr]) ? s[nt][e] * p.scale_log2 : -INFINITY;
      }
    return;
  }
  // Bias: the same column ranges on edge tiles. A visible tile leaves queries past len_q to the caller
  // (BandMask::tile_all_visible); the bias is never read there (its rows end at len_q), and such rows / columns are
  // -inf as on the edge tiles.
  int lo[2] = {col0, col0}, hi[2] = {col0 + NT * 8, col0 + NT * 8};
  if (need_mask) {
    fragment_row_ranges<kTransposed>(mk, row0 + g, lo, hi);
  } else {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      if (!kTransposed && row0 + g + 8 * rr >= mk.len_q) hi[rr] = lo[rr];
      if (kTransposed) hi[rr] = min(hi[rr], mk.len_q);
    }
  }
  // Elements (nt, 2 rr) and (nt, 2 rr + 1): visible or -inf; the bias b0, b1 enters only where visible (a masked
  // NaN never does: a select, not a product).
  const auto put = [&](int nt, int rr, float b0, float b1) {
    const int c = col0 + nt * 8 + 2 * t;
    const bool v0 = c >= lo[rr] && c < hi[rr], v1 = c + 1 >= lo[rr] && c + 1 < hi[rr];
    s[nt][2 * rr] = v0 ? s[nt][2 * rr] * p.scale_log2 + b0 * kLog2e : -INFINITY;
    s[nt][2 * rr + 1] = v1 ? s[nt][2 * rr + 1] * p.scale_log2 + b1 * kLog2e : -INFINITY;
  };
  // Prefetched (registers) or staged (shared memory): one branch for the tile, none per element; the words four at a
  // time (Pre::words4). A branch per element around the loads below (either path taken at run time) made the
  // warp-specialised forward's bias variant 10 k instructions long, and instruction-cache misses (BSYNC,
  // stall_no_inst) its most-sampled stall (ncu, bench/log/2026-12-02-bias-tma.md). A tile whose every element of this
  // warp's fragment is visible (no mask, rows / columns inside len_q: warp-uniform) takes no compare or select and
  // one FFMA per element, in natural units (sc_out; the Hopper kernels, the only callers with a pre, all pass it).
  if (pre != nullptr && pre->on) {
    static_assert(NT % 2 == 0, "words four at a time: (nt, rr) for two n-tiles");
    const bool all_visible = !need_mask && (kTransposed ? col0 + NT * 8 <= mk.len_q : row0 + 16 <= mk.len_q);
    const auto each = [&](auto&& f) {
#pragma unroll
      for (int k = 0; k < NT / 2; ++k) {
        uint32_t q[4];
        pre->words4(k, q);
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          float b0, b1;
          unpack_bias_word<T>(q[m], b0, b1);
          f(2 * k + (m >> 1), m & 1, b0, b1);
        }
      }
    };
    if (all_visible && sc_out != nullptr) {
      each([&](int nt, int rr, float b0, float b1) {
        s[nt][2 * rr] = fmaf(s[nt][2 * rr], p.softmax_scale, b0);
        s[nt][2 * rr + 1] = fmaf(s[nt][2 * rr + 1], p.softmax_scale, b1);
      });
      *sc_out = kLog2e;
    } else {
      each(put);
    }
    return;
  }
  // Loaded here: one element offset per fragment row (64 bits, once per tile), a column stride per element. Two
  // adjacent columns are adjacent bias elements when the columns are keys of unit stride: one paired load where the
  // offsets are even and the pointer aligned (uniform over the call). Read only where visible: never out of bounds.
  const int64_t rs = kTransposed ? p.bias_j : p.bias_i, cs = kTransposed ? p.bias_i : p.bias_j;
  const bool pair = !kTransposed && cs == 1 && ((p.bias_b | p.bias_h | p.bias_i) & 1) == 0 &&
                    (reinterpret_cast<uintptr_t>(p.bias) & (p.bias_f32 ? 7 : 3)) == 0;
  const int64_t base = n * p.bias_b + h * p.bias_h + static_cast<int64_t>(col0 + 2 * t) * cs;
  int64_t ro[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) ro[rr] = base + static_cast<int64_t>(row0 + g + 8 * rr) * rs;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int c = col0 + nt * 8 + 2 * t;
      const bool v0 = c >= lo[rr] && c < hi[rr], v1 = c + 1 >= lo[rr] && c + 1 < hi[rr];
      const int64_t o = ro[rr] + nt * 8 * cs;
      float b0 = 0.f, b1 = 0.f;
      if (pair && v0 && v1) {
        bias_load_pair<T>(p, o, b0, b1);
      } else {
        if (v0) b0 = bias_load<T>(p, o);
        if (v1) b1 = bias_load<T>(p, o + cs);
      }
      put(nt, rr, b0, b1);
    }
  }
}

// dS of one thread's fragment (rows row0 + g, + 8; columns col0 + 8 nt + 2 t, + 1) into the d_bias workspace
// ws_dbias[n][hs][i][j] (fp32; bias calls are dense, SPEC 1), elements inside the sequence only; hs = the query head,
// or the KV head when the caller summed the group's heads (Params::ws_dbias_heads). Rows are queries
// (the dq kernel: two adjacent keys as one 8-byte store when s_kv is even) or keys (kTransposed: the Hopper dK dV
// kernel; a store instruction covers 8 consecutive keys of 4 query rows).
template <int NT, bool kTransposed>
__device__ __forceinline__ void store_dbias_ws(const Params& p, const float (&ds)[NT][4], int n, int hs, int row0,
                                               int col0, int len_q, int len_kv, int lane) {
  const int g = lane >> 2, t = lane & 3;
  float* ws = p.ws_dbias + (static_cast<int64_t>(n) * p.ws_dbias_heads + hs) * p.s_q * p.s_kv;
  if constexpr (!kTransposed) {
    const bool pair = (p.s_kv & 1) == 0;
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int i = row0 + g + 8 * rr;
      if (i >= len_q) continue;
      float* row = ws + static_cast<int64_t>(i) * p.s_kv;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int j = col0 + nt * 8 + 2 * t;
        if (pair && j + 1 < len_kv) {
          *reinterpret_cast<ElemPair<float>*>(row + j) = ElemPair<float>{ds[nt][2 * rr], ds[nt][2 * rr + 1]};
        } else {
          if (j < len_kv) row[j] = ds[nt][2 * rr];
          if (j + 1 < len_kv) row[j + 1] = ds[nt][2 * rr + 1];
        }
      }
    }
  } else {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int j = row0 + g + 8 * (e >> 1), i = col0 + nt * 8 + 2 * t + (e & 1);
        if (i < len_q && j < len_kv) ws[static_cast<int64_t>(i) * p.s_kv + j] = ds[nt][e];
      }
  }
}

}  // namespace sinkattn::cuda

// CUDA backend: K / V rows of one (sequence, KV head), contiguous or through the page table (SPEC.md section 1,
// paged KV), and a tile loader that reads them with cp.async. The row addressing is core/kv_rows.hpp's
// kv_row_index, the same one the CPU backend uses (32-bit indices here).
// Rows at or past `rows_valid` are zero-filled and never read, and so are their page-table entries: a sequence's
// entries past ceil(seqused_kv[n] / page_size) are never touched (SPEC.md section 1).
#pragma once

#include "core/kv_rows.hpp"
#include "cuda/common.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

// Key j of sequence n, KV head hk, of k and v: element offsets from the k / v base pointers.
struct KvRows {
  const int* table;  // page table (paged calls) or nullptr
  int pt_n, pt_p, page_size, n, kv_start;
  bool varlen;
  int64_t k_b, k_s, v_b, v_s;  // k / v first-dimension and row strides
  int64_t k_head, v_head;      // hk * head stride

  __device__ __forceinline__ KvRows(const Params& p, const SeqInfo& s, int n_, int hk)
      : table(p.page_table), pt_n(static_cast<int>(p.pt_st_n)), pt_p(static_cast<int>(p.pt_st_p)),
        page_size(p.page_size), n(n_), kv_start(static_cast<int>(s.kv_start)), varlen(p.varlen != 0),
        k_b(p.k_st.b), k_s(p.k_st.s), v_b(p.v_st.b), v_s(p.v_st.s), k_head(hk * p.k_st.h), v_head(hk * p.v_st.h) {}

  __device__ __forceinline__ KvRowIndex index(int j) const {
    return kv_row_index<int>(table, pt_n, pt_p, page_size, n, kv_start, j, varlen);
  }
  __device__ __forceinline__ int64_t k_off(const KvRowIndex& r) const { return r.b * k_b + r.s * k_s + k_head; }
  __device__ __forceinline__ int64_t v_off(const KvRowIndex& r) const { return r.b * v_b + r.s * v_s + v_head; }
};

// K and V tiles of ROWS keys j0 .. j0 + ROWS - 1 into shared memory (row stride HD + 8, as load_tile_async), in
// two phases: `lookup` reads the page-table entries of this thread's rows, `copy` issues the cp.async copies. Rows
// outside [row_lo, row_hi) and columns >= d (K) / d_v (V) are zero-filled without being read, and so are their
// page-table entries. Thread tid moves the 16-byte chunks idx = tid + it * NTHREADS (it < kIters): row
// idx / kChunks, column chunk idx % kChunks, and looks a row's page up once for its K and V chunk.
// Why two phases: a lookup is a global load and a copy's address depends on it; looked up row by row (load, then its
// copy) the loads wait one after another, a whole memory latency per row of the tile. Every lookup of a tile (or of
// several, or one tile ahead of its copy, as the decode kernel does) is issued before the first copy needs one.
template <int ROWS, int HD, int NTHREADS>
struct KvTileLoader {
  static constexpr int kChunks = HD / 8;
  static constexpr int kStride = HD + 8;
  static constexpr int kIters = (ROWS * kChunks + NTHREADS - 1) / NTHREADS;

  // KvRowIndex per row, narrowed to 32 bits (a page number or a batch index, and a row in it), two registers a row
  struct Rows {
    int b[kIters], s[kIters];
  };

  __device__ __forceinline__ static bool in_tile(int idx) {
    return (ROWS * kChunks) % NTHREADS == 0 || idx < ROWS * kChunks;
  }

  __device__ __forceinline__ static Rows lookup(const KvRows& kr, int j0, int row_lo, int row_hi, int tid) {
    Rows rows;
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = tid + it * NTHREADS, r = idx / kChunks;
      const bool row_ok = in_tile(idx) && r >= row_lo && r < row_hi;
      const KvRowIndex ri = row_ok ? kr.index(j0 + r) : KvRowIndex{0, 0};
      rows.b[it] = static_cast<int>(ri.b);
      rows.s[it] = static_cast<int>(ri.s);
    }
    return rows;
  }

  template <typename T>
  __device__ __forceinline__ static void copy(T* sK, T* sV, const T* k, const T* v, const KvRows& kr, const Rows& rows,
                                              int row_lo, int row_hi, int d, int d_v, int tid) {
#pragma unroll
    for (int it = 0; it < kIters; ++it) {
      const int idx = tid + it * NTHREADS, r = idx / kChunks, cc = idx % kChunks;
      if (!in_tile(idx)) continue;
      const bool row_ok = r >= row_lo && r < row_hi;
      const bool k_ok = row_ok && cc * 8 < d, v_ok = row_ok && cc * 8 < d_v;
      const KvRowIndex ri{rows.b[it], rows.s[it]};
      cp_async16(sK + r * kStride + cc * 8, k_ok ? k + kr.k_off(ri) + cc * 8 : k, k_ok);
      cp_async16(sV + r * kStride + cc * 8, v_ok ? v + kr.v_off(ri) + cc * 8 : v, v_ok);
    }
  }
};

// Both phases for one tile (its lookups, then its copies).
template <int ROWS, int HD, int NTHREADS, typename T>
__device__ __forceinline__ void load_kv_tiles_async(T* sK, T* sV, const T* k, const T* v, const KvRows& kr, int j0,
                                                    int row_lo, int row_hi, int d, int d_v, int tid) {
  using L = KvTileLoader<ROWS, HD, NTHREADS>;
  L::copy(sK, sV, k, v, kr, L::lookup(kr, j0, row_lo, row_hi, tid), row_lo, row_hi, d, d_v, tid);
}

}  // namespace sinkattn::cuda

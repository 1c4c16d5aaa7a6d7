// CUDA backend: K / V rows of one (sequence, KV head), contiguous or through the page table (SPEC.md section 1,
// paged KV), and the loaders that read them with cp.async (whole tiles by a block; a warp's own rows). The row
// addressing is core/kv_rows.hpp's kv_row_index, the same one the CPU backend uses (32-bit indices here), with the key's page and row in it from
// p.page_div (FastDivmod) rather than a division per row: the loaders look up every row of every tile.
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
  int pt_n, pt_p, n, kv_start;
  FastDivmod page_div;  // the page size (d) and its divisor: p.page_div (d = 1 without a page table)
  bool varlen;
  int64_t k_b, k_s, v_b, v_s;  // k / v first-dimension and row strides
  int64_t k_head, v_head;      // hk * head stride

  __device__ __forceinline__ KvRows(const Params& p, const SeqInfo& s, int n_, int hk)
      : table(p.page_table), pt_n(static_cast<int>(p.pt_st_n)), pt_p(static_cast<int>(p.pt_st_p)),
        n(n_), kv_start(static_cast<int>(s.kv_start)), page_div(p.page_div),
        varlen(p.varlen != 0),
        k_b(p.k_st.b), k_s(p.k_st.s), v_b(p.v_st.b), v_s(p.v_st.s), k_head(hk * p.k_st.h), v_head(hk * p.v_st.h) {}

  __device__ __forceinline__ KvRowIndex index(int j) const {
    if (table == nullptr) return kv_row_index<int>(nullptr, pt_n, pt_p, 1, n, kv_start, j, varlen);
    const uint32_t page_no = page_div.div(static_cast<uint32_t>(j));
    return kv_paged_row<int>(table, pt_n, pt_p, n, static_cast<int>(page_no),
                             j - static_cast<int>(page_no * page_div.d));
  }
  __device__ __forceinline__ int64_t k_off(const KvRowIndex& r) const { return r.b * k_b + r.s * k_s + k_head; }
  __device__ __forceinline__ int64_t v_off(const KvRowIndex& r) const { return r.b * v_b + r.s * v_s + v_head; }
};

// K and V tiles of ROWS keys j0 .. j0 + ROWS - 1 into shared memory (row stride HD + 8, as load_tile_async):
// rows outside [row_lo, row_hi) and columns >= d (K) / d_v (V) are zero-filled without being read. A row's page is
// looked up once for its K and V chunk. When NTHREADS is a multiple of the 16-byte chunks per row, each thread owns
// one fixed column chunk and rows r0, r0 + step, ... (compile-time trip count); otherwise a plain strided loop.
template <int ROWS, int HD, int NTHREADS, typename T>
__device__ __forceinline__ void load_kv_tiles_async(T* sK, T* sV, const T* k, const T* v, const KvRows& kr, int j0,
                                                    int row_lo, int row_hi, int d, int d_v, int tid) {
  constexpr int kChunks = HD / 8;
  constexpr int kStride = HD + 8;
  auto chunk = [&](int r, int cc) {
    const bool row_ok = r >= row_lo && r < row_hi;
    const bool k_ok = row_ok && cc * 8 < d, v_ok = row_ok && cc * 8 < d_v;
    const KvRowIndex ri = row_ok ? kr.index(j0 + r) : KvRowIndex{0, 0};
    cp_async16(sK + r * kStride + cc * 8, k_ok ? k + kr.k_off(ri) + cc * 8 : k, k_ok);
    cp_async16(sV + r * kStride + cc * 8, v_ok ? v + kr.v_off(ri) + cc * 8 : v, v_ok);
  };
  if constexpr (NTHREADS % kChunks == 0) {
    constexpr int kRowStep = NTHREADS / kChunks;
    const int cc = tid % kChunks, r0 = tid / kChunks;
#pragma unroll
    for (int it = 0; it < (ROWS + kRowStep - 1) / kRowStep; ++it) {
      const int r = r0 + it * kRowStep;
      if (ROWS % kRowStep == 0 || r < ROWS) chunk(r, cc);
    }
  } else {
#pragma unroll
    for (int idx = tid; idx < ROWS * kChunks; idx += NTHREADS) chunk(idx / kChunks, idx % kChunks);
  }
}

// The K and V rows of one warp's 16 keys j0 .. j0 + 15 (the decode kernel, whose warps each read their own keys),
// into shared memory as load_kv_tiles_async stores them (rows outside [row_lo, row_hi) and columns >= d / d_v
// zero-filled without being read). Lane l looks up row l % 16 once (its page, the page-table load, the 64-bit
// offsets: about 75 instructions a row in the decode kernel's SASS, 4 rows a thread in load_kv_tiles_async) and
// holds the address of its K (l < 16) or V (l >= 16) row; the copies then take whole rows, kLanesPerRow lanes a row,
// each lane receiving its row's address by shuffle, so that every copy instruction reads whole 128-byte lines.
// (Copies of 32-byte pieces of 16 rows, a row's page looked up by the two lanes that copy it, read K / V at no more
// than 72% of a streaming read on an H100, against up to 93% line by line: bench/log/2026-12-07-decode-warp-rows.md.)
template <int HD, typename T>
__device__ __forceinline__ void load_kv_warp_rows_async(T* sK, T* sV, const T* k, const T* v, const KvRows& kr,
                                                        int j0, int row_lo, int row_hi, int d, int d_v, int lane) {
  constexpr int kChunks = HD / 8, kStride = HD + 8;
  constexpr int kLanesPerRow = kChunks < 32 ? kChunks : 32, kRowsPerStep = 32 / kLanesPerRow;
  static_assert(16 % kRowsPerStep == 0, "whole rows per step");
  const int mine = lane & 15;
  const bool mine_ok = mine >= row_lo && mine < row_hi;
  const KvRowIndex ri = mine_ok ? kr.index(j0 + mine) : KvRowIndex{0, 0};
  // a row outside the range keeps the pool's base address: its chunks read nothing (cp_async16, src-size 0)
  const T* row = lane < 16 ? (mine_ok ? k + kr.k_off(ri) : k) : (mine_ok ? v + kr.v_off(ri) : v);
  const auto row_bits = reinterpret_cast<unsigned long long>(row);
  const int cc = lane % kLanesPerRow;
#pragma unroll
  for (int r0 = 0; r0 < 16; r0 += kRowsPerStep) {
    const int r = r0 + lane / kLanesPerRow;
    const T* k_row = reinterpret_cast<const T*>(__shfl_sync(0xffffffffu, row_bits, r));
    const T* v_row = reinterpret_cast<const T*>(__shfl_sync(0xffffffffu, row_bits, 16 + r));
    const bool ok = r >= row_lo && r < row_hi;
    cp_async16(sK + r * kStride + cc * 8, k_row + cc * 8, ok && cc * 8 < d);
    cp_async16(sV + r * kStride + cc * 8, v_row + cc * 8, ok && cc * 8 < d_v);
  }
}

}  // namespace sinkattn::cuda

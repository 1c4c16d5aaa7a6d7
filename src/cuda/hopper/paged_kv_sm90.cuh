// CUDA backend, Hopper: the warp-specialised forward's K / V loads through a page table (paged KV, SPEC.md section
// 1: key j of sequence n is row j % page_size of page page_table[n, j / page_size] of the pools), into the same
// swizzled row panels as its contiguous loads (sm90_common.cuh), so the consumers' steps are unchanged:
//   - tma_load_paged_tile: a key block that lies in the sequence, by TMA from a tensor map of the pool
//     (d, rows in a page, h_kv, pages; launch.cuh, fwd_tma_maps) whose box is `rows` rows, rows = gcd(page_size,
//     block_n) >= 8 (dispatch.cpp): the block is block_n / rows chunks, each inside one page; lane c of the loading
//     warp looks up chunk c's page (paged_chunk, one key block ahead) and issues its boxes, so the lookups run side
//     by side (K and V have a loading warp each: fwd_sm90_ws.cuh). A chunk of a multiple of 8 rows starts at a
//     multiple of 1024 bytes of its panel: the 128-byte swizzle of its box is the one the whole block's box would
//     have;
//   - load_tile_sw_paged: by cp.async, one page lookup per row (a block reaching past the sequence's end, and every
//     block where the call has no tensor map): rows at or past rows_valid and columns past cols_valid are
//     zero-filled without being read (rows past len_kv must read as exact zeros: P = 0 there, and 0 * NaN would
//     reach the output), and so are their page-table entries (entries past ceil(seqused_kv[n] / page_size) are
//     never touched).
// The addressing is core/kv_rows.hpp's kv_row_index, the one every backend uses (32-bit indices here).
#pragma once

#include <cuda.h>

#include "core/kv_rows.hpp"
#include "cuda/common.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda::sm90 {

// Page and row in the page of key j of sequence n (paged calls).
__device__ __forceinline__ KvRowIndex paged_row(const Params& p, int n, int j) {
  return kv_row_index<int>(p.page_table, static_cast<int>(p.pt_st_n), static_cast<int>(p.pt_st_p), p.page_size, n, 0,
                           j, false);
}

// Where a chunk of a key block lies: its page and its first row in the page (32-bit: the loading warp runs on few
// registers).
struct PagedChunk {
  int page, row;
};

// Lane `lane` of the loading warp: where chunk `lane` (keys j0 + lane * rows ..) of a key block lies; lanes past the
// block's chunks read nothing.
__device__ __forceinline__ PagedChunk paged_chunk(const Params& p, int n, int j0, int rows, int chunks, int lane) {
  if (lane >= chunks) return {0, 0};
  const KvRowIndex at = paged_row(p, n, j0 + lane * rows);
  return {static_cast<int>(at.b), static_cast<int>(at.s)};
}

// A key block of BN rows, HD columns (panels of 64) into dst, completing `bar` (one arrival with the block's bytes
// by lane 0, then every chunk's boxes): lane c < chunks loads chunk c from `at` (its paged_chunk) of KV head hk.
template <int BN, int HD, typename T>
__device__ __forceinline__ void tma_load_paged_tile(T* dst, const void* tmap, PagedChunk at, int rows, int chunks,
                                                    int hk, uint64_t* bar, int lane) {
  if (lane == 0) mbar_arrive_expect_tx(bar, BN * HD * sizeof(T));
  __syncwarp();
  if (lane < chunks) {
#pragma unroll
    for (int c = 0; c < HD / 64; ++c)
      tma_load_4d(dst + c * BN * 64 + lane * rows * 64, tmap, c * 64, at.row, hk, at.page, bar);
  }
}

// load_tile_sw_rolled (sm90_common.cuh) through the page table: ROWS keys j0 .. of sequence n from the pool `pool`
// (row stride row_st, page stride page_st, head offset head_off in elements), the swizzled panels of COLS columns.
template <int ROWS, int COLS, typename T>
__device__ __forceinline__ void load_tile_sw_paged(T* smem, const T* pool, int64_t page_st, int64_t row_st,
                                                   int64_t head_off, const Params& p, int n, int j0, int rows_valid,
                                                   int cols_valid, int tid, int nthreads) {
  constexpr int kChunks = COLS / 8, kTotal = ROWS * kChunks;
  static_assert(COLS % 64 == 0, "whole panels");
  unsigned char* base = reinterpret_cast<unsigned char*>(smem);
#pragma unroll 1
  for (int idx = tid; idx < kTotal; idx += nthreads) {
    const int r = idx / kChunks, cc = idx % kChunks;
    const bool valid = r < rows_valid && cc * 8 < cols_valid;
    const KvRowIndex at = r < rows_valid ? paged_row(p, n, j0 + r) : KvRowIndex{0, 0};
    cp_async16(base + (cc / 8) * ROWS * 128 + r * 128 + (((cc % 8) ^ (r % 8)) * 16),
               valid ? pool + at.b * page_st + at.s * row_st + head_off + cc * 8 : pool, valid);
  }
}

}  // namespace sinkattn::cuda::sm90

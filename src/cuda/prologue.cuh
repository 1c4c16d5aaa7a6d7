// CUDA backend: the prologue every main kernel starts with, in one place: tile (scheduler.cuh) -> sequence n and head
// -> sequence bounds (common/seq.hpp) -> early exits (past the sequence's rows, padding rows) -> mask
// (common/mask.hpp) -> block range -> base pointers (common/rows.hpp).
//   QueryTile: forward (sm_80, sm_90) and dq kernels, one block per (query block, query head, sequence);
//   KeyTile:   dK dV kernels (sm_80, sm_90), one block per (key block, KV head, sequence).
// Key and value rows are addressed through kv_rows only, so a paged K / V layout (page_table) changes that one
// function.
#pragma once

#include "common/mask.hpp"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"
#include "cuda/scheduler.cuh"

namespace sinkattn::cuda {

template <int BM>
struct QueryTile {
  int h, n, hk;  // query head, sequence, KV head
  SeqInfo sq;
  int m0;        // first query row of the block (within the sequence)

  __device__ __forceinline__ QueryTile(const Params& p, const TileCoord& tc)
      : h(tc.head), n(tc.batch), hk(tc.head / p.group), sq(seq_info(p, tc.batch)), m0(tc.block * BM) {}
  // The block lies past the rows the sequence owns: nothing to write.
  __device__ __forceinline__ bool outside() const { return m0 >= sq.rows_q; }
  // The block is padding rows of a dense batch (rows [len_q, rows_q)): outputs get their fixed values.
  __device__ __forceinline__ bool padding() const { return m0 >= sq.len_q; }
  __device__ __forceinline__ int rows() const { return min(BM, sq.rows_q - m0); }
  // Key blocks [nb_lo, nb_hi) of BN keys that the block's rows see (not padding()).
  template <int BN>
  __device__ __forceinline__ void key_blocks(const Mask& mk, int& nb_lo, int& nb_hi) const {
    key_blocks_of_query_block<BN>(mk, m0, min(m0 + BM, sq.len_q), nb_lo, nb_hi);
  }
  // Row m0 of this head in a q / out / d_out / dq-like tensor; row 0 of the sequence's keys in k / v.
  template <typename T, typename V>
  __device__ __forceinline__ T* q_rows(V* base, const RowStrides3& st) const {
    return row_ptr<T>(base, st, n, sq.q_start + m0, h);
  }
  template <typename T, typename V>
  __device__ __forceinline__ T* kv_rows(V* base, const RowStrides3& st) const {
    return row_ptr<T>(base, st, n, sq.kv_start, hk);
  }
};

template <int BN>
struct KeyTile {
  int hk, n;  // KV head, sequence
  SeqInfo sq;
  int j0;     // first key of the block (within the sequence)

  __device__ __forceinline__ KeyTile(const Params& p, const TileCoord& tc)
      : hk(tc.head), n(tc.batch), sq(seq_info(p, tc.batch)), j0(tc.block * BN) {}
  __device__ __forceinline__ bool outside() const { return j0 >= sq.rows_kv; }
  __device__ __forceinline__ int rows() const { return min(BN, sq.rows_kv - j0); }
  // Query blocks qb_lo .. qb_lo + nq - 1 of BM rows that see some key of the block.
  template <int BM>
  __device__ __forceinline__ void query_blocks(const Mask& mk, int& qb_lo, int& nq) const {
    query_blocks_of_key_block<BM, BN>(mk, j0, qb_lo, nq);
  }
  // Row j0 of the block in a k / v / dk / dv-like tensor; row i0 of query head h in a q / d_out-like one.
  template <typename T, typename V>
  __device__ __forceinline__ T* kv_rows(V* base, const RowStrides3& st) const {
    return row_ptr<T>(base, st, n, sq.kv_start + j0, hk);
  }
  template <typename T, typename V>
  __device__ __forceinline__ T* q_rows(V* base, const RowStrides3& st, int h, int i0) const {
    return row_ptr<T>(base, st, n, sq.q_start + i0, h);
  }
};

}  // namespace sinkattn::cuda

// CUDA backend: the kernel-side description of one call (filled from sinkattn::Call by cuda_backend.cu),
// per-sequence bounds read from the device batch tensors, and the tile shapes of each kernel.
#pragma once

#include <cstdint>

#include "common/rows.hpp"
#include "common/seq.hpp"
#include "common/sink.hpp"
#include "core/kv_rows.hpp"
#include "cuda/tiles.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn::cuda {

// (batch, row, head) strides of a q/k/v-like tensor (common/rows.hpp: row_offset).
using RowStrides3 = sinkattn::RowStrides;

struct Params {
  // ---- tensors (device pointers; nullptr when the plan marks them absent) ----
  const void* q;
  const void* k;
  const void* v;
  void* out;            // forward: written; backward: read (D_i = dot(d_out_i, out_i), SPEC 3)
  float* softmax_lse;   // forward: written; backward: read
  const void* d_out;
  const float* d_lse;
  void* dq;
  void* dk;
  void* dv;
  float* d_sinks;
  const void* bias;
  void* d_bias;
  const float* sinks;
  int64_t sinks_stride;

  RowStrides3 q_st, k_st, v_st, out_st, dout_st, dq_st, dk_st, dv_st;
  int64_t lse_b, lse_h, lse_s;
  int64_t dlse_b, dlse_h, dlse_s;
  int64_t bias_b, bias_h, bias_i, bias_j;
  int64_t dbias_b, dbias_h, dbias_i, dbias_j;
  int bias_f32;     // bias / d_bias are fp32 (else the dtype of q)
  int bias_shape_b, bias_shape_h;  // 1 (broadcast) or b / h_q

  // ---- batch description (SPEC 1): int32 device tensors; the members of common/seq.hpp's BatchTensors ----
  const int* cu_seqlens_q;
  const int* cu_seqlens_kv;
  const int* seqused_kv;
  const int* seqlens_q;
  const int* seqlens_kv;
  int64_t cu_q_st, cu_kv_st, seqused_st, seqlens_q_st, seqlens_kv_st;
  int varlen;
  // ---- paged KV (SPEC 1): k, v are page pools, k_st / v_st = {page, row in page, head}; null when not paged ----
  const int* page_table;  // [b, max_pages]; entries past ceil(seqused_kv[n] / page_size) are never read
  int64_t pt_st_n, pt_st_p;
  int page_size;

  // ---- sizes ----
  int b, s_q, s_kv, h_q, h_kv, group, d, d_v;  // s_q / s_kv: dense extents or varlen max_seqlen
  int64_t rows_total_q;                        // rows of the per-row workspace arrays (b * s_q or total_q)
  int64_t rows_total_kv;                       // rows of k / v: b * s_kv (dense) or total_kv (varlen)

  // ---- options ----
  sinkattn_softmax_type_t softmax_type;
  float softmax_scale;
  float scale_log2;  // softmax_scale * log2(e)
  int window_left, window_right;  // < 0: unbounded
  int align_bottom_right;
  int dropout;
  uint32_t dropout_threshold;
  float dropout_rscale;  // 1 / (1 - p)
  const uint64_t* rng_in;  // forward: rng_seed_offset (may be null); backward: rng_state
  int64_t rng_in_stride;
  uint64_t seed, offset;   // used when rng_in is null

  // ---- workspace (forward, split-KV decode: decode/decode_kernel.cuh) ----
  int num_splits;      // key splits per row (1: no split, partials unused)
  float* ws_o_part;    // [num_splits][h_q][rows_total_q][d_v]: each split's normalised partial output
  float* ws_lse_part;  // [num_splits][h_q][rows_total_q]: each split's partial LSE (natural log; -inf: nothing)

  // ---- workspace (backward) ----
  float* ws_lse2;      // [h_q][rows_total_q]: LSE * log2(e), +inf for rows that see nothing / padding
  float* ws_dp;        // [h_q][rows_total_q]: D_i - d_lse_i
  float* ws_dsink;     // [h_q][b][n_pre_blocks]: per-block partial sums of d_sinks
  float* ws_dbias;     // [b][ws_dbias_heads][s_q][s_kv]: dS (fp32) of visited tiles (not cleared), reduced over
                       // the broadcast dims afterwards
  int ws_dbias_heads;  // h_q, or h_kv when the dK dV kernel sums each KV group's heads (KernelChoice::dbias_group_sum)
  float* ws_dq;        // [h_q][rows_total_q][d]: fp32 sum_j dS_ij k_j (the fused dq: atomics, or ordered)
  int n_pre_blocks;
  // Deterministic fused dq (DqPath::kFusedOrdered, dq_order.hpp): [0] the ticket counter, then one semaphore per
  // (sequence, KV head, query block of 64 rows); zeroed by the launch sequence before the dK dV kernel.
  unsigned* ws_dq_sem;
  // ---- tile order (scheduler.hpp): pairs per L2 section of the warp-specialised forward's tiles (0: one section);
  // KernelChoice::fwd_section, set by the backend's run (last: the other members keep their offsets) ----
  int fwd_section;
  // log2(dropout_rscale), for the sm90 dropout forward's scaled softmax (OnlineSoftmax::step_scaled; last, as above)
  float dropout_log2_rscale;
  // page_size as a FastDivmod (core/kv_rows.hpp): paged_kv.cuh's KvRows splits key indices into page and row with it
  // (last, as above)
  FastDivmod page_div;
  // group and num_splits as FastDivmods: the decode kernel splits packed rows into (query row, head of the group)
  // and its block index into (block of rows, split) with them, a multiply-high each instead of a division (last, as
  // above)
  FastDivmod group_div, splits_div;
  // 1: the decode kernel's num_splits blocks of a (block of rows, KV head, sequence) are one thread-block cluster
  // that combines the splits in its shared memory (no ws_o_part / ws_lse_part, no combine kernel; last, as above)
  int decode_cluster;
  // KernelChoice::dq_first_store: the dK dV kernel's block height (dkdv_block_m); the preprocess then zeroes only the
  // ws_dq rows of query blocks that no key block sees (every other row is stored by its first key block before any
  // add). 0: the preprocess zeroes every row. (last, as above)
  int dq_store_block_m;
};

// One sequence's place in the tensors (SPEC 1, DESIGN.md "Actual lengths"; common/seq.hpp).
using SeqInfo = SeqSpan<int>;

__device__ __forceinline__ SeqInfo seq_info(const Params& p, int n) { return seq_span<int>(p, n); }

// sigma of SPEC 2 for query head h (common/sink.hpp).
__device__ __forceinline__ float sink_value(const Params& p, int h) {
  return sink_sigma(p.softmax_type, p.sinks, p.sinks_stride, h);
}

// Element offset of (n, global row, head h) of a q/k/v-like tensor (common/rows.hpp), and the row pointer.
template <typename T, typename V>
__device__ __forceinline__ T* row_ptr(V* base, const RowStrides3& st, int n, int64_t row, int h) {
  return static_cast<T*>(base) + row_offset(st, n, row, h);
}

// Index of the per-row workspace arrays for (n, i).
__device__ __forceinline__ int64_t ws_row(const Params& p, const SeqInfo& s, int n, int i) {
  return p.varlen ? s.q_start + i : static_cast<int64_t>(n) * p.s_q + i;
}

// Row i of sequence n, head h, of the fp32 dq accumulator ws_dq ([h_q][rows_total_q][d]): the one address every
// path's adds (atomics, the Hopper writer), zeroing (preprocess) and conversion (dq_convert) use.
__device__ __forceinline__ float* ws_dq_row(const Params& p, const SeqInfo& s, int n, int h, int i) {
  return p.ws_dq + (h * p.rows_total_q + ws_row(p, s, n, i)) * p.d;
}

// ---- tile shapes ----
// Forward: 4 warps; each warp owns kMT x 16 query rows (kMT = 2 up to head dim 128, as FlashAttention-2's
// 128 x 64 tiles: every K / V fragment loaded from shared memory feeds two m-tiles); BLOCK_N keys per step.
template <int HD>
struct FwdTraits {
  static constexpr int kWarps = 4;
  static constexpr int kMT = tiles::fwd_m_tiles(HD);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kMT * kWarps;
  static_assert(kBlockM == tiles::fwd_block_m(HD), "tiles.hpp");
  // 32 above 64 (the S tile fits beside a 32-row O accumulator), except the head-dim-128 variant without bias /
  // dropout, which launch.cuh runs with tiles::fwd_block_n_lean = 64 (measured faster despite a few spills).
  static constexpr int kBlockN = tiles::fwd_block_n(HD);
  static constexpr int kStride = HD + 8;
  static constexpr int kMinBlocks = HD == 64 ? 3 : (HD <= 128 ? 2 : 1);  // __launch_bounds__ min blocks per SM
  // Q + double-buffered K and V
  static constexpr int kSmem = (kBlockM + 4 * kBlockN) * kStride * 2;
};

template <int HD>
struct DqTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = 16 * kWarps;
  static_assert(kBlockM == tiles::dq_block_m(HD), "tiles.hpp");
  static constexpr int kBlockN = tiles::dq_block_n(HD);
  static constexpr int kStride = HD + 8;
  // Q, dO + double-buffered K and V
  static constexpr int kSmem = (2 * kBlockM + 4 * kBlockN) * kStride * 2;
};

// dK/dV kernel: one warp owns 16 keys (8 warps = 128 keys up to head dim 128); BLOCK_M query rows per step
// (double-buffered Q, dO, LSE, D). With a dq accumulator (non-deterministic mode) dS of the step is staged in
// shared memory (sdS [BLOCK_N keys][BLOCK_M + 8]) and dQ += dS K is added to the fp32 accumulator with atomics.
template <int HD>
struct DkvTraits {
  static constexpr int kWarps = tiles::dkdv_warps(HD);
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = 16 * kWarps;
  static_assert(kBlockN == tiles::dkdv_block_n(HD), "tiles.hpp");
  static constexpr int kBlockM = tiles::dkdv_block_m(HD);
  static constexpr int kStride = HD + 8;
  static constexpr int kStrideS = kBlockM + 8;  // sdS row stride (elements)
  // dS as two terms (tiles::bwd_split_ds): the staged dS^T of the fused dq twice, its hi and lo terms.
  static constexpr bool kSplitDS = tiles::bwd_split_ds(HD);
  static constexpr int kSmem = (2 * kBlockN + 4 * kBlockM) * kStride * 2 + 4 * kBlockM * 4 +
                               (kSplitDS ? 2 : 1) * kBlockN * kStrideS * 2;
};

}  // namespace sinkattn::cuda

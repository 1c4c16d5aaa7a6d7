// The validated, resolved description of one attention call, shared by every backend.
//
// sinkattn_params_t (the C ABI struct) is checked once at the boundary by `resolve_call` (validate.cpp);
// backends only ever see a `Call`, in which every size is resolved, every optional tensor is known to be
// present or absent, and every strided tensor is reduced to (batch, row, head) strides in elements.
// SPEC.md sections 1-4.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/kv_rows.hpp"
#include "common/mask.hpp"
#include "common/rows.hpp"
#include "common/seq.hpp"
#include "common/sink.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn {

enum class Pass { kForward, kBackward };

enum class Memory { kHost, kDevice };

// Which optional tensors a call has and uses. ONE function (`decide_tensors`, validate.cpp) computes it, from
// the options alone, and both the forward and the backward validate and run against it.
enum class Use { kAbsent, kRequired };
struct TensorPlan {
  Use sinks = Use::kAbsent;       // learnable
  Use bias = Use::kAbsent;        // caller gave a bias
  Use d_bias = Use::kAbsent;      // backward with bias
  Use d_sinks = Use::kAbsent;     // backward, learnable
  Use d_lse = Use::kAbsent;       // backward, caller gave d_lse
  Use rng_state = Use::kAbsent;   // backward with dropout (read); forward: written if given
  bool varlen = false;            // cu_seqlens_q / cu_seqlens_kv
  bool seqused_kv = false;        // varlen, or any call with a page table (required there)
  bool seqlens_q = false;         // dense only
  bool seqlens_kv = false;        // dense only
  bool dropout = false;           // dropout_p > 0
  bool page_table = false;        // paged KV (SPEC.md section 1): k, v are page pools; forward only
};

// Paged KV (SPEC.md section 1): k [num_pages, page_size, h_kv, d], v [num_pages, page_size, h_kv, d_v],
// page_table int32 [b, max_pages]; key j < seqused_kv[n] of sequence n is row j % page_size of page
// page_table[n, j / page_size]. With `on`, Call::k / Call::v hold the (page, row-in-page, head) strides.
struct PagedKv {
  bool on = false;
  int64_t page_size = 0, num_pages = 0, max_pages = 0;
  int64_t pt_n = 0, pt_p = 0;  // page_table strides (sequence, page) in elements
  int64_t capacity() const { return max_pages * page_size; }  // keys a sequence can hold
};

// RowStrides: (batch, row, head) strides in elements of a q/k/v/out-like tensor (common/rows.hpp). For varlen
// inputs `b` is 0 and rows are global token indices (the sequence's first row is cu_seqlens[n]).

// Strides of softmax_lse / d_lse: dense [b, h_q, s_q], varlen [h_q, total_q] (b = 0, rows global).
struct LseStrides {
  int64_t b = 0, h = 0, s = 0;
};

// Strides of bias / d_bias [b|1, h_q|1, s_q, s_kv]: a broadcast dimension has stride 0.
struct BiasStrides {
  int64_t b = 0, h = 0, i = 0, j = 0;
};

struct Call {
  const sinkattn_params_t* p = nullptr;  // the caller's struct (data pointers)
  Pass pass = Pass::kForward;
  Memory memory = Memory::kHost;
  TensorPlan plan;

  sinkattn_dtype_t dtype = SINKATTN_F32;  // of q, k, v, out, d_out, dq, dk, dv
  sinkattn_dtype_t bias_dtype = SINKATTN_F32;

  // Sizes. Dense: s_q, s_kv are the tensor extents. Varlen: max_seqlen_q / max_seqlen_kv, and
  // total_q / total_kv are the packed row counts.
  int64_t b = 0, s_q = 0, s_kv = 0, h_q = 0, h_kv = 0, d = 0, d_v = 0;
  int64_t total_q = 0, total_kv = 0;
  int64_t group = 1;  // h_q / h_kv

  sinkattn_softmax_type_t softmax_type = SINKATTN_SOFTMAX_VANILLA;
  float softmax_scale = 0.f;  // resolved (default 1/sqrt(d))
  int64_t window_left = -1, window_right = -1;  // -1 = unbounded; clamped to s_q + s_kv (common/mask.hpp)
  sinkattn_mask_alignment_t alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
  double dropout_p = 0.0;
  uint32_t dropout_threshold = 0;  // min(floor(p * 2^32), 2^32 - 1)
  bool deterministic = false;

  RowStrides q, k, v, out, d_out, dq, dk, dv;  // paged: k, v are {page, row in page, head} strides
  LseStrides lse, d_lse;
  BiasStrides bias, d_bias;
  bool bias_per_head = false;  // bias (and d_bias) has h_q heads, not 1 (broadcast over the heads)
  PagedKv paged;
  int32_t num_splits = 0;  // forward: 0 heuristic, 1 no split, N > 1 at most N key splits per row

  // Actual lengths of sequence n need the batch tensors (host or device); backends read them themselves
  // (`seq_bounds` below for host memory).
  bool causal() const { return window_right == 0; }
};

// The call's batch description (common/seq.hpp): its batch tensors' data pointers (in the memory the call's
// tensors are in) and strides, and the extents (validate.cpp). Every backend reads the per-sequence bounds through
// it: host memory with host_seq_bounds, the kernels with their copy of it.
BatchTensors batch_tensors(const Call& c);

// Per-sequence bounds for host-memory calls (SPEC.md section 1): row offsets, rows owned, actual lengths.
using SeqBounds = SeqSpan<int64_t>;
inline SeqBounds host_seq_bounds(const Call& c, int64_t n) { return seq_span<int64_t>(batch_tensors(c), n); }

// The mask of sequence n (SPEC.md section 2; common/mask.hpp) for its actual lengths.
inline BandMask<int64_t> host_mask(const Call& c, int64_t len_q, int64_t len_kv) {
  return BandMask<int64_t>(c.alignment == SINKATTN_ALIGN_BOTTOM_RIGHT, c.window_left, c.window_right, len_q, len_kv);
}

// kv_row_index for a host-memory call (reads the page table of paged calls).
inline KvRowIndex host_kv_row(const Call& c, const SeqBounds& s, int64_t n, int64_t j) {
  const int32_t* pt = c.paged.on ? static_cast<const int32_t*>(c.p->page_table.data) : nullptr;
  return kv_row_index<int64_t>(pt, c.paged.pt_n, c.paged.pt_p, c.paged.page_size, n, s.kv_start, j, c.plan.varlen);
}

// First and one-past-last visible key of query row i (within its sequence), SPEC.md section 2, masks.
// Returns an empty range (lo >= hi) when nothing is visible.
struct KeyRange {
  int64_t lo, hi;
};
inline KeyRange visible_keys(const Call& c, int64_t i, int64_t len_q, int64_t len_kv) {
  KeyRange r;
  host_mask(c, len_q, len_kv).key_range(i, i + 1, r.lo, r.hi);
  return r;
}

// sigma of SPEC.md section 2 for query head h (host memory sinks; common/sink.hpp).
inline float host_sink(const Call& c, int64_t h) {
  const sinkattn_tensor_t& s = c.p->sinks;
  return sink_sigma(c.softmax_type, static_cast<const float*>(s.data), s.strides[0], h);
}

}  // namespace sinkattn

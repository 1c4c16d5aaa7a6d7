// Per-sequence bounds of SPEC.md section 1 (DESIGN.md "Actual lengths") as every path reads them (CPU backend, CUDA
// kernels, CUDA fp32 path): one definition.
//   dense:  q_start = kv_start = 0, rows_q = s_q, rows_kv = s_kv,
//           len_q = seqlens_q ? seqlens_q[n] : s_q,  len_kv = seqlens_kv ? seqlens_kv[n] : s_kv;
//   varlen: q_start = cu_seqlens_q[n], kv_start = cu_seqlens_kv[n], rows_* = cu_seqlens_*[n + 1] - cu_seqlens_*[n],
//           len_q = rows_q, len_kv = seqused_kv ? seqused_kv[n] : rows_kv;
//   paged KV (a page table; dense or varlen q): kv_start = 0, len_kv = rows_kv = seqused_kv[n] (the keys in the
//           sequence's pages, capped by s_kv = max_pages * page_size); no cu_seqlens_kv.
// The given lengths are capped by the rows they index (min), as the CUDA kernels always did; validation
// (core/validate.cpp) has already refused batch tensors outside these bounds whenever it could read them.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn {

// The int32 batch tensors of a call (pointers in the memory the reader runs in; absent ones are nullptr), their
// element strides, and the extents s_q, s_kv (dense: the tensor extents; varlen: max_seqlen_q / max_seqlen_kv).
// cuda::Params and cuda_f32::KParams carry the same members under the same names, so seq_span reads all three.
struct BatchTensors {
  int64_t s_q = 0, s_kv = 0;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_kv = nullptr;
  const int32_t* seqused_kv = nullptr;
  const int32_t* seqlens_q = nullptr;
  const int32_t* seqlens_kv = nullptr;
  int64_t cu_q_st = 0, cu_kv_st = 0, seqused_st = 0, seqlens_q_st = 0, seqlens_kv_st = 0;
  int varlen = 0;
  const int32_t* page_table = nullptr;  // paged KV: only whether there is one matters here (core/kv_rows.hpp reads it)
};

// One sequence's place in the tensors. I: int in the CUDA kernels, int64_t elsewhere.
template <typename I>
struct SeqSpan {
  int64_t q_start, kv_start;  // first global row (varlen) or 0 (dense)
  I len_q, len_kv;            // actual query rows / keys used
  I rows_q, rows_kv;          // rows the sequence owns in q/out/dq and k/v/dk/dv (dense: s_q, s_kv)
};

// Bounds of sequence n; B has the members of BatchTensors.
template <typename I, typename B>
SINKATTN_HD SeqSpan<I> seq_span(const B& bt, I n) {
  SeqSpan<I> s;
  if (bt.varlen) {
    const I q0 = bt.cu_seqlens_q[n * bt.cu_q_st], q1 = bt.cu_seqlens_q[(n + 1) * bt.cu_q_st];
    s.q_start = q0;
    s.len_q = q1 - q0;
    s.rows_q = s.len_q;
    if (bt.page_table == nullptr) {
      const I k0 = bt.cu_seqlens_kv[n * bt.cu_kv_st], k1 = bt.cu_seqlens_kv[(n + 1) * bt.cu_kv_st];
      s.kv_start = k0;
      s.rows_kv = k1 - k0;
      s.len_kv = bt.seqused_kv ? hd_min(static_cast<I>(bt.seqused_kv[n * bt.seqused_st]), s.rows_kv) : s.rows_kv;
    }
  } else {
    s.q_start = 0;
    s.kv_start = 0;
    s.rows_q = static_cast<I>(bt.s_q);
    s.rows_kv = static_cast<I>(bt.s_kv);
    s.len_q = bt.seqlens_q ? hd_min(static_cast<I>(bt.seqlens_q[n * bt.seqlens_q_st]), static_cast<I>(bt.s_q))
                           : static_cast<I>(bt.s_q);
    s.len_kv = bt.seqlens_kv ? hd_min(static_cast<I>(bt.seqlens_kv[n * bt.seqlens_kv_st]), static_cast<I>(bt.s_kv))
                             : static_cast<I>(bt.s_kv);
  }
  if (bt.page_table != nullptr) {  // paged KV: the sequence's keys are the first seqused_kv[n] rows of its pages
    s.kv_start = 0;
    s.len_kv = s.rows_kv = hd_min(static_cast<I>(bt.seqused_kv[n * bt.seqused_st]), static_cast<I>(bt.s_kv));
  }
  return s;
}

// The same bounds held inside the extents a grid covers: rows in [0, s_q] / [0, s_kv], lengths in [0, rows]. The
// fp32 path applies it so that a call breaking the max_seqlen contract (batch tensors that validation could not
// read, e.g. under graph capture) cannot index outside what it launched for.
template <typename I>
SINKATTN_HD SeqSpan<I> clamp_to_extents(SeqSpan<I> s, I s_q, I s_kv) {
  const auto clamp = [](I x, I hi) { return x < 0 ? I(0) : (x > hi ? hi : x); };
  s.rows_q = clamp(s.rows_q, s_q);
  s.rows_kv = clamp(s.rows_kv, s_kv);
  s.len_q = clamp(s.len_q, s.rows_q);
  s.len_kv = clamp(s.len_kv, s.rows_kv);
  return s;
}

}  // namespace sinkattn

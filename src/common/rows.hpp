// Row addressing (DESIGN.md "Row addressing") as every path uses it: one definition.
// A q / k / v / out / d_out / dq / dk / dv-like tensor is reduced (core/validate.cpp) to (batch, row, head) strides in
// elements; element (n, global row r, head h, column c) is at  n * b + r * s + h * h + c,  where the global row of row
// i of sequence n is first_row + i (first_row = cu_seqlens[n] for varlen, whose batch stride is 0; 0 for dense).
// Key rows go through the same function with the sequence's kv_start; a paged K / V layout would map key j of
// sequence n to (page, row in page) here, in one place (page * b + (j % page_size) * s + h * h).
// The LSE-like tensors (softmax_lse, d_lse: [b, h_q, s_q] dense, [h_q, total_q] varlen) use lse_offset.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn {

// (batch, row, head) strides in elements of a q/k/v/out-like tensor. For varlen inputs `b` is 0 and rows are
// global token indices.
struct RowStrides {
  int64_t b = 0, s = 0, h = 0;
};

SINKATTN_HD int64_t row_offset(const RowStrides& st, int64_t n, int64_t row, int64_t h) {
  return n * st.b + row * st.s + h * st.h;
}

// Element (n, head h, global row) of softmax_lse / d_lse with strides (b, h, s).
SINKATTN_HD int64_t lse_offset(int64_t sb, int64_t sh, int64_t ss, int64_t n, int64_t h, int64_t row) {
  return n * sb + h * sh + row * ss;
}

}  // namespace sinkattn

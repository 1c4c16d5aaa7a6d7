// Rows of packed (varlen) tensors that belong to no sequence (SPEC.md section 1): q / out / dq / softmax_lse rows
// from cu_seqlens_q[b] on, k / v / dk / dv rows from cu_seqlens_kv[b] on. No backend reads or writes them; a binding
// that allocates the outputs itself fills them through sinkattn_clear_unowned_rows (out = dq = dk = dv = 0,
// softmax_lse = -inf), so every binding returns the same values there. This header describes one such fill, the
// same on the host (api.cpp) and in the CUDA kernel (src/cuda/unowned_rows.cu).
#pragma once

#include <cmath>
#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn {

// Rows [*first_row, rows) x heads x cols of a strided tensor (strides in elements), filled with zeros
// (elem_bytes 2 or 4) or with -inf (fp32, softmax_lse). first_row points at cu_seqlens[b] (host or device memory,
// the memory of the tensors).
struct UnownedRegion {
  void* data = nullptr;
  const int32_t* first_row = nullptr;
  int64_t rows = 0, heads = 0, cols = 0;
  int64_t row_stride = 0, head_stride = 0;
  int elem_bytes = 2;
  bool minus_inf = false;  // softmax_lse: -inf instead of 0
};

// Element e of the (row - first) * heads * cols + head * cols + col enumeration of the region's unowned part.
SINKATTN_HD void fill_unowned_element(const UnownedRegion& r, int64_t first, int64_t e) {
  const int64_t col = e % r.cols, head = (e / r.cols) % r.heads, row = first + e / (r.cols * r.heads);
  char* p = static_cast<char*>(r.data) + (row * r.row_stride + head * r.head_stride + col) * r.elem_bytes;
  if (r.minus_inf) {
    *reinterpret_cast<float*>(p) = -INFINITY;
  } else if (r.elem_bytes == 4) {
    *reinterpret_cast<uint32_t*>(p) = 0u;
  } else {
    *reinterpret_cast<uint16_t*>(p) = 0u;
  }
}

// Number of elements to fill (0 when cu_seqlens[b] covers every row).
SINKATTN_HD int64_t unowned_elements(const UnownedRegion& r, int64_t first) {
  return first < r.rows ? (r.rows - first) * r.heads * r.cols : 0;
}

}  // namespace sinkattn

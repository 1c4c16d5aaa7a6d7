// KV row addressing (DESIGN.md "Row addressing", SPEC.md section 1), the one definition shared by the host code
// (core/call.hpp: host_kv_row) and the CUDA kernels (cuda/paged_kv.cuh). No dependencies, so device code can
// include it.
#pragma once

#include <cstdint>

namespace sinkattn {

// Where key j of sequence n lives in k / v: index of the first dimension (`b`: batch n for dense, 0 for varlen,
// the page for paged) and the row in it (`s`), so that element (n, j, head h, col c) of k is
// k_ptr[b * c.k.b + s * c.k.s + h * c.k.h + c]. The one definition of KV row addressing (DESIGN.md "Row
// addressing"), shared by the backends: `kv_start` is the sequence's first packed row (varlen, else 0) and
// `page_table` the int32 table (paged calls only), read with the strides of PagedKv.
struct KvRowIndex {
  int64_t b, s;
};
#if defined(__CUDACC__)
#define SINKATTN_KV_HD __host__ __device__ __forceinline__
#else
#define SINKATTN_KV_HD inline
#endif
// I: the index type (int64_t on the host; int in the CUDA kernels, where a 64-bit division is slow).
template <typename I>
SINKATTN_KV_HD KvRowIndex kv_row_index(const int32_t* page_table, I pt_n, I pt_p, I page_size, I n, I kv_start, I j,
                                       bool varlen) {
  if (page_table != nullptr) return {page_table[n * pt_n + (j / page_size) * pt_p], j % page_size};
  return {varlen ? 0 : n, kv_start + j};
}

}  // namespace sinkattn

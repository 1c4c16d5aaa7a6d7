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
// Key j = page_no * page_size + row of a paged sequence n: entry page_no of its page-table row.
template <typename I>
SINKATTN_KV_HD KvRowIndex kv_paged_row(const int32_t* page_table, I pt_n, I pt_p, I n, I page_no, I row) {
  return {page_table[n * pt_n + page_no * pt_p], row};
}

// I: the index type (int64_t on the host; int in the CUDA kernels, where a 64-bit division is slow).
template <typename I>
SINKATTN_KV_HD KvRowIndex kv_row_index(const int32_t* page_table, I pt_n, I pt_p, I page_size, I n, I kv_start, I j,
                                       bool varlen) {
  if (page_table != nullptr) return kv_paged_row<I>(page_table, pt_n, pt_p, n, j / page_size, j % page_size);
  return {varlen ? 0 : n, kv_start + j};
}

// x / d for 0 <= x < 2^31 and a divisor 1 <= d < 2^31 fixed ahead (a kernel's page_size): a multiply-high, an add
// and a shift instead of a division (Granlund and Montgomery's method: shift = ceil(log2 d),
// mul = floor(2^32 (2^shift - d) / d) + 1 < 2^32, x / d = (mulhi(x, mul) + x) >> shift, exact for x < 2^32; the
// 32-bit add does not overflow for x < 2^31). Built on the host, read by the kernels from their parameters.
struct FastDivmod {
  uint32_t d = 1, mul = 1, shift = 0;  // default: d = 1
  FastDivmod() = default;
  explicit FastDivmod(uint32_t divisor) : d(divisor), mul(1), shift(0) {
    while ((uint64_t{1} << shift) < d) ++shift;
    mul = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << shift) - d)) / d + 1);
  }
  SINKATTN_KV_HD uint32_t div(uint32_t x) const {
#if defined(__CUDA_ARCH__)
    const uint32_t hi = __umulhi(x, mul);
#else
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(x) * mul) >> 32);
#endif
    return (hi + x) >> shift;
  }
};

}  // namespace sinkattn

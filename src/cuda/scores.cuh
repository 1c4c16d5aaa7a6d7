// CUDA backend: from raw Q.K products to base-2 logits, SPEC.md section 2:
//   S_ij = softmax_scale * dot(q_i, k_j) + bias_ij;  S_ij = -inf where the mask excludes (i, j)
// kept as x_ij = S_ij * log2(e). The bias is read only for visible (i, j) inside the sequence, so it is never
// read out of bounds and masked positions never contribute (even a NaN bias).
// Fragment element (nt, e) of a warp's 16 x (NT * 8) tile is (row g + 8 * (e >= 2), col nt * 8 + 2t + (e & 1)).
// Rows are queries and columns keys, or the transpose (dK dV kernel: rows are keys).
#pragma once

#include "cuda/common.cuh"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

template <typename T>
__device__ __forceinline__ float bias_at(const Params& p, int n, int h, int i, int j) {
  const int64_t off = n * p.bias_b + h * p.bias_h + i * p.bias_i + j * p.bias_j;
  if (p.bias_f32) return static_cast<const float*>(p.bias)[off];
  return ElemTraits<T>::to_float(static_cast<const T*>(p.bias)[off]);
}

// kMayBias = false: the caller's kernel variant has no bias (compiled out of the common path).
template <typename T, int NT, bool kTransposed, bool kMayBias = true>
__device__ __forceinline__ void make_logits(float (&s)[NT][4], const Params& p, const Mask& mk, bool need_mask, int n,
                                            int h, int row0, int col0, int lane) {
  const int g = lane >> 2, t = lane & 3;
  const bool has_bias = kMayBias && p.bias != nullptr;
  if (!need_mask && !has_bias) {  // common path (interior tile, no bias): branch-free scaling only
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= p.scale_log2;
    return;
  }
  if (!has_bias) {
    // Edge tile without bias: each of the thread's two fragment rows sees one contiguous column range
    // [lo, hi) (the mask of SPEC 2 is a band, common/mask.hpp), computed once per row in 64 bits; then two
    // compares per element.
    int lo[2], hi[2];
    const BandMask<int64_t> wide(mk);
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t r = row0 + g + 8 * rr;
      int64_t a = 0, b = 0;
      if (!kTransposed && r < mk.len_q) wide.key_range(r, r + 1, a, b);         // row = query i: its keys
      else if (kTransposed && r < mk.len_kv) wide.query_range(r, r + 1, a, b);  // row = key j: its queries
      lo[rr] = static_cast<int>(a);
      hi[rr] = static_cast<int>(b);
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int c = col0 + nt * 8 + 2 * t + (e & 1);
        const int rr = e >> 1;
        s[nt][e] = (c >= lo[rr] && c < hi[rr]) ? s[nt][e] * p.scale_log2 : -INFINITY;
      }
    return;
  }
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = row0 + g + ((e & 2) ? 8 : 0);
      const int c = col0 + nt * 8 + 2 * t + (e & 1);
      const int i = kTransposed ? c : r;
      const int j = kTransposed ? r : c;
      float x = s[nt][e] * p.scale_log2;
      const bool vis = mk.visible(i, j) && i < mk.len_q;
      if (!vis) {
        x = -INFINITY;
      } else if (has_bias) {
        x += bias_at<T>(p, n, h, i, j) * kLog2e;
      }
      s[nt][e] = x;
    }
  }
}

}  // namespace sinkattn::cuda

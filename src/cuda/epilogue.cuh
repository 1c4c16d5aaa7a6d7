// CUDA backend: epilogue. Writes a warp's 16 x (NT * 8) fp32 accumulator fragment (C layout of
// common.cuh) to a strided global tensor in the input dtype, with a per-row factor (1 / l for out,
// softmax_scale for dq / dk). Rows >= rows_valid and columns >= cols_valid (a multiple of 8) are not written.
#pragma once

#include "cuda/common.cuh"

namespace sinkattn::cuda {

template <typename T, int NT>
__device__ __forceinline__ void store_fragment(T* base, int64_t row_stride, int rows_valid, int cols_valid,
                                               const float (&acc)[NT][4], float f0, float f8, int lane) {
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int col = nt * 8 + 2 * t;
    if (nt * 8 >= cols_valid) break;
    if (g < rows_valid) {
      *reinterpret_cast<uint32_t*>(base + g * row_stride + col) =
          ElemTraits<T>::pack(acc[nt][0] * f0, acc[nt][1] * f0);
    }
    if (g + 8 < rows_valid) {
      *reinterpret_cast<uint32_t*>(base + (g + 8) * row_stride + col) =
          ElemTraits<T>::pack(acc[nt][2] * f8, acc[nt][3] * f8);
    }
  }
}

// Writes zeros to rows [0, rows) x cols [0, cols) of a strided tensor (padding rows, SPEC 2-3).
template <typename T>
__device__ __forceinline__ void zero_rows(T* base, int64_t row_stride, int rows, int cols, int tid, int nthreads) {
  const int chunks = cols / 2;
  for (int idx = tid; idx < rows * chunks; idx += nthreads) {
    const int r = idx / chunks, c = idx % chunks;
    *reinterpret_cast<uint32_t*>(base + r * row_stride + 2 * c) = 0u;
  }
}

}  // namespace sinkattn::cuda

// CUDA backend: epilogue. Writes a warp's 16 x (NT * 8) fp32 accumulator fragment (C layout of
// common.cuh) to a strided global tensor in the input dtype, with a per-row factor (1 / l for out,
// softmax_scale for dq / dk). Rows >= rows_valid and columns >= cols_valid (a multiple of 8) are not written.
// Also the forward's row stores (out and softmax_lse), shared by fwd_kernel.cuh and hopper/fwd_sm90_ws.cuh.
#pragma once

#include "cuda/common.cuh"
#include "cuda/params.cuh"
#include "cuda/softmax.cuh"

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

// Forward (SPEC 2), a block of `rows` query rows starting at row m0 that lies wholly in the padding of a dense
// batch: out = 0 (`out` points at row m0) and softmax_lse = sigma, the LSE of a row that sees no key (the sink's
// logit, or -inf without a sink).
template <typename T>
__device__ __forceinline__ void fwd_store_padding_rows(const Params& p, const SeqInfo& sq, int n, int h, T* out,
                                                       int m0, int rows, float sigma, int tid, int nthreads) {
  zero_rows(out, p.out_st.s, rows, p.d_v, tid, nthreads);
  for (int r = tid; r < rows; r += nthreads)
    p.softmax_lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, sq.q_start + m0 + r)] = sigma;
}

// Forward (SPEC 2), a warp's 16 query rows starting at row row0 of the sequence (`out` points at row row0):
// out_i = O_i / l_i and softmax_lse_i = (m_i + log2 l_i) ln 2 from the online-softmax state; rows past len_q
// (padding of a dense batch) get out = 0, and rows past the sequence's rows are not written. kScaledP: the row state
// came from OnlineSoftmax::init / step_scaled with rscale = 1 / (1 - p) (the dropout forward of sm90).
template <typename T, bool kScaledP = false, int NO, int NT>
__device__ __forceinline__ void fwd_store_rows(const Params& p, const SeqInfo& sq, int n, int h, T* out, int row0,
                                               const OnlineSoftmax<NT>& sm, const float (&acc)[NO][4], int lane) {
  const int g = lane >> 2;
  float inv0, inv8, lse0, lse8;
  const float sigma = sink_value(p, h);
  const float rscale = kScaledP ? p.dropout_rscale : 1.f;
  sm.finalize(0, sigma, inv0, lse0, rscale);
  sm.finalize(1, sigma, inv8, lse8, rscale);
  const int rows_valid = sq.rows_q - row0;
  if (row0 + g >= sq.len_q) inv0 = 0.f;
  if (row0 + g + 8 >= sq.len_q) inv8 = 0.f;
  store_fragment<T, NO>(out, p.out_st.s, rows_valid, p.d_v, acc, inv0, inv8, lane);
  if ((lane & 3) == 0) {
    if (g < rows_valid) p.softmax_lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, sq.q_start + row0 + g)] = lse0;
    if (g + 8 < rows_valid)
      p.softmax_lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, sq.q_start + row0 + g + 8)] = lse8;
  }
}

}  // namespace sinkattn::cuda

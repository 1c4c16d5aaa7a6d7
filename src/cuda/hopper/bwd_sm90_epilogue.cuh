// CUDA backend, Hopper: the epilogue of both dK dV kernels (SPEC.md section 3; bwd_dkdv_sm90.cuh,
// bwd_dkdv_sm90_wide.cuh): dK = softmax_scale * sum_i dS^T_ji q_i and dV from the fp32 accumulators, rounded to the
// output dtype (epilogue.cuh, store_fragment: rows past the block's keys and columns past d / d_v are not written).
// The dq of the block went to ws_dq during the steps (bwd_sm90_dq.cuh); the dq convert scales and rounds it.
#pragma once

#include "cuda/epilogue.cuh"
#include "cuda/params.cuh"
#include "cuda/prologue.cuh"

namespace sinkattn::cuda::sm90 {

// A warp's 16 rows of dK and dV (rows r .. r + 15 of the key tile; columns c0 + 8 nt + 2 t, + 1 of the fragments).
template <typename T, int NO, int BN>
__device__ __forceinline__ void store_dkdv(const Params& p, const KeyTile<BN>& kt, int r, int c0,
                                           const float (&acc_dk)[NO][4], const float (&acc_dv)[NO][4], int lane) {
  T* dk = kt.template kv_rows<T>(p.dk, p.dk_st);
  T* dv = kt.template kv_rows<T>(p.dv, p.dv_st);
  const int rows_valid = kt.rows() - r;
  store_fragment<T, NO>(dk + r * p.dk_st.s + c0, p.dk_st.s, rows_valid, p.d - c0, acc_dk, p.softmax_scale,
                        p.softmax_scale, lane);
  store_fragment<T, NO>(dv + r * p.dv_st.s + c0, p.dv_st.s, rows_valid, p.d_v - c0, acc_dv, 1.f, 1.f, lane);
}

}  // namespace sinkattn::cuda::sm90

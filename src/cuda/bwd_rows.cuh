// CUDA backend: pieces shared by the two dK dV kernels (bwd_kernel.cuh on mma.sync, hopper/bwd_dkdv_sm90.cuh on
// wgmma), SPEC.md section 3: the per-row inputs of a query block (LSE2 = LSE * log2(e) and D - d_lse, written by
// the preprocess pass: Params::ws_lse2, ws_dp) prefetched into registers.
#pragma once

#include "cuda/mask.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

// LSE2 and D - d_lse of rows i0 + tid (tid < BM) of query head h: load() reads them from the workspace into
// registers when a step's tiles are issued, store() puts them in shared memory (sL, sD: [2][BM]) once the buffer
// is free, so no warp waits on their global latency. Rows past len_q get LSE2 = +inf (P = 0) and D = 0.
template <int BM>
struct RowStatsPrefetch {
  float l2 = INFINITY, d = 0.f;
  __device__ __forceinline__ void load(const Params& p, const SeqInfo& sq, int n, int h, int i0, int tid) {
    l2 = INFINITY;
    d = 0.f;
    if (tid < BM && i0 + tid < sq.len_q) {
      const int64_t wr = h * p.rows_total_q + ws_row(p, sq, n, i0 + tid);
      l2 = p.ws_lse2[wr];
      d = p.ws_dp[wr];
    }
  }
  __device__ __forceinline__ void store(float* sL, float* sD, int buf, int tid) const {
    if (tid < BM) {
      sL[buf * BM + tid] = l2;
      sD[buf * BM + tid] = d;
    }
  }
};

}  // namespace sinkattn::cuda

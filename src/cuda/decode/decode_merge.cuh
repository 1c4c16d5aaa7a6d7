// CUDA backend: the merge of split-KV partials, SPEC.md section 2; one definition for the combine kernel
// (decode_combine.cuh) and the cluster combine (decode_kernel.cuh, cluster_combine).
// With the splits' partials (o_s, lse_s) of one (query row, head), mx = max_s lse_s:
//     lse = mx + log sum_s exp(lse_s - mx),   w_s = exp(lse_s - lse),   out = sum_s w_s o_s.
// The sink is in exactly one partial (the carrying split's), so the merge adds nothing for it. A partial with
// lse_s = -inf (a split with no key and no sink) weighs exactly 0 and its o_s is not read. Every partial -inf (vanilla,
// no visible key): lse = -inf, every w_s = 0, out = 0.
#pragma once

#include "cuda/common.cuh"

namespace sinkattn::cuda {

// exp(lse_s - mx): a partial's term of the sum (0 for lse_s = -inf); the caller skips it when mx = -inf.
__device__ __forceinline__ float merge_term(float lse_s, float mx) { return fast_exp2((lse_s - mx) * kLog2e); }

// The merged LSE from the largest partial LSE and the sum of merge_term over the partials.
__device__ __forceinline__ float merged_lse(float mx, float sum) {
  return mx != -INFINITY ? mx + __logf(sum) : -INFINITY;
}

// The weight w_s of a partial in the merged output: 0 when every partial is -inf (lse = -inf).
__device__ __forceinline__ float merge_weight(float lse_s, float lse) {
  return lse != -INFINITY ? fast_exp2((lse_s - lse) * kLog2e) : 0.f;
}

}  // namespace sinkattn::cuda

// CUDA backend: online softmax with the sink as an already-seen key (SPEC.md section 2; NOTES-kernels.md).
// Scores are kept in base 2: x = S * log2(e). Each row starts as if the sink were a key with score sigma and
// value 0: m = sigma * log2(e), l = 1 (vanilla: m = -inf, l = 0). So the stable maximum includes sigma from
// the first tile, a row with no visible key ends with out = 0 and LSE = sigma, and
//   LSE = (m + log2(l)) * ln(2) = log(exp(sigma) + sum_j exp(S_ij)).
// A row whose maximum is still -inf (vanilla, nothing visible yet) uses 0 as its reference so that
// exp2(x - m) never evaluates -inf - (-inf).
// Each thread holds two rows (g and g + 8 of its warp's 16) and a partial l over its columns; partial l's
// are summed over the quad of 4 threads sharing a row at the end. The sink's 1 is counted by lane t == 0.
#pragma once

#include "cuda/common.cuh"

namespace sinkattn::cuda {

// The natural-log LSE of a finished online-softmax row in base 2 (m2 = max * log2(e), l = sum of exp2(x - m2), the
// sink's 1 included), -inf when l = 0. A row still in its initial state (m2 = sigma * log2(e), l = 1: no key, or only
// keys whose exp2 underflowed next to the sink's 1) gets sigma exactly (SPEC 2), not sigma * log2(e) * ln(2) rounded
// twice; that value is also the exact answer for a row whose one contributing key scored sigma.
__device__ __forceinline__ float natural_lse(float m2, float l, float sigma) {
  if (!(l > 0.f)) return -INFINITY;
  return (l == 1.f && m2 == sigma * kLog2e) ? sigma : (m2 + __log2f(l)) * kLn2;
}

template <int NT>  // n-tiles of 8 keys per step
struct OnlineSoftmax {
  float m[2];
  float l[2];

  __device__ __forceinline__ void init(float sigma, int lane) { init(sigma, sigma, lane); }
  // Rows g and g + 8 with their own sinks (the decode kernels pack the query heads of a KV group into one tile,
  // so the two rows of a thread may belong to different heads).
  //
  // rscale: the scaled form, for a forward with dropout that rounds P for the P V product as one value (SPEC 5's
  // plain implementation rounds P * keep / (1 - p), not P; rounding P first loses its low bits where P is subnormal
  // in fp16, which a large sink makes it): every p and l carry the factor rscale = 1 / (1 - p):
  //   init(..., rscale):     the sink counts rscale instead of 1;
  //   step_scaled:           p = exp2(x - m_new + log2(rscale)) = rscale * exp2(x - m_new), alpha unchanged;
  //   finalize(..., rscale): 1 / l = rscale / l_s, LSE from l_s / rscale (exactly 1 for a row that saw no key: x / x).
  // rscale = 1 (the default) is the plain form.
  __device__ __forceinline__ void init(float sigma0, float sigma8, int lane, float rscale = 1.f) {
    const float s[2] = {sigma0 * kLog2e, sigma8 * kLog2e};  // the sink is never scaled by softmax_scale (SPEC 2)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      m[r] = s[r];
      l[r] = (s[r] != -INFINITY && (lane & 3) == 0) ? rscale : 0.f;
    }
  }

  // s: scores of this step in units of 1 / sc (masked = -inf): x = sc * s is the base-2 score, sc > 0 (the
  // forward passes raw Q.K products with sc = softmax_scale * log2(e) on interior tiles, saving a multiply per
  // element; max(sc * s) = sc * max(s) for sc > 0, exactly, as rounding is monotonic). Replaces s by
  // p = exp2(x - m_new) and returns the factors alpha = exp2(m_old - m_new) that the output accumulator must
  // be multiplied by.
  __device__ __forceinline__ void step(float (&s)[NT][4], float (&alpha)[2], float sc = 1.f) {
    step_impl<false>(s, alpha, sc, 0.f);
  }
  // log2_rscale = log2(1 / (1 - p)) (init says why).
  __device__ __forceinline__ void step_scaled(float (&s)[NT][4], float (&alpha)[2], float sc, float log2_rscale) {
    step_impl<true>(s, alpha, sc, log2_rscale);
  }

  // Row r: 1 / l (0 for an empty vanilla row, giving out = 0) and the natural-log LSE (-inf when empty).
  // `sigma` and `rscale` are the values init() was given (natural_lse: exactly sigma for a row that saw no key).
  __device__ __forceinline__ void finalize(int r, float sigma, float& inv_l, float& lse, float rscale = 1.f) const {
    const float lt = quad_sum(l[r]);
    inv_l = lt > 0.f ? rscale / lt : 0.f;
    lse = natural_lse(m[r], lt / rscale, sigma);
  }

 private:
  // kShift: p = exp2(x - (m_new - shift)) (step_scaled); otherwise shift is unused and the step is the plain one.
  template <bool kShift>
  __device__ __forceinline__ void step_impl(float (&s)[NT][4], float (&alpha)[2], float sc, float shift) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mr = -INFINITY;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) mr = fmaxf(mr, fmaxf(s[nt][2 * r], s[nt][2 * r + 1]));
      const float mx = fmaxf(m[r], quad_max(mr) * sc);
      const float ref = mx == -INFINITY ? 0.f : mx;
      alpha[r] = fast_exp2(m[r] - ref);
      m[r] = mx;
      const float neg_ref = kShift ? shift - ref : -ref;
      float sum = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        s[nt][2 * r] = fast_exp2(fmaf(s[nt][2 * r], sc, neg_ref));
        s[nt][2 * r + 1] = fast_exp2(fmaf(s[nt][2 * r + 1], sc, neg_ref));
        sum += s[nt][2 * r] + s[nt][2 * r + 1];
      }
      l[r] = l[r] * alpha[r] + sum;
    }
  }
};

// acc *= alpha of its row (alpha[0]: row g, alpha[1]: row g + 8 of the C fragments), skipped when no row's maximum
// moved (warp vote): with a sink at or above the scores, or once the maximum has settled, alpha is exactly 1.
template <int NO>
__device__ __forceinline__ void rescale_rows(float (&acc)[NO][4], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int o = 0; o < NO; ++o) {
      acc[o][0] *= alpha[0];
      acc[o][1] *= alpha[0];
      acc[o][2] *= alpha[1];
      acc[o][3] *= alpha[1];
    }
  }
}

}  // namespace sinkattn::cuda

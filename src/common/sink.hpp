// The sink of SPEC.md sections 2-3 as every path uses it (CPU backend, CUDA kernels, fp32 path): one definition.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/hd.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn {

// sigma of SPEC.md section 2 for query head h: sinks[h] (learnable; `sinks` in the memory the caller runs in, element
// stride `stride`), 0 (off_by_one), -inf (vanilla). The sink is in logit units: never scaled by softmax_scale.
SINKATTN_HD float sink_sigma(sinkattn_softmax_type_t type, const float* sinks, int64_t stride, int64_t h) {
  if (type == SINKATTN_SOFTMAX_LEARNABLE) return sinks[h * stride];
  if (type == SINKATTN_SOFTMAX_OFF_BY_ONE) return 0.f;
  return -INFINITY;
}

// P_sink_i = exp(sigma - LSE_i) (SPEC.md section 3): the sink's share of row i's softmax, used by
// d_sinks[h] = sum_i P_sink_i * (d_lse_i - D_i).
// A row whose LSE is -inf saw no key under a -inf sink (sinks may be -inf, SPEC.md 3 "Sink values"): its P_sink is
// 1, the limit of a finite sink going to -inf, so the row adds d_lse_i (D_i = 0 there); every other row of such a
// head has exp(-inf - LSE_i) = 0. A finite sink never gives LSE = -inf (LSE >= sigma), so -1e30 and -inf agree.
// A NaN or +inf sink gives NaN here: that head's outputs are unspecified (SPEC.md 3), no other head reads it.
template <typename F>
SINKATTN_HD F sink_probability(F sigma, F lse) {
  return lse == -static_cast<F>(INFINITY) ? F(1) : std::exp(sigma - lse);
}

}  // namespace sinkattn

// CUDA backend: dropout keep decision of SPEC.md section 2, from src/core/philox.hpp (the same function the
// CPU backend calls, so both compute the same bits):
//   idx = ((n * h_q + h) * max_s_q + i) * max_s_kv + j,  keep = Philox4x32_10(idx / 4, offset; seed)[idx % 4] >= threshold
// Survivors are scaled by 1 / (1 - p); the sink is never dropped.
#pragma once

#include "core/philox.hpp"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

struct Dropout {
  uint64_t seed, offset;
  uint64_t row_base;  // ((n * h_q + h) * max_s_q) * max_s_kv
  uint32_t threshold;
  float rscale;

  __device__ __forceinline__ Dropout(const Params& p, int n, int h) {
    if (p.rng_in) {
      seed = p.rng_in[0];
      offset = p.rng_in[p.rng_in_stride];
    } else {
      seed = p.seed;
      offset = p.offset;
    }
    row_base = (static_cast<uint64_t>(n) * p.h_q + h) * static_cast<uint64_t>(p.s_q);
    threshold = p.dropout_threshold;
    rscale = p.dropout_rscale;
  }

  // keep_ij / (1 - p): 0 when dropped.
  __device__ __forceinline__ float factor(int i, int j, int s_kv) const {
    const uint64_t idx = (row_base + static_cast<uint64_t>(i)) * static_cast<uint64_t>(s_kv) + static_cast<uint64_t>(j);
    return sinkattn::dropout_keep(seed, offset, idx, threshold) ? rscale : 0.f;
  }
};

}  // namespace sinkattn::cuda

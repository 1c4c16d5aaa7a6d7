// What the GPU benchmark programs (gpu_bench.cpp, gpu_bench_paged_prefill.cpp) share besides their JSON report
// (bench_report.hpp): random bf16 inputs, a call timed alone by CUDA events, the median of such times.
#pragma once
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_check.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn_bench {

// `elems` random bf16 (N(0, 1)) values: a window, at a random offset, of one pool of 2^24 values drawn once (drawing
// every buffer's values afresh took most of a run at s = 16384).
inline std::vector<uint16_t> random_bf16(size_t elems, std::mt19937& rng) {
  static const std::vector<uint16_t> pool = [&] {
    std::vector<uint16_t> h(size_t(1) << 24);
    std::normal_distribution<float> nd(0.f, 1.f);
    for (auto& x : h) {
      const float f = nd(rng);
      uint32_t u;
      std::memcpy(&u, &f, 4);
      x = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    return h;
  }();
  std::vector<uint16_t> h(elems);
  for (size_t i = 0, at = rng() % pool.size(); i < elems; ++i, at = at + 1 == pool.size() ? 0 : at + 1) h[i] = pool[at];
  return h;
}

// Milliseconds of one call (`call()` returns its status) between two events on the default stream, after which the
// host waits; a failing call ends the program with `what` and the library's message.
template <typename Call>
float event_ms(cudaEvent_t e0, cudaEvent_t e1, const char* what, Call&& call) {
  CK(cudaEventRecord(e0));
  const sinkattn_status_t st = call();
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  if (st != SINKATTN_OK) {
    std::printf("%s: %s\n", what, sinkattn_last_error());
    std::exit(1);
  }
  float ms = 0.f;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  return ms;
}

inline float median(std::vector<float> ts) {
  std::sort(ts.begin(), ts.end());
  return ts[ts.size() / 2];
}

}  // namespace sinkattn_bench

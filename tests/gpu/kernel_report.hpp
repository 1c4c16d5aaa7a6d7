// The kernels a CUDA call would run, as sinkattn_query_backend reports them (the text after "kernels: " on the
// chosen backend's line), for the GPU programs that print or check them (gpu_decode.cpp, gpu_bench_decode.cu,
// gpu_bench_paged_prefill.cpp).
#pragma once
#include <string>

#include "sinkattn/sinkattn.h"

namespace sinkattn_test {

// The forward's kernels; "" when the call runs on no backend or not on CUDA (the CPU backend names no kernels).
inline std::string cuda_kernels(const sinkattn_params_t& p) {
  char buf[4096] = {0};
  sinkattn_backend_t chosen;
  if (sinkattn_query_backend(&p, 0, &chosen, buf, sizeof buf) != SINKATTN_OK ||
      chosen != SINKATTN_BACKEND_CUDA)
    return "";
  const std::string s(buf);
  const size_t a = s.find("kernels: ");
  if (a == std::string::npos) return "";
  const size_t e = s.find('\n', a);
  return s.substr(a + 9, e == std::string::npos ? std::string::npos : e - a - 9);
}

}  // namespace sinkattn_test

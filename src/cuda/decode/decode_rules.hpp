// CUDA backend: which forward calls the decode kernels (decode_kernel.cuh) run, as a host-only rule on the resolved
// call, so that the dispatch unit (dispatch.cpp, also compiled without CUDA into tests/test_cuda_dispatch.cpp) and
// the decode plan (decode.cu: splits, workspace) apply the same one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/call.hpp"

namespace sinkattn::cuda {

constexpr int kDecodeMaxQueries = 16;  // query rows per sequence (dense s_q or varlen max_seqlen_q)

// "" when the decode kernels run the call, else why not: forward, fp16 / bf16, no bias or dropout, at most
// kDecodeMaxQueries query rows per sequence, head dims up to 128, b and h_kv within one grid dimension.
inline std::string decode_unsupported(const Call& c) {
  if (c.pass != Pass::kForward) return "backward";
  if (c.dtype != SINKATTN_F16 && c.dtype != SINKATTN_BF16) return "dtype is not fp16 / bf16";
  if (c.plan.bias == Use::kRequired || c.plan.dropout) return "bias or dropout";
  if (c.s_q > kDecodeMaxQueries)
    return "more than " + std::to_string(kDecodeMaxQueries) + " query rows per sequence (s_q / max_seqlen_q = " +
           std::to_string(c.s_q) + ")";
  if (std::max(c.d, c.d_v) > 128) return "head dim above 128";
  if (c.b > 65535 || c.h_kv > 65535) return "b or h_kv above 65535 (grid dimensions)";
  return {};
}

}  // namespace sinkattn::cuda

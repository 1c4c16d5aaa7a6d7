// fp32 path of the CUDA backend: what it supports, its workspace, and the run (SPEC.md sections 1-4).
// Kernels: fwd_f32.cu, bwd_f32.cu; per-thread math: f32_kernels.cuh; Call -> KParams: f32_params.hpp.
#include "cuda/fp32/f32.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "cuda/fp32/f32_launch.hpp"
#include "cuda/fp32/f32_params.hpp"

namespace sinkattn::cuda_f32 {

namespace {

Status device_error(const char* what, cudaError_t e) {
  return Status{SINKATTN_ERR_DEVICE, std::string("cuda fp32: ") + what + ": " + cudaGetErrorName(e) + " (" +
                                         cudaGetErrorString(e) + ")"};
}

bool aligned4(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 3u) == 0; }

}  // namespace

Status supports(const Call& c) {
  if (c.dtype != SINKATTN_F32) return unsupported("q: dtype is not fp32 (fp32 path)");
  if (c.memory != Memory::kDevice)
    return unsupported("tensors are in host memory (the CUDA backend needs device memory)");
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return unsupported("no CUDA device found");
  }
  if (head_dim_tile(c.d, c.d_v) == 0)
    return unsupported("q: head dims d = " + std::to_string(c.d) + ", d_v = " + std::to_string(c.d_v) +
                       " not supported (any head dim up to 256)");
  if (c.b > 65535 || c.h_q > 65535)
    return unsupported("q: b and h_q must be <= 65535 (grid dimensions), got b = " +
                       std::to_string(c.b) + ", h_q = " + std::to_string(c.h_q));
  if (c.s_q > (int64_t(1) << 31) - kThreads || c.s_kv > (int64_t(1) << 31) - kThreads)
    return unsupported("max_seqlen_q / max_seqlen_kv: sequence lengths above 2^31 - 128 are not supported");
  if (c.plan.bias == Use::kRequired && c.bias_dtype != SINKATTN_F32)
    return unsupported("bias: dtype must be fp32 on the fp32 path");
  if (c.pass == Pass::kBackward && c.plan.d_bias == Use::kRequired && bias_broadcasts(c) &&
      static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv * 4.0 > 64.0 * (1ull << 30))
    return unsupported(
        "d_bias: broadcast, it needs an fp32 workspace of b*h_q*s_q*s_kv floats, over 64 GiB here");
  // fp32 elements are read one at a time: any strides, 4-byte aligned pointers.
  const sinkattn_params_t& p = *c.p;
  if (p.q.data != nullptr) {  // not a shape-only query
    const std::pair<const char*, const sinkattn_tensor_t*> ts[] = {
        {"q", &p.q},         {"k", &p.k},   {"v", &p.v},   {"out", &p.out}, {"softmax_lse", &p.softmax_lse},
        {"d_out", &p.d_out}, {"dq", &p.dq}, {"dk", &p.dk}, {"dv", &p.dv},   {"bias", &p.bias},
        {"d_bias", &p.d_bias}};
    for (const auto& [name, t] : ts)
      if (t->rank > 0 && t->data != nullptr && !aligned4(t->data))
        return unsupported(std::string(name) + ": data pointer must be 4-byte aligned");
  }
  return Status::ok();
}

Status workspace_size(const Call& c, size_t* bytes) {
  *bytes = layout_of(c).total;
  return Status::ok();
}

Status run(const Call& c) {
  const Layout w = layout_of(c);
  const sinkattn_params_t& p = *c.p;
  if (p.workspace_bytes < w.total)
    return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL, "workspace: " + std::to_string(p.workspace_bytes) +
                                                        " bytes, the cuda fp32 " +
                                                        (c.pass == Pass::kBackward ? "backward" : "forward") +
                                                        " needs " + std::to_string(w.total)};
  if (w.total > 0 && p.workspace == nullptr)
    return invalid("workspace: NULL but the cuda fp32 backward needs " + std::to_string(w.total) + " bytes");
  const int tile = head_dim_tile(c.d, c.d_v);
  if (tile == 0) return internal_error("cuda fp32: head dim not supported (supports() was not checked)");
  const KParams k = make_kparams(c, w, p.workspace);
  cudaStream_t stream = static_cast<cudaStream_t>(p.stream);
  cudaGetLastError();  // clear a stale error of the caller
  const char* what = "fp32 launch";
  const cudaError_t e = c.pass == Pass::kForward ? launch_forward(k, tile, stream, &what)
                                                 : launch_backward(k, tile, stream, &what);
  if (e != cudaSuccess) return device_error(what, e);
  return Status::ok();
}

}  // namespace sinkattn::cuda_f32

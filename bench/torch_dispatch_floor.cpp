// The floor of issue 11's host-time budget: what PyTorch itself charges a dispatcher operator with the schemas of
// torch.ops.sinkattn.fwd / bwd (python/torch/torch_ops.cpp) before it does any work. bench/bench_torch_overhead.py
// --floor builds this file (torch.utils.cpp_extension, against the PyTorch it runs under) and times it beside the
// real operators.
//
//   torch.ops.sinkattn_floor.fwd(<the 23 arguments of sinkattn::fwd>) -> (out, softmax_lse, rng_state)
//   torch.ops.sinkattn_floor.bwd(<the 25 arguments of sinkattn::bwd>) -> (dq, dk, dv, d_sinks, d_bias)
//
// Each kernel does only what any implementation of the operator must: allocate its outputs (out like q, softmax_lse
// fp32 [b, h_q, s_q], rng_state int64 [0]; dq, dk, dv like q, k, v, d_sinks fp32 like sinks, d_bias [0]) from
// PyTorch's allocator (the caching allocator on CUDA) under a device guard, and read the current stream. No
// validation, no library call, no kernel launch. fwd's Autograd key redispatches the boxed stack below autograd (the
// least an Autograd kernel can do when no input requires grad); bwd has no Autograd kernel, as sinkattn::bwd has none (PyTorch's fallback for that key runs, in both).
// On PyTorch's C++ API (not the stable ABI): the cheapest form such an operator can take.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>
#include <torch/library.h>

#ifdef SINKATTN_FLOOR_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <optional>
#include <tuple>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;

void touch_stream(const Tensor& q) {
#ifdef SINKATTN_FLOOR_CUDA
  if (q.is_cuda()) (void)c10::cuda::getCurrentCUDAStream(q.get_device()).stream();
#else
  (void)q;
#endif
}

std::tuple<Tensor, Tensor, Tensor> fwd(const Tensor& q, const Tensor&, const Tensor& v, const OptTensor&,
                                       const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                                       const OptTensor&, const OptTensor&, const OptTensor&, int64_t, int64_t, int64_t,
                                       std::optional<double>, int64_t, int64_t, int64_t, double, const OptTensor&,
                                       bool, bool, int64_t) {
  const c10::DeviceGuard guard(q.device());
  touch_stream(q);
  auto shape = q.sizes().vec();
  shape.back() = v.size(-1);
  Tensor out = at::empty(shape, q.options());
  Tensor lse = at::empty({q.size(0), q.size(2), q.size(1)}, q.options().dtype(at::kFloat));
  return {out, lse, at::empty({0}, q.options().dtype(at::kLong))};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> bwd(
    const Tensor&, const Tensor& q, const Tensor& k, const Tensor& v, const Tensor&, const Tensor&, const OptTensor&,
    const OptTensor& sinks, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
    const OptTensor&, int64_t, int64_t, int64_t, std::optional<double>, int64_t, int64_t, int64_t, double,
    const OptTensor&, bool, bool) {
  const c10::DeviceGuard guard(q.device());
  touch_stream(q);
  Tensor d_sinks = sinks ? at::empty(sinks->sizes(), q.options().dtype(at::kFloat))
                         : at::empty({0}, q.options().dtype(at::kFloat));
  return {at::empty(q.sizes(), q.options()), at::empty(k.sizes(), k.options()), at::empty(v.sizes(), v.options()),
          d_sinks, at::empty({0}, q.options().dtype(at::kFloat))};
}

void below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  at::AutoDispatchBelowADInplaceOrView below;
  op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
}

}  // namespace

TORCH_LIBRARY(sinkattn_floor, m) {
  // The schemas of python/torch/torch_ops.cpp (sinkattn::fwd, sinkattn::bwd), argument for argument.
  m.def("fwd(Tensor q, Tensor k, Tensor v, Tensor? sinks, Tensor? bias, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
        "Tensor? seqused_kv, Tensor? seqlens_q, Tensor? seqlens_kv, Tensor? page_table, int max_seqlen_q, "
        "int max_seqlen_kv, int softmax_type, float? softmax_scale, int window_left, int window_right, "
        "int mask_alignment, float dropout_p, Tensor? rng_seed_offset, bool deterministic, "
        "bool trust_device_batch_tensors, int num_splits) -> (Tensor, Tensor, Tensor)");
  m.def("bwd(Tensor d_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor? d_lse, "
        "Tensor? sinks, Tensor? bias, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? seqused_kv, "
        "Tensor? seqlens_q, Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, int softmax_type, "
        "float? softmax_scale, int window_left, int window_right, int mask_alignment, float dropout_p, "
        "Tensor? rng_state, bool deterministic, bool trust_device_batch_tensors) "
        "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(sinkattn_floor, CPU, m) {
  m.impl("fwd", fwd);
  m.impl("bwd", bwd);
}

TORCH_LIBRARY_IMPL(sinkattn_floor, CUDA, m) {
  m.impl("fwd", fwd);
  m.impl("bwd", bwd);
}

TORCH_LIBRARY_IMPL(sinkattn_floor, Autograd, m) {
  m.impl("fwd", torch::CppFunction::makeFromBoxedFunction<&below_autograd>());
}

// Optional compiled autograd kernel of torch.ops.sinkattn.fwd (libsinkattn_torch_autograd.so), built against the
// C++ API of ONE PyTorch release (not the stable ABI: PyTorch's stable ABI has no autograd, and no way to ask whether
// a tensor requires grad). python/sinkattn/torch/_ops.py loads it only into the PyTorch it was built for (the version
// file next to it), instead of registering the same formula from Python (torch.library.register_autograd); any other
// PyTorch gets the Python registration, and the stable-ABI operators (python/torch/torch_ops.cpp) are the same.
//
// Why: a Python kernel at the Autograd key costs every call of the operator, gradients or not, a round trip of its 23
// arguments and 3 results between the dispatcher and Python (bench/log/2026-12-01-torch-op-host-time-cpu.md). This
// kernel reads the requires_grad flags on the dispatcher's stack and, when no gradient is needed, redispatches the
// same stack below autograd (no conversion at all); otherwise it is a torch::autograd::Function with the formula of
// _ops.py (_setup_context / _backward): dq, dk, dv, d_sinks (learnable sinks), d_bias through torch.ops.sinkattn.bwd.
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/zeros_like.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kLearnable = 2;  // SINKATTN_SOFTMAX_LEARNABLE (include/sinkattn/sinkattn.h)
constexpr size_t kFwdArgs = 23;    // the schema of sinkattn::fwd (python/torch/torch_ops.cpp)
// Stack positions of the differentiable inputs: q, k, v, sinks, bias.
constexpr size_t kDiff[] = {0, 1, 2, 3, 4};

using FwdOut = std::tuple<Tensor, Tensor, Tensor>;
using FwdSig = FwdOut(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, const OptTensor&,
                      const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                      const OptTensor&, int64_t, int64_t, int64_t, std::optional<double>, int64_t, int64_t, int64_t,
                      double, const OptTensor&, bool, bool, int64_t);
using BwdOut = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor>;
using BwdSig = BwdOut(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                      const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&, const OptTensor&,
                      const OptTensor&, const OptTensor&, const OptTensor&, int64_t, int64_t, int64_t,
                      std::optional<double>, int64_t, int64_t, int64_t, double, const OptTensor&, bool, bool);

const c10::TypedOperatorHandle<FwdSig>& fwd_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("sinkattn::fwd", "").typed<FwdSig>();
  return op;
}
const c10::TypedOperatorHandle<BwdSig>& bwd_op() {
  static const auto op = c10::Dispatcher::singleton().findSchemaOrThrow("sinkattn::bwd", "").typed<BwdSig>();
  return op;
}

OptTensor opt(const Tensor& t) { return t.defined() ? OptTensor(t) : std::nullopt; }
Tensor def(const OptTensor& t) { return t.has_value() ? *t : Tensor(); }
// The library takes any strides but a contiguous last dimension (autograd's cotangents may be expanded).
Tensor last_dim_contiguous(const Tensor& x) { return x.stride(-1) == 1 ? x : x.contiguous(); }

struct SinkAttnFwd : public torch::autograd::Function<SinkAttnFwd> {
  static variable_list forward(AutogradContext* ctx, const Tensor& q, const Tensor& k, const Tensor& v,
                               const OptTensor& sinks, const OptTensor& bias, const OptTensor& cu_q,
                               const OptTensor& cu_kv, const OptTensor& seqused_kv, const OptTensor& seqlens_q,
                               const OptTensor& seqlens_kv, const OptTensor& page_table, int64_t max_q,
                               int64_t max_kv, int64_t softmax_type, std::optional<double> softmax_scale,
                               int64_t window_left, int64_t window_right, int64_t mask_alignment, double dropout_p,
                               const OptTensor& rng_seed_offset, bool deterministic, bool trust, int64_t num_splits) {
    Tensor out, lse, rng_state;
    {
      at::AutoDispatchBelowADInplaceOrView below;  // straight to the CPU / CUDA kernel (or the fake kernel)
      std::tie(out, lse, rng_state) =
          fwd_op().call(q, k, v, sinks, bias, cu_q, cu_kv, seqused_kv, seqlens_q, seqlens_kv, page_table, max_q,
                        max_kv, softmax_type, softmax_scale, window_left, window_right, mask_alignment, dropout_p,
                        rng_seed_offset, deterministic, trust, num_splits);
    }
    // as _ops._setup_context
    ctx->save_for_backward({q, k, v, out, lse, rng_state, def(sinks), def(bias), def(cu_q), def(cu_kv),
                            def(seqused_kv), def(seqlens_q), def(seqlens_kv)});
    ctx->saved_data["max_q"] = max_q;
    ctx->saved_data["max_kv"] = max_kv;
    ctx->saved_data["softmax_type"] = softmax_type;
    ctx->saved_data["softmax_scale"] = softmax_scale;
    ctx->saved_data["window_left"] = window_left;
    ctx->saved_data["window_right"] = window_right;
    ctx->saved_data["mask_alignment"] = mask_alignment;
    ctx->saved_data["dropout_p"] = dropout_p;
    ctx->saved_data["deterministic"] = deterministic;
    ctx->saved_data["trust"] = trust;
    ctx->mark_non_differentiable({rng_state});
    ctx->set_materialize_grads(false);
    return {out, lse, rng_state};
  }

  // as _ops._backward: dq, dk, dv, d_sinks, d_bias of SPEC.md section 3 (d_lse: the gradient flowing into lse)
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const variable_list s = ctx->get_saved_variables();
    const Tensor &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4], &rng_state = s[5];
    const OptTensor sinks = opt(s[6]), bias = opt(s[7]);
    Tensor d_out = grads[0].defined() ? last_dim_contiguous(grads[0].to(out.scalar_type())) : at::zeros_like(out);
    OptTensor d_lse = grads[1].defined() ? OptTensor(last_dim_contiguous(grads[1].to(at::kFloat))) : std::nullopt;
    auto& d = ctx->saved_data;
    const int64_t softmax_type = d["softmax_type"].toInt();
    auto [dq, dk, dv, d_sinks, d_bias] = bwd_op().call(
        d_out, q, k, v, out, lse, d_lse, sinks, bias, opt(s[8]), opt(s[9]), opt(s[10]), opt(s[11]), opt(s[12]),
        d["max_q"].toInt(), d["max_kv"].toInt(), softmax_type, d["softmax_scale"].toOptional<double>(),
        d["window_left"].toInt(), d["window_right"].toInt(), d["mask_alignment"].toInt(), d["dropout_p"].toDouble(),
        opt(rng_state), d["deterministic"].toBool(), d["trust"].toBool());
    variable_list g(kFwdArgs);
    g[0] = dq;
    g[1] = dk;
    g[2] = dv;
    if (softmax_type == kLearnable && sinks.has_value()) g[3] = d_sinks;
    if (bias.has_value()) g[4] = d_bias;
    return g;
  }
};

// The Autograd kernel of sinkattn::fwd, boxed: the stack holds the 23 arguments.
void fwd_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet ks, torch::jit::Stack* stack) {
  const size_t base = stack->size() - kFwdArgs;
  bool need_grad = false;
  if (at::GradMode::is_enabled()) {
    for (size_t i : kDiff) {
      const c10::IValue& a = (*stack)[base + i];
      if (a.isTensor() && a.toTensor().requires_grad()) need_grad = true;
    }
  }
  if (!need_grad) {
    at::AutoDispatchBelowADInplaceOrView below;
    op.redispatchBoxed(ks & c10::after_autograd_keyset, stack);
    return;
  }
  auto a = [&](size_t i) -> const c10::IValue& { return (*stack)[base + i]; };
  auto t = [&](size_t i) { return a(i).toOptional<Tensor>(); };
  variable_list res = SinkAttnFwd::apply(
      a(0).toTensor(), a(1).toTensor(), a(2).toTensor(), t(3), t(4), t(5), t(6), t(7), t(8), t(9), t(10),
      a(11).toInt(), a(12).toInt(), a(13).toInt(), a(14).toOptional<double>(), a(15).toInt(), a(16).toInt(),
      a(17).toInt(), a(18).toDouble(), t(19), a(20).toBool(), a(21).toBool(), a(22).toInt());
  torch::jit::drop(*stack, kFwdArgs);
  for (Tensor& r : res) torch::jit::push(*stack, std::move(r));
}

}  // namespace

TORCH_LIBRARY_IMPL(sinkattn, Autograd, m) {
  m.impl("fwd", torch::CppFunction::makeFromBoxedFunction<&fwd_autograd>());
}

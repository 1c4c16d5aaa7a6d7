// XLA FFI handlers (typed FFI API) of sinkattn for JAX: forward and backward, CPU and CUDA.
//
// Each handler turns the FFI buffers and attributes into one sinkattn_params_t (C ABI, include/sinkattn/sinkattn.h)
// and calls sinkattn_forward / sinkattn_backward with the backend set explicitly (CPU for the "cpu" target, CUDA
// with XLA's stream for the "CUDA" target). A library error is returned as an ffi::Error carrying
// sinkattn_last_error(), which JAX raises as a Python exception.
//
// Operand protocol (kept in sync with python/sinkattn/jax/_ffi.py):
//   forward  args: q, k, v, then the optional operands present in `operands` (bit order below)
//            rets: out, softmax_lse, workspace (u8), then rng_state (u32[4]) when dropout_p > 0
//   backward args: q, k, v, out, softmax_lse, d_out, then the optional operands present in `operands`
//            rets: dq, dk, dv, workspace (u8), then d_sinks (learnable), d_bias (with bias)
// The workspace: on CUDA an XLA buffer of the size of the library's shape-only query; on the CPU one byte, unused:
// the CPU handlers take the workspace from the host heap per call, sized by the library with the call's batch
// tensors (sinkattn_forward_alloc / sinkattn_backward_alloc), since the CPU backend's workspace follows the keys each
// sequence reads, which the shapes XLA sees cannot tell (from shapes alone, a decode batch over a large page table
// would reserve the table's whole capacity).
// Optional operands, in this order: sinks, bias, d_lse (backward), cu_seqlens_q + cu_seqlens_kv, seqused_kv,
// seqlens_q, seqlens_kv, rng (forward: rng_seed_offset, backward: rng_state), page_table. Extra trailing arguments
// (the test-only output poisoning buffers, aliased to the outputs) are ignored.
// Decode (sinkattn.jax.decode_attention): the forward protocol on its own target, sinkattn_jax_decode_{cpu,cuda},
// with one more attribute, num_splits (SPEC.md section 4); paged KV passes page_table (bit kPageTable) and
// seqused_kv, and k / v are the page pools. cu_seqlens_kv is not sent with a page table (only cu_seqlens_q).
// Seed/offset tensors travel as u32[4] = {lo32(seed), hi32(seed), lo32(offset), hi32(offset)}, which is the byte
// image of the library's I64[2] {seed, offset} on little-endian machines (SPEC.md section 2, dropout), so JAX
// needs no 64-bit integers (jax_enable_x64 off).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <string>
#include <utility>

#include "sinkattn/sinkattn.h"
#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

enum OperandBit : int32_t {
  kSinks = 1 << 0,
  kBias = 1 << 1,
  kDLse = 1 << 2,
  kCuSeqlens = 1 << 3,  // cu_seqlens_q and cu_seqlens_kv (two operands)
  kSequsedKv = 1 << 4,
  kSeqlensQ = 1 << 5,
  kSeqlensKv = 1 << 6,
  kRng = 1 << 7,
  kPageTable = 1 << 8,
  kCuSeqlensQOnly = 1 << 9,  // varlen queries over a page table: cu_seqlens_q alone (one operand)
};

bool to_dtype(ffi::DataType t, sinkattn_dtype_t* out) {
  switch (t) {
    case ffi::DataType::F32: *out = SINKATTN_F32; return true;
    case ffi::DataType::F16: *out = SINKATTN_F16; return true;
    case ffi::DataType::BF16: *out = SINKATTN_BF16; return true;
    case ffi::DataType::S32: *out = SINKATTN_I32; return true;
    case ffi::DataType::S64: *out = SINKATTN_I64; return true;
    default: return false;
  }
}

// A row-major contiguous view of an FFI buffer (XLA's default layout, which jax.ffi.ffi_call requests).
ffi::Error to_tensor(const ffi::AnyBuffer& b, const char* name, sinkattn_tensor_t* t) {
  auto dims = b.dimensions();
  if (dims.size() < 1 || dims.size() > SINKATTN_MAX_RANK)
    return ffi::Error::InvalidArgument(std::string("sinkattn: ") + name + " must have rank 1.." +
                                       std::to_string(SINKATTN_MAX_RANK) + ", got " + std::to_string(dims.size()));
  if (!to_dtype(b.element_type(), &t->dtype))
    return ffi::Error::InvalidArgument(std::string("sinkattn: ") + name + ": unsupported element type");
  t->data = b.untyped_data();
  t->rank = static_cast<int32_t>(dims.size());
  int64_t stride = 1;
  for (int i = t->rank - 1; i >= 0; --i) {
    t->shape[i] = dims[i];
    t->strides[i] = stride;
    stride *= dims[i];
  }
  return ffi::Error::Success();
}

// u32[4] seed/offset buffer seen as the library's I64[2] (see the header comment).
ffi::Error to_rng_tensor(const ffi::AnyBuffer& b, const char* name, sinkattn_tensor_t* t) {
  if (b.element_type() != ffi::DataType::U32 || b.element_count() != 4)
    return ffi::Error::InvalidArgument(std::string("sinkattn: ") + name + " must be uint32[4]");
  t->data = b.untyped_data();
  t->dtype = SINKATTN_I64;
  t->rank = 1;
  t->shape[0] = 2;
  t->strides[0] = 1;
  return ffi::Error::Success();
}

ffi::Error library_error(sinkattn_status_t st) {
  const char* msg = sinkattn_last_error();
  std::string m = std::string("sinkattn: ") + (msg && *msg ? msg : "error without message") + " (status " +
                  std::to_string(static_cast<int>(st)) + ")";
  return st == SINKATTN_ERR_INVALID_ARGUMENT ? ffi::Error::InvalidArgument(m) : ffi::Error::Internal(m);
}

#define SINKATTN_TRY(expr)                  \
  do {                                      \
    ffi::Error _e = (expr);                 \
    if (!_e.success()) return _e;           \
  } while (0)

struct Options {
  int32_t softmax_type;
  float softmax_scale;
  int64_t window_left, window_right;
  int32_t mask_alignment;
  double dropout_p;
  int32_t deterministic;
  int64_t max_seqlen_q, max_seqlen_kv;
  int32_t operands;
};

void apply_options(const Options& o, sinkattn_params_t* p) {
  p->softmax_type = static_cast<sinkattn_softmax_type_t>(o.softmax_type);
  p->softmax_scale = o.softmax_scale;  // NaN = 1/sqrt(d) (SPEC.md section 2)
  p->window_left = o.window_left;
  p->window_right = o.window_right;
  p->mask_alignment = static_cast<sinkattn_mask_alignment_t>(o.mask_alignment);
  p->dropout_p = o.dropout_p;
  p->deterministic = o.deterministic;
  p->max_seqlen_q = o.max_seqlen_q;
  p->max_seqlen_kv = o.max_seqlen_kv;
}

// Reads the optional operands (in the protocol order) starting at index `i` of `args`.
ffi::Error read_optional(const ffi::RemainingArgs& args, int32_t ops, bool backward, sinkattn_params_t* p) {
  size_t i = 0;
  auto next = [&](const char* name, sinkattn_tensor_t* t, bool rng) -> ffi::Error {
    auto b = args.get<ffi::AnyBuffer>(i++);
    if (!b.has_value())
      return ffi::Error::InvalidArgument(std::string("sinkattn: missing operand ") + name);
    return rng ? to_rng_tensor(*b, name, t) : to_tensor(*b, name, t);
  };
  if (ops & kSinks) SINKATTN_TRY(next("sinks", &p->sinks, false));
  if (ops & kBias) SINKATTN_TRY(next("bias", &p->bias, false));
  if (ops & kDLse) SINKATTN_TRY(next("d_lse", &p->d_lse, false));
  if (ops & kCuSeqlens) {
    SINKATTN_TRY(next("cu_seqlens_q", &p->cu_seqlens_q, false));
    SINKATTN_TRY(next("cu_seqlens_kv", &p->cu_seqlens_kv, false));
  } else if (ops & kCuSeqlensQOnly) {
    SINKATTN_TRY(next("cu_seqlens_q", &p->cu_seqlens_q, false));
  }
  if (ops & kSequsedKv) SINKATTN_TRY(next("seqused_kv", &p->seqused_kv, false));
  if (ops & kSeqlensQ) SINKATTN_TRY(next("seqlens_q", &p->seqlens_q, false));
  if (ops & kSeqlensKv) SINKATTN_TRY(next("seqlens_kv", &p->seqlens_kv, false));
  if (ops & kRng) {
    if (backward)
      SINKATTN_TRY(next("rng_state", &p->rng_state, true));
    else
      SINKATTN_TRY(next("rng_seed_offset", &p->rng_seed_offset, true));
  }
  if (ops & kPageTable) SINKATTN_TRY(next("page_table", &p->page_table, false));
  return ffi::Error::Success();
}

// XLA allocates the outputs: their varlen rows that belong to no sequence (after cu_seqlens[b]), which the library
// never writes, get out = dq = dk = dv = 0 and softmax_lse = -inf (SPEC.md section 1), on the call's stream. The pass
// has just validated the batch tensors: no second read-back.
ffi::Error clear_unowned_rows(sinkattn_params_t* p, bool backward) {
  if (p->cu_seqlens_q.rank == 0) return ffi::Error::Success();
  p->trust_device_batch_tensors = 1;
  const sinkattn_status_t st = sinkattn_clear_unowned_rows(p, backward ? 1 : 0);
  if (st != SINKATTN_OK) return library_error(st);
  return ffi::Error::Success();
}

// A call's workspace from the host heap (CPU handlers), freed when the call returns.
struct HostWorkspace {
  std::unique_ptr<unsigned char[]> memory;
  static void* alloc(size_t bytes, void* user) {
    auto* w = static_cast<HostWorkspace*>(user);
    w->memory.reset(new (std::nothrow) unsigned char[bytes]);
    return w->memory.get();
  }
};

// The pass with its workspace: XLA's buffer on CUDA, the host heap on the CPU (see the header comment).
sinkattn_status_t run_pass(sinkattn_params_t* p, bool backward, ffi::Result<ffi::AnyBuffer>& workspace) {
  if (p->backend == SINKATTN_BACKEND_CPU) {
    HostWorkspace w;
    return backward ? sinkattn_backward_alloc(p, &HostWorkspace::alloc, &w, 0)
                    : sinkattn_forward_alloc(p, &HostWorkspace::alloc, &w, 0);
  }
  p->workspace = workspace->untyped_data();
  p->workspace_bytes = workspace->size_bytes();
  return backward ? sinkattn_backward(p) : sinkattn_forward(p);
}

// The part of a call both passes share: options, backend, stream and the q, k, v views.
ffi::Error start_params(sinkattn_backend_t backend, void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, const Options& o, sinkattn_params_t* p) {
  sinkattn_params_init(p);
  apply_options(o, p);
  p->backend = backend;
  p->stream = stream;
  SINKATTN_TRY(to_tensor(q, "query", &p->q));
  SINKATTN_TRY(to_tensor(k, "key", &p->k));
  SINKATTN_TRY(to_tensor(v, "value", &p->v));
  return ffi::Error::Success();
}

// SPEC.md section 2: out, softmax_lse (and rng_state) from q, k, v and the options.
ffi::Error forward_impl(sinkattn_backend_t backend, void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                        ffi::AnyBuffer v, ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> out,
                        ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> workspace,
                        ffi::RemainingRets rets, const Options& o, int32_t num_splits = 0) {
  sinkattn_params_t p;
  SINKATTN_TRY(start_params(backend, stream, q, k, v, o, &p));
  p.num_splits = num_splits;
  SINKATTN_TRY(read_optional(args, o.operands, /*backward=*/false, &p));
  SINKATTN_TRY(to_tensor(*out, "out", &p.out));
  SINKATTN_TRY(to_tensor(*lse, "softmax_lse", &p.softmax_lse));
  if (o.dropout_p > 0.0) {
    auto rs = rets.get<ffi::AnyBuffer>(0);
    if (!rs.has_value()) return ffi::Error::InvalidArgument("sinkattn: missing result rng_state");
    SINKATTN_TRY(to_rng_tensor(**rs, "rng_state", &p.rng_state));
  }
  const sinkattn_status_t st = run_pass(&p, /*backward=*/false, workspace);
  if (st != SINKATTN_OK) return library_error(st);
  return clear_unowned_rows(&p, /*backward=*/false);
}

// SPEC.md section 3: dq, dk, dv, d_sinks (learnable), d_bias (with bias).
ffi::Error backward_impl(sinkattn_backend_t backend, void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k,
                         ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse, ffi::AnyBuffer d_out,
                         ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                         ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> workspace,
                         ffi::RemainingRets rets, const Options& o) {
  sinkattn_params_t p;
  SINKATTN_TRY(start_params(backend, stream, q, k, v, o, &p));
  SINKATTN_TRY(to_tensor(out, "out", &p.out));
  SINKATTN_TRY(to_tensor(lse, "softmax_lse", &p.softmax_lse));
  SINKATTN_TRY(to_tensor(d_out, "d_out", &p.d_out));
  SINKATTN_TRY(read_optional(args, o.operands, /*backward=*/true, &p));
  SINKATTN_TRY(to_tensor(*dq, "dq", &p.dq));
  SINKATTN_TRY(to_tensor(*dk, "dk", &p.dk));
  SINKATTN_TRY(to_tensor(*dv, "dv", &p.dv));
  size_t r = 0;
  if (o.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) {
    auto ds = rets.get<ffi::AnyBuffer>(r++);
    if (!ds.has_value()) return ffi::Error::InvalidArgument("sinkattn: missing result d_sinks");
    SINKATTN_TRY(to_tensor(**ds, "d_sinks", &p.d_sinks));
  }
  if (o.operands & kBias) {
    auto db = rets.get<ffi::AnyBuffer>(r++);
    if (!db.has_value()) return ffi::Error::InvalidArgument("sinkattn: missing result d_bias");
    SINKATTN_TRY(to_tensor(**db, "d_bias", &p.d_bias));
  }
  const sinkattn_status_t st = run_pass(&p, /*backward=*/true, workspace);
  if (st != SINKATTN_OK) return library_error(st);
  return clear_unowned_rows(&p, /*backward=*/true);
}

// ---- binding boilerplate: the same attributes for every handler ----
template <typename B>
auto bind_attrs(B b) {
  return std::move(b).template Attr<int32_t>("softmax_type")
      .template Attr<float>("softmax_scale")
      .template Attr<int64_t>("window_left")
      .template Attr<int64_t>("window_right")
      .template Attr<int32_t>("mask_alignment")
      .template Attr<double>("dropout_p")
      .template Attr<int32_t>("deterministic")
      .template Attr<int64_t>("max_seqlen_q")
      .template Attr<int64_t>("max_seqlen_kv")
      .template Attr<int32_t>("operands");
}

#define SINKATTN_ATTR_PARAMS                                                                            \
  int32_t softmax_type, float softmax_scale, int64_t window_left, int64_t window_right,                 \
      int32_t mask_alignment, double dropout_p, int32_t deterministic, int64_t max_seqlen_q,            \
      int64_t max_seqlen_kv, int32_t operands
#define SINKATTN_ATTR_OPTIONS                                                                           \
  Options{softmax_type, softmax_scale, window_left, window_right, mask_alignment, dropout_p,            \
          deterministic, max_seqlen_q, max_seqlen_kv, operands}

ffi::Error forward_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs args,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                       ffi::Result<ffi::AnyBuffer> ws, ffi::RemainingRets rets, SINKATTN_ATTR_PARAMS) {
  return forward_impl(SINKATTN_BACKEND_CPU, nullptr, q, k, v, args, out, lse, ws, rets, SINKATTN_ATTR_OPTIONS);
}
ffi::Error forward_cuda(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs args,
                        ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                        ffi::Result<ffi::AnyBuffer> ws, ffi::RemainingRets rets, SINKATTN_ATTR_PARAMS) {
  return forward_impl(SINKATTN_BACKEND_CUDA, stream, q, k, v, args, out, lse, ws, rets, SINKATTN_ATTR_OPTIONS);
}
ffi::Error backward_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out, ffi::AnyBuffer lse,
                        ffi::AnyBuffer d_out, ffi::RemainingArgs args, ffi::Result<ffi::AnyBuffer> dq,
                        ffi::Result<ffi::AnyBuffer> dk, ffi::Result<ffi::AnyBuffer> dv,
                        ffi::Result<ffi::AnyBuffer> ws, ffi::RemainingRets rets, SINKATTN_ATTR_PARAMS) {
  return backward_impl(SINKATTN_BACKEND_CPU, nullptr, q, k, v, out, lse, d_out, args, dq, dk, dv, ws, rets,
                       SINKATTN_ATTR_OPTIONS);
}
ffi::Error backward_cuda(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::AnyBuffer out,
                         ffi::AnyBuffer lse, ffi::AnyBuffer d_out, ffi::RemainingArgs args,
                         ffi::Result<ffi::AnyBuffer> dq, ffi::Result<ffi::AnyBuffer> dk,
                         ffi::Result<ffi::AnyBuffer> dv, ffi::Result<ffi::AnyBuffer> ws, ffi::RemainingRets rets,
                         SINKATTN_ATTR_PARAMS) {
  return backward_impl(SINKATTN_BACKEND_CUDA, stream, q, k, v, out, lse, d_out, args, dq, dk, dv, ws, rets,
                       SINKATTN_ATTR_OPTIONS);
}

// Decode: the forward with num_splits (key splits, SPEC.md section 4).
ffi::Error decode_cpu(ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs args,
                      ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse, ffi::Result<ffi::AnyBuffer> ws,
                      ffi::RemainingRets rets, SINKATTN_ATTR_PARAMS, int32_t num_splits) {
  return forward_impl(SINKATTN_BACKEND_CPU, nullptr, q, k, v, args, out, lse, ws, rets, SINKATTN_ATTR_OPTIONS,
                      num_splits);
}
ffi::Error decode_cuda(void* stream, ffi::AnyBuffer q, ffi::AnyBuffer k, ffi::AnyBuffer v, ffi::RemainingArgs args,
                       ffi::Result<ffi::AnyBuffer> out, ffi::Result<ffi::AnyBuffer> lse,
                       ffi::Result<ffi::AnyBuffer> ws, ffi::RemainingRets rets, SINKATTN_ATTR_PARAMS,
                       int32_t num_splits) {
  return forward_impl(SINKATTN_BACKEND_CUDA, stream, q, k, v, args, out, lse, ws, rets, SINKATTN_ATTR_OPTIONS,
                      num_splits);
}

auto fwd_binding() {
  return ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().RemainingArgs()
      .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().RemainingRets();
}
auto bwd_binding() {
  return ffi::Ffi::Bind().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
      .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().RemainingArgs()
      .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().RemainingRets();
}

}  // namespace

// Exported (the library is built with hidden visibility): the handler symbols are looked up by _ffi.py.
#pragma GCC visibility push(default)
// The CUDA handlers take XLA's stream as an opaque pointer (cudaStream_t), so this library needs no CUDA headers.
// They neither synchronise nor allocate (the workspace is an XLA buffer): safe inside CUDA graphs (command buffers).
XLA_FFI_DEFINE_HANDLER_SYMBOL(sinkattn_jax_forward_cpu, forward_cpu, bind_attrs(fwd_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(sinkattn_jax_backward_cpu, backward_cpu, bind_attrs(bwd_binding()));
XLA_FFI_DEFINE_HANDLER_SYMBOL(sinkattn_jax_forward_cuda, forward_cuda,
                              bind_attrs(ffi::Ffi::Bind()
                                             .Ctx<ffi::PlatformStream<void*>>()
                                             .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                             .RemainingArgs()
                                             .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                             .RemainingRets()),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(sinkattn_jax_decode_cpu, decode_cpu,
                              bind_attrs(fwd_binding()).Attr<int32_t>("num_splits"));
XLA_FFI_DEFINE_HANDLER_SYMBOL(sinkattn_jax_decode_cuda, decode_cuda,
                              bind_attrs(ffi::Ffi::Bind()
                                             .Ctx<ffi::PlatformStream<void*>>()
                                             .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                             .RemainingArgs()
                                             .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                             .RemainingRets())
                                  .Attr<int32_t>("num_splits"),
                              {ffi::Traits::kCmdBufferCompatible});
XLA_FFI_DEFINE_HANDLER_SYMBOL(sinkattn_jax_backward_cuda, backward_cuda,
                              bind_attrs(ffi::Ffi::Bind()
                                             .Ctx<ffi::PlatformStream<void*>>()
                                             .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                             .Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>().Arg<ffi::AnyBuffer>()
                                             .RemainingArgs()
                                             .Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>().Ret<ffi::AnyBuffer>()
                                             .Ret<ffi::AnyBuffer>().RemainingRets()),
                              {ffi::Traits::kCmdBufferCompatible});
#pragma GCC visibility pop

// ABI check for the ctypes mirror of sinkattn_params_t in _ffi.py: sizeof and the offsets of a few fields.
extern "C" __attribute__((visibility("default"))) int32_t sinkattn_jax_params_layout(int64_t* out, int32_t n) {
  const int64_t v[] = {
      static_cast<int64_t>(sizeof(sinkattn_params_t)),
      static_cast<int64_t>(sizeof(sinkattn_tensor_t)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, max_seqlen_q)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, out)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, softmax_type)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, dropout_p)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, rng_state)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, deterministic)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, workspace_bytes)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, page_table)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, trust_device_batch_tensors)),
      static_cast<int64_t>(offsetof(sinkattn_params_t, num_splits)),
  };
  const int32_t count = static_cast<int32_t>(sizeof(v) / sizeof(v[0]));
  for (int32_t i = 0; i < n && i < count; ++i) out[i] = v[i];
  return count;
}

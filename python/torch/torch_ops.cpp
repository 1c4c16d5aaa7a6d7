// PyTorch operators of sinkattn on PyTorch's stable ABI (STABLE_TORCH_LIBRARY, torch/csrc/stable): one build of this
// library loads into every PyTorch from the stable-ABI version it targets (TORCH_TARGET_VERSION, set by
// python/torch/CMakeLists.txt) on, whatever PyTorch it was compiled against, and depends on no Python version.
//
//   torch.ops.sinkattn.fwd(q, k, v, sinks, bias, cu_seqlens_q, cu_seqlens_kv, seqused_kv, seqlens_q, seqlens_kv,
//                          page_table, max_seqlen_q, max_seqlen_kv, softmax_type, softmax_scale, window_left,
//                          window_right, mask_alignment, dropout_p, rng_seed_offset, deterministic,
//                          trust_device_batch_tensors, num_splits) -> (out, softmax_lse, rng_state)
//   torch.ops.sinkattn.bwd(d_out, q, k, v, out, softmax_lse, d_lse, sinks, bias, cu_seqlens_q, cu_seqlens_kv,
//                          seqused_kv, seqlens_q, seqlens_kv, max_seqlen_q, max_seqlen_kv, softmax_type,
//                          softmax_scale, window_left, window_right, mask_alignment, dropout_p, rng_state,
//                          deterministic, trust_device_batch_tensors) -> (dq, dk, dv, d_sinks, d_bias)
//
// Each is one sinkattn_params_t (include/sinkattn/sinkattn.h, SPEC.md sections 1-4) over the caller's tensors (any
// strides, last dimension contiguous) and one C ABI call, sinkattn_forward_alloc / sinkattn_backward_alloc: the library
// validates the call once, sizes its workspace and takes it from PyTorch's allocator through a callback, runs the
// pass and (varlen) fills the rows of no sequence; its message (sinkattn_last_error) becomes the Python exception
// (RuntimeError "sinkattn: ..."). Host time per call (issue 11: at most 15 us over the C ABI call) is why the
// tensors' metadata is read once (Device, Views: the sizes / strides arrays) and nothing is validated twice.
// Shapes and dtypes:
//   dense  q [b, s_q, h_q, d], k [b, s_kv, h_kv, d], v [b, s_kv, h_kv, d_v] -> out [b, s_q, h_q, d_v] (q's dtype),
//          softmax_lse fp32 [b, h_q, s_q];  varlen (cu_seqlens_q given) q [total_q, h_q, d] -> out [total_q, h_q, d_v],
//          softmax_lse fp32 [h_q, total_q]; rng_state int64 [2] = {seed, offset} with dropout_p > 0, else [0] (SPEC.md section 2, dropout).
//   bwd: dq, dk, dv of the shapes and dtype of q, k, v; d_sinks fp32 [h_q] (learnable, else [0]); d_bias of bias's
//        dtype and shape (else [0]). Every output is a new contiguous tensor.
// The same kernel function serves the CPU and CUDA dispatch keys: the memory of the tensors picks the library's
// backend. CUDA: the call runs on PyTorch's current stream of q's device (under a device guard), every buffer (outputs
// and the library's workspace) comes from PyTorch's caching allocator, and nothing reads device memory back to the host
// when trust_device_batch_tensors is set (otherwise the library checks the batch tensors' contents with one
// synchronising copy, and skips that while the stream is being captured into a CUDA graph): graph capturable.
// Fake (meta) kernels and autograd are registered from Python (python/sinkattn/torch/_ops.py).
#include <dlfcn.h>

#include <cmath>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>

#include "sinkattn/sinkattn.h"

namespace {

using torch::stable::Tensor;
using torch::headeronly::ScalarType;
using OptTensor = std::optional<Tensor>;

// Errors reach Python as RuntimeError("sinkattn: <message>") (PyTorch's translation of std::runtime_error).
[[noreturn]] void fail(const std::string& msg) { throw std::runtime_error("sinkattn: " + msg); }

void check_status(sinkattn_status_t st) {
  if (st != SINKATTN_OK) fail(sinkattn_last_error());
}

sinkattn_dtype_t dtype_of(const Tensor& t, const char* name) {
  switch (t.scalar_type()) {
    case ScalarType::Float: return SINKATTN_F32;
    case ScalarType::Half: return SINKATTN_F16;
    case ScalarType::BFloat16: return SINKATTN_BF16;
    case ScalarType::Int: return SINKATTN_I32;
    case ScalarType::Long: return SINKATTN_I64;
    default: break;
  }
  fail(std::string(name) + ": dtype must be float32, float16, bfloat16 (or int32 / int64 for batch and rng tensors)");
}

// The device of a call (q's): the stable C shim's device type and index, read once per call.
struct Device {
  int32_t type = 0, index = 0;
  bool cuda = false;
  explicit Device(const Tensor& t) {
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_type(t.get(), &type));
    cuda = type == aoti_torch_device_type_cuda();
    if (cuda) STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_device_index(t.get(), &index));
  }
};

// A new contiguous tensor of `rank` extents from PyTorch's allocator (the caching allocator on CUDA) on `dev`.
Tensor new_tensor(const int64_t* shape, int64_t rank, int32_t dtype, const Device& dev) {
  int64_t strides[SINKATTN_MAX_RANK];
  int64_t s = 1;
  for (int64_t i = rank; i-- > 0;) {
    strides[i] = s;
    s *= shape[i] > 0 ? shape[i] : 1;
  }
  AtenTensorHandle h = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_empty_strided(rank, shape, strides, dtype, dev.type, dev.index, &h));
  return Tensor(h);
}
Tensor new_tensor(std::initializer_list<int64_t> shape, int32_t dtype, const Device& dev) {
  return new_tensor(shape.begin(), static_cast<int64_t>(shape.size()), dtype, dev);
}

// Strided views of one call's tensors (SPEC.md section 1: strides in elements; the library checks the last one is 1).
// PyTorch gives an empty tensor no storage (data NULL), which the library refuses for a present tensor; such a view
// points at a small allocation on the call's device instead (never read: the tensor has no element) and has
// row-major strides, so that zero-length inputs (a batch without keys, varlen buffers with no rows) keep their meaning.
// Sizes and strides are read as the tensor's arrays (borrowed, two shim calls), not one call per dimension.
struct Views {
  const Device& dev;
  std::optional<Tensor> placeholder;

  sinkattn_tensor_t operator()(const Tensor& t, const char* name) {
    const int64_t rank = t.dim();
    if (rank < 1 || rank > SINKATTN_MAX_RANK)
      fail(std::string(name) + ": rank must be between 1 and 4, got " + std::to_string(rank));
    int64_t* sizes = nullptr;
    int64_t* strides = nullptr;
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_sizes(t.get(), &sizes));
    STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_strides(t.get(), &strides));
    sinkattn_tensor_t v{};
    v.data = t.data_ptr();
    v.dtype = dtype_of(t, name);
    v.rank = static_cast<int32_t>(rank);
    bool empty = false;  // no element: any strides (PyTorch may give 0), here row-major ones
    for (int64_t i = 0; i < rank; ++i) empty |= sizes[i] == 0;
    int64_t stride = 1;
    for (int64_t i = rank; i-- > 0;) {
      v.shape[i] = sizes[i];
      v.strides[i] = empty ? stride : strides[i];
      stride *= v.shape[i] > 0 ? v.shape[i] : 1;
    }
    if (v.data == nullptr && empty) {
      if (!placeholder) placeholder = new_tensor({16}, aoti_torch_dtype_uint8(), dev);
      v.data = placeholder->data_ptr();
    }
    return v;
  }
  sinkattn_tensor_t operator()(const OptTensor& t, const char* name) {
    return t.has_value() ? (*this)(*t, name) : sinkattn_tensor_t{};
  }
};

// Every tensor of a call lives on q's device (the library tells host from device memory, not one GPU from another).
void same_device(const Device& q, const OptTensor& t, const char* name) {
  if (!t.has_value()) return;
  const Device d(*t);
  if (d.cuda != q.cuda || (q.cuda && d.index != q.index)) fail(std::string(name) + ": must be on the device of q");
}

int32_t torch_dtype(const Tensor& t) {
  int32_t d = 0;
  STABLE_TORCH_ERROR_CODE_CHECK(aoti_torch_get_dtype(t.get(), &d));
  return d;
}

// PyTorch's current CUDA stream of a device. aoti_torch_get_current_cuda_stream (part of the stable C shim) lives in
// libtorch_cuda.so; it is looked up in the already loaded library at the first CUDA call instead of being linked, so
// that this one binary also loads into a PyTorch built without CUDA (whose CPU tensors never get here).
void* current_cuda_stream(int32_t device_index) {
  using Fn = AOTITorchError (*)(int32_t, void**);
  static Fn fn = [] {
    void* lib = dlopen("libtorch_cuda.so", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<Fn>(dlsym(lib, "aoti_torch_get_current_cuda_stream")) : nullptr;
  }();
  if (fn == nullptr) fail("CUDA tensors, but PyTorch's libtorch_cuda.so (the current CUDA stream) was not found");
  void* stream = nullptr;
  STABLE_TORCH_ERROR_CODE_CHECK(fn(device_index, &stream));
  return stream;
}

// Where and how the library runs: backend, stream (CUDA) or thread count (CPU, PyTorch's intra-op threads).
struct Placement {
  std::optional<torch::stable::accelerator::DeviceGuard> guard;
  void place(const Device& dev, sinkattn_params_t* p) {
    if (dev.cuda) {
      guard.emplace(dev.index);
      p->backend = SINKATTN_BACKEND_CUDA;
      p->stream = current_cuda_stream(dev.index);
    } else {
      p->backend = SINKATTN_BACKEND_CPU;
      p->num_threads = static_cast<int32_t>(torch::stable::get_num_threads());
    }
  }
};

// The part of sinkattn_params_t that forward and backward share (SPEC.md sections 1-2): q, k, v, sinks, bias, the
// batch description and the options, with the backend placement; every tensor is checked to be on q's device.
struct Call {
  Device dev;
  sinkattn_params_t p;
  Placement where;
  Views view;

  Call(const Tensor& q, const Tensor& k, const Tensor& v, const OptTensor& sinks, const OptTensor& bias,
       const OptTensor& cu_seqlens_q, const OptTensor& cu_seqlens_kv, const OptTensor& seqused_kv,
       const OptTensor& seqlens_q, const OptTensor& seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv,
       int64_t softmax_type, std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
       int64_t mask_alignment, double dropout_p, bool deterministic, bool trust_device_batch_tensors)
      : dev(q), view{dev, std::nullopt} {
    sinkattn_params_init(&p);
    where.place(dev, &p);
    input(k, "k", &p.k);
    input(v, "v", &p.v);
    input(sinks, "sinks", &p.sinks);
    input(bias, "bias", &p.bias);
    input(cu_seqlens_q, "cu_seqlens_q", &p.cu_seqlens_q);
    input(cu_seqlens_kv, "cu_seqlens_kv", &p.cu_seqlens_kv);
    input(seqused_kv, "seqused_kv", &p.seqused_kv);
    input(seqlens_q, "seqlens_q", &p.seqlens_q);
    input(seqlens_kv, "seqlens_kv", &p.seqlens_kv);
    p.q = view(q, "q");
    p.softmax_type = static_cast<sinkattn_softmax_type_t>(softmax_type);
    p.softmax_scale = softmax_scale.has_value() ? static_cast<float>(*softmax_scale) : NAN;
    p.window_left = window_left;
    p.window_right = window_right;
    p.mask_alignment = static_cast<sinkattn_mask_alignment_t>(mask_alignment);
    p.dropout_p = dropout_p;
    p.max_seqlen_q = max_seqlen_q;
    p.max_seqlen_kv = max_seqlen_kv;
    p.deterministic = deterministic ? 1 : 0;
    p.trust_device_batch_tensors = trust_device_batch_tensors ? 1 : 0;
  }

  // A tensor the call reads: on q's device, viewed into `field`.
  void input(const OptTensor& t, const char* name, sinkattn_tensor_t* field) {
    same_device(dev, t, name);
    *field = view(t, name);
  }

  // The pass, validated once by the library (sinkattn_forward_alloc / sinkattn_backward_alloc): the workspace
  // (SPEC.md section 4) from PyTorch's allocator through the library's callback, and for varlen calls the rows of no
  // sequence (SPEC.md section 1: a binding that allocates the outputs returns out = 0, dq = dk = dv = 0 and
  // LSE = -inf there) filled by the library's helper in the same call, on the call's stream, writing exactly those
  // rows. The workspace tensor lives until the end of the kernel (on CUDA the caching allocator hands its block out
  // again only to work queued after the pass on the same stream).
  void run(bool backward, bool varlen) {
    struct Workspace {
      const Device& dev;
      std::optional<Tensor> tensor;
      std::exception_ptr error;
      static void* alloc(size_t bytes, void* user) {
        auto* w = static_cast<Workspace*>(user);
        try {
          const int64_t n = static_cast<int64_t>(bytes);
          w->tensor = new_tensor(&n, 1, aoti_torch_dtype_uint8(), w->dev);
          return w->tensor->data_ptr();
        } catch (...) {  // never across the C ABI: rethrown below
          w->error = std::current_exception();
          return nullptr;
        }
      }
    } ws{dev, std::nullopt, nullptr};
    const uint32_t flags = varlen ? SINKATTN_RUN_CLEAR_UNOWNED_ROWS : 0u;
    const sinkattn_status_t st = backward ? sinkattn_backward_alloc(&p, &Workspace::alloc, &ws, flags)
                                          : sinkattn_forward_alloc(&p, &Workspace::alloc, &ws, flags);
    if (ws.error) {  // the library's message (how much and why) with PyTorch's reason
      std::string why = "unknown error";
      try {
        std::rethrow_exception(ws.error);
      } catch (const std::exception& e) {
        why = e.what();
      } catch (...) {
      }
      fail(std::string(sinkattn_last_error()) + "; PyTorch's allocator: " + why);
    }
    check_status(st);
  }
};

std::tuple<Tensor, Tensor, Tensor> fwd(Tensor q, Tensor k, Tensor v, OptTensor sinks, OptTensor bias,
                                       OptTensor cu_seqlens_q, OptTensor cu_seqlens_kv, OptTensor seqused_kv,
                                       OptTensor seqlens_q, OptTensor seqlens_kv, OptTensor page_table,
                                       int64_t max_seqlen_q, int64_t max_seqlen_kv, int64_t softmax_type,
                                       std::optional<double> softmax_scale, int64_t window_left, int64_t window_right,
                                       int64_t mask_alignment, double dropout_p, OptTensor rng_seed_offset,
                                       bool deterministic, bool trust_device_batch_tensors, int64_t num_splits) {
  const bool varlen = cu_seqlens_q.has_value();
  if (q.dim() != (varlen ? 3 : 4))
    fail(std::string("q: rank must be ") + (varlen ? "3 for [total_q, h_q, d] (varlen)" : "4 for [b, s_q, h_q, d] (dense)") +
         ", got " + std::to_string(q.dim()));
  // v is a page pool [num_pages, page_size, h_kv, d_v] with a page table (SPEC.md section 1), else shaped like q
  if (!page_table.has_value() && v.dim() != q.dim())
    fail("v: rank must be " + std::to_string(q.dim()) + " like q, got " + std::to_string(v.dim()));
  Call call(q, k, v, sinks, bias, cu_seqlens_q, cu_seqlens_kv, seqused_kv, seqlens_q, seqlens_kv, max_seqlen_q,
            max_seqlen_kv, softmax_type, softmax_scale, window_left, window_right, mask_alignment, dropout_p,
            deterministic,  // a backward option: carried by the forward for its autograd formula
            trust_device_batch_tensors);
  sinkattn_params_t& p = call.p;
  call.input(page_table, "page_table", &p.page_table);
  call.input(rng_seed_offset, "rng_seed_offset", &p.rng_seed_offset);
  p.num_splits = static_cast<int32_t>(num_splits);

  // the shapes from the views already taken (p.q, p.v: q's and v's extents)
  const int64_t* qs = p.q.shape;
  const int64_t h_q = qs[varlen ? 1 : 2], d_v = p.v.shape[p.v.rank - 1];
  const Device& dev = call.dev;
  const int32_t q_dtype = torch_dtype(q);
  Tensor out = varlen ? new_tensor({qs[0], h_q, d_v}, q_dtype, dev) : new_tensor({qs[0], qs[1], h_q, d_v}, q_dtype, dev);
  Tensor lse = varlen ? new_tensor({h_q, qs[0]}, aoti_torch_dtype_float32(), dev)
                      : new_tensor({qs[0], h_q, qs[1]}, aoti_torch_dtype_float32(), dev);
  // {seed, offset} of the dropout mask (SPEC.md section 3) when dropout is on; without dropout an empty [0] tensor:
  // nothing to reproduce, and no kernel launch on the hot path.
  const bool dropout = dropout_p > 0.0;
  Tensor rng_state = new_tensor({dropout ? 2 : 0}, aoti_torch_dtype_int64(), dev);
  p.out = call.view(out, "out");
  p.softmax_lse = call.view(lse, "softmax_lse");
  if (dropout) p.rng_state = call.view(rng_state, "rng_state");
  call.run(/*backward=*/false, varlen);
  return {out, lse, rng_state};
}

std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor> bwd(
    Tensor d_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, OptTensor d_lse, OptTensor sinks,
    OptTensor bias, OptTensor cu_seqlens_q, OptTensor cu_seqlens_kv, OptTensor seqused_kv, OptTensor seqlens_q,
    OptTensor seqlens_kv, int64_t max_seqlen_q, int64_t max_seqlen_kv, int64_t softmax_type,
    std::optional<double> softmax_scale, int64_t window_left, int64_t window_right, int64_t mask_alignment,
    double dropout_p, OptTensor rng_state, bool deterministic, bool trust_device_batch_tensors) {
  const bool varlen = cu_seqlens_q.has_value();
  Call call(q, k, v, sinks, bias, cu_seqlens_q, cu_seqlens_kv, seqused_kv, seqlens_q, seqlens_kv, max_seqlen_q,
            max_seqlen_kv, softmax_type, softmax_scale, window_left, window_right, mask_alignment, dropout_p,
            deterministic, trust_device_batch_tensors);
  sinkattn_params_t& p = call.p;
  call.input(out, "out", &p.out);
  call.input(softmax_lse, "softmax_lse", &p.softmax_lse);
  call.input(d_out, "d_out", &p.d_out);
  call.input(d_lse, "d_lse", &p.d_lse);
  if (dropout_p > 0.0) call.input(rng_state, "rng_state", &p.rng_state);

  // each gradient has the shape of its input's view (p.q, p.k, ...: the extents read once)
  const Device& dev = call.dev;
  auto like = [&](const sinkattn_tensor_t& view, int32_t dtype) {
    return new_tensor(view.shape, view.rank, dtype, dev);
  };
  Tensor dq = like(p.q, torch_dtype(q));
  Tensor dk = like(p.k, torch_dtype(k));
  Tensor dv = like(p.v, torch_dtype(v));
  const bool learnable = softmax_type == SINKATTN_SOFTMAX_LEARNABLE;
  Tensor d_sinks = learnable && sinks.has_value() ? like(p.sinks, aoti_torch_dtype_float32())
                                                  : new_tensor({0}, aoti_torch_dtype_float32(), dev);
  Tensor d_bias = bias.has_value() ? like(p.bias, torch_dtype(*bias)) : new_tensor({0}, aoti_torch_dtype_float32(), dev);
  p.dq = call.view(dq, "dq");
  p.dk = call.view(dk, "dk");
  p.dv = call.view(dv, "dv");
  if (learnable) p.d_sinks = call.view(d_sinks, "d_sinks");
  if (bias.has_value()) p.d_bias = call.view(d_bias, "d_bias");
  call.run(/*backward=*/true, varlen);
  return {dq, dk, dv, d_sinks, d_bias};
}

}  // namespace

STABLE_TORCH_LIBRARY(sinkattn, m) {
  m.def(
      "fwd(Tensor q, Tensor k, Tensor v, Tensor? sinks, Tensor? bias, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, "
      "Tensor? seqused_kv, Tensor? seqlens_q, Tensor? seqlens_kv, Tensor? page_table, int max_seqlen_q, "
      "int max_seqlen_kv, int softmax_type, float? softmax_scale, int window_left, int window_right, "
      "int mask_alignment, float dropout_p, Tensor? rng_seed_offset, bool deterministic, "
      "bool trust_device_batch_tensors, int num_splits) -> (Tensor out, Tensor softmax_lse, Tensor rng_state)");
  m.def(
      "bwd(Tensor d_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor softmax_lse, Tensor? d_lse, Tensor? sinks, "
      "Tensor? bias, Tensor? cu_seqlens_q, Tensor? cu_seqlens_kv, Tensor? seqused_kv, Tensor? seqlens_q, "
      "Tensor? seqlens_kv, int max_seqlen_q, int max_seqlen_kv, int softmax_type, float? softmax_scale, "
      "int window_left, int window_right, int mask_alignment, float dropout_p, Tensor? rng_state, "
      "bool deterministic, bool trust_device_batch_tensors) "
      "-> (Tensor dq, Tensor dk, Tensor dv, Tensor d_sinks, Tensor d_bias)");
}

STABLE_TORCH_LIBRARY_IMPL(sinkattn, CPU, m) {
  m.impl("fwd", TORCH_BOX(&fwd));
  m.impl("bwd", TORCH_BOX(&bwd));
}

STABLE_TORCH_LIBRARY_IMPL(sinkattn, CUDA, m) {
  m.impl("fwd", TORCH_BOX(&fwd));
  m.impl("bwd", TORCH_BOX(&bwd));
}

// sinkattn: thin C++ layer over the C ABI (sinkattn.h). Same semantics (SPEC.md sections 1-4); failures throw
// sinkattn::Error carrying the status and the library's message instead of returning a status.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "sinkattn/sinkattn.h"

namespace sinkattn {

// Thrown by the functions below when the C ABI returns a status other than SINKATTN_OK.
class Error : public std::runtime_error {
 public:
  Error(sinkattn_status_t status, const std::string& message) : std::runtime_error(message), status_(status) {}
  sinkattn_status_t status() const { return status_; }

 private:
  sinkattn_status_t status_;
};

inline void check(sinkattn_status_t st) {
  if (st != SINKATTN_OK) throw Error(st, sinkattn_last_error());
}

// A strided tensor view: shape and strides in elements (strides empty = row-major contiguous).
inline sinkattn_tensor_t tensor(void* data, sinkattn_dtype_t dtype, std::initializer_list<int64_t> shape,
                                std::initializer_list<int64_t> strides = {}) {
  if (shape.size() > SINKATTN_MAX_RANK || (strides.size() != 0 && strides.size() != shape.size()))
    throw Error(SINKATTN_ERR_INVALID_ARGUMENT, "tensor: rank must be <= 4 and strides must match the shape");
  return sinkattn_make_tensor(data, dtype, static_cast<int32_t>(shape.size()), shape.begin(),
                              strides.size() ? strides.begin() : nullptr);
}

// sinkattn_params_t with the library defaults (sinkattn_params_init).
inline sinkattn_params_t default_params() {
  sinkattn_params_t p;
  sinkattn_params_init(&p);
  return p;
}

// SPEC.md section 2. Throws Error.
inline void forward(const sinkattn_params_t& p) { check(sinkattn_forward(&p)); }
// SPEC.md section 3. Throws Error.
inline void backward(const sinkattn_params_t& p) { check(sinkattn_backward(&p)); }

// SPEC.md section 4: workspace bytes for the forward / backward of `p`.
inline size_t forward_workspace_size(const sinkattn_params_t& p) {
  size_t bytes = 0;
  check(sinkattn_forward_workspace_size(&p, &bytes));
  return bytes;
}
inline size_t backward_workspace_size(const sinkattn_params_t& p) {
  size_t bytes = 0;
  check(sinkattn_backward_workspace_size(&p, &bytes));
  return bytes;
}

// sinkattn_forward_alloc / sinkattn_backward_alloc: one validation, the workspace from `alloc(bytes)` (any callable
// returning void*; called at most once, with bytes > 0; an exception from it propagates after the library call
// returned, nothing written), flags as the C functions take. Throws Error.
namespace detail {
template <class Alloc>
struct AllocCall {
  Alloc* alloc;
  std::exception_ptr error;
  static void* call(size_t bytes, void* user) {
    auto* self = static_cast<AllocCall*>(user);
    try {
      return (*self->alloc)(bytes);
    } catch (...) {
      self->error = std::current_exception();
      return nullptr;
    }
  }
};
template <class Alloc>
void run_alloc(sinkattn_status_t (*fn)(const sinkattn_params_t*, sinkattn_workspace_alloc_t, void*, uint32_t),
               const sinkattn_params_t& p, Alloc&& alloc, uint32_t flags) {
  using A = std::remove_reference_t<Alloc>;
  AllocCall<A> ctx{&alloc, nullptr};
  const sinkattn_status_t st = fn(&p, &AllocCall<A>::call, &ctx, flags);
  if (ctx.error) std::rethrow_exception(ctx.error);
  check(st);
}
}  // namespace detail
template <class Alloc>
void forward_alloc(const sinkattn_params_t& p, Alloc&& alloc, uint32_t flags = 0) {
  detail::run_alloc(&sinkattn_forward_alloc, p, std::forward<Alloc>(alloc), flags);
}
template <class Alloc>
void backward_alloc(const sinkattn_params_t& p, Alloc&& alloc, uint32_t flags = 0) {
  detail::run_alloc(&sinkattn_backward_alloc, p, std::forward<Alloc>(alloc), flags);
}

// Which backend would run `p`, and the per-backend report (why each other backend was not chosen).
struct BackendChoice {
  sinkattn_backend_t backend = SINKATTN_BACKEND_AUTO;  // AUTO: none can
  sinkattn_status_t status = SINKATTN_OK;
  std::string report;
};
inline BackendChoice query_backend(const sinkattn_params_t& p, bool backward_pass) {
  BackendChoice c;
  char buf[4096];
  c.status = sinkattn_query_backend(&p, backward_pass ? 1 : 0, &c.backend, buf, sizeof(buf));
  c.report = buf;
  return c;
}

}  // namespace sinkattn

// The C entry points: validation, dispatch, workspace checks, last error (SPEC.md section 4).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

#include "core/backend.hpp"
#include "core/philox.hpp"
#include "core/unowned_rows.hpp"
#include "core/validate.hpp"
#include "sinkattn/sinkattn.h"

#ifndef SINKATTN_VERSION_STRING
#define SINKATTN_VERSION_STRING "0.0.0"
#endif

namespace sinkattn {

#ifndef SINKATTN_WITH_CUDA
const Backend* cuda_backend() { return nullptr; }
Status cuda_clear_unowned_rows(const UnownedRegion*, int, void*) {
  return unsupported("clear_unowned_rows: device memory needs the CUDA backend, not compiled into this library");
}
#endif

Memory pointer_memory(const void* ptr) {
#ifdef SINKATTN_WITH_CUDA
  return cuda_pointer_memory(ptr);
#else
  (void)ptr;
  return Memory::kHost;
#endif
}

bool device_to_host(const void* src, void* dst, size_t bytes, void* stream) {
#ifdef SINKATTN_WITH_CUDA
  return cuda_device_to_host(src, dst, bytes, stream);
#else
  (void)src, (void)dst, (void)bytes, (void)stream;
  return false;
#endif
}

namespace {

thread_local std::string g_last_error;

sinkattn_status_t fail(const Status& st) {
  g_last_error = st.message;
  return st.code;
}

const char* backend_name(sinkattn_backend_t b) {
  switch (b) {
    case SINKATTN_BACKEND_CPU: return "cpu";
    case SINKATTN_BACKEND_CUDA: return "cuda";
    default: return "auto";
  }
}

const Backend* backend_for(sinkattn_backend_t b) {
  return b == SINKATTN_BACKEND_CPU ? cpu_backend() : b == SINKATTN_BACKEND_CUDA ? cuda_backend() : nullptr;
}

struct Choice {
  const Backend* backend = nullptr;
  Status status;       // why nothing was chosen, when backend == nullptr
  std::string report;  // one line per backend
};

// Picks the backend for a resolved call. Explicit requests are honoured or refused with the reason; AUTO takes
// the backend that matches the memory of the tensors (CUDA for device memory, CPU for host memory).
// with_kernels: the chosen backend's line also names its kernels (Backend::kernel_report), for
// sinkattn_query_backend.
Choice choose_backend(const Call& c, bool with_kernels = false) {
  Choice ch;
  const sinkattn_backend_t requested = c.p->backend;
  const sinkattn_backend_t natural = c.memory == Memory::kDevice ? SINKATTN_BACKEND_CUDA : SINKATTN_BACKEND_CPU;
  std::string first_reason;
  for (sinkattn_backend_t id : {SINKATTN_BACKEND_CPU, SINKATTN_BACKEND_CUDA}) {
    std::string line = std::string(backend_name(id)) + ": ";
    const Backend* b = backend_for(id);
    std::string why;
    if (b == nullptr) {
      why = "not compiled into this library";
    } else if (requested != SINKATTN_BACKEND_AUTO && requested != id) {
      why = std::string("not requested (backend = ") + backend_name(requested) + ")";
    } else if (requested == SINKATTN_BACKEND_AUTO && id != natural) {
      why = std::string("tensors are in ") + (c.memory == Memory::kDevice ? "device" : "host") + " memory";
    } else {
      const Status st = b->supports(c);
      if (st.is_ok() && ch.backend == nullptr) {
        ch.backend = b;
        line += std::string("chosen (") +
                (requested == SINKATTN_BACKEND_AUTO
                     ? (c.memory == Memory::kDevice ? "tensors in device memory" : "tensors in host memory")
                     : "requested") +
                ")";
        if (with_kernels) {
          const std::string k = b->kernel_report(c);
          if (!k.empty()) line += "; kernels: " + k;
        }
        ch.report += line + "\n";
        continue;
      }
      why = st.is_ok() ? "another backend was chosen first" : st.message;
      if (!st.is_ok() && first_reason.empty()) {
        first_reason = std::string(backend_name(id)) + ": " + st.message;
        ch.status = st;
      }
    }
    ch.report += line + "not chosen: " + why + "\n";
  }
  if (ch.backend == nullptr) {
    if (first_reason.empty()) {
      const Backend* want = backend_for(requested == SINKATTN_BACKEND_AUTO ? natural : requested);
      ch.status = unsupported(std::string("no backend can run this call: ") +
                              (want == nullptr ? std::string(backend_name(requested == SINKATTN_BACKEND_AUTO
                                                                              ? natural
                                                                              : requested)) +
                                                     " backend is not compiled into this library"
                                               : std::string("see the backend report")));
    } else {
      ch.status = Status{ch.status.code == SINKATTN_ERR_INVALID_ARGUMENT ? SINKATTN_ERR_INVALID_ARGUMENT
                                                                          : SINKATTN_ERR_UNSUPPORTED,
                         "no backend can run this call: " + first_reason};
    }
  }
  return ch;
}

// choose_backend without the report: the backend that runs a call the dispatcher would accept. Only the requested
// backend (or, for AUTO, the one of the tensors' memory) is ever a candidate, so this asks that one alone; when it
// cannot run the call (or is not compiled in), choose_backend builds the full answer (status and message). The
// run entry points use this: per call it saves building the report strings nobody reads.
Choice choose_backend_quiet(const Call& c) {
  const sinkattn_backend_t requested = c.p->backend;
  const sinkattn_backend_t id = requested != SINKATTN_BACKEND_AUTO ? requested
                                : c.memory == Memory::kDevice     ? SINKATTN_BACKEND_CUDA
                                                                  : SINKATTN_BACKEND_CPU;
  const Backend* b = backend_for(id);
  if (b != nullptr && b->supports(c).is_ok()) {
    Choice ch;
    ch.backend = b;
    return ch;
  }
  return choose_backend(c);
}

Status workspace_size_impl(const sinkattn_params_t* p, Pass pass, size_t* bytes) {
  if (bytes == nullptr) return invalid("bytes: pointer is NULL");
  Call c;
  SINKATTN_RETURN_IF_ERROR(resolve_call(p, pass, /*shape_only=*/true, &c));
  const Choice ch = choose_backend_quiet(c);
  if (ch.backend == nullptr) return ch.status;
  return ch.backend->workspace_size(c, bytes);
}

// What every run entry point does first: the call validated with its data (resolve_call), the backend that runs
// it and the workspace bytes it needs there.
Status prepare_run(const sinkattn_params_t* p, Pass pass, Call* c, Choice* ch, size_t* need) {
  SINKATTN_RETURN_IF_ERROR(resolve_call(p, pass, /*shape_only=*/false, c));
  *ch = choose_backend_quiet(*c);
  if (ch->backend == nullptr) return ch->status;
  *need = 0;
  return ch->backend->workspace_size(*c, need);
}

// "N bytes (X.Y GiB: <what the backend keeps there>)": how much workspace a call needs and why, for the messages of
// a workspace that is too small or that the allocator could not give.
std::string workspace_need(const Call& c, const Backend& b, size_t need) {
  char gib[32];
  std::snprintf(gib, sizeof gib, "%.3g GiB", static_cast<double>(need) / double(1ull << 30));
  const std::string why = b.workspace_report(c);
  return std::to_string(need) + " bytes (" + gib + (why.empty() ? "" : ": " + why) + ")";
}

Status run_impl(const sinkattn_params_t* p, Pass pass) {
  Call c;
  Choice ch;
  size_t need = 0;
  SINKATTN_RETURN_IF_ERROR(prepare_run(p, pass, &c, &ch, &need));
  if (p->workspace_bytes < need || (need > 0 && p->workspace == nullptr))
    return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL,
                  "workspace: this " + std::string(pass == Pass::kForward ? "forward" : "backward") + " on the " +
                      ch.backend->name() + " backend needs " + workspace_need(c, *ch.backend, need) + ", got " +
                      std::to_string(p->workspace == nullptr ? 0 : p->workspace_bytes) +
                      (p->workspace == nullptr && need > 0 ? " (NULL pointer)" : "")};
  return ch.backend->run(c);
}

// sinkattn_clear_unowned_rows: the rows of a varlen call's outputs that belong to no sequence (SPEC.md section 1),
// for a call already resolved (validated) with data pointers.
Status clear_unowned(const Call& c) {
  if (!c.plan.varlen) return Status::ok();
  const sinkattn_params_t* p = c.p;
  const Pass pass = c.pass;
  const auto end_of = [&](const sinkattn_tensor_t& cu) {
    return static_cast<const int32_t*>(cu.data) + c.b * cu.strides[0];
  };
  const int32_t* end_q = end_of(p->cu_seqlens_q);
  const int32_t* end_kv = end_of(p->cu_seqlens_kv);
  const int elem = static_cast<int>(sinkattn_dtype_size(c.dtype));
  const auto rows_region = [&](const sinkattn_tensor_t& t, const RowStrides& st, const int32_t* first, int64_t rows,
                               int64_t heads, int64_t cols) {
    UnownedRegion r;
    r.data = t.data;
    r.first_row = first;
    r.rows = rows;
    r.heads = heads;
    r.cols = cols;
    r.row_stride = st.s;
    r.head_stride = st.h;
    r.elem_bytes = elem;
    return r;
  };
  UnownedRegion regions[3];
  int count = 0;
  if (pass == Pass::kForward) {
    regions[count++] = rows_region(p->out, c.out, end_q, c.total_q, c.h_q, c.d_v);
    UnownedRegion lse;
    lse.data = p->softmax_lse.data;
    lse.first_row = end_q;
    lse.rows = c.total_q;
    lse.heads = c.h_q;
    lse.cols = 1;
    lse.row_stride = c.lse.s;
    lse.head_stride = c.lse.h;
    lse.elem_bytes = 4;
    lse.minus_inf = true;
    regions[count++] = lse;
  } else {
    regions[count++] = rows_region(p->dq, c.dq, end_q, c.total_q, c.h_q, c.d);
    regions[count++] = rows_region(p->dk, c.dk, end_kv, c.total_kv, c.h_kv, c.d);
    regions[count++] = rows_region(p->dv, c.dv, end_kv, c.total_kv, c.h_kv, c.d_v);
  }
  if (c.memory == Memory::kDevice) return cuda_clear_unowned_rows(regions, count, p->stream);
  for (int k = 0; k < count; ++k) {
    const int64_t first = *regions[k].first_row;
    const int64_t total = unowned_elements(regions[k], first);
    for (int64_t e = 0; e < total; ++e) fill_unowned_element(regions[k], first, e);
  }
  return Status::ok();
}

Status clear_unowned_impl(const sinkattn_params_t* p, Pass pass) {
  Call c;
  SINKATTN_RETURN_IF_ERROR(resolve_call(p, pass, /*shape_only=*/false, &c));
  return clear_unowned(c);
}

// sinkattn_forward_alloc / sinkattn_backward_alloc: one validation for the size query, the run and (with the flag)
// the unowned rows. The run reads the workspace through Call::p, so it runs on a copy of the caller's struct that
// holds the allocator's workspace (every other field, data pointers included, the caller's).
Status run_alloc_impl(const sinkattn_params_t* p, Pass pass, sinkattn_workspace_alloc_t alloc, void* user,
                      uint32_t flags) {
  if (alloc == nullptr) return invalid("alloc: pointer is NULL");
  if ((flags & ~uint32_t{SINKATTN_RUN_CLEAR_UNOWNED_ROWS}) != 0)
    return invalid("flags: unknown bits " + std::to_string(flags & ~uint32_t{SINKATTN_RUN_CLEAR_UNOWNED_ROWS}) +
                   " (only SINKATTN_RUN_CLEAR_UNOWNED_ROWS is defined)");
  Call c;
  Choice ch;
  size_t need = 0;
  SINKATTN_RETURN_IF_ERROR(prepare_run(p, pass, &c, &ch, &need));
  sinkattn_params_t with_ws = *p;
  with_ws.workspace = nullptr;
  with_ws.workspace_bytes = need;
  if (need > 0) {
    with_ws.workspace = alloc(need, user);
    if (with_ws.workspace == nullptr)
      return Status{SINKATTN_ERR_WORKSPACE_TOO_SMALL,
                    "workspace: the allocator returned NULL for the workspace this " +
                        std::string(pass == Pass::kForward ? "forward" : "backward") + " on the " +
                        ch.backend->name() + " backend needs, " + workspace_need(c, *ch.backend, need)};
  }
  c.p = &with_ws;
  SINKATTN_RETURN_IF_ERROR(ch.backend->run(c));
  if (flags & SINKATTN_RUN_CLEAR_UNOWNED_ROWS) return clear_unowned(c);
  return Status::ok();
}

template <class F>
sinkattn_status_t guarded(F&& f) {
  try {
    const Status st = f();
    if (!st.is_ok()) return fail(st);
    g_last_error.clear();
    return SINKATTN_OK;
  } catch (const std::exception& e) {
    return fail(internal_error(std::string("internal error: ") + e.what()));
  } catch (...) {
    return fail(internal_error("internal error: unknown exception"));
  }
}

}  // namespace
}  // namespace sinkattn

using namespace sinkattn;

extern "C" {

SINKATTN_API void sinkattn_params_init(sinkattn_params_t* p) {
  if (p == nullptr) return;
  std::memset(p, 0, sizeof(*p));
  p->softmax_type = SINKATTN_SOFTMAX_VANILLA;
  p->softmax_scale = NAN;
  p->window_left = -1;
  p->window_right = -1;
  p->mask_alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
  p->backend = SINKATTN_BACKEND_AUTO;
}

SINKATTN_API size_t sinkattn_dtype_size(sinkattn_dtype_t dtype) {
  switch (dtype) {
    case SINKATTN_F32: return 4;
    case SINKATTN_F16: return 2;
    case SINKATTN_BF16: return 2;
    case SINKATTN_I32: return 4;
    case SINKATTN_I64: return 8;
  }
  return 0;
}

SINKATTN_API sinkattn_tensor_t sinkattn_make_tensor(void* data, sinkattn_dtype_t dtype, int32_t rank,
                                                    const int64_t* shape, const int64_t* strides) {
  sinkattn_tensor_t t;
  std::memset(&t, 0, sizeof(t));
  t.data = data;
  t.dtype = dtype;
  t.rank = rank < 0 ? 0 : (rank > SINKATTN_MAX_RANK ? SINKATTN_MAX_RANK : rank);
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape ? shape[i] : 0;
    t.strides[i] = strides ? strides[i] : stride;
    stride *= t.shape[i] > 0 ? t.shape[i] : 1;
  }
  return t;
}

SINKATTN_API sinkattn_status_t sinkattn_forward(const sinkattn_params_t* p) {
  return guarded([&] { return run_impl(p, Pass::kForward); });
}

SINKATTN_API sinkattn_status_t sinkattn_backward(const sinkattn_params_t* p) {
  return guarded([&] { return run_impl(p, Pass::kBackward); });
}

SINKATTN_API sinkattn_status_t sinkattn_forward_alloc(const sinkattn_params_t* p, sinkattn_workspace_alloc_t alloc,
                                                      void* user, uint32_t flags) {
  return guarded([&] { return run_alloc_impl(p, Pass::kForward, alloc, user, flags); });
}

SINKATTN_API sinkattn_status_t sinkattn_backward_alloc(const sinkattn_params_t* p, sinkattn_workspace_alloc_t alloc,
                                                       void* user, uint32_t flags) {
  return guarded([&] { return run_alloc_impl(p, Pass::kBackward, alloc, user, flags); });
}

SINKATTN_API sinkattn_status_t sinkattn_forward_workspace_size(const sinkattn_params_t* p, size_t* bytes) {
  return guarded([&] { return workspace_size_impl(p, Pass::kForward, bytes); });
}

SINKATTN_API sinkattn_status_t sinkattn_backward_workspace_size(const sinkattn_params_t* p, size_t* bytes) {
  return guarded([&] { return workspace_size_impl(p, Pass::kBackward, bytes); });
}

SINKATTN_API sinkattn_status_t sinkattn_clear_unowned_rows(const sinkattn_params_t* p, int32_t is_backward) {
  return guarded([&] { return clear_unowned_impl(p, is_backward ? Pass::kBackward : Pass::kForward); });
}

SINKATTN_API sinkattn_status_t sinkattn_query_backend(const sinkattn_params_t* p, int32_t is_backward,
                                                      sinkattn_backend_t* chosen, char* report, size_t report_len) {
  return guarded([&]() -> Status {
    if (chosen) *chosen = SINKATTN_BACKEND_AUTO;
    if (report && report_len) report[0] = '\0';
    Call c;
    SINKATTN_RETURN_IF_ERROR(resolve_call(p, is_backward ? Pass::kBackward : Pass::kForward, /*shape_only=*/true, &c));
    const Choice ch = choose_backend(c, /*with_kernels=*/true);
    if (report && report_len) {
      const size_t n = std::min(report_len - 1, ch.report.size());
      std::memcpy(report, ch.report.data(), n);
      report[n] = '\0';
    }
    if (ch.backend == nullptr) return ch.status;
    if (chosen) *chosen = ch.backend->id();
    return Status::ok();
  });
}

SINKATTN_API const char* sinkattn_last_error(void) { return g_last_error.c_str(); }

SINKATTN_API size_t sinkattn_params_size(void) { return sizeof(sinkattn_params_t); }

SINKATTN_API const char* sinkattn_version(void) { return SINKATTN_VERSION_STRING; }

SINKATTN_API int32_t sinkattn_backend_available(sinkattn_backend_t backend) {
  return backend_for(backend) != nullptr ? 1 : 0;
}

SINKATTN_API void sinkattn_backend_describe(sinkattn_backend_t backend, char* buf, size_t len) {
  if (buf == nullptr || len == 0) return;
  std::string s;
  try {
    const Backend* b = backend_for(backend);
    s = b ? b->describe() : std::string(backend_name(backend)) + ": not compiled into this library";
  } catch (const std::exception& e) {
    s = std::string("error: ") + e.what();
  }
  const size_t n = std::min(len - 1, s.size());
  std::memcpy(buf, s.data(), n);
  buf[n] = '\0';
}

SINKATTN_API int32_t sinkattn_backend_kernel_families(sinkattn_backend_t backend,
                                                      const sinkattn_kernel_family_t** rows) {
  int count = 0;
  const sinkattn_kernel_family_t* r = nullptr;
  try {
    if (const Backend* b = backend_for(backend)) r = b->kernel_families(&count);
  } catch (const std::exception&) {
    count = 0;
  }
  if (rows != nullptr) *rows = count > 0 ? r : nullptr;
  return count > 0 ? count : 0;
}

SINKATTN_API int32_t sinkattn_backend_switches(sinkattn_backend_t backend, const sinkattn_switch_t** rows) {
  int count = 0;
  const sinkattn_switch_t* r = nullptr;
  try {
    if (const Backend* b = backend_for(backend)) r = b->switches(&count);
  } catch (const std::exception&) {
    count = 0;
  }
  if (rows != nullptr) *rows = count > 0 ? r : nullptr;
  return count > 0 ? count : 0;
}

SINKATTN_API void sinkattn_philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  const Philox4 r = philox4x32_10(counter[0], counter[1], counter[2], counter[3], key[0], key[1]);
  for (int i = 0; i < 4; ++i) out[i] = r.w[i];
}

SINKATTN_API int32_t sinkattn_dropout_keep(uint64_t seed, uint64_t offset, int64_t n, int64_t h, int64_t i, int64_t j,
                                           int64_t h_q, int64_t max_s_q, int64_t max_s_kv, double dropout_p) {
  const uint64_t idx = dropout_index(n, h, i, j, h_q, max_s_q, max_s_kv);
  return dropout_keep(seed, offset, idx, dropout_threshold(dropout_p)) ? 1 : 0;
}

}  // extern "C"

// The backend interface. Each backend declares what it supports; the dispatcher (api.cpp) asks every
// backend and reports, for each one not chosen, why (SPEC.md section 4).
#pragma once

#include <cstddef>
#include <string>

#include "core/call.hpp"
#include "core/status.hpp"

namespace sinkattn {

class Backend {
 public:
  virtual ~Backend() = default;
  virtual sinkattn_backend_t id() const = 0;
  virtual const char* name() const = 0;

  // Can this backend run `c`? If not, returns an error Status whose message says why (for example
  // "head dim 200 not supported (supported: 32, 64, ...)"). Must not touch tensor data.
  virtual Status supports(const Call& c) const = 0;

  // Bytes of workspace needed for `c` (c.pass says forward or backward). Same code path as run().
  virtual Status workspace_size(const Call& c, size_t* bytes) const = 0;

  // Runs `c`. Called only after supports(c) returned OK and the workspace was checked against
  // workspace_size(c).
  virtual Status run(const Call& c) const = 0;

  // What the workspace of `c` holds, in words and bytes, for the messages of a workspace that is too small or that
  // the caller's allocator could not give ("" when the backend has nothing to say). Same code path as
  // workspace_size().
  virtual std::string workspace_report(const Call& c) const {
    (void)c;
    return {};
  }

  // Free text for `sinkattn info`: "NAME: summary", then one "  TOPIC: text" line per topic (sinkattn.h).
  virtual std::string describe() const = 0;

  // The kernel families and the environment switches, static arrays (sinkattn_backend_kernel_families,
  // sinkattn_backend_switches); *count: their rows (0: none).
  virtual const sinkattn_kernel_family_t* kernel_families(int* count) const = 0;
  virtual const sinkattn_switch_t* switches(int* count) const {
    *count = 0;
    return nullptr;
  }

  // The kernels this backend runs `c` with and why (one line, for sinkattn_query_backend's report; "" when the
  // backend has nothing to say). Called only after supports(c) returned OK; must not touch tensor data.
  virtual std::string kernel_report(const Call& c) const {
    (void)c;
    return {};
  }
};

// The registered backends (CPU always; CUDA when compiled in). Returns nullptr when not compiled in.
const Backend* cpu_backend();
const Backend* cuda_backend();

// Memory kind of a pointer: device when the CUDA backend is compiled in and CUDA says so, host otherwise.
Memory pointer_memory(const void* ptr);
// Implemented by the CUDA backend (src/cuda) when compiled in: cudaPointerGetAttributes-based.
Memory cuda_pointer_memory(const void* ptr);

// Copies `bytes` from device memory at `src` to host memory at `dst`, ordered after the work already queued on
// `stream` (a cudaStream_t; NULL = default stream), and waits for it. Returns false, copying nothing, when the
// stream is being captured into a CUDA graph (no synchronisation is allowed there), when the copy fails, or
// without the CUDA backend. Used to validate batch tensors in device memory (SPEC.md section 4).
bool device_to_host(const void* src, void* dst, size_t bytes, void* stream);
bool cuda_device_to_host(const void* src, void* dst, size_t bytes, void* stream);

struct UnownedRegion;
// Fills `count` regions (core/unowned_rows.hpp) in device memory with one kernel on `stream`, reading their first
// rows (cu_seqlens[b]) on the device: no synchronisation. Implemented by the CUDA backend (src/cuda/unowned_rows.cu);
// an error Status without it.
Status cuda_clear_unowned_rows(const UnownedRegion* regions, int count, void* stream);

}  // namespace sinkattn

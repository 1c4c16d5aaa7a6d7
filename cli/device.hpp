// Device (CUDA) memory for the command: mirrors a host call's tensors in device memory, allocates workspaces,
// times with CUDA events. Compiled to stubs that throw when the command is built without CUDA
// (SINKATTN_CLI_WITH_CUDA undefined).
#pragma once

#include <cstddef>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

// A failed CUDA runtime call or a missing CUDA build.
class DeviceError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

bool cli_built_with_cuda();
// Number of CUDA devices the runtime sees (0 without CUDA or without a driver).
int cuda_device_count();
// One line per device: "cuda:0 NVIDIA H200 (sm_90, 139 GiB)".
std::vector<std::string> cuda_device_lines();

// Bytes of a contiguous-or-strided tensor view: 1 + sum((shape-1) * stride) elements (0 when empty).
size_t tensor_bytes(const sinkattn_tensor_t& t);

// A device copy of every present tensor of a params struct (inputs and outputs alike), with a params struct
// pointing at the copies. Outputs are copied too, so host-side NaN poisoning reaches the device.
class DeviceMirror {
 public:
  explicit DeviceMirror(const sinkattn_params_t& host);
  ~DeviceMirror();
  DeviceMirror(const DeviceMirror&) = delete;
  DeviceMirror& operator=(const DeviceMirror&) = delete;

  sinkattn_params_t& params() { return params_; }
  // Copies the named fields (result names: "out", "d_q", ...) device -> host into `host`'s buffers.
  void copy_back(const sinkattn_params_t& host, const std::vector<std::string>& names);

 private:
  sinkattn_params_t params_{};
  std::vector<void*> allocations_;
};

// Scratch memory in host or device memory, freed on destruction. Zero bytes gives a NULL pointer.
class Workspace {
 public:
  Workspace(size_t bytes, bool device);
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* data() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  bool device_ = false;
};

void device_synchronize();

// Elapsed milliseconds of `fn` (which enqueues work on the default stream) measured with CUDA events.
template <class Fn>
float time_on_device(Fn&& fn);

// Event pair helpers used by time_on_device.
struct EventPair;
std::unique_ptr<EventPair, void (*)(EventPair*)> make_event_pair();
void record_start(EventPair& e);
float record_stop_and_elapsed_ms(EventPair& e);  // records the stop event, waits for it, returns ms

template <class Fn>
float time_on_device(Fn&& fn) {
  auto ev = make_event_pair();
  record_start(*ev);
  fn();
  return record_stop_and_elapsed_ms(*ev);
}

}  // namespace sinkattn::cli

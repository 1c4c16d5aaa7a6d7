// See device.hpp.
#include "device.hpp"

#include <cstdio>
#include <cstdlib>
#include <new>

#include "capture.hpp"

#ifdef SINKATTN_CLI_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace sinkattn::cli {

size_t tensor_bytes(const sinkattn_tensor_t& t) {
  if (t.rank <= 0) return 0;
  int64_t last = 0;
  for (int i = 0; i < t.rank; ++i) {
    if (t.shape[i] == 0) return 0;
    last += (t.shape[i] - 1) * t.strides[i];
  }
  static const int64_t kSize[] = {4, 2, 2, 4, 8};
  return static_cast<size_t>(last + 1) * static_cast<size_t>(kSize[t.dtype]);
}

#ifdef SINKATTN_CLI_WITH_CUDA

namespace {
// Every sinkattn_tensor_t field, by capture / result name.
const std::vector<std::string>& all_field_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n = kInputNames;
    n.insert(n.end(), kResultNames.begin(), kResultNames.end());
    return n;
  }();
  return names;
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw DeviceError(std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}
}  // namespace

bool cli_built_with_cuda() { return true; }

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::vector<std::string> cuda_device_lines() {
  std::vector<std::string> lines;
  const int n = cuda_device_count();
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    char buf[512];
    std::snprintf(buf, sizeof buf, "cuda:%d %s (sm_%d%d, %.0f GiB, %d SMs)", i, prop.name, prop.major, prop.minor,
                  static_cast<double>(prop.totalGlobalMem) / (1024.0 * 1024.0 * 1024.0), prop.multiProcessorCount);
    lines.emplace_back(buf);
  }
  return lines;
}

DeviceMirror::DeviceMirror(const sinkattn_params_t& host) : params_(host) {
  try {
    for (const auto& name : all_field_names()) {
      auto field = params_field(name);
      const sinkattn_tensor_t& h = host.*field;
      if (h.rank <= 0) continue;
      const size_t bytes = tensor_bytes(h);
      void* d = nullptr;
      check(cudaMalloc(&d, bytes ? bytes : 16), "cudaMalloc");
      allocations_.push_back(d);
      if (bytes) check(cudaMemcpy(d, h.data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (host to device)");
      (params_.*field).data = d;
    }
  } catch (...) {
    for (void* p : allocations_) cudaFree(p);
    throw;
  }
}

DeviceMirror::~DeviceMirror() {
  for (void* p : allocations_) cudaFree(p);
}

void DeviceMirror::copy_back(const sinkattn_params_t& host, const std::vector<std::string>& names) {
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  for (const auto& name : names) {
    auto field = params_field(name);
    const sinkattn_tensor_t& h = host.*field;
    if (h.rank <= 0) continue;
    const size_t bytes = tensor_bytes(h);
    if (bytes)
      check(cudaMemcpy(h.data, (params_.*field).data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
  }
}

Workspace::Workspace(size_t bytes, bool device) : bytes_(bytes), device_(device) {
  if (bytes == 0) return;
  if (device) {
    check(cudaMalloc(&ptr_, bytes), "cudaMalloc (workspace)");
  } else {
    ptr_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!ptr_) throw std::bad_alloc();
  }
}

Workspace::~Workspace() {
  if (!ptr_) return;
  if (device_) cudaFree(ptr_);
  else std::free(ptr_);
}

void device_synchronize() { check(cudaDeviceSynchronize(), "cudaDeviceSynchronize"); }

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
};

std::unique_ptr<EventPair, void (*)(EventPair*)> make_event_pair() {
  auto* e = new EventPair;
  if (cudaEventCreate(&e->start) != cudaSuccess || cudaEventCreate(&e->stop) != cudaSuccess) {
    delete e;
    throw DeviceError("CUDA error in cudaEventCreate");
  }
  return {e, [](EventPair* p) {
            cudaEventDestroy(p->start);
            cudaEventDestroy(p->stop);
            delete p;
          }};
}

void record_start(EventPair& e) { check(cudaEventRecord(e.start, nullptr), "cudaEventRecord"); }

float record_stop_and_elapsed_ms(EventPair& e) {
  check(cudaEventRecord(e.stop, nullptr), "cudaEventRecord");
  check(cudaEventSynchronize(e.stop), "cudaEventSynchronize");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, e.start, e.stop), "cudaEventElapsedTime");
  return ms;
}

#else  // !SINKATTN_CLI_WITH_CUDA

namespace {
[[noreturn]] void no_cuda() { throw DeviceError("this sinkattn command was built without CUDA support"); }
}  // namespace

bool cli_built_with_cuda() { return false; }
int cuda_device_count() { return 0; }
std::vector<std::string> cuda_device_lines() { return {}; }
DeviceMirror::DeviceMirror(const sinkattn_params_t&) { no_cuda(); }
DeviceMirror::~DeviceMirror() = default;
void DeviceMirror::copy_back(const sinkattn_params_t&, const std::vector<std::string>&) { no_cuda(); }
Workspace::Workspace(size_t bytes, bool device) : bytes_(bytes), device_(device) {
  if (device) no_cuda();
  if (bytes == 0) return;
  ptr_ = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!ptr_) throw std::bad_alloc();
}
Workspace::~Workspace() { std::free(ptr_); }
void device_synchronize() {}
struct EventPair {};
std::unique_ptr<EventPair, void (*)(EventPair*)> make_event_pair() { no_cuda(); }
void record_start(EventPair&) { no_cuda(); }
float record_stop_and_elapsed_ms(EventPair&) { no_cuda(); }

#endif

}  // namespace sinkattn::cli

// The CPU backend: host memory, fp32 / fp16 / bf16 inputs with fp32 accumulation, every feature of SPEC.md
// sections 2-3, always deterministic (the passes are in cpu_forward.cpp and cpu_backward.cpp).
#include <omp.h>

#include <string>

#include "core/backend.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_passes.hpp"

namespace sinkattn {

namespace {

constexpr int64_t kMaxHeadDim = 512;

class CpuBackend final : public Backend {
 public:
  sinkattn_backend_t id() const override { return SINKATTN_BACKEND_CPU; }
  const char* name() const override { return "cpu"; }

  Status supports(const Call& c) const override {
    if (c.memory == Memory::kDevice)
      return unsupported("tensors are in device memory (the CPU backend reads host memory only)");
    if (c.dtype != SINKATTN_F32 && c.dtype != SINKATTN_F16 && c.dtype != SINKATTN_BF16)
      return unsupported("q: dtype must be fp32, fp16 or bf16");
    if (c.d < 1 || c.d > kMaxHeadDim)
      return unsupported("q: head dim d = " + std::to_string(c.d) + " not supported (supported: 1 .. " +
                         std::to_string(kMaxHeadDim) + ")");
    if (c.d_v < 1 || c.d_v > kMaxHeadDim)
      return unsupported("v: head dim d_v = " + std::to_string(c.d_v) + " not supported (supported: 1 .. " +
                         std::to_string(kMaxHeadDim) + ")");
    if (c.plan.bias == Use::kRequired && c.bias_dtype != SINKATTN_F32 && c.bias_dtype != c.dtype)
      return unsupported("bias: dtype must be fp32 or the dtype of q");
    return Status::ok();
  }

  Status workspace_size(const Call& c, size_t* bytes) const override {
    *bytes = c.pass == Pass::kForward ? cpu::forward_workspace_bytes(c) : cpu::backward_workspace_bytes(c);
    return Status::ok();
  }

  std::string workspace_report(const Call& c) const override {
    return c.pass == Pass::kForward ? cpu::forward_workspace_report(c) : cpu::backward_workspace_report(c);
  }

  Status run(const Call& c) const override {
    return c.pass == Pass::kForward ? cpu::run_forward(c) : cpu::run_backward(c);
  }

  std::string kernel_report(const Call& c) const override {
    int threads = omp_get_max_threads();
    if (c.p->num_threads > 0 && c.p->num_threads < threads) threads = c.p->num_threads;
    return std::string(c.pass == Pass::kForward ? "tiled online-softmax forward" : "tiled backward (dk dv, then dq)") +
           ", fp32 accumulation, tile " + std::to_string(cpu::kBlockQ) + " x " + std::to_string(cpu::kBlockK) +
           ", " + std::to_string(threads) + " OpenMP threads";
  }

  std::string describe() const override {
    return "cpu: the tiled online-softmax kernels on the host (fp32 accumulation, OpenMP), always deterministic\n"
           "  device: host memory, " +
           std::to_string(omp_get_max_threads()) +
           " OpenMP threads\n"
           "  dtypes: fp32, fp16, bf16 (fp32 accumulation)\n"
           "  head dims: d, d_v 1.." +
           std::to_string(kMaxHeadDim) +
           "\n"
           "  features: vanilla / off_by_one / learnable sinks; dense, padded and varlen batches; GQA / MQA; windows "
           "and causal (both alignments); post-scale bias with broadcast; dropout (Philox4x32-10); d_lse; paged KV "
           "(page_table, forward, any page size); split-KV (num_splits: 0 heuristic, 1 none, N at most N <= " +
           std::to_string(cpu::kMaxSplits) + ", with a combine)\n";
  }

  const sinkattn_kernel_family_t* kernel_families(int* count) const override {
    static const std::string runs_when = "host memory (every dtype, head dims up to " + std::to_string(kMaxHeadDim) +
                                         ", every feature), or backend = cpu";
    static const std::string rule =
        "Tiles of " + std::to_string(cpu::kBlockQ) + " query rows x " + std::to_string(cpu::kBlockK) +
        " keys over OpenMP threads: the forward an online softmax with the sink as an already-seen key, the "
        "backward dK dV then dq per tile, fp32 accumulation, no atomics: always deterministic. Split-KV forward "
        "(num_splits) with a combine; paged KV read through the page table.";
    static const sinkattn_kernel_family_t rows[] = {
        {"cpu", "src/cpu/", runs_when.c_str(), rule.c_str()},
    };
    *count = 1;
    return rows;
  }
};

}  // namespace

const Backend* cpu_backend() {
  static const CpuBackend backend;
  return &backend;
}

}  // namespace sinkattn

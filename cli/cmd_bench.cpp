// `sinkattn bench --preset NAME [--seqlen N --batch B --layer full|sliding --dtype bf16 --backend ...
//  --iters N --warmup N]`: times forward and backward on a model's attention shape.
// FLOP rule: forward = 4 * b * h_q * d * (visible (i, j) pairs of one (batch, head), counted exactly from the
// mask of SPEC.md section 2), backward = 2.5 * forward.
// CUDA: tensors in device memory, timed with CUDA events; CPU: std::chrono. Inputs are random (never zeros).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <vector>

#include "capture.hpp"
#include "commands.hpp"
#include "device.hpp"
#include "execute.hpp"
#include "presets.hpp"
#include "report.hpp"

namespace sinkattn::cli {

namespace {

struct Timing {
  double mean_ms = 0, min_ms = 0;
};

// Runs `one` warmup + iters times, timing each of the `iters` runs; progress dots to stderr.
template <class Fn>
Timing time_iterations(const char* what, int warmup, int iters, bool device, Fn&& one) {
  if (warmup > 0) {
    std::fprintf(stderr, "%s: warmup (%d)...", what, warmup);
    for (int i = 0; i < warmup; ++i) {
      one();
      std::fputc('.', stderr);
    }
    if (device) device_synchronize();
    std::fputc('\n', stderr);
  }
  std::fprintf(stderr, "%s: timing (%d)...", what, iters);
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    if (device) {
      ms.push_back(time_on_device(one));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      one();
      ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::fputc('.', stderr);
    std::fflush(stderr);
  }
  std::fputc('\n', stderr);
  Timing t;
  for (double x : ms) t.mean_ms += x / static_cast<double>(ms.size());
  t.min_ms = ms.empty() ? 0 : *std::min_element(ms.begin(), ms.end());
  return t;
}

std::string rate(double flops, double ms) {
  char buf[64];
  const double gflops = ms > 0 ? flops / (ms * 1e-3) / 1e9 : 0;
  if (gflops >= 1000) std::snprintf(buf, sizeof buf, "%8.1f TFLOP/s", gflops / 1000);
  else std::snprintf(buf, sizeof buf, "%8.2f GFLOP/s", gflops);
  return buf;
}

}  // namespace

int cmd_bench(const BenchOptions& o) {
  const Preset& preset = find_preset(o.preset);
  const std::vector<LayerSpec> layers = select_layers(preset, o.layer);
  const sinkattn_backend_t backend = parse_backend(o.backend);
  bool device = false;
  if (backend == SINKATTN_BACKEND_CUDA) {
    if (!cli_built_with_cuda()) throw DeviceError("--backend cuda: this sinkattn command was built without CUDA support");
    if (cuda_device_count() == 0) throw DeviceError("--backend cuda: no CUDA device found");
    device = true;
  } else if (backend == SINKATTN_BACKEND_AUTO) {
    device = cli_built_with_cuda() && cuda_device_count() > 0 && sinkattn_backend_available(SINKATTN_BACKEND_CUDA);
  }
  const int iters = o.iters >= 0 ? o.iters : device ? 20 : 2;
  const int warmup = o.warmup >= 0 ? o.warmup : device ? 3 : 1;
  if (iters < 1) throw std::invalid_argument("--iters must be at least 1");

  RandomCallSpec spec;
  spec.batch = o.batch;
  spec.seqlen = o.seqlen;
  spec.dtype = parse_float_dtype(o.dtype);
  spec.seed = o.seed;
  spec.backward = !o.forward_only;
  spec.deterministic = o.deterministic;

  std::printf("preset %s: b=%lld s=%lld h_q=%lld h_kv=%lld d=%lld %s %s, backend %s (%s memory), %d iters after %d warmup\n",
              preset.name.c_str(), static_cast<long long>(spec.batch), static_cast<long long>(spec.seqlen),
              static_cast<long long>(preset.h_q), static_cast<long long>(preset.h_kv), static_cast<long long>(preset.d),
              o.dtype.c_str(), preset.softmax_type == SINKATTN_SOFTMAX_LEARNABLE ? "learnable-sinks" : "vanilla",
              backend_name(backend), device ? "device" : "host", iters, warmup);
  for (const auto& line : cuda_device_lines()) std::printf("  %s\n", line.c_str());
  std::printf("FLOP rule: forward = 4 * b * h_q * d * visible_pairs (exact count of visible (i, j) per (batch, head));"
              " backward = 2.5 * forward\n");

  struct Line {
    std::string layer;
    int64_t pairs;
    double fwd_flops;
    Timing fwd, bwd;
    std::string chosen;
  };
  std::vector<Line> lines;
  for (const auto& layer : layers) {
    std::fprintf(stderr, "[%s] generating inputs...\n", layer.name.c_str());
    const Capture cap = make_random_capture(preset, layer, spec);
    HostCall call = make_host_call(cap);
    call.params.backend = backend;
    std::unique_ptr<DeviceMirror> mirror;
    if (device) mirror = std::make_unique<DeviceMirror>(call.params);
    sinkattn_params_t& p = mirror ? mirror->params() : call.params;

    sinkattn_backend_t chosen = SINKATTN_BACKEND_AUTO;
    char report[4096] = {0};
    check_status(sinkattn_query_backend(&p, 0, &chosen, report, sizeof report), "sinkattn_query_backend (forward)");
    const std::string fwd_kernels = kernels_of(report, chosen);
    if (!fwd_kernels.empty()) std::printf("[%s] forward kernels: %s\n", layer.name.c_str(), fwd_kernels.c_str());
    if (spec.backward) {
      sinkattn_backend_t bchosen = SINKATTN_BACKEND_AUTO;
      check_status(sinkattn_query_backend(&p, 1, &bchosen, report, sizeof report), "sinkattn_query_backend (backward)");
      const std::string k = kernels_of(report, bchosen);
      if (!k.empty()) std::printf("[%s] backward kernels: %s\n", layer.name.c_str(), k.c_str());
    }

    Line line{layer.name, visible_pairs(spec.seqlen, spec.seqlen, layer.window_left, layer.window_right,
                                        SINKATTN_ALIGN_BOTTOM_RIGHT),
              0, {}, {}, backend_name(chosen)};
    line.fwd_flops = 4.0 * static_cast<double>(spec.batch * preset.h_q * preset.d) * static_cast<double>(line.pairs);

    size_t fwd_bytes = 0;
    check_status(sinkattn_forward_workspace_size(&p, &fwd_bytes), "sinkattn_forward_workspace_size");
    Workspace fwd_ws(fwd_bytes, device);
    sinkattn_params_t pf = p;
    pf.workspace = fwd_ws.data();
    pf.workspace_bytes = fwd_ws.bytes();
    const std::string tag = "[" + layer.name + "] forward";
    line.fwd = time_iterations(tag.c_str(), warmup, iters, device,
                               [&] { check_status(sinkattn_forward(&pf), "sinkattn_forward"); });
    if (spec.backward) {
      if (warmup == 0) check_status(sinkattn_forward(&pf), "sinkattn_forward");  // out, softmax_lse for the backward
      if (device) device_synchronize();
      size_t bwd_bytes = 0;
      check_status(sinkattn_backward_workspace_size(&p, &bwd_bytes), "sinkattn_backward_workspace_size");
      Workspace bwd_ws(bwd_bytes, device);
      sinkattn_params_t pb = p;
      pb.workspace = bwd_ws.data();
      pb.workspace_bytes = bwd_ws.bytes();
      const std::string btag = "[" + layer.name + "] backward";
      line.bwd = time_iterations(btag.c_str(), warmup, iters, device,
                                 [&] { check_status(sinkattn_backward(&pb), "sinkattn_backward"); });
      if (device) device_synchronize();
    }
    lines.push_back(line);
  }

  std::printf("%-8s %-9s %14s %10s %16s %10s %16s\n", "layer", "backend", "visible_pairs", "fwd ms", "fwd rate",
              "bwd ms", "bwd rate");
  for (const auto& l : lines) {
    std::printf("%-8s %-9s %14lld %10.3f %16s", l.layer.c_str(), l.chosen.c_str(), static_cast<long long>(l.pairs),
                l.fwd.mean_ms, rate(l.fwd_flops, l.fwd.mean_ms).c_str());
    if (spec.backward) std::printf(" %10.3f %16s", l.bwd.mean_ms, rate(2.5 * l.fwd_flops, l.bwd.mean_ms).c_str());
    std::printf("\n");
  }
  std::printf("(ms are means over the timed iterations; forward FLOPs per call: ");
  for (size_t i = 0; i < lines.size(); ++i)
    std::printf("%s%s %.4g", i ? ", " : "", lines[i].layer.c_str(), lines[i].fwd_flops);
  std::printf(")\n");
  return 0;
}

}  // namespace sinkattn::cli

// `sinkattn check (--inputs FILE | --preset NAME [--seqlen --batch --layer --dtype --seed ...]) [--backend]`:
// runs a call through the library and compares every output with a float64 evaluation of SPEC.md
// (tests/reference), printing SPEC.md section 5's error table:
//   err = max|x - ref| / max(max|ref|, 1e-6) per output (gradients: with D_i from the out the backward was fed,
//   the backend's own forward output); a low-precision call passes when
//   err <= 2 * (error of the plain low-precision implementation) + 1e-3; fp32 calls when err <= 1e-5 (out,
//   softmax_lse) or 1e-4 (gradients).
// Exits 1 when any output fails.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "capture.hpp"
#include "commands.hpp"
#include "execute.hpp"
#include "presets.hpp"
#include "reference.hpp"
#include "report.hpp"

namespace sinkattn::cli {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Result-file name -> reference Result member.
ref::Array* result_member(ref::Result& r, const std::string& name) {
  if (name == "out") return &r.out;
  if (name == "softmax_lse") return &r.softmax_lse;
  if (name == "d_q") return &r.dq;
  if (name == "d_k") return &r.dk;
  if (name == "d_v") return &r.dv;
  if (name == "d_sinks") return &r.d_sinks;
  if (name == "d_bias") return &r.d_bias;
  return nullptr;
}

bool check_one(const Capture& cap, sinkattn_backend_t backend, int num_splits) {
  std::printf("call: %s\n", describe_call(cap).c_str());
  HostCall call = make_host_call(cap);
  call.params.num_splits = num_splits;
  auto t0 = std::chrono::steady_clock::now();
  const ExecuteReport rep = execute(call, backend);
  const double t_run = seconds_since(t0);
  print_backend_report(rep, call.backward);

  t0 = std::chrono::steady_clock::now();
  const sinkattn_dtype_t dtype = cap.at("q").dtype;
  // The backward ran on the out its forward wrote (call.params.out, copied back to host memory): it is judged
  // with D_i from that out (SPEC.md section 5).
  const ref::References refs =
      ref::references(call.params, call.backward, call.backward ? ref::DFrom::kGivenOut : ref::DFrom::kOwnOut);
  const double t_ref = seconds_since(t0);

  ref::Result actual;
  for (auto& [name, t] : call.outputs)
    if (ref::Array* a = result_member(actual, name)) *a = ref::read_tensor(t.view());
  const std::vector<ref::ErrorRow> rows = ref::error_table(actual, refs, dtype);

  std::printf("library %.3f s, reference %.3f s\n", t_run, t_ref);
  // SPEC.md section 5: fp16 / bf16 at most 2x the plain low-precision error + 1e-3; fp32 the fixed bounds (1e-5 out
  // and softmax_lse, 1e-4 gradients) or 2x the plain fp32 evaluation's error where that is larger.
  std::printf("%-12s %12s %16s %12s  %s\n", "output", "err", dtype == SINKATTN_F32 ? "plain-fp32 err" : "plain-lowp err",
              "tolerance", "result");
  bool pass = !rows.empty();
  for (const auto& r : rows) {
    char lowp_col[32];
    std::snprintf(lowp_col, sizeof lowp_col, "%.3e", r.lowp_err);
    std::printf("%-12s %12.3e %16s %12.3e  %s\n", r.name.c_str(), r.err, lowp_col, r.tolerance, r.pass ? "PASS" : "FAIL");
    pass = pass && r.pass;
  }
  // rng_state (SPEC.md section 2): {seed, offset} of the forward, as two uint64.
  if (auto it = call.outputs.find("rng_state"); it != call.outputs.end()) {
    const uint64_t* s = it->second.as<uint64_t>();
    const bool ok = s[0] == cap.options.seed && s[1] == cap.options.offset;
    std::printf("%-12s %12s %16s %12s  %s (got {%llu, %llu}, expected {%llu, %llu})\n", "rng_state", "-", "-", "exact",
                ok ? "PASS" : "FAIL", static_cast<unsigned long long>(s[0]), static_cast<unsigned long long>(s[1]),
                static_cast<unsigned long long>(cap.options.seed), static_cast<unsigned long long>(cap.options.offset));
    pass = pass && ok;
  }
  std::printf("%s\n", pass ? "PASS" : "FAIL");
  return pass;
}

std::string save_path(const std::string& base, const std::string& layer, bool several) {
  if (!several) return base;
  const size_t dot = base.rfind('.');
  const size_t slash = base.rfind('/');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash)) return base + "-" + layer;
  return base.substr(0, dot) + "-" + layer + base.substr(dot);
}

}  // namespace

int cmd_check(const CheckOptions& o) {
  const sinkattn_backend_t backend = parse_backend(o.backend);
  bool all = true;
  if (!o.inputs.empty()) {
    const Capture cap = read_capture(o.inputs);
    warn_unknown_tensors(cap);
    all = check_one(cap, backend, o.num_splits);
  } else {
    const Preset& preset = find_preset(o.preset);
    const std::vector<LayerSpec> layers = select_layers(preset, o.layer);
    RandomCallSpec spec;
    spec.batch = o.batch;
    spec.seqlen = o.seqlen;
    spec.dtype = parse_float_dtype(o.dtype);
    spec.seed = o.seed_given ? o.seed : std::random_device{}();
    spec.backward = !o.no_grad;
    spec.d_lse = o.d_lse;
    spec.dropout_p = o.dropout_p;
    spec.deterministic = o.deterministic;
    std::printf("preset %s, seed %llu (repeat with --seed %llu)\n", preset.name.c_str(),
                static_cast<unsigned long long>(spec.seed), static_cast<unsigned long long>(spec.seed));
    for (const auto& layer : layers) {
      std::printf("\n== %s layer (window_left %lld, window_right %lld) ==\n", layer.name.c_str(),
                  static_cast<long long>(layer.window_left), static_cast<long long>(layer.window_right));
      if (layer.window_left >= 0 && layer.window_left + 1 >= spec.seqlen)
        std::printf("note: --seqlen %lld is within the window: this layer is the same as full causal; use a longer "
                    "--seqlen to exercise the window\n",
                    static_cast<long long>(spec.seqlen));
      const Capture cap = make_random_capture(preset, layer, spec);
      if (!o.save.empty()) {
        const std::string path = save_path(o.save, layer.name, layers.size() > 1);
        write_capture(path, cap);
        std::printf("saved call capture to %s\n", path.c_str());
      }
      all = check_one(cap, backend, o.num_splits) && all;
    }
  }
  return all ? 0 : 1;
}

}  // namespace sinkattn::cli

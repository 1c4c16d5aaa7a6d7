// `sinkattn run --inputs call.safetensors --out result.safetensors [--backend auto|cpu|cuda] [--num-splits N]`:
// replays a call capture (SPEC.md section 6) and writes out, softmax_lse (+ rng_state with dropout) and,
// when the capture has d_out, d_q, d_k, d_v (+ d_sinks when learnable, d_bias with bias).
#include <cstdio>

#include "capture.hpp"
#include "commands.hpp"
#include "execute.hpp"
#include "report.hpp"

namespace sinkattn::cli {

int cmd_run(const RunOptions& o) {
  const Capture cap = read_capture(o.inputs);
  warn_unknown_tensors(cap);
  std::printf("call: %s\n", describe_call(cap).c_str());
  HostCall call = make_host_call(cap);
  call.params.num_splits = o.num_splits;
  const ExecuteReport rep = execute(call, parse_backend(o.backend));
  print_backend_report(rep, call.backward);
  write_results(o.out, call, cap.options);
  std::string names;
  for (const auto& n : kResultNames)
    if (call.outputs.count(n)) names += (names.empty() ? "" : ", ") + n;
  std::printf("wrote %s: %s\n", o.out.c_str(), names.c_str());
  return 0;
}

}  // namespace sinkattn::cli

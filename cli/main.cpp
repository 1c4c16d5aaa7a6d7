// The `sinkattn` command: run | check | bench | info. See docs/DESIGN.md and SPEC.md sections 5-6.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "capture.hpp"
#include "commands.hpp"
#include "sinkattn/sinkattn.h"

int main(int argc, char** argv) {
  using namespace sinkattn::cli;
  CLI::App app{"sinkattn: fused scaled-dot-product attention with softmax sinks"};
  app.set_version_flag("--version", std::string(sinkattn_version()));
  app.require_subcommand(1);

  RunOptions run;
  auto* run_cmd = app.add_subcommand("run", "Replay a call capture file (SPEC.md section 6) and write the results");
  run_cmd->add_option("--inputs", run.inputs, "call capture (safetensors)")->required();
  run_cmd->add_option("--out", run.out, "result file to write (safetensors)")->required();
  run_cmd->add_option("--num-splits", run.num_splits,
                      "forward key splits (split-KV): 0 = the backend's heuristic (default), 1 = none, N = at most N")
      ->check(CLI::NonNegativeNumber);
  run_cmd->add_option("--backend", run.backend, "auto|cpu|cuda (default auto: the memory of the tensors decides)")->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  CheckOptions check;
  auto* check_cmd =
      app.add_subcommand("check", "Run a call and compare every output with a float64 evaluation (SPEC.md section 5)");
  auto* in_opt = check_cmd->add_option("--inputs", check.inputs, "call capture (safetensors)");
  auto* preset_opt = check_cmd->add_option("--preset", check.preset, "gpt-oss-20b|gpt-oss-120b|llama3-8b (random inputs)");
  in_opt->excludes(preset_opt);
  check_cmd->add_option("--seqlen", check.seqlen, "preset: sequence length (default 256)");
  check_cmd->add_option("--batch", check.batch, "preset: batch size (default 1)");
  check_cmd->add_option("--layer", check.layer, "preset: full|sliding|both (default: every layer kind)");
  check_cmd->add_option("--dtype", check.dtype, "preset: bf16|fp16|fp32 (default bf16)");
  check_cmd->add_option("--seed", check.seed, "preset: input seed (default: random, printed)");
  check_cmd->add_option("--dropout", check.dropout_p, "preset: dropout probability (default 0)");
  check_cmd->add_flag("--no-grad", check.no_grad, "preset: forward only");
  check_cmd->add_flag("--d-lse", check.d_lse, "preset: also a gradient into softmax_lse");
  check_cmd->add_flag("--deterministic", check.deterministic, "preset: deterministic backward");
  check_cmd->add_option("--num-splits", check.num_splits,
                        "forward key splits (split-KV): 0 = the backend's heuristic (default), 1 = none, N = at most N")
      ->check(CLI::NonNegativeNumber);
  check_cmd->add_option("--save", check.save, "preset: also write the generated call capture(s) here");
  check_cmd->add_option("--backend", check.backend, "auto|cpu|cuda (default auto: the memory of the tensors decides)")->check(CLI::IsMember({"auto", "cpu", "cuda"}));

  BenchOptions bench;
  auto* bench_cmd = app.add_subcommand("bench", "Time forward and backward on a model's attention shape");
  bench_cmd->add_option("--preset", bench.preset, "gpt-oss-20b|gpt-oss-120b|llama3-8b")->required();
  bench_cmd->add_option("--seqlen", bench.seqlen, "sequence length (default 4096)");
  bench_cmd->add_option("--batch", bench.batch, "batch size (default 1)");
  bench_cmd->add_option("--layer", bench.layer, "full|sliding|both (default: every layer kind)");
  bench_cmd->add_option("--dtype", bench.dtype, "bf16|fp16|fp32 (default bf16)");
  bench_cmd->add_option("--backend", bench.backend, "auto|cpu|cuda (default auto: the memory of the tensors decides)")->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  bench_cmd->add_option("--iters", bench.iters, "timed iterations (default 20 on cuda, 2 on cpu)");
  bench_cmd->add_option("--warmup", bench.warmup, "warmup iterations (default 3 on cuda, 1 on cpu)");
  bench_cmd->add_flag("--forward-only", bench.forward_only, "skip the backward");
  bench_cmd->add_flag("--deterministic", bench.deterministic, "deterministic backward");

  InfoOptions info;
  auto* info_cmd = app.add_subcommand(
      "info", "Version, backends, devices, dtypes, head dims, kernel families and environment switches");
  auto* verbose_opt = info_cmd->add_flag("--verbose,-v", info.verbose,
                                         "the full rule of every kernel family and when to use every switch");
  auto* json_opt = info_cmd->add_flag("--json", info.json, "everything as one JSON object");
  info_cmd->add_flag("--switches-markdown", info.switches_markdown,
                     "the environment switch table as markdown (docs/DESIGN.md shows it)")
      ->excludes(verbose_opt)
      ->excludes(json_opt);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }

  try {
    if (*run_cmd) return cmd_run(run);
    if (*check_cmd) {
      check.seed_given = check_cmd->count("--seed") > 0;
      if (check.inputs.empty() == check.preset.empty()) {
        std::fprintf(stderr, "sinkattn check: give exactly one of --inputs FILE or --preset NAME\n");
        return 2;
      }
      return cmd_check(check);
    }
    if (*bench_cmd) return cmd_bench(bench);
    return cmd_info(info);
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "sinkattn: error: %s\n", e.what());
    return 1;
  }
}

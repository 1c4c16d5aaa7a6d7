// The subcommands of `sinkattn`. Each returns the process exit status (0 = success); errors are thrown
// (CaptureError, LibraryError, DeviceError, std::invalid_argument) and printed by main().
#pragma once

#include <cstdint>
#include <string>

namespace sinkattn::cli {

struct RunOptions {
  std::string inputs, out, backend = "auto";
  int num_splits = 0;  // forward key splits (sinkattn_params_t::num_splits): 0 heuristic, 1 none, N at most N
};
int cmd_run(const RunOptions& o);

struct CheckOptions {
  std::string inputs, preset, layer, dtype = "bf16", backend = "auto", save;
  int64_t seqlen = 256, batch = 1;
  uint64_t seed = 0;
  bool seed_given = false;
  bool no_grad = false, d_lse = false, deterministic = false;
  double dropout_p = 0.0;
  int num_splits = 0;  // as RunOptions::num_splits
};
int cmd_check(const CheckOptions& o);

struct BenchOptions {
  std::string preset, layer, dtype = "bf16", backend = "auto";
  int64_t seqlen = 4096, batch = 1;
  int iters = -1, warmup = -1;  // -1: a default suited to the backend
  bool forward_only = false, deterministic = false;
  uint64_t seed = 1;
};
int cmd_bench(const BenchOptions& o);

struct InfoOptions {
  bool verbose = false;            // the full rule of every kernel family, when to use every switch
  bool json = false;               // everything as one JSON object
  bool switches_markdown = false;  // the switch table as markdown (docs/DESIGN.md's)
};
int cmd_info(const InfoOptions& o);

}  // namespace sinkattn::cli

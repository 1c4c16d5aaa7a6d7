// The JSON report of the GPU benchmark programs (gpu_bench.cpp, gpu_bench_decode.cu), the input of
// tools/results_dashboard.py: their command line with `--json FILE` taken out, the UTC time of the run, and the write.
#pragma once

#include <cstdio>
#include <ctime>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sinkattn_bench {

struct Args {
  std::vector<std::string> positional;  // the arguments other than `--json FILE`, in order
  std::string json_path;                // FILE of `--json FILE`, "" without it
  std::string command;                  // `tool` and the positional arguments, as the report names the run
};

inline Args parse_args(int argc, char** argv, const char* tool) {
  Args a;
  a.command = tool;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) {
      a.json_path = argv[++i];
      continue;
    }
    a.positional.push_back(argv[i]);
    a.command += std::string(" ") + argv[i];
  }
  return a;
}

// Whether a benchmark row is run for the row filter `only` (the programs' first argument after the repetitions):
// "all": every row; "": the default rows (not `extra`); "=NAME": the row named NAME alone; else every row whose
// name contains `only`.
inline bool row_selected(const std::string& only, const std::string& name, bool extra) {
  if (only == "all") return true;
  if (only.empty()) return !extra;
  if (only[0] == '=') return name == only.substr(1);
  return name.find(only) != std::string::npos;
}

// ISO 8601, UTC, to the second: 2026-12-06T04:38:34Z.
inline std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// Writes `report` to `path` when one was given; 0, or 1 (said on stdout) when the file could not be written.
inline int write_report(const nlohmann::ordered_json& report, const std::string& path) {
  if (path.empty()) return 0;
  std::ofstream js(path);
  js << report.dump(1) << "\n";
  if (!js) {
    std::printf("could not write %s\n", path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace sinkattn_bench

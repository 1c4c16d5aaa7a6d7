// The GPU benchmark programs' command line (tests/gpu/bench_report.hpp), host only: `--json FILE` taken out of the
// positional arguments and of the command the report names, and the row filter (all / default rows / =NAME / part of
// a name) that tools/gpu-ab.sh and tools/prof/step_trace.sh pass to sinkattn_gpu_bench.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "gpu/bench_report.hpp"

namespace {

sinkattn_bench::Args parse(std::vector<std::string> words) {
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return sinkattn_bench::parse_args(static_cast<int>(argv.size()), argv.data(), "sinkattn_gpu_bench");
}

TEST(BenchArgs, JsonTakenOutOfPositionalAndCommand) {
  const auto a = parse({"prog", "10", "--json", "out.json", "=gpt-oss-full"});
  EXPECT_EQ(a.json_path, "out.json");
  EXPECT_EQ(a.positional, (std::vector<std::string>{"10", "=gpt-oss-full"}));
  EXPECT_EQ(a.command, "sinkattn_gpu_bench 10 =gpt-oss-full");
}

TEST(BenchArgs, TrailingJsonWithoutFileIsPositional) {
  const auto a = parse({"prog", "--json"});
  EXPECT_EQ(a.json_path, "");
  EXPECT_EQ(a.positional, (std::vector<std::string>{"--json"}));
}

TEST(BenchArgs, RowFilter) {
  using sinkattn_bench::row_selected;
  // no filter: the default rows only
  EXPECT_TRUE(row_selected("", "gpt-oss-full", false));
  EXPECT_FALSE(row_selected("", "gpt-oss-full-16k", true));
  // all: every row, the extra ones included
  EXPECT_TRUE(row_selected("all", "gpt-oss-full-16k", true));
  // =NAME: that row alone, not the rows whose names start with it
  EXPECT_TRUE(row_selected("=gpt-oss-full", "gpt-oss-full", false));
  EXPECT_FALSE(row_selected("=gpt-oss-full", "gpt-oss-full-16k", true));
  EXPECT_FALSE(row_selected("=gpt-oss-full", "gpt-oss-full+bias", true));
  EXPECT_TRUE(row_selected("=gpt-oss-full-16k", "gpt-oss-full-16k", true));
  // else: every row whose name contains it, default or extra
  EXPECT_TRUE(row_selected("gpt-oss-full", "gpt-oss-full", false));
  EXPECT_TRUE(row_selected("gpt-oss-full", "gpt-oss-full-16k", true));
  EXPECT_TRUE(row_selected("sliding", "gpt-oss-sliding", false));
  EXPECT_FALSE(row_selected("sliding", "mha-d128", false));
}

}  // namespace

// Timing of the CUDA backend through the C ABI (used by tools/gpu-check.sh next to `sinkattn bench`):
// bf16, b = 2, s = 4096, causal, the shapes of bench/RESULTS.md. CUDA events around `reps` calls after
// warm-up, inputs rotated over several sets so they are not all in L2. FLOPs (NOTES-kernels.md):
// forward 4 * b * h_q * d * (visible pairs), backward 2.5x that. "det" columns: the deterministic backward
// (deterministic = 1) and its speed relative to the default one (bwd ms / bwd det ms). bench/RESULTS.md holds the
// targets. Beyond the three layers, rows selected by name only (`all` runs every row):
//   "+bias"     a post-scale bias [1, 1, s, s] bf16 (one matrix shared by the batch and the heads, as a relative
//               position bias) with its gradient d_bias (summed over b and h_q); "x plain" = the plain row's
//               time / this row's, forward / backward
//   "+dropout"  dropout_p 0.1 (the forward writes rng_state, the backward regenerates the keep mask)
//   "hd256", "-16k"  head dim 256 (h 16), and one sequence of 16384 tokens (b 1) of the GPT-OSS full and MHA layers
// --json FILE also writes the rows as JSON (the GPU, the UTC time, the command, one object per row with the printed
// columns): the input of tools/results_dashboard.py, which builds bench/RESULTS.md from such files.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "bench_timing.hpp"
#include "cuda_check.hpp"
#include "sinkattn/sinkattn.h"

namespace {
struct Shape {
  const char* name;
  int b, s, h_q, h_kv, d;
  int64_t window_left;
  bool sinks;
  bool bias = false;
  double dropout_p = 0.0;
  bool extra = false;  // not in the default run: selected by a name substring (or `all`)
};

sinkattn_tensor_t t4(void* p, sinkattn_dtype_t dt, int64_t a, int64_t b, int64_t c, int64_t d) {
  const int64_t shape[4] = {a, b, c, d};
  return sinkattn_make_tensor(p, dt, 4, shape, nullptr);
}

// A device buffer of `elems` random bf16 (N(0, 1)) values (bench_timing.hpp's random_bf16).
void* dalloc_random(size_t elems, std::mt19937& rng) {
  const std::vector<uint16_t> h = sinkattn_bench::random_bf16(elems, rng);
  void* p;
  CK(cudaMalloc(&p, elems * 2));
  CK(cudaMemcpy(p, h.data(), elems * 2, cudaMemcpyHostToDevice));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  // Usage: sinkattn_gpu_bench [reps] [shape-substring | =shape] [--json FILE] (e.g. `1 mha` to profile one shape's
  // kernels with ncu; `all`: every row, the extra ones included; `=gpt-oss-full`: that row alone).
  const sinkattn_bench::Args cli = sinkattn_bench::parse_args(argc, argv, "sinkattn_gpu_bench");
  const std::vector<std::string>& args = cli.positional;
  const int reps = args.size() > 0 ? std::atoi(args[0].c_str()) : 20;
  const std::string only = args.size() > 1 ? args[1] : "";
  const Shape shapes[] = {{"gpt-oss-full", 2, 4096, 64, 8, 64, -1, true},
                          {"gpt-oss-sliding", 2, 4096, 64, 8, 64, 127, true},
                          {"mha-d128", 2, 4096, 32, 32, 128, -1, false},
                          {"gpt-oss-full+bias", 2, 4096, 64, 8, 64, -1, true, true, 0.0, true},
                          {"gpt-oss-full+dropout", 2, 4096, 64, 8, 64, -1, true, false, 0.1, true},
                          {"mha-d128+bias", 2, 4096, 32, 32, 128, -1, false, true, 0.0, true},
                          {"mha-d128+dropout", 2, 4096, 32, 32, 128, -1, false, false, 0.1, true},
                          {"hd256", 2, 4096, 16, 16, 256, -1, false, false, 0.0, true},
                          {"gpt-oss-full-16k", 1, 16384, 64, 8, 64, -1, true, false, 0.0, true},
                          {"mha-d128-16k", 1, 16384, 32, 32, 128, -1, false, false, 0.0, true},
                          // the short-window forward's rule (tiles::kSm90FwdWindowKeys) at other windows and tile 128
                          {"gpt-oss-sliding-w255", 2, 4096, 64, 8, 64, 255, true, false, 0.0, true},
                          {"gpt-oss-sliding-w511", 2, 4096, 64, 8, 64, 511, true, false, 0.0, true},
                          {"gpt-oss-sliding-w895", 2, 4096, 64, 8, 64, 895, true, false, 0.0, true},
                          {"mha-d128-sliding-w127", 2, 4096, 32, 32, 128, 127, false, false, 0.0, true},
                          {"mha-d128-sliding-w511", 2, 4096, 32, 32, 128, 511, false, false, 0.0, true}};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gpu_bench on %s, bf16, causal, %d reps (median of per-call times)\n", prop.name, reps);
  nlohmann::ordered_json report = {{"tool", "sinkattn_gpu_bench"},
                                   {"command", cli.command},
                                   {"date", sinkattn_bench::utc_now()},
                                   {"gpu", prop.name},
                                   {"reps", reps},
                                   {"dtype", "bf16"},
                                   {"rows", nlohmann::ordered_json::array()}};
  std::printf("%-20s %10s %10s %10s %10s %10s %12s %8s %10s\n", "shape", "fwd ms", "fwd TF/s", "bwd ms", "bwd TF/s",
              "f+b ms", "bwd det ms", "det x", "x plain");
  std::mt19937 rng(1);
  struct Plain {
    std::string name;
    float fwd, bwd;
  };
  std::vector<Plain> plain;  // the times of the rows without bias / dropout
  for (const Shape& sh : shapes) {
    const std::string name = sh.name;
    if (!sinkattn_bench::row_selected(only, name, sh.extra)) continue;  // (no argument: the three layers)
    const int kSets = 3;
    const size_t nq = size_t(sh.b) * sh.s * sh.h_q * sh.d, nk = size_t(sh.b) * sh.s * sh.h_kv * sh.d;
    std::vector<void*> q(kSets), k(kSets), v(kSets), dout(kSets);
    for (int i = 0; i < kSets; ++i) {
      q[i] = dalloc_random(nq, rng);
      k[i] = dalloc_random(nk, rng);
      v[i] = dalloc_random(nk, rng);
      dout[i] = dalloc_random(nq, rng);
    }
    void *out, *dq, *dk, *dv, *lse, *sinks, *dsinks, *bias = nullptr, *dbias = nullptr, *rng_state = nullptr;
    CK(cudaMalloc(&out, nq * 2));
    CK(cudaMalloc(&dq, nq * 2));
    CK(cudaMalloc(&dk, nk * 2));
    CK(cudaMalloc(&dv, nk * 2));
    CK(cudaMalloc(&lse, size_t(sh.b) * sh.h_q * sh.s * 4));
    CK(cudaMalloc(&sinks, sh.h_q * 4));
    CK(cudaMalloc(&dsinks, sh.h_q * 4));
    std::vector<float> hs(sh.h_q, std::log(float(sh.s)));
    CK(cudaMemcpy(sinks, hs.data(), sh.h_q * 4, cudaMemcpyHostToDevice));
    sinkattn_params_t p;
    sinkattn_params_init(&p);
    p.out = t4(out, SINKATTN_BF16, sh.b, sh.s, sh.h_q, sh.d);
    const int64_t lshape[3] = {sh.b, sh.h_q, sh.s};
    p.softmax_lse = sinkattn_make_tensor(lse, SINKATTN_F32, 3, lshape, nullptr);
    p.dq = t4(dq, SINKATTN_BF16, sh.b, sh.s, sh.h_q, sh.d);
    p.dk = t4(dk, SINKATTN_BF16, sh.b, sh.s, sh.h_kv, sh.d);
    p.dv = t4(dv, SINKATTN_BF16, sh.b, sh.s, sh.h_kv, sh.d);
    const int64_t hshape[1] = {sh.h_q};
    if (sh.sinks) {
      p.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
      p.sinks = sinkattn_make_tensor(sinks, SINKATTN_F32, 1, hshape, nullptr);
      p.d_sinks = sinkattn_make_tensor(dsinks, SINKATTN_F32, 1, hshape, nullptr);
    }
    if (sh.bias) {
      bias = dalloc_random(size_t(sh.s) * sh.s, rng);
      CK(cudaMalloc(&dbias, size_t(sh.s) * sh.s * 2));
      p.bias = t4(bias, SINKATTN_BF16, 1, 1, sh.s, sh.s);
      p.d_bias = t4(dbias, SINKATTN_BF16, 1, 1, sh.s, sh.s);
    }
    if (sh.dropout_p > 0) {
      const int64_t rshape[1] = {2};
      CK(cudaMalloc(&rng_state, 16));
      p.dropout_p = sh.dropout_p;
      p.seed = 1234;
      p.rng_state = sinkattn_make_tensor(rng_state, SINKATTN_I64, 1, rshape, nullptr);
    }
    p.window_right = 0;
    p.window_left = sh.window_left;
    p.backend = SINKATTN_BACKEND_CUDA;
    auto set = [&](int i) {
      p.q = t4(q[i], SINKATTN_BF16, sh.b, sh.s, sh.h_q, sh.d);
      p.k = t4(k[i], SINKATTN_BF16, sh.b, sh.s, sh.h_kv, sh.d);
      p.v = t4(v[i], SINKATTN_BF16, sh.b, sh.s, sh.h_kv, sh.d);
      p.d_out = t4(dout[i], SINKATTN_BF16, sh.b, sh.s, sh.h_q, sh.d);
    };
    set(0);
    size_t wsf = 0, wsb = 0, wsb_det = 0;
    p.deterministic = 1;  // the deterministic backward's workspace (its dq semaphores) may be the larger one
    const bool det_ok = sinkattn_backward_workspace_size(&p, &wsb_det) == SINKATTN_OK;
    p.deterministic = 0;
    if (!det_ok || sinkattn_forward_workspace_size(&p, &wsf) || sinkattn_backward_workspace_size(&p, &wsb)) {
      std::printf("%s: %s\n", sh.name, sinkattn_last_error());
      for (void* x : {bias, dbias, rng_state}) cudaFree(x);
      continue;
    }
    void* ws = nullptr;
    const size_t wsz = std::max({wsf, wsb, wsb_det});
    if (wsz) CK(cudaMalloc(&ws, wsz));
    p.workspace = ws;
    p.workspace_bytes = wsz;
    double pairs = 0;
    for (int i = 0; i < sh.s; ++i) pairs += sh.window_left < 0 ? i + 1 : std::min<int64_t>(i + 1, sh.window_left + 1);
    const double fwd_flop = 4.0 * sh.b * sh.h_q * sh.d * pairs;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    auto call_ms = [&](bool bwd) {
      return sinkattn_bench::event_ms(e0, e1, sh.name,
                                      [&] { return bwd ? sinkattn_backward(&p) : sinkattn_forward(&p); });
    };
    using sinkattn_bench::median;
    std::vector<float> tf, tb, td;
    for (int r = 0; r < reps + 3; ++r) {
      set(r % kSets);
      const float ms = call_ms(false);
      if (r >= 3) tf.push_back(ms);
    }
    // The default and the deterministic (atomic-free) backward in alternation, each rep both in an order that
    // alternates, so that clock and power drift over the run hit both alike and "det x" compares like with like
    // (the deterministic calls used to come last; both ways read the same within 0.01 on the H200:
    // bench/log/2026-12-03-deterministic-release.md).
    for (int r = 0; r < reps + 3; ++r) {
      set(r % kSets);
      for (int k = 0; k < 2; ++k) {
        const bool det = (k + r) % 2 == 1;
        p.deterministic = det ? 1 : 0;
        const float ms = call_ms(true);
        if (r >= 3) (det ? td : tb).push_back(ms);
      }
    }
    p.deterministic = 0;
    const float f = median(tf), b = median(tb), bd = median(td);
    // "x plain": against the row of the same layer without bias / dropout measured earlier in this run
    char plain_col[32] = "-";
    nlohmann::ordered_json row = {{"shape", name}, {"b", sh.b}, {"s", sh.s}, {"h_q", sh.h_q}, {"h_kv", sh.h_kv},
                                  {"d", sh.d}, {"window_left", sh.window_left}, {"sinks", sh.sinks},
                                  {"bias", sh.bias}, {"dropout_p", sh.dropout_p}};
    if (sh.bias || sh.dropout_p > 0) {
      const std::string layer = name.substr(0, name.find('+'));
      for (const Plain& pl : plain)
        if (pl.name == layer) {
          std::snprintf(plain_col, sizeof plain_col, "%.2f/%.2f", pl.fwd / f, pl.bwd / b);
          row["plain_fwd_ms"] = pl.fwd;
          row["plain_bwd_ms"] = pl.bwd;
        }
    } else {
      plain.push_back({name, f, b});
    }
    std::printf("%-20s %10.3f %10.1f %10.3f %10.1f %10.3f %12.3f %8.3f %10s\n", sh.name, f, fwd_flop / f * 1e-9, b,
                2.5 * fwd_flop / b * 1e-9, f + b, bd, b / bd, plain_col);
    row["fwd_ms"] = f;
    row["fwd_tflops"] = fwd_flop / f * 1e-9;
    row["bwd_ms"] = b;
    row["bwd_tflops"] = 2.5 * fwd_flop / b * 1e-9;
    row["det_bwd_ms"] = bd;
    report["rows"].push_back(row);
    for (int i = 0; i < kSets; ++i) {
      cudaFree(q[i]);
      cudaFree(k[i]);
      cudaFree(v[i]);
      cudaFree(dout[i]);
    }
    for (void* x : {out, dq, dk, dv, lse, sinks, dsinks, ws, bias, dbias, rng_state}) cudaFree(x);
  }
  return sinkattn_bench::write_report(report, cli.json_path);
}

// Decode speed of the CUDA backend through the C ABI, at GPT-OSS-120B's attention shape (h_q 64, h_kv 8, d 64,
// learnable sinks), bf16 paged cache, one new token per sequence (bench/RESULTS.md, decode):
//   page size 16 and 64 x batch 1, 8, 64, 256 x context 1k, 8k, 32k, 128k x full layer and sliding layer
//   (window_left 127, window_right 0); every sequence holds `context` keys in randomly permuted pages.
// Per configuration: microseconds per call from CUDA events around a CUDA graph of R calls replayed many times (no
// launch gaps; R caches rotate so that the data of small configurations is not all in L2), the same launched
// directly on a stream, and the effective bandwidth: bytes of K and V the call must read (the visible keys of every
// sequence and KV head) / time. Measured in the same run: device-to-device copy bandwidth (cudaMemcpyAsync, bytes
// read + written / time, as CUDA's bandwidthTest counts it) and the launch-latency floor (an empty kernel per call,
// graph-replayed the same way). Configurations whose cache does not fit in free device memory are skipped and said.
// Usage: sinkattn_gpu_bench_decode [iters] [filter-substring] [num_splits] [--json FILE]
// --json FILE also writes the run as JSON (the GPU, the UTC time, the command, the copy and launch-floor figures and
// one object per configuration): the input of tools/results_dashboard.py, which builds bench/RESULTS.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "cuda_check.hpp"
#include "sinkattn/sinkattn.h"


namespace {

constexpr int kHq = 64, kHkv = 8, kD = 64;
constexpr size_t kL2Rotate = 256ull << 20;  // rotate caches until R * cache >= 256 MiB (the H200's L2 is 60 MiB)

__global__ void empty_kernel() {}

__global__ void fill_bf16(uint16_t* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ seed;
    x ^= x >> 13;
    x *= 0x5bd1e995u;
    x ^= x >> 15;
    const float f = (static_cast<float>(x & 0xffffu) / 65536.f - 0.5f) * 3.f;  // uniform in [-1.5, 1.5)
    uint32_t u;
    memcpy(&u, &f, 4);
    p[i] = static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
}

struct Timing {
  float graph_us = 0, stream_us = 0;
};

// Times `calls` (each enqueues one decode call on `st`): a graph of all of them replayed `iters` times, and direct
// launches, per call.
template <class F>
Timing time_calls(int n_calls, F&& call, int iters, cudaStream_t st) {
  Timing t;
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  for (int w = 0; w < 3; ++w)
    for (int r = 0; r < n_calls; ++r) call(r);
  CK(cudaStreamSynchronize(st));
  cudaGraph_t g;
  cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
  for (int r = 0; r < n_calls; ++r) call(r);
  CK(cudaStreamEndCapture(st, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  CK(cudaGraphLaunch(ge, st));
  CK(cudaStreamSynchronize(st));
  CK(cudaEventRecord(e0, st));
  for (int i = 0; i < iters; ++i) CK(cudaGraphLaunch(ge, st));
  CK(cudaEventRecord(e1, st));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  t.graph_us = ms * 1e3f / (float(iters) * n_calls);
  CK(cudaEventRecord(e0, st));
  for (int i = 0; i < iters; ++i)
    for (int r = 0; r < n_calls; ++r) call(r);
  CK(cudaEventRecord(e1, st));
  CK(cudaEventSynchronize(e1));
  CK(cudaEventElapsedTime(&ms, e0, e1));
  t.stream_us = ms * 1e3f / (float(iters) * n_calls);
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const sinkattn_bench::Args cli = sinkattn_bench::parse_args(argc, argv, "sinkattn_gpu_bench_decode");
  const std::vector<std::string>& args = cli.positional;
  const int iters = args.size() > 0 ? std::atoi(args[0].c_str()) : 50;
  const std::string only = args.size() > 1 ? args[1] : "";
  const int force_splits = args.size() > 2 ? std::atoi(args[2].c_str()) : 0;
  const std::string date = sinkattn_bench::utc_now();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));

  // ---- copy bandwidth and launch floor, same run ----
  double copy_gbs = 0;
  {
    const size_t bytes = 2ull << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, st));
    const Timing t = time_calls(
        1, [&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)); }, 20, st);
    copy_gbs = 2.0 * bytes / (t.graph_us * 1e-6) * 1e-9;
    cudaFree(a);
    cudaFree(b);
  }
  const Timing floor_t = time_calls(
      8, [&](int) { empty_kernel<<<1, 32, 0, st>>>(); }, iters * 4, st);
  std::printf("gpu_bench_decode on %s (%d SMs), bf16 paged KV, h_q %d h_kv %d d %d, learnable sinks, 1 query per "
              "sequence, %d graph replays%s\n",
              prop.name, prop.multiProcessorCount, kHq, kHkv, kD, iters,
              force_splits > 0 ? (", num_splits " + std::to_string(force_splits)).c_str() : ", num_splits heuristic");
  std::printf("copy bandwidth (device to device, read + write): %.1f GB/s; launch floor (empty kernel, graph): %.2f us, "
              "(stream): %.2f us\n",
              copy_gbs, floor_t.graph_us, floor_t.stream_us);
  std::printf("%-8s %4s %5s %7s %10s %10s %10s %9s %8s %8s\n", "layer", "page", "batch", "context", "KV read MB",
              "us (graph)", "us (strm)", "GB/s", "% copy", "x floor");
  nlohmann::ordered_json report = {
      {"tool", "sinkattn_gpu_bench_decode"}, {"command", cli.command},
      {"date", date},                        {"gpu", prop.name},
      {"sms", prop.multiProcessorCount},     {"shape", {{"h_q", kHq}, {"h_kv", kHkv}, {"d", kD}}},
      {"iters", iters},                      {"num_splits", force_splits},
      {"copy_gbs", copy_gbs},                {"floor_graph_us", floor_t.graph_us},
      {"floor_stream_us", floor_t.stream_us}, {"rows", nlohmann::ordered_json::array()},
      {"skipped", nlohmann::ordered_json::array()}};

  std::mt19937 rng(1);
  const int batches[] = {1, 8, 64, 256};
  const int contexts[] = {1024, 8192, 32768, 131072};
  for (int b : batches) {
    for (int ctx : contexts) {
      const size_t kv_elems = size_t(b) * ctx * kHkv * kD;  // per cache, for K (and the same for V)
      const size_t cache_bytes = 2 * kv_elems * 2;
      const int R = static_cast<int>(std::clamp<size_t>(kL2Rotate / cache_bytes + 1, 1, 64));
      size_t free_b = 0, total_b = 0;
      CK(cudaMemGetInfo(&free_b, &total_b));
      const size_t need = R * cache_bytes + (size_t(b) * kHq * kD * 2) * 2 + (64ull << 20);
      if (need > free_b * 0.95) {
        std::printf("%-8s %4s %5d %7d %10.0f  skipped: needs %.1f GB, %.1f GB free\n", "both", "both", b, ctx,
                    cache_bytes / 1e6, need / 1e9, free_b / 1e9);
        report["skipped"].push_back({{"batch", b}, {"context", ctx}, {"need_gb", need / 1e9}, {"free_gb", free_b / 1e9}});
        continue;
      }
      uint16_t *k, *v;
      CK(cudaMalloc(&k, R * kv_elems * 2));
      CK(cudaMalloc(&v, R * kv_elems * 2));
      fill_bf16<<<1024, 256, 0, st>>>(k, R * kv_elems, 1);
      fill_bf16<<<1024, 256, 0, st>>>(v, R * kv_elems, 2);
      void *q, *out, *lse, *sinks, *used;
      CK(cudaMalloc(&q, size_t(b) * kHq * kD * 2));
      CK(cudaMalloc(&out, size_t(b) * kHq * kD * 2));
      CK(cudaMalloc(&lse, size_t(b) * kHq * 4));
      CK(cudaMalloc(&sinks, kHq * 4));
      CK(cudaMalloc(&used, size_t(b) * 4));
      fill_bf16<<<64, 256, 0, st>>>(static_cast<uint16_t*>(q), size_t(b) * kHq * kD, 3);
      {
        std::vector<float> hs(kHq);
        for (int h = 0; h < kHq; ++h) hs[h] = h % 2 ? 2.f : std::log(float(ctx));
        std::vector<int32_t> hu(b, ctx);
        CK(cudaMemcpy(sinks, hs.data(), kHq * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(used, hu.data(), size_t(b) * 4, cudaMemcpyHostToDevice));
      }
      for (int ps : {16, 64}) {
        const int64_t pages = int64_t(b) * ctx / ps;  // per cache
        const int64_t max_pages = ctx / ps;
        int32_t* tables;
        CK(cudaMalloc(&tables, size_t(R) * pages * 4));
        {  // rotation r uses the pages of cache r, permuted
          std::vector<int32_t> perm(static_cast<size_t>(pages)), all;
          for (int r = 0; r < R; ++r) {
            for (int64_t i = 0; i < pages; ++i) perm[i] = static_cast<int32_t>(r * pages + i);
            std::shuffle(perm.begin(), perm.end(), rng);
            all.insert(all.end(), perm.begin(), perm.end());
          }
          CK(cudaMemcpy(tables, all.data(), all.size() * 4, cudaMemcpyHostToDevice));
        }
        for (int sliding = 0; sliding < 2; ++sliding) {
          const char* layer = sliding ? "sliding" : "full";
          char tag[96];
          std::snprintf(tag, sizeof tag, "%s ps%d b%d ctx%d", layer, ps, b, ctx);
          if (std::string(tag).find(only) == std::string::npos) continue;
          sinkattn_params_t p;
          sinkattn_params_init(&p);
          const int64_t qs[4] = {b, 1, kHq, kD}, ls[3] = {b, kHq, 1}, hs[1] = {kHq}, us[1] = {b};
          const int64_t pool[4] = {R * pages, ps, kHkv, kD}, pt[2] = {b, max_pages};
          p.q = sinkattn_make_tensor(q, SINKATTN_BF16, 4, qs, nullptr);
          p.k = sinkattn_make_tensor(k, SINKATTN_BF16, 4, pool, nullptr);
          p.v = sinkattn_make_tensor(v, SINKATTN_BF16, 4, pool, nullptr);
          p.out = sinkattn_make_tensor(out, SINKATTN_BF16, 4, qs, nullptr);
          p.softmax_lse = sinkattn_make_tensor(lse, SINKATTN_F32, 3, ls, nullptr);
          p.sinks = sinkattn_make_tensor(sinks, SINKATTN_F32, 1, hs, nullptr);
          p.seqused_kv = sinkattn_make_tensor(used, SINKATTN_I32, 1, us, nullptr);
          p.page_table = sinkattn_make_tensor(tables, SINKATTN_I32, 2, pt, nullptr);
          p.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
          p.window_left = sliding ? 127 : -1;
          p.window_right = sliding ? 0 : -1;
          p.num_splits = force_splits;
          p.backend = SINKATTN_BACKEND_CUDA;
          p.stream = st;
          p.trust_device_batch_tensors = 1;  // a serving loop's call: no read-back of the page table
          size_t ws = 0;
          if (sinkattn_forward_workspace_size(&p, &ws) != SINKATTN_OK) {
            std::printf("%s: %s\n", tag, sinkattn_last_error());
            return 1;
          }
          void* wsp = nullptr;
          if (ws) CK(cudaMalloc(&wsp, ws));
          p.workspace = wsp;
          p.workspace_bytes = ws;
          std::vector<sinkattn_params_t> calls(R, p);
          for (int r = 0; r < R; ++r) calls[r].page_table.data = tables + size_t(r) * pages;
          bool ok = true;
          const Timing t = time_calls(
              R,
              [&](int r) {
                if (sinkattn_forward(&calls[r]) != SINKATTN_OK) {
                  ok = false;
                  std::printf("%s: %s\n", tag, sinkattn_last_error());
                }
              },
              iters, st);
          if (!ok) return 1;
          const double keys = sliding ? std::min(ctx, 128) : ctx;
          const double bytes = double(b) * keys * kHkv * (kD + kD) * 2;  // K and V rows every sequence must read
          const double gbs = bytes / (t.graph_us * 1e-6) * 1e-9;
          std::printf("%-8s %4d %5d %7d %10.2f %10.2f %10.2f %9.1f %7.1f%% %8.2f\n", layer, ps, b, ctx, bytes / 1e6,
                      t.graph_us, t.stream_us, gbs, 100.0 * gbs / copy_gbs, t.graph_us / floor_t.graph_us);
          report["rows"].push_back({{"layer", layer},
                                    {"page", ps},
                                    {"batch", b},
                                    {"context", ctx},
                                    {"kv_mb", bytes / 1e6},
                                    {"us_graph", t.graph_us},
                                    {"us_stream", t.stream_us},
                                    {"gbs", gbs}});
          std::fflush(stdout);
          if (wsp) cudaFree(wsp);
        }
        cudaFree(tables);
      }
      for (void* x : {static_cast<void*>(k), static_cast<void*>(v), q, out, lse, sinks, used}) cudaFree(x);
    }
  }
  return sinkattn_bench::write_report(report, cli.json_path);
}

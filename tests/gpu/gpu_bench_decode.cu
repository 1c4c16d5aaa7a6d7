// Decode speed of the CUDA backend through the C ABI, at GPT-OSS-120B's attention shape (h_q 64, h_kv 8, d 64,
// learnable sinks), bf16 paged cache, one new token per sequence (bench/RESULTS.md, decode):
//   page size 16 and 64 x batch 1, 8, 64, 256 x context 1k, 8k, 32k, 128k x full layer and sliding layer
//   (window_left 127, window_right 0); every sequence holds `context` keys in randomly permuted pages.
// Per configuration: microseconds per call from CUDA events around a CUDA graph of R calls replayed many times (no
// launch gaps; R caches rotate so that the data of small configurations is not all in L2), the same launched
// directly on a stream, and the effective bandwidth: bytes of K and V the call must read (the visible keys of every
// sequence and KV head) / time. Measured in the same run: device-to-device copy bandwidth (cudaMemcpyAsync, bytes
// read + written / time, as CUDA's bandwidthTest counts it), the launch-latency floor (an empty kernel per call,
// graph-replayed the same way), and per configuration a plain streaming-read kernel (stream_read: 16-byte loads,
// grid-stride, as many blocks as are resident on the GPU, an XOR reduction written per warp) over the same bytes:
// call r of the graph reads the first `KV read MB` / 2 bytes of cache r's K buffer and of its V buffer, so that one
// replay reads R times the bytes from R distinct buffers, as the decode calls do. Where R times the bytes fits in
// the L2 (the small sliding configurations), both are served from it alike; "% read" compares the two. The read is
// the same for both page sizes (it has no pages) and is measured once per batch, context and layer.
// "splits": the key splits of the call, from the CUDA backend's report of it ("; N key splits", kernel_report.hpp),
// or for a library whose report does not say, from its workspace size (the split partials of decode.cu's plan);
// "kernels": 2 where a combine kernel merges the splits, else 1 (no split, or the splits combined in their cluster).
// --sweep-splits: each configuration also timed (in the graph) with num_splits forced to 1, 2, 4, ..., 128 (the
// combine's limit; no more splits than the row has 64-key tiles), one line per configuration under its row: the
// time of each, the best, and the heuristic's time over the best's; a summary at the end.
// Usage: sinkattn_gpu_bench_decode [iters] [filter] [num_splits] [--sweep-splits] [--json FILE]
//   filter: configurations whose tag ("full ps16 b1 ctx32768") contains it; commas separate parts that must all be
//   in the tag ("sliding,b256"). num_splits: forced for every call (0: the heuristic).
// --json FILE also writes the run as JSON (the GPU, the UTC time, the command, the copy, streaming-read and
// launch-floor figures and one object per configuration): the input of tools/results_dashboard.py, which builds
// bench/RESULTS.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
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
#include "kernel_report.hpp"
#include "sinkattn/sinkattn.h"


namespace {

// What the program is doing ("full ps64 b256 ctx8192, heuristic splits"), named by every CUDA error below: a kernel's
// fault surfaces at the next synchronisation, and the row that was running is the one to suspect.
std::string g_doing = "setup";

}  // namespace

// cuda_check.hpp's CK, with g_doing in its message.
#undef CK
#define CK(expr)                                                                                               \
  do {                                                                                                         \
    cudaError_t _e = (expr);                                                                                   \
    if (_e != cudaSuccess) {                                                                                   \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s (during: %s)\n", cudaGetErrorName(_e), __FILE__, __LINE__, \
                   #expr, g_doing.c_str());                                                                    \
      std::exit(2);                                                                                            \
    }                                                                                                          \
  } while (0)

namespace {

constexpr int kHq = 64, kHkv = 8, kD = 64;
constexpr size_t kL2Rotate = 256ull << 20;  // rotate caches until R * cache >= 256 MiB (the H200's L2 is 60 MiB)
constexpr int kMaxSplits = 128;             // kCombineMaxSplits (src/cuda/decode/decode_combine.cuh)
constexpr int kReadThreads = 256, kReadUnroll = 4;

__global__ void empty_kernel() {}

// The streaming-read anchor: n 16-byte vectors of a and of b, each read once (grid-stride, kReadUnroll iterations'
// loads of both buffers issued before their use), XOR-reduced per warp and written, so that no load is dropped.
__global__ void __launch_bounds__(kReadThreads)
    stream_read(const uint4* __restrict__ a, const uint4* __restrict__ b, size_t n, uint32_t* __restrict__ out) {
  const size_t stride = size_t(gridDim.x) * kReadThreads;
  size_t i = blockIdx.x * size_t(kReadThreads) + threadIdx.x;
  uint32_t x = 0;
  for (; i + (kReadUnroll - 1) * stride < n; i += kReadUnroll * stride) {
    uint4 va[kReadUnroll], vb[kReadUnroll];
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u) {
      va[u] = a[i + u * stride];
      vb[u] = b[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < kReadUnroll; ++u)
      x ^= va[u].x ^ va[u].y ^ va[u].z ^ va[u].w ^ vb[u].x ^ vb[u].y ^ vb[u].z ^ vb[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 va = a[i], vb = b[i];
    x ^= va.x ^ va.y ^ va.z ^ va.w ^ vb.x ^ vb.y ^ vb.z ^ vb.w;
  }
  x = __reduce_xor_sync(0xffffffffu, x);
  if ((threadIdx.x & 31) == 0) out[(blockIdx.x * size_t(kReadThreads) + threadIdx.x) / 32] = x;
}

// Launches stream_read over `bytes` of a and `bytes` of b (a multiple of 16) with enough blocks to fill the GPU.
struct StreamRead {
  int max_blocks = 0;
  uint32_t* out = nullptr;  // one word per warp of the largest grid
  explicit StreamRead(int sms) {
    int per_sm = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, stream_read, kReadThreads, 0));
    max_blocks = std::max(per_sm, 1) * sms;
    CK(cudaMalloc(&out, size_t(max_blocks) * (kReadThreads / 32) * 4));
  }
  ~StreamRead() { cudaFree(out); }
  void operator()(const void* a, const void* b, size_t bytes, cudaStream_t st) const {
    const size_t n = bytes / 16;
    const int blocks = static_cast<int>(std::clamp<size_t>((n + kReadThreads - 1) / kReadThreads, 1, max_blocks));
    stream_read<<<blocks, kReadThreads, 0, st>>>(static_cast<const uint4*>(a), static_cast<const uint4*>(b), n, out);
  }
};

// The key splits of a decode call and its kernel count from the backend's report ("; 6 key splits, one cluster",
// "; 6 key splits + the combine kernel", "; 1 key split"); false when the report names no split count.
bool splits_of_report(const sinkattn_params_t& p, int* splits, int* kernels) {
  const std::string report = sinkattn_test::cuda_kernels(p);
  const size_t at = report.find(" key split");
  if (at == std::string::npos) return false;
  size_t num = at;
  while (num > 0 && report[num - 1] >= '0' && report[num - 1] <= '9') --num;
  if (num == at) return false;
  *splits = std::atoi(report.c_str() + num);
  *kernels = report.find("combine kernel", at) != std::string::npos ? 2 : 1;
  return true;
}

// The key splits of a decode call from the workspace its size query reported: decode.cu's plan_decode lays out the
// fp32 partial outputs of num_splits x h_q x rows (256-byte aligned) then their LSEs, and takes none without splits.
// -1 when no split count gives `ws` (the plan's layout changed: update this).
int splits_of_workspace(size_t ws, int64_t rows) {
  if (ws == 0) return 1;
  auto align256 = [](size_t x) { return (x + 255) & ~size_t(255); };
  for (int s = 2; s <= kMaxSplits; ++s) {
    const size_t n = size_t(s) * kHq * size_t(rows);
    if (align256(align256(n * kD * 4) + n * 4) == ws) return s;
  }
  return -1;
}

// Whether `tag` contains every comma-separated part of `filter` ("" matches all).
bool matches(const std::string& tag, const std::string& filter) {
  size_t at = 0;
  while (at <= filter.size()) {
    const size_t end = std::min(filter.find(',', at), filter.size());
    if (tag.find(filter.substr(at, end - at)) == std::string::npos) return false;
    at = end + 1;
  }
  return true;
}

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

// Host-to-device upload on `st`, waited for. Not cudaMemcpy: that runs on the legacy default stream, which `st`
// (cudaStreamNonBlocking) is not ordered after, and from pageable memory it returns once the data is staged, before
// the DMA has landed (CUDA Runtime API, "API synchronization behavior"): a kernel launched on `st` right after it
// could read the buffer's previous contents. For a page table those are whatever the allocator's reused memory
// held (after a split sweep, possibly the fp32 partials of a freed workspace, read as pages far outside the cache).
// The full sweep faulted (cudaErrorIllegalAddress, cudaErrorInvalidAddressSpace) after the page-16 rows of batch 256
// with cudaMemcpy and not with this upload (H100, 2026-12-06, 2 runs each); memcheck, which serialises copies and
// kernels, saw nothing, and a table poisoned before a cudaMemcpy upload did not fault: this race is the likeliest
// cause, not a proven one.
void upload(void* dst, const void* src, size_t bytes, cudaStream_t st) {
  CK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, st));
  CK(cudaStreamSynchronize(st));
}

// Waits for all the device's work and checks for an error (a fault of an earlier kernel included), so that it is
// reported for `g_doing`, the step that launched it, not for a later one.
void finish_step() {
  CK(cudaDeviceSynchronize());
  CK(cudaGetLastError());
}

struct Timing {
  float graph_us = 0, stream_us = 0;
};

// Times `calls` (each enqueues one decode call on `st`): a graph of all of them replayed `iters` times, and (unless
// !with_stream) direct launches, per call.
template <class F>
Timing time_calls(int n_calls, F&& call, int iters, cudaStream_t st, bool with_stream = true) {
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
  if (with_stream) {
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < iters; ++i)
      for (int r = 0; r < n_calls; ++r) call(r);
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    CK(cudaEventElapsedTime(&ms, e0, e1));
    t.stream_us = ms * 1e3f / (float(iters) * n_calls);
  }
  cudaGraphExecDestroy(ge);
  cudaGraphDestroy(g);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
  const sinkattn_bench::Args cli = sinkattn_bench::parse_args(argc, argv, "sinkattn_gpu_bench_decode");
  std::vector<std::string> args;
  bool sweep = false;
  for (const std::string& a : cli.positional) {
    if (a == "--sweep-splits") {
      sweep = true;
    } else if (a.rfind("--", 0) == 0) {
      std::printf("unknown option %s\nusage: sinkattn_gpu_bench_decode [iters] [filter] [num_splits] [--sweep-splits] "
                  "[--json FILE]\n",
                  a.c_str());
      return 2;
    } else {
      args.push_back(a);
    }
  }
  const int iters = args.size() > 0 ? std::atoi(args[0].c_str()) : 50;
  const std::string only = args.size() > 1 ? args[1] : "";
  const int force_splits = args.size() > 2 ? std::atoi(args[2].c_str()) : 0;
  const std::string date = sinkattn_bench::utc_now();
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t st;
  CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  const StreamRead read_kernel(prop.multiProcessorCount);

  // ---- copy bandwidth, streaming read of 2 GiB and launch floor, same run ----
  double copy_gbs = 0, read_2g_gbs = 0;
  {
    const size_t bytes = 2ull << 30;
    void *a, *b;
    g_doing = "copy bandwidth and streaming read of 2 GiB";
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    CK(cudaMemsetAsync(a, 1, bytes, st));
    const Timing t = time_calls(
        1, [&](int) { CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, st)); }, 20, st);
    copy_gbs = 2.0 * bytes / (t.graph_us * 1e-6) * 1e-9;
    const Timing tr = time_calls(
        1, [&](int) { read_kernel(a, static_cast<char*>(a) + bytes / 2, bytes / 2, st); }, 20, st, false);
    read_2g_gbs = bytes / (tr.graph_us * 1e-6) * 1e-9;
    finish_step();
    CK(cudaFree(a));
    CK(cudaFree(b));
  }
  g_doing = "launch floor";
  const Timing floor_t = time_calls(
      8, [&](int) { empty_kernel<<<1, 32, 0, st>>>(); }, iters * 4, st);
  std::printf("gpu_bench_decode on %s (%d SMs), bf16 paged KV, h_q %d h_kv %d d %d, learnable sinks, 1 query per "
              "sequence, %d graph replays%s%s\n",
              prop.name, prop.multiProcessorCount, kHq, kHkv, kD, iters,
              force_splits > 0 ? (", num_splits " + std::to_string(force_splits)).c_str() : ", num_splits heuristic",
              sweep ? ", split sweep" : "");
  std::printf("copy bandwidth (device to device, read + write): %.1f GB/s; streaming read of 2 GiB (stream_read, "
              "%d blocks): %.1f GB/s; launch floor (empty kernel, graph): %.2f us, (stream): %.2f us\n",
              copy_gbs, read_kernel.max_blocks, read_2g_gbs, floor_t.graph_us, floor_t.stream_us);
  std::printf("%-8s %4s %5s %7s %10s %10s %10s %9s %8s %8s %8s %9s %6s %7s\n", "layer", "page", "batch", "context",
              "KV read MB", "us (graph)", "us (strm)", "GB/s", "% copy", "% read", "x floor", "read GB/s", "splits",
              "kernels");
  nlohmann::ordered_json report = {
      {"tool", "sinkattn_gpu_bench_decode"}, {"command", cli.command},
      {"date", date},                        {"gpu", prop.name},
      {"sms", prop.multiProcessorCount},     {"shape", {{"h_q", kHq}, {"h_kv", kHkv}, {"d", kD}}},
      {"iters", iters},                      {"num_splits", force_splits},
      {"sweep_splits", sweep},               {"copy_gbs", copy_gbs},
      {"read_2gib_gbs", read_2g_gbs},        {"floor_graph_us", floor_t.graph_us},
      {"floor_stream_us", floor_t.stream_us}, {"rows", nlohmann::ordered_json::array()},
      {"skipped", nlohmann::ordered_json::array()}};
  struct SweepRow {
    std::string tag;
    int heuristic, best;
    float heuristic_us, best_us;
  };
  std::vector<SweepRow> sweep_rows;

  const int batches[] = {1, 8, 64, 256};
  const int contexts[] = {1024, 8192, 32768, 131072};
  for (int b : batches) {
    for (int ctx : contexts) {
      auto tag_of = [&](int sliding, int ps) {
        char tag[96];
        std::snprintf(tag, sizeof tag, "%s ps%d b%d ctx%d", sliding ? "sliding" : "full", ps, b, ctx);
        return std::string(tag);
      };
      bool wanted[2] = {false, false};  // per layer: some page size's tag matches the filter
      for (int sliding = 0; sliding < 2; ++sliding)
        for (int ps : {16, 64}) wanted[sliding] = wanted[sliding] || matches(tag_of(sliding, ps), only);
      if (!wanted[0] && !wanted[1]) continue;
      const size_t kv_elems = size_t(b) * ctx * kHkv * kD;  // per cache, for K (and the same for V)
      const size_t cache_bytes = 2 * kv_elems * 2;
      const int R = static_cast<int>(std::clamp<size_t>(kL2Rotate / cache_bytes + 1, 1, 64));
      const size_t ws_bound = size_t(kMaxSplits) * kHq * b * (kD + 1) * 4 + 512;  // the partials of 128 splits
      size_t free_b = 0, total_b = 0;
      CK(cudaMemGetInfo(&free_b, &total_b));
      const size_t need = R * cache_bytes + (size_t(b) * kHq * kD * 2) * 2 + ws_bound + (64ull << 20);
      if (need > free_b * 0.95) {
        std::printf("%-8s %4s %5d %7d %10.0f  skipped: needs %.1f GB, %.1f GB free\n", "both", "both", b, ctx,
                    cache_bytes / 1e6, need / 1e9, free_b / 1e9);
        report["skipped"].push_back({{"batch", b}, {"context", ctx}, {"need_gb", need / 1e9}, {"free_gb", free_b / 1e9}});
        continue;
      }
      g_doing = "b" + std::to_string(b) + " ctx" + std::to_string(ctx) + ": caches and streaming read";
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
        upload(sinks, hs.data(), kHq * 4, st);
        upload(used, hu.data(), size_t(b) * 4, st);
      }
      // The streaming read of each layer's bytes: call r reads the first half-bytes of cache r's K and V.
      Timing read_t[2];
      for (int sliding = 0; sliding < 2; ++sliding) {
        if (!wanted[sliding]) continue;
        const size_t half = size_t(b) * (sliding ? std::min(ctx, 128) : ctx) * kHkv * kD * 2;  // bytes of K (of V)
        read_t[sliding] = time_calls(
            R, [&](int r) { read_kernel(k + size_t(r) * kv_elems, v + size_t(r) * kv_elems, half, st); }, iters, st,
            false);
      }
      finish_step();
      for (int ps : {16, 64}) {
        g_doing = tag_of(0, ps) + " / " + tag_of(1, ps) + ": page tables";
        const int64_t pages = int64_t(b) * ctx / ps;  // per cache
        const int64_t max_pages = ctx / ps;
        int32_t* tables;
        CK(cudaMalloc(&tables, size_t(R) * pages * 4));
        {  // rotation r uses the pages of cache r, permuted (seeded per configuration: a filtered run's pages are
           // the full run's)
          std::mt19937 rng(static_cast<uint32_t>(b) * 1000003u + static_cast<uint32_t>(ctx) * 131u +
                           static_cast<uint32_t>(ps));
          std::vector<int32_t> perm(static_cast<size_t>(pages)), all;
          for (int r = 0; r < R; ++r) {
            for (int64_t i = 0; i < pages; ++i) perm[i] = static_cast<int32_t>(r * pages + i);
            std::shuffle(perm.begin(), perm.end(), rng);
            all.insert(all.end(), perm.begin(), perm.end());
          }
          upload(tables, all.data(), all.size() * 4, st);
        }
        for (int sliding = 0; sliding < 2; ++sliding) {
          const char* layer = sliding ? "sliding" : "full";
          const std::string tag = tag_of(sliding, ps);
          if (!matches(tag, only)) continue;
          g_doing = tag + ", num_splits " + (force_splits > 0 ? std::to_string(force_splits) : "heuristic");
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
          p.backend = SINKATTN_BACKEND_CUDA;
          p.stream = st;
          p.trust_device_batch_tensors = 1;  // a serving loop's call: no read-back of the page table
          // workspace: the call's own, and (sweeping) that of the most splits, which every forced count fits in
          size_t ws = 0, ws_alloc = 0;
          p.num_splits = sweep ? kMaxSplits : force_splits;
          const sinkattn_status_t st_max = sinkattn_forward_workspace_size(&p, &ws_alloc);
          p.num_splits = force_splits;
          if (st_max != SINKATTN_OK || sinkattn_forward_workspace_size(&p, &ws) != SINKATTN_OK) {
            std::printf("%s: %s\n", tag.c_str(), sinkattn_last_error());
            return 1;
          }
          ws_alloc = std::max(ws_alloc, ws);
          void* wsp = nullptr;
          if (ws_alloc) CK(cudaMalloc(&wsp, ws_alloc));
          p.workspace = wsp;
          p.workspace_bytes = ws_alloc;
          int splits = 0, kernels = 0;
          if (!splits_of_report(p, &splits, &kernels)) {
            splits = splits_of_workspace(ws, b);
            kernels = splits > 1 ? 2 : 1;
          }
          std::vector<sinkattn_params_t> calls(R, p);
          for (int r = 0; r < R; ++r) calls[r].page_table.data = tables + size_t(r) * pages;
          bool ok = true;
          auto run = [&](std::vector<sinkattn_params_t>& cs, bool with_stream) {
            return time_calls(
                R,
                [&](int r) {
                  if (sinkattn_forward(&cs[r]) != SINKATTN_OK) {
                    ok = false;
                    std::printf("%s: %s\n", tag.c_str(), sinkattn_last_error());
                  }
                },
                iters, st, with_stream);
          };
          const Timing t = run(calls, true);
          if (!ok) return 1;
          const double keys = sliding ? std::min(ctx, 128) : ctx;
          const double bytes = double(b) * keys * kHkv * (kD + kD) * 2;  // K and V rows every sequence must read
          const double gbs = bytes / (t.graph_us * 1e-6) * 1e-9;
          const double read_gbs = bytes / (read_t[sliding].graph_us * 1e-6) * 1e-9;
          const std::string splits_s = splits > 0 ? std::to_string(splits) : "?";
          const std::string kernels_s = splits > 0 ? std::to_string(kernels) : "?";
          std::printf("%-8s %4d %5d %7d %10.2f %10.2f %10.2f %9.1f %7.1f%% %7.1f%% %8.2f %9.1f %6s %7s\n", layer, ps, b,
                      ctx, bytes / 1e6, t.graph_us, t.stream_us, gbs, 100.0 * gbs / copy_gbs, 100.0 * gbs / read_gbs,
                      t.graph_us / floor_t.graph_us, read_gbs, splits_s.c_str(), kernels_s.c_str());
          nlohmann::ordered_json row = {{"layer", layer},
                                        {"page", ps},
                                        {"batch", b},
                                        {"context", ctx},
                                        {"kv_mb", bytes / 1e6},
                                        {"us_graph", t.graph_us},
                                        {"us_stream", t.stream_us},
                                        {"gbs", gbs},
                                        {"read_us_graph", read_t[sliding].graph_us},
                                        {"read_gbs", read_gbs},
                                        {"splits", splits > 0 ? nlohmann::ordered_json(splits) : nullptr},
                                        {"kernels", splits > 0 ? nlohmann::ordered_json(kernels) : nullptr}};
          if (sweep) {
            // Forced split counts, at most one per 64-key tile a row reads (more only adds empty splits).
            const int tiles = static_cast<int>((keys + 63) / 64);
            int best = splits, best_kernels = kernels;
            float best_us = t.graph_us;
            std::string line;
            nlohmann::ordered_json times = nlohmann::ordered_json::object();
            for (int s : {1, 2, 4, 8, 16, 32, 64, 128}) {
              if (s > std::max(tiles, 1) || s > kMaxSplits) break;
              std::vector<sinkattn_params_t> forced(calls);
              for (sinkattn_params_t& c : forced) c.num_splits = s;
              g_doing = tag + ", split sweep: num_splits " + std::to_string(s);
              const Timing ts = run(forced, false);
              if (!ok) return 1;
              times[std::to_string(s)] = ts.graph_us;
              char cell[32];
              std::snprintf(cell, sizeof cell, " %d: %.2f", s, ts.graph_us);
              line += cell;
              if (ts.graph_us < best_us) {
                best_us = ts.graph_us;
                best = s;
                int rs = 0;
                if (!splits_of_report(forced[0], &rs, &best_kernels)) best_kernels = s > 1 ? 2 : 1;
              }
            }
            const double best_gbs = bytes / (best_us * 1e-6) * 1e-9;
            std::printf("    splits (us, graph):%s | heuristic %s (%s kernel%s) %.2f | best %d (%d kernel%s) %.2f, "
                        "%.1f%% read | heuristic %.2fx the best\n",
                        line.c_str(), splits_s.c_str(), kernels_s.c_str(), splits == 1 ? "" : "s", t.graph_us, best,
                        best_kernels, best_kernels > 1 ? "s" : "", best_us, 100.0 * best_gbs / read_gbs,
                        t.graph_us / best_us);
            row["sweep_us_graph"] = times;
            row["best_splits"] = best;
            row["best_kernels"] = best_kernels;
            row["best_us_graph"] = best_us;
            sweep_rows.push_back({tag, splits, best, t.graph_us, best_us});
          }
          report["rows"].push_back(row);
          std::fflush(stdout);
          finish_step();  // the row's last calls, before its workspace is freed
          if (wsp) CK(cudaFree(wsp));
        }
        CK(cudaFree(tables));
      }
      g_doing = "b" + std::to_string(b) + " ctx" + std::to_string(ctx) + ": freeing the caches";
      for (void* x : {static_cast<void*>(k), static_cast<void*>(v), q, out, lse, sinks, used}) CK(cudaFree(x));
    }
  }
  g_doing = "the end of the run";
  finish_step();
  if (sweep && !sweep_rows.empty()) {
    int within = 0;
    for (const SweepRow& r : sweep_rows) within += r.heuristic_us <= 1.05f * r.best_us;
    std::printf("split sweep: the heuristic within 5%% of the best forced count in %d of %zu configurations; "
                "the others, slowest first:\n",
                within, sweep_rows.size());
    std::vector<SweepRow> off;
    for (const SweepRow& r : sweep_rows)
      if (r.heuristic_us > 1.05f * r.best_us) off.push_back(r);
    std::sort(off.begin(), off.end(), [](const SweepRow& x, const SweepRow& y) {
      return x.heuristic_us / x.best_us > y.heuristic_us / y.best_us;
    });
    for (const SweepRow& r : off)
      std::printf("  %-26s heuristic %3d splits %10.2f us, best %3d splits %10.2f us: %.2fx\n", r.tag.c_str(),
                  r.heuristic, r.heuristic_us, r.best, r.best_us, r.heuristic_us / r.best_us);
  }
  const double wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf("wall time %.1f s\n", wall_s);
  report["wall_s"] = wall_s;
  return sinkattn_bench::write_report(report, cli.json_path);
}

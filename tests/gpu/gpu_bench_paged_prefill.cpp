// Paged prefill speed of the CUDA backend through the C ABI: the forward of a prefill chunk whose keys are read
// through a page table (bf16, learnable sinks where the layer has them, causal, bottom-right aligned), against the
// same call on the same keys in a contiguous cache, measured in the same run (bench/RESULTS.md, paged prefill):
//   GPT-OSS full (b 2, s 4096, h_q 64, h_kv 8, d 64), MHA d 128 (b 2, s 4096, h 32), head dim 256 (b 2, s 4096,
//   h 16), and a chunk of 1024 new queries over 8192 cached keys (b 4, GPT-OSS heads), each with pages of 16, 64 and
//   256 rows in a randomly permuted pool.
// Per row: milliseconds per call (median of CUDA-event times around single calls after warm-up; the paged and the
// contiguous call alternate, so that clock drift hits both alike), "x dense" = contiguous time / paged time, and the
// kernels the library reports for the paged call (sinkattn_query_backend). The contiguous call reads [b, s_kv, h_kv,
// d] tensors; the paged one pools of b * s_kv / page_size pages (the same bytes), its page table [b, s_kv /
// page_size] and seqused_kv = s_kv.
// Usage: sinkattn_gpu_bench_paged_prefill [reps] [filter] [--json FILE] (filter: rows whose name contains it).
// --json FILE also writes the rows as JSON (the GPU, the UTC time, the command, one object per row).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_report.hpp"
#include "bench_timing.hpp"
#include "cuda_check.hpp"
#include "kernel_report.hpp"
#include "sinkattn/sinkattn.h"

namespace {

struct Layer {
  const char* name;
  int64_t b, s_q, s_kv, h_q, h_kv, d;
  bool sinks;
};

sinkattn_tensor_t tensor(void* p, sinkattn_dtype_t dt, std::vector<int64_t> shape) {
  return sinkattn_make_tensor(p, dt, static_cast<int32_t>(shape.size()), shape.data(), nullptr);
}

void* upload(const void* src, size_t bytes) {
  void* p = nullptr;
  CK(cudaMalloc(&p, std::max<size_t>(bytes, 16)));
  CK(cudaMemcpy(p, src, bytes, cudaMemcpyHostToDevice));
  return p;
}

// The kernels of a forward call, or why none are reported.
std::string kernels_of(const sinkattn_params_t& p) {
  const std::string k = sinkattn_test::cuda_kernels(p);
  return k.empty() ? std::string("not on CUDA: ") + sinkattn_last_error() : k;
}

}  // namespace

int main(int argc, char** argv) {
  const sinkattn_bench::Args cli = sinkattn_bench::parse_args(argc, argv, "sinkattn_gpu_bench_paged_prefill");
  const std::vector<std::string>& args = cli.positional;
  const int reps = args.size() > 0 ? std::atoi(args[0].c_str()) : 20;
  const std::string only = args.size() > 1 ? args[1] : "";
  const Layer layers[] = {{"gpt-oss-full", 2, 4096, 4096, 64, 8, 64, true},
                          {"mha-d128", 2, 4096, 4096, 32, 32, 128, false},
                          {"hd256", 2, 4096, 4096, 16, 16, 256, false},
                          {"gpt-oss-chunk1k-ctx8k", 4, 1024, 8192, 64, 8, 64, true}};
  const int64_t page_sizes[] = {16, 64, 256};
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gpu_bench_paged_prefill on %s, bf16, causal (bottom-right), %d reps (median of per-call times)\n",
              prop.name, reps);
  nlohmann::ordered_json report = {{"tool", "sinkattn_gpu_bench_paged_prefill"},
                                   {"command", cli.command},
                                   {"date", sinkattn_bench::utc_now()},
                                   {"gpu", prop.name},
                                   {"reps", reps},
                                   {"dtype", "bf16"},
                                   {"rows", nlohmann::ordered_json::array()}};
  std::printf("%-24s %6s %10s %10s %8s  %s\n", "layer", "page", "dense ms", "paged ms", "x dense", "paged kernels");
  std::mt19937 rng(7);
  for (const Layer& L : layers) {
    if (!only.empty() && std::string(L.name).find(only) == std::string::npos) continue;
    const size_t nq = size_t(L.b) * L.s_q * L.h_q * L.d, row = size_t(L.h_kv) * L.d, nk = size_t(L.b) * L.s_kv * row;
    const std::vector<uint16_t> hq = sinkattn_bench::random_bf16(nq, rng), hk = sinkattn_bench::random_bf16(nk, rng),
                                hv = sinkattn_bench::random_bf16(nk, rng);
    void* q = upload(hq.data(), nq * 2);
    void* k = upload(hk.data(), nk * 2);
    void* v = upload(hv.data(), nk * 2);
    void *out, *lse, *sinks;
    CK(cudaMalloc(&out, nq * 2));
    CK(cudaMalloc(&lse, size_t(L.b) * L.h_q * L.s_q * 4));
    CK(cudaMalloc(&sinks, L.h_q * 4));
    const std::vector<float> hs(L.h_q, std::log(float(L.s_kv)));
    CK(cudaMemcpy(sinks, hs.data(), L.h_q * 4, cudaMemcpyHostToDevice));
    sinkattn_params_t dense;
    sinkattn_params_init(&dense);
    dense.q = tensor(q, SINKATTN_BF16, {L.b, L.s_q, L.h_q, L.d});
    dense.k = tensor(k, SINKATTN_BF16, {L.b, L.s_kv, L.h_kv, L.d});
    dense.v = tensor(v, SINKATTN_BF16, {L.b, L.s_kv, L.h_kv, L.d});
    dense.out = tensor(out, SINKATTN_BF16, {L.b, L.s_q, L.h_q, L.d});
    dense.softmax_lse = tensor(lse, SINKATTN_F32, {L.b, L.h_q, L.s_q});
    if (L.sinks) {
      dense.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
      dense.sinks = tensor(sinks, SINKATTN_F32, {L.h_q});
    }
    dense.window_right = 0;
    dense.mask_alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
    dense.backend = SINKATTN_BACKEND_CUDA;
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    for (int64_t ps : page_sizes) {
      // The pool: page i of sequence n at slot perm[n * pages + i]; the page table says so; seqused_kv = s_kv.
      const int64_t pages = L.s_kv / ps, total = L.b * pages;
      std::vector<int32_t> perm(total);
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      std::vector<uint16_t> pk(nk), pv(nk);
      for (int64_t n = 0; n < L.b; ++n)
        for (int64_t i = 0; i < pages; ++i) {
          const size_t from = (size_t(n) * L.s_kv + size_t(i) * ps) * row, to = size_t(perm[n * pages + i]) * ps * row;
          std::copy(hk.begin() + from, hk.begin() + from + ps * row, pk.begin() + to);
          std::copy(hv.begin() + from, hv.begin() + from + ps * row, pv.begin() + to);
        }
      const std::vector<int32_t> used(L.b, static_cast<int32_t>(L.s_kv));
      void* kp = upload(pk.data(), nk * 2);
      void* vp = upload(pv.data(), nk * 2);
      void* table = upload(perm.data(), perm.size() * 4);
      void* seqused = upload(used.data(), used.size() * 4);
      sinkattn_params_t paged = dense;
      paged.k = tensor(kp, SINKATTN_BF16, {total, ps, L.h_kv, L.d});
      paged.v = tensor(vp, SINKATTN_BF16, {total, ps, L.h_kv, L.d});
      paged.page_table = tensor(table, SINKATTN_I32, {L.b, pages});
      paged.seqused_kv = tensor(seqused, SINKATTN_I32, {L.b});
      size_t wd = 0, wp = 0;
      if (sinkattn_forward_workspace_size(&dense, &wd) != SINKATTN_OK ||
          sinkattn_forward_workspace_size(&paged, &wp) != SINKATTN_OK) {
        std::printf("%s ps%lld: %s\n", L.name, static_cast<long long>(ps), sinkattn_last_error());
        return 1;
      }
      void* ws = nullptr;
      if (std::max(wd, wp) > 0) CK(cudaMalloc(&ws, std::max(wd, wp)));
      for (sinkattn_params_t* p : {&dense, &paged}) p->workspace = ws, p->workspace_bytes = std::max(wd, wp);
      auto call_ms = [&](sinkattn_params_t& p) {
        return sinkattn_bench::event_ms(e0, e1, L.name, [&] { return sinkattn_forward(&p); });
      };
      std::vector<float> td, tp;
      for (int r = 0; r < reps + 3; ++r)
        for (int j = 0; j < 2; ++j) {
          const bool pg = (j + r) % 2 == 1;
          const float ms = call_ms(pg ? paged : dense);
          if (r >= 3) (pg ? tp : td).push_back(ms);
        }
      const float d = sinkattn_bench::median(td), pms = sinkattn_bench::median(tp);
      const std::string kern = kernels_of(paged), dkern = kernels_of(dense);
      std::printf("%-24s %6lld %10.3f %10.3f %8.3f  %s\n", L.name, static_cast<long long>(ps), d, pms, d / pms,
                  kern.c_str());
      report["rows"].push_back({{"layer", L.name}, {"b", L.b}, {"s_q", L.s_q}, {"s_kv", L.s_kv}, {"h_q", L.h_q},
                                {"h_kv", L.h_kv}, {"d", L.d}, {"sinks", L.sinks}, {"page_size", ps},
                                {"dense_ms", d}, {"paged_ms", pms}, {"x_dense", d / pms},
                                {"paged_kernels", kern}, {"dense_kernels", dkern}});
      for (void* x : {kp, vp, table, seqused, ws}) cudaFree(x);
    }
    for (void* x : {q, k, v, out, lse, sinks}) cudaFree(x);
    CK(cudaEventDestroy(e0));
    CK(cudaEventDestroy(e1));
  }
  return sinkattn_bench::write_report(report, cli.json_path);
}

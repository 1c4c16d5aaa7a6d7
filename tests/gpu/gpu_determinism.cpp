// Deterministic backward of the CUDA backend on large shapes (needs a GPU; tools/gpu-check.sh STEPS=determinism):
// shapes where many key blocks add to every query block's dq (the GPT-OSS layers, MHA d 128, GQA with top-left
// causal and s_q != s_kv, a two-sided window, varlen with seqused_kv, head dim 256), each run
//   - with deterministic = 1 `--reps` times (default 4), outputs NaN-poisoned and the workspace filled with 0xFF
//     before every run: dq, dk, dv, d_sinks (and d_bias for the bias shapes: a 16-bit bias of the dtype of q,
//     [1, 1, s_q, s_kv] or [b, h_q, s_q, s_kv], the Hopper kernels' staged bias tiles and the d_bias group sum) must
//     be bitwise identical across the runs;
//   - with deterministic = 0 once: the same gradients up to the order of the fp32 sums (max |det - nondet| within
//     1% of max |nondet| per tensor, no NaN), so the ordered kernel computes what the atomic one does;
//   - captured into a CUDA graph in each mode and replayed twice on poisoned outputs and workspace: the direct
//     call's bits (deterministic = 1) or values within the same 1% (deterministic = 0) (the backward's kernels
//     launched with programmatic dependent launch are programmatic edges there);
// and the kernel choice of each pass is printed (sinkattn_query_backend). The GPU suite (gpu_suite.cpp) judges the
// values against the CPU backend and the float64 reference on small shapes, deterministic ones included; this
// program is about the order and the waits that only long chains of key blocks exercise. Exit status 1 on a failure.
// Usage: sinkattn_gpu_determinism [--reps N] [--only SUBSTRING] [--time]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda_check.hpp"
#include "sinkattn/sinkattn.h"

namespace {

uint16_t to_half_bits(float f, bool bf16) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if (bf16) return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  // fp16, round to nearest (inputs are small normals)
  const uint32_t sign = (u >> 16) & 0x8000u;
  const float a = std::fabs(f);
  if (a < 6.103515625e-05f) return static_cast<uint16_t>(sign);
  uint32_t ax = u & 0x7fffffffu;
  ax += 0xfffu + ((ax >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((((ax >> 23) - 127 + 15) << 10) | ((ax >> 13) & 0x3ffu)));
}
float half_bits_to_float(uint16_t h, bool bf16) {
  if (bf16) {
    const uint32_t u = static_cast<uint32_t>(h) << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  const uint32_t sign = (h & 0x8000u) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
  uint32_t u;
  if (e == 0) {
    const float f = std::ldexp(static_cast<float>(m), -24);
    return sign ? -f : f;
  }
  u = e == 31 ? (sign | 0x7f800000u | (m << 13)) : (sign | ((e - 15 + 127) << 23) | (m << 13));
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Case {
  const char* name;
  sinkattn_dtype_t dtype;
  int h_q, h_kv, d;
  int64_t wl, wr;
  sinkattn_mask_alignment_t align;
  sinkattn_softmax_type_t st;
  // dense: b sequences of s_q x s_kv; varlen: the per-sequence lengths (and seqused_kv when non-empty)
  int b, s_q, s_kv;
  std::vector<int> len_q, len_kv, used_kv;
  int bias = 0;  // 0 none, 1 [1, 1, s_q, s_kv], 2 [b, h_q, s_q, s_kv] (dense only)
};

struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  void alloc(size_t n) {
    bytes = std::max<size_t>(n, 16);
    CK(cudaMalloc(&p, bytes));
  }
  ~Dev() {
    if (p) cudaFree(p);
  }
  std::vector<unsigned char> host() const {
    std::vector<unsigned char> h(bytes);
    CK(cudaMemcpy(h.data(), p, bytes, cudaMemcpyDeviceToHost));
    return h;
  }
  void poison() { CK(cudaMemset(p, 0xFF, bytes)); }  // NaN in fp16 / bf16 / fp32
};

std::string cuda_line(const sinkattn_params_t& p, bool backward) {
  char buf[4096] = {0};
  sinkattn_backend_t chosen;
  if (sinkattn_query_backend(&p, backward ? 1 : 0, &chosen, buf, sizeof buf) != SINKATTN_OK)
    return std::string("query failed: ") + sinkattn_last_error();
  std::string s(buf);
  const size_t a = s.find("cuda: ");
  if (a == std::string::npos) return s;
  const size_t e = s.find('\n', a);
  return s.substr(a, e == std::string::npos ? std::string::npos : e - a);
}

// max |a - b| / max |b| over a 16-bit or fp32 tensor; NaN if either holds a NaN.
double rel_diff(const std::vector<unsigned char>& a, const std::vector<unsigned char>& b, bool f32, bool bf16) {
  const size_t n = f32 ? a.size() / 4 : a.size() / 2;
  double md = 0, mb = 0;
  for (size_t i = 0; i < n; ++i) {
    float x, y;
    if (f32) {
      std::memcpy(&x, a.data() + 4 * i, 4);
      std::memcpy(&y, b.data() + 4 * i, 4);
    } else {
      uint16_t u, v;
      std::memcpy(&u, a.data() + 2 * i, 2);
      std::memcpy(&v, b.data() + 2 * i, 2);
      x = half_bits_to_float(u, bf16);
      y = half_bits_to_float(v, bf16);
    }
    if (std::isnan(x) || std::isnan(y)) return NAN;
    md = std::max(md, static_cast<double>(std::fabs(x - y)));
    mb = std::max(mb, static_cast<double>(std::fabs(y)));
  }
  return mb > 0 ? md / mb : md;
}

int run_case(const Case& c, int reps, bool time_it) {
  const bool varlen = !c.len_q.empty();
  const bool bf16 = c.dtype == SINKATTN_BF16;
  const int b = varlen ? static_cast<int>(c.len_q.size()) : c.b;
  int64_t tq = 0, tk = 0;
  int max_q = 0, max_kv = 0;
  std::vector<int32_t> cu_q{0}, cu_k{0};
  if (varlen) {
    for (int n = 0; n < b; ++n) {
      tq += c.len_q[n];
      tk += c.len_kv[n];
      cu_q.push_back(static_cast<int32_t>(tq));
      cu_k.push_back(static_cast<int32_t>(tk));
      max_q = std::max(max_q, c.len_q[n]);
      max_kv = std::max(max_kv, c.len_kv[n]);
    }
  } else {
    tq = static_cast<int64_t>(b) * c.s_q;
    tk = static_cast<int64_t>(b) * c.s_kv;
  }
  const size_t nq = static_cast<size_t>(tq) * c.h_q * c.d, nk = static_cast<size_t>(tk) * c.h_kv * c.d;
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  auto upload_random = [&](Dev& dv, size_t n) {
    std::vector<uint16_t> h(n);
    for (auto& x : h) x = to_half_bits(nd(rng), bf16);
    dv.alloc(n * 2);
    CK(cudaMemcpy(dv.p, h.data(), n * 2, cudaMemcpyHostToDevice));
  };
  Dev q, k, v, dout, out, lse, dq, dk, dv, sinks, dsinks, cuq, cuk, used, ws, bias, dbias;
  upload_random(q, nq);
  upload_random(k, nk);
  upload_random(v, nk);
  upload_random(dout, nq);
  out.alloc(nq * 2);
  dq.alloc(nq * 2);
  dk.alloc(nk * 2);
  dv.alloc(nk * 2);
  lse.alloc(static_cast<size_t>(tq) * c.h_q * 4);
  std::vector<float> hs(c.h_q);
  const float big = std::log(static_cast<float>(std::max(c.s_kv, max_kv)));  // sinks log(s_kv), 2, -1
  for (int h = 0; h < c.h_q; ++h) hs[h] = h % 3 == 0 ? big : h % 3 == 1 ? 2.f : -1.f;
  sinks.alloc(c.h_q * 4);
  dsinks.alloc(c.h_q * 4);
  CK(cudaMemcpy(sinks.p, hs.data(), c.h_q * 4, cudaMemcpyHostToDevice));

  sinkattn_params_t p;
  sinkattn_params_init(&p);
  auto t = [](void* ptr, sinkattn_dtype_t dt, std::vector<int64_t> shape) {
    return sinkattn_make_tensor(ptr, dt, static_cast<int32_t>(shape.size()), shape.data(), nullptr);
  };
  if (varlen) {
    p.q = t(q.p, c.dtype, {tq, c.h_q, c.d});
    p.k = t(k.p, c.dtype, {tk, c.h_kv, c.d});
    p.v = t(v.p, c.dtype, {tk, c.h_kv, c.d});
    p.out = t(out.p, c.dtype, {tq, c.h_q, c.d});
    p.d_out = t(dout.p, c.dtype, {tq, c.h_q, c.d});
    p.dq = t(dq.p, c.dtype, {tq, c.h_q, c.d});
    p.dk = t(dk.p, c.dtype, {tk, c.h_kv, c.d});
    p.dv = t(dv.p, c.dtype, {tk, c.h_kv, c.d});
    p.softmax_lse = t(lse.p, SINKATTN_F32, {c.h_q, tq});
    cuq.alloc(cu_q.size() * 4);
    cuk.alloc(cu_k.size() * 4);
    CK(cudaMemcpy(cuq.p, cu_q.data(), cu_q.size() * 4, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(cuk.p, cu_k.data(), cu_k.size() * 4, cudaMemcpyHostToDevice));
    p.cu_seqlens_q = t(cuq.p, SINKATTN_I32, {b + 1});
    p.cu_seqlens_kv = t(cuk.p, SINKATTN_I32, {b + 1});
    p.max_seqlen_q = max_q;
    p.max_seqlen_kv = max_kv;
    if (!c.used_kv.empty()) {
      used.alloc(c.used_kv.size() * 4);
      CK(cudaMemcpy(used.p, c.used_kv.data(), c.used_kv.size() * 4, cudaMemcpyHostToDevice));
      p.seqused_kv = t(used.p, SINKATTN_I32, {b});
    }
  } else {
    p.q = t(q.p, c.dtype, {b, c.s_q, c.h_q, c.d});
    p.k = t(k.p, c.dtype, {b, c.s_kv, c.h_kv, c.d});
    p.v = t(v.p, c.dtype, {b, c.s_kv, c.h_kv, c.d});
    p.out = t(out.p, c.dtype, {b, c.s_q, c.h_q, c.d});
    p.d_out = t(dout.p, c.dtype, {b, c.s_q, c.h_q, c.d});
    p.dq = t(dq.p, c.dtype, {b, c.s_q, c.h_q, c.d});
    p.dk = t(dk.p, c.dtype, {b, c.s_kv, c.h_kv, c.d});
    p.dv = t(dv.p, c.dtype, {b, c.s_kv, c.h_kv, c.d});
    p.softmax_lse = t(lse.p, SINKATTN_F32, {b, c.h_q, c.s_q});
    if (c.bias != 0) {
      const int64_t bb = c.bias == 2 ? b : 1, bh = c.bias == 2 ? c.h_q : 1;
      const size_t nbias = static_cast<size_t>(bb * bh) * c.s_q * c.s_kv;
      upload_random(bias, nbias);
      dbias.alloc(nbias * 2);
      p.bias = t(bias.p, c.dtype, {bb, bh, c.s_q, c.s_kv});
      p.d_bias = t(dbias.p, c.dtype, {bb, bh, c.s_q, c.s_kv});
    }
  }
  p.softmax_type = c.st;
  if (c.st == SINKATTN_SOFTMAX_LEARNABLE) {
    p.sinks = t(sinks.p, SINKATTN_F32, {c.h_q});
    p.d_sinks = t(dsinks.p, SINKATTN_F32, {c.h_q});
  }
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.mask_alignment = c.align;
  p.backend = SINKATTN_BACKEND_CUDA;

  size_t wf = 0, wb_det = 0, wb = 0;
  p.deterministic = 1;
  if (sinkattn_forward_workspace_size(&p, &wf) != SINKATTN_OK ||
      sinkattn_backward_workspace_size(&p, &wb_det) != SINKATTN_OK) {
    std::printf("FAIL %s: workspace query: %s\n", c.name, sinkattn_last_error());
    return 1;
  }
  p.deterministic = 0;
  if (sinkattn_backward_workspace_size(&p, &wb) != SINKATTN_OK) {
    std::printf("FAIL %s: workspace query: %s\n", c.name, sinkattn_last_error());
    return 1;
  }
  ws.alloc(std::max({wf, wb, wb_det}));
  p.workspace = ws.p;
  p.workspace_bytes = ws.bytes;
  std::printf("== %s: b %d, s_q %d, s_kv %d, h_q %d, h_kv %d, d %d, window (%lld, %lld) %s, %s%s\n", c.name, b,
              varlen ? max_q : c.s_q, varlen ? max_kv : c.s_kv, c.h_q, c.h_kv, c.d, static_cast<long long>(c.wl),
              static_cast<long long>(c.wr), c.align == SINKATTN_ALIGN_TOP_LEFT ? "top-left" : "bottom-right",
              bf16 ? "bf16" : "fp16", varlen ? ", varlen" : "");
  std::printf("  forward:  %s\n", cuda_line(p, false).c_str());
  out.poison();
  lse.poison();
  if (sinkattn_forward(&p) != SINKATTN_OK) {
    std::printf("FAIL %s: forward: %s\n", c.name, sinkattn_last_error());
    return 1;
  }
  CK(cudaDeviceSynchronize());

  std::vector<Dev*> grads = {&dq, &dk, &dv};
  std::vector<const char*> names = {"dq", "dk", "dv"};
  std::vector<bool> is_f32 = {false, false, false};
  if (c.st == SINKATTN_SOFTMAX_LEARNABLE) {
    grads.push_back(&dsinks);
    names.push_back("d_sinks");
    is_f32.push_back(true);
  }
  if (c.bias != 0) {
    grads.push_back(&dbias);
    names.push_back("d_bias");
    is_f32.push_back(false);
  }
  const int ngrad = static_cast<int>(grads.size());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto backward = [&](bool det, float* ms) -> bool {
    p.deterministic = det ? 1 : 0;
    ws.poison();
    for (int g = 0; g < ngrad; ++g) grads[g]->poison();
    CK(cudaEventRecord(e0));
    const sinkattn_status_t st = sinkattn_backward(&p);
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    if (st != SINKATTN_OK) {
      std::printf("FAIL %s: backward (deterministic = %d): %s\n", c.name, det ? 1 : 0, sinkattn_last_error());
      return false;
    }
    CK(cudaDeviceSynchronize());
    if (ms) CK(cudaEventElapsedTime(ms, e0, e1));
    return true;
  };
  int fails = 0;
  p.deterministic = 1;
  std::printf("  backward, deterministic = 1: %s\n", cuda_line(p, true).c_str());
  std::vector<std::vector<unsigned char>> first;
  std::vector<float> t_det;
  for (int r = 0; r < reps; ++r) {
    float ms = 0;
    if (!backward(true, &ms)) return 1;
    t_det.push_back(ms);
    std::vector<std::vector<unsigned char>> now;
    for (int g = 0; g < ngrad; ++g) now.push_back(grads[g]->host());
    if (r == 0) {
      first = now;
      continue;
    }
    for (int g = 0; g < ngrad; ++g)
      if (now[g] != first[g]) {
        std::printf("FAIL %s: %s of run %d differs bitwise from run 0 (deterministic = 1)\n", c.name, names[g], r);
        ++fails;
      }
  }
  // The backward captured into a CUDA graph (global capture mode: a synchronisation or allocation inside the call
  // would invalidate it; the kernels launched with programmatic dependent launch become programmatic edges) and
  // replayed twice on poisoned outputs and workspace: deterministic = 1 gives the direct calls' bits, 0 their values
  // within the same bound as below.
  for (const bool det : {true, false}) {
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    p.deterministic = det ? 1 : 0;
    p.stream = stream;
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const sinkattn_status_t st = sinkattn_backward(&p);
    const std::string msg = sinkattn_last_error();
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    p.stream = nullptr;
    if (st != SINKATTN_OK || ce != cudaSuccess) {
      std::printf("FAIL %s: backward (deterministic = %d) under graph capture: status %d %s, capture %s\n", c.name,
                  det ? 1 : 0, static_cast<int>(st), msg.c_str(), cudaGetErrorString(ce));
      ++fails;
    } else {
      cudaGraphExec_t exec;
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 2; ++rep) {
        ws.poison();
        for (int g = 0; g < ngrad; ++g) grads[g]->poison();
        CK(cudaDeviceSynchronize());  // the poisoning (legacy stream) before the replay on the non-blocking stream
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaStreamSynchronize(stream));
        for (int g = 0; g < ngrad; ++g) {
          const std::vector<unsigned char> now = grads[g]->host();
          const double r = det ? 0.0 : rel_diff(first[g], now, is_f32[g], bf16);
          if (det ? now != first[g] : (std::isnan(r) || r > 1e-2)) {
            std::printf("FAIL %s: %s of graph replay %d (deterministic = %d) differs from the direct call%s\n",
                        c.name, names[g], rep, det ? 1 : 0, det ? " bitwise" : "");
            ++fails;
          }
        }
      }
      CK(cudaGraphExecDestroy(exec));
      CK(cudaGraphDestroy(graph));
    }
    CK(cudaStreamDestroy(stream));
  }
  std::printf("  graph capture and replay of the backward (deterministic = 1 and 0): %s\n", fails ? "FAILED" : "ok");
  p.deterministic = 0;
  std::printf("  backward, deterministic = 0: %s\n", cuda_line(p, true).c_str());
  float t_nd = 0;
  if (!backward(false, &t_nd)) return 1;
  for (int g = 0; g < ngrad; ++g) {
    const double r = rel_diff(first[g], grads[g]->host(), is_f32[g], bf16);
    const bool ok = !std::isnan(r) && r <= 1e-2;
    std::printf("  %s: deterministic vs not, max |diff| / max |value| = %.3g%s\n", names[g], r, ok ? "" : "  FAIL");
    if (!ok) ++fails;
  }
  if (time_it) {
    std::vector<float> tn;
    for (int r = 0; r < 5; ++r) {
      float ms = 0;
      backward(false, &ms);
      tn.push_back(ms);
      backward(true, &ms);
      t_det.push_back(ms);
    }
    std::sort(tn.begin(), tn.end());
    std::sort(t_det.begin(), t_det.end());
    std::printf("  time: deterministic %.3f ms, not %.3f ms (median; speed ratio %.3f)\n", t_det[t_det.size() / 2],
                tn[tn.size() / 2], tn[tn.size() / 2] / t_det[t_det.size() / 2]);
  }
  std::printf("  %s: %d bitwise repeats, %s\n", c.name, reps, fails ? "FAILED" : "ok");
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return fails ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes (a log cut short by a timeout keeps them)
  int reps = 4;
  std::string only;
  bool time_it = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) reps = std::max(2, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc) only = argv[++i];
    else if (a == "--time") time_it = true;
    else {
      std::fprintf(stderr, "usage: %s [--reps N] [--only SUBSTRING] [--time]\n", argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("gpu_determinism on %s (compute capability %d.%d), %d deterministic runs per shape\n", prop.name,
              prop.major, prop.minor, reps);
  const auto BR = SINKATTN_ALIGN_BOTTOM_RIGHT, TL = SINKATTN_ALIGN_TOP_LEFT;
  const auto LRN = SINKATTN_SOFTMAX_LEARNABLE, OBO = SINKATTN_SOFTMAX_OFF_BY_ONE, VAN = SINKATTN_SOFTMAX_VANILLA;
  const std::vector<Case> cases = {
      {"gpt-oss-full", SINKATTN_BF16, 64, 8, 64, -1, 0, BR, LRN, 2, 4096, 4096, {}, {}, {}},
      {"gpt-oss-sliding", SINKATTN_BF16, 64, 8, 64, 127, 0, BR, LRN, 2, 4096, 4096, {}, {}, {}},
      {"mha-d128-causal", SINKATTN_BF16, 32, 32, 128, -1, 0, BR, VAN, 1, 4096, 4096, {}, {}, {}},
      {"mha-d128-full", SINKATTN_F16, 8, 8, 128, -1, -1, BR, OBO, 1, 1536, 1536, {}, {}, {}},
      {"gqa4-top-left", SINKATTN_F16, 8, 2, 64, -1, 0, TL, LRN, 2, 1000, 1700, {}, {}, {}},
      {"two-sided-window", SINKATTN_BF16, 4, 4, 128, 300, 200, BR, LRN, 1, 2000, 2000, {}, {}, {}},
      {"varlen-seqused", SINKATTN_BF16, 8, 2, 64, -1, 0, BR, LRN, 0, 0, 0, {1, 700, 1500, 333}, {5, 900, 1500, 20},
       {5, 850, 1400, 0}},
      {"varlen-window", SINKATTN_F16, 6, 3, 128, 200, 0, BR, LRN, 0, 0, 0, {1100, 64, 1290}, {1300, 64, 1290}, {}},
      {"gpt-oss-full-bias", SINKATTN_BF16, 64, 8, 64, -1, 0, BR, LRN, 1, 2048, 2048, {}, {}, {}, 1},
      {"mha-d128-bias-per-head", SINKATTN_F16, 8, 8, 128, 500, 0, BR, LRN, 2, 1500, 1500, {}, {}, {}, 2},
      // Head dim 256: the Hopper dK dV kernel that splits the head dim (64 keys a block, dq by atomics in turns).
      {"hd256-gqa-causal", SINKATTN_BF16, 16, 4, 256, -1, 0, BR, LRN, 1, 2048, 2048, {}, {}, {}},
      {"hd256-varlen-window", SINKATTN_F16, 4, 2, 256, 300, 0, BR, LRN, 0, 0, 0, {700, 64, 1100}, {900, 64, 1100}, {}},
  };
  int failed = 0, ran = 0;
  for (const Case& c : cases) {
    if (!only.empty() && std::string(c.name).find(only) == std::string::npos) continue;
    ++ran;
    failed += run_case(c, reps, time_it);
  }
  std::printf("SUMMARY determinism: %d shapes, %d failed\n", ran, failed);
  return failed ? 1 : 0;
}

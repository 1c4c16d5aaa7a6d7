// The CUDA backend called from several host threads at once, one stream each (a serving engine's streams, PyTorch's
// autograd threads, JAX's per-device dispatch): 8 threads run forward + backward pipelines (deterministic = 1, so that
// results are comparable bit for bit), on different inputs (each thread its own call: sm_80 and Hopper kernels, the
// tile-32 backward, the decode kernels with split-KV, the fp32 SIMT path) and on shared inputs (every thread reads the
// same device q, k, v, d_out and writes its own outputs), each with its own workspace, and every result must be
// bitwise equal to the same call run alone on the default stream. Between the calls each thread makes its own invalid
// call and must read its own message from sinkattn_last_error() (thread-local), and a valid call then clears it.
// Usage: sinkattn_gpu_concurrency [--cpu-only] [--threads N] [--iters N] (--cpu-only: host buffers and the CPU
// backend, the program's own logic without a GPU). Exit status 1 on failure; tools/gpu-check.sh runs it.
#include <cuda_runtime.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"
#include "sinkattn/sinkattn.h"

namespace {

bool g_cpu_only = false;
std::mutex g_log_mu;
std::atomic<int> g_failures{0};

void fail(const std::string& s) {
  std::lock_guard<std::mutex> lock(g_log_mu);
  std::printf("FAIL %s\n", s.c_str());
  ++g_failures;
}

uint16_t to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
uint16_t to_f16(float x) {  // finite, normal-range values only (the inputs here are N(0, 1))
  uint32_t u;
  std::memcpy(&u, &x, 4);
  const uint32_t sign = (u >> 16) & 0x8000u;
  const int e = static_cast<int>((u >> 23) & 0xff) - 127 + 15;
  if (e <= 0) return static_cast<uint16_t>(sign);
  const uint32_t m = u & 0x7fffffu, r = m + 0xfffu + ((m >> 13) & 1u);
  return static_cast<uint16_t>(sign | ((static_cast<uint32_t>(e) << 10) + (r >> 13)));
}

// A buffer in the memory the call runs in (device; host with --cpu-only).
struct Mem {
  void* p = nullptr;
  size_t bytes = 0;
  std::vector<unsigned char> host;  // --cpu-only
  Mem() = default;
  explicit Mem(size_t n) : bytes(std::max<size_t>(n, 16)) {
    if (g_cpu_only) {
      host.assign(bytes, 0xff);
      p = host.data();
    } else {
      CK(cudaMalloc(&p, bytes));
    }
  }
  Mem(const Mem&) = delete;
  Mem& operator=(const Mem&) = delete;
  ~Mem() {
    if (p && !g_cpu_only) cudaFree(p);
  }
  void upload(const void* src, size_t n) {
    if (g_cpu_only) std::memcpy(p, src, n);
    else CK(cudaMemcpy(p, src, n, cudaMemcpyHostToDevice));
  }
  void poison(cudaStream_t s) {
    if (g_cpu_only) std::memset(p, 0xff, bytes);
    else CK(cudaMemsetAsync(p, 0xff, bytes, s));
  }
  std::vector<unsigned char> download(cudaStream_t s) const {
    std::vector<unsigned char> out(bytes);
    if (g_cpu_only) {
      std::memcpy(out.data(), p, bytes);
    } else {
      CK(cudaMemcpyAsync(out.data(), p, bytes, cudaMemcpyDeviceToHost, s));
      CK(cudaStreamSynchronize(s));
    }
    return out;
  }
};

// One call's shape and options.
struct Shape {
  std::string name;
  sinkattn_dtype_t dt = SINKATTN_BF16;
  int64_t b = 1, s_q = 64, s_kv = 64, h_q = 4, h_kv = 2, d = 64;
  sinkattn_softmax_type_t st = SINKATTN_SOFTMAX_LEARNABLE;
  int64_t wl = -1, wr = 0;
  bool backward = true;
  int32_t num_splits = 0;
};

std::vector<Shape> shapes() {
  std::vector<Shape> v;
  v.push_back({"bf16-gqa-causal-d64", SINKATTN_BF16, 2, 128, 192, 8, 2, 64});
  v.push_back({"fp16-window-d128", SINKATTN_F16, 1, 96, 96, 4, 4, 128, SINKATTN_SOFTMAX_OFF_BY_ONE, 31, 0});
  v.push_back({"bf16-tile32-d8", SINKATTN_BF16, 1, 100, 100, 2, 1, 8});
  v.push_back({"fp32-simt-d64", SINKATTN_F32, 1, 40, 70, 2, 1, 64, SINKATTN_SOFTMAX_VANILLA});
  v.push_back({"bf16-decode-splits", SINKATTN_BF16, 4, 1, 1500, 64, 8, 64, SINKATTN_SOFTMAX_LEARNABLE, -1, -1, false, 0});
  v.push_back({"bf16-decode-16-splits", SINKATTN_BF16, 2, 1, 700, 16, 2, 64, SINKATTN_SOFTMAX_LEARNABLE, -1, -1, false, 16});
  v.push_back({"bf16-d256-causal", SINKATTN_BF16, 1, 70, 70, 2, 2, 256});
  v.push_back({"fp16-mqa-d96", SINKATTN_F16, 2, 33, 65, 4, 1, 96, SINKATTN_SOFTMAX_LEARNABLE, 10, 3});
  return v;
}

size_t esize(sinkattn_dtype_t t) { return t == SINKATTN_F32 ? 4 : 2; }

// The inputs of a call (in the call's memory) and how to build its params over a set of outputs.
struct Inputs {
  Shape s;
  Mem q, k, v, d_out, sinks;
  explicit Inputs(const Shape& sh)
      : s(sh), q(sh.b * sh.s_q * sh.h_q * sh.d * esize(sh.dt)), k(sh.b * sh.s_kv * sh.h_kv * sh.d * esize(sh.dt)),
        v(sh.b * sh.s_kv * sh.h_kv * sh.d * esize(sh.dt)), d_out(sh.b * sh.s_q * sh.h_q * sh.d * esize(sh.dt)),
        sinks(sh.h_q * 4) {
    std::mt19937_64 rng(std::hash<std::string>{}(sh.name));
    std::normal_distribution<float> nd(0.f, 1.f);
    for (Mem* m : {&q, &k, &v, &d_out}) {
      const size_t n = m->bytes / esize(sh.dt);
      std::vector<unsigned char> bytes(m->bytes);
      for (size_t i = 0; i < n; ++i) {
        const float x = nd(rng);
        if (sh.dt == SINKATTN_F32) std::memcpy(&bytes[4 * i], &x, 4);
        else {
          const uint16_t h = sh.dt == SINKATTN_BF16 ? to_bf16(x) : to_f16(x);
          std::memcpy(&bytes[2 * i], &h, 2);
        }
      }
      m->upload(bytes.data(), bytes.size());
    }
    std::vector<float> sk(static_cast<size_t>(sh.h_q));
    for (int64_t h = 0; h < sh.h_q; ++h) sk[h] = h == 0 ? std::log(static_cast<float>(sh.s_kv)) : h == 1 ? 20.f : nd(rng);
    sinks.upload(sk.data(), sk.size() * 4);
  }
};

struct Outputs {
  Mem out, lse, dq, dk, dv, ds;
  explicit Outputs(const Shape& s)
      : out(s.b * s.s_q * s.h_q * s.d * esize(s.dt)), lse(s.b * s.h_q * s.s_q * 4),
        dq(s.b * s.s_q * s.h_q * s.d * esize(s.dt)), dk(s.b * s.s_kv * s.h_kv * s.d * esize(s.dt)),
        dv(s.b * s.s_kv * s.h_kv * s.d * esize(s.dt)), ds(s.h_q * 4) {}
  std::vector<Mem*> all() { return {&out, &lse, &dq, &dk, &dv, &ds}; }
};

sinkattn_tensor_t t4(void* p, sinkattn_dtype_t dt, int64_t a, int64_t b, int64_t c, int64_t d) {
  const int64_t shape[4] = {a, b, c, d};
  return sinkattn_make_tensor(p, dt, 4, shape, nullptr);
}

sinkattn_params_t params(const Inputs& in, Outputs& o, cudaStream_t stream) {
  const Shape& s = in.s;
  sinkattn_params_t p;
  sinkattn_params_init(&p);
  p.q = t4(in.q.p, s.dt, s.b, s.s_q, s.h_q, s.d);
  p.k = t4(in.k.p, s.dt, s.b, s.s_kv, s.h_kv, s.d);
  p.v = t4(in.v.p, s.dt, s.b, s.s_kv, s.h_kv, s.d);
  p.out = t4(o.out.p, s.dt, s.b, s.s_q, s.h_q, s.d);
  const int64_t ls[3] = {s.b, s.h_q, s.s_q};
  p.softmax_lse = sinkattn_make_tensor(o.lse.p, SINKATTN_F32, 3, ls, nullptr);
  p.softmax_type = s.st;
  const int64_t hs[1] = {s.h_q};
  if (s.st == SINKATTN_SOFTMAX_LEARNABLE) {
    p.sinks = sinkattn_make_tensor(in.sinks.p, SINKATTN_F32, 1, hs, nullptr);
    p.d_sinks = sinkattn_make_tensor(o.ds.p, SINKATTN_F32, 1, hs, nullptr);
  }
  p.window_left = s.wl;
  p.window_right = s.wr;
  p.num_splits = s.num_splits;
  p.d_out = t4(in.d_out.p, s.dt, s.b, s.s_q, s.h_q, s.d);
  p.dq = t4(o.dq.p, s.dt, s.b, s.s_q, s.h_q, s.d);
  p.dk = t4(o.dk.p, s.dt, s.b, s.s_kv, s.h_kv, s.d);
  p.dv = t4(o.dv.p, s.dt, s.b, s.s_kv, s.h_kv, s.d);
  p.deterministic = 1;
  p.stream = stream;
  p.num_threads = 2;  // --cpu-only: the CPU split heuristic reads the thread count
  p.backend = g_cpu_only ? SINKATTN_BACKEND_CPU : SINKATTN_BACKEND_CUDA;
  return p;
}

// The pipeline into `o` on `stream`, with workspaces from `ws` (grown as needed); the bytes of every output.
std::vector<std::vector<unsigned char>> pipeline(const Inputs& in, Outputs& o, cudaStream_t stream,
                                                 std::unique_ptr<Mem>& ws, const std::string& who) {
  for (Mem* m : o.all()) m->poison(stream);
  sinkattn_params_t p = params(in, o, stream);
  for (bool backward : {false, true}) {
    if (backward && !in.s.backward) break;
    size_t bytes = 0;
    sinkattn_status_t st =
        backward ? sinkattn_backward_workspace_size(&p, &bytes) : sinkattn_forward_workspace_size(&p, &bytes);
    if (st == SINKATTN_OK) {
      if (!ws || ws->bytes < bytes) ws = std::make_unique<Mem>(bytes);
      ws->poison(stream);
      p.workspace = ws->p;
      p.workspace_bytes = ws->bytes;
      st = backward ? sinkattn_backward(&p) : sinkattn_forward(&p);
    }
    if (st != SINKATTN_OK) fail(who + ": " + (backward ? "backward" : "forward") + ": " + sinkattn_last_error());
    else if (std::strcmp(sinkattn_last_error(), "") != 0) fail(who + ": a successful call left a message");
  }
  std::vector<std::vector<unsigned char>> bytes;
  for (Mem* m : o.all()) bytes.push_back(m->download(stream));
  return bytes;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 8, iters = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--cpu-only") g_cpu_only = true;
    else if (a == "--threads" && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (a == "--iters" && i + 1 < argc) iters = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr, "usage: %s [--cpu-only] [--threads N] [--iters N]\n", argv[0]);
      return 2;
    }
  }
  if (g_cpu_only) {
    std::printf("sinkattn GPU concurrency test, --cpu-only (host buffers, the CPU backend)\n");
  } else {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("sinkattn GPU concurrency test on %s (sm_%d%d): %d threads x %d iterations, one stream each\n",
                prop.name, prop.major, prop.minor, threads, iters);
  }
  const std::vector<Shape> sh = shapes();
  std::vector<std::unique_ptr<Inputs>> inputs;
  for (const Shape& s : sh) inputs.push_back(std::make_unique<Inputs>(s));
  // Alone, on the default stream.
  std::vector<std::vector<std::vector<unsigned char>>> alone;
  {
    std::unique_ptr<Mem> ws;
    for (size_t j = 0; j < sh.size(); ++j) {
      Outputs o(sh[j]);
      alone.push_back(pipeline(*inputs[j], o, nullptr, ws, sh[j].name + " (alone)"));
    }
  }
  const size_t shared = 0;
  std::atomic<int> ready{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      cudaStream_t stream = nullptr;
      if (!g_cpu_only) CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
      const size_t mine = static_cast<size_t>(t) % sh.size();
      Outputs own(sh[mine]), sho(sh[shared]);
      std::unique_ptr<Mem> ws;
      ready.fetch_add(1);
      while (ready.load() < threads) std::this_thread::yield();
      for (int it = 0; it < iters; ++it) {
        const std::string who = "thread " + std::to_string(t) + " iteration " + std::to_string(it);
        if (pipeline(*inputs[mine], own, stream, ws, who + " " + sh[mine].name) != alone[mine])
          fail(who + ": " + sh[mine].name + " differs from the call run alone");
        if (pipeline(*inputs[shared], sho, stream, ws, who + " shared inputs") != alone[shared])
          fail(who + ": the shared-input call differs from the call run alone");
        sinkattn_params_t bad = params(*inputs[mine], own, stream);
        bad.num_splits = -(100 + 10 * t + it);
        const sinkattn_status_t st = sinkattn_forward(&bad);
        std::this_thread::yield();
        const std::string want = "num_splits: must be >= 0 (0 = the backend's heuristic, 1 = no split), got " +
                                 std::to_string(bad.num_splits);
        if (st != SINKATTN_ERR_INVALID_ARGUMENT || want != sinkattn_last_error())
          fail(who + ": sinkattn_last_error() is '" + sinkattn_last_error() + "', wanted '" + want + "'");
      }
      if (stream) CK(cudaStreamDestroy(stream));
    });
  for (auto& th : pool) th.join();
  std::printf("CONCURRENCY SUMMARY: %d threads x %d iterations over %zu calls (+ shared inputs): %d failed\n", threads,
              iters, sh.size(), g_failures.load());
  return g_failures.load() == 0 ? 0 : 1;
}

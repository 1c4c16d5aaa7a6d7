// The library called from several threads at once, as frameworks call it (data loaders, PyTorch's autograd engine
// running the backward on its own threads, JAX dispatching per device, a serving engine's many streams): 8 threads
// run forward + backward pipelines on the CPU backend,
//   - on different inputs (eight calls of different shapes, dtypes, batch kinds and options), and
//   - on shared inputs (every thread reads the same q, k, v, sinks, d_out and writes its own outputs),
// with the size query + run and the allocator entry points, and each result is bitwise equal to the same call run
// alone on one thread (the CPU backend is deterministic). Between the calls every thread makes its own invalid
// call and reads its own message from sinkattn_last_error() (thread-local: another thread's error or success never
// shows), and a valid call then clears it. Built into the ThreadSanitizer job of CI (tools/ci-sanitizers.sh), where
// a data race between the threads, or inside a call's OpenMP team, fails the run.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

constexpr int kThreads = 8;
constexpr int kIters = 3;

std::vector<Config> configs() {
  std::vector<Config> cs;
  Config c;
  c.d_lse = true;
  c.window_right = 0;
  c.num_threads = 2;
  cs.push_back(c);  // fp32 dense causal learnable, d_lse
  c = Config{};
  c.dtype = SINKATTN_BF16;
  c.h_q = 8, c.h_kv = 2, c.s_q = 40, c.s_kv = 40;
  c.window_left = 7, c.window_right = 0;
  c.num_threads = 2;
  cs.push_back(c);  // bf16 GQA sliding window
  c = Config{};
  c.dtype = SINKATTN_F16;
  c.batch = Batch::kVarlen;
  c.b = 3;
  c.seqlens_q = {5, 0, 17};
  c.seqlens_kv = {9, 3, 17};
  c.tail_q = 2, c.tail_kv = 3;
  c.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE;
  c.num_threads = 2;
  cs.push_back(c);  // fp16 varlen with rows outside the call
  c = Config{};
  c.bias = "BHSS";
  c.dropout_p = 0.2, c.seed = 7, c.offset = 3;
  c.num_threads = 2;
  cs.push_back(c);  // fp32 bias + dropout
  c = Config{};
  c.dtype = SINKATTN_BF16;
  c.batch = Batch::kPadded;
  c.seqlens_q = {16, 9};
  c.seqlens_kv = {12, 16};
  c.d = 64, c.d_v = 32;
  c.softmax_type = SINKATTN_SOFTMAX_VANILLA;
  c.num_threads = 2;
  cs.push_back(c);  // bf16 padded, d != d_v, vanilla
  c = Config{};
  c.layout = Layout::kPackedKV;
  c.s_q = 9, c.s_kv = 30;
  c.window_right = 0;
  c.num_threads = 1;
  cs.push_back(c);  // fp32 packed KV, s_q != s_kv, one OpenMP thread
  c = Config{};
  c.dtype = SINKATTN_BF16;
  c.b = 1, c.s_q = 3, c.s_kv = 300;
  c.alignment = SINKATTN_ALIGN_TOP_LEFT;
  c.window_right = 0;
  c.num_threads = 2;
  cs.push_back(c);  // bf16 top-left causal, long keys (several key tiles)
  c = Config{};
  c.batch = Batch::kVarlen;
  c.b = 2;
  c.seqlens_q = {11, 20};
  c.seqlens_kv = {30, 20};
  c.seqused_kv = {25, 0};
  c.d = c.d_v = 96;
  c.deterministic = 1;
  c.num_threads = 2;
  cs.push_back(c);  // fp32 varlen with seqused_kv (a sequence without keys), d = 96
  return cs;
}

// A deep copy of a tensor (its own storage, the same view).
HostTensor clone(const HostTensor& h) {
  if (!h.present()) return h;
  HostTensor c;
  c.storage = std::make_shared<Storage>(*h.storage);
  c.t = h.t;
  c.t.data = c.storage->bytes.data() + (static_cast<const unsigned char*>(h.t.data) - h.storage->bytes.data());
  return c;
}

// One thread's outputs of a pipeline, poisoned as the problem's were before its first call.
struct Outputs {
  HostTensor out, lse, rng, dq, dk, dv, ds, db;
  explicit Outputs(const Problem& pb)
      : out(clone(pb.out)), lse(clone(pb.lse)), rng(clone(pb.rng_state)), dq(clone(pb.dq)), dk(clone(pb.dk)),
        dv(clone(pb.dv)), ds(clone(pb.d_sinks)), db(clone(pb.d_bias)) {}
  std::vector<HostTensor*> all() { return {&out, &lse, &rng, &dq, &dk, &dv, &ds, &db}; }
};

// Forward, then the backward fed by it, into `o` (reset to `fresh` first). `alloc`: the allocator entry points.
// Returns the bytes of every output.
std::vector<std::vector<unsigned char>> pipeline(const Problem& pb, const Outputs& fresh, Outputs& o, bool alloc) {
  std::vector<HostTensor*> dst = o.all();
  const std::vector<HostTensor*> src = const_cast<Outputs&>(fresh).all();
  for (size_t i = 0; i < dst.size(); ++i)
    if (dst[i]->present()) dst[i]->storage->bytes = src[i]->storage->bytes;
  sinkattn_params_t p = pb.p;
  p.out = o.out.t;
  p.softmax_lse = o.lse.t;
  if (o.rng.present()) p.rng_state = o.rng.t;
  p.dq = o.dq.t;
  p.dk = o.dk.t;
  p.dv = o.dv.t;
  if (o.ds.present()) p.d_sinks = o.ds.t;
  if (o.db.present()) p.d_bias = o.db.t;
  for (bool backward : {false, true}) {
    sinkattn_status_t st;
    std::vector<unsigned char> ws;
    if (alloc) {
      struct A {
        static void* fn(size_t n, void* u) {
          auto* v = static_cast<std::vector<unsigned char>*>(u);
          v->assign(n, 0xff);
          return v->data();
        }
      };
      st = backward ? sinkattn_backward_alloc(&p, &A::fn, &ws, 0) : sinkattn_forward_alloc(&p, &A::fn, &ws, 0);
    } else {
      size_t bytes = 0;
      st = backward ? sinkattn_backward_workspace_size(&p, &bytes) : sinkattn_forward_workspace_size(&p, &bytes);
      if (st == SINKATTN_OK) {
        ws.assign(bytes + 1, 0xff);
        p.workspace = ws.data();
        p.workspace_bytes = bytes;
        st = backward ? sinkattn_backward(&p) : sinkattn_forward(&p);
      }
    }
    EXPECT_EQ(st, SINKATTN_OK) << (backward ? "backward: " : "forward: ") << sinkattn_last_error() << "\n"
                               << pb.cfg.describe();
    EXPECT_STREQ(sinkattn_last_error(), "");
  }
  std::vector<std::vector<unsigned char>> bytes;
  for (HostTensor* t : dst) bytes.push_back(t->present() ? t->bytes() : std::vector<unsigned char>{});
  return bytes;
}

TEST(Concurrency, EightThreadsForwardBackwardBitwiseAndOwnLastError) {
  const std::vector<Config> cs = configs();
  ASSERT_EQ(cs.size(), static_cast<size_t>(kThreads));
  std::vector<std::unique_ptr<Problem>> problems;
  std::vector<std::unique_ptr<Outputs>> fresh;
  for (const Config& c : cs) {
    problems.push_back(std::make_unique<Problem>(c));
    problems.back()->poison_forward_outputs();
    problems.back()->poison_backward_outputs();
    fresh.push_back(std::make_unique<Outputs>(*problems.back()));
  }
  // Alone, on this thread: the expected bytes (and each one judged against the float64 reference elsewhere: these
  // are the configurations of the other suites; here only sameness matters).
  std::vector<std::vector<std::vector<unsigned char>>> alone;
  for (int j = 0; j < kThreads; ++j) {
    Outputs o(*problems[j]);
    alone.push_back(pipeline(*problems[j], *fresh[j], o, false));
  }
  const int shared = 0;  // every thread also runs this problem on the same input tensors

  std::atomic<int> mismatches{0}, error_mixups{0};
  std::mutex report_mu;
  std::vector<std::string> reports;
  auto report = [&](const std::string& s) {
    std::lock_guard<std::mutex> lock(report_mu);
    reports.push_back(s);
  };
  std::atomic<int> ready{0};
  auto body = [&](int t) {
    ready.fetch_add(1);
    while (ready.load() < kThreads) std::this_thread::yield();  // start together
    const int mine = t;
    Outputs own(*problems[mine]), sh(*problems[shared]);
    for (int it = 0; it < kIters; ++it) {
      const bool alloc = (t + it) % 2 == 1;
      if (pipeline(*problems[mine], *fresh[mine], own, alloc) != alone[mine]) {
        mismatches.fetch_add(1);
        report("thread " + std::to_string(t) + " iteration " + std::to_string(it) + ": problem " +
               std::to_string(mine) + " differs from the single-threaded run");
      }
      if (pipeline(*problems[shared], *fresh[shared], sh, !alloc) != alone[shared]) {
        mismatches.fetch_add(1);
        report("thread " + std::to_string(t) + " iteration " + std::to_string(it) +
               ": shared-input problem differs from the single-threaded run");
      }
      // This thread's own error, read back while the other threads succeed and fail with theirs.
      sinkattn_params_t bad = problems[mine]->p;
      bad.num_splits = -(100 + 10 * t + it);
      size_t bytes = 0;
      const sinkattn_status_t st = it % 2 ? sinkattn_forward_workspace_size(&bad, &bytes) : sinkattn_forward(&bad);
      const std::string want = "num_splits: must be >= 0 (0 = the backend's heuristic, 1 = no split), got " +
                               std::to_string(bad.num_splits);
      std::this_thread::yield();
      const std::string got = sinkattn_last_error();
      if (st != SINKATTN_ERR_INVALID_ARGUMENT || got != want) {
        error_mixups.fetch_add(1);
        report("thread " + std::to_string(t) + ": last error '" + got + "', wanted '" + want + "'");
      }
    }
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(body, t);
  for (auto& th : threads) th.join();
  for (const auto& r : reports) ADD_FAILURE() << r;
  EXPECT_EQ(mismatches.load(), 0);
  EXPECT_EQ(error_mixups.load(), 0);
}

// The backend query and the size query from many threads at once (they build strings and read the backends'
// static descriptions): the same answer everywhere.
TEST(Concurrency, QueriesFromManyThreads) {
  Problem pb(Config{});
  char want[1024];
  sinkattn_backend_t chosen = SINKATTN_BACKEND_AUTO;
  ASSERT_EQ(sinkattn_query_backend(&pb.p, 1, &chosen, want, sizeof want), SINKATTN_OK);
  size_t want_bytes = 0;
  ASSERT_EQ(sinkattn_backward_workspace_size(&pb.p, &want_bytes), SINKATTN_OK);
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 20; ++i) {
        char r[1024];
        sinkattn_backend_t c = SINKATTN_BACKEND_AUTO;
        size_t bytes = 0;
        char desc[4096];
        sinkattn_backend_describe(SINKATTN_BACKEND_CPU, desc, sizeof desc);
        if (sinkattn_query_backend(&pb.p, 1, &c, r, sizeof r) != SINKATTN_OK || std::string(r) != want ||
            c != chosen || sinkattn_backward_workspace_size(&pb.p, &bytes) != SINKATTN_OK || bytes != want_bytes)
          bad.fetch_add(1);
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

}  // namespace
}  // namespace sinkattn::test

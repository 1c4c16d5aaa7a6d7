// Memory bounded by the keys a call reads (SPEC.md sections 1 and 4), on the CPU backend:
//   - a decode batch as a serving engine lays it out: b = 256 sequences of GPT-OSS-120B heads (64 query heads, 8 KV
//     heads, d = 64, bf16), a page table of 65,536 pages of 16 per sequence (room for 1,048,576 keys each) of which
//     the sequences use 1 to 256 keys. Entries past ceil(seqused_kv / page_size) are never read (SPEC.md section 1),
//     so the call's workspace and its peak resident memory must follow the keys used, not the table's capacity
//     (from the capacity the K / V panels alone would be 1.1 TB);
//   - a dense call whose seqlens_kv are far below s_kv (k and v of 2^20 rows per sequence, at most 300 used), and a
//     dense backward of the same kind;
//   - each gives, bit for bit, the answer of the same call on compact tensors (a page table of the pages used, a
//     k / v of the longest sequence's rows), which is judged against the float64 reference by SPEC.md section 5;
//   - the stated bounds: workspace <= 4 bytes x h_kv x (d + d_v) x sum_n (len_kv[n] + 16), + the split partials
//     4 x S x h_q x rows x (d_v + 9) bytes (S: the key splits, at most one per 64-key tile of the longest sequence
//     plus one); peak resident memory during the call (Linux's VmHWM, reset before the call) at most the workspace
//     + 64 MiB (per-thread tiles, the OpenMP pool);
//   - a workspace the allocator cannot give fails before anything is written, with a message that says how many
//     bytes the call needs and what they hold.
// The big buffers (page table, dense k / v) are anonymous mappings of which only the rows and entries a call may read
// are ever written: untouched pages cost no memory, so the resident figures measure the library alone.
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "reference.hpp"
#include "sinkattn/sinkattn.h"

namespace {

namespace ref = sinkattn::ref;

constexpr int64_t kMiB = int64_t{1} << 20;

// An anonymous private mapping: zero pages that cost no memory until written.
struct Mapping {
  void* ptr = nullptr;
  size_t bytes = 0;
  explicit Mapping(size_t n) : bytes(n) {
    ptr = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ptr == MAP_FAILED) ptr = nullptr;
  }
  ~Mapping() {
    if (ptr) munmap(ptr, bytes);
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
};

// Linux's resident-set figures of this process (/proc/self/status, kB -> bytes); -1 when not readable.
int64_t status_bytes(const char* key) {
  std::ifstream f("/proc/self/status");
  std::string line;
  const std::string k = std::string(key) + ":";
  while (std::getline(f, line))
    if (line.compare(0, k.size(), k) == 0) return std::atoll(line.c_str() + k.size()) * 1024;
  return -1;
}
// Resets VmHWM (the peak resident set) to the current resident set: "5" into /proc/self/clear_refs (Linux 4.0+).
bool reset_peak_rss() {
  std::ofstream f("/proc/self/clear_refs");
  if (!f) return false;
  f << "5";
  f.close();
  return !f.fail();
}

// The library's workspace through sinkattn_forward_alloc / sinkattn_backward_alloc from malloc (NaN-filled), with
// the bytes asked for recorded.
struct Allocator {
  size_t asked = 0;
  void* mem = nullptr;
  bool refuse = false;
  ~Allocator() { std::free(mem); }
  static void* alloc(size_t bytes, void* user) {
    auto* a = static_cast<Allocator*>(user);
    a->asked = bytes;
    if (a->refuse) return nullptr;
    std::free(a->mem);
    a->mem = std::malloc(bytes);
    if (a->mem) std::memset(a->mem, 0xff, bytes);
    return a->mem;
  }
};

// One call's run with its peak resident growth (bytes over the resident set before it; -1 when not measurable).
struct Measured {
  sinkattn_status_t status = SINKATTN_OK;
  size_t workspace = 0;
  int64_t peak_growth = -1;
};
Measured run_measured(const sinkattn_params_t& p, bool backward) {
  Measured m;
  Allocator a;
  const bool can = reset_peak_rss();
  const int64_t before = status_bytes("VmRSS");
  m.status = backward ? sinkattn_backward_alloc(&p, &Allocator::alloc, &a, 0)
                      : sinkattn_forward_alloc(&p, &Allocator::alloc, &a, 0);
  const int64_t peak = status_bytes("VmHWM");
  m.workspace = a.asked;
  if (can && before >= 0 && peak >= 0) m.peak_growth = std::max<int64_t>(peak - before, 0);
  return m;
}

sinkattn_tensor_t tensor(void* data, sinkattn_dtype_t dt, std::vector<int64_t> shape) {
  return sinkattn_make_tensor(data, dt, static_cast<int32_t>(shape.size()), shape.data(), nullptr);
}

uint16_t bf16(double x) { return ref::double_to_bf16(x); }
constexpr uint16_t kBf16NaN = 0x7fc0;

std::vector<uint16_t> random_bf16(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<double> nd(0.0, 1.0);
  std::vector<uint16_t> v(n);
  for (auto& x : v) x = bf16(nd(rng));
  return v;
}

// Sinks of SPEC.md section 5's advice: log(s_kv), 20, then moderate values.
std::vector<float> test_sinks(int64_t h_q, double longest, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 3.0);
  std::vector<float> s(static_cast<size_t>(h_q));
  for (int64_t h = 0; h < h_q; ++h) s[h] = static_cast<float>(h == 0 ? std::log(longest) : h == 1 ? 20.0 : u(rng));
  return s;
}

// round_up8(l) + 8 <= l + 15: the panels' slots per sequence, bounded.
int64_t panel_bound(const std::vector<int32_t>& len, int64_t h_kv, int64_t d, int64_t d_v) {
  int64_t slots = 0;
  for (int32_t l : len) slots += l + 16;
  return 4 * h_kv * (d + d_v) * slots;
}
int64_t partials_bound(int64_t splits, int64_t h_q, int64_t rows, int64_t d_v) {
  return splits > 1 ? 4 * splits * h_q * rows * (d_v + 9) + 64 : 0;
}

bool same_bytes(const void* a, const void* b, size_t n) { return std::memcmp(a, b, n) == 0; }

void expect_spec5(const sinkattn_params_t& p, bool backward, const ref::Result& act) {
  const ref::References refs = ref::references(p, backward, backward ? ref::DFrom::kGivenOut : ref::DFrom::kOwnOut);
  for (const auto& row : ref::error_table(act, refs, p.q.dtype))
    EXPECT_TRUE(row.pass) << row.name << ": err " << row.err << " > tolerance " << row.tolerance << " (plain "
                          << row.lowp_err << ")";
}

// ---------------------------------------------------------------- the decode batch over a large page table
struct DecodeBatch {
  static constexpr int64_t b = 256, h_q = 64, h_kv = 8, d = 64, page_size = 16, max_pages = 65536;
  std::vector<int32_t> seqused;
  int64_t num_pages = 0, compact_pages = 0;
  std::vector<uint16_t> k_pool, v_pool, q;
  std::vector<float> sinks;
  std::vector<int32_t> compact;  // [b, compact_pages]
  Mapping big{static_cast<size_t>(b * max_pages) * sizeof(int32_t)};  // [b, max_pages]
  std::vector<uint16_t> out_big, out_compact;
  std::vector<float> lse_big, lse_compact;

  DecodeBatch() {
    std::mt19937_64 rng(39);
    seqused.resize(b);
    for (int64_t n = 0; n < b; ++n) seqused[n] = 1 + static_cast<int32_t>(rng() % 256);
    seqused[0] = 1;
    seqused[1] = 256;
    seqused[2] = 17;  // ends one key into its second page
    std::vector<int64_t> pages(b);
    for (int64_t n = 0; n < b; ++n) pages[n] = (seqused[n] + page_size - 1) / page_size;
    const int64_t used_pages = std::accumulate(pages.begin(), pages.end(), int64_t{0});
    num_pages = used_pages + 5;  // five pages no sequence reads (NaN)
    compact_pages = 256 / page_size + 2;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const size_t row = static_cast<size_t>(h_kv * d);
    k_pool.assign(static_cast<size_t>(num_pages * page_size) * row, kBf16NaN);
    v_pool.assign(k_pool.size(), kBf16NaN);
    compact.assign(static_cast<size_t>(b * compact_pages), -1);
    int32_t* table = big.as<int32_t>();
    const int32_t garbage[] = {-1, 2147483647, static_cast<int32_t>(num_pages), -2147483647};
    std::normal_distribution<double> nd(0.0, 1.0);
    size_t next = 0;
    for (int64_t n = 0; n < b; ++n) {
      for (int64_t pg = 0; pg < pages[n]; ++pg) {
        const int32_t page = perm[next++];
        table[n * max_pages + pg] = page;
        compact[n * compact_pages + pg] = page;
        for (int64_t r = 0; r < page_size && pg * page_size + r < seqused[n]; ++r)
          for (size_t x = 0; x < row; ++x) {
            k_pool[(page * page_size + r) * row + x] = bf16(nd(rng));
            v_pool[(page * page_size + r) * row + x] = bf16(nd(rng));
          }
      }
      // garbage in the two entries after the last page used (never read); the rest of the row is never touched
      for (int64_t pg = pages[n]; pg < pages[n] + 2; ++pg) {
        table[n * max_pages + pg] = garbage[(n + pg) % 4];
        compact[n * compact_pages + pg] = garbage[(n + pg + 1) % 4];
      }
    }
    q = random_bf16(static_cast<size_t>(b * h_q * d), rng);
    sinks = test_sinks(h_q, 256, rng);
    out_big.resize(q.size());
    out_compact.resize(q.size());
    lse_big.resize(static_cast<size_t>(b * h_q));
    lse_compact.resize(lse_big.size());
  }

  sinkattn_params_t params(bool big_table, int32_t num_splits) {
    sinkattn_params_t p;
    sinkattn_params_init(&p);
    p.q = tensor(q.data(), SINKATTN_BF16, {b, 1, h_q, d});
    p.k = tensor(k_pool.data(), SINKATTN_BF16, {num_pages, page_size, h_kv, d});
    p.v = tensor(v_pool.data(), SINKATTN_BF16, {num_pages, page_size, h_kv, d});
    p.page_table = big_table ? tensor(big.ptr, SINKATTN_I32, {b, max_pages})
                             : tensor(compact.data(), SINKATTN_I32, {b, compact_pages});
    p.seqused_kv = tensor(seqused.data(), SINKATTN_I32, {b});
    p.sinks = tensor(sinks.data(), SINKATTN_F32, {h_q});
    p.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
    p.out = tensor(big_table ? out_big.data() : out_compact.data(), SINKATTN_BF16, {b, 1, h_q, d});
    p.softmax_lse = tensor(big_table ? lse_big.data() : lse_compact.data(), SINKATTN_F32, {b, h_q, 1});
    p.num_splits = num_splits;
    p.backend = SINKATTN_BACKEND_CPU;
    return p;
  }
  void poison() {
    std::fill(out_big.begin(), out_big.end(), kBf16NaN);
    std::fill(out_compact.begin(), out_compact.end(), kBf16NaN);
    std::fill(lse_big.begin(), lse_big.end(), NAN);
    std::fill(lse_compact.begin(), lse_compact.end(), NAN);
  }
};

TEST(MemoryBound, DecodeBatchOverLargePageTable) {
  DecodeBatch t;
  ASSERT_NE(t.big.ptr, nullptr);
  using B = DecodeBatch;
  const int64_t longest_tiles = (256 + 63) / 64;
  for (int32_t splits : {0, 1, 3, 128}) {
    SCOPED_TRACE("num_splits = " + std::to_string(splits));
    t.poison();
    const sinkattn_params_t big = t.params(true, splits), compact = t.params(false, splits);
    size_t ws_big = 0, ws_compact = 0;
    ASSERT_EQ(sinkattn_forward_workspace_size(&big, &ws_big), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(sinkattn_forward_workspace_size(&compact, &ws_compact), SINKATTN_OK) << sinkattn_last_error();
    // The workspace follows the keys used: the same as the compact table's, within the stated bound.
    EXPECT_EQ(ws_big, ws_compact);
    const int64_t s_max = splits == 0 ? 1 : std::min<int64_t>(splits, longest_tiles + 1);
    const int64_t bound = panel_bound(t.seqused, B::h_kv, B::d, B::d) + partials_bound(s_max, B::h_q, B::b, B::d);
    EXPECT_LE(static_cast<int64_t>(ws_big), bound);

    const Measured m = run_measured(big, false);
    ASSERT_EQ(m.status, SINKATTN_OK) << sinkattn_last_error();
    EXPECT_EQ(m.workspace, ws_big);
    if (m.peak_growth >= 0) {
      EXPECT_LE(m.peak_growth, static_cast<int64_t>(ws_big) + 64 * kMiB);
      std::printf("[ memory  ] decode b=256, 65536 pages x 16 per sequence, num_splits=%d: workspace %.1f MiB "
                  "(bound %.1f MiB), peak resident growth %.1f MiB\n",
                  splits, ws_big / double(kMiB), bound / double(kMiB), m.peak_growth / double(kMiB));
    }
    ASSERT_EQ(run_measured(compact, false).status, SINKATTN_OK) << sinkattn_last_error();
    EXPECT_TRUE(same_bytes(t.out_big.data(), t.out_compact.data(), t.out_big.size() * 2));
    EXPECT_TRUE(same_bytes(t.lse_big.data(), t.lse_compact.data(), t.lse_big.size() * 4));
    if (splits == 0) {  // the compact call (hence both) against the float64 reference
      ref::Result act;
      act.out = ref::read_tensor(compact.out);
      act.softmax_lse = ref::read_tensor(compact.softmax_lse);
      expect_spec5(compact, false, act);
    }
  }
  // A shape-only size query cannot read seqused_kv: it gets the bound from the table's capacity (documented in
  // sinkattn.h), at least the panels of 1,048,576 keys per sequence.
  sinkattn_params_t shape_only = t.params(true, 1);
  for (sinkattn_tensor_t* x : {&shape_only.q, &shape_only.k, &shape_only.v, &shape_only.page_table,
                               &shape_only.seqused_kv, &shape_only.sinks, &shape_only.out, &shape_only.softmax_lse})
    x->data = nullptr;
  size_t bound_bytes = 0;
  ASSERT_EQ(sinkattn_forward_workspace_size(&shape_only, &bound_bytes), SINKATTN_OK) << sinkattn_last_error();
  EXPECT_GE(static_cast<double>(bound_bytes), 4.0 * B::h_kv * 2 * B::d * B::b * B::max_pages * B::page_size);
}

TEST(MemoryBound, WorkspaceTheAllocatorCannotGiveSaysHowMuchAndWhy) {
  DecodeBatch t;
  ASSERT_NE(t.big.ptr, nullptr);
  t.poison();
  const sinkattn_params_t p = t.params(true, 1);
  size_t need = 0;
  ASSERT_EQ(sinkattn_forward_workspace_size(&p, &need), SINKATTN_OK);
  Allocator a;
  a.refuse = true;
  ASSERT_EQ(sinkattn_forward_alloc(&p, &Allocator::alloc, &a, 0), SINKATTN_ERR_WORKSPACE_TOO_SMALL);
  const std::string msg = sinkattn_last_error();
  EXPECT_EQ(a.asked, need);
  EXPECT_NE(msg.find("allocator returned NULL"), std::string::npos) << msg;
  EXPECT_NE(msg.find(std::to_string(need) + " bytes"), std::string::npos) << msg;
  EXPECT_NE(msg.find("GiB"), std::string::npos) << msg;
  EXPECT_NE(msg.find("key slots x 8 KV heads"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the keys each sequence reads"), std::string::npos) << msg;
  for (uint16_t x : t.out_big) ASSERT_EQ(x, kBf16NaN) << "an output was written by a refused call";
  // The same from a run given too small a workspace.
  sinkattn_params_t small = p;
  std::vector<unsigned char> ws(16);
  small.workspace = ws.data();
  small.workspace_bytes = ws.size();
  ASSERT_EQ(sinkattn_forward(&small), SINKATTN_ERR_WORKSPACE_TOO_SMALL);
  const std::string msg2 = sinkattn_last_error();
  EXPECT_NE(msg2.find("needs " + std::to_string(need) + " bytes"), std::string::npos) << msg2;
  EXPECT_NE(msg2.find("K^T and V panels"), std::string::npos) << msg2;
}

// ---------------------------------------------------------------- dense calls with seqlens_kv far below s_kv
struct DenseCall {
  int64_t b, s_kv, s_q, h_q, h_kv, d;
  sinkattn_dtype_t dtype;
  std::vector<int32_t> seqlens;
  int64_t longest = 0;
  size_t es;
  Mapping k_big, v_big;
  std::vector<unsigned char> k_small, v_small, q, d_out;
  std::vector<float> sinks;

  DenseCall(int64_t b_, int64_t s_kv_, int64_t s_q_, int64_t h_q_, int64_t h_kv_, int64_t d_, sinkattn_dtype_t dt,
            std::vector<int32_t> lens)
      : b(b_), s_kv(s_kv_), s_q(s_q_), h_q(h_q_), h_kv(h_kv_), d(d_), dtype(dt), seqlens(std::move(lens)),
        es(sinkattn_dtype_size(dt)),
        k_big(static_cast<size_t>(b_ * s_kv_ * h_kv_ * d_) * sinkattn_dtype_size(dt)),
        v_big(k_big.bytes) {
    for (int32_t l : seqlens) longest = std::max<int64_t>(longest, l);
    std::mt19937_64 rng(390);
    std::normal_distribution<double> nd(0.0, 1.0);
    k_small.resize(static_cast<size_t>(b * longest * h_kv * d) * es);
    v_small.resize(k_small.size());
    const auto put = [&](void* base, size_t idx, double x) {
      if (dtype == SINKATTN_F32) {
        const float f = static_cast<float>(x);
        std::memcpy(static_cast<char*>(base) + idx * 4, &f, 4);
      } else {
        const uint16_t h = dtype == SINKATTN_BF16 ? bf16(x) : ref::double_to_half(x);
        std::memcpy(static_cast<char*>(base) + idx * 2, &h, 2);
      }
    };
    const size_t row = static_cast<size_t>(h_kv * d);
    for (int64_t n = 0; n < b; ++n)
      for (int64_t j = 0; j < longest; ++j)
        for (size_t x = 0; x < row; ++x) {
          // keys past the sequence's length are NaN in both layouts (masked: must reach nothing); in the big
          // tensors only the rows up to the longest sequence are ever written
          const double kv = j < seqlens[n] ? nd(rng) : NAN, vv = j < seqlens[n] ? nd(rng) : NAN;
          put(k_small.data(), (n * longest + j) * row + x, kv);
          put(v_small.data(), (n * longest + j) * row + x, vv);
          put(k_big.ptr, (n * s_kv + j) * row + x, kv);
          put(v_big.ptr, (n * s_kv + j) * row + x, vv);
        }
    q.resize(static_cast<size_t>(b * s_q * h_q * d) * es);
    d_out.resize(q.size());
    for (size_t x = 0; x < q.size() / es; ++x) {
      put(q.data(), x, nd(rng));
      put(d_out.data(), x, nd(rng));
    }
    sinks = test_sinks(h_q, static_cast<double>(longest), rng);
  }

  struct Outs {
    std::vector<unsigned char> out, dq, dk, dv;
    std::vector<float> lse, d_sinks;
  };
  // The call on the big (s_kv rows) or the compact (longest rows) k / v; backward: dk / dv of the same rows.
  sinkattn_params_t params(bool big, Outs& o, bool backward) {
    const int64_t rows = big ? s_kv : longest;
    o.out.assign(q.size(), 0xff);
    o.lse.assign(static_cast<size_t>(b * h_q * s_q), NAN);
    sinkattn_params_t p;
    sinkattn_params_init(&p);
    p.q = tensor(q.data(), dtype, {b, s_q, h_q, d});
    p.k = tensor(big ? k_big.ptr : k_small.data(), dtype, {b, rows, h_kv, d});
    p.v = tensor(big ? v_big.ptr : v_small.data(), dtype, {b, rows, h_kv, d});
    p.seqlens_kv = tensor(seqlens.data(), SINKATTN_I32, {b});
    p.sinks = tensor(sinks.data(), SINKATTN_F32, {h_q});
    p.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
    p.window_right = 0;  // causal, bottom-right: each query row sees its sequence's keys up to its position
    p.out = tensor(o.out.data(), dtype, {b, s_q, h_q, d});
    p.softmax_lse = tensor(o.lse.data(), SINKATTN_F32, {b, h_q, s_q});
    p.backend = SINKATTN_BACKEND_CPU;
    if (backward) {
      o.dq.assign(q.size(), 0xff);
      o.dk.assign(static_cast<size_t>(b * rows * h_kv * d) * es, 0xff);
      o.dv.assign(o.dk.size(), 0xff);
      o.d_sinks.assign(static_cast<size_t>(h_q), NAN);
      p.d_out = tensor(d_out.data(), dtype, {b, s_q, h_q, d});
      p.dq = tensor(o.dq.data(), dtype, {b, s_q, h_q, d});
      p.dk = tensor(o.dk.data(), dtype, {b, rows, h_kv, d});
      p.dv = tensor(o.dv.data(), dtype, {b, rows, h_kv, d});
      p.d_sinks = tensor(o.d_sinks.data(), SINKATTN_F32, {h_q});
    }
    return p;
  }
};

TEST(MemoryBound, DenseForwardWithSeqlensKvFarBelowSkv) {
  // k and v of 2^20 rows per sequence (1 GiB each, never touched past the rows used), at most 300 keys used
  DenseCall t(4, int64_t{1} << 20, 2, 8, 2, 64, SINKATTN_BF16, {0, 100, 257, 300});
  ASSERT_NE(t.k_big.ptr, nullptr);
  ASSERT_NE(t.v_big.ptr, nullptr);
  for (int32_t splits : {0, 1, 4}) {
    SCOPED_TRACE("num_splits = " + std::to_string(splits));
    DenseCall::Outs ob, oc;
    sinkattn_params_t big = t.params(true, ob, false), compact = t.params(false, oc, false);
    big.num_splits = compact.num_splits = splits;
    big.num_threads = compact.num_threads = 2;  // the split heuristic reads the thread count
    size_t ws_big = 0, ws_compact = 0;
    ASSERT_EQ(sinkattn_forward_workspace_size(&big, &ws_big), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(sinkattn_forward_workspace_size(&compact, &ws_compact), SINKATTN_OK) << sinkattn_last_error();
    const int64_t s_max = splits == 0 ? 1 : std::min<int64_t>(splits, (300 + 63) / 64 + 1);
    const int64_t bound = panel_bound(t.seqlens, t.h_kv, t.d, t.d) + partials_bound(s_max, t.h_q, t.b * t.s_q, t.d);
    EXPECT_LE(static_cast<int64_t>(ws_big), bound);
    EXPECT_EQ(ws_big, ws_compact);
    const Measured m = run_measured(big, false);
    ASSERT_EQ(m.status, SINKATTN_OK) << sinkattn_last_error();
    EXPECT_EQ(m.workspace, ws_big);
    if (m.peak_growth >= 0) {
      EXPECT_LE(m.peak_growth, static_cast<int64_t>(ws_big) + 64 * kMiB);
      std::printf("[ memory  ] dense s_kv=2^20, seqlens_kv <= 300, num_splits=%d: workspace %.2f MiB (bound %.2f MiB), "
                  "peak resident growth %.1f MiB\n",
                  splits, ws_big / double(kMiB), bound / double(kMiB), m.peak_growth / double(kMiB));
    }
    ASSERT_EQ(run_measured(compact, false).status, SINKATTN_OK) << sinkattn_last_error();
    EXPECT_EQ(ob.out, oc.out);
    EXPECT_TRUE(same_bytes(ob.lse.data(), oc.lse.data(), ob.lse.size() * 4));
    if (splits == 0) {
      ref::Result act;
      act.out = ref::read_tensor(compact.out);
      act.softmax_lse = ref::read_tensor(compact.softmax_lse);
      expect_spec5(compact, false, act);
    }
  }
}

TEST(MemoryBound, DenseBackwardWithSeqlensKvFarBelowSkv) {
  // dk and dv are outputs of s_kv rows (written: keys past seqlens_kv get 0), so s_kv stays moderate here; the
  // workspace must still follow the keys used.
  DenseCall t(3, 1 << 14, 70, 4, 2, 32, SINKATTN_F32, {50, 0, 130});
  DenseCall::Outs ob, oc;
  sinkattn_params_t big = t.params(true, ob, true), compact = t.params(false, oc, true);
  ASSERT_EQ(run_measured(big, false).status, SINKATTN_OK) << sinkattn_last_error();
  ASSERT_EQ(run_measured(compact, false).status, SINKATTN_OK) << sinkattn_last_error();
  size_t ws_big = 0, ws_compact = 0;
  ASSERT_EQ(sinkattn_backward_workspace_size(&big, &ws_big), SINKATTN_OK) << sinkattn_last_error();
  ASSERT_EQ(sinkattn_backward_workspace_size(&compact, &ws_compact), SINKATTN_OK) << sinkattn_last_error();
  EXPECT_EQ(ws_big, ws_compact);
  // D, q and d_out copies (one row each per query row and head) and the K^T, K, V^T panels of the keys used
  const int64_t rows = t.b * t.s_q * t.h_q;
  EXPECT_LE(static_cast<int64_t>(ws_big), 4 * rows * (1 + 2 * t.d + 1) + 3 * panel_bound(t.seqlens, t.h_kv, t.d, 0) +
                                              8 * 64);
  const Measured m = run_measured(big, true);
  ASSERT_EQ(m.status, SINKATTN_OK) << sinkattn_last_error();
  EXPECT_EQ(m.workspace, ws_big);
  ASSERT_EQ(run_measured(compact, true).status, SINKATTN_OK) << sinkattn_last_error();
  EXPECT_EQ(ob.dq, oc.dq);
  EXPECT_TRUE(same_bytes(ob.d_sinks.data(), oc.d_sinks.data(), ob.d_sinks.size() * 4));
  // dk / dv: the compact call's rows, then exact zeros for the keys no sequence uses
  const size_t row = static_cast<size_t>(t.h_kv * t.d) * t.es;
  for (int64_t n = 0; n < t.b; ++n)
    for (int64_t j = 0; j < t.s_kv; j += (j < t.longest ? 1 : 997)) {
      const size_t at_big = static_cast<size_t>(n * t.s_kv + j) * row;
      if (j < t.longest) {
        const size_t at_small = static_cast<size_t>(n * t.longest + j) * row;
        ASSERT_TRUE(same_bytes(&ob.dk[at_big], &oc.dk[at_small], row)) << "dk n=" << n << " j=" << j;
        ASSERT_TRUE(same_bytes(&ob.dv[at_big], &oc.dv[at_small], row)) << "dv n=" << n << " j=" << j;
      } else {
        for (size_t x = 0; x < row; ++x) ASSERT_EQ(ob.dk[at_big + x] | ob.dv[at_big + x], 0) << "n=" << n << " j=" << j;
      }
    }
  ref::Result act;
  act.out = ref::read_tensor(compact.out);
  act.softmax_lse = ref::read_tensor(compact.softmax_lse);
  act.dq = ref::read_tensor(compact.dq);
  act.dk = ref::read_tensor(compact.dk);
  act.dv = ref::read_tensor(compact.dv);
  act.d_sinks = ref::read_tensor(compact.d_sinks);
  expect_spec5(compact, true, act);
}

}  // namespace

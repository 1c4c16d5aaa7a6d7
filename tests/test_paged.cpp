// Paged KV and split-KV (SPEC.md sections 1, 2 and 4) on the CPU backend, against the float64 reference (which
// reads the page pools itself, tests/reference) with SPEC.md section 5 tolerances:
//   - paged == dense on the same keys, bit for bit (the CPU backend converts the same rows in the same order),
//     with pages shuffled in the pool and shared between sequences (a common prefix), page sizes 1 .. 256, ragged
//     lengths, empty sequences, lengths that end mid-page, dense and varlen queries, GQA, windows, both alignments;
//   - every pool slot no sequence reads is NaN, every page-table entry past a sequence's last page is garbage
//     (negative or far out of range): neither may reach an output;
//   - split-KV (num_splits) against no split and the reference for every split count, including more splits than
//     key tiles (the split that carries the sink is then empty) and sequences without keys;
//   - the sink counted exactly once: the judge used here rejects a result with the sink counted twice or not at all
//     (planted into a correct result), so a backend that did either would fail these tests;
//   - windows whose edges fall on page edges;
//   - validation of every paged argument (status, message naming the argument, nothing written).
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "paged_layout.hpp"
#include "test_util.hpp"

namespace sinkattn::test {
namespace {

struct PagedConfig {
  std::vector<int32_t> seqused;   // keys per sequence (b = its size)
  std::vector<int32_t> len_q;     // varlen query lengths (empty: dense queries of s_q rows)
  int64_t s_q = 1;
  int64_t h_q = 8, h_kv = 2, d = 32, d_v = 32;
  int64_t page_size = 16;
  int64_t extra_pages = 3;        // unreferenced pool pages (NaN)
  int64_t extra_table = 2;        // page-table columns past the longest sequence (garbage)
  bool share_prefix = false;      // sequence 1 starts with sequence 0's first pages
  sinkattn_dtype_t dtype = SINKATTN_F32;
  sinkattn_softmax_type_t softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  std::vector<double> sinks;      // empty: head 0 log(max len), head 1 20, others uniform [-1, 3]
  int64_t window_left = -1, window_right = -1;
  sinkattn_mask_alignment_t alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
  int32_t num_splits = 1;
  uint64_t seed = 1;

  int64_t b() const { return static_cast<int64_t>(seqused.size()); }
  bool varlen() const { return !len_q.empty(); }
  std::string describe() const {
    std::ostringstream s;
    s << "b=" << b() << (varlen() ? " varlen" : " dense") << " s_q=" << s_q << " h=" << h_q << "/" << h_kv
      << " d=" << d << "/" << d_v << " " << dtype_name(dtype) << " " << softmax_name(softmax_type)
      << " page_size=" << page_size << " window=[" << window_left << "," << window_right << "] "
      << (alignment == SINKATTN_ALIGN_BOTTOM_RIGHT ? "bottom_right" : "top_left") << " num_splits=" << num_splits
      << (share_prefix ? " shared-prefix" : "") << " seqused=";
    for (size_t n = 0; n < seqused.size(); ++n) s << (n ? "," : "") << seqused[n];
    return s.str();
  }
};

// A paged call (page pools, page table, seqused_kv) and its dense twin (the same keys gathered into a padded
// dense k / v with seqlens_kv, or packed varlen k / v with cu_seqlens_kv for varlen queries).
class PagedProblem {
 public:
  PagedConfig cfg;
  HostTensor q, k_pool, v_pool, page_table, seqused, cu_q, sinks, out, lse;
  HostTensor k_dense, v_dense, seqlens_kv, cu_kv, out_dense, lse_dense;
  sinkattn_params_t p{}, dense{};
  std::vector<unsigned char> ws;
  int64_t num_pages = 0, max_pages = 0, total_q = 0, cap = 0;

  explicit PagedProblem(const PagedConfig& c) : cfg(c) { build(); }

  sinkattn_status_t run(sinkattn_params_t& params, HostTensor& o, HostTensor& l) {
    o.poison();
    l.poison();
    size_t bytes = 0;
    const sinkattn_status_t st = sinkattn_forward_workspace_size(&params, &bytes);
    if (st != SINKATTN_OK) return st;
    ws.assign(bytes + 1, 0xff);  // NaN-filled scratch
    params.workspace = ws.data();
    params.workspace_bytes = bytes;
    return sinkattn_forward(&params);
  }
  sinkattn_status_t forward() { return run(p, out, lse); }
  sinkattn_status_t forward_dense() { return run(dense, out_dense, lse_dense); }

  ref::Result actual() const {
    ref::Result r;
    r.out = out.read();
    r.softmax_lse = lse.read();
    return r;
  }

 private:
  void build() {
    std::mt19937_64 rng(cfg.seed);
    const PagedConfig& c = cfg;
    const int64_t b = c.b(), ps = c.page_size;
    int64_t longest = 0;
    for (int32_t u : c.seqused) longest = std::max<int64_t>(longest, u);
    // ---- page assignment: a shuffled pool; with share_prefix, sequence 1 reuses sequence 0's first pages ----
    const PageLayout L = make_page_layout(c.seqused, ps, c.share_prefix, c.extra_pages, c.extra_table, rng);
    num_pages = L.num_pages;
    max_pages = L.max_pages;
    cap = L.capacity();

    // ---- pools: NaN everywhere, random values in the slots some sequence reads ----
    k_pool = HostTensor::contiguous(c.dtype, {num_pages, ps, c.h_kv, c.d});
    v_pool = HostTensor::contiguous(c.dtype, {num_pages, ps, c.h_kv, c.d_v});
    {
      ref::Array kp = k_pool.read(), vp = v_pool.read();  // NaN
      std::normal_distribution<double> nd(0.0, 1.0);
      for (int64_t n = 0; n < b; ++n)
        for (int64_t j = 0; j < c.seqused[n]; ++j) {
          const int64_t slot = L.slot(n, j);
          for (int64_t x = 0; x < c.h_kv * c.d; ++x) {
            double& e = kp.data[slot * c.h_kv * c.d + x];
            if (std::isnan(e)) e = nd(rng);  // a shared slot keeps its first value
          }
          for (int64_t x = 0; x < c.h_kv * c.d_v; ++x) {
            double& e = vp.data[slot * c.h_kv * c.d_v + x];
            if (std::isnan(e)) e = nd(rng);
          }
        }
      k_pool.write(kp);
      v_pool.write(vp);
    }
    // ---- page table: used entries, then garbage that must never be read ----
    page_table = HostTensor::contiguous(SINKATTN_I32, {b, max_pages});
    std::memcpy(page_table.t.data, L.table.data(), L.table.size() * sizeof(int32_t));
    auto i32 = [](const std::vector<int32_t>& xs) {
      HostTensor h = HostTensor::contiguous(SINKATTN_I32, {static_cast<int64_t>(xs.size())});
      std::memcpy(h.t.data, xs.data(), xs.size() * 4);
      return h;
    };
    seqused = i32(c.seqused);

    // ---- queries ----
    total_q = c.varlen() ? std::accumulate(c.len_q.begin(), c.len_q.end(), int64_t{0}) : b * c.s_q;
    int64_t s_q = c.s_q;
    if (c.varlen()) s_q = std::max<int64_t>(1, *std::max_element(c.len_q.begin(), c.len_q.end()));
    const std::vector<int64_t> qs = c.varlen() ? std::vector<int64_t>{total_q, c.h_q, c.d}
                                               : std::vector<int64_t>{b, c.s_q, c.h_q, c.d};
    const std::vector<int64_t> os = c.varlen() ? std::vector<int64_t>{total_q, c.h_q, c.d_v}
                                               : std::vector<int64_t>{b, c.s_q, c.h_q, c.d_v};
    const std::vector<int64_t> ls = c.varlen() ? std::vector<int64_t>{c.h_q, total_q}
                                               : std::vector<int64_t>{b, c.h_q, c.s_q};
    q = HostTensor::contiguous(c.dtype, qs);
    q.write(random_array(rng, qs));
    out = HostTensor::contiguous(c.dtype, os);
    lse = HostTensor::contiguous(SINKATTN_F32, ls);
    out_dense = HostTensor::contiguous(c.dtype, os);
    lse_dense = HostTensor::contiguous(SINKATTN_F32, ls);
    sinks = HostTensor::contiguous(SINKATTN_F32, {c.h_q});
    {
      ref::Array s;
      s.shape = {c.h_q};
      std::uniform_real_distribution<double> ud(-1.0, 3.0);
      for (int64_t h = 0; h < c.h_q; ++h)
        s.data.push_back(!c.sinks.empty() ? c.sinks.at(h)
                         : h == 0         ? std::log(static_cast<double>(std::max<int64_t>(longest, 2)))
                         : h == 1         ? 20.0
                                          : ud(rng));
      sinks.write(s);
    }

    sinkattn_params_init(&p);
    p.q = q.t;
    p.k = k_pool.t;
    p.v = v_pool.t;
    p.page_table = page_table.t;
    p.seqused_kv = seqused.t;
    p.out = out.t;
    p.softmax_lse = lse.t;
    if (c.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) p.sinks = sinks.t;
    p.softmax_type = c.softmax_type;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.mask_alignment = c.alignment;
    p.num_splits = c.num_splits;
    p.backend = SINKATTN_BACKEND_CPU;
    if (c.varlen()) {
      std::vector<int32_t> cq{0};
      for (int32_t l : c.len_q) cq.push_back(cq.back() + l);
      cu_q = i32(cq);
      p.cu_seqlens_q = cu_q.t;
      p.max_seqlen_q = s_q;
      p.max_seqlen_kv = std::max<int64_t>(longest, 1);
    }

    // ---- the dense twin: the same keys gathered per sequence ----
    dense = p;
    dense.page_table = sinkattn_tensor_t{};
    dense.out = out_dense.t;
    dense.softmax_lse = lse_dense.t;
    const ref::Array kp = k_pool.read(), vp = v_pool.read();
    if (c.varlen()) {
      const int64_t total_kv = std::accumulate(c.seqused.begin(), c.seqused.end(), int64_t{0});
      k_dense = HostTensor::contiguous(c.dtype, {std::max<int64_t>(total_kv, 1), c.h_kv, c.d});
      v_dense = HostTensor::contiguous(c.dtype, {std::max<int64_t>(total_kv, 1), c.h_kv, c.d_v});
      std::vector<int32_t> ck{0};
      for (int32_t u : c.seqused) ck.push_back(ck.back() + u);
      cu_kv = i32(ck);
      dense.cu_seqlens_kv = cu_kv.t;
      dense.seqused_kv = sinkattn_tensor_t{};
    } else {
      k_dense = HostTensor::contiguous(c.dtype, {b, cap, c.h_kv, c.d});
      v_dense = HostTensor::contiguous(c.dtype, {b, cap, c.h_kv, c.d_v});
      seqlens_kv = i32(c.seqused);
      dense.seqlens_kv = seqlens_kv.t;
      dense.seqused_kv = sinkattn_tensor_t{};
    }
    ref::Array kd = k_dense.read(), vd = v_dense.read();  // NaN beyond each sequence's keys
    int64_t row0 = 0;
    for (int64_t n = 0; n < b; ++n) {
      for (int64_t j = 0; j < c.seqused[n]; ++j) {
        const int64_t slot = L.slot(n, j);
        const int64_t row = c.varlen() ? row0 + j : n * cap + j;
        for (int64_t x = 0; x < c.h_kv * c.d; ++x) kd.data[row * c.h_kv * c.d + x] = kp.data[slot * c.h_kv * c.d + x];
        for (int64_t x = 0; x < c.h_kv * c.d_v; ++x)
          vd.data[row * c.h_kv * c.d_v + x] = vp.data[slot * c.h_kv * c.d_v + x];
      }
      row0 += c.seqused[n];
    }
    k_dense.write(kd);
    v_dense.write(vd);
    dense.k = k_dense.t;
    dense.v = v_dense.t;
  }
};

// SPEC.md section 5 verdict of out and softmax_lse against the float64 reference (which reads the pages itself).
std::vector<ref::ErrorRow> judge(const ref::Result& act, const sinkattn_params_t& p) {
  const ref::Result r64 = ref::evaluate(p, false);
  ref::Result lowp;
  if (p.q.dtype != SINKATTN_F32) lowp = ref::evaluate(p, false, ref::Precision::kPlainLowPrecision);
  return ref::error_table(act, r64, lowp, p.q.dtype);
}
bool passes(const std::vector<ref::ErrorRow>& rows) {
  bool all = !rows.empty();
  for (const auto& r : rows) all = all && r.pass;
  return all;
}

// Runs the paged call, checks it against the reference, and (when `twin`) against the dense twin bit for bit.
void check_paged(PagedProblem& pb, bool twin = true) {
  ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error() << "\n" << pb.cfg.describe();
  const auto rows = judge(pb.actual(), pb.p);
  EXPECT_TRUE(passes(rows)) << pb.cfg.describe() << "\n" << format_table(rows);
  if (!twin) return;
  ASSERT_EQ(pb.forward_dense(), SINKATTN_OK) << sinkattn_last_error() << "\n" << pb.cfg.describe();
  EXPECT_EQ(pb.out.bytes(), pb.out_dense.bytes()) << "paged out != dense out on the same keys: " << pb.cfg.describe();
  EXPECT_EQ(pb.lse.bytes(), pb.lse_dense.bytes()) << "paged lse != dense lse on the same keys: " << pb.cfg.describe();
}

// ---- paged == dense, and == the reference ----
using PagedParam = std::tuple<int64_t /*page size*/, bool /*varlen*/, sinkattn_dtype_t, int /*mask*/>;
class Paged : public ::testing::TestWithParam<PagedParam> {};

struct MaskCase {
  const char* name;
  int64_t wl, wr;
  sinkattn_mask_alignment_t align;
};
const MaskCase kMasks[] = {{"none", -1, -1, SINKATTN_ALIGN_BOTTOM_RIGHT},
                           {"causal", -1, 0, SINKATTN_ALIGN_BOTTOM_RIGHT},
                           {"sliding_13", 13, 0, SINKATTN_ALIGN_BOTTOM_RIGHT},
                           {"window_5_2_tl", 5, 2, SINKATTN_ALIGN_TOP_LEFT}};

TEST_P(Paged, EqualsDenseAndReference) {
  const auto [ps, varlen, dt, mi] = GetParam();
  PagedConfig c;
  c.page_size = ps;
  c.dtype = dt;
  c.window_left = kMasks[mi].wl;
  c.window_right = kMasks[mi].wr;
  c.alignment = kMasks[mi].align;
  // ragged: ends mid-page, exactly on a page edge, one past it, empty, one key, long
  c.seqused = {static_cast<int32_t>(3 * ps + ps / 2), static_cast<int32_t>(2 * ps), 0, 1,
               static_cast<int32_t>(ps + 1), static_cast<int32_t>(5 * ps - 1)};
  if (ps >= 128) c.seqused = {static_cast<int32_t>(ps + ps / 2), static_cast<int32_t>(ps), 0, 1, 300};
  c.share_prefix = true;
  if (varlen) {
    c.len_q.clear();
    for (size_t n = 0; n < c.seqused.size(); ++n) c.len_q.push_back(static_cast<int32_t>((n * 3) % 5));  // 0..4
  } else {
    c.s_q = 3;
  }
  c.h_q = 6;
  c.h_kv = 2;
  c.d = 24;
  c.d_v = 16;
  c.seed = static_cast<uint64_t>(ps * 100 + mi * 7 + varlen * 3 + dt);
  PagedProblem pb(c);
  check_paged(pb);
}

INSTANTIATE_TEST_SUITE_P(All, Paged,
                         ::testing::Combine(::testing::Values<int64_t>(1, 8, 16, 32, 64, 128, 256), ::testing::Bool(),
                                            ::testing::Values(SINKATTN_F32, SINKATTN_BF16, SINKATTN_F16),
                                            ::testing::Range(0, 4)),
                         [](const ::testing::TestParamInfo<PagedParam>& i) {
                           return "ps" + std::to_string(std::get<0>(i.param)) +
                                  (std::get<1>(i.param) ? "_varlen_" : "_dense_") +
                                  dtype_name(std::get<2>(i.param)) + "_" + kMasks[std::get<3>(i.param)].name;
                         });

// GPT-OSS attention shape at decode (s_q = 1, GQA 8, d 64, learnable sinks), a few speculative tokens (s_q = 4).
TEST(PagedDecode, GptOssShape) {
  for (int64_t s_q : {1, 4}) {
    for (int64_t wl : {-1, 127}) {
      PagedConfig c;
      c.h_q = 64;
      c.h_kv = 8;
      c.d = c.d_v = 64;
      c.dtype = SINKATTN_BF16;
      c.page_size = 16;
      c.s_q = s_q;
      c.window_left = wl;
      c.window_right = 0;
      c.seqused = {300, 17, 129};
      c.num_splits = 0;  // heuristic
      c.seed = static_cast<uint64_t>(s_q * 10 + (wl > 0));
      PagedProblem pb(c);
      check_paged(pb);
    }
  }
}

// ---- split-KV: every split count against no split and the reference ----
using SplitParam = std::tuple<int32_t /*num_splits*/, sinkattn_softmax_type_t, bool /*varlen*/>;
class Splits : public ::testing::TestWithParam<SplitParam> {};

TEST_P(Splits, MatchNoSplitAndReference) {
  const auto [ns, st, varlen] = GetParam();
  PagedConfig c;
  c.softmax_type = st;
  c.page_size = 16;
  // 0 keys (every split empty), 1 key, 70 keys (2 tiles of 64: with 3+ splits the last ones, the sink's among
  // them, are empty), 64 keys (one full tile), 600 keys (10 tiles).
  c.seqused = {0, 1, 70, 64, 600};
  if (varlen) c.len_q = {1, 2, 3, 1, 5};
  else c.s_q = 2;
  c.window_right = 0;
  c.num_splits = 1;
  c.seed = 42;
  PagedProblem base(c);
  ASSERT_EQ(base.forward(), SINKATTN_OK) << sinkattn_last_error();
  const ref::Array out1 = base.out.read(), lse1 = base.lse.read();

  c.num_splits = ns;
  PagedProblem pb(c);  // same seed: same inputs
  ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  const auto rows = judge(pb.actual(), pb.p);
  EXPECT_TRUE(passes(rows)) << c.describe() << "\n" << format_table(rows);
  // Against no split: fp32, only the summation order differs.
  const ref::Array out = pb.out.read(), lse = pb.lse.read();
  EXPECT_LE(ref::relative_error(out, out1), 1e-5) << c.describe();
  EXPECT_LE(ref::relative_error(lse, lse1), 1e-6) << c.describe();
  // Sequence 0 has no key: out = 0 and LSE = sigma exactly (-inf vanilla, 0 off_by_one).
  const ref::Array sk = pb.sinks.read();
  for (int64_t h = 0; h < c.h_q; ++h) {
    const double want = st == SINKATTN_SOFTMAX_LEARNABLE ? static_cast<float>(sk.data[h])
                        : st == SINKATTN_SOFTMAX_OFF_BY_ONE ? 0.0
                                                            : -INFINITY;
    const int64_t rows0 = varlen ? c.len_q[0] : c.s_q;
    for (int64_t i = 0; i < rows0; ++i) {
      EXPECT_EQ(varlen ? at(lse, {h, i}) : at(lse, {0, h, i}), want) << "h " << h << " i " << i;
      for (int64_t x = 0; x < c.d_v; ++x) EXPECT_EQ(varlen ? at(out, {i, h, x}) : at(out, {0, i, h, x}), 0.0);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(All, Splits,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 7, 8, 10, 11, 16, 64, 128, 1000),
                                            ::testing::Values(SINKATTN_SOFTMAX_VANILLA, SINKATTN_SOFTMAX_OFF_BY_ONE,
                                                              SINKATTN_SOFTMAX_LEARNABLE),
                                            ::testing::Bool()),
                         [](const ::testing::TestParamInfo<SplitParam>& i) {
                           return "splits" + std::to_string(std::get<0>(i.param)) + "_" +
                                  softmax_name(std::get<1>(i.param)) + (std::get<2>(i.param) ? "_varlen" : "_dense");
                         });

// Split-KV on contiguous (non-paged) KV too: dense, padded and varlen batches.
TEST(Splits, ContiguousKv) {
  for (Batch batch : {Batch::kDense, Batch::kPadded, Batch::kVarlen}) {
    for (int32_t ns : {1, 3, 9}) {
      Config c;
      c.batch = batch;
      c.b = 2;
      c.s_q = 5;
      c.s_kv = 300;
      if (batch == Batch::kPadded) {
        c.seqlens_q = {5, 2};
        c.seqlens_kv = {300, 65};
      } else if (batch == Batch::kVarlen) {
        c.seqlens_q = {5, 1};
        c.seqlens_kv = {300, 0};
      }
      c.window_right = 0;
      c.num_threads = 2;
      Problem pb(c);
      pb.p.num_splits = ns;
      check_against_reference(pb, /*backward=*/false);
    }
  }
}

// ---- the sink exactly once: the judge rejects a double-counted or dropped sink ----
// With the sink's logit 20 far above the scores (~|N(0, 1)| / sqrt(d) * ...), counting it twice moves every LSE by
// ~log 2 and scales out by ~1/2; not counting it moves LSE to the scores' logsumexp. A correct result passes the
// judge; the same result with either bug planted (lse' = logaddexp(lse, sigma), out' = out exp(lse - lse'), or the
// sink removed) must fail it. The library's own results for every split count pass (above), so none of them counts
// the sink twice or drops it.
TEST(SinkOnce, PlantedDoubleCountFailsTheJudge) {
  for (int32_t ns : {1, 4, 16}) {
    PagedConfig c;
    c.sinks = {20.0, 3.0, 20.0, 0.5, -2.0, 20.0, 1.0, 2.0};
    c.seqused = {70, 5, 200};
    c.s_q = 2;
    c.num_splits = ns;
    PagedProblem pb(c);
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
    const ref::Result good = pb.actual();
    ASSERT_TRUE(passes(judge(good, pb.p))) << c.describe();
    for (int bug = 0; bug < 2; ++bug) {  // 0: counted twice, 1: not counted
      ref::Result bad = good;
      for (int64_t n = 0; n < c.b(); ++n)
        for (int64_t h = 0; h < c.h_q; ++h)
          for (int64_t i = 0; i < c.s_q; ++i) {
            double& l = bad.softmax_lse.data[(n * c.h_q + h) * c.s_q + i];
            const double sigma = c.sinks[h];
            const double l2 = bug == 0 ? std::max(l, sigma) + std::log1p(std::exp(-std::fabs(l - sigma)))
                                       : l + std::log(-std::expm1(std::min(sigma - l, -1e-12)));
            for (int64_t x = 0; x < c.d_v; ++x) bad.out.data[((n * c.s_q + i) * c.h_q + h) * c.d_v + x] *= std::exp(l - l2);
            l = l2;
          }
      EXPECT_FALSE(passes(judge(bad, pb.p))) << "a planted " << (bug == 0 ? "double-counted" : "dropped")
                                             << " sink passed the judge: " << c.describe();
    }
  }
}

// ---- windows whose edges fall on page edges (GPT-OSS sliding layers: 127 keys back + the query) ----
TEST(PagedWindow, EdgesOnPageEdges) {
  for (int64_t ps : {16, 64, 128}) {
    for (int64_t wl : {ps - 1, ps, 2 * ps - 1}) {
      for (int32_t ns : {1, 3}) {
        PagedConfig c;
        c.page_size = ps;
        c.window_left = wl;
        c.window_right = 0;
        c.s_q = 1;
        c.num_splits = ns;
        // windows starting exactly at a page start, one key after it, one key before it
        c.seqused = {static_cast<int32_t>(2 * ps + wl), static_cast<int32_t>(2 * ps + wl + 1),
                     static_cast<int32_t>(2 * ps + wl - 1), static_cast<int32_t>(wl)};
        c.seed = static_cast<uint64_t>(ps + wl + ns);
        PagedProblem pb(c);
        check_paged(pb);
      }
    }
  }
}

// Pages the window skips reach no output: poisoning them with NaN changes nothing. (Their table entries must still
// be valid pages: SPEC.md section 1 lets only entries past ceil(seqused_kv / page_size) hold garbage.)
TEST(PagedWindow, PagesBeforeTheWindowAreNotRead) {
  PagedConfig c;
  c.page_size = 16;
  c.window_left = 20;
  c.window_right = 0;
  c.seqused = {200};
  c.extra_pages = 0;
  PagedProblem pb(c);
  check_paged(pb, /*twin=*/false);
  const std::vector<unsigned char> out0 = pb.out.bytes(), lse0 = pb.lse.bytes();
  // Keys 0 .. 178 are outside the window of the only query (key 199): pages 0 .. 10 are never needed.
  int32_t* t = static_cast<int32_t*>(pb.page_table.t.data);
  ref::Array kp = pb.k_pool.read(), vp = pb.v_pool.read();
  for (int64_t pg = 0; pg < 11; ++pg) {
    const int64_t page = t[pg];
    for (int64_t x = 0; x < 16 * c.h_kv * c.d; ++x) kp.data[page * 16 * c.h_kv * c.d + x] = NAN;
    for (int64_t x = 0; x < 16 * c.h_kv * c.d_v; ++x) vp.data[page * 16 * c.h_kv * c.d_v + x] = NAN;
  }
  pb.k_pool.write(kp);
  pb.v_pool.write(vp);
  for (int32_t ns : {1, 4}) {
    pb.p.num_splits = ns;
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
    if (ns == 1) {
      EXPECT_EQ(pb.out.bytes(), out0);
      EXPECT_EQ(pb.lse.bytes(), lse0);
    }
    EXPECT_TRUE(no_nan(pb.out.read()) && no_nan(pb.lse.read()));
  }
}

// ---- validation (SPEC.md section 4): status, message naming the argument, nothing written ----
struct PagedRule {
  const char* name;
  const char* argument;
  std::function<void(PagedProblem&)> mutate;
  bool backward = false;
  bool varlen = false;  // varlen queries
};

TEST(PagedValidation, EveryRule) {
  const std::vector<PagedRule> rules = {
      {"table_dtype", "page_table", [](PagedProblem& pb) { pb.p.page_table.dtype = SINKATTN_F32; }},
      {"table_rank", "page_table", [](PagedProblem& pb) { pb.p.page_table.rank = 1; }},
      {"table_batch", "page_table", [](PagedProblem& pb) { pb.p.page_table.shape[0] = 2; }},
      {"seqused_missing", "seqused_kv", [](PagedProblem& pb) { pb.p.seqused_kv = sinkattn_tensor_t{}; }},
      {"seqused_shape", "seqused_kv", [](PagedProblem& pb) { pb.p.seqused_kv.shape[0] = 2; }},
      {"seqused_over_capacity", "seqused_kv",
       [](PagedProblem& pb) { static_cast<int32_t*>(pb.seqused.t.data)[1] = static_cast<int32_t>(pb.cap + 1); }},
      {"seqused_negative", "seqused_kv", [](PagedProblem& pb) { static_cast<int32_t*>(pb.seqused.t.data)[0] = -1; }},
      {"page_out_of_range", "page_table",
       [](PagedProblem& pb) { static_cast<int32_t*>(pb.page_table.t.data)[1] = static_cast<int32_t>(pb.num_pages); }},
      {"page_negative", "page_table", [](PagedProblem& pb) { static_cast<int32_t*>(pb.page_table.t.data)[0] = -3; }},
      {"k_pool_rank", "k", [](PagedProblem& pb) { pb.p.k.rank = 3; }},
      {"v_page_size", "v", [](PagedProblem& pb) { pb.p.v.shape[1] = 8; }},
      {"k_head_dim", "k", [](PagedProblem& pb) { pb.p.k.shape[3] = 16; }},
      {"cu_seqlens_kv", "cu_seqlens_kv", [](PagedProblem& pb) { pb.p.cu_seqlens_kv = pb.cu_q.t; }, false, true},
      {"varlen_seqused_over_max_seqlen_kv", "seqused_kv", [](PagedProblem& pb) { pb.p.max_seqlen_kv = 30; }, false,
       true},
      {"seqlens_kv", "seqlens_kv", [](PagedProblem& pb) { pb.p.seqlens_kv = pb.seqused.t; }},
      {"dropout", "dropout_p", [](PagedProblem& pb) { pb.p.dropout_p = 0.1; }},
      {"num_splits", "num_splits", [](PagedProblem& pb) { pb.p.num_splits = -1; }},
      {"backward", "page_table", [](PagedProblem&) {}, true},
  };
  for (const auto& r : rules) {
    PagedConfig c;
    c.seqused = {40, 0, 17};
    c.s_q = 2;
    if (r.varlen) c.len_q = {2, 1, 3};
    PagedProblem pb(c);
    r.mutate(pb);
    pb.out.poison();
    pb.lse.poison();
    const std::vector<unsigned char> out0 = pb.out.bytes(), lse0 = pb.lse.bytes();
    sinkattn_status_t st;
    if (r.backward) {
      HostTensor d_out = HostTensor::contiguous(c.dtype, pb.out.shape());
      d_out.write(pb.out.read());
      pb.p.d_out = d_out.t;
      pb.p.dq = pb.q.t;
      pb.p.dk = pb.k_pool.t;
      pb.p.dv = pb.v_pool.t;
      HostTensor ds = HostTensor::contiguous(SINKATTN_F32, {c.h_q});
      pb.p.d_sinks = ds.t;
      size_t bytes = 0;
      st = sinkattn_backward_workspace_size(&pb.p, &bytes);
      EXPECT_NE(st, SINKATTN_OK) << r.name;
      st = sinkattn_backward(&pb.p);
    } else {
      size_t bytes = 0;
      st = sinkattn_forward_workspace_size(&pb.p, &bytes);
      if (st == SINKATTN_OK) {  // content rules are checked by the run (the size query sees shapes only)
        pb.ws.assign(bytes + 1, 0);
        pb.p.workspace = pb.ws.data();
        pb.p.workspace_bytes = bytes;
        st = sinkattn_forward(&pb.p);
      }
    }
    const std::string msg = sinkattn_last_error();
    EXPECT_EQ(st, SINKATTN_ERR_INVALID_ARGUMENT) << r.name << ": " << msg;
    EXPECT_EQ(msg.rfind(r.argument, 0), 0u) << r.name << ": message should start with '" << r.argument << "': " << msg;
    EXPECT_EQ(pb.out.bytes(), out0) << r.name << ": out written although validation failed";
    EXPECT_EQ(pb.lse.bytes(), lse0) << r.name << ": softmax_lse written although validation failed";
  }
}

// The shape-only size query works without data (bindings size their buffers with it) and reports the split
// buffers: more splits, more workspace, up to one split per 64-key tile of the table's capacity plus one (9 pages of
// 16 keys: 3 tiles, 4 splits); more splits than that are the same partials (cpu_forward.cpp).
TEST(PagedValidation, ShapeOnlyWorkspaceQuery) {
  PagedConfig c;
  c.seqused = {100, 3};
  PagedProblem pb(c);
  ASSERT_EQ(pb.cap, 144);
  size_t ws[4] = {0, 0, 0, 0};
  const int32_t splits[4] = {1, 2, 4, 16};
  for (int k = 0; k < 4; ++k) {
    sinkattn_params_t q = pb.p;
    for (sinkattn_tensor_t* t : {&q.q, &q.k, &q.v, &q.page_table, &q.seqused_kv, &q.out, &q.softmax_lse, &q.sinks})
      t->data = nullptr;
    q.num_splits = splits[k];
    ASSERT_EQ(sinkattn_forward_workspace_size(&q, &ws[k]), SINKATTN_OK) << sinkattn_last_error();
  }
  EXPECT_LT(ws[0], ws[1]);
  EXPECT_LT(ws[1], ws[2]);
  EXPECT_EQ(ws[2], ws[3]);
}

}  // namespace
}  // namespace sinkattn::test

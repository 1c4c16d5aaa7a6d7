// Sink values and rows at the edge of the call, on the CPU backend (the GPU suite checks the same on CUDA):
//   - SPEC.md section 3, "Sink values": a -inf sink makes its head vanilla in the forward (rows without keys:
//     out = 0, LSE = -inf exactly); in the backward each row of that head that sees no key adds d_lse_i to
//     d_sinks[h] (P_sink = 1, the limit of a finite sink going to -inf) and rows with keys add 0, never NaN;
//     -1e30 gives the same result;
//   - SPEC.md section 2: a row that sees no key has LSE exactly sigma (learnable), 0 (off_by_one), -inf
//     (vanilla), out = 0 and dq = 0, on every path (dense with seqlens_kv 0, varlen with empty kv sequences,
//     s_q > s_kv bottom-right windows; fp32, fp16, bf16; deterministic or not);
//   - SPEC.md section 1: rows of packed tensors after cu_seqlens[b] are outside the call: a sentinel there survives
//     forward and backward bit for bit, and NaN there in the inputs reaches no output;
//   - SPEC.md section 3: a NaN or +inf sink in head 0 changes no bit of any other head's outputs.
// Every call is also judged by the float64 reference (SPEC.md section 5), the backward with D from the out it
// was fed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

// Rows of a problem: (n, i) with i < len_q(n), and the keys row i of sequence n sees (SPEC.md section 2).
bool sees_no_key(const Problem& pb, int64_t n, int64_t i) {
  const Config& c = pb.cfg;
  return ref::visible_keys(i, pb.len_q(n), pb.len_kv(n), c.window_left, c.window_right,
                           c.alignment == SINKATTN_ALIGN_BOTTOM_RIGHT)
      .empty();
}

size_t lse_at(const Problem& pb, int64_t n, int64_t h, int64_t i) {
  return pb.varlen() ? size_t(h * pb.total_q + pb.q_row(n, i)) : size_t((n * pb.cfg.h_q + h) * pb.cfg.s_q + i);
}

// The LSE SPEC.md section 2 gives a row that sees no key.
double keyless_lse(const Problem& pb, int64_t h) {
  if (pb.cfg.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) return pb.sinks.read().data[h];
  if (pb.cfg.softmax_type == SINKATTN_SOFTMAX_OFF_BY_ONE) return 0.0;
  return -INFINITY;
}

// Rows that see no key: LSE exactly keyless_lse, out = 0, dq = 0 (every head). Returns how many (row, head).
int64_t expect_keyless_rows(const Problem& pb, const std::string& what) {
  const Config& c = pb.cfg;
  const ref::Array lse = pb.lse.read(), out = pb.out.read(), dq = pb.dq.read();
  int64_t rows = 0, bad_out = 0, bad_dq = 0;
  for (int64_t n = 0; n < c.b; ++n)
    for (int64_t i = 0; i < pb.len_q(n); ++i) {
      if (!sees_no_key(pb, n, i)) continue;
      const int64_t r = pb.q_row(n, i);
      for (int64_t h = 0; h < c.h_q; ++h) {
        ++rows;
        EXPECT_EQ(lse.data[lse_at(pb, n, h, i)], keyless_lse(pb, h)) << what << ": LSE of (n " << n << ", h " << h
                                                                     << ", i " << i << ")";
        for (int64_t x = 0; x < c.d_v; ++x) bad_out += out.data[(r * c.h_q + h) * c.d_v + x] != 0.0;
        for (int64_t x = 0; x < c.d; ++x) bad_dq += dq.data[(r * c.h_q + h) * c.d + x] != 0.0;
      }
    }
  EXPECT_EQ(bad_out, 0) << what << ": out of rows without keys not exactly 0";
  EXPECT_EQ(bad_dq, 0) << what << ": dq of rows without keys not exactly 0";
  return rows;
}

// Bit-for-bit equality of two float64 arrays read from the library's tensors, over the elements `keep` selects
// (by the multi-index). Returns the number of differing elements.
template <class Keep>
int64_t bit_differences(const ref::Array& a, const ref::Array& b, Keep keep) {
  EXPECT_EQ(a.shape, b.shape);
  int64_t diff = 0;
  std::vector<int64_t> idx(a.shape.size(), 0);
  for (size_t lin = 0; lin < a.data.size(); ++lin) {
    size_t rest = lin;
    for (size_t r = a.shape.size(); r-- > 0;) {
      idx[r] = int64_t(rest % size_t(a.shape[r]));
      rest /= size_t(a.shape[r]);
    }
    if (!keep(idx)) continue;
    const double x = a.data[lin], y = b.data[lin];
    diff += std::isnan(x) || std::memcmp(&x, &y, sizeof x) != 0;
  }
  return diff;
}
template <class Keep>
int64_t bit_differences(const HostTensor& a, const HostTensor& b, Keep keep) {
  return bit_differences(a.read(), b.read(), keep);
}
auto everything = [](const std::vector<int64_t>&) { return true; };

// ---------------------------------------------------------------- -inf sinks
struct MinusInfCase {
  std::string name;
  Config cfg;
};
void PrintTo(const MinusInfCase& c, std::ostream* os) { *os << c.name; }

// The calls of this file: GQA (4 query heads on 2 KV heads), head dim 32, learnable sinks, d_lse.
Config small_config(sinkattn_dtype_t dt) {
  Config c;
  c.dtype = dt;
  c.b = 2;
  c.h_q = 4;
  c.h_kv = 2;
  c.d = c.d_v = 32;
  c.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  c.d_lse = true;
  return c;
}

Config minus_inf_base(sinkattn_dtype_t dt) {
  Config c = small_config(dt);
  c.sinks = {-INFINITY, 1.5, -INFINITY, 20.0};
  return c;
}

std::vector<MinusInfCase> minus_inf_cases() {
  std::vector<MinusInfCase> v;
  for (auto dt : {SINKATTN_F32, SINKATTN_BF16}) {
    const std::string t = std::string("_") + dtype_name(dt);
    Config c = minus_inf_base(dt);  // s_q > s_kv, bottom-right causal: rows 0..s_q-s_kv-1 see no key
    c.s_q = 40;
    c.s_kv = 17;
    c.window_right = 0;
    v.push_back({"bottom_right" + t, c});
    c.d_lse = false;
    v.push_back({"bottom_right_no_d_lse" + t, c});
    Config w = minus_inf_base(dt);  // a window as well
    w.s_q = 50;
    w.s_kv = 20;
    w.window_left = 5;
    w.window_right = 0;
    w.deterministic = 1;
    v.push_back({"bottom_right_window_deterministic" + t, w});
    Config vl = minus_inf_base(dt);  // varlen with zero-length kv sequences
    vl.b = 3;
    vl.batch = Batch::kVarlen;
    vl.seqlens_q = {5, 9, 3};
    vl.seqlens_kv = {0, 11, 0};
    v.push_back({"varlen_empty_kv" + t, vl});
    vl.d_lse = false;
    v.push_back({"varlen_empty_kv_no_d_lse" + t, vl});
    Config pd = minus_inf_base(dt);  // dense with seqlens_kv 0
    pd.batch = Batch::kPadded;
    pd.s_q = 24;
    pd.s_kv = 20;
    pd.seqlens_q = {24, 13};
    pd.seqlens_kv = {0, 20};
    pd.window_right = 0;
    v.push_back({"padded_zero_kv" + t, pd});
  }
  return v;
}

class MinusInfSink : public ::testing::TestWithParam<MinusInfCase> {};

TEST_P(MinusInfSink, VanillaForwardDLseSumAndSameAsMinus1e30) {
  const Config& c = GetParam().cfg;
  SCOPED_TRACE(c.describe());
  Problem pb(c);
  check_against_reference(pb, true);
  if (HasFatalFailure()) return;
  const std::vector<int64_t> inf_heads = {0, 2};

  // Forward: the -inf heads are vanilla. Same data, softmax_type vanilla: those heads' out and LSE bit for bit.
  Config cv = c;
  cv.softmax_type = SINKATTN_SOFTMAX_VANILLA;
  Problem van(cv);
  ASSERT_EQ(van.forward(), SINKATTN_OK) << sinkattn_last_error();
  const bool vl = pb.varlen();
  auto head_of_rows = [&](const std::vector<int64_t>& idx) { return idx[vl ? 1 : 2]; };
  auto head_of_lse = [&](const std::vector<int64_t>& idx) { return idx[vl ? 0 : 1]; };
  auto is_inf_head = [&](int64_t h) { return h == 0 || h == 2; };
  EXPECT_EQ(bit_differences(pb.out, van.out, [&](const std::vector<int64_t>& i) { return is_inf_head(head_of_rows(i)); }), 0)
      << "out of a -inf head differs from vanilla";
  EXPECT_EQ(bit_differences(pb.lse, van.lse,
                            [&](const std::vector<int64_t>& i) {
                              if (!is_inf_head(head_of_lse(i))) return false;
                              if (c.batch != Batch::kPadded) return true;
                              return i[2] < pb.len_q(i[0]);  // LSE of padding rows is unspecified
                            }),
            0)
      << "softmax_lse of a -inf head differs from vanilla";

  // Rows that see no key: out = 0, LSE = -inf exactly for the -inf heads (sigma for the others), dq = 0.
  EXPECT_GT(expect_keyless_rows(pb, "-inf sinks"), 0) << "the case has no row without keys";

  // Backward: d_sinks[h] of a -inf head = sum of d_lse over its rows without keys (rows with keys add 0).
  const ref::Array ds = pb.d_sinks.read();
  const ref::Array gl = c.d_lse ? pb.d_lse.read() : ref::Array{};
  for (int64_t h : inf_heads) {
    double want = 0;
    for (int64_t n = 0; n < c.b; ++n)
      for (int64_t i = 0; i < pb.len_q(n); ++i)
        if (c.d_lse && sees_no_key(pb, n, i)) want += gl.data[lse_at(pb, n, h, i)];
    ASSERT_FALSE(std::isnan(ds.data[h])) << "d_sinks[" << h << "] is NaN";
    if (c.d_lse) {
      EXPECT_NE(want, 0.0);
      EXPECT_NEAR(ds.data[h], want, 1e-5 * std::max(1.0, std::fabs(want))) << "d_sinks[" << h << "]";
    } else {
      EXPECT_EQ(ds.data[h], 0.0) << "d_sinks[" << h << "] without d_lse";
    }
  }

  // -1e30 in place of -inf: out bit for bit, gradients bit for bit (the CPU backend is deterministic), d_sinks
  // within fp32 rounding; LSE of rows without keys exactly -1e30.
  Config c30 = c;
  for (double& s : c30.sinks)
    if (s == -INFINITY) s = -1e30;
  Problem p30(c30);
  ASSERT_EQ(p30.forward(), SINKATTN_OK) << sinkattn_last_error();
  ASSERT_EQ(p30.backward(), SINKATTN_OK) << sinkattn_last_error();
  EXPECT_TRUE(p30.out.bytes() == pb.out.bytes()) << "out differs between -inf and -1e30 sinks";
  EXPECT_TRUE(p30.dq.bytes() == pb.dq.bytes());
  EXPECT_TRUE(p30.dk.bytes() == pb.dk.bytes());
  EXPECT_TRUE(p30.dv.bytes() == pb.dv.bytes());
  const ref::Array ds30 = p30.d_sinks.read();
  for (int64_t h = 0; h < c.h_q; ++h)
    EXPECT_NEAR(ds30.data[h], ds.data[h], 1e-5 * std::max(1.0, std::fabs(ds.data[h]))) << "d_sinks[" << h << "]";
  EXPECT_GT(expect_keyless_rows(p30, "-1e30 sinks"), 0);
}

INSTANTIATE_TEST_SUITE_P(Cases, MinusInfSink, ::testing::ValuesIn(minus_inf_cases()),
                         [](const ::testing::TestParamInfo<MinusInfCase>& i) { return i.param.name; });

// ---------------------------------------------------------------- rows without keys: LSE exact
class KeylessRows : public ::testing::TestWithParam<int> {};

TEST_P(KeylessRows, LseExactlySigmaZeroOrMinusInf) {
  const int which = GetParam();
  const sinkattn_dtype_t dts[] = {SINKATTN_F32, SINKATTN_F16, SINKATTN_BF16};
  const sinkattn_softmax_type_t sts[] = {SINKATTN_SOFTMAX_LEARNABLE, SINKATTN_SOFTMAX_OFF_BY_ONE,
                                         SINKATTN_SOFTMAX_VANILLA};
  for (int shape = 0; shape < 3; ++shape)
    for (int det = 0; det < 2; ++det) {
      Config c;
      c.dtype = dts[which % 3];
      c.softmax_type = sts[which / 3];
      c.h_q = 4;
      c.h_kv = 2;
      c.d = c.d_v = 64;
      c.sinks = {2.7, -1.3, 20.0, 0.1};  // not exact in base 2: an LSE that goes through log2 and back shows it
      c.d_lse = true;
      c.deterministic = det;
      c.data_seed = 100 + which * 10 + shape * 2 + det;
      if (shape == 0) {  // dense, seqlens_kv 0
        c.batch = Batch::kPadded;
        c.s_q = 16;
        c.s_kv = 24;
        c.seqlens_q = {16, 9};
        c.seqlens_kv = {0, 24};
      } else if (shape == 1) {  // varlen, empty kv sequences, no mask
        c.b = 4;
        c.batch = Batch::kVarlen;
        c.seqlens_q = {7, 20, 1, 12};
        c.seqlens_kv = {0, 13, 0, 5};
      } else {  // s_q > s_kv, bottom-right window
        c.b = 1;
        c.s_q = 96;
        c.s_kv = 32;
        c.window_left = 8;
        c.window_right = 0;
      }
      Problem pb(c);
      SCOPED_TRACE(c.describe() + " deterministic=" + std::to_string(det));
      check_against_reference(pb, true);
      EXPECT_GT(expect_keyless_rows(pb, "rows without keys"), 0);
    }
}

INSTANTIATE_TEST_SUITE_P(DtypesAndSoftmaxTypes, KeylessRows, ::testing::Range(0, 9));

// ---------------------------------------------------------------- rows after cu_seqlens[b]
TEST(VarlenTailRows, UntouchedAndTheirNaNReachesNothing) {
  for (auto dt : {SINKATTN_F32, SINKATTN_BF16, SINKATTN_F16})
    for (int det = 0; det < 2; ++det) {
      Config c = small_config(dt);
      c.b = 3;
      c.batch = Batch::kVarlen;
      c.seqlens_q = {20, 0, 11};
      c.seqlens_kv = {13, 7, 20};
      c.window_right = 0;
      c.tail_q = 9;
      c.tail_kv = 5;
      c.deterministic = det;
      Problem pb(c);
      SCOPED_TRACE(c.describe());
      ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
      // The forward left the sentinel (the Problem wrote it after the NaN poison) in the rows after cu_seqlens.
      auto tail_rows = [](int64_t used, int dim) {
        return [used, dim](const std::vector<int64_t>& i) { return i[dim] >= used; };
      };
      Problem want(c);  // what the outputs held before the call: NaN, and the sentinel in the tail
      want.poison_forward_outputs();
      want.poison_backward_outputs();
      EXPECT_EQ(bit_differences(pb.out, want.out, tail_rows(pb.used_q, 0)), 0) << "forward wrote out after cu_seqlens_q[b]";
      EXPECT_EQ(bit_differences(pb.lse, want.lse, tail_rows(pb.used_q, 1)), 0)
          << "forward wrote softmax_lse after cu_seqlens_q[b]";
      // The backward gets NaN in those rows of out and softmax_lse (inputs outside the call).
      pb.fill_tail(pb.out, false, NAN);
      pb.fill_tail(pb.lse, false, NAN, true);
      ASSERT_EQ(pb.backward(), SINKATTN_OK) << sinkattn_last_error();
      EXPECT_EQ(bit_differences(pb.dq, want.dq, tail_rows(pb.used_q, 0)), 0) << "backward wrote dq after cu_seqlens_q[b]";
      EXPECT_EQ(bit_differences(pb.dk, want.dk, tail_rows(pb.used_kv, 0)), 0) << "backward wrote dk after cu_seqlens_kv[b]";
      EXPECT_EQ(bit_differences(pb.dv, want.dv, tail_rows(pb.used_kv, 0)), 0) << "backward wrote dv after cu_seqlens_kv[b]";
      // Everything inside the call matches the reference (rows after cu_seqlens[b] are unspecified there), and
      // the NaN outside reached no output (relative_error is infinite on a NaN). The forward's outputs get their
      // sentinel back (their NaN was an input of the backward, not an output).
      pb.fill_tail(pb.out, false, c.tail_fill);
      pb.fill_tail(pb.lse, false, c.tail_fill, true);
      const auto rows = ref::error_table(pb.actual(true), pb.judges(true), c.dtype);
      for (const auto& r : rows) EXPECT_TRUE(r.pass) << format_table(rows);
    }
}

// ---------------------------------------------------------------- NaN / +inf sinks
class NonFiniteSink : public ::testing::TestWithParam<int> {};

TEST_P(NonFiniteSink, OtherHeadsUnchangedBitForBit) {
  const int which = GetParam();
  Config c = small_config(which % 2 ? SINKATTN_BF16 : SINKATTN_F32);
  c.h_kv = which < 4 ? 4 : 2;  // MHA: dk, dv of KV heads 1..3 checked; GQA: KV head 1
  c.sinks = {1.0, 20.0, -2.0, 4.4};
  c.window_right = 0;
  if (which == 2 || which == 3) {
    c.batch = Batch::kVarlen;
    c.b = 2;
    c.seqlens_q = {30, 8};
    c.seqlens_kv = {25, 0};
  }
  if (which >= 4) c.bias = "1HSS";  // per-head bias: d_bias of heads 1..3 checked
  for (double bad : {double(NAN), double(INFINITY)}) {
    Config cb = c;
    cb.sinks[0] = bad;
    Problem base(c), odd(cb);
    SCOPED_TRACE(cb.describe() + " sinks[0] = " + std::to_string(bad));
    ASSERT_EQ(base.forward(), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(base.backward(), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(odd.forward(), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(odd.backward(), SINKATTN_OK) << sinkattn_last_error();
    const bool vl = base.varlen();
    auto not_head0 = [](int dim) { return [dim](const std::vector<int64_t>& i) { return i[dim] != 0; }; };
    EXPECT_EQ(bit_differences(odd.out, base.out, not_head0(vl ? 1 : 2)), 0) << "out of heads 1..";
    EXPECT_EQ(bit_differences(odd.lse, base.lse, not_head0(vl ? 0 : 1)), 0) << "softmax_lse of heads 1..";
    EXPECT_EQ(bit_differences(odd.dq, base.dq, not_head0(vl ? 1 : 2)), 0) << "dq of heads 1..";
    // Query head 0 reads KV head 0: dk, dv of the other KV heads.
    EXPECT_EQ(bit_differences(odd.dk, base.dk, not_head0(vl ? 1 : 2)), 0) << "dk of KV heads 1..";
    EXPECT_EQ(bit_differences(odd.dv, base.dv, not_head0(vl ? 1 : 2)), 0) << "dv of KV heads 1..";
    EXPECT_EQ(bit_differences(odd.d_sinks, base.d_sinks, not_head0(0)), 0) << "d_sinks of heads 1..";
    if (!c.bias.empty()) {
      EXPECT_EQ(bit_differences(odd.d_bias, base.d_bias, not_head0(1)), 0) << "d_bias of heads 1..";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, NonFiniteSink, ::testing::Range(0, 6));

}  // namespace
}  // namespace sinkattn::test

// Conformance of the CPU backend (and of the C ABI helpers bindings use) to the SPEC.md rules on sink values,
// key-less rows and varlen rows that belong to no sequence:
//   - a -inf sink makes its head vanilla in the forward and, in the backward, adds d_lse_i of each key-less row to
//     d_sinks[h] (SPEC.md 3, "Sink values"); -1e30 gives the same d_sinks and out;
//   - key-less rows get LSE = sigma exactly (0 for off_by_one, -inf for vanilla) (SPEC.md 2);
//   - varlen rows after cu_seqlens[b] are neither read nor written by a pass, and sinkattn_clear_unowned_rows
//     fills them with out = dq = dk = dv = 0, LSE = -inf (SPEC.md 1);
//   - a +inf or NaN sink in head 0 changes no bit of any other head's outputs (SPEC.md 3).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

HostTensor i32_tensor(const std::vector<int32_t>& xs) {
  HostTensor h = HostTensor::contiguous(SINKATTN_I32, {static_cast<int64_t>(xs.size())});
  std::memcpy(h.t.data, xs.data(), xs.size() * 4);
  return h;
}

// Rows with no visible key in every sequence: s_q > s_kv bottom-right causal (the first s_q - s_kv rows), plus a
// padded sequence with zero keys.
Config keyless_config(sinkattn_dtype_t dt) {
  Config c;
  c.b = 2;
  c.s_q = 12;
  c.s_kv = 7;
  c.h_q = 4;
  c.h_kv = 2;
  c.d = c.d_v = 16;
  c.dtype = dt;
  c.window_right = 0;
  c.batch = Batch::kPadded;
  c.seqlens_q = {12, 9};
  c.seqlens_kv = {7, 0};
  c.d_lse = true;
  return c;
}

class SinkValues : public ::testing::TestWithParam<sinkattn_dtype_t> {};

TEST_P(SinkValues, MinusInfinitySinkIsVanillaAndKeylessRowsAddDLse) {
  for (double low : {-double(INFINITY), -1e30}) {
    SCOPED_TRACE(low);
    Config c = keyless_config(GetParam());
    c.sinks = {low, 1.5, low, 20.0};
    Problem pb(c);
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(pb.backward(), SINKATTN_OK) << sinkattn_last_error();
    const ref::Array lse = pb.lse.read(), out = pb.out.read(), dls = pb.d_lse.read(), ds = pb.d_sinks.read();
    ASSERT_TRUE(no_nan(ds));
    for (int64_t h : {0, 2}) {
      double want = 0;  // sum of d_lse over the key-less (non-padding) rows of head h
      for (int64_t n = 0; n < c.b; ++n) {
        const int64_t lq = c.seqlens_q[n], lk = c.seqlens_kv[n];
        for (int64_t i = 0; i < lq; ++i) {
          const bool keyless = i + (lk - lq) < 0;  // bottom-right causal: key j <= i + lk - lq, none when < 0
          const double l = at(lse, {n, h, i});
          if (keyless) {
            want += at(dls, {n, h, i});
            EXPECT_EQ(l, static_cast<double>(static_cast<float>(low))) << "key-less row LSE must be sigma exactly (n " << n << " i " << i << ")";
            for (int64_t col = 0; col < c.d_v; ++col) EXPECT_EQ(at(out, {n, i, h, col}), 0.0);
          } else {
            EXPECT_TRUE(std::isfinite(l));
          }
        }
      }
      EXPECT_NEAR(ds.data[h], want, 1e-5 * std::max(1.0, std::fabs(want))) << "head " << h;
    }
    // The whole result against the float64 reference (which has the -inf rule too).
    for (const auto& r : check_against_reference(pb, /*backward=*/true)) EXPECT_TRUE(r.pass) << r.name;
  }
}

TEST_P(SinkValues, MinusInfinityAndMinusHugeAgree) {
  std::vector<std::vector<unsigned char>> outs, dsinks, dqs;
  for (double low : {-double(INFINITY), -1e30}) {
    Config c = keyless_config(GetParam());
    c.sinks = {low, 0.5, 2.0, low};
    Problem pb(c);
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
    ASSERT_EQ(pb.backward(), SINKATTN_OK) << sinkattn_last_error();
    outs.push_back(pb.out.bytes());
    dqs.push_back(pb.dq.bytes());
    dsinks.push_back(pb.d_sinks.bytes());
  }
  EXPECT_EQ(outs[0], outs[1]);
  EXPECT_EQ(dqs[0], dqs[1]);
  EXPECT_EQ(dsinks[0], dsinks[1]);
}

TEST_P(SinkValues, KeylessRowsLseIsExactlySigma) {
  for (sinkattn_softmax_type_t st :
       {SINKATTN_SOFTMAX_LEARNABLE, SINKATTN_SOFTMAX_OFF_BY_ONE, SINKATTN_SOFTMAX_VANILLA}) {
    SCOPED_TRACE(softmax_name(st));
    Config c = keyless_config(GetParam());
    c.softmax_type = st;
    c.sinks = {2.718281828, -3.3, 20.0, 0.1};
    Problem pb(c);
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
    const ref::Array lse = pb.lse.read(), sinks = pb.sinks.read();
    for (int64_t n = 0; n < c.b; ++n)
      for (int64_t h = 0; h < c.h_q; ++h)
        for (int64_t i = 0; i < c.seqlens_q[n]; ++i) {
          if (i + (c.seqlens_kv[n] - c.seqlens_q[n]) >= 0) continue;
          const double want = st == SINKATTN_SOFTMAX_LEARNABLE ? sinks.data[h]
                              : st == SINKATTN_SOFTMAX_OFF_BY_ONE ? 0.0
                                                                  : -INFINITY;
          EXPECT_EQ(at(lse, {n, h, i}), want) << "n " << n << " h " << h << " i " << i;
        }
  }
}

TEST_P(SinkValues, NonFiniteSinkLeavesOtherHeadsBitwiseUnchanged) {
  // MHA (h_kv = h_q): dk / dv of head 1..3 depend on their own query head only, so every output of the other
  // heads must be bit-identical whatever head 0's sink is.
  Config base = keyless_config(GetParam());
  base.h_kv = base.h_q;
  base.sinks = {1.0, 2.0, -0.5, 20.0};
  auto run = [&](double s0) {
    Config c = base;
    c.sinks[0] = s0;
    auto pb = std::make_unique<Problem>(c);
    EXPECT_EQ(pb->forward(), SINKATTN_OK) << sinkattn_last_error();
    EXPECT_EQ(pb->backward(), SINKATTN_OK) << sinkattn_last_error();
    return pb;
  };
  const auto ref_run = run(1.0);
  const ref::Result want = ref_run->actual(true);
  for (double bad : {std::numeric_limits<double>::quiet_NaN(), double(INFINITY)}) {
    SCOPED_TRACE(bad);
    const auto pb = run(bad);
    const ref::Result got = pb->actual(true);
    const auto same_heads = [&](const ref::Array& a, const ref::Array& b, int head_dim, const char* name) {
      ASSERT_EQ(a.shape, b.shape);
      int64_t inner = 1;
      for (size_t k = head_dim + 1; k < a.shape.size(); ++k) inner *= a.shape[k];
      const int64_t heads = a.shape[head_dim];
      for (int64_t e = 0; e < a.numel(); ++e) {
        if ((e / inner) % heads == 0) continue;
        const double x = a.data[e], y = b.data[e];
        EXPECT_TRUE(std::memcmp(&x, &y, sizeof x) == 0 || (std::isnan(x) && std::isnan(y)))
            << name << " element " << e << ": " << x << " vs " << y;
      }
    };
    same_heads(got.out, want.out, 2, "out");
    same_heads(got.softmax_lse, want.softmax_lse, 1, "softmax_lse");
    same_heads(got.dq, want.dq, 2, "dq");
    same_heads(got.dk, want.dk, 2, "dk");
    same_heads(got.dv, want.dv, 2, "dv");
    same_heads(got.d_sinks, want.d_sinks, 0, "d_sinks");
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, SinkValues, ::testing::Values(SINKATTN_F32, SINKATTN_BF16, SINKATTN_F16),
                         [](const ::testing::TestParamInfo<sinkattn_dtype_t>& i) { return dtype_name(i.param); });

// Varlen with rows of no sequence: the problem is built with three sequences, then cu_seqlens keep only the first
// two, so the third one's rows (of q, k, v and every output) lie after cu_seqlens[b].
struct TailProblem {
  std::unique_ptr<Problem> pb;
  HostTensor cq, ck;
  int64_t end_q = 0, end_kv = 0;
  explicit TailProblem(sinkattn_dtype_t dt) {
    Config c;
    c.batch = Batch::kVarlen;
    c.b = 3;
    c.h_q = 4;
    c.h_kv = 2;
    c.d = c.d_v = 16;
    c.dtype = dt;
    c.seqlens_q = {5, 3, 4};
    c.seqlens_kv = {6, 2, 5};
    c.window_left = 2;
    c.d_lse = true;
    pb = std::make_unique<Problem>(c);
    end_q = 8;
    end_kv = 8;
    cq = i32_tensor({0, 5, 8});
    ck = i32_tensor({0, 6, 8});
    pb->p.cu_seqlens_q = cq.t;
    pb->p.cu_seqlens_kv = ck.t;
  }
  // NaN in the tail rows of the inputs: they must not reach any output.
  void poison_input_tails() {
    for (HostTensor* t : {&pb->q, &pb->k, &pb->v, &pb->d_out}) {
      const bool q_like = t == &pb->q || t == &pb->d_out;
      ref::Array a = t->read();
      const int64_t first = q_like ? end_q : end_kv, per_row = a.numel() / a.shape[0];
      for (int64_t e = first * per_row; e < a.numel(); ++e) a.data[e] = std::numeric_limits<double>::quiet_NaN();
      t->write(a);
    }
  }
};

// Bytes of rows [first, rows) of a q-like tensor ([rows, heads, cols], contiguous) or of softmax_lse ([h, rows]).
std::vector<unsigned char> tail_bytes(const HostTensor& t, int64_t first, bool lse) {
  const size_t es = dtype_size(t.t.dtype);
  std::vector<unsigned char> out;
  const unsigned char* base = static_cast<const unsigned char*>(t.t.data);
  if (lse) {
    for (int64_t h = 0; h < t.t.shape[0]; ++h)
      for (int64_t r = first; r < t.t.shape[1]; ++r) {
        const unsigned char* p = base + (h * t.t.strides[0] + r * t.t.strides[1]) * es;
        out.insert(out.end(), p, p + es);
      }
  } else {
    const size_t row = static_cast<size_t>(t.t.strides[0]) * es;
    out.assign(base + first * row, base + t.t.shape[0] * row);
  }
  return out;
}

class UnownedRows : public ::testing::TestWithParam<sinkattn_dtype_t> {};

TEST_P(UnownedRows, PassesNeitherReadNorWriteThem) {
  TailProblem tp(GetParam());
  tp.poison_input_tails();
  Problem& pb = *tp.pb;
  ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();  // outputs poisoned (NaN) before the call
  pb.poison_backward_outputs();
  const auto before_out = tail_bytes(pb.out, tp.end_q, false), before_lse = tail_bytes(pb.lse, tp.end_q, true);
  ASSERT_EQ(pb.backward(), SINKATTN_OK) << sinkattn_last_error();
  EXPECT_EQ(tail_bytes(pb.out, tp.end_q, false), before_out);
  EXPECT_EQ(tail_bytes(pb.lse, tp.end_q, true), before_lse);
  HostTensor poisoned = HostTensor::contiguous(pb.dq.t.dtype, pb.dq.shape());  // NaN pattern of the same shape
  EXPECT_EQ(tail_bytes(pb.dq, tp.end_q, false), tail_bytes(poisoned, tp.end_q, false)) << "dq tail was written";
  HostTensor poisoned_kv = HostTensor::contiguous(pb.dk.t.dtype, pb.dk.shape());
  EXPECT_EQ(tail_bytes(pb.dk, tp.end_kv, false), tail_bytes(poisoned_kv, tp.end_kv, false)) << "dk tail was written";
  EXPECT_EQ(tail_bytes(pb.dv, tp.end_kv, false), tail_bytes(poisoned_kv, tp.end_kv, false)) << "dv tail was written";
  // The rows of the two sequences: finite and right (NaN in the tails reached nothing).
  const ref::Array out = pb.out.read(), dq = pb.dq.read(), dk = pb.dk.read();
  const int64_t qrow = out.numel() / out.shape[0], krow = dk.numel() / dk.shape[0];
  for (int64_t e = 0; e < tp.end_q * qrow; ++e) ASSERT_TRUE(std::isfinite(out.data[e]) && std::isfinite(dq.data[e]));
  for (int64_t e = 0; e < tp.end_kv * krow; ++e) ASSERT_TRUE(std::isfinite(dk.data[e]));
  ASSERT_TRUE(no_nan(pb.d_sinks.read()));
}

TEST_P(UnownedRows, ClearHelperFillsExactlyThem) {
  TailProblem tp(GetParam());
  Problem& pb = *tp.pb;
  ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  ASSERT_EQ(pb.backward(), SINKATTN_OK) << sinkattn_last_error();
  const auto owned_out = pb.out.bytes(), owned_dq = pb.dq.bytes();
  ASSERT_EQ(sinkattn_clear_unowned_rows(&pb.p, 0), SINKATTN_OK) << sinkattn_last_error();
  ASSERT_EQ(sinkattn_clear_unowned_rows(&pb.p, 1), SINKATTN_OK) << sinkattn_last_error();
  const ref::Array out = pb.out.read(), lse = pb.lse.read(), dq = pb.dq.read(), dk = pb.dk.read(), dv = pb.dv.read();
  const auto rows_equal = [](const ref::Array& a, int64_t from, double v) {
    const int64_t per = a.numel() / a.shape[0];
    for (int64_t e = from * per; e < a.numel(); ++e)
      if (!(a.data[e] == v)) return false;
    return true;
  };
  EXPECT_TRUE(rows_equal(out, tp.end_q, 0.0));
  EXPECT_TRUE(rows_equal(dq, tp.end_q, 0.0));
  EXPECT_TRUE(rows_equal(dk, tp.end_kv, 0.0));
  EXPECT_TRUE(rows_equal(dv, tp.end_kv, 0.0));
  for (int64_t h = 0; h < lse.shape[0]; ++h)
    for (int64_t r = tp.end_q; r < lse.shape[1]; ++r) EXPECT_EQ(at(lse, {h, r}), -INFINITY);
  // Rows of the sequences are untouched by the helper.
  const size_t qrow_bytes = static_cast<size_t>(pb.out.t.strides[0]) * dtype_size(pb.out.t.dtype);
  EXPECT_TRUE(std::equal(owned_out.begin(), owned_out.begin() + tp.end_q * qrow_bytes, pb.out.bytes().begin()));
  EXPECT_TRUE(std::equal(owned_dq.begin(), owned_dq.begin() + tp.end_q * qrow_bytes, pb.dq.bytes().begin()));
}

TEST(UnownedRowsHelper, DenseIsANoOpAndInvalidCallsAreRefused) {
  Config c;
  Problem pb(c);
  ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  const auto out = pb.out.bytes();
  EXPECT_EQ(sinkattn_clear_unowned_rows(&pb.p, 0), SINKATTN_OK);
  EXPECT_EQ(pb.out.bytes(), out);
  sinkattn_params_t bad = pb.p;
  bad.k.shape[2] = 3;  // h_q % h_kv != 0
  EXPECT_EQ(sinkattn_clear_unowned_rows(&bad, 0), SINKATTN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sinkattn_last_error()).find("h_kv"), std::string::npos) << sinkattn_last_error();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, UnownedRows, ::testing::Values(SINKATTN_F32, SINKATTN_BF16, SINKATTN_F16),
                         [](const ::testing::TestParamInfo<sinkattn_dtype_t>& i) { return dtype_name(i.param); });

}  // namespace
}  // namespace sinkattn::test

// Tests of the float64 reference itself (no library): known answers computed by hand from SPEC.md sections
// 2-3, Random123's Philox known-answer vectors, the fp16/bf16 conversions, and central finite differences of
// every gradient of the reference in float64 (loss = sum(out * g) + sum(lse * g_lse), SPEC.md section 3).
#define SINKATTN_TEST_NO_LIBRARY 1
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

TEST(Reference, PhiloxKnownAnswers) {
  for (const PhiloxKat& k : kPhiloxKnownAnswers) {
    uint32_t out[4];
    ref::philox4x32_10(k.ctr, k.key, out);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out[w], k.want[w]) << "word " << w;
  }
}

TEST(Reference, DropoutThreshold) {
  // threshold = min(floor(p * 2^32), 2^32 - 1)
  EXPECT_EQ(ref::dropout_threshold(0.0), 0u);
  EXPECT_EQ(ref::dropout_threshold(0.5), 0x80000000u);
  EXPECT_EQ(ref::dropout_threshold(0.25), 0x40000000u);
  EXPECT_EQ(ref::dropout_threshold(1e-12), 0u);                 // floor(0.0043) = 0
  EXPECT_EQ(ref::dropout_threshold(1.0 / 4294967296.0), 1u);    // exactly one
  EXPECT_EQ(ref::dropout_threshold(0.9999999999999999), 0xFFFFFFFFu);
  // p = 0: everything is kept.
  for (int j = 0; j < 64; ++j) EXPECT_TRUE(ref::dropout_keep(1, 2, 0, 0, 0, j, 1, 1, 64, 0.0));
}

TEST(Reference, DropoutKeepUsesSpecIndex) {
  // keep(seed, offset, n, h, i, j) = words[idx % 4] >= threshold with idx = ((n*h_q + h)*max_s_q + i)*max_s_kv + j
  const uint64_t seed = 0x123456789abcdefull, offset = 0xfedcba9876543210ull;
  const int64_t n = 1, h = 2, i = 3, j = 5, h_q = 4, sq = 7, skv = 9;
  const uint64_t idx = ((n * h_q + h) * sq + i) * skv + j;
  const uint64_t ctr = idx / 4;
  const uint32_t c[4] = {uint32_t(ctr), uint32_t(ctr >> 32), uint32_t(offset), uint32_t(offset >> 32)};
  const uint32_t key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  uint32_t w[4];
  ref::philox4x32_10(c, key, w);
  const double p = 0.3;
  EXPECT_EQ(ref::dropout_keep(seed, offset, n, h, i, j, h_q, sq, skv, p), w[idx % 4] >= ref::dropout_threshold(p));
  // The kept fraction is close to 1 - p.
  int kept = 0, total = 0;
  for (int64_t jj = 0; jj < 20000; ++jj, ++total) kept += ref::dropout_keep(seed, offset, 0, 0, 0, jj, 1, 1, 20000, p);
  EXPECT_NEAR(double(kept) / total, 0.7, 0.02);
}

TEST(Reference, HalfAndBfloatConversions) {
  EXPECT_EQ(ref::double_to_half(1.0), 0x3c00);
  EXPECT_EQ(ref::double_to_half(-2.0), 0xc000);
  EXPECT_EQ(ref::double_to_half(65504.0), 0x7bff);
  EXPECT_EQ(ref::double_to_half(65520.0), 0x7c00);  // rounds to inf (ties to even)
  EXPECT_EQ(ref::double_to_half(65519.0), 0x7bff);
  EXPECT_EQ(ref::double_to_half(std::ldexp(1.0, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(ref::double_to_half(std::ldexp(1.0, -25)), 0x0000);  // tie to even -> 0
  EXPECT_EQ(ref::double_to_half(1.0 + std::ldexp(1.0, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(ref::double_to_half(1.0 + 3 * std::ldexp(1.0, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(ref::half_to_double(0x3555), 0.333251953125);
  EXPECT_TRUE(std::isinf(ref::half_to_double(0x7c00)));
  EXPECT_TRUE(std::isnan(ref::half_to_double(0x7e00)));
  EXPECT_EQ(ref::half_to_double(0x0001), std::ldexp(1.0, -24));
  EXPECT_EQ(ref::double_to_bf16(1.0), 0x3f80);
  EXPECT_EQ(ref::double_to_bf16(1.0 + std::ldexp(1.0, -8)), 0x3f80);      // tie -> even
  EXPECT_EQ(ref::double_to_bf16(1.0 + 3 * std::ldexp(1.0, -8)), 0x3f82);  // tie -> even (up)
  EXPECT_EQ(ref::bf16_to_double(0x3eab), 0.333984375);
  EXPECT_TRUE(std::isnan(ref::bf16_to_double(ref::double_to_bf16(NAN))));
  // Round trip of every half.
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const double x = ref::half_to_double(uint16_t(b));
    if (std::isnan(x)) continue;
    ASSERT_EQ(ref::double_to_half(x), b) << b;
  }
}

TEST(Reference, RelativeError) {
  ref::Array a, r;
  a.shape = r.shape = {4};
  r.data = {1, -2, -INFINITY, NAN};
  a.data = {1.5, -2, -INFINITY, 3};
  EXPECT_DOUBLE_EQ(ref::relative_error(a, r), 0.25);
  a.data[3] = NAN;  // unspecified position, but NaN is never allowed
  EXPECT_TRUE(std::isinf(ref::relative_error(a, r)));
  a.data[3] = -INFINITY;
  a.data[2] = 0;  // -inf expected
  EXPECT_TRUE(std::isinf(ref::relative_error(a, r)));
}

// SPEC.md section 5's table: fp16 / bf16 are bounded by 2x the plain evaluation's error + 1e-3; fp32 by fixed bounds,
// with a plain fp32 evaluation's error (when one is given) only reported. Positions the float64 reference leaves
// unspecified (NaN) are not part of the plain evaluation's error.
TEST(Reference, ErrorTableTolerances) {
  ref::Result actual, ref64, lowp;
  for (ref::Result* r : {&actual, &ref64, &lowp}) r->dq.shape = {3};
  ref64.dq.data = {1, -2, NAN};
  lowp.dq.data = {1.5, -2, NAN};  // err 0.25
  actual.dq.data = {1, -2.8, 0};  // err 0.4
  const auto half = ref::error_table(actual, ref64, lowp, SINKATTN_F16);
  ASSERT_EQ(half.size(), 1u);
  EXPECT_DOUBLE_EQ(half[0].lowp_err, 0.25);
  EXPECT_DOUBLE_EQ(half[0].tolerance, 2 * 0.25 + 1e-3);
  EXPECT_TRUE(half[0].pass);
  // fp32 (SPEC.md section 5): the fixed bound, or twice the plain fp32 evaluation's error where that is larger
  const auto f32 = ref::error_table(actual, ref64, lowp, SINKATTN_F32);
  EXPECT_DOUBLE_EQ(f32[0].lowp_err, 0.25);
  EXPECT_DOUBLE_EQ(f32[0].tolerance, 2 * 0.25);
  EXPECT_TRUE(f32[0].pass);
  ref::Result close = lowp;
  close.dq.data = {1 + 2e-6, -2, NAN};  // plain err 1e-6: the fixed bound holds
  const auto f32_fixed = ref::error_table(actual, ref64, close, SINKATTN_F32);
  EXPECT_DOUBLE_EQ(f32_fixed[0].tolerance, 1e-4);
  EXPECT_FALSE(f32_fixed[0].pass);
  const auto f32_alone = ref::error_table(actual, ref64, ref::Result{}, SINKATTN_F32);
  EXPECT_EQ(f32_alone[0].lowp_err, 0);
  EXPECT_DOUBLE_EQ(f32_alone[0].tolerance, 1e-4);
}

// One row, two keys, learnable sink, every value by hand.
TEST(Reference, HandComputedRow) {
  Config c;
  c.b = 1; c.s_q = 1; c.s_kv = 2; c.h_q = 1; c.h_kv = 1; c.d = 8; c.d_v = 8;
  c.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  c.sinks = {0.7};
  c.d_lse = true;
  Problem pb(c);
  const ref::Array q = pb.q.read(), k = pb.k.read(), v = pb.v.read(), g = pb.d_out.read(), gl = pb.d_lse.read();
  const double scale = 1 / std::sqrt(8.0), sigma = pb.sinks.read().data[0];
  double s[2];
  for (int j = 0; j < 2; ++j) {
    double dot = 0;
    for (int c2 = 0; c2 < 8; ++c2) dot += q.data[c2] * k.data[j * 8 + c2];
    s[j] = scale * dot;
  }
  const double lse = std::log(std::exp(sigma) + std::exp(s[0]) + std::exp(s[1]));
  const double P[2] = {std::exp(s[0] - lse), std::exp(s[1] - lse)};
  const ref::Result r = pb.reference(true);
  EXPECT_NEAR(r.softmax_lse.data[0], lse, 1e-14);
  double D = 0, dP[2] = {0, 0};
  for (int c2 = 0; c2 < 8; ++c2) {
    const double o = P[0] * v.data[c2] + P[1] * v.data[8 + c2];
    EXPECT_NEAR(r.out.data[c2], o, 1e-14);
    D += g.data[c2] * static_cast<float>(o);  // D from the stored (fp32) output
    dP[0] += g.data[c2] * v.data[c2];
    dP[1] += g.data[c2] * v.data[8 + c2];
  }
  const double dS[2] = {P[0] * (dP[0] - D + gl.data[0]), P[1] * (dP[1] - D + gl.data[0])};
  for (int c2 = 0; c2 < 8; ++c2) {
    EXPECT_NEAR(r.dq.data[c2], scale * (dS[0] * k.data[c2] + dS[1] * k.data[8 + c2]), 1e-13);
    EXPECT_NEAR(r.dk.data[c2], scale * dS[0] * q.data[c2], 1e-13);
    EXPECT_NEAR(r.dv.data[8 + c2], P[1] * g.data[c2], 1e-13);
  }
  EXPECT_NEAR(r.d_sinks.data[0], std::exp(sigma - lse) * (gl.data[0] - D), 1e-13);
}

// edge-cases.json "off-by-one-definition": all logits 10, 4 keys: each P = e^10 / (1 + 4 e^10).
TEST(Reference, OffByOneDefinition) {
  Config c;
  c.b = 1; c.s_q = 1; c.s_kv = 4; c.h_q = 1; c.h_kv = 1; c.d = 8; c.d_v = 8;
  c.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE;
  c.softmax_scale = 1.0f;
  Problem pb(c);
  ref::Array q = pb.q.read(), k = pb.k.read();
  std::fill(q.data.begin(), q.data.end(), 0.0);
  std::fill(k.data.begin(), k.data.end(), 0.0);
  q.data[0] = 10;
  for (int j = 0; j < 4; ++j) k.data[j * 8] = 1;
  pb.q.write(q);
  pb.k.write(k);
  const ref::Array v = pb.v.read();
  const ref::Result r = pb.reference(false);
  const double P = std::exp(10.0) / (1 + 4 * std::exp(10.0));
  for (int c2 = 0; c2 < 8; ++c2) {
    double o = 0;
    for (int j = 0; j < 4; ++j) o += P * v.data[j * 8 + c2];
    EXPECT_NEAR(r.out.data[c2], o, 1e-13);
  }
  EXPECT_NEAR(r.softmax_lse.data[0], std::log(1 + 4 * std::exp(10.0)), 1e-13);
}

// Masks: the reference sees exactly the keys SPEC.md section 2 names (bottom-right causal, s_q < s_kv).
TEST(Reference, MaskVisibility) {
  Config c;
  c.b = 1; c.s_q = 3; c.s_kv = 6; c.h_q = 1; c.h_kv = 1; c.d = 8; c.d_v = 8;
  c.softmax_type = SINKATTN_SOFTMAX_VANILLA;
  c.window_left = 1; c.window_right = 0;
  Problem pb(c);
  // Make every v row a one-hot code of its key index so out reveals the weights.
  ref::Array v = pb.v.read();
  std::fill(v.data.begin(), v.data.end(), 0.0);
  for (int j = 0; j < 6; ++j) v.data[j * 8 + j] = 1;
  pb.v.write(v);
  const ref::Result r = pb.reference(false);
  // off = 3: row i sees keys i+2 .. i+3.
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 6; ++j) {
      const double w = r.out.data[i * 8 + j];
      if (j == i + 2 || j == i + 3) {
        EXPECT_GT(w, 0) << i << "," << j;
      } else {
        EXPECT_EQ(w, 0) << i << "," << j;
      }
    }
}

// Central differences of the reference's own gradients, in float64 (inputs stored in fp32; the actual
// perturbation is the difference of the stored values).
struct FdCase {
  const char* name;
  Config cfg;
};

class ReferenceFiniteDifference : public ::testing::TestWithParam<int> {};

Config fd_config(int which) {
  Config c;
  c.b = 2; c.s_q = 5; c.s_kv = 6; c.h_q = 4; c.h_kv = 2; c.d = 8; c.d_v = 8;
  c.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  c.sinks = {std::log(6.0), 1.5, -0.5, 0.3};
  c.d_lse = true;
  c.data_seed = 7 + which;
  switch (which) {
    case 0: break;
    case 1: c.bias = "B1SS"; c.window_left = 2; c.window_right = 0; break;
    case 2: c.batch = Batch::kPadded; c.seqlens_q = {5, 3}; c.seqlens_kv = {6, 2}; c.bias = "1HSS"; break;
    case 3: c.batch = Batch::kVarlen; c.seqlens_q = {3, 0, 4}; c.seqlens_kv = {4, 2, 5}; c.b = 3;
            c.window_right = 0; c.alignment = SINKATTN_ALIGN_TOP_LEFT; break;
    case 4: c.d_v = 16; c.h_kv = 1; c.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE; c.bias = "11SS"; break;
  }
  return c;
}

double loss(const Problem& pb, const ref::Result& r) {
  const ref::Array g = pb.d_out.read(), gl = pb.d_lse.read();
  double l = 0;
  for (size_t x = 0; x < g.data.size(); ++x) l += r.out.data[x] * g.data[x];
  for (size_t x = 0; x < gl.data.size(); ++x)
    if (std::isfinite(r.softmax_lse.data[x])) l += r.softmax_lse.data[x] * gl.data[x];
  return l;
}

TEST_P(ReferenceFiniteDifference, EveryGradient) {
  Problem pb(fd_config(GetParam()));
  const ref::Result an = pb.reference(true);
  for (const GradInput& in : gradient_inputs(pb, an)) {
    const std::vector<double> fd = central_differences(*in.t, 1e-3, [&] { return loss(pb, pb.reference(false)); });
    double max_grad = 0, max_diff = 0;
    for (double g : in.grad->data) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t e = 0; e < fd.size(); ++e) max_diff = std::max(max_diff, std::fabs(fd[e] - in.grad->data[e]));
    EXPECT_LE(max_diff, 1e-5 * std::max(max_grad, 1.0)) << in.name << " (max |grad| " << max_grad << ")";
    EXPECT_GT(max_grad, 0) << in.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, ReferenceFiniteDifference, ::testing::Range(0, 5));

// Padding rows: out 0, LSE unspecified (NaN in the reference), gradients 0; their d_out / d_lse are never read.
TEST(Reference, PaddingRowsIgnoreTheirInputs) {
  Config c;
  c.batch = Batch::kPadded;
  c.seqlens_q = {16, 5};
  c.seqlens_kv = {16, 7};
  c.d_lse = true;
  Problem pb(c);
  const ref::Result clean = pb.reference(true);
  ref::Array g = pb.d_out.read(), q = pb.q.read(), k = pb.k.read();
  for (int64_t i = 5; i < 16; ++i)
    for (int64_t x = 0; x < c.h_q * c.d_v; ++x) g.data[(16 + i) * c.h_q * c.d_v + x] = NAN;
  for (int64_t i = 5; i < 16; ++i)
    for (int64_t x = 0; x < c.h_q * c.d; ++x) q.data[(16 + i) * c.h_q * c.d + x] = INFINITY;
  for (int64_t j = 7; j < 16; ++j)
    for (int64_t x = 0; x < c.h_kv * c.d; ++x) k.data[(16 + j) * c.h_kv * c.d + x] = NAN;
  pb.d_out.write(g);
  pb.q.write(q);
  pb.k.write(k);
  const ref::Result dirty = pb.reference(true);
  EXPECT_EQ(ref::relative_error(dirty.out, clean.out), 0);
  EXPECT_EQ(ref::relative_error(dirty.dq, clean.dq), 0);
  EXPECT_EQ(ref::relative_error(dirty.dk, clean.dk), 0);
  EXPECT_EQ(ref::relative_error(dirty.d_sinks, clean.d_sinks), 0);
  EXPECT_TRUE(std::isnan(at(clean.softmax_lse, {1, 0, 10})));
  EXPECT_EQ(at(clean.out, {1, 10, 0, 0}), 0);
  EXPECT_EQ(at(clean.dk, {1, 10, 0, 0}), 0);
}

}  // namespace
}  // namespace sinkattn::test

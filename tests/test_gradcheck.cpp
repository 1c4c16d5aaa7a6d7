// Central finite differences of every gradient of the CPU backend (fp32): q, k, v, sinks, bias, and the d_lse
// path. Loss (SPEC.md section 3 / edge-cases README): L = sum(out * g) + sum(lse * g_lse), accumulated in
// float64 from the library's fp32 forward outputs; the analytic gradient is the library's backward with
// d_out = g, d_lse = g_lse.
//
// Tolerance: step h = 1e-2 (the actual step is the difference of the stored fp32 values). The truncation
// error of a central difference is O(h^2 * L''') ~ 1e-4 here and the fp32 noise of L is ~1e-6 / (2h) ~ 5e-5,
// so |fd - analytic| <= 2e-3 * max(1, max|analytic|) separates rounding from a wrong formula (a missing
// or wrong term moves gradients by O(0.1 .. 1)).
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

Config fd_config(int which) {
  Config c;
  c.dtype = SINKATTN_F32;
  c.b = 2;
  c.s_q = 5;
  c.s_kv = 7;
  c.h_q = 4;
  c.h_kv = 2;
  c.d = 8;
  c.d_v = 8;
  c.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  c.sinks = {std::log(7.0), 1.0, -0.5, 2.0};  // sinks near log(s_kv): P_sink is large, d_sinks is visible
  c.d_lse = true;
  c.num_threads = 1;
  c.data_seed = 300 + which;
  switch (which) {
    case 0:  // dense, window, B1SS bias
      c.bias = "B1SS";
      c.window_left = 3;
      c.window_right = 0;
      break;
    case 1:  // padded, BHSS bias, top-left causal
      c.batch = Batch::kPadded;
      c.seqlens_q = {5, 3};
      c.seqlens_kv = {7, 2};
      c.bias = "BHSS";
      c.window_right = 0;
      c.alignment = SINKATTN_ALIGN_TOP_LEFT;
      break;
    case 2:  // varlen GQA with a zero-length sequence
      c.batch = Batch::kVarlen;
      c.b = 3;
      c.seqlens_q = {4, 0, 5};
      c.seqlens_kv = {6, 3, 7};
      c.window_left = 4;
      c.window_right = 1;
      break;
    case 3:  // MQA, d != d_v, 1HSS bias, dropout (the keep mask is fixed by seed/offset)
      c.h_kv = 1;
      c.d_v = 16;
      c.bias = "1HSS";
      c.dropout_p = 0.2;
      c.seed = 17;
      c.offset = 4;
      break;
    case 4:  // off_by_one, 11SS bias
      c.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE;
      c.bias = "11SS";
      break;
  }
  return c;
}

double loss(Problem& pb) {
  EXPECT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  const ref::Array out = pb.out.read(), lse = pb.lse.read(), g = pb.d_out.read(), gl = pb.d_lse.read();
  double l = 0;
  for (size_t x = 0; x < g.data.size(); ++x) l += out.data[x] * g.data[x];
  // LSE of padding rows is unspecified (no gradient flows from it): only rows of a sequence count.
  for (int64_t n = 0; n < pb.cfg.b; ++n)
    for (int64_t h = 0; h < pb.cfg.h_q; ++h)
      for (int64_t i = 0; i < pb.len_q(n); ++i) {
        const size_t idx = pb.varlen() ? size_t(h * pb.total_q + pb.q_row(n, i))
                                       : size_t((n * pb.cfg.h_q + h) * pb.cfg.s_q + i);
        if (std::isfinite(lse.data[idx])) l += lse.data[idx] * gl.data[idx];
      }
  return l;
}

class GradCheck : public ::testing::TestWithParam<int> {};

TEST_P(GradCheck, FiniteDifferences) {
  Problem pb(fd_config(GetParam()));
  // Padding rows of g_lse / g would be ignored by the backward anyway; the loss above skips them too.
  ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  ASSERT_EQ(pb.backward(), SINKATTN_OK) << sinkattn_last_error();
  const ref::Result an = pb.actual(true);
  const double h = 1e-2;
  for (const GradInput& in : gradient_inputs(pb, an)) {
    const std::vector<double> fd = central_differences(*in.t, h, [&] { return loss(pb); });
    double max_grad = 0, max_diff = 0;
    size_t worst = 0;
    for (double g : in.grad->data) max_grad = std::max(max_grad, std::fabs(g));
    for (size_t e = 0; e < fd.size(); ++e) {
      const double diff = std::fabs(fd[e] - in.grad->data[e]);
      if (!(diff <= max_diff)) {
        max_diff = diff;
        worst = e;
      }
    }
    EXPECT_LE(max_diff, 2e-3 * std::max(1.0, max_grad))
        << in.name << ": worst element " << worst << " analytic " << in.grad->data[worst] << " (max |grad| "
        << max_grad << ")\n"
        << pb.cfg.describe();
    EXPECT_GT(max_grad, 1e-3) << in.name << " gradient is (almost) zero: the check would be vacuous";
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, GradCheck, ::testing::Range(0, 5));

}  // namespace
}  // namespace sinkattn::test

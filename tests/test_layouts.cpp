// SPEC.md section 1: tensors are strided views (BSHD, SBHD, BHSD, packed QKV / KV buffers, padded strides):
// every layout gives the same results as the contiguous call, and matches the float64 reference.
#include <gtest/gtest.h>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

// Copies `src` into a new strided tensor whose storage holds `storage_elems` elements (poisoned with NaN
// outside the view), with the given strides and element offset.
HostTensor restride(const HostTensor& src, const std::vector<int64_t>& strides, int64_t storage_elems, int64_t offset) {
  HostTensor owner = HostTensor::contiguous(src.t.dtype, {storage_elems});
  HostTensor v = HostTensor::view(owner, src.shape(), strides, offset);
  v.write(src.read());
  return v;
}

// The same values as `src` in the same logical shape, stored with every dimension's stride padded (last dim
// contiguous): rows of length shape[-1] + 8, the other strides in reverse order with one extra slot.
HostTensor padded_strides(const HostTensor& src) {
  const auto shape = src.shape();
  std::vector<int64_t> strides(shape.size());
  int64_t s = 1;
  for (int r = static_cast<int>(shape.size()) - 1; r >= 0; --r) {
    strides[r] = s;
    s = s * (r == static_cast<int>(shape.size()) - 1 ? shape[r] + 8 : shape[r] + 1);
  }
  return restride(src, strides, s + 3, 3);
}

void expect_same_values(const ref::Result& a, const ref::Result& b, const std::string& what) {
  // The layout changes no arithmetic: every output value is identical to the contiguous call's.
  EXPECT_EQ(ref::relative_error(a.out, b.out), 0) << what << " out";
  EXPECT_EQ(ref::relative_error(a.softmax_lse, b.softmax_lse), 0) << what << " softmax_lse";
  if (!b.dq.empty()) {
    EXPECT_EQ(ref::relative_error(a.dq, b.dq), 0) << what << " dq";
    EXPECT_EQ(ref::relative_error(a.dk, b.dk), 0) << what << " dk";
    EXPECT_EQ(ref::relative_error(a.dv, b.dv), 0) << what << " dv";
  }
  if (!b.d_sinks.empty()) {
    EXPECT_LE(ref::relative_error(a.d_sinks, b.d_sinks), 1e-6) << what << " d_sinks";
  }
}

using LayoutParam = std::tuple<Layout, sinkattn_dtype_t>;
class Layouts : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(Layouts, SameAsContiguous) {
  const auto [layout, dt] = GetParam();
  Config c;
  c.dtype = dt;
  c.s_q = 14;
  c.s_kv = layout == Layout::kPackedQKV ? 14 : 19;
  c.h_q = 4;
  c.h_kv = layout == Layout::kPackedQKV ? 4 : 2;
  c.d = c.d_v = 32;
  c.window_left = 7;
  c.window_right = 0;
  c.d_lse = true;
  c.data_seed = 5;
  Problem contiguous(c);
  check_against_reference(contiguous, true);
  c.layout = layout;
  Problem strided(c);
  // Same values in the new layout.
  strided.q.write(contiguous.q.read());
  strided.k.write(contiguous.k.read());
  strided.v.write(contiguous.v.read());
  strided.d_out.write(contiguous.d_out.read());
  strided.d_lse.write(contiguous.d_lse.read());
  strided.sinks.write(contiguous.sinks.read());
  if (layout != Layout::kBSHD) {  // the layout really differs (k is strided in every non-BSHD layout)
    EXPECT_NE(std::vector<int64_t>(strided.p.k.strides, strided.p.k.strides + 4),
              std::vector<int64_t>(contiguous.p.k.strides, contiguous.p.k.strides + 4));
  }
  check_against_reference(strided, true);
  expect_same_values(strided.actual(true), contiguous.actual(true), layout_name(layout));
}

INSTANTIATE_TEST_SUITE_P(All, Layouts,
                         ::testing::Combine(::testing::Values(Layout::kBSHD, Layout::kSBHD, Layout::kBHSD,
                                                              Layout::kPackedQKV, Layout::kPackedKV),
                                            ::testing::Values(SINKATTN_F32, SINKATTN_BF16)),
                         [](const ::testing::TestParamInfo<LayoutParam>& i) {
                           return std::string(layout_name(std::get<0>(i.param))) + "_" +
                                  dtype_name(std::get<1>(i.param));
                         });

// Every tensor (inputs, outputs, LSE, bias, d_bias, sinks, batch tensors) with padded strides.
TEST(Layouts2, EveryTensorPaddedStrides) {
  for (auto dt : {SINKATTN_F32, SINKATTN_F16}) {
    Config c;
    c.dtype = dt;
    c.bias = "B1SS";
    c.batch = Batch::kPadded;
    c.seqlens_q = {16, 9};
    c.seqlens_kv = {16, 11};
    c.d_lse = true;
    c.window_left = 5;
    c.window_right = 1;
    Problem contiguous(c);
    check_against_reference(contiguous, true);
    Problem pb(c);
    for (HostTensor* t : {&pb.q, &pb.k, &pb.v, &pb.out, &pb.lse, &pb.d_out, &pb.d_lse, &pb.dq,
                          &pb.dk, &pb.dv, &pb.bias, &pb.d_bias, &pb.sinks, &pb.d_sinks, &pb.seqlens_q,
                          &pb.seqlens_kv})
      *t = padded_strides(*t);
    pb.p.q = pb.q.t; pb.p.k = pb.k.t; pb.p.v = pb.v.t; pb.p.out = pb.out.t; pb.p.softmax_lse = pb.lse.t;
    pb.p.d_out = pb.d_out.t; pb.p.d_lse = pb.d_lse.t; pb.p.dq = pb.dq.t; pb.p.dk = pb.dk.t; pb.p.dv = pb.dv.t;
    pb.p.bias = pb.bias.t; pb.p.d_bias = pb.d_bias.t; pb.p.sinks = pb.sinks.t; pb.p.d_sinks = pb.d_sinks.t;
    pb.p.seqlens_q = pb.seqlens_q.t; pb.p.seqlens_kv = pb.seqlens_kv.t;
    check_against_reference(pb, true);
    ref::Result a = pb.actual(true), b = contiguous.actual(true);
    expect_same_values(a, b, "padded strides");
    EXPECT_LE(ref::relative_error(a.d_bias, b.d_bias), 1e-6);
  }
}

// Varlen (THD) with one packed QKV buffer [total, 3, h, d] and with the head-major layout [h, total, d].
TEST(Layouts2, VarlenPackedQkvAndHeadMajor) {
  Config c;
  c.dtype = SINKATTN_BF16;
  c.batch = Batch::kVarlen;
  c.b = 3;
  c.seqlens_q = {5, 0, 11};
  c.seqlens_kv = {5, 0, 11};
  c.h_q = c.h_kv = 2;
  c.d = c.d_v = 16;
  c.window_right = 0;
  c.d_lse = true;
  Problem contiguous(c);
  check_against_reference(contiguous, true);

  Problem packed(c);
  const int64_t T = packed.total_q, H = c.h_q, D = c.d;
  HostTensor buf = HostTensor::contiguous(c.dtype, {T, 3, H, D});
  const std::vector<int64_t> st = {3 * H * D, D, 1};
  packed.q = HostTensor::view(buf, {T, H, D}, st, 0);
  packed.k = HostTensor::view(buf, {T, H, D}, st, H * D);
  packed.v = HostTensor::view(buf, {T, H, D}, st, 2 * H * D);
  packed.q.write(contiguous.q.read());
  packed.k.write(contiguous.k.read());
  packed.v.write(contiguous.v.read());
  HostTensor gbuf = HostTensor::contiguous(c.dtype, {T, 3, H, D});
  packed.dq = HostTensor::view(gbuf, {T, H, D}, st, 0);
  packed.dk = HostTensor::view(gbuf, {T, H, D}, st, H * D);
  packed.dv = HostTensor::view(gbuf, {T, H, D}, st, 2 * H * D);
  packed.p.q = packed.q.t; packed.p.k = packed.k.t; packed.p.v = packed.v.t;
  packed.p.dq = packed.dq.t; packed.p.dk = packed.dk.t; packed.p.dv = packed.dv.t;
  check_against_reference(packed, true);
  expect_same_values(packed.actual(true), contiguous.actual(true), "varlen packed QKV");

  Problem head_major(c);
  for (HostTensor* t : {&head_major.q, &head_major.k, &head_major.v, &head_major.out, &head_major.d_out,
                        &head_major.dq, &head_major.dk, &head_major.dv}) {
    const auto sh = t->shape();  // [rows, h, d]
    *t = restride(*t, {sh[2], sh[0] * sh[2], 1}, sh[0] * sh[1] * sh[2], 0);
  }
  head_major.q.write(contiguous.q.read());
  head_major.k.write(contiguous.k.read());
  head_major.v.write(contiguous.v.read());
  head_major.d_out.write(contiguous.d_out.read());
  head_major.p.q = head_major.q.t; head_major.p.k = head_major.k.t; head_major.p.v = head_major.v.t;
  head_major.p.out = head_major.out.t; head_major.p.d_out = head_major.d_out.t;
  head_major.p.dq = head_major.dq.t; head_major.p.dk = head_major.dk.t; head_major.p.dv = head_major.dv.t;
  check_against_reference(head_major, true);
  expect_same_values(head_major.actual(true), contiguous.actual(true), "varlen head-major");
}

// Broadcast bias given as a stride-0 view of a single [s_q, s_kv] matrix (shape [b, h, s_q, s_kv]).
TEST(Layouts2, StrideZeroBroadcastBiasInput) {
  Config c;
  c.bias = "11SS";
  c.d_lse = true;
  Problem small(c);
  ref::Result r_small = ref::Result{};
  check_against_reference(small, false);
  r_small = small.actual(false);
  Problem big(c);
  HostTensor full = HostTensor::view(small.bias, {c.b, c.h_q, c.s_q, c.s_kv}, {0, 0, c.s_kv, 1}, 0);
  big.p.bias = full.t;
  big.p.d_bias = sinkattn_tensor_t{};
  ASSERT_EQ(big.forward(), SINKATTN_OK) << sinkattn_last_error();
  EXPECT_EQ(ref::relative_error(big.out.read(), r_small.out), 0);
}

}  // namespace
}  // namespace sinkattn::test

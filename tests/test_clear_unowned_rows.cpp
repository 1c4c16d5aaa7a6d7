// sinkattn_clear_unowned_rows, the C ABI helper bindings use for the varlen rows that belong to no sequence
// (SPEC.md section 1): it fills exactly the rows after cu_seqlens_q[b] (out = dq = 0, softmax_lse = -inf) and after
// cu_seqlens_kv[b] (dk = dv = 0), on the host here (the device kernel runs the same region description,
// core/unowned_rows.hpp, and is covered by the GPU suite's users through the JAX and PyTorch bindings). That the passes
// themselves never touch those rows is tested in test_sink_values.cpp.
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
};

class UnownedRows : public ::testing::TestWithParam<sinkattn_dtype_t> {};

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

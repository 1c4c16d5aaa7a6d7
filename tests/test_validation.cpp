// SPEC.md section 4: every entry point validates its arguments, returns a status with a message naming the
// argument, and writes NOTHING to outputs when validation fails (outputs are poisoned before the call and
// must still be poisoned, bit for bit, afterwards).
#include <gtest/gtest.h>

#include <functional>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

struct Rule {
  const char* name;        // test label
  const char* argument;    // must appear in the message
  bool backward;           // which pass is called
  std::function<void(Problem&)> mutate;
  std::function<Config()> config = nullptr;
  sinkattn_status_t want = SINKATTN_ERR_INVALID_ARGUMENT;
};

Config base() {
  Config c;
  c.d_lse = true;
  return c;
}
Config varlen_base() {
  Config c;
  c.batch = Batch::kVarlen;
  c.b = 3;
  c.seqlens_q = {4, 0, 6};
  c.seqlens_kv = {5, 2, 6};
  return c;
}

std::vector<Rule> rules() {
  std::vector<Rule> r;
  // ---- shapes ----
  r.push_back({"q_rank", "q", false, [](Problem& pb) { pb.p.q.rank = 3; }});
  r.push_back({"k_head_dim", "k", false, [](Problem& pb) { pb.p.k.shape[3] = 16; }});
  r.push_back({"v_rows", "v", false, [](Problem& pb) { pb.p.v.shape[1] -= 1; }});
  r.push_back({"k_batch", "k", false, [](Problem& pb) { pb.p.k.shape[0] = 1; }});
  r.push_back({"out_shape", "out", false, [](Problem& pb) { pb.p.out.shape[3] = 8; }});
  r.push_back({"lse_shape", "softmax_lse", false, [](Problem& pb) { pb.p.softmax_lse.shape[2] += 1; }});
  r.push_back({"d_out_shape", "d_out", true, [](Problem& pb) { pb.p.d_out.shape[1] -= 1; }});
  r.push_back({"dq_shape", "dq", true, [](Problem& pb) { pb.p.dq.shape[2] = 2; }});
  r.push_back({"dk_shape", "dk", true, [](Problem& pb) { pb.p.dk.shape[2] = 4; }});
  r.push_back({"d_lse_shape", "d_lse", true, [](Problem& pb) { pb.p.d_lse.shape[1] = 3; }});
  r.push_back({"sinks_shape", "sinks", false, [](Problem& pb) { pb.p.sinks.shape[0] = 3; }});
  r.push_back({"negative_extent", "q", false, [](Problem& pb) { pb.p.q.shape[1] = -1; }});
  r.push_back({"h_q_mod_h_kv", "h_kv", false, [](Problem& pb) {
                 pb.p.k.shape[2] = 3;
                 pb.p.v.shape[2] = 3;
               }});
  // ---- dtypes ----
  r.push_back({"k_dtype", "k", false, [](Problem& pb) { pb.p.k.dtype = SINKATTN_F16; }});
  r.push_back({"q_int_dtype", "q", false, [](Problem& pb) { pb.p.q.dtype = SINKATTN_I32; }});
  r.push_back({"out_dtype", "out", false, [](Problem& pb) { pb.p.out.dtype = SINKATTN_BF16; }});
  r.push_back({"lse_dtype", "softmax_lse", false, [](Problem& pb) { pb.p.softmax_lse.dtype = SINKATTN_F16; }});
  r.push_back({"sinks_dtype", "sinks", false, [](Problem& pb) { pb.p.sinks.dtype = SINKATTN_BF16; }});
  r.push_back({"dv_dtype", "dv", true, [](Problem& pb) { pb.p.dv.dtype = SINKATTN_F16; }});
  r.push_back({"d_sinks_dtype", "d_sinks", true, [](Problem& pb) { pb.p.d_sinks.dtype = SINKATTN_F16; }});
  // ---- strides ----
  r.push_back({"q_last_dim_strided", "q", false, [](Problem& pb) { pb.p.q.strides[3] = 2; }});
  r.push_back({"v_last_dim_strided", "v", false, [](Problem& pb) { pb.p.v.strides[3] = 2; }});
  r.push_back({"out_last_dim_strided", "out", false, [](Problem& pb) { pb.p.out.strides[3] = 2; }});
  r.push_back({"dq_last_dim_strided", "dq", true, [](Problem& pb) { pb.p.dq.strides[3] = 2; }});
  r.push_back({"negative_stride", "k", false, [](Problem& pb) { pb.p.k.strides[1] = -1; }});
  // ---- null pointers ----
  r.push_back({"q_null", "q", false, [](Problem& pb) { pb.p.q.data = nullptr; }});
  r.push_back({"k_null", "k", false, [](Problem& pb) { pb.p.k.data = nullptr; }});
  r.push_back({"v_null", "v", true, [](Problem& pb) { pb.p.v.data = nullptr; }});
  r.push_back({"out_null", "out", false, [](Problem& pb) { pb.p.out.data = nullptr; }});
  r.push_back({"lse_null", "softmax_lse", false, [](Problem& pb) { pb.p.softmax_lse.data = nullptr; }});
  r.push_back({"d_out_null", "d_out", true, [](Problem& pb) { pb.p.d_out.data = nullptr; }});
  r.push_back({"dk_null", "dk", true, [](Problem& pb) { pb.p.dk.data = nullptr; }});
  r.push_back({"sinks_null", "sinks", false, [](Problem& pb) { pb.p.sinks.data = nullptr; }});
  r.push_back({"d_out_absent", "d_out", true, [](Problem& pb) { pb.p.d_out = sinkattn_tensor_t{}; }});
  r.push_back({"out_absent", "out", false, [](Problem& pb) { pb.p.out = sinkattn_tensor_t{}; }});
  r.push_back({"k_absent", "k", false, [](Problem& pb) { pb.p.k = sinkattn_tensor_t{}; }});
  // ---- sinks ----
  r.push_back({"learnable_without_sinks", "sinks", false, [](Problem& pb) { pb.p.sinks = sinkattn_tensor_t{}; }});
  r.push_back({"learnable_without_sinks_bwd", "sinks", true, [](Problem& pb) { pb.p.sinks = sinkattn_tensor_t{}; }});
  r.push_back({"d_sinks_missing", "d_sinks", true, [](Problem& pb) { pb.p.d_sinks = sinkattn_tensor_t{}; }});
  // ---- options ----
  r.push_back({"dropout_p_one", "dropout_p", false, [](Problem& pb) { pb.p.dropout_p = 1.0; }});
  r.push_back({"dropout_p_negative", "dropout_p", false, [](Problem& pb) { pb.p.dropout_p = -0.1; }});
  r.push_back({"dropout_p_nan", "dropout_p", false, [](Problem& pb) { pb.p.dropout_p = NAN; }});
  r.push_back({"dropout_p_bwd", "dropout_p", true, [](Problem& pb) { pb.p.dropout_p = 1.5; }});
  r.push_back({"rng_state_missing", "rng_state", true, [](Problem& pb) {
                 pb.p.dropout_p = 0.1;
                 pb.p.rng_state = sinkattn_tensor_t{};
               }});
  r.push_back({"softmax_type", "softmax_type", false,
               [](Problem& pb) { pb.p.softmax_type = static_cast<sinkattn_softmax_type_t>(7); }});
  r.push_back({"alignment", "mask_alignment", false,
               [](Problem& pb) { pb.p.mask_alignment = static_cast<sinkattn_mask_alignment_t>(5); }});
  r.push_back({"softmax_scale_inf", "softmax_scale", false, [](Problem& pb) { pb.p.softmax_scale = INFINITY; }});
  // ---- bias ----
  r.push_back({"bias_shape", "bias", false, [](Problem& pb) {
                 static HostTensor b = HostTensor::contiguous(SINKATTN_F32, {2, 3, 16, 16});
                 pb.p.bias = b.t;
               }});
  r.push_back({"bias_dtype", "bias", false, [](Problem& pb) {
                 static HostTensor b = HostTensor::contiguous(SINKATTN_F16, {1, 1, 16, 16});
                 pb.p.bias = b.t;
               }});
  r.push_back({"d_bias_missing", "d_bias", true, [](Problem& pb) {
                 static HostTensor b = HostTensor::contiguous(SINKATTN_F32, {1, 1, 16, 16});
                 std::mt19937_64 rng(3);
                 b.write(random_array(rng, {1, 1, 16, 16}));
                 pb.p.bias = b.t;
                 pb.p.d_bias = sinkattn_tensor_t{};
               }});
  r.push_back({"bias_with_varlen", "bias", false,
               [](Problem& pb) {
                 static HostTensor b = HostTensor::contiguous(SINKATTN_F32, {1, 1, 6, 6});
                 pb.p.bias = b.t;
               },
               varlen_base});
  // ---- batch tensors ----
  r.push_back({"cu_seqlens_q_not_monotonic", "cu_seqlens_q", false,
               [](Problem& pb) { static_cast<int32_t*>(pb.p.cu_seqlens_q.data)[2] = 2; }, varlen_base});
  r.push_back({"cu_seqlens_kv_not_monotonic", "cu_seqlens_kv", true,
               [](Problem& pb) { static_cast<int32_t*>(pb.p.cu_seqlens_kv.data)[2] = 4; }, varlen_base});
  r.push_back({"cu_seqlens_q_not_from_zero", "cu_seqlens_q", false,
               [](Problem& pb) { static_cast<int32_t*>(pb.p.cu_seqlens_q.data)[0] = 1; }, varlen_base});
  r.push_back({"cu_seqlens_kv_not_from_zero", "cu_seqlens_kv", false,
               [](Problem& pb) { static_cast<int32_t*>(pb.p.cu_seqlens_kv.data)[0] = 1; }, varlen_base});
  r.push_back({"cu_seqlens_q_beyond_q", "cu_seqlens_q", false,
               [](Problem& pb) { static_cast<int32_t*>(pb.p.cu_seqlens_q.data)[3] = 11; }, varlen_base});
  r.push_back({"cu_seqlens_kv_dtype", "cu_seqlens_kv", false,
               [](Problem& pb) { pb.p.cu_seqlens_kv.dtype = SINKATTN_I64; }, varlen_base});
  r.push_back({"cu_seqlens_kv_missing", "cu_seqlens_kv", false,
               [](Problem& pb) { pb.p.cu_seqlens_kv = sinkattn_tensor_t{}; }, varlen_base});
  r.push_back({"max_seqlen_q_too_small", "max_seqlen_q", false, [](Problem& pb) { pb.p.max_seqlen_q = 5; },
               varlen_base});
  r.push_back({"max_seqlen_kv_negative", "max_seqlen_kv", false, [](Problem& pb) { pb.p.max_seqlen_kv = -2; },
               varlen_base});
  r.push_back({"seqused_kv_too_large", "seqused_kv", false,
               [](Problem& pb) {
                 static HostTensor u = HostTensor::contiguous(SINKATTN_I32, {3});
                 int32_t* x = static_cast<int32_t*>(u.t.data);
                 x[0] = 5; x[1] = 3; x[2] = 6;  // sequence 1 has 2 keys
                 pb.p.seqused_kv = u.t;
               },
               varlen_base});
  r.push_back({"seqused_kv_dense", "seqused_kv", false, [](Problem& pb) {
                 static HostTensor u = HostTensor::contiguous(SINKATTN_I32, {2});
                 pb.p.seqused_kv = u.t;
               }});
  r.push_back({"seqlens_q_too_large", "seqlens_q", false, [](Problem& pb) {
                 static HostTensor u = HostTensor::contiguous(SINKATTN_I32, {2});
                 int32_t* x = static_cast<int32_t*>(u.t.data);
                 x[0] = 16; x[1] = 17;
                 pb.p.seqlens_q = u.t;
               }});
  r.push_back({"seqlens_kv_shape", "seqlens_kv", false, [](Problem& pb) {
                 static HostTensor u = HostTensor::contiguous(SINKATTN_I32, {3});
                 int32_t* x = static_cast<int32_t*>(u.t.data);
                 x[0] = 1; x[1] = 1; x[2] = 1;
                 pb.p.seqlens_kv = u.t;
               }});
  r.push_back({"seqlens_in_varlen", "seqlens_q", false, [](Problem& pb) {
                 static HostTensor u = HostTensor::contiguous(SINKATTN_I32, {3});
                 int32_t* x = static_cast<int32_t*>(u.t.data);
                 x[0] = 1; x[1] = 0; x[2] = 1;
                 pb.p.seqlens_q = u.t;
               }, varlen_base});
  return r;
}

class Validation : public ::testing::TestWithParam<int> {};

TEST_P(Validation, StatusMessageAndNothingWritten) {
  const Rule rule = rules()[GetParam()];
  Problem pb(rule.config ? rule.config() : base());
  if (rule.backward) {
    // Valid forward first (out / lse are backward inputs).
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  }
  if (rule.mutate) rule.mutate(pb);
  // Poison every output and take a snapshot of the bytes.
  pb.poison_forward_outputs();
  pb.poison_backward_outputs();
  const auto out0 = pb.out.bytes(), lse0 = pb.lse.bytes(), dq0 = pb.dq.bytes(), dk0 = pb.dk.bytes(),
             dv0 = pb.dv.bytes(), ds0 = pb.d_sinks.bytes();
  std::vector<unsigned char> ws(1 << 20, 0xff);
  pb.p.workspace = ws.data();
  pb.p.workspace_bytes = ws.size();
  const sinkattn_status_t st = rule.backward ? sinkattn_backward(&pb.p) : sinkattn_forward(&pb.p);
  const std::string msg = sinkattn_last_error();
  EXPECT_EQ(st, rule.want) << rule.name << ": " << msg;
  EXPECT_NE(msg.find(rule.argument), std::string::npos) << "message does not name '" << rule.argument << "': " << msg;
  EXPECT_FALSE(msg.empty());
  // The same status from the workspace-size query and the backend query (same code path, SPEC.md section 4).
  size_t bytes = 0;
  const sinkattn_status_t wst = rule.backward ? sinkattn_backward_workspace_size(&pb.p, &bytes)
                                              : sinkattn_forward_workspace_size(&pb.p, &bytes);
  if (std::string(rule.name).find("null") == std::string::npos) {  // NULL data is allowed in the size query
    EXPECT_EQ(wst, st) << "workspace size query: " << sinkattn_last_error();
    sinkattn_backend_t chosen = SINKATTN_BACKEND_CPU;
    EXPECT_NE(sinkattn_query_backend(&pb.p, rule.backward, &chosen, nullptr, 0), SINKATTN_OK);
  }
  // Nothing written.
  EXPECT_TRUE(pb.out.bytes() == out0) << "out was written";
  EXPECT_TRUE(pb.lse.bytes() == lse0) << "softmax_lse was written";
  EXPECT_TRUE(pb.dq.bytes() == dq0) << "dq was written";
  EXPECT_TRUE(pb.dk.bytes() == dk0) << "dk was written";
  EXPECT_TRUE(pb.dv.bytes() == dv0) << "dv was written";
  EXPECT_TRUE(pb.d_sinks.bytes() == ds0) << "d_sinks was written";
}

INSTANTIATE_TEST_SUITE_P(Rules, Validation, ::testing::Range(0, static_cast<int>(rules().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return rules()[i.param].name; });

TEST(Validation2, NullParams) {
  EXPECT_EQ(sinkattn_forward(nullptr), SINKATTN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sinkattn_last_error()).find("params"), std::string::npos) << sinkattn_last_error();
  EXPECT_EQ(sinkattn_backward(nullptr), SINKATTN_ERR_INVALID_ARGUMENT);
  size_t b;
  EXPECT_EQ(sinkattn_forward_workspace_size(nullptr, &b), SINKATTN_ERR_INVALID_ARGUMENT);
}

TEST(Validation2, WorkspaceTooSmall) {
  bool tested = false;
  for (int bwd = 0; bwd < 2; ++bwd) {
    for (Config c : {base(), varlen_base()}) {
      c.deterministic = 1;
      c.s_q = c.s_kv = std::max<int64_t>(c.s_q, 64);
      Problem pb(c);
      ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
      size_t need = 0;
      ASSERT_EQ(bwd ? sinkattn_backward_workspace_size(&pb.p, &need) : sinkattn_forward_workspace_size(&pb.p, &need),
                SINKATTN_OK);
      if (need == 0) continue;
      tested = true;
      pb.poison_forward_outputs();
      pb.poison_backward_outputs();
      const auto out0 = pb.out.bytes(), dq0 = pb.dq.bytes();
      std::vector<unsigned char> ws(need);
      pb.p.workspace = ws.data();
      pb.p.workspace_bytes = need - 1;
      const sinkattn_status_t st = bwd ? sinkattn_backward(&pb.p) : sinkattn_forward(&pb.p);
      EXPECT_EQ(st, SINKATTN_ERR_WORKSPACE_TOO_SMALL);
      EXPECT_NE(std::string(sinkattn_last_error()).find("workspace"), std::string::npos) << sinkattn_last_error();
      pb.p.workspace = nullptr;
      pb.p.workspace_bytes = need;
      EXPECT_EQ(bwd ? sinkattn_backward(&pb.p) : sinkattn_forward(&pb.p), SINKATTN_ERR_WORKSPACE_TOO_SMALL);
      EXPECT_TRUE(pb.out.bytes() == out0);
      EXPECT_TRUE(pb.dq.bytes() == dq0);
    }
  }
  if (!tested) GTEST_SKIP() << "the CPU backend needs no workspace for these calls";
}

// Shape-only queries: NULL data pointers are allowed in the workspace size queries (bindings size scratch
// before any memory exists).
TEST(Validation2, ShapeOnlyWorkspaceQuery) {
  Problem pb(base());
  size_t with_data = 0, without = 0;
  ASSERT_EQ(sinkattn_backward_workspace_size(&pb.p, &with_data), SINKATTN_OK) << sinkattn_last_error();
  sinkattn_params_t p = pb.p;
  for (sinkattn_tensor_t* t : {&p.q, &p.k, &p.v, &p.sinks, &p.out, &p.softmax_lse, &p.d_out, &p.d_lse, &p.dq, &p.dk,
                               &p.dv, &p.d_sinks})
    t->data = nullptr;
  ASSERT_EQ(sinkattn_backward_workspace_size(&p, &without), SINKATTN_OK) << sinkattn_last_error();
  EXPECT_EQ(with_data, without);
}

// The chosen backend's report line names its kernels (Backend::kernel_report; the CUDA backend's comes from
// src/cuda/dispatch.cpp, tests/test_cuda_dispatch.cpp).
TEST(Validation2, QueryBackendNamesKernels) {
  Problem pb(base());
  for (int backward : {0, 1}) {
    char report[4096] = {0};
    sinkattn_backend_t chosen = SINKATTN_BACKEND_AUTO;
    ASSERT_EQ(sinkattn_query_backend(&pb.p, backward, &chosen, report, sizeof report), SINKATTN_OK)
        << sinkattn_last_error();
    EXPECT_EQ(chosen, SINKATTN_BACKEND_CPU);
    const std::string r(report);
    EXPECT_NE(r.find("cpu: chosen ("), std::string::npos) << r;
    EXPECT_NE(r.find("); kernels: tiled"), std::string::npos) << r;
    EXPECT_NE(r.find("tile 64 x 64"), std::string::npos) << r;
  }
}

// Windows of s_q + s_kv or more restrict nothing (the one window clamp, src/common/mask.hpp): any such window, up
// to 2^62 (the float64 reference adds the window to row indices in int64), gives the bitwise result of an
// unbounded one.
TEST(Validation2, HugeWindowIsUnbounded) {
  Config c = base();
  c.window_left = c.window_right = -1;
  Problem a(c);
  check_against_reference(a, true);
  for (int64_t w : {c.s_q + c.s_kv, c.s_q + c.s_kv + 1, int64_t(1) << 40, int64_t(1) << 62}) {
    c.window_left = w;
    c.window_right = w - 1;
    Problem b(c);
    check_against_reference(b, true);
    EXPECT_TRUE(a.out.bytes() == b.out.bytes()) << w;
    EXPECT_TRUE(a.lse.bytes() == b.lse.bytes()) << w;
    EXPECT_TRUE(a.dq.bytes() == b.dq.bytes()) << w;
    EXPECT_TRUE(a.dk.bytes() == b.dk.bytes()) << w;
  }
}

// Any negative window bound means unbounded (SPEC.md section 2): -5 is the same as -1.
TEST(Validation2, NegativeWindowIsUnbounded) {
  Config c = base();
  c.window_left = -1;
  c.window_right = 0;
  Problem a(c);
  check_against_reference(a, true);
  c.window_left = -5;
  c.window_right = 0;
  Problem b(c);
  check_against_reference(b, true);
  EXPECT_TRUE(a.out.bytes() == b.out.bytes());
  EXPECT_TRUE(a.dq.bytes() == b.dq.bytes());
}

// Head dims: SPEC.md section 1 asks the CPU for every multiple of 8 up to 256; anything else either works
// (and then matches the reference) or is rejected with a clear error naming the head dim, writing nothing.
TEST(Validation2, HeadDimsOutsideTheCpuList) {
  for (int64_t d : {4, 12, 100, 264, 320}) {
    Config c = base();
    c.d = c.d_v = d;
    c.s_q = c.s_kv = 5;
    Problem pb(c);
    pb.poison_forward_outputs();
    size_t bytes = 0;
    const sinkattn_status_t qs = sinkattn_forward_workspace_size(&pb.p, &bytes);
    if (qs == SINKATTN_OK) {
      check_against_reference(pb, true);
      continue;
    }
    const std::string msg = sinkattn_last_error();
    EXPECT_TRUE(qs == SINKATTN_ERR_UNSUPPORTED || qs == SINKATTN_ERR_INVALID_ARGUMENT) << d << ": " << msg;
    EXPECT_NE(msg.find("head dim"), std::string::npos) << d << ": " << msg;
    std::vector<unsigned char> ws(1 << 16);
    pb.p.workspace = ws.data();
    pb.p.workspace_bytes = ws.size();
    const auto out0 = pb.out.bytes();
    EXPECT_EQ(sinkattn_forward(&pb.p), qs);
    EXPECT_TRUE(pb.out.bytes() == out0);
  }
}

// A successful call after a failed one clears the message ("" if none).
TEST(Validation2, LastErrorAfterSuccess) {
  Problem pb(base());
  pb.p.dropout_p = 2;
  EXPECT_NE(pb.forward(), SINKATTN_OK);
  EXPECT_STRNE(sinkattn_last_error(), "");
  pb.p.dropout_p = 0;
  EXPECT_EQ(pb.forward(), SINKATTN_OK);
  EXPECT_STREQ(sinkattn_last_error(), "");
}

// The element sizes the tests (and the command) size their buffers with come from the library.
TEST(Validation2, DtypeSizes) {
  EXPECT_EQ(sinkattn_dtype_size(SINKATTN_F32), 4u);
  EXPECT_EQ(sinkattn_dtype_size(SINKATTN_F16), 2u);
  EXPECT_EQ(sinkattn_dtype_size(SINKATTN_BF16), 2u);
  EXPECT_EQ(sinkattn_dtype_size(SINKATTN_I32), 4u);
  EXPECT_EQ(sinkattn_dtype_size(SINKATTN_I64), 8u);
  EXPECT_EQ(sinkattn_dtype_size(static_cast<sinkattn_dtype_t>(99)), 0u);
}

}  // namespace
}  // namespace sinkattn::test

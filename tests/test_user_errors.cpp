// Errors in the user's words, C ABI (SPEC.md section 4): the mistakes a new user makes, each refused with a message
// that starts with the argument's name as the C caller spells it (the sinkattn_params_t field), says the rule, and
// names the backend once. The bindings' counterparts: tests/python/test_user_errors.py (JAX, PyTorch, HF) and the
// UserErrors tests of tests/cli/test_capture.cpp (the command).
#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "test_util.hpp"

namespace sinkattn::test {
namespace {

struct Mistake {
  const char* name;
  bool backward;
  std::function<void(Config&)> config;     // the call's shape
  std::function<void(Problem&)> mutate;    // the mistake, on a valid call
  const char* prefix;                      // the message must start with this
  std::vector<const char*> also;           // and contain these
  sinkattn_status_t want = SINKATTN_ERR_INVALID_ARGUMENT;
};

std::vector<Mistake> mistakes() {
  std::vector<Mistake> m;
  // q, k, v of mixed dtypes: the rule is "match q's", not a dtype picked out of context
  m.push_back({"v_dtype_differs_from_q", false, nullptr, [](Problem& pb) { pb.p.v.dtype = SINKATTN_BF16; },
               "v: dtype must match q's (fp32), got bf16", {}});
  m.push_back({"k_dtype_differs_from_q", false, [](Config& c) { c.dtype = SINKATTN_BF16; },
               [](Problem& pb) { pb.p.k.dtype = SINKATTN_F16; }, "k: dtype must match q's (bf16), got fp16", {}});
  m.push_back({"out_dtype_differs_from_q", false, nullptr, [](Problem& pb) { pb.p.out.dtype = SINKATTN_F16; },
               "out: dtype must match q's (fp32), got fp16", {}});
  m.push_back({"dk_dtype_differs_from_q", true, nullptr, [](Problem& pb) { pb.p.dk.dtype = SINKATTN_BF16; },
               "dk: dtype must match q's (fp32), got bf16", {}});
  m.push_back({"d_bias_dtype_differs_from_bias", true, [](Config& c) { c.bias = "1HSS"; },
               [](Problem& pb) { pb.p.d_bias.dtype = SINKATTN_BF16; }, "d_bias: dtype must match bias's (fp32)", {}});
  // sinks of the wrong length
  m.push_back({"sinks_wrong_length", false, nullptr, [](Problem& pb) { pb.p.sinks.shape[0] = 3; },
               "sinks: shape must be [4], got [3]", {}});
  m.push_back({"learnable_without_sinks", false, nullptr, [](Problem& pb) { pb.p.sinks = sinkattn_tensor_t{}; },
               "sinks: softmax_type LEARNABLE requires sinks", {}});
  // head dims no backend runs: the backend named once, then the argument
  m.push_back({"head_dim_600", false, [](Config& c) { c.d = c.d_v = 600; }, nullptr,
               "no backend can run this call: cpu: q: head dim d = 600 not supported", {},
               SINKATTN_ERR_UNSUPPORTED});
  m.push_back({"value_head_dim_600", false, [](Config& c) { c.d_v = 600; }, nullptr,
               "no backend can run this call: cpu: v: head dim d_v = 600 not supported", {},
               SINKATTN_ERR_UNSUPPORTED});
  // windows and batch tensors
  m.push_back({"h_q_not_a_multiple_of_h_kv", false, nullptr,
               [](Problem& pb) {
                 pb.p.k.shape[2] = 3;
                 pb.p.v.shape[2] = 3;
               },
               "k: h_q % h_kv must be 0", {}});
  m.push_back({"seqlens_kv_past_s_kv", false,
               [](Config& c) {
                 c.batch = Batch::kPadded;
                 c.seqlens_q = {16, 4};
                 c.seqlens_kv = {16, 3};
               },
               [](Problem& pb) { static_cast<int32_t*>(pb.p.seqlens_kv.data)[1] = 17; },
               "seqlens_kv: entry 1 is 17, must be in [0, s_kv = 16]", {}});
  m.push_back({"dropout_p_out_of_range", false, nullptr, [](Problem& pb) { pb.p.dropout_p = 1.0; },
               "dropout_p: must be in [0, 1)", {}});
  return m;
}

class UserErrors : public ::testing::TestWithParam<int> {};

TEST_P(UserErrors, MessageNamesTheArgument) {
  const Mistake mk = mistakes()[GetParam()];
  Config c;
  c.d_lse = true;
  if (mk.config) mk.config(c);
  Problem pb(c);
  if (mk.backward) {
    ASSERT_EQ(pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  }
  if (mk.mutate) mk.mutate(pb);
  std::vector<unsigned char> ws(1 << 20, 0xff);
  pb.p.workspace = ws.data();
  pb.p.workspace_bytes = ws.size();
  pb.poison_forward_outputs();
  const auto out0 = pb.out.bytes();
  const sinkattn_status_t st = mk.backward ? sinkattn_backward(&pb.p) : sinkattn_forward(&pb.p);
  const std::string msg = sinkattn_last_error();
  EXPECT_EQ(st, mk.want) << msg;
  EXPECT_EQ(msg.rfind(mk.prefix, 0), 0u) << "message: " << msg << "\nwanted it to start with: " << mk.prefix;
  for (const char* a : mk.also) EXPECT_NE(msg.find(a), std::string::npos) << msg;
  EXPECT_EQ(msg.find("cpu: cpu:"), std::string::npos) << msg;
  if (!mk.backward) {
    EXPECT_TRUE(pb.out.bytes() == out0) << "out was written";
  }
  // the size query says the same
  size_t bytes = 0;
  EXPECT_EQ(mk.backward ? sinkattn_backward_workspace_size(&pb.p, &bytes) : sinkattn_forward_workspace_size(&pb.p, &bytes),
            st);
  EXPECT_EQ(std::string(sinkattn_last_error()), msg);
}

INSTANTIATE_TEST_SUITE_P(Mistakes, UserErrors, ::testing::Range(0, static_cast<int>(mistakes().size())),
                         [](const ::testing::TestParamInfo<int>& i) { return mistakes()[i.param].name; });

// The backend report names each backend once, then why it is not chosen, in the argument's words.
TEST(UserErrorsReport, BackendReportNamesEachBackendOnce) {
  Config c;
  c.d = c.d_v = 600;
  Problem pb(c);
  char report[2048];
  sinkattn_backend_t chosen = SINKATTN_BACKEND_CPU;
  EXPECT_EQ(sinkattn_query_backend(&pb.p, 0, &chosen, report, sizeof report), SINKATTN_ERR_UNSUPPORTED);
  const std::string r = report;
  EXPECT_NE(r.find("cpu: not chosen: q: head dim d = 600"), std::string::npos) << r;
  EXPECT_EQ(r.find("cpu: cpu:"), std::string::npos) << r;
  EXPECT_EQ(r.find("cuda: cuda"), std::string::npos) << r;
}

}  // namespace
}  // namespace sinkattn::test

// sinkattn_forward_alloc / sinkattn_backward_alloc (include/sinkattn/sinkattn.h): one validation, the workspace from
// the caller's allocator, optionally the unowned varlen rows. Checked against the existing sequence (size query, run,
// sinkattn_clear_unowned_rows) on the same data: bitwise equal outputs (one CPU thread, so that both runs sum in the
// same order), the allocator called once with the size query's byte count (never for 0, never for an invalid call),
// and the errors of the new arguments (NULL allocator, unknown flags, an allocator that fails: nothing written).
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "sinkattn/sinkattn.hpp"
#include "test_util.hpp"

namespace sinkattn::test {
namespace {

// The allocator of the tests: poisoned bytes (0xff: NaN in every float dtype), counts its calls.
struct Arena {
  std::vector<std::vector<unsigned char>> blocks;
  std::vector<size_t> requests;
  bool fail = false;
  static void* alloc(size_t bytes, void* user) {
    auto* a = static_cast<Arena*>(user);
    a->requests.push_back(bytes);
    if (a->fail) return nullptr;
    a->blocks.emplace_back(bytes, 0xff);
    return a->blocks.back().data();
  }
};

Config dense_config() {
  Config c;
  c.num_threads = 1;
  c.bias = "1HSS";
  c.d_lse = true;
  c.window_left = 5;
  c.window_right = 0;
  return c;
}

Config varlen_config() {
  Config c;
  c.num_threads = 1;
  c.batch = Batch::kVarlen;
  c.b = 3;
  c.seqlens_q = {5, 0, 7};
  c.seqlens_kv = {6, 3, 9};
  c.tail_q = 3;
  c.tail_kv = 2;
  c.dropout_p = 0.25;
  c.seed = 11;
  c.offset = 3;
  return c;
}

void expect_same_forward(const Problem& a, const Problem& b) {
  EXPECT_EQ(a.out.bytes(), b.out.bytes());
  EXPECT_EQ(a.lse.bytes(), b.lse.bytes());
  if (a.rng_state.present()) {
    EXPECT_EQ(a.rng_state.bytes(), b.rng_state.bytes());
  }
}

void expect_same_backward(const Problem& a, const Problem& b) {
  EXPECT_EQ(a.dq.bytes(), b.dq.bytes());
  EXPECT_EQ(a.dk.bytes(), b.dk.bytes());
  EXPECT_EQ(a.dv.bytes(), b.dv.bytes());
  if (a.d_sinks.present()) {
    EXPECT_EQ(a.d_sinks.bytes(), b.d_sinks.bytes());
  }
  if (a.d_bias.present()) {
    EXPECT_EQ(a.d_bias.bytes(), b.d_bias.bytes());
  }
}

class RunAlloc : public ::testing::TestWithParam<bool> {};  // varlen (with rows of no sequence and dropout) or dense

TEST_P(RunAlloc, SameOutputsAsSizeQueryAndRun) {
  const Config c = GetParam() ? varlen_config() : dense_config();
  const int32_t cls = GetParam() ? 1 : 0;  // the existing path clears the unowned rows itself
  Problem ref_pb(c), pb(c);
  ASSERT_EQ(ref_pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  if (cls) {
    ASSERT_EQ(sinkattn_clear_unowned_rows(&ref_pb.p, 0), SINKATTN_OK) << sinkattn_last_error();
  }
  size_t fwd_bytes = 0, bwd_bytes = 0;
  ASSERT_EQ(sinkattn_forward_workspace_size(&pb.p, &fwd_bytes), SINKATTN_OK);
  ASSERT_EQ(sinkattn_backward_workspace_size(&pb.p, &bwd_bytes), SINKATTN_OK);

  pb.p.workspace = nullptr;  // ignored by the alloc entry points
  pb.p.workspace_bytes = 12345;
  const sinkattn_params_t before = pb.p;
  Arena arena;
  pb.poison_forward_outputs();
  ASSERT_EQ(sinkattn_forward_alloc(&pb.p, &Arena::alloc, &arena, cls ? SINKATTN_RUN_CLEAR_UNOWNED_ROWS : 0u),
            SINKATTN_OK)
      << sinkattn_last_error();
  EXPECT_EQ(std::memcmp(&before, &pb.p, sizeof(before)), 0) << "params modified";
  EXPECT_EQ(arena.requests, fwd_bytes ? std::vector<size_t>{fwd_bytes} : std::vector<size_t>{});
  expect_same_forward(ref_pb, pb);

  ASSERT_EQ(ref_pb.backward(), SINKATTN_OK) << sinkattn_last_error();
  if (cls) {
    ASSERT_EQ(sinkattn_clear_unowned_rows(&ref_pb.p, 1), SINKATTN_OK) << sinkattn_last_error();
  }
  arena.requests.clear();
  pb.poison_backward_outputs();
  ASSERT_EQ(sinkattn_backward_alloc(&pb.p, &Arena::alloc, &arena, cls ? SINKATTN_RUN_CLEAR_UNOWNED_ROWS : 0u),
            SINKATTN_OK)
      << sinkattn_last_error();
  EXPECT_EQ(arena.requests, bwd_bytes ? std::vector<size_t>{bwd_bytes} : std::vector<size_t>{});
  expect_same_backward(ref_pb, pb);
}

// Without the flag the rows of no sequence keep what they held (the passes never write them).
TEST(RunAllocFlags, VarlenWithoutTheFlagLeavesUnownedRows) {
  Problem pb(varlen_config());
  Arena arena;
  pb.poison_forward_outputs();
  const auto tail_before = pb.out.bytes();
  ASSERT_EQ(sinkattn_forward_alloc(&pb.p, &Arena::alloc, &arena, 0u), SINKATTN_OK) << sinkattn_last_error();
  const size_t row_bytes = static_cast<size_t>(pb.out.t.strides[0]) * dtype_size(pb.out.t.dtype);
  const size_t owned = static_cast<size_t>(pb.used_q) * row_bytes;
  EXPECT_TRUE(std::equal(tail_before.begin() + owned, tail_before.end(), pb.out.bytes().begin() + owned));
}

TEST(RunAllocErrors, ArgumentsAndFailingAllocator) {
  Problem pb(dense_config());
  Arena arena;
  EXPECT_EQ(sinkattn_forward_alloc(&pb.p, nullptr, &arena, 0u), SINKATTN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sinkattn_last_error()).find("alloc"), std::string::npos) << sinkattn_last_error();
  EXPECT_EQ(sinkattn_backward_alloc(&pb.p, &Arena::alloc, &arena, 6u), SINKATTN_ERR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(sinkattn_last_error()).find("flags"), std::string::npos) << sinkattn_last_error();
  EXPECT_TRUE(arena.requests.empty());

  // An invalid call: the same status and message as the run, and the allocator is not called.
  sinkattn_params_t bad = pb.p;
  bad.k.shape[2] = 3;  // h_q % h_kv != 0
  size_t ws = 0;
  const std::vector<unsigned char> ws_bytes(1 << 16, 0);
  bad.workspace = const_cast<unsigned char*>(ws_bytes.data());
  bad.workspace_bytes = ws_bytes.size();
  const sinkattn_status_t want = sinkattn_forward(&bad);
  const std::string want_msg = sinkattn_last_error();
  EXPECT_EQ(sinkattn_forward_alloc(&bad, &Arena::alloc, &arena, 0u), want);
  EXPECT_EQ(std::string(sinkattn_last_error()), want_msg);
  EXPECT_EQ(sinkattn_forward_workspace_size(&bad, &ws), want);
  EXPECT_TRUE(arena.requests.empty());

  // The allocator fails: WORKSPACE_TOO_SMALL, nothing written.
  arena.fail = true;
  pb.poison_forward_outputs();
  const auto out = pb.out.bytes(), lse = pb.lse.bytes();
  EXPECT_EQ(sinkattn_forward_alloc(&pb.p, &Arena::alloc, &arena, 0u), SINKATTN_ERR_WORKSPACE_TOO_SMALL);
  EXPECT_NE(std::string(sinkattn_last_error()).find("allocator returned NULL"), std::string::npos)
      << sinkattn_last_error();
  EXPECT_EQ(pb.out.bytes(), out);
  EXPECT_EQ(pb.lse.bytes(), lse);
  EXPECT_EQ(arena.requests.size(), 1u);
}

// The C++ wrapper (sinkattn.hpp): any callable; its exception propagates, a library error throws sinkattn::Error.
TEST(RunAllocCpp, WrapperForwardsCallableAndErrors) {
  Problem ref_pb(dense_config()), pb(dense_config());
  ASSERT_EQ(ref_pb.forward(), SINKATTN_OK) << sinkattn_last_error();
  std::vector<unsigned char> block;
  int calls = 0;
  pb.poison_forward_outputs();
  forward_alloc(pb.p, [&](size_t bytes) -> void* {
    ++calls;
    block.assign(bytes, 0xff);
    return block.data();
  });
  EXPECT_LE(calls, 1);
  expect_same_forward(ref_pb, pb);
  EXPECT_THROW(backward_alloc(pb.p, [](size_t) -> void* { throw std::runtime_error("no memory"); }),
               std::runtime_error);
  sinkattn_params_t bad = pb.p;
  bad.k.shape[2] = 3;
  EXPECT_THROW(forward_alloc(bad, [](size_t) -> void* { return nullptr; }), Error);
}

INSTANTIATE_TEST_SUITE_P(Batch, RunAlloc, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "varlen" : "dense"; });

}  // namespace
}  // namespace sinkattn::test

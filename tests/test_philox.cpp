// SPEC.md section 2, dropout: the library's Philox4x32-10 against Random123's known answers, and its keep
// function against the reference's independent implementation (including threshold edge cases).
#include <gtest/gtest.h>

#include <random>

#include "reference.hpp"
#include "sinkattn/sinkattn.h"
#include "test_util.hpp"

namespace {

namespace ref = ::sinkattn::ref;

TEST(Philox, Random123KnownAnswers) {
  for (const auto& k : sinkattn::test::kPhiloxKnownAnswers) {
    uint32_t out[4] = {1, 2, 3, 4};
    sinkattn_philox4x32_10(k.ctr, k.key, out);
    for (int w = 0; w < 4; ++w) EXPECT_EQ(out[w], k.want[w]) << std::hex << "word " << w;
  }
}

TEST(Philox, MatchesReferenceOnRandomCounters) {
  std::mt19937_64 rng(42);
  for (int t = 0; t < 2000; ++t) {
    const uint32_t c[4] = {uint32_t(rng()), uint32_t(rng()), uint32_t(rng()), uint32_t(rng())};
    const uint32_t k[2] = {uint32_t(rng()), uint32_t(rng())};
    uint32_t a[4], b[4];
    sinkattn_philox4x32_10(c, k, a);
    ref::philox4x32_10(c, k, b);
    for (int w = 0; w < 4; ++w) ASSERT_EQ(a[w], b[w]);
  }
}

// keep(seed, offset, n, h, i, j) with the SPEC's index, for random calls, including indices above 2^32
// (the counter's high word) and offsets above 2^32.
TEST(DropoutKeep, MatchesReference) {
  std::mt19937_64 rng(7);
  const double ps[] = {0.0, 1e-12, 1.0 / 4294967296.0, 2.0 / 4294967296.0, 0.1, 0.5, 0.9, 0.999999999,
                       0.9999999999999999};
  int64_t mismatches = 0, checked = 0;
  for (double p : ps) {
    for (int t = 0; t < 3000; ++t) {
      const uint64_t seed = rng(), offset = (t % 2) ? rng() : rng() % 1000;
      const int64_t h_q = 1 + int64_t(rng() % 64), sq = 1 + int64_t(rng() % 5000), skv = 1 + int64_t(rng() % 5000);
      const int64_t n = int64_t(rng() % 8), h = int64_t(rng() % h_q), i = int64_t(rng() % sq),
                    j = int64_t(rng() % skv);
      const int32_t lib = sinkattn_dropout_keep(seed, offset, n, h, i, j, h_q, sq, skv, p);
      const bool want = ref::dropout_keep(seed, offset, n, h, i, j, h_q, sq, skv, p);
      ASSERT_TRUE(lib == 0 || lib == 1);
      mismatches += (lib != 0) != want;
      ++checked;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << checked;
}

TEST(DropoutKeep, ThresholdEdges) {
  // p = 0: threshold 0, everything kept.
  for (int64_t j = 0; j < 4096; ++j) ASSERT_EQ(sinkattn_dropout_keep(3, 5, 0, 0, 0, j, 1, 1, 4096, 0.0), 1);
  // p tiny (p * 2^32 < 1): threshold 0, everything kept.
  for (int64_t j = 0; j < 4096; ++j) ASSERT_EQ(sinkattn_dropout_keep(3, 5, 0, 0, 0, j, 1, 1, 4096, 1e-12), 1);
  // p just below 1: threshold 2^32 - 1, only a word equal to 0xffffffff is kept (practically nothing).
  int kept = 0;
  for (int64_t j = 0; j < 4096; ++j) kept += sinkattn_dropout_keep(3, 5, 0, 0, 0, j, 1, 1, 4096, 0.9999999999999999);
  EXPECT_EQ(kept, 0);
  // Exactly the words of a Philox block: keep = words[idx % 4] >= threshold.
  const uint64_t seed = 0xdeadbeefcafef00dull, offset = (uint64_t(1) << 33) + 17;
  const int64_t h_q = 3, sq = 5, skv = 11;
  for (int64_t idx = 0; idx < h_q * sq * skv; ++idx) {
    const int64_t j = idx % skv, i = (idx / skv) % sq, h = idx / (skv * sq);
    const uint64_t ctr = uint64_t(idx) / 4;
    const uint32_t c[4] = {uint32_t(ctr), uint32_t(ctr >> 32), uint32_t(offset), uint32_t(offset >> 32)};
    const uint32_t k[2] = {uint32_t(seed), uint32_t(seed >> 32)};
    uint32_t w[4];
    ref::philox4x32_10(c, k, w);
    const double p = 0.37;
    const uint32_t thr = uint32_t(std::floor(p * 4294967296.0));
    ASSERT_EQ(sinkattn_dropout_keep(seed, offset, 0, h, i, j, h_q, sq, skv, p), w[idx % 4] >= thr ? 1 : 0) << idx;
  }
}

TEST(DropoutKeep, KeptFraction) {
  for (double p : {0.1, 0.5}) {
    int kept = 0;
    const int n = 40000;
    for (int j = 0; j < n; ++j) kept += sinkattn_dropout_keep(11, 0, 0, 0, 0, j, 1, 1, n, p);
    EXPECT_NEAR(double(kept) / n, 1 - p, 0.015) << p;
  }
}

}  // namespace

// Philox4x32-10 (Random123, Salmon et al. 2011) and the dropout keep decision of SPEC.md section 2.
// Header-only and usable from host and device code, so every backend computes the same bits.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn {

struct Philox4 {
  uint32_t w[4];
};

// One Philox round: (hi, lo) = M * x, mixed with the key.
SINKATTN_HD void philox_mulhilo(uint32_t a, uint32_t b, uint32_t* hi, uint32_t* lo) {
  const uint64_t prod = static_cast<uint64_t>(a) * static_cast<uint64_t>(b);
  *hi = static_cast<uint32_t>(prod >> 32);
  *lo = static_cast<uint32_t>(prod);
}

// Philox4x32 with 10 rounds: multipliers 0xD2511F53, 0xCD9E8D57; key bumps 0x9E3779B9, 0xBB67AE85.
SINKATTN_HD Philox4 philox4x32_10(uint32_t c0, uint32_t c1, uint32_t c2, uint32_t c3, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(0xD2511F53u, c0, &hi0, &lo0);
    philox_mulhilo(0xCD9E8D57u, c2, &hi1, &lo1);
    const uint32_t n0 = hi1 ^ c1 ^ k0;
    const uint32_t n1 = lo1;
    const uint32_t n2 = hi0 ^ c3 ^ k1;
    const uint32_t n3 = lo0;
    c0 = n0; c1 = n1; c2 = n2; c3 = n3;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return Philox4{{c0, c1, c2, c3}};
}

// threshold = min(floor(p * 2^32), 2^32 - 1), p as a double.
SINKATTN_HD uint32_t dropout_threshold(double p) {
  const double t = p * 4294967296.0;
  if (!(t > 0.0)) return 0u;
  if (t >= 4294967295.0) return 0xFFFFFFFFu;
  return static_cast<uint32_t>(t);  // truncation == floor for t >= 0
}

// Element index of (n, h, i, j): ((n * h_q + h) * max_s_q + i) * max_s_kv + j, uint64.
SINKATTN_HD uint64_t dropout_index(uint64_t n, uint64_t h, uint64_t i, uint64_t j, uint64_t h_q, uint64_t max_s_q,
                                   uint64_t max_s_kv) {
  return ((n * h_q + h) * max_s_q + i) * max_s_kv + j;
}

// All four keep words of the Philox block holding element `idx` (idx / 4 is the counter).
SINKATTN_HD Philox4 dropout_block(uint64_t seed, uint64_t offset, uint64_t idx) {
  const uint64_t ctr = idx >> 2;
  return philox4x32_10(static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), static_cast<uint32_t>(offset),
                       static_cast<uint32_t>(offset >> 32), static_cast<uint32_t>(seed),
                       static_cast<uint32_t>(seed >> 32));
}

// keep = words[idx % 4] >= threshold.
SINKATTN_HD bool dropout_keep(uint64_t seed, uint64_t offset, uint64_t idx, uint32_t threshold) {
  const Philox4 r = dropout_block(seed, offset, idx);
  return r.w[idx & 3] >= threshold;
}

}  // namespace sinkattn

// CUDA backend: dropout keep decision of SPEC.md section 2, from src/core/philox.hpp (the same function the
// CPU backend calls, so both compute the same bits):
//   idx = ((n * h_q + h) * max_s_q + i) * max_s_kv + j,  keep = Philox4x32_10(idx / 4, offset; seed)[idx % 4] >= threshold
// Survivors are scaled by 1 / (1 - p); the sink is never dropped.
// One Philox block gives the keep words of 4 consecutive keys of one query; `factors` / `keep_bits` spread each block
// over the lanes whose fragment elements use it (one block per thread and 8-key slice: one per element cost the
// dropout kernels most of their time); `keep_key_quad` gives one block's bits to a thread that stores them for
// others (the keep producers of the Hopper kernels).
#pragma once

#include <type_traits>

#include "core/philox.hpp"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

struct Dropout {
  uint64_t seed, offset;
  uint64_t row_base;  // ((n * h_q + h) * max_s_q) * max_s_kv
  uint32_t threshold;
  float rscale;

  __device__ __forceinline__ Dropout(const Params& p, int n, int h) {
    if (p.rng_in) {
      seed = p.rng_in[0];
      offset = p.rng_in[p.rng_in_stride];
    } else {
      seed = p.seed;
      offset = p.offset;
    }
    row_base = (static_cast<uint64_t>(n) * p.h_q + h) * static_cast<uint64_t>(p.s_q);
    threshold = p.dropout_threshold;
    rscale = p.dropout_rscale;
  }

  __device__ __forceinline__ uint64_t index(int i, int j, int s_kv) const {
    return (row_base + static_cast<uint64_t>(i)) * static_cast<uint64_t>(s_kv) + static_cast<uint64_t>(j);
  }

  // keep_ij / (1 - p) (0 when dropped) of the four elements f[e] a thread holds of one 8-column slice of a warp's
  // 16-row mma fragment (scores.cuh's layout: element e at row r0 + g + 8 (e >> 1), column c0 + 2t + (e & 1),
  // g = lane / 4, t = lane % 4). kKeysAreRows = false: rows are queries i, columns keys j (forward, dq kernel);
  // true: rows are keys, columns queries (dK dV kernel). The key axis' origin (c0, resp. r0) is a multiple of 4, so
  // with s_kv % 4 == 0 every Philox block (4 consecutive keys of one query) lies within one slice:
  //   keys are columns: lanes t, t ^ 1 share the blocks of rows g and g + 8; each computes one, a shuffle swaps
  //                     the halves the other needs;
  //   keys are rows:    lanes with the same t and g / 4 (k = g % 4 apart) share four blocks (queries 2t, 2t + 1 x key
  //                     groups g / 4, g / 4 + 2); lane k computes block e = k, three shuffle rounds deliver word k
  //                     of the others.
  // Otherwise (s_kv % 4 != 0: a block may straddle two rows) each element takes its own block. Warp-synchronous:
  // every lane of the warp calls it with the same r0, c0.
  template <bool kKeysAreRows>
  __device__ __forceinline__ void factors(int r0, int c0, int s_kv, int lane, float (&f)[4]) const {
    uint32_t k = 0;
    by_key_alignment(s_kv,
                     [&](auto aligned) { k = keep4<kKeysAreRows, decltype(aligned)::value>(r0, c0, s_kv, lane); });
#pragma unroll
    for (int e = 0; e < 4; ++e) f[e] = (k >> e) & 1u ? rscale : 0.f;
  }

  // The one s_kv % 4 test of the keep functions below (their kAligned): calls f(std::true_type{}) when every Philox
  // block (4 consecutive keys of one query) starts at a key j % 4 == 0 of the same query, f(std::false_type{})
  // otherwise. Callers make it once, outside their loops, so that the Philox chains of a loop body interleave.
  template <typename F>
  __device__ __forceinline__ static void by_key_alignment(int s_kv, F&& f) {
    if (s_kv % 4 == 0)
      f(std::true_type{});
    else
      f(std::false_type{});
  }

  // The keep bits of a thread's whole fragment of NT slices (bit 4 nt + e: element (nt, e) of scores.cuh's layout,
  // columns starting at c0 + 8 nt), for kernels that keep the undropped P beside the dropped one (Hopper: P for
  // the normaliser or dS, P * keep / (1 - p) for the P V / dV product). The s_kv % 4 test is made once, so that
  // the NT Philox chains interleave (Dropout::keep_key_quad says why).
  template <bool kKeysAreRows, int NT>
  __device__ __forceinline__ uint64_t keep_bits(int r0, int c0, int s_kv, int lane) const {
    static_assert(NT * 4 <= 64, "one bit per element");
    uint64_t bits = 0;
    by_key_alignment(s_kv, [&](auto aligned) {
      if constexpr (decltype(aligned)::value) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
          bits |= static_cast<uint64_t>(keep4<kKeysAreRows, true>(r0, c0 + nt * 8, s_kv, lane)) << (4 * nt);
      } else {  // 4 blocks a slice: not unrolled (4 NT chains at once would not fit the registers; a rare case)
#pragma unroll 1
        for (int nt = 0; nt < NT; ++nt)
          bits |= static_cast<uint64_t>(keep4<kKeysAreRows, false>(r0, c0 + nt * 8, s_kv, lane)) << (4 * nt);
      }
    });
    return bits;
  }

  // The keep bits of keys j .. j + 3 (j % 4 == 0) for query i: bit k for key j + k (the keep producers of the Hopper
  // kernels, fwd_sm90_ws.cuh and bwd_dkdv_sm90.cuh). kAligned (s_kv % 4 == 0, the caller's choice, made once outside
  // its loops): the four words of one Philox block; otherwise each key takes its own block. No branch inside, so
  // that the Philox chains of several calls in a row interleave (with the s_kv test in here, every call was its own
  // basic block and the chains ran one after another: bench/log/2026-12-02-dropout-forward-hopper.md).
  template <bool kAligned>
  __device__ __forceinline__ uint32_t keep_key_quad(int i, int j, int s_kv) const {
    auto kept = [&](uint32_t w) { return static_cast<uint32_t>(w >= threshold); };
    if constexpr (kAligned) {
      const Philox4 b = dropout_block(seed, offset, index(i, j, s_kv));
      return kept(b.w[0]) | kept(b.w[1]) << 1 | kept(b.w[2]) << 2 | kept(b.w[3]) << 3;
    } else {
      uint32_t k = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e)
        k |= static_cast<uint32_t>(sinkattn::dropout_keep(seed, offset, index(i, j + e, s_kv), threshold)) << e;
      return k;
    }
  }

  // The 4 keep bits (bit e) of one slice, as `factors` describes; kAligned: s_kv % 4 == 0 (the caller's test).
  template <bool kKeysAreRows, bool kAligned>
  __device__ __forceinline__ uint32_t keep4(int r0, int c0, int s_kv, int lane) const {
    const int g = lane >> 2, t = lane & 3;
    auto kept = [&](uint32_t w) { return static_cast<uint32_t>(w >= threshold); };
    if constexpr (!kAligned) {
      uint32_t k = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = r0 + g + 8 * (e >> 1), c = c0 + 2 * t + (e & 1);
        const uint64_t idx = kKeysAreRows ? index(c, r, s_kv) : index(r, c, s_kv);
        k |= static_cast<uint32_t>(sinkattn::dropout_keep(seed, offset, idx, threshold)) << e;
      }
      return k;
    } else if constexpr (!kKeysAreRows) {
      const bool odd = t & 1;  // odd: computes row g + 8's block, needs words 2, 3 (columns 2t % 4 == 2)
      const Philox4 b = dropout_block(seed, offset, index(r0 + g + (odd ? 8 : 0), c0 + 4 * (t >> 1), s_kv));
      const uint32_t got0 = __shfl_xor_sync(0xffffffffu, odd ? b.w[0] : b.w[2], 1);
      const uint32_t got1 = __shfl_xor_sync(0xffffffffu, odd ? b.w[1] : b.w[3], 1);
      return kept(odd ? got0 : b.w[0]) | kept(odd ? got1 : b.w[1]) << 1 | kept(odd ? b.w[2] : got0) << 2 |
             kept(odd ? b.w[3] : got1) << 3;
    } else {
      const int k = g & 3;  // this lane's word in every block of its group, and the element whose block it computes
      const Philox4 b =
          dropout_block(seed, offset, index(c0 + 2 * t + (k & 1), r0 + 4 * (g >> 2) + 8 * (k >> 1), s_kv));
      auto word = [&](int w) { return w == 0 ? b.w[0] : w == 1 ? b.w[1] : w == 2 ? b.w[2] : b.w[3]; };
      // got[r]: word k of block e = (k + r) % 4, from the lane computing it; that lane sends word (its k - r) % 4
      uint32_t got[4];
      got[0] = word(k);
#pragma unroll
      for (int r = 1; r < 4; ++r)
        got[r] = __shfl_sync(0xffffffffu, word((k - r) & 3), (lane & ~12) | (((k + r) & 3) << 2));
      uint32_t bits = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = (e - k) & 3;
        bits |= kept(r == 0 ? got[0] : r == 1 ? got[1] : r == 2 ? got[2] : got[3]) << e;
      }
      return bits;
    }
  }
};

}  // namespace sinkattn::cuda

// CUDA backend: which forward calls the decode kernels (decode_kernel.cuh) run, as a host-only rule on the resolved
// call, so that the dispatch unit (dispatch.cpp, also compiled without CUDA into tests/test_cuda_dispatch.cpp) and
// the decode plan (decode.cu: splits, workspace) apply the same one.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "core/call.hpp"

namespace sinkattn::cuda {

constexpr int kDecodeMaxQueries = 16;  // query rows per sequence (dense s_q or varlen max_seqlen_q)
constexpr int kCombineMaxSplits = 128;  // key splits a call takes at most (decode_combine.cuh: 4 partial LSEs a lane)
// The most key splits one thread-block cluster combines (KernelChoice::decode_cluster): the portable cluster size.
constexpr int kDecodeClusterMaxSplits = 8;

// Whether a call of `splits` key splits over `blocks` (sequence, KV head, block of rows) triples runs its splits as
// one cluster each (on a device of `sms` SMs, 0: unknown): 2 splits, or up to kDecodeClusterMaxSplits where the grid
// has at most one block an SM. Measured on an H200 (bench/log/2026-12-07-decode-cluster-combine.md): faster than
// the combine kernel at 2 splits from batch 64 (0.5-4.5%) and at 6 splits of batch 1 (48 blocks: 13%), slower at 6
// splits of batch 8 (384 blocks: 1.17-1.38x the time).
inline bool decode_cluster_splits(int64_t splits, int64_t blocks, int sms) {
  if (splits < 2 || splits > kDecodeClusterMaxSplits) return false;
  return splits == 2 || (sms > 0 && blocks * splits <= sms);
}

// "" when the decode kernels run the call, else why not: forward, fp16 / bf16, no bias or dropout, at most
// kDecodeMaxQueries query rows per sequence, head dims up to 128, b and h_kv within one grid dimension.
inline std::string decode_unsupported(const Call& c) {
  if (c.pass != Pass::kForward) return "backward";
  if (c.dtype != SINKATTN_F16 && c.dtype != SINKATTN_BF16) return "dtype is not fp16 / bf16";
  if (c.plan.bias == Use::kRequired || c.plan.dropout) return "bias or dropout";
  if (c.s_q > kDecodeMaxQueries)
    return "more than " + std::to_string(kDecodeMaxQueries) + " query rows per sequence (s_q / max_seqlen_q = " +
           std::to_string(c.s_q) + ")";
  if (std::max(c.d, c.d_v) > 128) return "head dim above 128";
  if (c.b > 65535 || c.h_kv > 65535) return "b or h_kv above 65535 (grid dimensions)";
  return {};
}

// Keys the windows of a block of block_m packed rows span, when both window bounds are set: wl + wr + the query rows
// the block's rows belong to (at most (block_m + group - 1) / group); -1 without such a window.
inline int64_t decode_window_keys(const Call& c, int64_t block_m) {
  if (c.window_left < 0 || c.window_right < 0) return -1;
  return c.window_left + c.window_right + (block_m + c.group - 1) / c.group;
}

// Key tiles of 64 keys (decode_kernel.cuh's kBlockN at head-dim tile 64) that a block of block_m packed rows reads at
// most: its window's keys (decode_window_keys) and up to 15 below the first, since its tiles start on a 16-key
// boundary, at most s_kv (the extent, max_seqlen_kv or the paged capacity).
inline int64_t decode_max_tiles(const Call& c, int64_t block_m) {
  int64_t keys = c.s_kv;
  if (const int64_t w = decode_window_keys(c, block_m); w >= 0) keys = std::min<int64_t>(keys, w + 15);
  return (keys + 63) / 64;
}

// The short-range configuration (decode_kernel.cuh, kDecodeShortConfig: 16 packed rows, Q in registers, 3 stages,
// 4 blocks an SM): head dims up to 64, one 16-row block of packed rows (s_q * group <= 16), whose rows read at most
// 3 tiles (GPT-OSS's sliding layer, window 128: 2 query rows x 8 heads read 130 keys from a 16-key boundary), so
// that a 4-stage ring would hold a stage no tile uses, and more blocks (b x h_kv) than the default configuration's
// 3 an SM hold on the device's `sms` multiprocessors (0: unknown, no). Measured on an H200 (GPT-OSS sliding decode,
// bench/log/2026-12-06-decode-short-range.md): 1.13-1.48x faster from batch 64 (512 blocks), where the fourth block
// an SM hides one more chain sequence length -> page table -> K / V; 0.7-8% slower at batch 1 and 8 (8 and 64
// blocks), where no SM holds three and the third tile's load waits for the first tile's barrier.
constexpr int kDecodeDefaultBlocksPerSm = 3;  // the 16-row configuration at head-dim tile 64: 76,032 bytes a block
inline bool decode_short_keys(const Call& c, int sms) {
  return std::max(c.d, c.d_v) <= 64 && std::max<int64_t>(c.s_q, 1) * c.group <= 16 && decode_max_tiles(c, 16) <= 3 &&
         sms > 0 && c.b * c.h_kv > int64_t{kDecodeDefaultBlocksPerSm} * sms;
}

// The key splits decode.cu's plan takes when the call gives no num_splits, for rows that read `tiles` key tiles at
// most, over `blocks` (sequence, KV head, block of rows) triples, on `sms` multiprocessors holding `per_sm` blocks
// each; `cluster`: the device merges 2 .. kDecodeClusterMaxSplits splits in a cluster (KernelChoice::decode_cluster).
//   - A row of fewer than 8 tiles is not split (a sliding window: one block streams them faster than a split and a
//     merge); nor are 4 or more waves of blocks (the last wave's quantisation is small).
//   - Few blocks (at most an eighth of the SMs: a batch of one sequence of 8 KV heads): sms / blocks splits, one
//     block an SM. Measured on an H100 (bench/log/2026-12-07-decode-split-rule.md, forced split counts): at batch 1
//     16 splits took 0.77-0.91x the time of the 33 and 43 that filling every resident block gave, from 8k keys on.
//   - Else the wave efficiency of s splits (the blocks as waves of the resident slots, over the whole waves they
//     take): the smallest s within 85% of the best, at least two tiles per split.
// Then as few splits as cover the tiles at that count's tiles per split (42 splits of 129 tiles take 4 each, and 33
// of 4 cover them; the other 9 would find no key). A count merged in a cluster is then rounded up to a power of two
// where the grid keeps one block an SM (the added splits start past the last key): at batch 1 and 1k keys, 8 splits
// (2 of them empty) in clusters of 8 took 0.88x the time of the same 6 splits' keys in clusters of 6 (H100, the same
// log).
inline int64_t decode_heuristic_splits(int64_t tiles, int64_t blocks, int sms, int64_t per_sm, bool cluster) {
  blocks = std::max<int64_t>(blocks, 1);
  const int64_t slots = std::max<int64_t>(sms, 1) * std::max<int64_t>(per_sm, 1);
  const int64_t max_s = std::clamp<int64_t>(tiles / 2, 1, kCombineMaxSplits);
  int64_t s = 1;
  if (tiles >= 8 && sms > 0 && blocks * 8 <= sms) {
    s = std::min<int64_t>(sms / blocks, max_s);
  } else if (tiles >= 8 && blocks < 4 * slots) {
    auto eff = [&](int64_t x) {
      const double waves = static_cast<double>(blocks * x) / static_cast<double>(slots);
      return waves / std::ceil(waves);
    };
    double best = 0;
    for (int64_t x = 1; x <= max_s; ++x) best = std::max(best, eff(x));
    while (s < max_s && eff(s) < 0.85 * best) ++s;
  }
  const int64_t per = (tiles + s - 1) / s;
  s = (tiles + per - 1) / per;
  if (cluster && s > 2 && decode_cluster_splits(s, blocks, sms)) {
    int64_t p = 4;
    while (p < s) p *= 2;
    if (blocks * p <= sms) s = p;
  }
  return s;
}

}  // namespace sinkattn::cuda

// CUDA backend: which forward calls the decode kernels (decode_kernel.cuh) run, as a host-only rule on the resolved
// call, so that the dispatch unit (dispatch.cpp, also compiled without CUDA into tests/test_cuda_dispatch.cpp) and
// the decode plan (decode.cu: splits, workspace) apply the same one.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

#include "core/call.hpp"

namespace sinkattn::cuda {

constexpr int kDecodeMaxQueries = 16;  // query rows per sequence (dense s_q or varlen max_seqlen_q)
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

}  // namespace sinkattn::cuda

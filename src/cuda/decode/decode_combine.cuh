// CUDA backend: the combine of split-KV partials (decode_kernel.cuh), SPEC.md section 2, NOTES-kernels.md.
// One warp per (sequence n, query row i, query head h) merges the splits' partials (o_s, lse_s) by decode_merge.cuh's
// formula: lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) o_s. The sink is in exactly one partial (the
// carrying split's: its lse is sigma alone when it had no key). A partial with lse_s = -inf weighs exactly 0 and its
// o_s is not read: it cannot overwrite a valid LSE. Every partial -inf (vanilla, no visible key): out = 0, LSE = -inf.
// Dense padding rows (i >= len_q): out = 0, LSE = sigma. Grid (ceil(s_q * h_q / 4), b), 4 warps per block.
#pragma once

#include "cuda/common.cuh"
#include "cuda/decode/decode_merge.cuh"
#include "cuda/decode/decode_rules.hpp"
#include "cuda/params.cuh"

namespace sinkattn::cuda {

template <typename T>
__global__ void __launch_bounds__(128) decode_combine_kernel(const Params p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = blockIdx.y;
  const int pair = blockIdx.x * 4 + warp;  // (i, h): consecutive warps take consecutive heads of one query row
  const int i = pair / p.h_q, h = pair % p.h_q;
  const SeqInfo sq = seq_info(p, n);
  if (i >= sq.rows_q) return;
  T* out = row_ptr<T>(p.out, p.out_st, n, sq.q_start + i, h);
  float* lse_out = p.softmax_lse + lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, sq.q_start + i);
  if (i >= sq.len_q) {  // padding row of a dense batch
    for (int col = 2 * lane; col < p.d_v; col += 64) *reinterpret_cast<uint32_t*>(out + col) = 0u;
    if (lane == 0) *lse_out = sink_value(p, h);
    return;
  }
  // Waits for the decode kernel's partials (launched with KernelChoice::decode_pdl, this grid may start before it
  // ends).
  pdl_wait();
  const int S = p.num_splits;
  const int64_t row = ws_row(p, sq, n, i);
  const int64_t plane = static_cast<int64_t>(p.h_q) * p.rows_total_q;  // partials of one split
  const int64_t base = static_cast<int64_t>(h) * p.rows_total_q + row;
  float ls[kCombineMaxSplits / 32];
  float mx = -INFINITY;
#pragma unroll
  for (int k = 0; k < kCombineMaxSplits / 32; ++k) {
    const int s = lane + 32 * k;
    ls[k] = s < S ? p.ws_lse_part[s * plane + base] : -INFINITY;
    mx = fmaxf(mx, ls[k]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
  float sum = 0.f;
  if (mx != -INFINITY) {
#pragma unroll
    for (int k = 0; k < kCombineMaxSplits / 32; ++k) sum += merge_term(ls[k], mx);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  const float lse = merged_lse(mx, sum);
  // weights w_s = exp(lse_s - lse) (shared memory, one row per warp), then out = sum_s w_s o_s
  __shared__ float sW[4][kCombineMaxSplits];
#pragma unroll
  for (int k = 0; k < kCombineMaxSplits / 32; ++k)
    sW[warp][lane + 32 * k] = merge_weight(ls[k], lse);
  __syncwarp();
  // kBatch partials' loads are issued before the first is used: one memory latency per batch, not per split.
  constexpr int kBatch = 16;
  static_assert(kCombineMaxSplits % kBatch == 0, "batches cover sW");
  for (int col = 2 * lane; col < p.d_v; col += 64) {
    float a0 = 0.f, a1 = 0.f;
    for (int s0 = 0; s0 < S; s0 += kBatch) {
      float2 o[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {  // sW is 0 past S: those partials, and empty splits', are not read
        const float* src = p.ws_o_part + ((s0 + u) * plane + base) * p.d_v + col;
        o[u] = sW[warp][s0 + u] != 0.f ? *reinterpret_cast<const float2*>(src) : make_float2(0.f, 0.f);
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const float w = sW[warp][s0 + u];
        a0 += w * o[u].x;
        a1 += w * o[u].y;
      }
    }
    *reinterpret_cast<uint32_t*>(out + col) = ElemTraits<T>::pack(a0, a1);
  }
  if (lane == 0) *lse_out = lse;
}

}  // namespace sinkattn::cuda

// CUDA backend, Hopper: the per-key-block steps of one consumer warpgroup (64 query rows) that the Hopper forward
// (fwd_sm90_ws.cuh, warp-specialised, 2 or 3 consumer warpgroups) is made of (SPEC.md section 2), apart from its
// loads, synchronisation and pipeline order; and the forward's tensor maps (Sm90FwdTma).
//   fwd_issue_s:   S = Q K^T of one key block of BN keys, an m64nBNk16 wgmma chain over the head dim (A = Q,
//                  B = K, both K-major from the 128-byte-swizzled row panels of sm90_common.cuh), committed,
//                  not waited for;
//   fwd_issue_pv:  O += P V, an m64nHDk16 chain over the BN keys (A = P from registers, pack_a_frags of
//                  sm90_common.cuh; B = V read MN-major), committed, not waited for;
//   fwd_softmax_step: mask / scale of S (scores.cuh) and the online-softmax step (softmax.cuh, the sink as an
//                  already-seen key): S becomes P = exp2(S * c - m_new), alpha the factors O must be multiplied by.
// The wgmma accumulator of a warp is the mma.sync C layout (rows g and g + 8 of the warp's 16), so OnlineSoftmax,
// make_logits and the epilogue (epilogue.cuh) work on it unchanged.
// The order of these steps over a tile's key blocks (S_j issued with P_{j-1} V_{j-1}, wait for S_j, softmax while
// P V runs, wait, rescale, pack) is written out in fwd_ws_consumers (fwd_sm90_ws.cuh), not here: one function
// template taking the kernel's waits / turns / releases as lambdas (tried, nvcc 13.0) cost the warp-specialised
// kernel's 2-consumer variants 4-5 % more SASS instructions (and the first, software-pipelined Hopper forward 10 / 13
// registers), also with each loop's index kept.
#pragma once

#include <cuda.h>

#include "cuda/hopper/sm90_common.cuh"
#include "cuda/hopper/wgmma_ops.cuh"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"
#include "cuda/scores.cuh"
#include "cuda/softmax.cuh"

namespace sinkattn::cuda::sm90 {

// Tensor maps of q, k, v for the forward's TMA loads (launch.cuh, fwd_tma_maps): 4-d (d, rows, heads, b) of 16-bit
// elements, box 64 x a block of rows, 128-byte swizzle; ok = 0: none (every tile through cp.async).
// bias: the kBias variant stages the bias tiles by TMA (KernelChoice::fwd_bias_tma): 4-d (s_kv, s_q, bias heads,
// bias batches), box 64 keys x kBlockM queries; bias_ok = 0: none (each thread loads its fragment from global memory).
// Paged KV (the kPaged kernel): k, v describe the pools, 4-d (d, rows in a page, h_kv, pages), box 64 x page_rows
// rows (paged_kv_sm90.cuh).
struct Sm90FwdTma {
  CUtensorMap q, k, v, bias;
  int ok, bias_ok;
  int page_rows;  // paged KV: rows per TMA box, gcd(page_size, kBlockN) (a multiple of 8); else 0
};

// S (64 x BN, BN = 8 NT) = Q K^T: sQ_wg = this warpgroup's 64 rows of a Q tile of QROWS rows (1024-byte aligned:
// 64 rows of every panel), sK = a K tile of BN rows, both HD wide.
template <typename T, int QROWS, int HD, int NT>
__device__ __forceinline__ void fwd_issue_s(float (&s)[NT][4], const T* sQ_wg, const T* sK) {
  constexpr int BN = NT * 8;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    Wgmma<T, BN>::template ss<0, 0>(s, desc_kmajor_sw<QROWS>(sQ_wg, kk), desc_kmajor_sw<BN>(sK, kk), kk > 0);
  wgmma_commit();
}

// O (64 x HD, HD = 8 NO) += P V: ap = P as A fragments (k-step kc = keys 16 kc .. 16 kc + 15 of the BN = 16 KC),
// sV = a V tile of BN rows.
template <typename T, int KC, int NO>
__device__ __forceinline__ void fwd_issue_pv(float (&acc)[NO][4], const uint32_t (&ap)[KC][4], const T* sV) {
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) Wgmma<T, NO * 8>::template rs<1>(acc, ap[kc], desc_mnmajor_sw<KC * 16>(sV, kc), 1);
  wgmma_commit();
}

// Mask / scale and the online-softmax step of the key block starting at key j0, for the warp whose 16 query rows
// start at row_w (within the sequence): s becomes P, alpha the factors for O. Interior tiles keep the raw Q.K
// products and fold the scale into the exp2 argument (OnlineSoftmax::step). kBias: the kernel variant for calls with
// a bias (make_logits adds it, from pre: the BiasPrefetch the kernel read the block's bias into, from the staged tile
// or from global memory; on a fully visible fragment it leaves softmax_scale * s + bias in natural units and log2(e)
// to the step). kScaledP: P comes out multiplied by 1 / (1 - p) (OnlineSoftmax::step_scaled; the dropout forward,
// whose row state init was given rscale = 1 / (1 - p)).
template <typename T, bool kBias = false, bool kScaledP = false, int NT, typename Pre = BiasPrefetch<T, NT>>
__device__ __forceinline__ void fwd_softmax_step(OnlineSoftmax<NT>& sm, float (&s)[NT][4], float (&alpha)[2],
                                                 const Params& p, const Mask& mk, int n, int h, int row_w, int j0,
                                                 int lane, const Pre* pre = nullptr) {
  const bool need_mask = !mk.tile_all_visible(row_w, 16, j0, NT * 8);
  const bool fold = !need_mask && !kBias && p.scale_log2 > 0.f;
  float sc_bias = 1.f;
  if (!fold)
    make_logits<T, NT, false, kBias>(s, p, mk, need_mask, n, h, row_w, j0, lane, pre, kBias ? &sc_bias : nullptr);
  if constexpr (kScaledP)
    sm.step_scaled(s, alpha, fold ? p.scale_log2 : sc_bias, p.dropout_log2_rscale);
  else
    sm.step(s, alpha, fold ? p.scale_log2 : sc_bias);
}

}  // namespace sinkattn::cuda::sm90

// CUDA backend, Hopper: the products of one step of the dK dV kernels (SPEC.md section 3), per query block of BM
// rows and query head of the KV group, over the block's keys:
//   S^T  = K Q^T                          dP^T = V dO^T
//   P^T  = exp2(S^T * scale * log2(e) - LSE2)
//   dS^T = P^T (dP^T - D)                 (D - d_lse from the preprocess; with dropout P^T and dP^T * keep / (1 - p))
//   dV  += P^T dO                         dK  += dS^T Q                 dQ = dS K (added to ws_dq: bwd_sm90_dq.cuh)
// The wgmma chains are issued and committed (one commit group each), not waited for: the kernels order the waits.
// Accumulators are in the mma.sync C layout of a warp's 16 rows (rows g, g + 8; columns 8 nt + 2 t, + 1), so the
// softmax part works with mask.cuh / scores.cuh unchanged. Operands in the 128-byte-swizzled row panels of
// sm90_common.cuh.
//   bwd_dkdv_sm90.cuh (head-dim tiles 64 / 128): each warpgroup owns 64 keys; S^T / dP^T of its keys from shared
//     memory, dV / dK with A = P^T / dS^T from registers, dQ from the staged dS^T;
//   bwd_dkdv_sm90_wide.cuh (tile 256): S^T / dP^T split by query columns, dV / dK / dQ by head-dim columns, every
//     operand from shared memory (descriptors as a base plus a constant per k-step).
#pragma once

#include <cstdint>

#include "cuda/common.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/hopper/wgmma_ops.cuh"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"
#include "cuda/scores.cuh"

namespace sinkattn::cuda::sm90 {

// ---- bwd_dkdv_sm90.cuh: a warpgroup's 64 keys x the step's BM = 8 NT queries.

// S^T = K Q^T (or dP^T = V dO^T: rows = V, q = dO): k_wg = the warpgroup's 64 rows of the BN-row K tile, q = the
// step's BM-row Q tile; an m64nBMk16 chain over the head dim, both operands K-major.
template <typename T, int BN, int HD, int NT>
__device__ __forceinline__ void issue_st(float (&st)[NT][4], const T* k_wg, const T* q) {
  constexpr int BM = NT * 8;
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    Wgmma<T, BM>::template ss<0, 0>(st, desc_kmajor_sw<BN>(k_wg, kk), desc_kmajor_sw<BM>(q, kk), kk > 0);
  wgmma_commit();
}
// dP^T = V dO^T: the same chain.
template <typename T, int BN, int HD, int NT>
__device__ __forceinline__ void issue_dpt(float (&dpt)[NT][4], const T* v_wg, const T* d_out) {
  issue_st<T, BN, HD>(dpt, v_wg, d_out);
}

// P^T = exp2(sc * S^T - LSE2), s in place, lse2 = the step's LSE2 (indexed by query). Interior tiles without a bias
// keep the raw products (sc = scale log2(e)); else make_logits masks / scales / adds the bias (pre: a BiasPrefetch or
// a BiasSmemView, bias_staging.cuh), and a fully visible biased fragment comes back in natural units (sc = log2(e),
// make_logits' sc_out: sc_bias, the caller's 1).
template <typename T, bool kBias, int NT, typename Pre>
__device__ __forceinline__ void pt_from_st(float (&s)[NT][4], const Params& p, const Mask& mk, int n, int h, int key_w,
                                           int i0, int lane, const float* lse2, const Pre* pre, float& sc_bias) {
  const int t = lane & 3;
  const bool need_mask = !mk.tile_all_visible(i0, NT * 8, key_w, 16);
  const bool fold = !need_mask && !kBias;
  if (!fold)
    make_logits<T, NT, true, kBias>(s, p, mk, need_mask, n, h, key_w, i0, lane, pre, kBias ? &sc_bias : nullptr);
  const float sc = fold ? p.scale_log2 : sc_bias;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2(fmaf(s[nt][e], sc, -lse2[nt * 8 + 2 * t + (e & 1)]));
}

// P^T (rounded to T) as the A operand of dV += P^T dO; kDropout: P^T * keep / (1 - p) (keep: keep_producers.cuh,
// DkvKeepBits), through sd.
template <typename T, bool kDropout, int NT, int KC, typename Keep>
__device__ __forceinline__ void pack_pt(const float (&pt)[NT][4], uint32_t (&ap)[KC][4], float (&sd)[NT][4],
                                        const Keep& keep, float rscale) {
  if constexpr (kDropout) {
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) sd[nt][e] = keep(nt, e) ? pt[nt][e] * rscale : 0.f;
    pack_a_frags<T>(sd, ap);
  } else {
    (void)sd;
    (void)keep;
    (void)rscale;
    pack_a_frags<T>(pt, ap);
  }
}

// dV += P^T dO (or dK += dS^T Q): A = P^T from registers (k-step kc = queries 16 kc .. 16 kc + 15), B = the step's
// BM-row dO tile read MN-major; an m64nHDk16 chain over the BM queries.
template <typename T, int HD, int NO, int KC>
__device__ __forceinline__ void issue_dv(float (&acc_dv)[NO][4], const uint32_t (&pt)[KC][4], const T* d_out) {
#pragma unroll
  for (int kc = 0; kc < KC; ++kc) Wgmma<T, HD>::template rs<1>(acc_dv, pt[kc], desc_mnmajor_sw<KC * 16>(d_out, kc), 1);
  wgmma_commit();
}
// dK += dS^T Q: the same chain, A = dS^T from registers, B = Q.
template <typename T, int HD, int NO, int KC>
__device__ __forceinline__ void issue_dk(float (&acc_dk)[NO][4], const uint32_t (&dst)[KC][4], const T* q) {
  issue_dv<T, HD>(acc_dk, dst, q);
}

// dS^T = P^T (dP^T - D), in dpt's place (pt = P^T, dpsum = the step's D - d_lse); kDropout: dP^T * keep / (1 - p).
template <bool kDropout, int NT, typename Keep>
__device__ __forceinline__ void dst_from_dpt(float (&dpt)[NT][4], const float (&pt)[NT][4], const float* dpsum,
                                             int t, const Keep& keep, float rscale) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pr = pt[nt][e];
      float dp = dpt[nt][e];
      if constexpr (kDropout) dp = keep(nt, e) ? dp * rscale : 0.f;
      dpt[nt][e] = pr != 0.f ? pr * (dp - dpsum[nt * 8 + 2 * t + (e & 1)]) : 0.f;
    }
}

// A warp's 16 x 8 NT fragment (rows r0, r0 + 8; columns 8 nt + 2 t, + 1, from c0) rounded to T into a BN-row tile of
// the swizzled row panels: dS^T into sdS for dQ (the wide kernel: P^T into sP as well).
template <typename T, int BN, int NT>
__device__ __forceinline__ void store_frag_sw(T* tile, const float (&f)[NT][4], int r0, int c0, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int c = c0 + nt * 8 + 2 * t;
    *reinterpret_cast<uint32_t*>(tile + sw_offset<BN>(r0, c)) = ElemTraits<T>::pack(f[nt][0], f[nt][1]);
    *reinterpret_cast<uint32_t*>(tile + sw_offset<BN>(r0 + 8, c)) = ElemTraits<T>::pack(f[nt][2], f[nt][3]);
  }
}
// The same rows of zeros (a warpgroup whose keys see no query of the step).
template <int BN, int NT, typename T>
__device__ __forceinline__ void store_zero_frag_sw(T* tile, int r0, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int c = nt * 8 + 2 * t;
    *reinterpret_cast<uint32_t*>(tile + sw_offset<BN>(r0, c)) = 0u;
    *reinterpret_cast<uint32_t*>(tile + sw_offset<BN>(r0 + 8, c)) = 0u;
  }
}

// dQ = dS K over the block's BN keys (k-step kk = keys 16 kk .. 16 kk + 15) for the product's 64 queries from m0 and
// 8 NQ columns from n0: A = dS (the staged dS^T sdS read MN-major: its column panel m0 / 64), B = K read MN-major
// from column n0 (at head dim 64 possibly 64 bytes into the swizzle atom: the hardware swizzles the absolute
// address); an m64n(8 NQ)k16 chain.
template <typename T, int BN, int NQ>
__device__ __forceinline__ void issue_dq(float (&accq)[NQ][4], const T* sdS, int m0, const T* sK, int n0) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    Wgmma<T, NQ * 8>::template ss<1, 1>(accq, desc_mnmajor_sw<BN>(sdS + (m0 / 64) * BN * 64, kk),
                                        desc_mnmajor_sw<BN>(sK + (n0 / 64) * BN * 64 + n0 % 64, kk), kk > 0);
  wgmma_commit();
}

// kBias: dS^T (fp32) of the step to the d_bias workspace (scores.cuh, store_dbias_ws; rows = the warp's keys from
// key_w, columns = the step's queries from i0). Params::ws_dbias_heads = h_kv (a bias broadcast over the heads,
// KernelChoice::dbias_group_sum): summed over the group's query heads first, which are consecutive steps of one query
// block (query-block-major order, heads ascending: a fixed order), in shared memory (sDb: [NT * 4][NTHREADS] floats),
// and stored once, at the last head (ih = group - 1), in the KV head's slot; the warpgroup is active for every head
// of the block or for none (the mask is the heads' own). dst is not read after this.
template <int NT, int NTHREADS>
__device__ __forceinline__ void store_dbias_step(const Params& p, float (&dst)[NT][4], float* sDb, int n, int h, int hk,
                                                 const int& ih, int key_w, int i0, int len_q, int len_kv, int tid,
                                                 int lane) {
  if (p.ws_dbias_heads == p.h_q) {
    store_dbias_ws<NT, true>(p, dst, n, h, key_w, i0, len_q, len_kv, lane);
  } else {
    const bool first = ih == 0, last = ih == p.group - 1;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float& a = sDb[(nt * 4 + e) * NTHREADS + tid];
        const float v = first ? dst[nt][e] : a + dst[nt][e];
        if (last) dst[nt][e] = v;
        else a = v;
      }
    if (last) store_dbias_ws<NT, true>(p, dst, n, hk, key_w, i0, len_q, len_kv, lane);
  }
}

// ---- bwd_dkdv_sm90_wide.cuh (tile 256): every operand from shared memory. The descriptors of a chain's k-steps are
// one base descriptor plus a constant (the start address's field, bits 0-13, holds address / 16 and the tiles lie
// inside shared memory, so the sum never carries out of it): the 16 k-steps of the S^T / dP^T chains then cost no
// register each. kstep_desc: k-step kk of a K-major operand of `rows` rows; mnstep_desc: of an MN-major one.
__device__ __forceinline__ uint64_t kstep_desc(uint64_t d0, int kk, int rows) {
  return d0 + static_cast<uint64_t>(((kk / 4) * rows * 128 + (kk % 4) * 32) >> 4);
}
__device__ __forceinline__ uint64_t mnstep_desc(uint64_t d0, int kk) {
  return d0 + static_cast<uint64_t>((kk * 16 * 128) >> 4);
}

// S^T = K Q^T (or dP^T = V dO^T) for the warpgroup's 8 NT query columns over all BN keys: an m64n(8 NT)k16 chain over
// the head dim, A = K (V) rows from descriptor dk0, B = the columns' Q (dO) rows from dq0, both K-major.
template <typename T, int HD, int BN, int BM, int NT>
__device__ __forceinline__ void issue_st_desc(float (&st)[NT][4], uint64_t dk0, uint64_t dq0) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk)
    Wgmma<T, NT * 8>::template ss<0, 0>(st, kstep_desc(dk0, kk, BN), kstep_desc(dq0, kk, BM), kk > 0);
  wgmma_commit();
}

// dV += P^T dO (or dK += dS^T Q) for the warpgroup's 8 NO head-dim columns: A = sP (sdS) K-major from dp0, B = the
// columns' dO (Q) read MN-major from dn0; an m64n(8 NO)k16 chain over the BM queries.
template <typename T, int BN, int BM, int NO>
__device__ __forceinline__ void issue_mma_desc(float (&acc)[NO][4], uint64_t dp0, uint64_t dn0) {
#pragma unroll
  for (int kc = 0; kc < BM / 16; ++kc)
    Wgmma<T, NO * 8>::template ss<0, 1>(acc, kstep_desc(dp0, kc, BN), mnstep_desc(dn0, kc), 1);
  wgmma_commit();
}

// dQ = dS K for the warpgroup's 8 NQ head-dim columns: A = sdS read MN-major from dds0, B = the columns' K read
// MN-major from dk0; an m64n(8 NQ)k16 chain over the BN keys.
template <typename T, int BN, int NQ>
__device__ __forceinline__ void issue_dq_desc(float (&accq)[NQ][4], uint64_t dds0, uint64_t dk0) {
#pragma unroll
  for (int kk = 0; kk < BN / 16; ++kk)
    Wgmma<T, NQ * 8>::template ss<1, 1>(accq, mnstep_desc(dds0, kk), mnstep_desc(dk0, kk), kk > 0);
  wgmma_commit();
}

// P^T = exp2(sc * S^T - LSE2) of the warpgroup's queries ic .. ic + 8 NT - 1 (columns c0 .. of the step's lse2; no
// bias): interior tiles keep the raw products (sc = scale log2(e)), others are masked and scaled by make_logits.
template <typename T, int NT>
__device__ __forceinline__ void pt_from_st_cols(float (&s)[NT][4], const Params& p, const Mask& mk, int n, int h,
                                                int key_w, int ic, int lane, const float* lse2, int c0, int t) {
  const bool need_mask = !mk.tile_all_visible(ic, NT * 8, key_w, 16);
  if (need_mask) make_logits<T, NT, true, false>(s, p, mk, true, n, h, key_w, ic, lane);
  const float sc = need_mask ? 1.f : p.scale_log2;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2(fmaf(s[nt][e], sc, -lse2[c0 + nt * 8 + 2 * t + (e & 1)]));
}

// dS^T = P^T (dP^T - D) of the same columns (no dropout), in dpt's place.
template <int NT>
__device__ __forceinline__ void dst_from_dpt_cols(float (&dpt)[NT][4], const float (&pt)[NT][4], const float* dpsum,
                                                  int c0, int t) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float pr = pt[nt][e];
      dpt[nt][e] = pr != 0.f ? pr * (dpt[nt][e] - dpsum[c0 + nt * 8 + 2 * t + (e & 1)]) : 0.f;
    }
}

}  // namespace sinkattn::cuda::sm90

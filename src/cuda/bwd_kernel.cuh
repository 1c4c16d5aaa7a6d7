// CUDA backend: backward kernels (SPEC.md section 3), templated on the head-dim tile.
//   dq kernel   (grid: query blocks, h_q, b; like the forward): per visible key block
//                 P = exp2(x - LSE2), dP = dO V^T * keep / (1 - p), dS = P (dP - D + d_lse),
//                 dQ += dS K; dQ *= softmax_scale. With a bias, dS (fp32) goes to the d_bias workspace.
//   dK dV kernel (grid: key blocks, h_kv, b): for every query head of the KV group and every query block
//                 that sees the key block: dV += (P * keep / (1 - p))^T dO, dK += dS^T Q; dK *= softmax_scale.
//                 The GQA sum over the group happens in registers, in a fixed order.
// deterministic = 1, or a bias (the dq kernel writes dS for d_bias): the dq kernel above (no float atomics;
//   every output bitwise reproducible).
// deterministic = 0 (default) without bias: no dq kernel; the dK dV kernel also computes dQ += dS K per tile (dS^T staged in
//   shared memory) and adds it with fp32 atomics into p.ws_dq (5 instead of 7 tile products); the postprocess
//   (bwd_small.cu) writes dq = softmax_scale * ws_dq in the dtype.
// Per-row inputs come from the preprocess pass (bwd_small.cu): LSE2 = LSE * log2(e) (+inf for rows that see
// no key or are padding, so their P is exactly 0) and Dp = D - d_lse.
// dS enters the dK and dQ products rounded to T, or at tile 32 as two terms of T (tiles::bwd_split_ds).
#pragma once

#include "cuda/dropout.cuh"
#include "cuda/bwd_rows.cuh"
#include "cuda/epilogue.cuh"
#include "cuda/mainloop.cuh"
#include "cuda/mask.cuh"
#include "cuda/prologue.cuh"
#include "cuda/scheduler.cuh"
#include "cuda/scores.cuh"

namespace sinkattn::cuda {

template <typename T, int HD>
__global__ void __launch_bounds__(DqTraits<HD>::kThreads, 1) bwd_dq_kernel(const Params p) {
  using Tr = DqTraits<HD>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, LD = Tr::kStride, NT = BN / 8, NO = HD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sdO = sQ + BM * LD;
  T* sK = sdO + BM * LD;      // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;   // [2][BN][LD]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2;
  const QueryTile<BM> qt(p, scheduled_tile(p.window_right >= 0));
  const int h = qt.h, n = qt.n, m0 = qt.m0;
  const SeqInfo& sq = qt.sq;
  if (qt.outside()) return;
  T* dq = qt.template q_rows<T>(p.dq, p.dq_st);
  if (qt.padding()) {  // padding rows: dq = 0 (SPEC 3)
    zero_rows(dq, p.dq_st.s, qt.rows(), p.d, tid, Tr::kThreads);
    return;
  }

  const Mask mk(p, sq);
  int nb_lo, nb_hi;
  qt.template key_blocks<BN>(mk, nb_lo, nb_hi);

  const T* qg = qt.template q_rows<const T>(p.q, p.q_st);
  const T* dog = qt.template q_rows<const T>(p.d_out, p.dout_st);
  const T* kg = qt.template kv_rows<const T>(p.k, p.k_st);
  const T* vg = qt.template kv_rows<const T>(p.v, p.v_st);

  load_tile_async<BM, HD, Tr::kThreads>(sQ, qg, p.q_st.s, sq.len_q - m0, p.d, tid);
  load_tile_async<BM, HD, Tr::kThreads>(sdO, dog, p.dout_st.s, sq.len_q - m0, p.d_v, tid);
  if (nb_lo < nb_hi) {
    const int j0 = nb_lo * BN;
    load_tile_async<BN, HD, Tr::kThreads>(sK, kg + j0 * p.k_st.s, p.k_st.s, sq.len_kv - j0, p.d, tid);
    load_tile_async<BN, HD, Tr::kThreads>(sV, vg + j0 * p.v_st.s, p.v_st.s, sq.len_kv - j0, p.d_v, tid);
  }
  cp_async_commit();

  const int row_w = m0 + warp * 16;
  float lse2[2], dpr[2];
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row_w + g + 8 * r;
    if (i < sq.len_q) {
      const int64_t wr = h * p.rows_total_q + ws_row(p, sq, n, i);
      lse2[r] = p.ws_lse2[wr];
      dpr[r] = p.ws_dp[wr];
    } else {
      lse2[r] = INFINITY;
      dpr[r] = 0.f;
    }
  }
  const Dropout dp(p, n, h);
  float acc[NO][4];
  zero_acc(acc);

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (nb + 1 < nb_hi) {
      const int j1 = (nb + 1) * BN;
      load_tile_async<BN, HD, Tr::kThreads>(sK + (buf ^ 1) * BN * LD, kg + j1 * p.k_st.s, p.k_st.s, sq.len_kv - j1,
                                            p.d, tid);
      load_tile_async<BN, HD, Tr::kThreads>(sV + (buf ^ 1) * BN * LD, vg + j1 * p.v_st.s, p.v_st.s, sq.len_kv - j1,
                                            p.d_v, tid);
    }
    cp_async_commit();
    const int j0 = nb * BN;
    const T* k_cur = sK + buf * BN * LD;
    const T* v_cur = sV + buf * BN * LD;

    float s[NT][4], dpv[NT][4];
    zero_acc(s);
    zero_acc(dpv);
    gemm_abt<T, NT, HD, LD>(s, sQ + warp * 16 * LD, k_cur, lane);
    gemm_abt<T, NT, HD, LD>(dpv, sdO + warp * 16 * LD, v_cur, lane);
    const bool need_mask = !mk.tile_all_visible(m0, BM, j0, BN);
    make_logits<T, NT, false>(s, p, mk, need_mask, n, h, row_w, j0, lane);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float f[4] = {1.f, 1.f, 1.f, 1.f};
      if (p.dropout) dp.factors<false>(row_w, j0 + nt * 8, p.s_kv, lane, f);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int r = e >> 1;
        const float pr = fast_exp2(s[nt][e] - lse2[r]);  // P_ij (0 when masked or the row is empty)
        float dpij = dpv[nt][e];
        if (p.dropout && pr != 0.f) dpij *= f[e];
        s[nt][e] = pr != 0.f ? pr * (dpij - dpr[r]) : 0.f;  // dS_ij
      }
    }
    if (p.ws_dbias) store_dbias_ws<NT, false>(p, s, n, h, row_w, j0, sq.len_q, sq.len_kv, lane);
    if constexpr (tiles::bwd_split_ds(HD))  // dS as two terms of T (tiles.hpp says why)
      gemm_pb_split<T, NT, NO, LD>(acc, s, k_cur, lane);
    else
      gemm_pb<T, NT, NO, LD>(acc, s, k_cur, lane);
  }
  cp_async_wait<0>();
  // Padding rows [len_q, rows_q) of a dense batch get dq = 0 exactly (SPEC 3).
  store_fragment<T, NO>(dq + warp * 16 * p.dq_st.s, p.dq_st.s, sq.rows_q - row_w, p.d, acc,
                        row_w + g < sq.len_q ? p.softmax_scale : 0.f, row_w + g + 8 < sq.len_q ? p.softmax_scale : 0.f,
                        lane);
}

// kExtra: the call has a bias or dropout (compiled out of the common variant).
template <typename T, int HD, bool kExtra>
__global__ void __launch_bounds__(DkvTraits<HD>::kThreads, 1) bwd_dkdv_kernel(const Params p) {
  using Tr = DkvTraits<HD>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, LD = Tr::kStride, NT = BM / 8, NO = HD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw);
  T* sV = sK + BN * LD;
  T* sQ = sV + BN * LD;        // [2][BM][LD]
  T* sdO = sQ + 2 * BM * LD;   // [2][BM][LD]
  float* sL = reinterpret_cast<float*>(sdO + 2 * BM * LD);  // [2][BM] LSE2
  float* sD = sL + 2 * BM;                                 // [2][BM] D - d_lse
  T* sdS = reinterpret_cast<T*>(sD + 2 * BM);              // [BN][BM + 8] dS^T of the step (fused dq only)
  constexpr int LDS = Tr::kStrideS;
  // Tr::kSplitDS (tiles::bwd_split_ds): dS enters the dK and dQ products as hi + lo terms of T; sdS holds the hi terms
  // and sdS_lo the lo ones.
  [[maybe_unused]] T* const sdS_lo = Tr::kSplitDS ? sdS + BN * LDS : nullptr;  // [BN][BM + 8]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int g = lane >> 2, t = lane & 3;
  const KeyTile<BN> kt(p, scheduled_tile(false));
  const int hk = kt.hk, n = kt.n, j0 = kt.j0;
  const SeqInfo& sq = kt.sq;
  if (kt.outside()) return;
  T* dk = kt.template kv_rows<T>(p.dk, p.dk_st);
  T* dv = kt.template kv_rows<T>(p.dv, p.dv_st);
  const int rows_out = kt.rows();

  const Mask mk(p, sq);
  int qb_lo, nq;
  kt.template query_blocks<BM>(mk, qb_lo, nq);
  const int iters = nq * p.group;  // (query head of the group, query block), head-major

  const T* kg = kt.template kv_rows<const T>(p.k, p.k_st);
  const T* vg = kt.template kv_rows<const T>(p.v, p.v_st);
  load_tile_async<BN, HD, Tr::kThreads>(sK, kg, p.k_st.s, sq.len_kv - j0, p.d, tid);
  load_tile_async<BN, HD, Tr::kThreads>(sV, vg, p.v_st.s, sq.len_kv - j0, p.d_v, tid);

  // Step `it` = (query head hk * group + it / nq, query block qb_lo + it % nq), head-major; (ih, iq) are it / nq
  // and it % nq, tracked without a division. Q and dO go to shared memory through cp.async; LSE2 and D of the
  // block's rows are read into registers by issue() (pf.load) and stored to shared memory at the end of the
  // current step (pf.store), so no warp waits on their global latency.
  RowStatsPrefetch<BM> pf;
  auto issue = [&](int buf, int ih, int iq) {
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    const T* qg = kt.template q_rows<const T>(p.q, p.q_st, h, i0);
    const T* dog = kt.template q_rows<const T>(p.d_out, p.dout_st, h, i0);
    load_tile_async<BM, HD, Tr::kThreads>(sQ + buf * BM * LD, qg, p.q_st.s, sq.len_q - i0, p.d, tid);
    load_tile_async<BM, HD, Tr::kThreads>(sdO + buf * BM * LD, dog, p.dout_st.s, sq.len_q - i0, p.d_v, tid);
    static_assert(BM <= Tr::kThreads, "one row per thread");
    pf.load(p, sq, n, h, i0, tid);
  };
  if (iters > 0) {
    issue(0, 0, 0);
    pf.store(sL, sD, 0, tid);
  }
  cp_async_commit();

  float acc_dk[NO][4], acc_dv[NO][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);
  const int key_w = j0 + warp * 16;  // first key of this warp
  // Query rows that see some key of this warp: query blocks outside [qw_lo, qw_hi) are skipped by this warp
  // alone (exact: P = dS = 0 there); with the fused dq it still writes zeros to its rows of sdS.
  int qw_lo = 0, qw_hi = 0;
  if (key_w < sq.len_kv) mk.query_range(key_w, min(key_w + 16, sq.len_kv), qw_lo, qw_hi);

  int ih = 0, iq = 0;  // it / nq, it % nq
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    cp_async_wait<0>();
    __syncthreads();
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    int ih_next = ih, iq_next = iq + 1;
    if (iq_next == nq) iq_next = 0, ++ih_next;
    const bool prefetch = it + 1 < iters;
    if (prefetch) issue(buf ^ 1, ih_next, iq_next);
    cp_async_commit();
    const T* q_cur = sQ + buf * BM * LD;
    const T* do_cur = sdO + buf * BM * LD;
    const float* l_cur = sL + buf * BM;
    const float* d_cur = sD + buf * BM;
    const Dropout dp(p, n, h);
    if (i0 < qw_hi && i0 + BM > qw_lo) {
      float s[NT][4], dpv[NT][4];  // transposed tiles: rows = this warp's 16 keys, cols = BM queries
      zero_acc(s);
      zero_acc(dpv);
      gemm_abt<T, NT, HD, LD>(s, sK + warp * 16 * LD, q_cur, lane);
      gemm_abt<T, NT, HD, LD>(dpv, sV + warp * 16 * LD, do_cur, lane);
      const bool need_mask = !mk.tile_all_visible(i0, BM, j0, BN);
      // Interior tiles without bias keep the raw products: P = exp2(s * scale * log2(e) - LSE2) in one FFMA.
      const bool fold = !need_mask && !(kExtra && p.bias != nullptr);
      if (!fold) make_logits<T, NT, true, kExtra>(s, p, mk, need_mask, n, h, key_w, i0, lane);
      const float sc = fold ? p.scale_log2 : 1.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        float keep[4] = {1.f, 1.f, 1.f, 1.f};
        if (kExtra && p.dropout) dp.factors<true>(key_w, i0 + nt * 8, p.s_kv, lane, keep);
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = nt * 8 + 2 * t + (e & 1);  // query row within the block
          const float pr = fast_exp2(fmaf(s[nt][e], sc, -l_cur[c]));
          const float f = kExtra && p.dropout && pr != 0.f ? keep[e] : 1.f;
          s[nt][e] = pr != 0.f ? pr * (dpv[nt][e] * f - d_cur[c]) : 0.f;  // dS^T
          dpv[nt][e] = pr * f;                                              // (P * keep / (1 - p))^T
        }
      }
      if (p.ws_dq) {  // stage dS^T (rounded to T, as for the dK product) for dQ += dS K
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int c = nt * 8 + 2 * t;
          if constexpr (Tr::kSplitDS) {
            const int ea = (warp * 16 + g) * LDS + c, eb = ea + 8 * LDS;  // rows g and g + 8 of this warp's keys
            pack_split<T>(s[nt][0], s[nt][1], *reinterpret_cast<uint32_t*>(sdS + ea),
                          *reinterpret_cast<uint32_t*>(sdS_lo + ea));
            pack_split<T>(s[nt][2], s[nt][3], *reinterpret_cast<uint32_t*>(sdS + eb),
                          *reinterpret_cast<uint32_t*>(sdS_lo + eb));
          } else {
            *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g) * LDS + c) = ElemTraits<T>::pack(s[nt][0], s[nt][1]);
            *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8) * LDS + c) = ElemTraits<T>::pack(s[nt][2], s[nt][3]);
          }
        }
      }
      gemm_pb<T, NT, NO, LD>(acc_dv, dpv, do_cur, lane);
      if constexpr (Tr::kSplitDS)
        gemm_pb_split<T, NT, NO, LD>(acc_dk, s, q_cur, lane);
      else
        gemm_pb<T, NT, NO, LD>(acc_dk, s, q_cur, lane);
    } else if (p.ws_dq) {  // this warp's keys see no query of the block: dS^T rows are zero
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int c = nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g) * LDS + c) = 0u;
        *reinterpret_cast<uint32_t*>(sdS + (warp * 16 + g + 8) * LDS + c) = 0u;
        if constexpr (Tr::kSplitDS) {
          *reinterpret_cast<uint32_t*>(sdS_lo + (warp * 16 + g) * LDS + c) = 0u;
          *reinterpret_cast<uint32_t*>(sdS_lo + (warp * 16 + g + 8) * LDS + c) = 0u;
        }
      }
    }
    if (p.ws_dq) {
      // dQ_i += sum_j dS_ij k_j over this block's keys (SPEC 3; softmax_scale applied in the postprocess).
      // Warp w computes m-tile w % (BM / 16) of the BM query rows, column chunks cg, cg + CG, ... of width CW.
      constexpr int MTILES = BM / 16, CG = Tr::kWarps / MTILES;
      constexpr int CW = HD <= 128 ? HD / 2 : 32, NC = CW / 8, CHUNKS = HD / CW;
      static_assert(Tr::kWarps % MTILES == 0 && NC % 2 == 0, "dq split");
      __syncthreads();
      const int mtile = warp % MTILES;
      const int ia = i0 + mtile * 16 + g, ib = ia + 8;
      float* rowa = ia < sq.len_q ? ws_dq_row(p, sq, n, h, ia) : nullptr;
      float* rowb = ib < sq.len_q ? ws_dq_row(p, sq, n, h, ib) : nullptr;
#pragma unroll 1
      for (int ch = warp / MTILES; ch < CHUNKS; ch += CG) {
        if (ch * CW >= p.d) break;
        float accq[NC][4];
        zero_acc(accq);
        gemm_atb<T, NC, BN, LDS, LD>(accq, sdS + mtile * 16, sK + ch * CW, lane);
        if constexpr (Tr::kSplitDS) gemm_atb<T, NC, BN, LDS, LD>(accq, sdS_lo + mtile * 16, sK + ch * CW, lane);
#pragma unroll
        for (int nt = 0; nt < NC; ++nt) {
          const int col = ch * CW + nt * 8 + 2 * t;
          if (ch * CW + nt * 8 >= p.d) break;
          if (rowa) atomic_add2(rowa + col, accq[nt][0], accq[nt][1]);
          if (rowb) atomic_add2(rowb + col, accq[nt][2], accq[nt][3]);
        }
      }
    }
    if (prefetch) pf.store(sL, sD, buf ^ 1, tid);
    ih = ih_next;
    iq = iq_next;
  }
  cp_async_wait<0>();
  const int rows_valid = rows_out - warp * 16;
  store_fragment<T, NO>(dk + warp * 16 * p.dk_st.s, p.dk_st.s, rows_valid, p.d, acc_dk, p.softmax_scale,
                        p.softmax_scale, lane);
  store_fragment<T, NO>(dv + warp * 16 * p.dv_st.s, p.dv_st.s, rows_valid, p.d_v, acc_dv, 1.f, 1.f, lane);
}

}  // namespace sinkattn::cuda

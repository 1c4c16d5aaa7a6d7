// CUDA backend: forward kernel (SPEC.md section 2), FlashAttention-2 structure on sm_80 tensor cores.
// Grid (query blocks, h_q, b); each warp owns kMT x 16 query rows (params.cuh). Q stays in shared memory; K and V blocks of the
// visible band stream through a double-buffered cp.async pipeline; online softmax with the sink (softmax.cuh);
// dropout on P for the P V product only (the normaliser l uses the undropped P, SPEC 2); epilogue writes
// out = acc / l and softmax_lse (natural log, sink included).
#pragma once

#include "cuda/dropout.cuh"
#include "cuda/epilogue.cuh"
#include "cuda/mainloop.cuh"
#include "cuda/mask.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/prologue.cuh"
#include "cuda/scheduler.cuh"
#include "cuda/scores.cuh"
#include "cuda/softmax.cuh"

namespace sinkattn::cuda {

// kExtra: the call has a bias or dropout. The common variant (false) compiles both out, so its mainloop is the
// products, the edge-tile mask and the online softmax only.
// kMinB, kBN: launch-bounds minimum blocks per SM and keys per step (FwdTraits by default).
// kPaged: k, v are page pools read through p.page_table (paged KV, SPEC 1; paged_kv.cuh), only with kExtra = false.
template <typename T, int HD, bool kExtra, int kMinB = FwdTraits<HD>::kMinBlocks, int kBN = FwdTraits<HD>::kBlockN,
          bool kPaged = false>
__global__ void __launch_bounds__(FwdTraits<HD>::kThreads, kMinB) fwd_kernel(const Params p) {
  using Tr = FwdTraits<HD>;
  constexpr int BM = Tr::kBlockM, BN = kBN, LD = Tr::kStride, NT = BN / 8, NO = HD / 8, MT = Tr::kMT;
  constexpr int WM = 16 * MT;  // query rows per warp
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * LD;       // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;   // [2][BN][LD]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const QueryTile<BM> qt(p, scheduled_tile(p.window_right >= 0));
  const int h = qt.h, n = qt.n, m0 = qt.m0;
  const SeqInfo& sq = qt.sq;
  if (qt.outside()) return;

  T* out = qt.template q_rows<T>(p.out, p.out_st);
  const float sigma = sink_value(p, h);
  if (qt.padding()) {  // padding rows of a dense batch
    fwd_store_padding_rows(p, sq, n, h, out, m0, qt.rows(), sigma, tid, Tr::kThreads);
    return;
  }

  const Mask mk(p, sq);
  int nb_lo, nb_hi;
  qt.template key_blocks<BN>(mk, nb_lo, nb_hi);

  const T* qg = qt.template q_rows<const T>(p.q, p.q_st);
  const T* kg = qt.template kv_rows<const T>(p.k, p.k_st);
  const T* vg = qt.template kv_rows<const T>(p.v, p.v_st);

  load_tile_async<BM, HD, Tr::kThreads>(sQ, qg, p.q_st.s, sq.len_q - m0, p.d, tid);
  if (nb_lo < nb_hi) {
    const int j0 = nb_lo * BN;
    if constexpr (kPaged) {
      load_kv_tiles_async<BN, HD, Tr::kThreads>(sK, sV, static_cast<const T*>(p.k), static_cast<const T*>(p.v),
                                                KvRows(p, sq, n, qt.hk), j0, 0, sq.len_kv - j0, p.d, p.d_v, tid);
    } else {
      load_tile_async<BN, HD, Tr::kThreads>(sK, kg + j0 * p.k_st.s, p.k_st.s, sq.len_kv - j0, p.d, tid);
      load_tile_async<BN, HD, Tr::kThreads>(sV, vg + j0 * p.v_st.s, p.v_st.s, sq.len_kv - j0, p.d_v, tid);
    }
  }
  cp_async_commit();

  OnlineSoftmax<NT> sm[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) sm[mt].init(sigma, lane);
  float acc[MT][NO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero_acc(acc[mt]);
  const int row_w = m0 + warp * WM;  // first query row of this warp (within the sequence)
  // Keys this warp's rows can see: key blocks outside [kw_lo, kw_hi) are skipped by this warp alone (a band's
  // corners, the causal diagonal); skipping is exact: an all-masked tile changes neither m, l nor acc.
  int kw_lo = 0, kw_hi = 0;
  if (row_w < sq.len_q) mk.key_range(row_w, min(row_w + WM, sq.len_q), kw_lo, kw_hi);

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (nb + 1 < nb_hi) {  // prefetch the next K, V block into the other buffer
      const int j1 = (nb + 1) * BN;
      if constexpr (kPaged) {
        load_kv_tiles_async<BN, HD, Tr::kThreads>(sK + (buf ^ 1) * BN * LD, sV + (buf ^ 1) * BN * LD,
                                                  static_cast<const T*>(p.k), static_cast<const T*>(p.v),
                                                  KvRows(p, sq, n, qt.hk), j1, 0, sq.len_kv - j1, p.d, p.d_v, tid);
      } else {
        load_tile_async<BN, HD, Tr::kThreads>(sK + (buf ^ 1) * BN * LD, kg + j1 * p.k_st.s, p.k_st.s, sq.len_kv - j1,
                                              p.d, tid);
        load_tile_async<BN, HD, Tr::kThreads>(sV + (buf ^ 1) * BN * LD, vg + j1 * p.v_st.s, p.v_st.s, sq.len_kv - j1,
                                              p.d_v, tid);
      }
    }
    cp_async_commit();

    const int j0 = nb * BN;
    if (j0 >= kw_hi || j0 + BN <= kw_lo) continue;  // warp-uniform; the next __syncthreads is at the loop top
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero_acc(s[mt]);
    gemm_abt_m<T, MT, NT, HD, LD>(s, sQ + warp * WM * LD, sK + buf * BN * LD, lane);
    // Per-warp decision (warp-uniform): only tiles on the band's edges or the sequence end are masked.
    const bool need_mask = !mk.tile_all_visible(row_w, WM, j0, BN);
    // Interior tiles without bias keep the raw products; the softmax folds the scale into its exp2 argument.
    const bool fold = !need_mask && !(kExtra && p.bias != nullptr) && p.scale_log2 > 0.f;
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if (!fold) make_logits<T, NT, false, kExtra>(s[mt], p, mk, need_mask, n, h, row_w + mt * 16, j0, lane);
      float alpha[2];
      sm[mt].step(s[mt], alpha, fold ? p.scale_log2 : 1.f);
      rescale_rows(acc[mt], alpha);  // only when some row's maximum moved (softmax.cuh)
    }
    if (kExtra && p.dropout) {
      const Dropout dp(p, n, h);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float f[4];
          dp.factors<false>(row_w + mt * 16, j0 + nt * 8, p.s_kv, lane, f);
#pragma unroll
          for (int e = 0; e < 4; ++e) s[mt][nt][e] *= f[e];
        }
    }
    gemm_pb_m<T, MT, NT, NO, LD>(acc, s, sV + buf * BN * LD, lane);
  }
  cp_async_wait<0>();

  // Epilogue: out_i = acc_i / l_i (0 for a row that saw nothing), LSE_i (SPEC 2).
  // Rows [len_q, rows_q) of a dense batch are padding: written as exact zeros (their Q rows were zero-filled,
  // so acc is finite there). Varlen sequences own exactly len_q rows.
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
    fwd_store_rows<T>(p, sq, n, h, out + (warp * WM + mt * 16) * p.out_st.s, row_w + mt * 16, sm[mt], acc[mt], lane);
}

}  // namespace sinkattn::cuda

// CUDA backend: forward kernel (SPEC.md section 2), FlashAttention-2 structure on sm_80 tensor cores.
// Grid (query blocks, h_q, b); each warp owns 16 query rows. Q stays in shared memory; K and V blocks of the
// visible band stream through a double-buffered cp.async pipeline; online softmax with the sink (softmax.cuh);
// dropout on P for the P V product only (the normaliser l uses the undropped P, SPEC 2); epilogue writes
// out = acc / l and softmax_lse (natural log, sink included).
#pragma once

#include "cuda/dropout.cuh"
#include "cuda/epilogue.cuh"
#include "cuda/mainloop.cuh"
#include "cuda/mask.cuh"
#include "cuda/scheduler.cuh"
#include "cuda/scores.cuh"
#include "cuda/softmax.cuh"

namespace sinkattn::cuda {

template <typename T, int HD>
__global__ void __launch_bounds__(FwdTraits<HD>::kThreads, 1) fwd_kernel(const Params p) {
  using Tr = FwdTraits<HD>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, LD = Tr::kStride, NT = BN / 8, NO = HD / 8;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sQ = reinterpret_cast<T*>(smem_raw);
  T* sK = sQ + BM * LD;       // [2][BN][LD]
  T* sV = sK + 2 * BN * LD;   // [2][BN][LD]

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int h = blockIdx.y, n = blockIdx.z;
  const int hk = h / p.group;
  const SeqInfo sq = seq_info(p, n);
  const int m0 = scheduled_block(p.window_right >= 0) * BM;
  if (m0 >= sq.rows_q) return;

  T* out = static_cast<T*>(p.out) + n * p.out_st.b + (sq.q_start + m0) * p.out_st.s + h * p.out_st.h;
  const float sigma = sink_value(p, h);
  if (m0 >= sq.len_q) {
    // Padding rows of a dense batch: out = 0 (SPEC 2); LSE = that of an empty row (finite or -inf).
    const int rows = min(BM, sq.rows_q - m0);
    zero_rows(out, p.out_st.s, rows, p.d_v, tid, Tr::kThreads);
    for (int r = tid; r < rows; r += Tr::kThreads)
      p.softmax_lse[n * p.lse_b + h * p.lse_h + (sq.q_start + m0 + r) * p.lse_s] = sigma;
    return;
  }

  const Mask mk(p, sq);
  const int m1 = min(m0 + BM, sq.len_q);
  int k_lo, k_hi;
  mk.key_range(m0, m1, k_lo, k_hi);
  const int nb_lo = k_lo / BN, nb_hi = (k_hi + BN - 1) / BN;

  const T* qg = static_cast<const T*>(p.q) + n * p.q_st.b + (sq.q_start + m0) * p.q_st.s + h * p.q_st.h;
  const T* kg = static_cast<const T*>(p.k) + n * p.k_st.b + sq.kv_start * p.k_st.s + hk * p.k_st.h;
  const T* vg = static_cast<const T*>(p.v) + n * p.v_st.b + sq.kv_start * p.v_st.s + hk * p.v_st.h;

  load_tile_async<BM, HD, Tr::kThreads>(sQ, qg, p.q_st.s, sq.len_q - m0, p.d, tid);
  if (nb_lo < nb_hi) {
    const int j0 = nb_lo * BN;
    load_tile_async<BN, HD, Tr::kThreads>(sK, kg + j0 * p.k_st.s, p.k_st.s, sq.len_kv - j0, p.d, tid);
    load_tile_async<BN, HD, Tr::kThreads>(sV, vg + j0 * p.v_st.s, p.v_st.s, sq.len_kv - j0, p.d_v, tid);
  }
  cp_async_commit();

  OnlineSoftmax<NT> sm;
  sm.init(sigma, lane);
  float acc[NO][4];
  zero_acc(acc);
  const Dropout dp(p, n, h);
  const int row_w = m0 + warp * 16;  // first query row of this warp (within the sequence)

  for (int nb = nb_lo; nb < nb_hi; ++nb) {
    const int buf = (nb - nb_lo) & 1;
    cp_async_wait<0>();
    __syncthreads();
    if (nb + 1 < nb_hi) {  // prefetch the next K, V block into the other buffer
      const int j1 = (nb + 1) * BN;
      load_tile_async<BN, HD, Tr::kThreads>(sK + (buf ^ 1) * BN * LD, kg + j1 * p.k_st.s, p.k_st.s, sq.len_kv - j1,
                                            p.d, tid);
      load_tile_async<BN, HD, Tr::kThreads>(sV + (buf ^ 1) * BN * LD, vg + j1 * p.v_st.s, p.v_st.s, sq.len_kv - j1,
                                            p.d_v, tid);
    }
    cp_async_commit();

    const int j0 = nb * BN;
    float s[NT][4];
    zero_acc(s);
    gemm_abt<T, NT, HD, LD>(s, sQ + warp * 16 * LD, sK + buf * BN * LD, lane);
    const bool need_mask = !mk.tile_all_visible(m0, BM, j0, BN);
    make_logits<T, NT, false>(s, p, mk, need_mask, n, h, row_w, j0, lane);

    float alpha[2];
    sm.step(s, alpha);
#pragma unroll
    for (int o = 0; o < NO; ++o) {
      acc[o][0] *= alpha[0];
      acc[o][1] *= alpha[0];
      acc[o][2] *= alpha[1];
      acc[o][3] *= alpha[1];
    }
    if (p.dropout) {
      const int g = lane >> 2, t = lane & 3;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int i = row_w + g + ((e & 2) ? 8 : 0), j = j0 + nt * 8 + 2 * t + (e & 1);
          if (s[nt][e] != 0.f) s[nt][e] *= dp.factor(i, j, p.s_kv);
        }
    }
    gemm_pb<T, NT, NO, LD>(acc, s, sV + buf * BN * LD, lane);
  }
  cp_async_wait<0>();

  // Epilogue: out_i = acc_i / l_i (0 for a row that saw nothing), LSE_i (SPEC 2).
  float inv0, inv8, lse0, lse8;
  sm.finalize(0, inv0, lse0);
  sm.finalize(1, inv8, lse8);
  // Rows [len_q, rows_q) of a dense batch are padding: written as exact zeros (their Q rows were zero-filled,
  // so acc is finite there). Varlen sequences own exactly len_q rows.
  const int g = lane >> 2;
  const int rows_valid = sq.rows_q - row_w;
  if (row_w + g >= sq.len_q) inv0 = 0.f;
  if (row_w + g + 8 >= sq.len_q) inv8 = 0.f;
  store_fragment<T, NO>(out + warp * 16 * p.out_st.s, p.out_st.s, rows_valid, p.d_v, acc, inv0, inv8, lane);
  if ((lane & 3) == 0) {
    if (g < rows_valid) p.softmax_lse[n * p.lse_b + h * p.lse_h + (sq.q_start + row_w + g) * p.lse_s] = lse0;
    if (g + 8 < rows_valid) p.softmax_lse[n * p.lse_b + h * p.lse_h + (sq.q_start + row_w + g + 8) * p.lse_s] = lse8;
  }
}

}  // namespace sinkattn::cuda

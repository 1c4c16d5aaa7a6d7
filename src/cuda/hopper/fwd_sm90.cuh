// CUDA backend, Hopper: the forward kernel (SPEC.md section 2) on warpgroup MMA (wgmma, sm_90a), for head-dim tiles
// 64 and 128, fp16 / bf16, without bias or dropout (the warp-specialised forward's kBias variant, fwd_sm90_ws.cuh,
// and fwd_kernel.cuh run the other combinations).
// Same math, mask, sink and epilogue as fwd_kernel (online softmax with the sink as an already-seen key,
// softmax.cuh: the wgmma accumulator of a warp is the mma.sync C layout, so OnlineSoftmax / make_logits /
// store_fragment work unchanged); the per-key-block steps (the S and P V wgmma chains, the softmax step) are
// fwd_sm90_mainloop.cuh's, shared with the warp-specialised fwd_sm90_ws.cuh:
//   S = Q K^T (per key block of BN = 64 or 128 keys), m_new = max(m, rowmax(S) * scale * log2(e)),
//   P = exp2(S * c - m_new), l = l * alpha + rowsum(P), O = O * alpha + P V; out = O / l, LSE = (m + log2 l) ln 2.
// Block: 2 warpgroups x 64 query rows (the sm_80 grid: 128 query rows per block). Per key block: S as an
// m64nBNk16 chain (A = Q, B = K, both K-major from shared memory); softmax in registers; O += P V as an m64nHDk16
// chain with A = P from registers and B = V read MN-major, software-pipelined: S of block j is issued together
// with P V of block j - 1 and its softmax runs while the tensor cores compute P V. Q once, K and V double-buffered
// (K one block ahead of V), all three in the 128-byte-swizzled row-panel layout (sm90_common.cuh): by TMA (one
// thread, an mbarrier per buffer; rows read as 128-byte pieces: the 16-byte pieces of the column-chunk layout
// doubled the L2 traffic) for blocks whose rows all lie in the sequence, else by cp.async (rows past the end
// zero-filled).
#pragma once

#include <cuda.h>

#include "cuda/epilogue.cuh"
#include "cuda/hopper/fwd_sm90_mainloop.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/mask.cuh"
#include "cuda/prologue.cuh"
#include "cuda/scheduler.cuh"
#include "cuda/softmax.cuh"

namespace sinkattn::cuda::sm90 {

// Tensor maps of q, k, v for the forward's TMA loads (launch.cuh): 4-d (d, rows, heads, b) of 16-bit elements,
// box 64 x 128, 128-byte swizzle; ok = 0: none (every tile through cp.async).
// bias: the warp-specialised forward's kBias variant stages the bias tiles by TMA (KernelChoice::fwd_bias_tma):
// 4-d (s_kv, s_q, bias heads, bias batches), box 64 keys x kBlockM queries; bias_ok = 0: none (each thread loads its
// fragment from global memory).
struct Sm90FwdTma {
  CUtensorMap q, k, v, bias;
  int ok, bias_ok;
};

template <int HD>
struct FwdSm90Traits {
  static constexpr int kThreads = 256;  // 2 warpgroups
  static constexpr int kBlockM = tiles::fwd_sm90_block_m(HD);  // query rows per block (64 per warpgroup)
  static_assert(kBlockM == 128, "2 warpgroups x 64 rows");
  // Keys per step. Head dim 64: 64 keys and two blocks per SM (S, P and O in <= 128 registers), so that one
  // block's softmax runs while the other's wgmmas do (at 128 keys and one block per SM the two warpgroups, in
  // lock step, left the tensor cores idle during the softmax: 272 TFLOP/s on the GPT-OSS layer, below the sm_80
  // kernel). Head dim 128: 128 keys, one block per SM.
  static constexpr int kBlockN = tiles::fwd_sm90_block_n(HD);
  static constexpr int kMinBlocks = HD == 64 ? 2 : 1;
  // sQ [BM][HD]; sK, sV [2][BN][HD] (swizzled row panels, 2 bytes); 5 mbarriers (K 0, K 1, V 0, V 1, Q); room to
  // align the tiles to 1024 bytes
  static constexpr int kSmem = (kBlockM * HD + 4 * kBlockN * HD) * 2 + 5 * 8 + 1024;
};

template <typename T, int HD>
__global__ void __launch_bounds__(256, FwdSm90Traits<HD>::kMinBlocks)
    fwd_sm90_kernel(const Params p, const __grid_constant__ Sm90FwdTma tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = FwdSm90Traits<HD>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, NT = BN / 8, NO = HD / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  // The swizzled tiles need 1024-byte alignment of the shared-memory address itself (kSmem leaves room).
  T* sQ = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  T* sK = sQ + BM * HD;       // [2][BN * HD]
  T* sV = sK + 2 * BN * HD;   // [2][BN * HD]
  uint64_t* bars = reinterpret_cast<uint64_t*>(sV + 2 * BN * HD);  // [0, 1]: K buffers, [2, 3]: V buffers, [4]: Q

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wl = warp & 3;
  const QueryTile<BM> qt(p, scheduled_tile(p.window_right >= 0));
  const int h = qt.h, hk = qt.hk, n = qt.n, m0 = qt.m0;
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
  const int nbatch = p.varlen ? 0 : n;

  if (tid == 0) {
#pragma unroll
    for (int i = 0; i < 5; ++i) mbar_init(&bars[i], 1);
  }
  __syncthreads();

  const bool q_tma = tma.ok != 0 && m0 + BM <= sq.len_q;
  if (q_tma) {
    if (tid == 0) tma_load_tile_sw<BM, HD>(sQ, &tma.q, static_cast<int>(sq.q_start) + m0, h, nbatch, &bars[4]);
  } else {
    const T* qg = qt.template q_rows<const T>(p.q, p.q_st);
    load_tile_sw<BM, HD, Tr::kThreads>(sQ, qg, p.q_st.s, sq.len_q - m0, p.d, tid);
  }
  const T* kg = qt.template kv_rows<const T>(p.k, p.k_st);
  const T* vg = qt.template kv_rows<const T>(p.v, p.v_st);
  // Key blocks loaded by TMA: all BN keys inside the sequence (a function of the block alone, so the loader and
  // the waiters agree; only the last block of a sequence can fail it).
  auto kv_tma = [&](int nb) { return tma.ok != 0 && (nb + 1) * BN <= sq.len_kv; };
  // K (v = 0) or V (v = 1) of key block nb into its buffer (K and V have their own buffers and barriers: K runs one
  // block ahead of V, see the loop).
  auto issue_kv = [&](int v, int nb) {
    const int buf = (nb - nb_lo) & 1, j0 = nb * BN;
    T* dst = (v ? sV : sK) + buf * BN * HD;
    uint64_t* bar = &bars[2 * v + buf];
    if (kv_tma(nb)) {
      if (tid == 0)
        tma_load_tile_sw<BN, HD>(dst, v ? &tma.v : &tma.k, static_cast<int>(sq.kv_start) + j0, hk, nbatch, bar);
    } else if (v) {
      load_tile_sw<BN, HD, Tr::kThreads>(dst, vg + j0 * p.v_st.s, p.v_st.s, sq.len_kv - j0, p.d_v, tid);
    } else {
      load_tile_sw<BN, HD, Tr::kThreads>(dst, kg + j0 * p.k_st.s, p.k_st.s, sq.len_kv - j0, p.d, tid);
    }
  };
  // Waits until K of block nbk and, if nbv >= 0, V of block nbv are in shared memory and visible to every
  // thread's wgmma: the TMA barriers of their buffers (phase bits flip per use) and this thread's cp.async groups,
  // then one block barrier.
  uint32_t phase = 0;  // bit b: K buffer b, bit 2 + b: V buffer b
  auto tma_wait = [&](int nb, int v) {
    if (kv_tma(nb)) {
      const int bit = 2 * v + ((nb - nb_lo) & 1);
      mbar_wait(&bars[bit], (phase >> bit) & 1u);
      phase ^= 1u << bit;
    }
  };
  auto wait_tiles = [&](int nbk, int nbv) {
    cp_async_wait<0>();
    if (nbk >= 0) tma_wait(nbk, 0);
    if (nbv >= 0) tma_wait(nbv, 1);
    fence_proxy_async();
    __syncthreads();
  };

  OnlineSoftmax<NT> sm;
  sm.init(sigma, lane);
  float acc[NO][4];
  zero_acc(acc);
  const int row_w = m0 + wg * 64 + wl * 16;  // first query row of this warp (within the sequence)
  const T* sQ_wg = sQ + wg * 64 * 64;        // rows 64 wg .. 64 wg + 63 of every panel (1024-byte aligned)

  // The steps of fwd_sm90_mainloop.cuh on key block nb (its K / V buffer: (nb - nb_lo) & 1): S = Q K^T into s
  // and O += P V (issued and committed, not waited for); mask / scale and the online-softmax step (s becomes P,
  // alpha the factors for O).
  auto issue_s = [&](float (&s)[NT][4], int nb) {
    fwd_issue_s<T, BM, HD>(s, sQ_wg, sK + ((nb - nb_lo) & 1) * BN * HD);
  };
  auto issue_pv = [&](const uint32_t (&ap)[BN / 16][4], int nb) {
    fwd_issue_pv<T>(acc, ap, sV + ((nb - nb_lo) & 1) * BN * HD);
  };
  auto softmax = [&](float (&s)[NT][4], float (&alpha)[2], int nb) {
    fwd_softmax_step<T>(sm, s, alpha, p, mk, n, h, row_w, nb * BN, lane);
  };

  // Pipeline (one warpgroup; both run it in step): step nb issues S_nb = Q K_nb^T and O += P_{nb-1} V_{nb-1},
  // waits for S_nb only, runs the softmax of S_nb while the tensor cores still work on P V, then waits for P V,
  // rescales O by alpha_nb (O is then on the scale of m_nb, the one P_nb was formed with) and packs P_nb.
  // Loads: K runs one block ahead of V. At the barrier of step nb every read of K_{nb-1} (S, step nb - 1) and of
  // V_{nb-2} (P V, step nb - 1) has retired, so K_{nb+1} and V_nb are issued into those buffers then.
  // Every key block of the block's range is computed by both warpgroups (a tile this warpgroup's rows cannot see
  // is all -inf after the mask: m, l and O are unchanged), so no wgmma sits under a data-dependent branch.
  // The same step order as fwd_sm90_ws.cuh's consumers, written out in each (fwd_sm90_mainloop.cuh says why).
  if (nb_lo < nb_hi) {
    issue_kv(0, nb_lo);
    cp_async_commit();
    if (q_tma) mbar_wait(&bars[4], 0);
    wait_tiles(nb_lo, -1);
    if (nb_lo + 1 < nb_hi) issue_kv(0, nb_lo + 1);
    issue_kv(1, nb_lo);
    cp_async_commit();

    uint32_t ap[BN / 16][4];
    {
      float s[NT][4];
      wgmma_fence();
      issue_s(s, nb_lo);
      wgmma_wait<0>();
      fence_acc(s);
      float alpha[2];
      softmax(s, alpha, nb_lo);  // O = 0: alpha not needed
      pack_a_frags<T>(s, ap);
    }
    for (int nb = nb_lo + 1; nb < nb_hi; ++nb) {
      wait_tiles(nb, nb - 1);
      if (nb + 1 < nb_hi) issue_kv(0, nb + 1);
      issue_kv(1, nb);
      cp_async_commit();
      float s[NT][4];
      wgmma_fence();
      issue_s(s, nb);
      issue_pv(ap, nb - 1);
      wgmma_wait<1>();
      fence_acc(s);
      float alpha[2];
      softmax(s, alpha, nb);
      wgmma_wait<0>();
      fence_acc(acc);
      rescale_rows(acc, alpha);
      pack_a_frags<T>(s, ap);
    }
    wait_tiles(-1, nb_hi - 1);
    wgmma_fence();
    issue_pv(ap, nb_hi - 1);
    wgmma_wait<0>();
    fence_acc(acc);
  } else {  // no visible key: out = 0 (the sink or nothing), Q is not read
    cp_async_wait<0>();
    if (q_tma) mbar_wait(&bars[4], 0);
  }
  cp_async_wait<0>();

  // Epilogue (as fwd_kernel): out_i = O_i / l_i (0 for a row that saw nothing), LSE_i; padding rows of a dense
  // batch get exact zeros.
  fwd_store_rows<T>(p, sq, n, h, out + (wg * 64 + wl * 16) * p.out_st.s, row_w, sm, acc, lane);
#endif
}

}  // namespace sinkattn::cuda::sm90

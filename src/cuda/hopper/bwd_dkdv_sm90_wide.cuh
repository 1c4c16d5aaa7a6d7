// CUDA backend, Hopper: the dK dV kernel of the backward (SPEC.md section 3) for head-dim tile 256, on warpgroup MMA
// (wgmma, sm_90a), fp16 / bf16, without bias or dropout, with dQ fused: fp32 reductions into p.ws_dq in any order
// (kDet = false, deterministic = 0) or in a fixed order of the key blocks under per-step semaphores (kDet = true;
// dq_order.hpp has the order and why it cannot deadlock). The dispatch (dispatch.cpp) picks it.
// Same math and the same per-row inputs (LSE2, D - d_lse from the preprocess pass) as bwd_dkdv_sm90.cuh:
//   S^T = K Q^T, dP^T = V dO^T (per query block of 64 rows, per query head of the KV group)
//   P^T = exp2(S^T * scale * log2(e) - LSE2), dS^T = P^T (dP^T - D)
//   dV += P^T dO, dK += dS^T Q (GQA group summed in registers, fixed order), dQ += dS K
// Why a kernel of its own: the tile-64 / 128 kernel gives each of its two warpgroups 64 keys with their dK and dV
// over the whole head dim, 256 accumulator registers a thread at head dim 256. Here the head dim is split instead:
// Block: 2 warpgroups (256 threads), 64 keys, 64 query rows per step.
//   S^T, dP^T (64 keys x 64 queries): warpgroup wg computes the 32 query columns [32 wg, 32 wg + 32) over all 64
//     keys (m64n32k16 chains over the head dim; A = K or V rows, B = Q or dO rows, both K-major), forms its columns
//     of P^T and dS^T in registers and stores them (rounded to T) to shared memory (sP, sdS);
//   dV, dK, dQ: warpgroup wg owns the head-dim columns [128 wg, 128 wg + 128) of each: dV += P^T dO and
//     dK += dS^T Q (A = sP / sdS, K-major; B = dO / Q read MN-major), dQ = dS K (A = sdS read MN-major, B = K
//     read MN-major), m64n128k16, all operands from shared memory.
//   Registers: dK and dV accumulators 64 + 64 floats a thread, the step's dQ tile 64, S^T and dP^T 16 each.
// Shared memory (16-bit tiles in the 128-byte-swizzled row panels of sm90_common.cuh): K, V (loaded once,
// cp.async), two stages of a step's Q and dO tiles (TMA for a query block with all 64 rows in the sequence, else
// cp.async, as in bwd_dkdv_sm90.cuh), P^T and dS^T (64 x 64 each), LSE2 and D: 209 KiB.
// dQ: a full query block's 64 x 256 fp32 tile is staged in the stage it was computed from, once dV and dK have read
// its Q and dO (the stage's 64 KiB are the tile's size; no room is left for a buffer of its own), in the swizzled
// image of the ws_dq map's 32-column boxes, and thread 0 adds it to ws_dq by TMA reduce-adds after the next step's
// first barrier; the next step's prefetch into that stage waits until they have read it (thread 0, before the
// barrier that precedes the prefetch). Partial query blocks (and a call without the dq map) add with float4
// atomics. bf16, b 2, h 16, s 4096, causal (bench/log/2026-12-05-dkdv-head-dim-256.md, 6e52af0): float4 atomics for
// every block 4.87 ms on an H100 and 2.72 ms on an H200, against 1.99 / 1.94 ms with no dq adds at all (a timing
// build, results wrong) and 2.28 ms (H200) with these reduce-adds: the fp32 reductions of 64 KiB per step at 64
// keys a block, not the products, were the atomics' time.
// Order of a step (barriers are the block's; each product its own wgmma commit group):
//   wait for the step's Q / dO; barrier | thread 0: the previous step's dQ reduce-adds | S^T, dP^T issued |
//   wait S^T: P^T to sP | thread 0: wait for the reduce-adds' reads | barrier | next step's loads issued into the
//   other stage | dV issued | wait dP^T: dS^T to sdS | barrier | dQ, dK issued | wait dQ, dK: the dQ tile to the
//   stage (full blocks) or dQ atomics.
// Every warpgroup runs every product of the step (a warpgroup whose 32 queries see no key of the block gets P = 0
// from the mask): wgmmas issued and waited for under different branches were serialised by ptxas (C7514).
// The parts are bwd_dkdv_sm90.cuh's (the prologue, products, dq adds, epilogue in files of their own); this file: the
// traits, the shared-memory layout (DkvSm90WideSmem), the loads of a step (DkvSm90WideLoads), its dQ and dK products
// (wide_dq_dk) and the kernel.
// kDet: as bwd_dkdv_sm90.cuh's kDet with a turn per step (dq_turn_per_step): the block's tile comes from a ticket,
// steps run query-block-major and descending, the step's turn is waited for before its adds (thread 0 for a tile
// it adds by TMA in the next step, else lane 0 of every warp before the warp's atomics), and thread 0 releases the
// previous turn once its reduce-adds have completed, after the barrier that follows every thread's atomics of it.
#pragma once

#include "cuda/hopper/bwd_dkdv_sm90.cuh"

namespace sinkattn::cuda::sm90 {

template <int HD>
struct DkvSm90WideTraits {
  static constexpr int kHeadDim = HD;
  static constexpr int kThreads = 256;
  static constexpr int kBlockN = tiles::dkdv_sm90_block_n(HD);  // keys per block
  static constexpr int kBlockM = 64;                             // query rows per step
  static constexpr int kHalf = HD / 2;                           // dK / dV / dQ columns per warpgroup
  static constexpr int kCols = kBlockM / 2;                      // S^T / dP^T query columns per warpgroup
  static_assert(tiles::dkdv_sm90_wide(HD) && HD == 256 && kBlockN == 64,
                "head dim 256: two warpgroups x 128 columns, 64 keys");
  // The shared memory (DkvSm90WideSmem has the layout) and room to align its base to 1024 bytes.
  static constexpr int kSmem = (2 * kBlockN * HD + 4 * kBlockM * HD + 2 * kBlockN * kBlockM) * 2 + 4 * kBlockM * 4 +
                               32 + 1024;
  static_assert(kSmem + 1024 <= 227 * 1024, "shared memory per block (dynamic + 1024 static)");
};

// The shared memory of bwd_dkdv_sm90_wide_kernel, in this order from a base aligned to 1024 bytes (16-bit tiles in the
// 128-byte-swizzled row panels; DkvSm90WideTraits has the size):
//   sK, sV [BN][HD]; 2 stages of {Q [BM][HD], dO [BM][HD]} (q_tile, do_tile; each stage also the fp32 [BM][HD] dQ tile
//   of its step: dq_box); sP, sdS [BN][BM] (P^T, dS^T: rows = keys, cols = queries); sL, sD [2][BM] fp32 (LSE2,
//   D - d_lse); bars [2] (the TMA loads of the two stages) and kDet's ticket (32 bytes).
template <typename T, typename Tr>
struct DkvSm90WideSmem {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim;
  T *sK, *sV, *stages, *sP, *sdS;
  float *sL, *sD;
  uint64_t* bars;
  unsigned* ticket;
  __device__ __forceinline__ explicit DkvSm90WideSmem(unsigned char* smem_raw) {
    sK = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
    sV = sK + BN * HD;
    stages = sV + BN * HD;  // [2][Q BM * HD, dO BM * HD]
    sP = stages + 4 * BM * HD;
    sdS = sP + BN * BM;
    sL = reinterpret_cast<float*>(sdS + BN * BM);
    sD = sL + 2 * BM;
    bars = reinterpret_cast<uint64_t*>(sD + 2 * BM);
    ticket = reinterpret_cast<unsigned*>(bars + 2);
  }
  // Stage b's Q and dO tiles.
  __device__ __forceinline__ T* q_tile(int b) const { return stages + b * 2 * BM * HD; }
  __device__ __forceinline__ T* do_tile(int b) const { return stages + b * 2 * BM * HD + BM * HD; }
  // The dQ tile's 32-column fp32 box bx in stage b: after the step's last barrier warpgroup wg's dV and dK still read
  // dO and Q columns [128 wg, 128 wg + 128) (panels 2 wg, 2 wg + 1 of each), so the four boxes of its columns go
  // there: boxes 4 wg, 4 wg + 1 over its Q panels, 4 wg + 2, 4 wg + 3 over its dO panels. Each warpgroup then
  // overwrites only what it alone reads, once its own products have completed (with the boxes in column order, the
  // first warpgroup's would cover the whole Q tile while the other's dK still read it: NaN in dK under racecheck).
  __device__ __forceinline__ unsigned char* dq_box(int b, int bx) const {
    const int w = bx >> 2, j = bx & 3;
    return reinterpret_cast<unsigned char*>(stages + b * 2 * BM * HD) + (j < 2 ? 0 : BM * HD * 2) +
           w * (BM * 128 * 2) + (j & 1) * (BM * 128);
  }
  static_assert(BM * HD * 4 == 2 * BM * HD * 2 && HD == 256, "a stage holds its step's fp32 dQ tile");
};

// The loads of step (query head ih of the group, query block qb_lo + iq) into stage buf (the kernel's state, by
// reference): Q and dO by TMA where all BM rows lie in the sequence (tma_block; thread kLoader arms bars[buf]), else
// by cp.async (rows past len_q zero-filled); the rows' LSE2 / D into registers (pf; stored one step later). kDet:
// other threads than thread 0 load (bwd_dkdv_sm90.cuh says why: the turns' releases).
template <typename T, typename Tr, int kLoader, typename TmaBlock>
struct DkvSm90WideLoads {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim;
  const int& hk;
  const Params& p;
  const int& qb_lo;
  const TmaBlock& tma_block;
  const int& tid;
  const DkvSm90WideSmem<T, Tr>& sm;
  const SeqInfo& sq;
  const int& n;
  const Sm90Tma& tma;
  const KeyTile<BN>& kt;
  RowStatsPrefetch<BM>& pf;
  const int& pf_tid;

  __device__ __forceinline__ void operator()(int buf, int ih, int iq) const {
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    if (tma_block(i0)) {
      if (tid == kLoader) {
        mbar_arrive_expect_tx(&sm.bars[buf], 2 * BM * HD * sizeof(T));
        const int row = static_cast<int>(sq.q_start) + i0, nb = p.varlen ? 0 : n;
#pragma unroll
        for (int c = 0; c < HD / 64; ++c) {
          tma_load_4d(sm.q_tile(buf) + c * BM * 64, &tma.q, c * 64, row, h, nb, &sm.bars[buf]);
          tma_load_4d(sm.do_tile(buf) + c * BM * 64, &tma.d_out, c * 64, row, h, nb, &sm.bars[buf]);
        }
      }
    } else {
      const T* qg = kt.template q_rows<const T>(p.q, p.q_st, h, i0);
      const T* dog = kt.template q_rows<const T>(p.d_out, p.dout_st, h, i0);
      load_tile_sw<BM, HD, Tr::kThreads>(sm.q_tile(buf), qg, p.q_st.s, sq.len_q - i0, p.d, tid);
      load_tile_sw<BM, HD, Tr::kThreads>(sm.do_tile(buf), dog, p.dout_st.s, sq.len_q - i0, p.d_v, tid);
    }
    pf.load(p, sq, n, h, i0, pf_tid);
  }
};

// The dQ and dK products of a step of bwd_dkdv_sm90_wide_kernel (after the barrier that follows dS^T) for warpgroup
// columns n0 .. n0 + HN of each (descriptors: the kernel's), with thread row r of the tile: dQ = dS K, dK += dS^T Q,
// and turn() (kDet's turn) while they run. A full query block's dQ tile (tma_dq) goes to the step's stage once dK has
// read it, its reduce-adds issued after the next barrier (staged); other blocks add by float4 atomics while dK runs.
// (The waits are unconditional: wgmma waits under a branch made ptxas serialise the products, C7514.)
template <typename T, typename Tr, typename TmaDq, typename Turn>
__device__ __forceinline__ void wide_dq_dk(float (&acc_dk)[Tr::kHalf / 8][4], float (&acc_dv)[Tr::kHalf / 8][4],
                                           uint64_t ddS_mn0, uint64_t dKn0, uint64_t ddS0, uint64_t dQn0,
                                           const DkvSm90WideSmem<T, Tr>& sm, int buf, const Params& p,
                                           const SeqInfo& sq, int n, int h, int i0, int n0, int r, int t,
                                           const TmaDq& tma_dq, const Turn& turn, DqStaged& staged) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  float accq[Tr::kHalf / 8][4];
  wgmma_fence();
  issue_dq_desc<T, BN>(accq, ddS_mn0, dKn0);      // dQ[:, n0 .. n0 + HN) = dS K
  issue_mma_desc<T, BN, BM>(acc_dk, ddS0, dQn0);  // dK[:, n0 .. n0 + HN) += dS^T Q
  turn();
  wgmma_wait<1>();  // dV, dQ (dK still running)
  fence_acc(accq);
  const bool by_tma = tma_dq(i0);  // block-uniform
  if (!by_tma) dq_atomic_add4(p, sq, n, h, i0, r, n0, t, accq);  // float4 atomics while dK runs
  wgmma_wait<0>();  // dK: this step's Q and dO are read
  fence_acc(acc_dk);
  fence_acc(acc_dv);
  if (by_tma) {  // the tile to this step's stage (columns >= d clipped by the map); added after the next barrier
    dq_stage_boxes<BM>([&](int bx) { return sm.dq_box(buf, bx); }, accq, r, n0, t);
    fence_proxy_async();
    staged = DqStaged{true, buf, h, static_cast<int>(ws_row(p, sq, n, i0))};
  }
}

template <typename T, int HD, bool kDet>
__global__ void __launch_bounds__(DkvSm90WideTraits<HD>::kThreads, 1)
    bwd_dkdv_sm90_wide_kernel(const Params p, const __grid_constant__ Sm90Tma tma) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = DkvSm90WideTraits<HD>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HN = Tr::kHalf, QC = Tr::kCols, NT = QC / 8, NO = HN / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const DkvSm90WideSmem<T, Tr> sm(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wl = warp & 3;
  const int g = lane >> 2, t = lane & 3;
  // Programmatic dependent launch (KernelChoice::pdl): as bwd_dkdv_sm90.cuh. Every block waits for the preprocess
  // before it exits, so that the dq convert's wait for this grid implies the preprocess's completion too.
  pdl_launch_dependents();
  const TileCoord tc = dkdv_tile<kDet>(p, sm.ticket, tid);  // (the prologue: bwd_sm90_prologue.cuh)
  const DkvBlock<BM, BN> blk(p, tc);
  if (blk.kt.outside()) {
    pdl_wait();
    return;
  }
  const KeyTile<BN>& kt = blk.kt;
  const Mask& mk = blk.mk;
  const SeqInfo& sq = kt.sq;
  const int hk = kt.hk, n = kt.n, j0 = kt.j0, qb_lo = blk.qb_lo, nq = blk.nq, iters = nq * p.group;
  using Order = StepOrder<kDet>;
  using Turns = DqTurns<dq_turn_per_step(false)>;  // kDet

  // A query block with all BM rows inside the sequence is loaded by TMA (a function of the block alone: the issuing
  // and the consuming step agree on it); its dq tile is added by TMA reduce-adds (bwd_sm90_dq.cuh).
  auto tma_block = [&](int i0) { return tma.ok != 0 && i0 + BM <= sq.len_q; };
  auto tma_dq = [&](int i0) { return tma.dq_ok != 0 && i0 + BM <= sq.len_q; };
  DqStaged staged;  // the previous step staged a dQ tile (in its stage, the other one)
  auto add_pending = [&](int b) {  // thread 0, after a barrier that follows every thread's stores of the tile
    dq_reduce_add<HD>(&tma.dq, [&](int bx) { return sm.dq_box(b, bx); }, p.d, staged.row, staged.h);
  };
  if (tid == 0) {
    mbar_init(&sm.bars[0], 1);
    mbar_init(&sm.bars[1], 1);
  }
  __syncthreads();
  load_kv_sw<HD, Tr::kThreads>(sm.sK, sm.sV, kt, p, tid);  // K, V of the block, once (cp.async)
  pdl_wait();  // the preprocess's ws_lse2 / ws_dp / zeroed ws_dq (K and V loads are already under way)
  uint32_t phase = 0;  // bit b: parity of the next completion of bars[b]

  RowStatsPrefetch<BM> pf;
  constexpr int kLoader = kDet ? 32 : 0;
  const int pf_tid = kDet ? tid ^ BM : tid;
  const DkvSm90WideLoads<T, Tr, kLoader, decltype(tma_block)> load{hk, p, qb_lo, tma_block, tid, sm, sq, n, tma, kt,
                                                                   pf, pf_tid};
  int ih, iq;
  Order::first(nq, p.group, ih, iq);
  if (iters > 0) {
    load(0, ih, iq);
    pf.store(sm.sL, sm.sD, 0, pf_tid);
  }
  cp_async_commit();

  float acc_dk[NO][4], acc_dv[NO][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);
  const int n0 = wg * HN;          // this warpgroup's head-dim columns of dK, dV, dQ
  const int c0 = wg * QC;          // its query columns of S^T, dP^T (within the step's block)
  const int key_w = j0 + wl * 16;  // this warp's first key (S^T rows)
  const int r0 = wl * 16 + g;      // this thread's first row of sP / sdS
  // A warp's 16 x 32 fragment (rows = keys r0, r0 + 8; cols = queries c0 + 8 nt + 2 t) rounded to T into sP / sdS.
  auto store_frag = [&](T* tile, const float (&f)[NT][4]) { store_frag_sw<T, BN>(tile, f, r0, c0, t); };

  // Descriptors of the k-steps as one base descriptor plus a constant (kstep_desc, mnstep_desc: the 16 k-steps of
  // the S^T / dP^T chains then cost no register each).
  const uint64_t dK0 = desc_kmajor_sw<BN>(sm.sK, 0), dV0 = desc_kmajor_sw<BN>(sm.sV, 0);
  const uint64_t dP0 = desc_kmajor_sw<BN>(sm.sP, 0), ddS0 = desc_kmajor_sw<BN>(sm.sdS, 0);
  const uint64_t ddS_mn0 = desc_mnmajor_sw<BN>(sm.sdS, 0), dKn0 = desc_mnmajor_sw<BN>(sm.sK + (n0 / 64) * BN * 64, 0);
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    cp_async_wait<0>();
    if (tma_block(i0)) {
      mbar_wait(&sm.bars[buf], (phase >> buf) & 1u);
      phase ^= 1u << buf;
    }
    fence_proxy_async();
    __syncthreads();  // the step's tiles are in; every product and dQ store of the previous step has completed
    // thread 0: the reduce-adds of the previous step's tile (kDet: that step's turn is held)
    const bool issued = staged.pending && tid == 0;
    if (issued) add_pending(buf ^ 1);
    staged.pending = false;
    int ih_next = ih, iq_next = iq;
    Order::next(nq, p.group, ih_next, iq_next);
    const bool prefetch = it + 1 < iters;
    const unsigned* sem = nullptr;
    unsigned seen = 0;
    const bool waits = kDet && Turns::opens(ih) && lane == 0 && (warp == 0 || !tma_dq(i0));
    if constexpr (kDet) {
      if (waits) sem = open_dq_turn<Turns>(blk, p, ih, iq, seen);
    }
    const T* q_cur = sm.q_tile(buf);
    const T* do_cur = sm.do_tile(buf);
    const uint64_t dQ0 = desc_kmajor_sw<BM>(q_cur + c0 * 64, 0), dO0 = desc_kmajor_sw<BM>(do_cur + c0 * 64, 0);
    const uint64_t dQn0 = desc_mnmajor_sw<BM>(q_cur + (n0 / 64) * BM * 64, 0);
    const uint64_t dOn0 = desc_mnmajor_sw<BM>(do_cur + (n0 / 64) * BM * 64, 0);
    const float* l_cur = sm.sL + buf * BM;
    const float* d_cur = sm.sD + buf * BM;
    const int ic = i0 + c0;  // this warpgroup's first query
    float s[NT][4], dpv[NT][4];  // rows = this warp's 16 keys, cols = the warpgroup's 32 queries
    wgmma_fence();
    issue_st_desc<T, HD, BN, BM>(s, dK0, dQ0);     // S^T = K Q^T (the warpgroup's query columns)
    issue_st_desc<T, HD, BN, BM>(dpv, dV0, dO0);   // dP^T = V dO^T
    wgmma_wait<1>();  // S^T
    fence_acc(s);
    pt_from_st_cols<T>(s, p, mk, n, h, key_w, ic, lane, l_cur, c0, t);  // P^T = exp2(S^T sc - LSE2)
    store_frag(sm.sP, s);
    if (issued) bulk_wait_read<0>();  // the other stage is read: the next step's tiles may go there
    fence_proxy_async();
    __syncthreads();  // P^T complete
    if (prefetch) load(buf ^ 1, ih_next, iq_next);
    cp_async_commit();
    wgmma_fence();
    issue_mma_desc<T, BN, BM>(acc_dv, dP0, dOn0);  // dV[:, n0 .. n0 + HN) += P^T dO
    wgmma_wait<1>();  // dP^T (dV still running)
    fence_acc(dpv);
    dst_from_dpt_cols(dpv, s, d_cur, c0, t);  // dS^T = P^T (dP^T - D)
    store_frag(sm.sdS, dpv);
    fence_proxy_async();
    __syncthreads();  // dS^T complete
    auto turn = [&] {
      if constexpr (kDet) pass_dq_turn<Turns>(blk, p, tc.block, tid, it, ih, iq, waits, sem, seen);
    };
    wide_dq_dk<T, Tr>(acc_dk, acc_dv, ddS_mn0, dKn0, ddS0, dQn0, sm, buf, p, sq, n, h, i0, n0, wl * 16 + g, t, tma_dq,
                      turn, staged);
    if (prefetch) pf.store(sm.sL, sm.sD, buf ^ 1, pf_tid);
    ih = ih_next;
    iq = iq_next;
  }
  dq_finish<kDet, Turns>(blk, p, tid, iters, staged.pending, [] { __syncthreads(); },
                         [&] { add_pending((iters - 1) & 1); });
  cp_async_wait<0>();
  store_dkdv<T>(p, kt, wl * 16, n0, acc_dk, acc_dv, lane);
#endif
}

}  // namespace sinkattn::cuda::sm90

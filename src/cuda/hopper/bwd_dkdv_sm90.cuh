// CUDA backend, Hopper: the dK dV kernel of the backward (SPEC.md section 3) on warpgroup MMA (wgmma, sm_90a), for
// head-dim tiles 64 and 128, fp16 / bf16, with a bias (kBias) or dropout (kDropout) or neither, with dQ fused:
// fp32 reductions into p.ws_dq, in any order (kDet = false, deterministic = 0, as the sm_80 kernel in bwd_kernel.cuh)
// or in a fixed order of the key blocks under per-turn semaphores (kDet = true, deterministic = 1;
// dq_order.hpp has the order, why the sums are bitwise reproducible and why the waits cannot deadlock). The
// dispatch (dispatch.cpp) picks the kernel.
// Same math and the same per-row inputs (LSE2, D - d_lse from the preprocess pass) as bwd_dkdv_kernel:
//   S^T = K Q^T, dP^T = V dO^T (per query block of BM rows, per query head of the KV group)
//   P^T = exp2(S^T * scale * log2(e) - LSE2), dS^T = P^T (dP^T - D)
//   dV += P^T dO, dK += dS^T Q (GQA group summed in registers, fixed order),
//   dQ += dS K (fp32 TMA reduce-adds, or atomics)
// The parts: the prologue (the block's tile and keys, its K / V loads) bwd_sm90_prologue.cuh; the products of a step
// bwd_sm90_products.cuh; the dq adds and the deterministic turns bwd_sm90_dq.cuh; the staged bias tiles
// bias_staging.cuh; the keep producer keep_producers.cuh; dK / dV bwd_sm90_epilogue.cuh. This file: the traits, the
// shared-memory layout (DkvSm90Smem), the loads of a step (DkvSm90Loads), the step's two halves (DkvSm90Math) and the
// kernel, which runs the steps.
// Block: 2 warpgroups (256 threads), 128 keys (64 per warpgroup: its dK, dV accumulators), BM query rows per step:
// 64, or 128 at head dim 64 without bias / dropout (tiles::dkdv_sm90_block_m; dQ then split by rows:
// DkvSm90Traits::kDqSplitRows). The text below describes BM = 64; at 128 the S^T / dP^T products are m64n128, the
// boxes 128 rows high.
// Per step: S^T and dP^T as two m64n64k16 chains (A = K or V rows of the warpgroup, B = Q or dO, both K-major);
// the softmax part in registers (the accumulator layout is the mma.sync C layout, so mask.cuh / scores.cuh work
// unchanged); dV and dK as m64nHDk16 chains with A = P^T, dS^T from registers and B = dO, Q read MN-major; dS^T
// staged in shared memory; dQ (64 x HD) split by columns between the warpgroups, A = dS (MN-major), B = K (MN-major).
// A warpgroup whose keys see no query of the step skips the softmax part (exact: P = dS = 0 there) and writes zeros
// to its rows of sdS; its dK product is issued all the same, with dS^T = 0 (a wgmma under a branch the compiler
// cannot prove uniform is serialised).
// K, V (loaded once, cp.async) and the staged dS^T are in the 128-byte-swizzled row-panel layout too: dS^T's stores
// are conflict-free (a warp's 8 rows x 4 column pairs hit 32 distinct banks); K as dQ's MN-major B operand starts
// at column n0 (at head dim 64, 64 bytes into the swizzle atom: the hardware swizzles the absolute address).
// Measured against the core-matrix layout these tiles had before (bench/log/2026-12-01-dq-tma-reduce-add.md, H200,
// 25b4f5e): within 1% (not the reason for the kernel's speed); kept so that every tile of the kernel has one layout.
// Q, dO are double-buffered in the 128-byte-swizzled row-panel layout (sm90_common.cuh): a query block with all
// 64 rows valid is loaded by TMA (2 * HD / 64 boxes of 64 columns x 64 rows, one thread, completion on an mbarrier
// per buffer) when the launcher could describe q and d_out as tensor maps (Sm90Tma::ok); other blocks (the last,
// partial block of a sequence: TMA would read the next sequence's or padding rows instead of zeros) through
// cp.async. LSE2, D: loads to registers, stored to shared memory one step later.
// Order of a step (each product its own wgmma commit group, so that register work overlaps the tensor cores;
// bench/log/2026-11-29-dkdv-commit-groups.md has the measurements):
//   S^T, dP^T issued | wait S^T: P^T = exp2(..) | dV issued | wait dP^T: dS^T, stored to sdS | barrier |
//   dQ, dK issued | wait dQ (dK still running): dQ tile to sdQ (full query blocks) or dQ atomics | wait dK.
// The variants at 128 query rows a step (head dim 64, no bias or dropout: DkvSm90Traits::kOneBarrier) run that step
// with one block barrier, the one after dS^T (dkdv_steps_one_barrier): a producer warpgroup's warps load the steps
// (qdo_loader: Q, dO and the rows' LSE2 / D, on mbarriers) and add the dq tiles (dq_writer), and dS^T has two
// stages; the rest of this header describes the others, whose step also begins with a barrier (the head-dim-128
// deterministic one with the same dq writer and its lane-0 TMA loader: DkvSm90Traits::kDqWriter).
// The steps' order (StepOrder): query-block-major with a bias also without kDet, so that the heads of a group read
// one bias tile in consecutive steps (head-major, the non-deterministic bias backward took 12.2 ms against 7.0 ms
// deterministic at GPT-OSS full; ncu, bench/log/2026-12-01-bias-hopper.md, H200, 299693c).
// dQ adds: a full query block's 64 x HD fp32 tile is stored to sdQ (two buffers, the swizzled image of
// the ws_dq tensor map's 32-column boxes: conflict-free float2 stores) and added to ws_dq by TMA reduce-adds that
// thread 0 issues after the next barrier (the reduce unit does the adds; before this, 2 * HD / 8 float2 atomics per
// thread and step); thread 0 waits for the reduce-adds of two steps ago to have read their buffer before the
// barrier that precedes the stores into it, and for all of them before the block exits. Partial blocks, and every
// block without a dq tensor map (SINKATTN_CUDA_NO_TMA=1, fewer rows than a block), add with per-thread atomics.
// kDet: the block's tile comes from a ticket (the launch order of its key blocks), steps run query-block-major and
// descending, a step that opens a turn (every step, or with a bias the first step of a query block: DqTurns,
// dq_turn_per_step) reads its counter early (its latency hides behind S, dP and dV) and, before its dQ adds, waits
// for its turn while dQ and dK run (thread 0 alone when the block's tiles go by TMA reduce-add, which thread 0
// issues; else lane 0 of every warp, each adding its own elements), and the step after the turn's last one releases
// it (thread 0, once the reduce-adds have completed, while that step's dQ and dK run: before the barrier that
// precedes them, this wait and the release's fence (MEMBAR.GPU) stalled warp 0 and with it the block;
// bench/log/2026-12-01-deterministic-hopper.md, H200, 193dd4b). Releasing later (one more step, or by warp 7 after
// the next barrier) measured slower: the successor waits for the release
// (bench/log/2026-12-03-deterministic-release.md, H200, dfffab6). A release is a MEMBAR.GPU, which waits for every
// memory operation of the thread in flight, so thread 0 issues no loads in this variant: threads 64 .. 127 load the
// rows' LSE2 / D and lane 0 of warp 1 (kLoader) issues the TMA loads and stages the bias tiles (with thread 0 issuing
// them, the release waited for the next step's tiles: 0.24 ms of the deterministic backward at the MHA layer, det x
// 0.83 -> 0.92; bench/log/2026-12-03-deterministic-release.md, H200, dfffab6). Why these turns: dq_order.hpp.
// Programmatic dependent launch (KernelChoice::pdl): the dq convert after this kernel may start once every block of
// it has started; and this kernel may have started before the preprocess ended: the math threads wait for it in
// pdl_wait, before their first read of its rows' LSE2 / D or add to ws_dq (which it zeroes); a block past its
// sequence's keys waits before it exits (varlen with no keys: else every block could exit first). The ticket counter
// and the turns' semaphores were zeroed before the preprocess was launched (cuda_backend.cu).
#pragma once

#include <cuda.h>

#include "cuda/bwd_rows.cuh"
#include "cuda/dq_order.hpp"
#include "cuda/dropout.cuh"
#include "cuda/hopper/bias_staging.cuh"
#include "cuda/hopper/bwd_sm90_dq.cuh"
#include "cuda/hopper/bwd_sm90_epilogue.cuh"
#include "cuda/hopper/bwd_sm90_products.cuh"
#include "cuda/hopper/handover.hpp"
#include "cuda/hopper/bwd_sm90_prologue.cuh"
#include "cuda/hopper/keep_producers.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/hopper/step_trace.cuh"
#include "cuda/mask.cuh"
#include "cuda/prologue.cuh"
#include "cuda/scores.cuh"

namespace sinkattn::cuda::sm90 {

template <int HD, bool kBias_ = false, bool kDropout_ = false, int BM_ = 64, bool kDet_ = false>
struct DkvSm90Traits {
  static constexpr int kHeadDim = HD;
  static constexpr int kConsumers = 256;  // the 2 warpgroups of the math (64 keys each)
  // kDropout at head dim 64: a third warpgroup, the keep producer (keep_producer: Philox blocks into sKeep), with
  // kKeepRegs registers, the math warpgroups kConsumerRegs (setmaxnreg, within the block's launch allocation of
  // 168 per thread: setmaxnreg.inc waits until the block's own pool has the registers; 65536 is not the bound).
  // At head dim 128 the math alone takes 254 registers (ptxas -v): at 240, what a producer would leave, it spills
  // 180 bytes (988 deterministic) and serialises its wgmmas, so there the math warpgroups draw the bits themselves
  // (Dropout::keep_bits).
  static constexpr bool kKeepProducer = kDropout_ && tiles::dkdv_sm90_keep_producer(HD);
  // Without bias or dropout, deterministic or at 128 query rows per step (head dim 64): a producer warpgroup whose
  // first warp is the dq writer (bwd_sm90_dq.cuh, dq_writer) and whose second loads the steps (qdo_loader), 24
  // registers, the math warpgroups 240 (bench/log/2026-12-07-dq-writer.md, H100): the deterministic backward 15%
  // faster at GPT-OSS full (2.05 against 2.41 ms, as fast as the default), 7% at MHA head dim 128; the default 2%
  // faster at GPT-OSS full, 1% slower at the sliding layer, and 11% slower at MHA head dim 128 (2.13 against 1.92 ms;
  // at 240 registers its math spills), which therefore keeps thread 0 issuing the reduce-adds and the loads.
  static constexpr bool kDqWriter = tiles::dkdv_sm90_dq_writer(HD, kBias_, kDropout_, kDet_, BM_);
  // The writer variants at 128 query rows a step (head dim 64) run one block barrier a step, the one after dS^T
  // (dkdv_steps_one_barrier): dS^T in two stages (sdS[it & 1]: the other warpgroup's dQ product of step it - 1 may
  // still read the other one), and the whole of the producer's warp 9 brings each step's Q / dO (TMA, or cp.async
  // for a partial query block) and its rows' LSE2 / D (qdo_loader), so the math threads load nothing after K and V;
  // one sdQ buffer (a one-buffer ring of dq_full / dq_empty) keeps the shared memory within the limit. Measured
  // (bench/log/2026-12-07-one-barrier-step.md, H100): GPT-OSS full backward 2.04 -> 1.81-1.83 ms, deterministic
  // 2.00 -> 1.85-1.86, sliding 0.455 -> 0.424; at head dim 128 the same design was slower (deterministic 2.11-2.14
  // -> 2.19 ms, also with two sdQ buffers; default with it 2.13-2.22 against 1.92 with thread 0's adds), so the
  // head-dim-128 deterministic variant keeps the writer with two barriers a step (its loader: lane 0, the TMA loads).
  static constexpr bool kOneBarrier = kDqWriter && BM_ == 128;
  static constexpr int kDsBufs = kOneBarrier ? 2 : 1, kDqBufs = kOneBarrier ? 1 : 2;
  static constexpr bool kProducerWG = kKeepProducer || kDqWriter;
  static constexpr int kThreads = kConsumers + (kProducerWG ? 128 : 0);
  static constexpr int kKeepRegs = kDqWriter ? 24 : 56, kConsumerRegs = kDqWriter ? 240 : 224;
  static_assert(!kProducerWG || kKeepRegs * 128 + kConsumerRegs * kConsumers <= 168 * kThreads,
                "setmaxnreg redistributes the block's registers");
  static constexpr int kBlockN = tiles::dkdv_sm90_block_n(HD);  // keys per block (64 per warpgroup)
  static constexpr int kBlockM = BM_;                            // query rows per step (tiles::dkdv_sm90_block_m)
  // 128 query rows per step: head dim 64 without bias or dropout only (the registers: S^T and dP^T are 64 x 128 per
  // warpgroup; the keep producer's bit layout and the bias staging are written for 64).
  static_assert(kBlockN == 128 && (kBlockM == 64 || (kBlockM == 128 && HD == 64 && !kBias_ && !kDropout_)),
                "2 warpgroups x 64 keys; 64 or 128 query rows per step");
  // The dQ product of a step (BM x HD) is split between the warpgroups by columns at 64 rows (HD / 2 each), by rows
  // at 128 (64 x HD each): a 64 x 64 fp32 tile per warpgroup either way at head dim 64.
  static constexpr bool kDqSplitRows = kBlockM == 128;
  // At 128 rows P^T and dS^T stay in registers as at 64 (A operands of dV and dK): 255 registers and 140 bytes of
  // spill stores (ptxas -v). Staging P^T in shared memory for dV and reading dS^T from sdS for dK (84 bytes of
  // spills) measured slower on the H200: GPT-OSS full backward 2.10-2.12 ms against 1.93-1.94
  // (bench/log/2026-12-03-dkdv-128-row-step.md, 09990b7).
  // The shared memory (DkvSm90Smem has the layout): the sizes.
  // kBias: two bias buffers at head dim 64, one at 128. There, 225.0 KiB leave no room for the alignment slack: the
  // compiler pads every one of these kernels' static shared memory to 1024 bytes (cuobjdump -res-usage: SHARED
  // 1024), the dynamic part starts 1024-aligned, and the kernel traps if it does not (227 KiB is the most a block
  // may have, static included).
  static constexpr int kBiasTile = kBlockM * kBlockN;
  static constexpr int kBiasBufs = !kBias_ ? 0 : HD == 64 ? 2 : 1;
  static constexpr int kBiasOff =
      (2 * kBlockN * HD + 4 * kBlockM * HD + kDsBufs * kBlockN * kBlockM) * 2 + kDqBufs * kBlockM * HD * 4;
  static constexpr int kKeepOff = kBiasOff + kBiasBufs * kBiasTile * 2 + 4 * kBlockM * 4;
  static constexpr int kBarsOff = kKeepOff + (kKeepProducer ? 2 * kBlockN * 8 + 32 : 0);
  static constexpr int kSlack = kBias_ && HD == 128 ? 0 : 1024;
  static constexpr int kSmem = kBarsOff + 32 + (kDqWriter ? 64 : 0) + kSlack;
  static_assert(HD > 128 || kSmem + 1024 <= 227 * 1024, "shared memory per block (dynamic + 1024 static)");
  // kBias summing a KV group's heads (Params::ws_dbias_heads = h_kv): each thread's dS^T fragment (kBlockM / 2
  // floats) summed over the group in shared memory, [kBlockM / 2][kConsumers] floats after the barriers.
  static constexpr int kSmemDbiasSum = kSmem + kConsumers * (kBlockM / 2) * 4;
  // DkvSm90Smem places sDb and the writer's mbarriers (dq_full, dq_empty, q_empty) both right after the ticket: a
  // writer variant with bias would need its own room for one of them.
  static_assert(!(kDqWriter && kBias_), "sDb and the dq writer's mbarriers overlap");
};

// The shared memory of bwd_dkdv_sm90_kernel, in this order from a base aligned to 1024 bytes (the swizzled tiles;
// DkvSm90Traits has the sizes):
//   sK, sV [BN][HD]; sQ, sdO [2][BM][HD] (the step's buffers); sdS [kDsBufs][BN][BM] (dS^T: rows = keys, cols =
//     queries), all 16-bit in the 128-byte-swizzled row panels, each 1024-byte aligned (BN * HD * 2 bytes per tile);
//   sdQ [kDqBufs][BM][HD] fp32: the dq tiles of one or two steps for the TMA reduce-adds, in the swizzled image of
//     the ws_dq map's boxes (1024-byte aligned);
//   kBias: sB [kBiasBufs][BM * BN], the staged bias tiles (rows = queries, swizzled row panels, 1024-byte aligned);
//   sL, sD [2][BM] fp32: LSE2 and D - d_lse of the step's rows;
//   kKeepProducer: sKeep [2][BN] uint64 (bit c of row r: query i0 + c keeps key j0 + r) and its 4 mbarriers
//     (keep_bars);
//   bars [2] (the TMA loads of the two buffers), bias_bar (kBias at head dim 128: the bias tile's TMA load), kDet's
//     ticket: 32 bytes;
//   kBias summing a KV group's heads: sDb [NT * 4][256] fp32 (DkvSm90Traits::kSmemDbiasSum).
template <typename T, typename Tr>
struct DkvSm90Smem {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim;
  T *sK, *sV, *sQ, *sdO, *sdS;
  float* sdQ;
  T* sB;
  float *sL, *sD;
  uint64_t* sKeep;
  KeepBars* keep_bars;
  uint64_t *bars, *bias_bar;
  unsigned* ticket;
  float* sDb;
  uint64_t *dq_full, *dq_empty;  // kDqWriter: the staged dq tiles' handover, per buffer
  uint64_t* q_empty;             // kDqWriter: the Q / dO buffers free again (every math thread arrives)
  __device__ __forceinline__ explicit DkvSm90Smem(unsigned char* smem_raw) {
    sK = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
    sV = sK + BN * HD;
    sQ = sV + BN * HD;
    sdO = sQ + 2 * BM * HD;
    sdS = sdO + 2 * BM * HD;
    sdQ = reinterpret_cast<float*>(sdS + Tr::kDsBufs * BN * BM);
    sB = reinterpret_cast<T*>(sdQ + Tr::kDqBufs * BM * HD);
    sL = reinterpret_cast<float*>(sB + Tr::kBiasBufs * Tr::kBiasTile);
    sD = sL + 2 * BM;
    sKeep = reinterpret_cast<uint64_t*>(sD + 2 * BM);
    keep_bars = reinterpret_cast<KeepBars*>(sKeep + 2 * BN);
    bars = sKeep + (Tr::kKeepProducer ? 2 * BN + 4 : 0);
    bias_bar = bars + 2;
    ticket = reinterpret_cast<unsigned*>(bars + 3);
    sDb = reinterpret_cast<float*>(bars + 4);
    dq_full = bars + 4;
    dq_empty = bars + 6;
    q_empty = bars + 8;
  }
  // kDqWriter: waits until the writer has read the tile of the step that last used step it's sdQ buffer (it -
  // kDqBufs; handover.hpp's ring of kDqBufs buffers).
  __device__ __forceinline__ void wait_dq_buffer_free(int it) const {
    constexpr int kQ = Tr::kDqBufs;
    if (it >= kQ) mbar_wait(&dq_empty[ring_slot<kQ>(it)], ring_parity_of<kQ>(it - kQ));
  }
  // Thread 0, before the block's first barrier.
  __device__ __forceinline__ void init_barriers() const {
    mbar_init(&bars[0], Tr::kOneBarrier ? 32 : 1);  // (kOneBarrier: every lane of the loader warp arrives)
    mbar_init(&bars[1], Tr::kOneBarrier ? 32 : 1);
    mbar_init(bias_bar, 1);
    if constexpr (Tr::kDqWriter) {
      for (int b = 0; b < 2; ++b) {
        mbar_init(&dq_full[b], Tr::kConsumers);
        mbar_init(&dq_empty[b], 32);  // (every lane of the writer warp)
        mbar_init(&q_empty[b], Tr::kConsumers);
      }
    }
    if constexpr (Tr::kKeepProducer) {
      for (int b = 0; b < 2; ++b) {
        mbar_init(&keep_bars->full[b], Tr::kThreads - Tr::kConsumers);
        mbar_init(&keep_bars->empty[b], Tr::kConsumers);
      }
    }
  }
};

// The loads of step (query head ih of the group, query block qb_lo + iq) into buffer buf. Q and dO by TMA where all
// BM rows of the block lie in the sequence (tma_block: a function of the block alone, so the issuing step and the
// consuming step agree on it, and every thread does): thread kLoader arms bars[buf] with the bytes of every box of
// the step (Q, dO and, with two bias buffers, the bias tile); else by cp.async (every math thread; rows past len_q
// zero-filled). The rows' LSE2 / D into registers (pf; stored to sL / sD one step later). kBias: the bias tile staged
// by TMA (bias_smem; bias_staging.cuh): two buffers (head dim 64), with the step's Q / dO on bars[buf]; one (128),
// on bias_bar (bias_one), issued after the barrier that follows every thread's reads of the previous step's tile.
template <typename T, typename Tr, int kLoader, typename TmaBlock>
struct DkvSm90Loads {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim;
  // The kernel's state, by reference.
  const int& hk;
  const int& j0;
  const TmaBlock& tma_block;
  const Params& p;
  const int& qb_lo;
  const bool& bias_smem;
  const int& tid;
  const DkvSm90Smem<T, Tr>& sm;
  const SeqInfo& sq;
  const int& n;
  const Sm90Tma& tma;
  const KeyTile<BN>& kt;
  RowStatsPrefetch<BM>& pf;
  const int& pf_tid;

  __device__ __forceinline__ void operator()(int buf, int ih, int iq) const {
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    const bool bias_here = Tr::kBiasBufs == 2 && bias_smem;
    const uint32_t bias_bytes = bias_here ? Tr::kBiasTile * sizeof(T) : 0u;
    if (tma_block(i0)) {
      if (tid == kLoader) {
        mbar_arrive_expect_tx(&sm.bars[buf], 2 * BM * HD * sizeof(T) + bias_bytes);
        const int row = static_cast<int>(sq.q_start) + i0, nb = p.varlen ? 0 : n;
#pragma unroll
        for (int c = 0; c < HD / 64; ++c) {
          tma_load_4d(sm.sQ + buf * BM * HD + c * BM * 64, &tma.q, c * 64, row, h, nb, &sm.bars[buf]);
          tma_load_4d(sm.sdO + buf * BM * HD + c * BM * 64, &tma.d_out, c * 64, row, h, nb, &sm.bars[buf]);
        }
      }
    } else {
      const T* qg = kt.template q_rows<const T>(p.q, p.q_st, h, i0);
      const T* dog = kt.template q_rows<const T>(p.d_out, p.dout_st, h, i0);
      load_tile_sw<BM, HD, Tr::kConsumers>(sm.sQ + buf * BM * HD, qg, p.q_st.s, sq.len_q - i0, p.d, tid);
      load_tile_sw<BM, HD, Tr::kConsumers>(sm.sdO + buf * BM * HD, dog, p.dout_st.s, sq.len_q - i0, p.d_v, tid);
      if (bias_here && tid == kLoader) mbar_arrive_expect_tx(&sm.bars[buf], bias_bytes);
    }
    if (bias_here && tid == kLoader) issue_bias(buf, h, i0, &sm.bars[buf]);
    pf.load(p, sq, n, h, i0, pf_tid);
  }
  // The bias tile of query head h, queries i0 .. into buffer buf, completing on bar (thread kLoader; the caller arms
  // bar).
  __device__ __forceinline__ void issue_bias(int buf, int h, int i0, uint64_t* bar) const {
    load_bias_tile<BM, BN>(sm.sB, buf, tma.bias, p, n, h, i0, j0, bar);
  }
  // One bias buffer: step (ih, iq)'s tile on bias_bar (thread kLoader).
  __device__ __forceinline__ void bias_one(int ih, int iq) const {
    mbar_arrive_expect_tx(sm.bias_bar, Tr::kBiasTile * sizeof(T));
    issue_bias(0, hk * p.group + ih, (qb_lo + iq) * BM, sm.bias_bar);
  }
};

// The products of a step of bwd_dkdv_sm90_kernel (their order: the header above) for one warpgroup's 64 keys, with
// the block's constants: the kernel's state, by reference.
template <typename T, typename Tr, bool kDropout, bool kBias>
struct DkvSm90Math {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim, NT = BM / 8, NO = HD / 8;
  static constexpr bool kProducer = Tr::kKeepProducer;
  const Params& p;
  const DkvSm90Smem<T, Tr>& sm;
  const Mask& mk;
  const SeqInfo& sq;
  const int& n;
  const int& hk;
  const int& j0;
  const bool& bias_smem;
  const int& tid;
  const int& lane;
  const int& wg;
  const int& wl;
  const int& g;
  const int& t;
  const int& key_w;
  const T* const& sK_wg;
  const T* const& sV_wg;

  // Step it's dS^T stage (the step's Q / dO buffer's index with two stages).
  __device__ __forceinline__ T* sds(int buf) const { return sm.sdS + (Tr::kDsBufs == 2 ? buf : 0) * BN * BM; }

  // The first half of step it (query head h = member ih of the group, queries i0 .., buffer buf), for thread row r0
  // of sdS. active (the warpgroup's keys see some query of the block; warpgroup-uniform): S^T = K Q^T, dP^T = V dO^T;
  // P^T = exp2(S^T sc - LSE2) (kBias: with bias^T; kDropout: dV takes P^T * keep / (1 - p)); dV += P^T dO, issued
  // and still running on return; dS^T = P^T (dP^T - D), rounded to T, to sdS (for dQ = dS K) and to as (the A operand
  // of dK, k-step = 16 queries); kBias: dS^T to the d_bias workspace. Not active: as = 0 and zero rows of sdS.
  __device__ __forceinline__ void ds_t(bool active, float (&acc_dv)[NO][4], uint32_t (&as)[BM / 16][4], int buf,
                                       int it, int h, int ih, int i0, int r0) const {
    const T* q_cur = sm.sQ + buf * BM * HD;
    const T* do_cur = sm.sdO + buf * BM * HD;
    const float* l_cur = sm.sL + buf * BM;
    const float* d_cur = sm.sD + buf * BM;
    if (active) {
      float s[NT][4], dpv[NT][4];  // rows = this warp's 16 keys, cols = BM queries
      wgmma_fence();
      issue_st<T, BN, HD>(s, sK_wg, q_cur);       // S^T = K Q^T
      issue_dpt<T, BN, HD>(dpv, sV_wg, do_cur);   // dP^T = V dO^T
      uint64_t keep_lo = 0, keep_hi = 0;  // kDropout: the step's keep bits of rows r0, r0 + 8 (keep_producers.cuh)
      if constexpr (kProducer)
        take_keep_bits<BN>(sm.sKeep, sm.keep_bars, buf, it, r0, t, keep_lo, keep_hi);
      else if constexpr (kDropout)
        keep_lo = Dropout(p, n, h).keep_bits<true, NT>(key_w, i0, p.s_kv, lane);
      const DkvKeepBits<kProducer> keep{keep_lo, keep_hi};
      BiasPrefetch<T, NT, true> bias;  // kBias: the bias^T of the tile (bias_staging.cuh)
      BiasSmemView<T, NT, true, SwOffset<BM>> bias_view{SwOffset<BM>{}};
      prefetch_bias_t<BM, BN, Tr::kBiasBufs>(bias, bias_view, bias_smem, sm.sB, buf, p, n, h, key_w, j0, i0, sq.len_q,
                                             sq.len_kv, lane);
      wgmma_wait<1>();  // S^T
      fence_acc(s);
      trace_mark(it, kTrS);
      bind_bias_t<Tr::kBiasBufs>(bias_view, bias_smem, sm.sB, sm.bias_bar, it, key_w, j0, lane);
      float sc_bias = 1.f;
      pt_from_st<T, kBias>(s, p, mk, n, h, key_w, i0, lane, l_cur, bias_t_source<Tr::kBiasBufs>(bias, bias_view),
                           sc_bias);  // P^T = exp2(S^T sc - LSE2)
      uint32_t ap[BM / 16][4];
      float sd[NT][4];  // kDropout: P^T * keep / (1 - p)
      pack_pt<T, kDropout>(s, ap, sd, keep, p.dropout_rscale);
      wgmma_fence();
      issue_dv<T, HD>(acc_dv, ap, do_cur);  // dV += P^T dO
      wgmma_wait<1>();  // dP^T (dV still running)
      fence_acc(dpv);
      trace_mark(it, kTrDp);
      dst_from_dpt<kDropout>(dpv, s, d_cur, t, keep, p.dropout_rscale);  // dS^T = P^T (dP^T - D)
      store_frag_sw<T, BN>(sds(buf), dpv, r0, 0, t);  // dS^T (rounded to T, as for dK) staged for dQ = dS K
      pack_a_frags<T>(dpv, as);
      if constexpr (kBias)  // dS^T to the d_bias workspace (dpv is not read after this)
        store_dbias_step<NT, Tr::kConsumers>(p, dpv, sm.sDb, n, h, hk, ih, key_w, i0, sq.len_q, sq.len_kv, tid, lane);
    } else {  // this warpgroup's keys see no query of the block: its dS^T rows are zero
      if constexpr (kProducer) mbar_arrive(&sm.keep_bars->empty[buf]);  // (every math thread arrives: KeepBars)
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) as[kc][0] = as[kc][1] = as[kc][2] = as[kc][3] = 0u;
      store_zero_frag_sw<BN, NT>(sds(buf), r0, t);
    }
  }

  // The second half, after the barrier that follows every warpgroup's dS^T: dQ = dS K over the block's 128 keys
  // (BM 64: warpgroup wg's HD / 2 columns; BM 128: its 64 rows, sdS's panel wg) and dK += dS^T Q (as = 0 where the
  // warpgroup skipped the step); turn() (kDet's turn) while they run. A full query block's dQ tile (tma_dq) goes to
  // sdQ[buf], its reduce-adds issued after the next barrier (staged); other blocks add by atomics. kDqWriter: every
  // tile goes to sdQ[ring_slot(it)] (kDqBufs of them) and to the writer (dq_full), once the writer has read the
  // buffer's previous tile (dq_empty: waited for here with one barrier a step, by thread 0 before the second with
  // two).
  template <typename TmaDq, typename Turn>
  __device__ __forceinline__ void dq_dk(float (&acc_dk)[NO][4], float (&acc_dv)[NO][4],
                                        const uint32_t (&as)[BM / 16][4], int buf, int it, int h, int i0,
                                        const TmaDq& tma_dq, const Turn& turn, DqStaged& staged) const {
    constexpr bool kRows = Tr::kDqSplitRows;
    constexpr int HN = kRows ? HD : HD / 2;
    const int n0 = kRows ? 0 : wg * HN, m0 = kRows ? wg * 64 : 0;
    const T* q_cur = sm.sQ + buf * BM * HD;
    float accq[HN / 8][4];
    wgmma_fence();
    issue_dq<T, BN>(accq, sds(buf), m0, sm.sK, n0);  // dQ = dS K
    issue_dk<T, HD>(acc_dk, as, q_cur);  // dK += dS^T Q
    turn();
    wgmma_wait<1>();  // dV, dQ (dK still running)
    fence_acc(accq);
    if (Tr::kDqWriter || tma_dq(i0)) {  // staged: for the writer (dq_writer: every tile) or the reduce-adds
      constexpr int kQ = Tr::kDqBufs;
      if constexpr (Tr::kOneBarrier) sm.wait_dq_buffer_free(it);  // (two barriers a step: thread 0 before the second)
      dq_stage<BM>(reinterpret_cast<unsigned char*>(sm.sdQ + ring_slot<kQ>(it) * BM * HD), accq, m0 + wl * 16 + g,
                   n0, t);
      fence_proxy_async();
      if constexpr (Tr::kDqWriter)
        mbar_arrive(&sm.dq_full[ring_slot<kQ>(it)]);
      else  // reduce-adds issued after the next barrier (columns >= d are clipped by the map)
        staged = DqStaged{true, buf, h, static_cast<int>(ws_row(p, sq, n, i0))};
    } else {
      dq_atomic_add(p, sq, n, h, i0, m0 + wl * 16 + g, n0, t, accq);
    }
    wgmma_wait<0>();  // dK: as[] and the Q buffer are free again
    fence_acc(acc_dk);
    fence_acc(acc_dv);
  }
};

// The step loader (DkvSm90Traits::kDqWriter: the producer warpgroup's warp 9): for every step, once the math warps
// have finished the step two before it with the same buffer (q_empty), its Q / dO tiles into buffer buf: by TMA for
// a query block inside the sequence (tma_block; lane 0 adds the tiles' bytes to bars[buf]'s phase); kAll
// (DkvSm90Traits::kOneBarrier, the whole warp): else by the warp's cp.async with the rows past the sequence
// zero-filled, and the step's rows' LSE2 / D into sL / sD[buf] (rows past the sequence: LSE2 = inf, so that P = 0
// there), every lane arriving on bars[buf] (32 arrivals a phase) once its stores (and its cp.async, waited for and
// fenced for the wgmma's async proxy) are done; not kAll (lane 0 alone): the math threads load the rest (a partial
// block by cp.async, LSE2 / D; DkvSm90Loads), and lane 0's arrival (with the bytes, or plain) is the phase's one.
// Each step thus completes a phase of bars[buf] and the math waits for each (handover.hpp: neither side runs two
// phases ahead).
template <bool kAll, typename Order, int BM, int BN, int HD, typename T, typename TmaBlock>
__device__ __forceinline__ void qdo_loader(const DkvBlock<BM, BN>& blk, const Params& p, const Sm90Tma& tma,
                                           const TmaBlock& tma_block, T* sQ, T* sdO, float* sL, float* sD,
                                           uint64_t* bars, uint64_t* q_empty, int lane) {
  const KeyTile<BN>& kt = blk.kt;
  const SeqInfo& sq = kt.sq;
  const int iters = blk.nq * p.group, nb = p.varlen ? 0 : kt.n;
  if constexpr (kAll) pdl_wait();  // the preprocess's ws_lse2 / ws_dp
  int ih, iq;
  Order::first(blk.nq, p.group, ih, iq);
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1, h = kt.hk * p.group + ih, i0 = (blk.qb_lo + iq) * BM;
    if (it >= 2) mbar_wait(&q_empty[buf], ring_parity(it - 2));
    const bool by_tma = tma_block(i0);
    if (by_tma) {
      if (lane == 0) {
        if constexpr (kAll)
          mbar_expect_tx(&bars[buf], 2 * BM * HD * sizeof(T));  // (lane 0 arrives below, after its stores)
        else
          mbar_arrive_expect_tx(&bars[buf], 2 * BM * HD * sizeof(T));
        const int row = static_cast<int>(sq.q_start) + i0;
#pragma unroll
        for (int c = 0; c < HD / 64; ++c) {
          tma_load_4d(sQ + buf * BM * HD + c * BM * 64, &tma.q, c * 64, row, h, nb, &bars[buf]);
          tma_load_4d(sdO + buf * BM * HD + c * BM * 64, &tma.d_out, c * 64, row, h, nb, &bars[buf]);
        }
      }
    } else if constexpr (kAll) {
      const T* qg = kt.template q_rows<const T>(p.q, p.q_st, h, i0);
      const T* dog = kt.template q_rows<const T>(p.d_out, p.dout_st, h, i0);
      load_tile_sw_rolled<BM, HD>(sQ + buf * BM * HD, qg, p.q_st.s, sq.len_q - i0, p.d, lane, 32);
      load_tile_sw_rolled<BM, HD>(sdO + buf * BM * HD, dog, p.dout_st.s, sq.len_q - i0, p.d_v, lane, 32);
      cp_async_commit();
    }
    if constexpr (kAll) {
      for (int r = lane; r < BM; r += 32) {
        RowStatsPrefetch<BM> rs;
        rs.load(p, sq, kt.n, h, i0, r);
        rs.store(sL, sD, buf, r);
      }
      if (!by_tma) {
        cp_async_wait<0>();
        fence_proxy_async();
      }
      mbar_arrive(&bars[buf]);
    } else if (!by_tma) {
      mbar_arrive(&bars[buf]);  // the math threads load this step by cp.async; it still completes a phase
    }
    Order::next(blk.nq, p.group, ih, iq);
  }
}

// The producer warpgroup (DkvSm90Traits::kProducerWG, warpgroup 2), true for its threads once they are done: they
// give registers to the math warpgroups (setmaxnreg) and take their role: kDqWriter: warp 8 the dq writer
// (bwd_sm90_dq.cuh), warp 9 (kOneBarrier) or its lane 0 the step loader (qdo_loader), the other threads leave at once;
// kKeepProducer: the keep bits (keep_producers.cuh). The math threads (false) take the registers.
template <typename Tr, typename Order, typename Turns, bool kDet, int BM, int BN, typename T, typename TmaBlock,
          typename TmaDq>
__device__ __forceinline__ bool producer_warpgroup(const DkvBlock<BM, BN>& blk, const Params& p, const Sm90Tma& tma,
                                                   const DkvSm90Smem<T, Tr>& sm, int block, const TmaBlock& tma_block,
                                                   const TmaDq& tma_dq, int tid) {
  constexpr int HD = Tr::kHeadDim;
  const int warp = tid >> 5, lane = tid & 31;
  if (warp >> 2 != 2) {
    setmaxnreg_inc<Tr::kConsumerRegs>();
    return false;
  }
  setmaxnreg_dec<Tr::kKeepRegs>();
  if constexpr (Tr::kDqWriter) {
    if (warp == 8)
      dq_writer<Order, Turns, kDet, BM, BN, HD, Tr::kDqBufs>(blk, p, &tma.dq, tma_dq, sm.sdQ, sm.dq_full, sm.dq_empty,
                                                             block, lane);
    else if (warp == 9 && (Tr::kOneBarrier || lane == 0))
      qdo_loader<Tr::kOneBarrier, Order, BM, BN, HD>(blk, p, tma, tma_block, sm.sQ, sm.sdO, sm.sL, sm.sD, sm.bars,
                                                     sm.q_empty, lane);
  } else {
    keep_producer<BM, BN, Order>(p, blk.kt, blk.mk, blk.qb_lo, blk.nq, sm.sKeep, sm.keep_bars, tid - Tr::kConsumers);
  }
  return true;
}

// The steps of the writer variants (DkvSm90Traits::kOneBarrier), after K and V have landed: per step, the loader's
// phase of bars[buf] (Q / dO, LSE2 / D), the first half (ds_t: dV issued, dS^T to sdS[buf]), the one barrier of the
// 256 math threads (every warpgroup's dS^T stored; each warpgroup had waited for its own dQ product of step it - 1,
// which read the other stage, before it arrived here), the second half (dq_dk: dQ and dK, the dq tile to the
// writer) and, once dK has completed, the arrival on q_empty[buf] (Q / dO, LSE2 / D [buf] free for the loader).
template <typename Order, typename Math, typename T, typename Tr, typename TmaDq, int NO>
__device__ __forceinline__ void dkdv_steps_one_barrier(const Math& math, const DkvSm90Smem<T, Tr>& sm, const Params& p,
                                                       int hk, int qb_lo, int nq, int qg_lo, int qg_hi, int r0,
                                                       const TmaDq& tma_dq, float (&acc_dk)[NO][4],
                                                       float (&acc_dv)[NO][4]) {
  constexpr int BM = Tr::kBlockM;
  const int iters = nq * p.group;
  DqStaged staged;  // (not used: the writer adds every tile)
  int ih, iq;
  Order::first(nq, p.group, ih, iq);
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1, h = hk * p.group + ih, i0 = (qb_lo + iq) * BM;
    trace_mark(it, kTrStep);
    mbar_wait(&sm.bars[buf], ring_parity(it));
    trace_mark(it, kTrLoaded);
    const bool active = i0 < qg_hi && i0 + BM > qg_lo;  // warpgroup-uniform
    uint32_t as[BM / 16][4];                            // dS^T as the A operand of dK (k-step = 16 queries)
    math.ds_t(active, acc_dv, as, buf, it, h, ih, i0, r0);
    trace_mark(it, kTrDs);
    fence_proxy_async();
    named_bar_sync(kBarMath, Tr::kConsumers);
    trace_mark(it, kTrBarrierB);
    math.dq_dk(acc_dk, acc_dv, as, buf, it, h, i0, tma_dq, [] {}, staged);
    trace_mark(it, kTrDk);
    mbar_arrive(&sm.q_empty[buf]);
    Order::next(nq, p.group, ih, iq);
  }
}

// kDropout: the call has dropout (SPEC.md section 2): dV takes P^T * keep / (1 - p), dS^T = P^T (dP^T * keep / (1 - p)
// - D), with the keep bits the producer warpgroup (keep_producer, head dim 64) drew into sKeep, read after the S^T /
// dP^T issue, or (head dim 128, DkvSm90Traits says why) drawn by the math warpgroups while S^T / dP^T run.
// kBias: the call has a bias (not with dropout): S^T takes bias^T (scores.cuh, make_logits), and dS^T (fp32) goes to
// the d_bias workspace (store_dbias_ws) besides dQ, dK; with Params::ws_dbias_heads = h_kv (a bias broadcast over
// the heads, KernelChoice::dbias_group_sum) summed over the KV group's query heads first, in shared memory
// (kSmemDbiasSum): 8x fewer workspace bytes at GPT-OSS (bench/log/2026-12-02-dbias-group-sum.md).
template <typename T, int HD, bool kDet, bool kDropout = false, bool kBias = false, int BM_ = 64>
__global__ void __launch_bounds__(DkvSm90Traits<HD, kBias, kDropout, BM_, kDet>::kThreads, 1)
    bwd_dkdv_sm90_kernel(const Params p, const __grid_constant__ Sm90Tma tma) {
  static_assert(!(kDropout && kBias), "no variant with both (dispatch.cpp)");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = DkvSm90Traits<HD, kBias, kDropout, BM_, kDet>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, NO = HD / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const DkvSm90Smem<T, Tr> sm(smem_raw);
  if constexpr (Tr::kSlack == 0) {
    if ((smem_addr(smem_raw) & 1023) != 0) __trap();  // (DkvSm90Traits: no slack for the alignment)
  }
  const bool bias_smem = kBias && tma.bias_ok != 0;  // kBias: the bias tiles staged by TMA (uniform over the launch)
  constexpr bool kBiasOneBuf = Tr::kBiasBufs == 1;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wl = warp & 3;  // warpgroup, warp within it
  const int g = lane >> 2, t = lane & 3;
  pdl_launch_dependents();  // (programmatic dependent launch: the header above)
  const TileCoord tc = dkdv_tile<kDet>(p, sm.ticket, tid);
  const DkvBlock<BM, BN> blk(p, tc);
  if (blk.kt.outside()) {
    pdl_wait();
    return;
  }
  const KeyTile<BN>& kt = blk.kt;
  const Mask& mk = blk.mk;
  const SeqInfo& sq = kt.sq;
  const int hk = kt.hk, n = kt.n, j0 = kt.j0, qb_lo = blk.qb_lo, nq = blk.nq, iters = nq * p.group;
  trace_block(false, tc.block, hk, n);
  using Order = StepOrder<kDet || kBias>;  // (query head of the group, query block) of each step
  using Turns = DqTurns<dq_turn_per_step(kBias)>;  // kDet

  // A full query block's dq tile by TMA reduce-adds, issued by thread 0 after the next barrier (bwd_sm90_dq.cuh).
  auto tma_block = [&](int i0) { return tma.ok != 0 && i0 + BM <= sq.len_q; };
  auto tma_step = [&](int i0) { return tma_block(i0) || (bias_smem && !kBiasOneBuf); };
  auto tma_dq = [&](int i0) { return tma.dq_ok != 0 && i0 + BM <= sq.len_q; };
  DqStaged staged;  // a staged tile whose reduce-adds are still to be issued
  auto add_pending = [&]() {  // thread 0, after a barrier that follows every thread's sdQ stores of the staged step
    dq_reduce_add<HD>(&tma.dq, [&](int bx) { return sm.sdQ + staged.buf * BM * HD + bx * BM * 32; }, p.d,
                      staged.row, staged.h);
  };
  if (tid == 0) sm.init_barriers();
  __syncthreads();
  if constexpr (Tr::kProducerWG) {  // warpgroup 2 takes its role (producer_warpgroup) and leaves
    if (producer_warpgroup<Tr, Order, Turns, kDet>(blk, p, tma, sm, tc.block, tma_block, tma_dq, tid)) return;
  }
  auto math_sync = [] {
    if constexpr (Tr::kProducerWG) named_bar_sync(kBarMath, Tr::kConsumers);
    else __syncthreads();
  };
  load_kv_sw<HD, Tr::kConsumers>(sm.sK, sm.sV, kt, p, tid);  // K, V of the block, once (cp.async)
  pdl_wait();  // the preprocess's ws_lse2 / ws_dp / zeroed ws_dq (K and V loads are already under way)
  uint32_t phase = 0;  // bit b: parity of the next completion of bars[b]
  RowStatsPrefetch<BM> pf;
  constexpr int kLoader = Tr::kDqWriter ? -1 : kDet ? 32 : 0;  // the TMA loads' thread (-1: the producer's warp 9)
  const int pf_tid = kDet ? tid ^ BM : tid;  // BM 128: threads 128 .. 255
  const DkvSm90Loads<T, Tr, kLoader, decltype(tma_block)> load{hk, j0,  tma_block, p,     qb_lo, bias_smem, tid, sm,
                                                                   sq, n,   tma,       kt, pf,    pf_tid};
  int ih, iq;
  Order::first(nq, p.group, ih, iq);
  if (!Tr::kOneBarrier && iters > 0) {  // (kOneBarrier: the loader warp loads every step)
    load(0, ih, iq);
    if (kBiasOneBuf && bias_smem && tid == kLoader) load.bias_one(ih, iq);
    pf.store(sm.sL, sm.sD, 0, pf_tid);
  }
  cp_async_commit();

  float acc_dk[NO][4], acc_dv[NO][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);
  const int key_wg = j0 + wg * 64;     // first key of this warpgroup
  const int key_w = key_wg + wl * 16;  // first key of this warp
  // Query rows that see some key of this warpgroup: other query blocks are skipped by the warpgroup (exact: its
  // P = dS = 0 there), which then writes zeros to its rows of sdS.
  int qg_lo = 0, qg_hi = 0;
  if (key_wg < sq.len_kv) mk.query_range(key_wg, min(key_wg + 64, sq.len_kv), qg_lo, qg_hi);
  // The warpgroup's 64 rows of K / V (the K-major A operand of S^T / dP^T) start 64 rows into each panel.
  const T* sK_wg = sm.sK + wg * 64 * 64;
  const T* sV_wg = sm.sV + wg * 64 * 64;
  const DkvSm90Math<T, Tr, kDropout, kBias> math{p, sm, mk, sq, n, hk, j0, bias_smem, tid, lane, wg, wl, g, t, key_w,
                                                 sK_wg, sV_wg};

  if constexpr (Tr::kOneBarrier) {
    cp_async_wait<0>();  // K, V
    fence_proxy_async();
    math_sync();
    dkdv_steps_one_barrier<Order>(math, sm, p, hk, qb_lo, nq, qg_lo, qg_hi, wg * 64 + wl * 16 + g, tma_dq, acc_dk,
                                  acc_dv);
  } else {
    for (int it = 0; it < iters; ++it) {
      const int buf = it & 1;
      const int h = hk * p.group + ih;
      const int i0 = (qb_lo + iq) * BM;
      trace_mark(it, kTrStep);
      cp_async_wait<0>();
      if constexpr (Tr::kDqWriter) {  // the loader's phase of this step (its TMA loads, or its turn for cp.async)
        mbar_wait(&sm.bars[buf], ring_parity(it));
      } else if (tma_step(i0)) {  // the step's TMA loads (Q / dO and / or a bias tile)
        mbar_wait(&sm.bars[buf], (phase >> buf) & 1u);
        phase ^= 1u << buf;
      }
      trace_mark(it, kTrLoaded);
      fence_proxy_async();
      math_sync();
      trace_mark(it, kTrBarrierA);
      // thread 0: this step issues the reduce-adds of the previous one (kDet: that step's turn is held)
      if (!Tr::kDqWriter && staged.pending && tid == 0) add_pending();
      const bool issued = staged.pending;
      staged.pending = false;
      int ih_next = ih, iq_next = iq;
      Order::next(nq, p.group, ih_next, iq_next);
      const bool prefetch = it + 1 < iters;
      if (prefetch) load(buf ^ 1, ih_next, iq_next);
      cp_async_commit();
      // kDet, a step that opens a turn: its counter, read early by the threads that wait for the turn.
      const unsigned* sem = nullptr;
      unsigned seen = 0;
      const bool waits = kDet && !Tr::kDqWriter && Turns::opens(ih) && lane == 0 && (warp == 0 || !tma_dq(i0));
      if constexpr (kDet) {
        if (waits) sem = open_dq_turn<Turns>(blk, p, ih, iq, seen);
      }
      const bool active = i0 < qg_hi && i0 + BM > qg_lo;  // warpgroup-uniform
      uint32_t as[BM / 16][4];                            // dS^T as the A operand of dK (k-step = 16 queries)
      math.ds_t(active, acc_dv, as, buf, it, h, ih, i0, wg * 64 + wl * 16 + g);
      trace_mark(it, kTrDs);
      if constexpr (Tr::kDqWriter) {  // the writer has added step it - 2's tile from this buffer
        if (tid == 0) sm.wait_dq_buffer_free(it);
      } else {
        dq_wait_buffer_read(tid, issued);  // this step's sdQ buffer
      }
      trace_mark(it, kTrDqBuffer);
      fence_proxy_async();
      math_sync();
      trace_mark(it, kTrBarrierB);
      // One bias buffer: every thread has read this step's tile; the next step's loads while dQ and dK run.
      if constexpr (kBiasOneBuf) {
        if (bias_smem && prefetch && tid == kLoader) load.bias_one(ih_next, iq_next);
      }
      math.dq_dk(acc_dk, acc_dv, as, buf, it, h, i0, tma_dq, [&] {
        if constexpr (kDet && !Tr::kDqWriter) pass_dq_turn<Turns>(blk, p, tc.block, tid, it, ih, iq, waits, sem, seen);
      }, staged);
      trace_mark(it, kTrDk);
      if constexpr (Tr::kDqWriter) mbar_arrive(&sm.q_empty[buf]);  // dK has completed: Q / dO [buf] are free
      if (prefetch) pf.store(sm.sL, sm.sD, buf ^ 1, pf_tid);
      trace_mark(it, kTrEnd);
      ih = ih_next;
      iq = iq_next;
    }
  }
  if constexpr (!Tr::kDqWriter) dq_finish<kDet, Turns>(blk, p, tid, iters, staged.pending, math_sync, add_pending);
  cp_async_wait<0>();
  wgmma_wait<0>();
  fence_acc(acc_dk);
  fence_acc(acc_dv);
  trace_block(true, tc.block, hk, n);
  store_dkdv<T>(p, kt, wg * 64 + wl * 16, 0, acc_dk, acc_dv, lane);
#endif
}

}  // namespace sinkattn::cuda::sm90

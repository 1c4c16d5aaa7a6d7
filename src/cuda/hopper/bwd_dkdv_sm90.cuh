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
// Block: 2 warpgroups (256 threads), 128 keys (64 per warpgroup: its dK, dV accumulators), BM query rows per step:
// 64, or 128 at head dim 64 without bias / dropout (tiles::dkdv_sm90_block_m; dQ then split by rows:
// DkvSm90Traits::kDqSplitRows). The text below describes BM = 64; at 128 the S^T / dP^T products are m64n128, the
// boxes 128 rows high.
// Per step: S^T and dP^T as two m64n64k16 chains (A = K or V rows of the warpgroup, B = Q or dO, both K-major);
// the softmax part in registers (the accumulator layout is the mma.sync C layout, so mask.cuh / scores.cuh work
// unchanged); dV and dK as m64nHDk16 chains with A = P^T, dS^T from registers and B = dO, Q read MN-major; dS^T
// staged in shared memory; dQ (64 x HD) split by columns between the warpgroups, A = dS (MN-major), B = K (MN-major).
// K, V (loaded once, cp.async) and the staged dS^T are in the 128-byte-swizzled row-panel layout too: dS^T's stores
// are conflict-free (a warp's 8 rows x 4 column pairs hit 32 distinct banks); K as dQ's MN-major B operand starts
// at column n0 (at head dim 64, 64 bytes into the swizzle atom: the hardware swizzles the absolute address).
// Measured against the core-matrix layout these tiles had before (bench/RESULTS.md, 2026-12-01, H200, 25b4f5e):
// within 1% (not the reason for the kernel's speed); kept so that every tile of the kernel has one layout.
// Q, dO are double-buffered in the 128-byte-swizzled row-panel layout (sm90_common.cuh): a query block with all
// 64 rows valid is loaded by TMA (2 * HD / 64 boxes of 64 columns x 64 rows, one thread, completion on an mbarrier
// per buffer) when the launcher could describe q and d_out as tensor maps (Sm90Tma::ok); other blocks (the last,
// partial block of a sequence: TMA would read the next sequence's or padding rows instead of zeros) through
// cp.async. LSE2, D: loads to registers, stored to shared memory one step later.
// Order of a step (each product its own wgmma commit group; bench/RESULTS.md has the measurements):
//   S^T, dP^T issued | wait S^T: P^T = exp2(..) | dV issued | wait dP^T: dS^T, stored to sdS | barrier |
//   dQ, dK issued | wait dQ (dK still running): dQ tile to sdQ (full query blocks) or dQ atomics | wait dK.
// dQ adds: a full query block's 64 x HD fp32 tile is stored to sdQ (two buffers, the swizzled image of
// the ws_dq tensor map's 32-column boxes: conflict-free float2 stores) and added to ws_dq by TMA reduce-adds that
// thread 0 issues after the next barrier (the reduce unit does the adds; before this, 2 * HD / 8 float2 atomics per
// thread and step); thread 0 waits for the reduce-adds of two steps ago to have read their buffer before the
// barrier that precedes the stores into it, and for all of them before the block exits. Partial blocks and
// SINKATTN_CUDA_DQ_ATOMICS=1 add with per-thread atomics.
// kDet: the block's tile comes from a ticket (the launch order of its key blocks), steps run query-block-major and
// descending, a step that opens a turn (every step, or with a bias the first step of a query block: DqTurns,
// dq_turn_per_step) reads its counter early and, before its dQ adds, waits for its turn while dQ and dK run (thread 0
// alone when the block's tiles go by TMA reduce-add, which thread 0 issues; else one lane per warp), and the step
// after the turn's last one releases it (thread 0, once the reduce-adds have completed, while that step's dQ and dK
// run; the thread issues no loads in this variant, kLoader). Releasing later (one more step, or by warp 7 after the
// next barrier) measured slower: the successor waits for the release (bench/RESULTS.md, 2026-12-03, H200,
// dfffab6). Why these turns: dq_order.hpp.
#pragma once

#include <type_traits>

#include <cuda.h>

#include "cuda/bwd_rows.cuh"
#include "cuda/dropout.cuh"
#include "cuda/epilogue.cuh"
#include "cuda/dq_order.hpp"
#include "cuda/hopper/bwd_sm90_dq.cuh"
#include "cuda/hopper/bwd_sm90_prologue.cuh"
#include "cuda/hopper/keep_producers.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/hopper/wgmma_ops.cuh"
#include "cuda/mask.cuh"
#include "cuda/prologue.cuh"
#include "cuda/scheduler.cuh"
#include "cuda/scores.cuh"

namespace sinkattn::cuda::sm90 {

template <int HD, bool kBias_ = false, bool kDropout_ = false, int BM_ = 64>
struct DkvSm90Traits {
  static constexpr int kConsumers = 256;  // the 2 warpgroups of the math (64 keys each)
  // kDropout at head dim 64: a third warpgroup, the keep producer (keep_producer: Philox blocks into sKeep), with
  // kKeepRegs registers, the math warpgroups kConsumerRegs (setmaxnreg, within the block's launch allocation of
  // 168 per thread: setmaxnreg.inc waits until the block's own pool has the registers; 65536 is not the bound).
  // At head dim 128 the math alone takes 254 registers (ptxas -v): at 240, what a producer would leave, it spills
  // 180 bytes (988 deterministic) and serialises its wgmmas, so there the math warpgroups draw the bits themselves
  // (Dropout::keep_bits).
  static constexpr bool kKeepProducer = kDropout_ && tiles::dkdv_sm90_keep_producer(HD);
  static constexpr int kThreads = kConsumers + (kKeepProducer ? 128 : 0);
  static constexpr int kKeepRegs = 56, kConsumerRegs = 224;
  static_assert(!kKeepProducer || kKeepRegs * 128 + kConsumerRegs * kConsumers <= 168 * kThreads,
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
  // spills) measured slower on the H200: GPT-OSS full backward 2.10-2.12 ms against 1.93-1.94 (bench/RESULTS.md,
  // 2026-12-03, 09990b7).
  // sK, sV [BN][HD]; sQ, sdO [2][BM][HD]; sdS [BN][BM] (all 128-byte-swizzled row panels), 2 bytes each; sdQ
  // [2][BM][HD] fp32 (the dq tiles of two steps for the TMA reduce-adds, in the swizzled image of the ws_dq map's
  // boxes); kBias: sB [kBiasBufs][BM * BN], the staged bias tiles (rows = queries, swizzled row panels); LSE2, D
  // [2][BM] fp32; kKeepProducer: sKeep [2][BN] uint64 (bit c of row r: query i0 + c keeps key j0 + r) and its 4
  // mbarriers (KeepBars); 3 mbarriers (8 bytes each: the TMA loads of the two buffers, and the bias tile of kBias at
  // head dim 128) and kDet's ticket (32 bytes in all); room to align the base to 1024 bytes (the swizzled tiles).
  // kBias: two bias buffers at head dim 64, one at 128. There, 225.0 KiB leave no room for the alignment slack: the
  // compiler pads every one of these kernels' static shared memory to 1024 bytes (cuobjdump -res-usage: SHARED
  // 1024), the dynamic part starts 1024-aligned, and the kernel traps if it does not (227 KiB is the most a block
  // may have, static included).
  static constexpr int kBiasTile = kBlockM * kBlockN;
  static constexpr int kBiasBufs = !kBias_ ? 0 : HD == 64 ? 2 : 1;
  static constexpr int kBiasOff =
      (2 * kBlockN * HD + 4 * kBlockM * HD + kBlockN * kBlockM) * 2 + 2 * kBlockM * HD * 4;
  static constexpr int kKeepOff = kBiasOff + kBiasBufs * kBiasTile * 2 + 4 * kBlockM * 4;
  static constexpr int kBarsOff = kKeepOff + (kKeepProducer ? 2 * kBlockN * 8 + 32 : 0);
  static constexpr int kSlack = kBias_ && HD == 128 ? 0 : 1024;
  static constexpr int kSmem = kBarsOff + 32 + kSlack;
  static_assert(HD > 128 || kSmem + 1024 <= 227 * 1024, "shared memory per block (dynamic + 1024 static)");
  // kBias summing a KV group's heads (Params::ws_dbias_heads = h_kv): each thread's dS^T fragment (kBlockM / 2
  // floats) summed over the group in shared memory, [kBlockM / 2][kConsumers] floats after the barriers.
  static constexpr int kSmemDbiasSum = kSmem + kConsumers * (kBlockM / 2) * 4;
};

// kDropout: the call has dropout (SPEC.md section 2): dV takes P^T * keep / (1 - p), dS^T = P^T (dP^T * keep / (1 - p)
// - D), with the keep bits the producer warpgroup (keep_producer, head dim 64) drew into sKeep, read after the S^T /
// dP^T issue, or (head dim 128, DkvSm90Traits says why) drawn by the math warpgroups while S^T / dP^T run.
// kBias: the call has a bias (not with dropout): S^T takes bias^T (scores.cuh, make_logits), and dS^T (fp32) goes to
// the d_bias workspace (store_dbias_ws) besides dQ, dK; with Params::ws_dbias_heads = h_kv (a bias broadcast over
// the heads, KernelChoice::dbias_group_sum) summed over the KV group's query heads first, in shared memory
// (kSmemDbiasSum): 8x fewer workspace bytes at GPT-OSS (bench/RESULTS.md, 2026-12-02).
template <typename T, int HD, bool kDet, bool kDropout = false, bool kBias = false, int BM_ = 64>
__global__ void __launch_bounds__(DkvSm90Traits<HD, kBias, kDropout, BM_>::kThreads, 1)
    bwd_dkdv_sm90_kernel(const Params p, const __grid_constant__ Sm90Tma tma) {
  static_assert(!(kDropout && kBias), "no variant with both (dispatch.cpp)");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using Tr = DkvSm90Traits<HD, kBias, kDropout, BM_>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, NT = BM / 8, NO = HD / 8;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
  T* sV = sK + BN * HD;
  T* sQ = sV + BN * HD;       // [2][BM * HD], swizzled row panels (1024-byte aligned: BN * HD * 2 bytes per tile)
  T* sdO = sQ + 2 * BM * HD;  // [2][BM * HD], swizzled row panels
  T* sdS = sdO + 2 * BM * HD; // [BN * BM]: dS^T, rows = keys, cols = queries
  float* sdQ = reinterpret_cast<float*>(sdS + BN * BM);  // [2][BM * HD] fp32 (1024-byte aligned)
  T* sB = reinterpret_cast<T*>(sdQ + 2 * BM * HD);      // kBias: [kBiasBufs][BM * BN] (1024-byte aligned)
  float* sL = reinterpret_cast<float*>(sB + Tr::kBiasBufs * Tr::kBiasTile);  // [2][BM] LSE2
  float* sD = sL + 2 * BM;                              // [2][BM] D - d_lse
  uint64_t* sKeep = reinterpret_cast<uint64_t*>(sD + 2 * BM);  // kKeepProducer: [2][BN] keep bits
  KeepBars* keep_bars = reinterpret_cast<KeepBars*>(sKeep + 2 * BN);  // kKeepProducer
  uint64_t* bars = sKeep + (Tr::kKeepProducer ? 2 * BN + 4 : 0);     // [2]: TMA completion per buffer
  uint64_t* bias_bar = bars + 2;                     // kBias, one bias buffer: its TMA completion
  unsigned* ticket = reinterpret_cast<unsigned*>(bars + 3);  // kDet
  float* sDb = reinterpret_cast<float*>(bars + 4);  // kBias, group sum: [NT * 4][256] (kSmemDbiasSum)
  if constexpr (Tr::kSlack == 0) {
    if ((smem_addr(smem_raw) & 1023) != 0) __trap();
  }
  // kBias: each step's bias tile staged by TMA (uniform over the launch). Two buffers (head dim 64): with the step's
  // Q / dO, on bars[buf]. One (128): on bias_bar, the next step's tile issued by thread 0 after the barrier that
  // follows every thread's reads of this step's (the one before dQ), so it loads while dQ and dK run.
  const bool bias_smem = kBias && tma.bias_ok != 0;
  constexpr bool kBiasOneBuf = Tr::kBiasBufs == 1;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2, wl = warp & 3;  // warpgroup, warp within it
  const int g = lane >> 2, t = lane & 3;
  // Programmatic dependent launch (KernelChoice::pdl): the dq convert after this kernel may start once every block
  // of it has started; and this kernel may have started before the preprocess ended: the math threads wait for it
  // in pdl_wait below, before their first read of its rows' LSE2 / D or add to ws_dq (which it zeroes); a block past
  // its sequence's keys waits before it exits (varlen with no keys: else every block could exit first). The ticket
  // counter and the turns' semaphores were zeroed before the preprocess was launched (cuda_backend.cu).
  pdl_launch_dependents();
  const TileCoord tc = dkdv_tile<kDet>(p, ticket, tid);
  const DkvBlock<BM, BN> blk(p, tc);
  if (blk.kt.outside()) {
    pdl_wait();
    return;
  }
  const KeyTile<BN>& kt = blk.kt;
  const Mask& mk = blk.mk;
  const SeqInfo& sq = kt.sq;
  const int hk = kt.hk, n = kt.n, j0 = kt.j0, qb_lo = blk.qb_lo, nq = blk.nq, iters = nq * p.group;
  // (query head of the group, query block) of each step. kBias: query-block-major (the order of kDet) also without
  // kDet, so the heads of a group read one bias tile in consecutive steps: head-major, the non-deterministic bias
  // backward took 12.2 ms against 7.0 ms deterministic at GPT-OSS full (ncu, bench/RESULTS.md 2026-12-01, H200,
  // 299693c).
  using Order = StepOrder<kDet || kBias>;
  using Turns = DqTurns<dq_turn_per_step(kBias)>;  // kDet

  // Blocks loaded by TMA: all BM rows inside the sequence (a function of the block alone, so the issuing step and
  // the consuming step agree on it, and every thread does). A step waits for its buffer's mbarrier when it has such a
  // block or a staged bias tile.
  auto tma_block = [&](int i0) { return tma.ok != 0 && i0 + BM <= sq.len_q; };
  auto tma_step = [&](int i0) { return tma_block(i0) || (bias_smem && !kBiasOneBuf); };
  // The same for the dq adds: a full block's tile goes to sdQ and, after the next barrier, to ws_dq by TMA
  // reduce-adds issued by thread 0 (pending: that step's buffer, head and first ws_dq row); a partial block adds
  // with atomics (a box would add to the next sequence's rows).
  auto tma_dq = [&](int i0) { return tma.dq_ok != 0 && i0 + BM <= sq.len_q; };
  bool pending = false;
  int pending_buf = 0, pending_h = 0, pending_row = 0;
  auto issue_dq = [&]() {  // thread 0, after a barrier that follows every thread's sdQ stores of the pending step
#pragma unroll
    for (int bx = 0; bx < HD / 32; ++bx)
      if (bx * 32 < p.d)
        tma_reduce_add_3d(&tma.dq, sdQ + pending_buf * BM * HD + bx * BM * 32, bx * 32, pending_row, pending_h);
    bulk_commit();
  };
  if (tid == 0) {
    mbar_init(&bars[0], 1);
    mbar_init(&bars[1], 1);
    mbar_init(bias_bar, 1);
    if constexpr (Tr::kKeepProducer) {
      for (int b = 0; b < 2; ++b) {
        mbar_init(&keep_bars->full[b], Tr::kThreads - Tr::kConsumers);
        mbar_init(&keep_bars->empty[b], Tr::kConsumers);
      }
    }
  }
  __syncthreads();
  // kKeepProducer: the third warpgroup draws the keep bits of every step into sKeep, up to two steps ahead of the
  // math warpgroups, and leaves; those then synchronise among themselves on named barrier kBarMath. K and V are
  // loaded by the math warpgroups alone (their cp.async groups are waited for in the step loop).
  constexpr bool kProducer = Tr::kKeepProducer;
  if constexpr (kProducer) {
    if (wg == 2) {
      setmaxnreg_dec<Tr::kKeepRegs>();
      keep_producer<BM, BN, Order>(p, kt, mk, qb_lo, nq, sKeep, keep_bars, tid - Tr::kConsumers);
      return;
    }
    setmaxnreg_inc<Tr::kConsumerRegs>();
  }
  auto math_sync = [] {
    if constexpr (kProducer) named_bar_sync(kBarMath, Tr::kConsumers);
    else __syncthreads();
  };
  const T* kg = kt.template kv_rows<const T>(p.k, p.k_st);
  const T* vg = kt.template kv_rows<const T>(p.v, p.v_st);
  load_tile_sw<BN, HD, Tr::kConsumers>(sK, kg, p.k_st.s, sq.len_kv - j0, p.d, tid);
  load_tile_sw<BN, HD, Tr::kConsumers>(sV, vg, p.v_st.s, sq.len_kv - j0, p.d_v, tid);
  pdl_wait();  // the preprocess's ws_lse2 / ws_dp / zeroed ws_dq (K and V loads are already under way)
  uint32_t phase = 0;  // bit b: parity of the next completion of bars[b]

  // The bias tile of query head h, queries i0 .., keys j0 .. (zeros outside the tensor) into buffer buf, completing
  // on bar (thread 0; the caller arms bar).
  auto issue_bias = [&](int buf, int h, int i0, uint64_t* bar) {
#pragma unroll
    for (int c = 0; c < BN / 64; ++c)
      tma_load_4d(sB + buf * Tr::kBiasTile + c * BM * 64, &tma.bias, j0 + c * 64, i0, p.bias_shape_h == 1 ? 0 : h,
                  p.bias_shape_b == 1 ? 0 : n, bar);
  };
  auto issue_bias_one = [&](int ih, int iq) {  // one buffer: step (ih, iq)'s tile on bias_bar
    mbar_arrive_expect_tx(bias_bar, Tr::kBiasTile * sizeof(T));
    issue_bias(0, hk * p.group + ih, (qb_lo + iq) * BM, bias_bar);
  };
  RowStatsPrefetch<BM> pf;
  // kDet: thread 0 releases the turns, and a release is a MEMBAR.GPU, which waits for every memory operation the
  // thread has in flight. So threads 64 .. 127 (pf_tid < BM) load the rows' LSE2 / D, and lane 0 of warp 1 issues
  // the step's Q / dO TMA loads and stages the bias tiles: with thread 0 issuing them, the release waited for the
  // next step's tiles, 0.24 ms of the deterministic backward at the MHA layer (det x 0.83 -> 0.92; bench/RESULTS.md,
  // 2026-12-03, H200, dfffab6).
  constexpr int kLoader = kDet ? 32 : 0;
  const int pf_tid = kDet ? tid ^ BM : tid;  // BM 128: threads 128 .. 255
  auto issue = [&](int buf, int ih, int iq) {
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    // One arrival (thread 0) with the bytes of every box of the step on bars[buf]: Q, dO and / or the bias tile.
    const bool bias_here = kBias && !kBiasOneBuf && bias_smem;
    const uint32_t bias_bytes = bias_here ? Tr::kBiasTile * sizeof(T) : 0u;
    if (tma_block(i0)) {
      if (tid == kLoader) {
        mbar_arrive_expect_tx(&bars[buf], 2 * BM * HD * sizeof(T) + bias_bytes);
        const int row = static_cast<int>(sq.q_start) + i0, nb = p.varlen ? 0 : n;
#pragma unroll
        for (int c = 0; c < HD / 64; ++c) {
          tma_load_4d(sQ + buf * BM * HD + c * BM * 64, &tma.q, c * 64, row, h, nb, &bars[buf]);
          tma_load_4d(sdO + buf * BM * HD + c * BM * 64, &tma.d_out, c * 64, row, h, nb, &bars[buf]);
        }
      }
    } else {
      const T* qg = kt.template q_rows<const T>(p.q, p.q_st, h, i0);
      const T* dog = kt.template q_rows<const T>(p.d_out, p.dout_st, h, i0);
      load_tile_sw<BM, HD, Tr::kConsumers>(sQ + buf * BM * HD, qg, p.q_st.s, sq.len_q - i0, p.d, tid);
      load_tile_sw<BM, HD, Tr::kConsumers>(sdO + buf * BM * HD, dog, p.dout_st.s, sq.len_q - i0, p.d_v, tid);
      if (bias_here && tid == kLoader) mbar_arrive_expect_tx(&bars[buf], bias_bytes);
    }
    if (bias_here && tid == kLoader) issue_bias(buf, h, i0, &bars[buf]);
    pf.load(p, sq, n, h, i0, pf_tid);
  };
  int ih, iq;
  Order::first(nq, p.group, ih, iq);
  if (iters > 0) {
    issue(0, ih, iq);
    if (kBiasOneBuf && bias_smem && tid == kLoader) issue_bias_one(ih, iq);
    pf.store(sL, sD, 0, pf_tid);
  }
  cp_async_commit();

  float acc_dk[NO][4], acc_dv[NO][4];
  zero_acc(acc_dk);
  zero_acc(acc_dv);
  const int key_wg = j0 + wg * 64;        // first key of this warpgroup
  const int key_w = key_wg + wl * 16;     // first key of this warp
  // Query rows that see some key of this warpgroup: other query blocks are skipped by the warpgroup (exact: its
  // P = dS = 0 there), which then writes zeros to its rows of sdS.
  int qg_lo = 0, qg_hi = 0;
  if (key_wg < sq.len_kv) mk.query_range(key_wg, min(key_wg + 64, sq.len_kv), qg_lo, qg_hi);
  // The warpgroup's 64 rows of K / V (the K-major A operand of S^T / dP^T) start 64 rows into each panel.
  const T* sK_wg = sK + wg * 64 * 64;
  const T* sV_wg = sV + wg * 64 * 64;

  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    const int h = hk * p.group + ih;
    const int i0 = (qb_lo + iq) * BM;
    cp_async_wait<0>();
    if (tma_step(i0)) {
      mbar_wait(&bars[buf], (phase >> buf) & 1u);
      phase ^= 1u << buf;
    }
    fence_proxy_async();
    math_sync();
    // thread 0: this step issues the reduce-adds of the previous one (kDet: that step's turn is held)
    if (pending && tid == 0) issue_dq();
    const bool issued = pending;
    pending = false;
    int ih_next = ih, iq_next = iq;
    Order::next(nq, p.group, ih_next, iq_next);
    const bool prefetch = it + 1 < iters;
    if (prefetch) issue(buf ^ 1, ih_next, iq_next);
    cp_async_commit();
    // kDet, a step that opens a turn: its counter, read early (its latency hides behind S, dP and dV) by the threads
    // that wait for the turn: thread 0 when it adds the tile by TMA, else lane 0 of every warp (each adds its own
    // elements).
    const unsigned* sem = nullptr;
    unsigned seen = 0;
    const bool waits = kDet && Turns::opens(ih) && lane == 0 && (warp == 0 || !tma_dq(i0));
    if constexpr (kDet) {
      if (waits) sem = open_dq_turn<Turns>(blk, p, ih, iq, seen);
    }
    const T* q_cur = sQ + buf * BM * HD;
    const T* do_cur = sdO + buf * BM * HD;
    const float* l_cur = sL + buf * BM;
    const float* d_cur = sD + buf * BM;

    // One step, as five wgmma commit groups so that register work overlaps the tensor cores:
    //   S^T | dP^T  -> P^T = exp2(...) while dP^T runs; dV += P^T dO issued before dS^T is formed
    //   dQ | dK     -> the dQ tile to sdQ (or its atomics) while dK += dS^T Q runs
    const bool active = i0 < qg_hi && i0 + BM > qg_lo;  // warpgroup-uniform
    uint32_t as[BM / 16][4];                            // dS^T as the A operand of dK (k-step = 16 queries)
    const int r0 = wg * 64 + wl * 16 + g;               // this thread's first row of sdS (key)
    if (active) {
      float s[NT][4], dpv[NT][4];  // rows = this warp's 16 keys, cols = BM queries
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        Wgmma<T, BM>::template ss<0, 0>(s, desc_kmajor_sw<BN>(sK_wg, kk), desc_kmajor_sw<BM>(q_cur, kk), kk > 0);
      wgmma_commit();
#pragma unroll
      for (int kk = 0; kk < HD / 16; ++kk)
        Wgmma<T, BM>::template ss<0, 0>(dpv, desc_kmajor_sw<BN>(sV_wg, kk), desc_kmajor_sw<BM>(do_cur, kk), kk > 0);
      wgmma_commit();
      // kDropout, kProducer: this step's keep bits of the thread's rows r0, r0 + 8 (keys), shifted so that bit
      // 8 nt + (e & 1) is element (nt, e)'s query column 8 nt + 2 t + (e & 1); the buffer is then the producer's
      // again (KeepBars). Without the producer (head dim 128): drawn here while S^T / dP^T run, bit 4 nt + e.
      uint64_t keep_lo = 0, keep_hi = 0;
      if constexpr (kProducer) {
        mbar_wait(&keep_bars->full[buf], (it >> 1) & 1);
        keep_lo = sKeep[buf * BN + r0] >> (2 * t);
        keep_hi = sKeep[buf * BN + r0 + 8] >> (2 * t);
        mbar_arrive(&keep_bars->empty[buf]);
      } else if constexpr (kDropout) {
        keep_lo = Dropout(p, n, h).keep_bits<true, NT>(key_w, i0, p.s_kv, lane);
      }
      const auto kept = [&](int nt, int e) -> bool {
        if constexpr (kProducer) return ((e >> 1 ? keep_hi : keep_lo) >> (8 * nt + (e & 1))) & 1u;
        else return (keep_lo >> (4 * nt + e)) & 1u;
      };
      // kBias at head dim 64: the bias^T of the tile, loaded while S^T / dP^T run, from the staged tile (bias_smem)
      // or from global memory. At 128 the registers are spent: make_logits reads the staged tile where it uses it
      // (BiasSmemView; step it's tile is the it-th completion of bias_bar), or loads from global memory.
      constexpr bool kPrefetch = kBias && HD == 64;
      const auto bias_off = [](int r, int c) { return sw_offset<BM>(r, c); };
      BiasPrefetch<T, NT, true> bias;
      BiasSmemView<T, NT, true, decltype(bias_off)> bias_view(bias_off);  // a staged tile
      if constexpr (kPrefetch) {
        if (bias_smem) {
          bias_view.bind(sB + buf * Tr::kBiasTile, key_w - j0, 0, lane);
          bias.load_smem(bias_view);
        } else {
          bias.load(p, n, h, key_w, i0, sq.len_q, sq.len_kv, lane);
        }
      }
      wgmma_wait<1>();  // S^T
      fence_acc(s);
      if constexpr (kBiasOneBuf) {
        if (bias_smem) {
          mbar_wait(bias_bar, static_cast<uint32_t>(it & 1));
          bias_view.bind(sB, key_w - j0, 0, lane);
        }
      }
      const bool need_mask = !mk.tile_all_visible(i0, BM, key_w, 16);
      // P^T = exp2(sc * s - LSE2): interior tiles without a bias keep the raw products (sc = scale log2(e)); a fully
      // visible staged / prefetched bias fragment comes back in natural units (sc = log2(e), make_logits' sc_out).
      const bool fold = !need_mask && !kBias;
      float sc_bias = 1.f;
      if (!fold) {
        if constexpr (kBiasOneBuf)
          make_logits<T, NT, true, kBias>(s, p, mk, need_mask, n, h, key_w, i0, lane, &bias_view, &sc_bias);
        else
          make_logits<T, NT, true, kBias>(s, p, mk, need_mask, n, h, key_w, i0, lane, kPrefetch ? &bias : nullptr,
                                          kBias ? &sc_bias : nullptr);
      }
      const float sc = fold ? p.scale_log2 : sc_bias;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) s[nt][e] = fast_exp2(fmaf(s[nt][e], sc, -l_cur[nt * 8 + 2 * t + (e & 1)]));
      // dV += P^T dO: A = P^T from registers (k-step kc = queries 16 kc .. 16 kc + 15), B = dO read MN-major.
      uint32_t ap[BM / 16][4];
      if constexpr (kDropout) {
        float sd[NT][4];  // P^T * keep / (1 - p)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) sd[nt][e] = kept(nt, e) ? s[nt][e] * p.dropout_rscale : 0.f;
        pack_a_frags<T>(sd, ap);
      } else {
        pack_a_frags<T>(s, ap);
      }
      wgmma_fence();
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc)
        Wgmma<T, HD>::template rs<1>(acc_dv, ap[kc], desc_mnmajor_sw<BM>(do_cur, kc), 1);
      wgmma_commit();
      wgmma_wait<1>();  // dP^T (dV still running)
      fence_acc(dpv);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // dS^T = P^T (dP^T [* keep / (1 - p)] - D)
          const float pr = s[nt][e];
          float dp = dpv[nt][e];
          if constexpr (kDropout) dp = kept(nt, e) ? dp * p.dropout_rscale : 0.f;
          dpv[nt][e] = pr != 0.f ? pr * (dp - d_cur[nt * 8 + 2 * t + (e & 1)]) : 0.f;
        }
      // Stage dS^T (rounded to T, as for the dK product) for dQ += dS K.
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int c = nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sdS + sw_offset<BN>(r0, c)) = ElemTraits<T>::pack(dpv[nt][0], dpv[nt][1]);
        *reinterpret_cast<uint32_t*>(sdS + sw_offset<BN>(r0 + 8, c)) = ElemTraits<T>::pack(dpv[nt][2], dpv[nt][3]);
      }
      pack_a_frags<T>(dpv, as);
      if constexpr (kBias) {  // dS^T to the d_bias workspace (dpv is not read after this)
        if (p.ws_dbias_heads == p.h_q) {
          store_dbias_ws<NT, true>(p, dpv, n, h, key_w, i0, sq.len_q, sq.len_kv, lane);
        } else {
          // Summed over the group's query heads, which are consecutive steps of one query block (query-block-major
          // order, heads ascending: a fixed order), and stored once, at the last head, in the KV head's slot.
          // This warpgroup is active for every head of the block or for none (the mask is the heads' own).
          const bool first = ih == 0, last = ih == p.group - 1;
#pragma unroll
          for (int nt = 0; nt < NT; ++nt)
#pragma unroll
            for (int e = 0; e < 4; ++e) {
              float& a = sDb[(nt * 4 + e) * Tr::kConsumers + tid];
              const float v = first ? dpv[nt][e] : a + dpv[nt][e];
              if (last) dpv[nt][e] = v;
              else a = v;
            }
          if (last) store_dbias_ws<NT, true>(p, dpv, n, hk, key_w, i0, sq.len_q, sq.len_kv, lane);
        }
      }
    } else {  // this warpgroup's keys see no query of the block: its dS^T rows are zero
      if constexpr (kProducer) mbar_arrive(&keep_bars->empty[buf]);  // (every math thread arrives: KeepBars)
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc) as[kc][0] = as[kc][1] = as[kc][2] = as[kc][3] = 0u;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int c = nt * 8 + 2 * t;
        *reinterpret_cast<uint32_t*>(sdS + sw_offset<BN>(r0, c)) = 0u;
        *reinterpret_cast<uint32_t*>(sdS + sw_offset<BN>(r0 + 8, c)) = 0u;
      }
    }
    // This step's sdQ buffer was read by the reduce-adds issued in the previous step (of the step before it), the
    // newest group unless this step issued one.
    if (tid == 0) {
      if (issued)
        bulk_wait_read<1>();
      else
        bulk_wait_read<0>();
    }
    fence_proxy_async();
    math_sync();
    // One bias buffer: every thread has read this step's tile; the next step's loads while dQ and dK run.
    if constexpr (kBiasOneBuf) {
      if (bias_smem && prefetch && tid == kLoader) issue_bias_one(ih_next, iq_next);
    }
    // dQ_i += sum_j dS_ij k_j over the block's 128 keys (SPEC 3; softmax_scale applied in the postprocess).
    // BM 64: warpgroup wg computes columns [wg * HD / 2, (wg + 1) * HD / 2) of the 64 x HD product; BM 128: rows
    // [64 wg, 64 wg + 64) (queries; sdS's column panel wg) x all HD columns.
    {
      constexpr bool kRows = Tr::kDqSplitRows;
      constexpr int HN = kRows ? HD : HD / 2;
      const int n0 = kRows ? 0 : wg * HN, m0 = kRows ? wg * 64 : 0;
      float accq[HN / 8][4];
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BN / 16; ++kk)
        Wgmma<T, HN>::template ss<1, 1>(accq, desc_mnmajor_sw<BN>(sdS + (m0 / 64) * BN * 64, kk),
                                                  desc_mnmajor_sw<BN>(sK + (n0 / 64) * BN * 64 + n0 % 64, kk), kk > 0);
      wgmma_commit();
      // dK += dS^T Q: A = dS^T from registers, B = Q read MN-major (issued unconditionally, with dS^T = 0 when the
      // warpgroup skipped the block: a wgmma under a branch the compiler cannot prove uniform is serialised).
#pragma unroll
      for (int kc = 0; kc < BM / 16; ++kc)
        Wgmma<T, HD>::template rs<1>(acc_dk, as[kc], desc_mnmajor_sw<BM>(q_cur, kc), 1);
      wgmma_commit();
      if constexpr (kDet) {
        // A step that opens a turn closes the previous one: it goes to the next key block. Its atomics preceded this
        // step's first barrier and its reduce-adds (the last of them issued after that barrier) are waited for here,
        // while dQ and dK run: before the barrier that precedes them, this wait and the release's fence (MEMBAR.GPU)
        // stalled warp 0 and with it the block (bench/RESULTS.md, 2026-12-01, H200, 193dd4b). Then this block's
        // turn in the query block's order, before its adds.
        pass_dq_turn<Turns>(blk, p, tc.block, tid, it, ih, iq, waits, sem, seen);
      }
      wgmma_wait<1>();  // dV, dQ (dK still running)
      fence_acc(accq);
      if (tma_dq(i0)) {  // stage the tile for the reduce-adds (columns >= d are clipped by the map)
        unsigned char* sq_buf = reinterpret_cast<unsigned char*>(sdQ + buf * BM * HD);
        const int ra = m0 + wl * 16 + g;
#pragma unroll
        for (int nt = 0; nt < HN / 8; ++nt) {
          const int c = n0 + nt * 8 + 2 * t;
          *reinterpret_cast<float2*>(sq_buf + sw128_f32_offset<BM>(ra, c)) = make_float2(accq[nt][0], accq[nt][1]);
          *reinterpret_cast<float2*>(sq_buf + sw128_f32_offset<BM>(ra + 8, c)) =
              make_float2(accq[nt][2], accq[nt][3]);
        }
        fence_proxy_async();
        pending = true;
        pending_buf = buf;
        pending_h = h;
        pending_row = static_cast<int>(ws_row(p, sq, n, i0));
      } else {
        // Rows ia and ia + 8 of this thread; one base pointer each (immediate offsets per atomic).
        const int ia = i0 + m0 + wl * 16 + g;
        const bool va = ia < sq.len_q, vb = ia + 8 < sq.len_q;
        float* pa = p.ws_dq + (h * p.rows_total_q + ws_row(p, sq, n, ia)) * p.d + n0 + 2 * t;
        float* pb = pa + 8 * p.d;
#pragma unroll
        for (int nt = 0; nt < HN / 8; ++nt) {
          if (n0 + nt * 8 >= p.d) break;
          if (va) atomic_add2(pa + nt * 8, accq[nt][0], accq[nt][1]);
          if (vb) atomic_add2(pb + nt * 8, accq[nt][2], accq[nt][3]);
        }
      }
      wgmma_wait<0>();  // dK: as[] and the Q buffer are free again
      fence_acc(acc_dk);
      fence_acc(acc_dv);
    }
    if (prefetch) pf.store(sL, sD, buf ^ 1, pf_tid);
    ih = ih_next;
    iq = iq_next;
  }
  if (pending) {  // the last step's tile (uniform: a function of its query block)
    math_sync();
    if (tid == 0) issue_dq();
  }
  if (tid == 0) bulk_wait<0>();  // the shared memory stays valid until every reduce-add has completed
  if constexpr (kDet) {
    if (iters > 0) {  // the last turn, after every thread's atomics and the reduce-adds
      math_sync();
      release_last_dq_turn<Turns>(blk, p, tid);
    }
  }
  cp_async_wait<0>();
  wgmma_wait<0>();
  fence_acc(acc_dk);
  fence_acc(acc_dv);
  T* dk = kt.template kv_rows<T>(p.dk, p.dk_st);
  T* dv = kt.template kv_rows<T>(p.dv, p.dv_st);
  const int rows_valid = kt.rows() - (wg * 64 + wl * 16);
  store_fragment<T, NO>(dk + (wg * 64 + wl * 16) * p.dk_st.s, p.dk_st.s, rows_valid, p.d, acc_dk, p.softmax_scale,
                        p.softmax_scale, lane);
  store_fragment<T, NO>(dv + (wg * 64 + wl * 16) * p.dv_st.s, p.dv_st.s, rows_valid, p.d_v, acc_dv, 1.f, 1.f, lane);
#endif
}

}  // namespace sinkattn::cuda::sm90

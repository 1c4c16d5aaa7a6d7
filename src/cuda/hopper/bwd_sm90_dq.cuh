// CUDA backend, Hopper: the fused dq of both dK dV kernels (SPEC.md section 3; bwd_dkdv_sm90.cuh,
// bwd_dkdv_sm90_wide.cuh): dQ_i += sum_j dS_ij k_j, accumulated in fp32 in Params::ws_dq (softmax_scale is applied
// by the dq convert), in any order (deterministic = 0) or, deterministic = 1, in a fixed order of the key blocks
// under per-turn semaphores (dq_order.hpp has the order, why the sums are bitwise reproducible and why the waits
// cannot deadlock).
#pragma once

#include "cuda/dq_order.hpp"
#include "cuda/hopper/bwd_sm90_prologue.cuh"
#include "cuda/common.cuh"
#include "cuda/hopper/handover.hpp"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda::sm90 {

// Semaphores of the deterministic dq (dq_order.hpp), in global memory. load_turn: the counter, with acquire semantics
// (LDG.STRONG + L1 invalidate on sm_90: it does not stall the thread, so it is issued early in the step and its
// value checked later). wait_turn: from the value `seen` of such a load, loads again until the counter reaches
// `turn`; the adds of the earlier turns are then visible to the thread (and, through the caller's __syncwarp, to
// its warp), and a proxy fence orders the TMA reduce-adds the thread issues afterwards after that acquire.
// release_turn: a proxy fence (the block's completed TMA reduce-adds, bulk_wait, before what follows), then adds 1
// with release semantics, after the caller's barrier (every atomic add of the block before it).
__device__ __forceinline__ unsigned load_turn(const unsigned* sem) {
  unsigned v = 0;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];\n" : "=r"(v) : "l"(sem) : "memory");
#endif
  return v;
}
__device__ __forceinline__ void wait_turn(const unsigned* sem, unsigned turn, unsigned seen) {
  while (seen < turn) {
    __nanosleep(32);
    seen = load_turn(sem);
  }
  fence_proxy_async_global();
}
__device__ __forceinline__ void release_turn(unsigned* sem) {
  fence_proxy_async_global();
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("red.release.gpu.global.add.u32 [%0], 1;\n" ::"l"(sem) : "memory");
#endif
}

// ---- The turns of a block (kDet; DqTurns says what a turn is).
// The semaphore of the turn (DqTurns) of step (query head ih of the group, query block qb_lo + iq); nullptr when
// the block is >= n_qb, which only batch tensors that break the max_seqlen_q contract give (unvalidated under graph
// capture; no counter outside the workspace is touched then, and such a call's dq is unspecified anyway).
template <typename Turns, int BM, int BN>
__device__ __forceinline__ unsigned* dq_turn_sem(const DkvBlock<BM, BN>& blk, const Params& p, int ih, int iq) {
  const int n_qb = (p.s_q + BM - 1) / BM, qb = blk.qb_lo + iq;
  return qb < n_qb ? p.ws_dq_sem + dq_sem_index(blk.kt.n, Turns::head(blk.kt.hk, p.group, ih), p.h_q, n_qb, qb)
                   : nullptr;
}
// A thread that will wait for the turn of step (ih, iq): its semaphore, and the counter read early into `seen`
// (its latency hides behind the step's first products); nullptr: no semaphore (dq_turn_sem).
template <typename Turns, int BM, int BN>
__device__ __forceinline__ const unsigned* open_dq_turn(const DkvBlock<BM, BN>& blk, const Params& p, int ih, int iq,
                                                        unsigned& seen) {
  const unsigned* sem = dq_turn_sem<Turns>(blk, p, ih, iq);
  if (sem != nullptr) seen = load_turn(sem);
  return sem;
}
// While step `it` (ih, iq) runs its dQ and dK products: a step that opens a turn closes the previous one (thread
// 0, once its own reduce-adds of it have completed: bulk_wait; every thread's atomics of it preceded this step's
// barriers), then the threads that wait (`waits`, with open_dq_turn's `sem` and `seen`) wait for this block's turn
// (tile `block`, the key block's position in the query block's order) before the step's adds; __syncwarp passes
// the wait on to their warps.
template <typename Turns, int BM, int BN>
__device__ __forceinline__ void pass_dq_turn(const DkvBlock<BM, BN>& blk, const Params& p, int block, int tid, int it,
                                             int ih, int iq, bool waits, const unsigned* sem, unsigned seen) {
  if (tid == 0 && it > 0 && Turns::opens(ih)) {
    int ih_prev = ih, iq_prev = iq;
    Turns::previous(p.group, ih_prev, iq_prev);
    unsigned* prev = dq_turn_sem<Turns>(blk, p, ih_prev, iq_prev);
    bulk_wait<0>();
    if (prev != nullptr) release_turn(prev);
  }
  if (waits && sem != nullptr)
    wait_turn(sem, static_cast<unsigned>(dq_turn<BM, BN>(blk.mk, block, blk.qb_lo + iq)), seen);
  __syncwarp();
}
// After the steps and a barrier that follows every thread's adds (and thread 0's completed reduce-adds): thread 0
// releases the block's last turn.
template <typename Turns, int BM, int BN>
__device__ __forceinline__ void release_last_dq_turn(const DkvBlock<BM, BN>& blk, const Params& p, int tid) {
  int ih_last, iq_last;
  Turns::last(p.group, ih_last, iq_last);
  unsigned* last = dq_turn_sem<Turns>(blk, p, ih_last, iq_last);
  if (tid == 0 && last != nullptr) release_turn(last);
}

// ---- TMA reduce-adds. A full query block's fp32 dQ tile (its BM rows all in the sequence: a box would add to the
// next sequence's rows) is stored to shared memory in the swizzled image of the ws_dq map's 32-column boxes
// (sw128_f32_offset: conflict-free float2 stores) and thread 0 adds it to ws_dq by TMA reduce-adds (the reduce unit
// does the adds) after a barrier that follows every thread's stores; a partial block adds with per-thread atomics.

// Thread 0: the reduce-adds of a staged tile's HD / 32 boxes (box(bx): the image of columns 32 bx .. 32 bx + 31;
// columns >= d are not added), as one bulk group; kStore: the boxes stored instead (a query block's first tile when
// KernelChoice::dq_first_store: the accumulator was not zeroed).
template <int HD, bool kStore = false, typename Box>
__device__ __forceinline__ void dq_reduce_add(const CUtensorMap* map, const Box& box, const int& d, const int& row,
                                              const int& h) {
#pragma unroll
  for (int bx = 0; bx < HD / 32; ++bx)
    if (bx * 32 < d) {
      if constexpr (kStore)
        tma_store_3d(map, box(bx), bx * 32, row, h);
      else
        tma_reduce_add_3d(map, box(bx), bx * 32, row, h);
    }
  bulk_commit();
}

// A warp's dQ fragment (rows ra, ra + 8; columns n0 + 8 nt + 2 t, + 1) into the image of a BM-row tile whose boxes
// follow one another from `tile` (columns >= d are clipped by the map).
template <int BM, int NQ>
__device__ __forceinline__ void dq_stage(unsigned char* tile, const float (&accq)[NQ][4], int ra, int n0, int t) {
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt) {
    const int c = n0 + nt * 8 + 2 * t;
    *reinterpret_cast<float2*>(tile + sw128_f32_offset<BM>(ra, c)) = make_float2(accq[nt][0], accq[nt][1]);
    *reinterpret_cast<float2*>(tile + sw128_f32_offset<BM>(ra + 8, c)) = make_float2(accq[nt][2], accq[nt][3]);
  }
}
// The same into boxes placed by box(bx) (each the image of one map box: sw128_f32_offset of its 32 columns).
template <int BM, int NQ, typename Box>
__device__ __forceinline__ void dq_stage_boxes(const Box& box, const float (&accq)[NQ][4], int ra, int n0, int t) {
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt) {
    const int c = n0 + nt * 8 + 2 * t;
    unsigned char* b = box(c >> 5);
    *reinterpret_cast<float2*>(b + sw128_f32_offset<BM>(ra, c & 31)) = make_float2(accq[nt][0], accq[nt][1]);
    *reinterpret_cast<float2*>(b + sw128_f32_offset<BM>(ra + 8, c & 31)) = make_float2(accq[nt][2], accq[nt][3]);
  }
}

// Thread 0, before the barrier that precedes a step's stores into its buffer: the reduce-adds that read it (those of
// the step before the previous one) have read it; the newest bulk group is the previous step's unless this step
// issued one.
__device__ __forceinline__ void dq_wait_buffer_read(int tid, bool issued) {
  if (tid == 0) {
    if (issued)
      bulk_wait_read<1>();
    else
      bulk_wait_read<0>();
  }
}

// ---- Atomics: the fragment of a partial query block (or of a call without the dq map) added by this thread.
// float2 atomics: rows ia, ia + 8 (those inside the sequence), columns n0 + 8 nt + 2 t, + 1 below d; one base
// pointer per row (immediate offsets per atomic).
template <int NQ>
__device__ __forceinline__ void dq_atomic_add(const Params& p, const SeqInfo& sq, int n, int h, int i0, int r, int n0,
                                              int t, const float (&accq)[NQ][4]) {
  const int ia = i0 + r;
  const bool va = ia < sq.len_q, vb = ia + 8 < sq.len_q;
  float* pa = ws_dq_row(p, sq, n, h, ia) + n0 + 2 * t;
  float* pb = pa + 8 * p.d;
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt) {
    if (n0 + nt * 8 >= p.d) break;
    if (va) atomic_add2(pa + nt * 8, accq[nt][0], accq[nt][1]);
    if (vb) atomic_add2(pb + nt * 8, accq[nt][2], accq[nt][3]);
  }
}
// float4 atomics (half the instructions): lanes t and t ^ 1 (same g) swap halves so that an even t adds columns
// 8 nt + 2 t .. + 3 of row g, an odd t those of row g + 8 (columns 8 nt + 2 (t - 1) .. + 3); row g = i0 + r.
template <int NQ>
__device__ __forceinline__ void dq_atomic_add4(const Params& p, const SeqInfo& sq, int n, int h, int i0, int r, int n0,
                                               int t, const float (&accq)[NQ][4]) {
  const bool odd = (t & 1) != 0;
  const int ia = i0 + r + (odd ? 8 : 0);
  const bool va = ia < sq.len_q;
  float* pa = ws_dq_row(p, sq, n, h, ia) + n0 + 2 * (t & 2);
#pragma unroll
  for (int nt = 0; nt < NQ; ++nt) {
    if (n0 + nt * 8 >= p.d) break;
    const float x0 = __shfl_xor_sync(0xffffffffu, odd ? accq[nt][0] : accq[nt][2], 1);
    const float x1 = __shfl_xor_sync(0xffffffffu, odd ? accq[nt][1] : accq[nt][3], 1);
    const float4 v =
        odd ? make_float4(x0, x1, accq[nt][2], accq[nt][3]) : make_float4(accq[nt][0], accq[nt][1], x0, x1);
    if (va) atomicAdd(reinterpret_cast<float4*>(pa + nt * 8), v);
  }
}

// A step's dq tile staged in shared memory whose reduce-adds are still to be issued (after the next barrier): its
// buffer, query head and first ws_dq row.
struct DqStaged {
  bool pending = false;
  int buf = 0, h = 0, row = 0;
};

// ---- After the steps: the last step's staged tile (pending: uniform, a function of its query block) is added after
// a barrier (sync) that follows every thread's stores of it (issue: dq_reduce_add of it); thread 0 waits until every
// reduce-add has completed (the shared memory stays valid until then); kDet: thread 0 releases the block's last turn
// after a barrier that follows every thread's atomics and the completed reduce-adds.
template <bool kDet, typename Turns, int BM, int BN, typename Sync, typename Issue>
__device__ __forceinline__ void dq_finish(const DkvBlock<BM, BN>& blk, const Params& p, int tid, int iters,
                                          bool pending, const Sync& sync, const Issue& issue) {
  if (pending) {
    sync();
    if (tid == 0) issue();
  }
  if (tid == 0) bulk_wait<0>();
  if constexpr (kDet) {
    if (iters > 0) {
      sync();
      release_last_dq_turn<Turns>(blk, p, tid);
    }
  }
}

// ---- The dq writer (DkvSm90Traits::kDqWriter): one warp of the producer warpgroup adds every step's staged dQ
// tile to ws_dq, so that no math warp issues a bulk operation or waits for a turn. It walks the steps in the math
// warps' order (Order) and, per step it: waits on dq_full (every math thread arrives once its part of the tile is in
// sdQ, after a proxy fence) and, kDet, for the step's turn (lane 0), in that order with two buffers (head dim 128:
// the turn first measured 3% slower there, bench/log/2026-12-07-one-barrier-step.md), the turn first with one (so
// that the one buffer is held only while it is read); adds the tile: a full query block (tma_dq) by thread lane 0's
// TMA reduce-adds, waiting until they have read the buffer, else by the warp's float4 atomics of the rows inside
// the sequence read back from the swizzled image; every lane arrives on dq_empty once its reads of the tile are
// done (the math warps' staging of step it + kBufs waits for it: a ring of kBufs buffers, handover.hpp); kDet: once
// the adds have completed, lane 0 releases the turn. kDet, turn 0 (the query block's first key block): the tile is
// stored instead of added (TMA stores, float4 stores), so the preprocess does not zero those rows
// (KernelChoice::dq_first_store, bwd_small.cu: dq_row_stored): every later turn adds to them after this one's
// release. The tile layout is dq_stage's (sw128_f32_offset<BM>: the boxes of the ws_dq map one after another).
// It runs on the 24 registers a thread the producer warpgroup keeps (setmaxnreg). Its turns are per step (the writer
// is for the variants without a bias: dq_turn_per_step).
template <typename Order, typename Turns, bool kDet, int BM, int BN, int HD, int kBufs, typename TmaDq>
__device__ __forceinline__ void dq_writer(const DkvBlock<BM, BN>& blk, const Params& p, const CUtensorMap* map,
                                          const TmaDq& tma_dq, const float* sdQ, uint64_t* dq_full,
                                          uint64_t* dq_empty, int block, int lane) {
  const KeyTile<BN>& kt = blk.kt;
  const SeqInfo& sq = kt.sq;
  const int iters = blk.nq * p.group;
  pdl_wait();  // ws_dq is zeroed by the preprocess (kDet: the rows no turn 0 stores)
  int ih, iq;
  Order::first(blk.nq, p.group, ih, iq);
  for (int it = 0; it < iters; ++it) {
    const int h = kt.hk * p.group + ih, i0 = (blk.qb_lo + iq) * BM;
    const int slot = ring_slot<kBufs>(it);
    const float* tile = sdQ + slot * BM * HD;
    // Two buffers: the tile first, then the turn (the math stages the next step's into the other buffer meanwhile).
    if constexpr (kBufs == 2) mbar_wait(&dq_full[slot], ring_parity_of<kBufs>(it));
    unsigned* sem = nullptr;
    bool first = false;  // kDet: the query block's first turn, which stores its tile (KernelChoice::dq_first_store)
    if constexpr (kDet) {
      const int turn = dq_turn<BM, BN>(blk.mk, block, blk.qb_lo + iq);
      first = turn == 0;
      if (lane == 0) {
        sem = dq_turn_sem<Turns>(blk, p, ih, iq);
        if (sem != nullptr) wait_turn(sem, static_cast<unsigned>(turn), load_turn(sem));
      }
      __syncwarp();
    }
    if constexpr (kBufs == 1) mbar_wait(&dq_full[slot], ring_parity_of<kBufs>(it));
    if (tma_dq(i0)) {
      if (lane == 0) {
        const auto box = [&](int bx) { return tile + bx * BM * 32; };
        const int row = static_cast<int>(ws_row(p, sq, kt.n, i0));
        if (first)
          dq_reduce_add<HD, true>(map, box, p.d, row, h);
        else
          dq_reduce_add<HD>(map, box, p.d, row, h);
        bulk_wait_read<0>();
      }
    } else {
      const int rows = min(BM, sq.len_q - i0);
      const unsigned char* img = reinterpret_cast<const unsigned char*>(tile);
      for (int e = lane; e < BM * HD / 4; e += 32) {
        const int r = e / (HD / 4), c = (e % (HD / 4)) * 4;
        if (r >= rows || c >= p.d) continue;
        const float4 v = *reinterpret_cast<const float4*>(img + sw128_f32_offset<BM>(r, c));
        float4* dst = reinterpret_cast<float4*>(ws_dq_row(p, sq, kt.n, h, i0 + r) + c);
        if (first)
          *dst = v;
        else
          atomicAdd(dst, v);
      }
    }
    __syncwarp();
    mbar_arrive(&dq_empty[slot]);  // every lane, after its own reads of the tile (32 arrivals a phase)
    if constexpr (kDet) {
      if (lane == 0) {
        bulk_wait<0>();
        if (sem != nullptr) release_turn(sem);
      }
    }
    Order::next(blk.nq, p.group, ih, iq);
  }
  if (lane == 0) bulk_wait<0>();
}

}  // namespace sinkattn::cuda::sm90

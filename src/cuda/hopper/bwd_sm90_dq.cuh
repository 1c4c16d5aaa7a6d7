// CUDA backend, Hopper: the fused dq of both dK dV kernels (SPEC.md section 3; bwd_dkdv_sm90.cuh,
// bwd_dkdv_sm90_wide.cuh): dQ_i += sum_j dS_ij k_j, accumulated in fp32 in Params::ws_dq (softmax_scale is applied
// by the dq convert), in any order (deterministic = 0) or, deterministic = 1, in a fixed order of the key blocks
// under per-turn semaphores (dq_order.hpp has the order, why the sums are bitwise reproducible and why the waits
// cannot deadlock).
#pragma once

#include "cuda/dq_order.hpp"
#include "cuda/hopper/bwd_sm90_prologue.cuh"
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

}  // namespace sinkattn::cuda::sm90

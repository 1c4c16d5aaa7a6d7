// CUDA backend: the fixed order in which the Hopper dK dV kernels add dq in the deterministic backward
// (deterministic = 1; their kDet variants, whose turns are hopper/bwd_sm90_dq.cuh's), and the block order it depends
// on. Host + device code (SINKATTN_HD) so that tests/test_mask_order.cpp checks the order, and that it cannot
// deadlock, on the CPU.
//
// The kernel runs one block per (key block kb, KV head hk, sequence n). dq_i = sum_j dS_ij k_j is accumulated in fp32
// in the workspace (Params::ws_dq) by every key block that some row of i's query block sees. Deterministic mode:
//   * Order. Each turn has a semaphore (a counter in the workspace, zeroed before the launch). A turn is one step,
//     (query head h, query block qb), or (DqTurns, dq_turn_per_step) one query block for all the heads of the KV
//     group. The key blocks that see qb are kb_lo(qb) .. kb_hi(qb) - 1 (common/mask.hpp: key_blocks_of_query_block,
//     the same relation the kernel walks from the key side), and block kb adds its part of the turn's tiles as turn
//     kb - kb_lo(qb): it waits until the counter equals its turn, adds (a full query block's BM x HD tile by TMA
//     reduce-adds, a partial one's by fp32 vector reductions of its own elements: no other block writes them
//     meanwhile), and once all its adds are complete the counter is incremented with release semantics. So every
//     element of ws_dq receives the same sequence of fp32 additions, in the same order, on every run: the sum is
//     bitwise reproducible (each contribution is itself a fixed sequence of wgmma products of the same inputs).
//     The variants with a dq writer (tiles::dkdv_sm90_dq_writer) store turn 0's tile instead of adding it, so that
//     the preprocess need not zero those rows first (KernelChoice::dq_first_store): the same sums, one pass fewer
//     over the accumulator.
//   * No deadlock. A block takes a ticket (an atomic counter in the workspace) when it starts and works on the tile
//     of that ticket (scheduler.hpp, tile_of_linear: the launch order, key blocks ascending). Every block it waits
//     for has a smaller kb of the same (n, hk), hence a smaller ticket, hence is running or done: it took its
//     ticket while resident. A block never waits while holding an unreleased turn (it releases the turn it holds
//     before it waits for the next), so by induction on the ticket every block finishes, whatever the number of
//     blocks resident at once. (Hardware launch order is not relied on.)
//   * Speed. Steps run query-block-major and descending (the heads of the group for the last query block first),
//     so every block of a (n, hk) starts on the same steps and trails its predecessor in the order by one turn:
//     the release of a turn (in the step after its last one, once thread 0's reduce-adds of it have completed:
//     they are issued after that step's first barrier) and the wait for a turn are both issued while the step's dQ
//     and dK products run, never before the barrier that precedes them (where they stalled the block).
//     Turns of one query block for the group's `group` steps make block kb trail its predecessor by `group` steps: at
//     GPT-OSS full (group 8, 128-row steps, 32 key blocks a head) the k-th of the blocks of a head that run at once
//     idles about 8 k steps, and the deterministic backward ran at 0.65x of the default one on an H100 (0.76x on the
//     H200); one turn per step: 0.83x (bench/log/2026-12-05-deterministic-per-step-turns.md, H100 and H200, 748eeac).
//     With a bias one turn per query block stays (dq_turn_per_step): there every thread also stores dS to the d_bias
//     workspace, the release's fence (MEMBAR.GPU) waits for thread 0's stores of the step, and per-step turns
//     measured 9% slower (GPT-OSS full + bias on an H100, 0.90x -> 0.84x). Per-step turns had measured slower at
//     GPT-OSS too before the release stopped waiting for the next step's loads
//     (bench/log/2026-12-01-deterministic-hopper.md, H200, 193dd4b, and
//     bench/log/2026-12-03-deterministic-release.md, H200, dfffab6). Nor one turn per two query blocks at group 1
//     (the runtime unit arithmetic cost registers and speed at every group;
//     bench/log/2026-12-01-deterministic-hopper.md, H200, 193dd4b).
#pragma once

#include <cstdint>

#include "common/hd.hpp"
#include "common/mask.hpp"
#include "cuda/scheduler.hpp"

namespace sinkattn::cuda {

// Steps of a dK dV block over (query head ih of the group, query block qb_lo + iq), iq < nq:
//   kDet = false: head-major, query blocks ascending;
//   kDet = true:  query-block-major, query blocks descending, the heads of the group ascending within one.
template <bool kDet>
struct StepOrder {
  SINKATTN_HD static void first(int nq, int group, int& ih, int& iq) {
    (void)group;
    ih = 0;
    iq = kDet ? nq - 1 : 0;
  }
  SINKATTN_HD static void next(int nq, int group, int& ih, int& iq) {
    if (kDet) {
      if (++ih == group) ih = 0, --iq;
    } else {
      if (++iq == nq) iq = 0, ++ih;
    }
  }
};

// The unit of a turn (StepOrder<true>'s steps): per step (kPerStep: the query head's semaphore) or per query block
// (held over the group's steps of it: the KV head's semaphore). The dK dV kernel's variants take one turn per step
// except with a bias (why: the header above); the kernel and the dispatch's report read this one rule.
constexpr bool dq_turn_per_step(bool bias) { return !bias; }
template <bool kPerStep>
struct DqTurns {
  // Step (ih, iq) opens a turn: it releases the turn opened before it and waits for its own before its adds.
  SINKATTN_HD static bool opens(int ih) { return kPerStep || ih == 0; }
  // The head index of the turn's semaphore (dq_sem_index): the query head, or the KV head hk.
  SINKATTN_HD static int head(int hk, int group, int ih) { return kPerStep ? hk * group + ih : hk; }
  // A step of the turn opened before the one that step (ih, iq) opens (the step before it).
  SINKATTN_HD static void previous(int group, int& ih, int& iq) {
    if (kPerStep && ih > 0) {
      --ih;
    } else {
      ih = group - 1;
      ++iq;
    }
  }
  // A step of the turn of the block's last step (released after the loop).
  SINKATTN_HD static void last(int group, int& ih, int& iq) {
    ih = group - 1;
    iq = 0;
  }
};

// Semaphores of the deterministic dq: one counter per (sequence n, head slot, query block qb) after the ticket
// counter (index 0); n_qb = query blocks per sequence (ceil(s_q / BM), s_q the extent or max_seqlen_q). A turn's
// head slot is DqTurns::head: a query head (< h_q), or a KV head (< h_kv <= h_q), so h_q slots serve both units.
SINKATTN_HD int64_t dq_sem_count(int64_t b, int64_t h_q, int64_t n_qb) { return 1 + b * h_q * n_qb; }
SINKATTN_HD int64_t dq_sem_index(int n, int head, int h_q, int n_qb, int qb) {
  return 1 + (static_cast<int64_t>(n) * h_q + head) * n_qb + qb;
}

// Turn of key block kb in the order of query block qb (rows [qb * BM, min(qb * BM + BM, len_q)) ): its position
// among the key blocks that see qb, which start at kb_lo(qb).
template <int BM, int BN, typename I>
SINKATTN_HD I dq_turn(const BandMask<I>& mk, I kb, I qb) {
  I kb_lo, kb_hi;
  const I i0 = qb * BM;
  key_blocks_of_query_block<BN>(mk, i0, hd_min(i0 + BM, mk.len_q), kb_lo, kb_hi);
  return kb - kb_lo;
}

// KernelChoice::dq_first_store: the query block of rows [i0, i1) (clipped to len_q) has a turn 0, whose key block
// stores its dq tile (every row of the block) before any other adds: some row of it sees a key, hence some key block
// sees the block (key_blocks_of_query_block: the same relation from the key side). Its rows need no zeroing pass.
template <typename I>
SINKATTN_HD bool dq_block_stored(const BandMask<I>& mk, I i0, I i1) {
  I k_lo, k_hi;
  mk.key_range(i0, i1, k_lo, k_hi);
  return k_hi > k_lo;
}

}  // namespace sinkattn::cuda

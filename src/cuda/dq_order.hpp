// CUDA backend: the fixed order in which the Hopper dK dV kernel adds dq in the deterministic backward
// (deterministic = 1; hopper/bwd_dkdv_sm90.cuh with kDet), and the block order it depends on. Host + device code
// (SINKATTN_HD) so that tests/test_mask_order.cpp checks the order, and that it cannot deadlock, on the CPU.
//
// The kernel runs one block per (key block kb, KV head hk, sequence n). dq_i = sum_j dS_ij k_j is accumulated in fp32
// in the workspace (Params::ws_dq) by every key block that some row of i's query block sees. Deterministic mode:
//   * Order. Each (n, hk, query block qb) has a semaphore (a counter in the workspace, zeroed before the launch).
//     The key blocks that see qb are kb_lo(qb) .. kb_hi(qb) - 1 (common/mask.hpp: key_blocks_of_query_block, the
//     same relation the kernel walks from the key side), and block kb adds its part of qb, for every query head of
//     the group, as turn kb - kb_lo(qb): it waits until the counter equals its turn, adds (a full query block's
//     64 x HD tiles by TMA reduce-adds, a partial one's by fp32 vector reductions of its own elements: no other block
//     writes them meanwhile), and once all its adds are complete the counter is incremented with release semantics. So every element of ws_dq receives the same sequence of fp32 additions, in the same
//     order, on every run: the sum is bitwise reproducible (each contribution is itself a fixed sequence of wgmma
//     products of the same inputs).
//   * No deadlock. A block takes a ticket (an atomic counter in the workspace) when it starts and works on the tile
//     of that ticket (scheduler.hpp, tile_of_linear: the launch order, key blocks ascending). Every block it waits
//     for has a smaller kb of the same (n, hk), hence a smaller ticket, hence is running or done: it took its
//     ticket while resident. A block never waits while holding an unreleased turn (it releases the previous query
//     block's turn before it waits for the next), so by induction on the ticket every block finishes, whatever the
//     number of blocks resident at once. (Hardware launch order is not relied on.)
//   * Speed. Steps run query-block-major and descending (the heads of the group for the last query block first),
//     so a block starts where its predecessors in every order also start and stays behind them; the release of a
//     query block's turn (one step after its last adds: thread 0 waits for its reduce-adds to complete, then
//     fences) and the wait for the next turn are both issued while the step's dQ and dK products run, never before
//     the barrier that precedes them (where they stalled the block). One turn per query block, not per (query
//     head, query block): per-step turns couple a block to its predecessor step by step, measured 11% slower on
//     the GPT-OSS layers; nor per two query blocks at group 1 (the runtime unit arithmetic cost registers and speed
//     at every group; bench/RESULTS.md, 2026-12-01 third session).
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
  // The step opens a query block (deterministic mode: the step that waits for the block's turn).
  SINKATTN_HD static bool opens_query_block(int ih) { return ih == 0; }
  // kDet: the query block (iq) of the steps before a step that opens query block iq (the one whose turn that step
  // releases), and the query block of the last step.
  SINKATTN_HD static int previous_query_block(int iq) { return kDet ? iq + 1 : iq - 1; }
  SINKATTN_HD static int last_query_block(int nq) { return kDet ? 0 : nq - 1; }
};

// Semaphores of the deterministic dq: one counter per (sequence n, KV head hk, query block qb) after the ticket
// counter (index 0). n_qb = query blocks per sequence (ceil(s_q / BM), s_q the extent or max_seqlen_q).
SINKATTN_HD int64_t dq_sem_count(int64_t b, int64_t h_kv, int64_t n_qb) { return 1 + b * h_kv * n_qb; }
SINKATTN_HD int64_t dq_sem_index(int n, int hk, int h_kv, int n_qb, int qb) {
  return 1 + (static_cast<int64_t>(n) * h_kv + hk) * n_qb + qb;
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

}  // namespace sinkattn::cuda

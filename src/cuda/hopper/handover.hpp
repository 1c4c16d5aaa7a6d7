// CUDA backend, Hopper: the handovers between the dK dV kernel's math warpgroups and its producer warpgroup
// (DkvSm90Traits::kDqWriter; bwd_dkdv_sm90.cuh, bwd_sm90_dq.cuh), as host + device code so that
// tests/test_mask_order.cpp can run the protocol on the CPU. Each handover is a pair of two-buffer rings of
// mbarriers: step it uses buffer it & 1, and the k-th phase completion of a buffer's barrier is step 2 k + (it & 1)'s,
// so a wait for step it's completion waits for parity ring_parity(it) (mbarrier.try_wait.parity: the phase with
// that parity has completed). The parity names a completion unambiguously only while the barrier is at most one
// completion past it: every wait below is for a step the waiting side's own progress keeps within one step of it.
//   Q / dO (q_empty, bars[b]): for every step the loader waits until the math threads have arrived on q_empty for
//     step it - 2 (they arrive at the end of every step, once its dK product is complete), then issues the step's
//     TMA loads on bars[b], or, for a step the math threads load by cp.async, arrives on bars[b]; the math waits on
//     bars[b] at every step. Were the cp.async steps left out of the loader's waits and the math's, the math could
//     run two phases of q_empty ahead of the loader over consecutive cp.async steps (a deterministic backward's last
//     query block: the group's heads in a row) and the parity would alias: DkvHandover in test_mask_order.cpp;
//   the dq tile (dq_full, dq_empty): the math threads stage step it's tile once the writer has arrived on dq_empty
//     for step it - 2, then arrive on dq_full; the writer waits on dq_full for step it, adds the tile and arrives on
//     dq_empty once the tile has been read.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn::cuda::sm90 {

SINKATTN_HD constexpr uint32_t ring_parity(int it) { return static_cast<uint32_t>(it >> 1) & 1u; }

}  // namespace sinkattn::cuda::sm90

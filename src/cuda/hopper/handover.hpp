// CUDA backend, Hopper: the handovers between the dK dV kernel's math warpgroups and its producer warpgroup
// (DkvSm90Traits::kDqWriter; bwd_dkdv_sm90.cuh, bwd_sm90_dq.cuh), as host + device code so that
// tests/test_mask_order.cpp can run the protocol on the CPU. Q / dO is a two-buffer ring of mbarriers: step it uses
// buffer it & 1, and the k-th phase completion of a buffer's barrier is step 2 k + (it & 1)'s, so a wait for step
// it's completion waits for parity ring_parity(it) (mbarrier.try_wait.parity: the phase with that parity has
// completed); the dq tile is a ring of one buffer (the k-th completion step k's: ring1_parity) or two (ring_slot,
// ring_parity_of say which). The parity names a completion unambiguously only while the barrier is at most one
// completion past it: every wait below is for a step the waiting side's own progress keeps within one step of it.
//   Q / dO and the rows' LSE2 / D (q_empty, bars[b]): for every step the loader waits until the math threads have
//     arrived on q_empty for step it - 2 (they arrive at the end of every step, once its dK product is complete),
//     then loads the step into buffer b (TMA; a partial query block by its own cp.async, or, at two barriers a step,
//     by the math threads' a step ahead, the loader then only arriving) and arrives on bars[b]; the math waits on
//     bars[b] at every step. Were the math's cp.async steps left out of the loader's waits and the math's, the math
//     could run two phases of q_empty ahead of the loader over consecutive such steps;
//   the dq tile (dq_full, dq_empty; one buffer at one barrier a step, else two): the math threads stage step it's
//     tile once the writer has arrived on dq_empty for the step that last used the buffer, then arrive on dq_full;
//     the writer waits on dq_full for step it, adds the tile and arrives on dq_empty once the tile has been read.
#pragma once

#include <cstdint>

#include "common/hd.hpp"

namespace sinkattn::cuda::sm90 {

SINKATTN_HD constexpr uint32_t ring_parity(int it) { return static_cast<uint32_t>(it >> 1) & 1u; }
// A one-buffer ring: step it's is the barrier's it-th completion.
SINKATTN_HD constexpr uint32_t ring1_parity(int it) { return static_cast<uint32_t>(it) & 1u; }
// A ring of kBufs (1 or 2) buffers: step it's buffer and the parity of its completion.
template <int kBufs>
SINKATTN_HD constexpr int ring_slot(int it) {
  static_assert(kBufs == 1 || kBufs == 2, "one or two buffers");
  return kBufs == 2 ? (it & 1) : 0;
}
template <int kBufs>
SINKATTN_HD constexpr uint32_t ring_parity_of(int it) {
  return kBufs == 2 ? ring_parity(it) : ring1_parity(it);
}

}  // namespace sinkattn::cuda::sm90

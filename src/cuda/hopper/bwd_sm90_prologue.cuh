// CUDA backend, Hopper: the prologue of both dK dV kernels (SPEC.md section 3; bwd_dkdv_sm90.cuh for head-dim tiles
// 64 / 128, bwd_dkdv_sm90_wide.cuh for 256): the tensor maps their launchers build (Sm90Tma), the block's tile
// (dkdv_tile) and what the block works on (DkvBlock).
#pragma once

#include <cuda.h>

#include "cuda/hopper/sm90_common.cuh"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"
#include "cuda/prologue.cuh"
#include "cuda/scheduler.cuh"

namespace sinkattn::cuda::sm90 {

// Tensor maps of q and d_out for the kernels' TMA loads (built by the launcher, launch.cuh: dkdv_tma_maps): 4-d
// (d, rows, h_q, b) of 16-bit elements, box 64 columns x BM rows x 1 x 1, 128-byte swizzle; dense: rows = s_q,
// b = p.b; varlen: rows = total rows, b = 1. ok = 0: none (the kernel then loads every block through cp.async).
// dq: the fp32 accumulator p.ws_dq as a 3-d map (d, rows_total_q, h_q), box 32 x BM x 1, 128-byte swizzle, for the
// TMA reduce-adds of the fused dq (both modes); dq_ok = 0: none (per-thread atomics instead).
// bias: kBias (KernelChoice::dkdv_bias_tma), the bias as a 4-d map (s_kv, s_q, bias heads, bias batches), box 64 keys
// x 64 queries: at head dim 64 each step's bias tile is staged with its Q / dO on the same mbarrier (two buffers);
// at 128 into one buffer, a step ahead, on its own mbarrier (bias_bar); bias_ok = 0: none (bias^T loaded by each
// thread from global memory).
struct Sm90Tma {
  CUtensorMap q, d_out, dq, bias;
  int ok, dq_ok, bias_ok;
};

// dkdv_tile: the block's tile, under kDet the tile of a ticket taken in launch order (every block it will wait for
// then holds a smaller one: dq_order.hpp; `ticket` is a shared word), else longest first. DkvBlock: its key tile,
// the mask of its sequence and the query blocks qb_lo .. qb_lo + nq - 1 of BM rows that see its keys (a block past
// its sequence's keys has none; the kernels then wait in pdl_wait and return, so that the dq convert's wait for the
// grid implies the preprocess's completion). The deterministic dq's turns of a block: bwd_sm90_dq.cuh.
template <bool kDet>
__device__ __forceinline__ TileCoord dkdv_tile(const Params& p, unsigned* ticket, int tid) {
  if constexpr (kDet) {
    if (tid == 0) *ticket = atomicAdd(p.ws_dq_sem, 1u);
    __syncthreads();
    return tile_of_linear(*ticket, tile_pairs(gridDim.y, gridDim.z), gridDim.x, gridDim.y, false);
  } else {
    (void)p;
    (void)ticket;
    (void)tid;
    return scheduled_tile(false);
  }
}
template <int BM, int BN>
struct DkvBlock {
  KeyTile<BN> kt;
  Mask mk;
  int qb_lo = 0, nq = 0;
  __device__ __forceinline__ DkvBlock(const Params& p, const TileCoord& tc) : kt(p, tc), mk(p, kt.sq) {
    kt.template query_blocks<BM>(mk, qb_lo, nq);
  }
};


// K and V of the block's key tile (rows past the sequence's keys and columns past d / d_v zero-filled) into the
// swizzled row panels by cp.async, NTHREADS threads (the caller commits and waits for the group).
template <int HD, int NTHREADS, typename T, int BN>
__device__ __forceinline__ void load_kv_sw(T* sK, T* sV, const KeyTile<BN>& kt, const Params& p, int tid) {
  const T* kg = kt.template kv_rows<const T>(p.k, p.k_st);
  const T* vg = kt.template kv_rows<const T>(p.v, p.v_st);
  load_tile_sw<BN, HD, NTHREADS>(sK, kg, p.k_st.s, kt.sq.len_kv - kt.j0, p.d, tid);
  load_tile_sw<BN, HD, NTHREADS>(sV, vg, p.v_st.s, kt.sq.len_kv - kt.j0, p.d_v, tid);
}

}  // namespace sinkattn::cuda::sm90

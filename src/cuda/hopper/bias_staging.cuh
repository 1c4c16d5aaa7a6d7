// CUDA backend, Hopper: the bias tiles of the kBias variants (SPEC.md section 2: S + bias before the softmax) staged
// in shared memory by TMA, and the thread's reads of them (scores.cuh: BiasPrefetch reads a fragment's words into
// registers, BiasSmemView where make_logits uses them; both four words per ldmatrix). The launchers build the bias
// map (launch.cuh, make_bias_map: a 16-bit bias of unit key stride) where KernelChoice::dkdv_bias_tma /
// fwd_bias_tma allow; without it each thread loads its fragment from global memory (BiasPrefetch::load, or
// make_logits itself).
//   dK dV kernel (bwd_dkdv_sm90.cuh), tile BM queries x BN keys read transposed (rows = keys): at head dim 64 two
//     buffers, each step's tile loaded with its Q / dO on the same mbarrier and read into registers while S^T / dP^T
//     run; at 128 one buffer loaded a step ahead on its own mbarrier and read where make_logits uses it.
//   Warp-specialised forward (fwd_sm90_ws.cuh): the producer loads each key block's tile with its K into a ring
//     stage of its own (b_full / b_empty); the 2 consumers read it into registers after S is issued.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/hopper/sm90_common.cuh"
#include "cuda/params.cuh"
#include "cuda/scores.cuh"

namespace sinkattn::cuda::sm90 {

// Element offset of (r, c) in a staged tile of ROWS rows (the swizzled row panels: the bias's own layout, rows =
// queries), as BiasSmemView takes it.
template <int ROWS>
struct SwOffset {
  __device__ __forceinline__ int operator()(int r, int c) const { return sw_offset<ROWS>(r, c); }
};

// ---- The dK dV kernel.

// The bias tile of query head h, queries i0 .. i0 + BM - 1, keys j0 .. j0 + BN - 1 (zeros outside the tensor) into
// buffer buf of sB ([bufs][BM * BN]) as BN / 64 boxes of 64 keys x BM queries, completing on bar (one thread; the
// caller arms bar).
template <int BM, int BN, typename T>
__device__ __forceinline__ void load_bias_tile(T* const& sB, int buf, const CUtensorMap& map, const Params& p,
                                               const int& n, int h, int i0, const int& j0, uint64_t* bar) {
#pragma unroll
  for (int c = 0; c < BN / 64; ++c)
    tma_load_4d(sB + buf * BM * BN + c * BM * 64, &map, j0 + c * 64, i0, p.bias_shape_h == 1 ? 0 : h,
                p.bias_shape_b == 1 ? 0 : n, bar);
}

// A math thread's bias^T of one step (rows = the warp's keys key_w + g, + 8; columns = the step's queries), for
// make_logits: with two buffers (kBufs 2, head dim 64) read into registers (bias) while S^T / dP^T run, from the
// staged tile (staged) or from global memory; with one (kBufs 1, head dim 128: the registers are spent) viewed in the
// staged tile (view) once its mbarrier has completed (step it's tile is the it-th completion of bar), else loaded by
// make_logits; kBufs 0: no bias. sB: the staged tiles ([kBufs][BM * BN]), j0: the block's first key.
template <int BM, int BN, int kBufs, typename T, typename Pre, typename View>
__device__ __forceinline__ void prefetch_bias_t(Pre& bias, View& view, bool staged, const T* sB, int buf,
                                                const Params& p, int n, int h, int key_w, int j0, int i0, int len_q,
                                                int len_kv, int lane) {
  if constexpr (kBufs == 2) {
    if (staged) {
      view.bind(sB + buf * BM * BN, key_w - j0, 0, lane);
      bias.load_smem(view);
    } else {
      bias.load(p, n, h, key_w, i0, len_q, len_kv, lane);
    }
  }
}
template <int kBufs, typename T, typename View>
__device__ __forceinline__ void bind_bias_t(View& view, bool staged, const T* sB, uint64_t* bar, int it, int key_w,
                                            int j0, int lane) {
  if constexpr (kBufs == 1) {
    if (staged) {
      mbar_wait(bar, static_cast<uint32_t>(it & 1));
      view.bind(sB, key_w - j0, 0, lane);
    }
  }
}
// What make_logits reads the step's bias from (nullptr: no bias, or loaded by make_logits).
template <int kBufs, typename Pre, typename View>
__device__ __forceinline__ const auto* bias_t_source(const Pre& bias, const View& view) {
  if constexpr (kBufs == 1)
    return &view;
  else if constexpr (kBufs == 2)
    return &bias;
  else
    return static_cast<const Pre*>(nullptr);
}

// ---- The warp-specialised forward.

// The producer: the bias tile of query head h, queries m0 .. m0 + BM - 1, keys j0 .. j0 + BN - 1 (zeros outside the
// tensor) into a ring stage dst, armed and completing on full (one thread).
template <int BM, int BN, typename T>
__device__ __forceinline__ void load_bias_tile_fwd(T* dst, const CUtensorMap& map, const Params& p, int n, int h,
                                                   int m0, int j0, uint64_t* full) {
  tma_load_tile_sw<BM, BN>(dst, &map, m0, p.bias_shape_h == 1 ? 0 : h, p.bias_shape_b == 1 ? 0 : n, full, j0);
}
// A consumer: waits for the staged tile of the key block at ring position bi (stage bi % S, its (bi / S)-th use) and
// views it (rows r0 .., the warp's queries) for make_logits / BiasPrefetch::load_smem.
template <typename Tr, typename T, typename View>
__device__ __forceinline__ void stage_bias_fwd(View& view, T* sB, uint64_t* b_full, int bi, int r0, int lane) {
  constexpr int S = Tr::kStages;
  mbar_wait(&b_full[bi % S], static_cast<uint32_t>((bi / S) & 1));
  view.bind(sB + (bi % S) * Tr::kBiasTile, r0, 0, lane);
}

}  // namespace sinkattn::cuda::sm90

// CUDA backend: the tile shapes of every kernel, as plain constexpr functions of the head-dim tile, so that the
// kernels' traits (params.cuh, hopper/*.cuh) and the dispatch unit (dispatch.cpp, host-only C++) read one definition.
// Rows x keys (forward, dq) or keys x rows (dK dV) per block.
#pragma once

#include <cstdint>

namespace sinkattn::cuda::tiles {

// Head-dim tiles compiled: a call with head dims (d, d_v) runs on the smallest tile >= max(d, d_v) (0: none).
constexpr int kHeadDimTiles[] = {32, 64, 96, 128, 192, 256};
constexpr int head_dim_tile(int64_t d, int64_t d_v) {
  const int64_t m = d > d_v ? d : d_v;
  for (int t : kHeadDimTiles)
    if (m <= t) return t;
  return 0;
}

// sm_80 forward (fwd_kernel.cuh): 4 warps x kMT m-tiles of 16 rows; keys per step.
constexpr int fwd_m_tiles(int hd) { return hd <= 128 ? 2 : 1; }
constexpr int fwd_block_m(int hd) { return 16 * fwd_m_tiles(hd) * 4; }
constexpr int fwd_block_n(int hd) { return hd <= 64 ? 64 : 32; }
// The lean (no bias / dropout) variant at head dim 128 takes 64 keys per step (measured faster despite a few spilled
// registers: bench/log/2026-11-29-sm80-kernels.md, MHA); every other variant keeps fwd_block_n.
constexpr int fwd_block_n_lean(int hd) { return hd == 128 ? 64 : fwd_block_n(hd); }

// sm_80 dq kernel (bwd_kernel.cuh).
constexpr int dq_block_m(int) { return 64; }
constexpr int dq_block_n(int hd) { return hd <= 128 ? 64 : 32; }

// sm_80 dK dV kernel (bwd_kernel.cuh): one warp per 16 keys.
constexpr int dkdv_warps(int hd) { return hd <= 128 ? 8 : 4; }
constexpr int dkdv_block_n(int hd) { return 16 * dkdv_warps(hd); }
constexpr int dkdv_block_m(int hd) { return hd <= 128 ? 64 : 32; }

// sm_80 backward at tile 32 (head dims up to 32): dS enters the dK and dQ products as two terms of the input dtype,
// hi = dS rounded and lo = (dS - hi) rounded (mainloop.cuh, gemm_pb_split), instead of dS rounded once. With one
// rounding the backward's arithmetic is that of SPEC 5's plain implementation, but its D comes from the out it is fed
// while the plain implementation's comes from its own out; where dK_j = softmax_scale * sum_i dS_ij q_i or dQ is
// ill-conditioned the plain error can then fall below half the backward's, and the backward misses the budget (shared
// case head-dims, d = 8, on an H100: dK 4.93e-3 against 2 x 1.92e-3 + 1e-3). A CPU emulation of this kernel's
// arithmetic on random inputs of that shape (100 keys, causal, GQA 2:1, sinks log(100) and 20) misses the budget on
// 9 of 3000 at d = 8 (dK up to 1.21x, dQ up to 1.12x), on 1 of 1500 at d = 16, 24 and 32 (up to 1.17x), and with the
// split on none of 3000 at d = 8 (at most 0.44x); at d = 48 on 1 of 1500 (1.02x), at d = 40 and 64 on none of 1500.
// The split costs one more tensor-core product per dK / dQ product, cheap at this tile; the other tiles keep one
// rounding.
constexpr bool bwd_split_ds(int hd) { return hd == 32; }

// Hopper (sm_90a) kernels, head-dim tiles 64 and 128: the backward and the warp-specialised forward's bias / dropout
// variants.
constexpr bool has_sm90(int hd) { return hd == 64 || hd == 128; }
// The warp-specialised forward's plain variant (no bias, no dropout) also runs tiles 192 and 256 (keys per step:
// sm90_ws_block_n).
constexpr bool has_sm90_fwd_ws(int hd) { return has_sm90(hd) || hd == 192 || hd == 256; }
// The dK dV kernel at tile 256 (hopper/bwd_dkdv_sm90_wide.cuh): the head dim split between the two warpgroups,
// 64 keys a block, no bias / dropout variant. Tile 192 stays on the sm_80 backward (its 96-column halves would
// start inside a 64-column swizzle panel and cross the next: not built).
constexpr bool dkdv_sm90_wide(int hd) { return hd == 256; }
constexpr int dkdv_sm90_block_n(int hd) { return dkdv_sm90_wide(hd) ? 64 : 128; }
// Query rows per step: 128 at tile 64 without bias or dropout (S^T and dP^T as m64n128 products, half the steps and
// barriers per FLOP; measured on the H200: bench/log/2026-12-03-dkdv-128-row-step.md, 09990b7), 64 otherwise (tile 128:
// the math takes 254 registers at 64 rows; the bias / dropout variants' staging and keep bits are laid out for 64).
constexpr int dkdv_sm90_block_m(int hd, bool plain) { return hd == 64 && plain ? 128 : 64; }
// The Hopper dK dV kernel's dropout variant draws the keep bits in a producer warpgroup at head dim 64; at 128 the
// math warpgroups draw them (their 254 registers leave none for a third warpgroup: bwd_dkdv_sm90.cuh).
constexpr bool dkdv_sm90_keep_producer(int hd) { return hd == 64; }
// The Hopper dK dV variants with a producer warpgroup of a dq writer and a step loader (hopper/bwd_dkdv_sm90.cuh,
// DkvSm90Traits::kDqWriter and kOneBarrier, where the measurements are): the narrow kernel (not the wide one of tile
// 256) without bias or dropout, deterministic or at 128 query rows per step.
constexpr bool dkdv_sm90_dq_writer(int hd, bool bias, bool dropout, bool det, int block_m) {
  return !dkdv_sm90_wide(hd) && !dropout && !bias && (det || block_m == 128);
}

// Forward windows on the Hopper kernel: a window bounded on both sides that leaves kSm90FwdWindowRows query rows
// fewer keys than kSm90FwdWindowKeys (rows + window_left + window_right), and at least sm90_ws_window_min_keys, runs
// the warp-specialised forward's short-window variant at tiles 64 and 128 without bias / dropout / paged KV
// (sm90_ws_window); any other window that leaves them fewer than kSm90FwdMinWindowKeys runs the sm_80 forward. The
// default variants spend much of a short tile in the pipeline prologue and, with 3 consumers at tile 64 (192 query
// rows, 3-4 key blocks of 128 for a 127-key window), on masked keys (H200, GPT-OSS sliding layer, window 127:
// 0.211-0.216 ms against 0.168-0.170 on the sm_80 forward, bench/log/2026-12-05-deterministic-per-step-turns.md).
// The short-window variant: 2 consumers (128 query rows: a 127-key window's rows see 2 key blocks of 128, where 192
// rows see 3 or 4) and Q in 2 buffers (a tile is a few key blocks, so the next tile's Q loads while the consumers
// finish the current one; 4-7% faster than one buffer). Measured on the H200
// (bench/log/2026-12-06-short-window-forward.md, b 2, s 4096, causal, forward ms, variant / previous kernel):
// tile 128, h 32, window 127 0.133-0.136 / 0.181-0.183 (sm_80), window 511 0.211-0.212 / 0.216-0.217 (2 consumers,
// one Q buffer); tile 64, GPT-OSS (h 64 / 8), window 511 0.291-0.298 / 0.307 (3 consumers), 895 0.386-0.393 /
// 0.386-0.391, but window 127 0.195-0.200 / 0.167-0.170 and 255 0.229-0.230 / 0.217-0.220 on the sm_80 forward,
// whose 4 blocks of 4 warps an SM hide more latency than the variant's 2 consumer warpgroups (ncu, window 127: 0.46
// instructions issued a cycle per scheduler, 0.63 eligible warps): tile 64 takes the variant from
// kSm90FwdMinWindowKeys keys.
constexpr int kSm90FwdWindowRows = 128;
constexpr int kSm90FwdMinWindowKeys = 512;
constexpr int kSm90FwdWindowKeys = 1024;
constexpr bool sm90_ws_window(int hd) { return has_sm90(hd); }
constexpr int sm90_ws_window_min_keys(int hd) { return hd == 64 ? kSm90FwdMinWindowKeys : 0; }
constexpr int kSm90WsWindowConsumers = 2;
constexpr int kSm90WsWindowQStages = 2;
// The warp-specialised Hopper forward (hopper/fwd_sm90_ws.cuh): 64 query rows per consumer warpgroup, 128 keys per
// step up to tile 128, 64 at tiles 192 / 256 (the two-stage K / V ring and a 128-row Q tile fit the 227 KiB of shared
// memory: 192 KiB at 256; the O accumulator takes 96 / 128 registers a thread); consumer warpgroups by default
// (dispatch.cpp; the kernel's first measurements: bench/log/2026-12-01-warp-specialised-forward.md).
constexpr int sm90_ws_block_n(int hd) { return hd <= 128 ? 128 : 64; }
constexpr int sm90_ws_default_consumers(int hd) { return hd == 64 ? 3 : 2; }
// Its bias variant (kBias): 2 consumers, staged by TMA or not. Staged, 2 read the tile's words into registers
// (ldmatrix) after S is issued; 3 (128 registers a thread) read them where used and spilled 114 bytes: GPT-OSS full
// + bias forward 1.019 / 1.023 ms with 2 against 1.191 / 1.200 with 3 (H200, bench/log/2026-12-02-bias-ldmatrix.md;
// before the ldmatrix reads, 3 were marginally faster: 1.285 against 1.298, bench/log/2026-12-02-bias-tma.md). A
// bias loaded from global memory (fp32, strided, unaligned rows): 2, whose threads have the registers to prefetch it
// (H200, 299693c: 2.52-2.63 ms against 2.66-2.69, bench/log/2026-12-01-bias-hopper.md). The kernel has no 3-consumer
// bias path (fwd_sm90_ws.cuh).
constexpr int sm90_ws_bias_consumers(int /*hd*/) { return 2; }
// Its dropout variant (kDropout): 2 consumers; warps 1 .. 3 of the producer warpgroup draw keep bits with this many
// registers (setmaxnreg), the consumers take (3 x 168 - this) / 2. The consumers draw the bits of the first
// sm90_ws_dropout_consumer_slices 8-key slices of every key block, the producer those of the others. H200, 1651c86,
// GPT-OSS full / MHA d128 + dropout forward: 0 slices 3.79 / 2.93 ms, 8: 2.77 / 2.04, 10: 2.49 / 1.70 (12, with two
// producer units in flight: 2.60 / 2.05); 56 producer registers at head dim 64 instead of 88: 2.88 against 2.64 ms
// (a build drawing the consumers' slices 5 at a time); bench/log/2026-12-02-dropout-forward-hopper.md.
constexpr int sm90_ws_dropout_consumers(int /*hd*/) { return 2; }
constexpr int sm90_ws_dropout_producer_regs(int hd) { return hd == 64 ? 88 : 56; }
constexpr int sm90_ws_dropout_consumer_slices(int /*hd*/) { return 10; }

}  // namespace sinkattn::cuda::tiles

// CUDA backend, Hopper: the warp-specialised forward (SPEC.md section 2) on wgmma + TMA, FlashAttention-3's
// structure written for this library's math (head-dim tiles 64, 128, 192 and 256, fp16 / bf16; a bias in the kBias
// variant, dropout in the kDropout variant, both at tiles 64 and 128 only):
//   - one producer warp (its warpgroup gives its registers away: setmaxnreg.dec) loads Q once and K, V of every
//     key block into a two-stage ring of shared-memory buffers, by TMA where the block lies in the sequence and
//     by cp.async with zero-fill where it reaches past the sequence's end (rows past len_kv must read as exact
//     zeros: P = 0 there, and 0 * NaN would reach the output), completing "full" mbarriers;
//   - kNC consumer warpgroups (setmaxnreg.inc), 64 query rows each, compute per key block j
//         S_j = Q K_j^T (wgmma, both operands from shared memory),
//         m_new = max(m, rowmax(S_j) * scale * log2 e), P_j = exp2(S_j * c - m_new), l = l * alpha + rowsum(P_j)
//         O = O * alpha + P_{j} V_{j}     (wgmma, A = P from registers)
//     with the online softmax of softmax.cuh unchanged (the sink as an already-seen key: m = sigma log2 e, l = 1;
//     the S and P V wgmma chains and the softmax step are fwd_sm90_mainloop.cuh's),
//     S_j issued together with P_{j-1} V_{j-1} (intra-warpgroup overlap: the softmax of S_j runs while the tensor
//     cores compute P V), and release K_j / V_{j-1} to the producer ("empty" mbarriers) as soon as their wgmmas
//     retire;
//   - ping-pong: the consumer warpgroups take turns to issue their wgmmas (named barriers, round robin), so that
//     one warpgroup's softmax overlaps the others' matrix products;
//   - epilogue: out = O / l, LSE = (m + log2 l) ln 2 through fwd_store_rows (epilogue.cuh), as every forward;
//   - kDropout: the keep bits of every key block come from two places: the consumers draw those of their fragment's
//     first kConsumerSlices 8-key slices while S and P V run (Dropout::keep_bits), warps 1 .. 3 of the producer
//     warpgroup those of the other keys into a ring in shared memory (fwd_keep_producer). The Philox blocks are what
//     this variant spends its time on (bench/log/2026-12-02-dropout-forward-hopper.md, H200, 1651c86: with the
//     producer alone it was slower than the sm_80 kernel; 10 of 16 slices in the consumers was the fastest split
//     measured).
// Tiles (kBlockM query rows of one (sequence, head)) in scheduler.hpp's longest-first order over the whole launch (in
// L2 sections of p.fwd_section heads):
// block b takes tiles b, b + gridDim.x, ... (persistent blocks, one per SM: the producer loads the next tile's Q and
// K / V while the consumers finish and store the current one; Q is released through a q_empty barrier, and the
// short-window variant (QS = 2 Q buffers, tiles::sm90_ws_window) loads the next tile's Q before that), or one tile
// per block when the grid has a block per tile. Masks, sinks and LSE conventions are the sm_80 kernel's. Paged KV
// (kPaged): the producer warp reads K / V through the page table (paged_kv_sm90.cuh), the consumers are unchanged.
// This file: the traits, the shared-memory layout (FwdWsSmem), the tile order (fwd_ws_tile), the producer warp's
// loads (fwd_ws_load), the consumers' pipeline and epilogue (fwd_ws_consumers, with the bias / keep-bit steps of the
// kBias / kDropout variants in FwdWsBlockExtras) and the kernel, which gives each warpgroup its role. The keep producer and the consumers'
// side of its handover: keep_producers.cuh; the staged bias tiles: bias_staging.cuh; the consumers' per-key-block steps
// and the tensor maps (Sm90FwdTma): fwd_sm90_mainloop.cuh.
#pragma once

#include <cuda.h>

#include <type_traits>

#include "cuda/dropout.cuh"
#include "cuda/epilogue.cuh"
#include "cuda/hopper/bias_staging.cuh"
#include "cuda/hopper/fwd_sm90_mainloop.cuh"
#include "cuda/hopper/keep_producers.cuh"
#include "cuda/hopper/paged_kv_sm90.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/mask.cuh"
#include "cuda/scheduler.cuh"
#include "cuda/softmax.cuh"

namespace sinkattn::cuda::sm90 {

template <int HD, int NC_ = 2, bool kBias_ = false, bool kDropout_ = false, int QS_ = 1>
struct FwdWsTraits {
  static constexpr int kHeadDim = HD;
  static constexpr int kNC = NC_;                 // consumer warpgroups
  static constexpr int kThreads = 128 * (kNC + 1);  // + the producer warpgroup
  static constexpr int kBlockM = 64 * kNC;        // query rows per block
  static constexpr int kBlockN = tiles::sm90_ws_block_n(HD);  // keys per step
  static_assert(tiles::has_sm90_fwd_ws(HD) && (tiles::has_sm90(HD) || (!kBias_ && !kDropout_)),
                "bias / dropout variants at tiles 64 and 128 only");
  static constexpr int kStages = 2;               // K and V buffers each
  // Q buffers: 2 in the short-window variant (tiles::kSm90WsWindowQStages), whose tiles have a few key blocks
  // each, so that the next tile's Q loads while the consumers finish the current one; else 1.
  static constexpr int kQStages = QS_;
  static_assert(QS_ == 1 || (!kBias_ && !kDropout_), "Q ring: the plain variant");
  // kDropout: warps 1 .. 3 of the producer warpgroup draw the keep bits of the slices the consumers leave
  // (fwd_keep_producer) and need registers for their Philox chains; the consumers give up what the producer
  // warpgroup takes (setmaxnreg, within the block's launch allocation: 168 a thread at 384 threads).
  static constexpr int kProducerRegs = kDropout_ ? tiles::sm90_ws_dropout_producer_regs(HD) : 24;
  static constexpr int kConsumerRegs = kDropout_ ? (168 * 3 - kProducerRegs) / 2 : kNC == 2 ? 240 : 160;
  static_assert(!kBias_ || kNC == 2, "bias: 2 consumers (tiles::sm90_ws_bias_consumers)");
  static_assert(!kDropout_ || (kNC == 2 && kProducerRegs % 8 == 0 && kConsumerRegs % 8 == 0 &&
                               kProducerRegs * 128 + kConsumerRegs * 256 <= 168 * kThreads),
                "dropout: 2 consumers, registers within the launch allocation");
  // kBias: the bias tiles staged by TMA (Sm90FwdTma::bias_ok), sB [S][kBlockM * kBlockN] in the swizzled row-panel
  // layout (rows = queries), a ring beside K's; 225.1 KiB in all at head dim 128 (227 the most). Always 2 consumers
  // (tiles::sm90_ws_bias_consumers): they read the block's bias into registers (BiasPrefetch).
  static constexpr int kBiasTile = kBlockM * kBlockN;
  static constexpr int kBiasStages = kBias_ ? kStages : 0;
  // kDropout: the keep bits of a key block, sKeep [kKeepStages][kBlockM][kBlockN / 16] uint16 (row r = query m0 + r,
  // chunk c, bit k = key j0 + 16 c + k), a ring of its own (the producer may run ahead of the consumers).
  static constexpr int kKeepChunks = kBlockN / 16;
  static constexpr int kKeepTile = kBlockM * kKeepChunks;  // uint16 words
  static constexpr int kKeepStages = kDropout_ ? 4 : 0;
  static constexpr int kKeepThreads = 96;  // producer warps 1 .. 3 (every producer warp but warp 0, the loader)
  static_assert(kKeepThreads == 128 - 32, "the kernel runs fwd_keep_producer on producer warps != 0");
  // kDropout: the consumers draw the keep bits of their fragment's first kConsumerSlices 8-key slices themselves
  // (Dropout::keep_bits, while S and P V run), the producer the rest (chunks kConsumerSlices / 2 ..).
  static constexpr int kConsumerSlices = kDropout_ ? tiles::sm90_ws_dropout_consumer_slices(HD) : 0;
  static_assert(kConsumerSlices % 2 == 0 && kConsumerSlices < kBlockN / 8, "whole 16-key chunks to the producer");
  // Barriers: q_full[QS], q_empty[QS], k_full[S], k_empty[S], v_full[S], v_empty[S] (kBias: b_full[S], b_empty[S];
  // kDropout: keep_full[KS], keep_empty[KS])
  static constexpr int kBars = 2 * kQStages + 4 * kStages + 2 * kBiasStages + 2 * kKeepStages;
  static constexpr int kSmem = (kQStages * kBlockM * HD + 2 * kStages * kBlockN * HD + kBiasStages * kBiasTile +
                                kKeepStages * kKeepTile) * 2 +
                               kBars * 8 + 1024;
  static_assert(kSmem <= 227 * 1024, "shared memory per block");
};

// Named barriers 1 .. kNC (sm90_common.cuh's named_bar_sync / named_bar_arrive) order the consumer warpgroups'
// wgmma issue.

// The loading warp's cp.async copies, completed on the "full" barrier `bar` as TMA completes its own: wait for this
// thread's copies, make them visible to wgmma's async proxy, then one arrival for the warp.
__device__ __forceinline__ void cp_async_arrive_warp(uint64_t* bar, int lane) {
  cp_async_commit();
  cp_async_wait<0>();
  fence_proxy_async();
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}

// The shared memory of fwd_sm90_ws_kernel, in this order from a base aligned to 1024 bytes (FwdWsTraits has the
// sizes): sQ [QS][BM][HD]; sK, sV [S][BN][HD] (the two-stage K / V ring; 16-bit tiles in the swizzled row panels);
// kBias: sB [S][BM * BN] (the bias tiles, a ring beside K's); kDropout: sKeep [KS][BM][BN / 16] uint16 (the keep
// bits of the slices the producer draws); the mbarriers: q_full[QS], q_empty[QS], k_full[S], k_empty[S], v_full[S],
// v_empty[S] (kBias: b_full[S], b_empty[S]; kDropout: keep_full[KS], keep_empty[KS]). A "full" barrier completes
// when a stage's loads have landed (one arrival and the TMA bytes, or the loading warp's cp.async arrival), an
// "empty" one when every consumer warp (one arrival each) is done with it.
template <typename T, typename Tr>
struct FwdWsSmem {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim, S = Tr::kStages, NC = Tr::kNC;
  static constexpr int KS = Tr::kKeepStages, QS = Tr::kQStages;
  T *sQ, *sK, *sV, *sB;
  uint16_t* sKeep;
  uint64_t *q_full, *q_empty, *k_full, *k_empty, *v_full, *v_empty, *b_full, *b_empty, *keep_full, *keep_empty;
  __device__ __forceinline__ explicit FwdWsSmem(unsigned char* smem_raw) {
    sQ = reinterpret_cast<T*>(smem_raw + ((1024 - (smem_addr(smem_raw) & 1023)) & 1023));
    sK = sQ + QS * BM * HD;
    sV = sK + S * BN * HD;
    sB = sV + S * BN * HD;
    sKeep = reinterpret_cast<uint16_t*>(sB + Tr::kBiasStages * Tr::kBiasTile);
    uint64_t* bars = reinterpret_cast<uint64_t*>(sKeep + Tr::kKeepStages * Tr::kKeepTile);
    q_full = bars;
    q_empty = bars + QS;
    k_full = bars + 2 * QS;
    k_empty = k_full + S;
    v_full = k_empty + S;
    v_empty = v_full + S;
    b_full = v_empty + S;
    b_empty = b_full + S;
    keep_full = b_empty + S;
    keep_empty = keep_full + KS;
  }
  // Thread 0, before the block's first barrier: a full barrier takes one arrival, an empty one an arrival per
  // consumer warp (keep_full: one per producer thread).
  __device__ __forceinline__ void init_barriers() const {
    for (int q = 0; q < QS; ++q) {
      mbar_init(&q_full[q], 1);
      mbar_init(&q_empty[q], 4 * NC);
    }
    for (int s = 0; s < S; ++s) {
      mbar_init(&k_full[s], 1);
      mbar_init(&v_full[s], 1);
      mbar_init(&k_empty[s], 4 * NC);
      mbar_init(&v_empty[s], 4 * NC);
      if constexpr (Tr::kBiasStages > 0) {
        mbar_init(&b_full[s], 1);
        mbar_init(&b_empty[s], 4 * NC);
      }
    }
    for (int s = 0; s < KS; ++s) {
      mbar_init(&keep_full[s], Tr::kKeepThreads);
      mbar_init(&keep_empty[s], 4 * NC);
    }
  }
};

// Everything a role needs of one tile (both roles compute it alike, so they agree on which tiles load): tile L of
// the launch's longest-first order in L2 sections of p.fwd_section heads (scheduler.hpp), BM query rows from m0 of
// head h, sequence n, and its key blocks nb_lo .. nb_lo + nblocks - 1 of BN keys. mblocks: query blocks per
// sequence; heavy_last: windows reaching right (the heavy tiles are then the last ones).
struct FwdWsTile {
  int h, n, hk, m0, nb_lo, nblocks;
  SeqInfo sq;
  bool real, padding;  // real: some row of the block lies in its sequence (else nothing to do)
};
template <int BM, int BN>
__device__ __forceinline__ FwdWsTile fwd_ws_tile(const Params& p, int64_t L, int mblocks, bool heavy_last) {
  FwdWsTile t;
  const TileCoord tc = tile_of_linear_sectioned(static_cast<unsigned long long>(L), tile_pairs(p.h_q, p.b), mblocks,
                                                p.h_q, heavy_last, static_cast<unsigned long long>(p.fwd_section));
  t.h = tc.head;
  t.n = tc.batch;
  const int block = tc.block;
  t.hk = t.h / p.group;
  t.sq = seq_info(p, t.n);
  t.m0 = block * BM;
  t.real = t.m0 < t.sq.rows_q;
  t.padding = t.real && t.m0 >= t.sq.len_q;
  t.nb_lo = 0;
  t.nblocks = 0;
  if (t.real && !t.padding) {
    const Mask mk(p, t.sq);
    int k_lo, k_hi;
    mk.key_range(t.m0, min(t.m0 + BM, t.sq.len_q), k_lo, k_hi);
    t.nb_lo = k_lo / BN;
    const int nb_hi = (k_hi + BN - 1) / BN;
    t.nblocks = nb_hi > t.nb_lo ? nb_hi - t.nb_lo : 0;
  }
  return t;
}

// The producer warp (warp 0): Q once per tile and K, V (kBias: with the bias tile) of every key block into the
// two-stage ring, by TMA where the block lies in the sequence and by cp.async with zero-fill where it reaches past
// its end (rows past len_kv must read as exact zeros: P = 0 there, and 0 * NaN would reach the output), each stage
// once the consumers have released it (its "empty" barrier), completing its "full" barrier. kPaged: K / V through
// the page table (paged_kv_sm90.cuh: TMA boxes of page chunks, cp.async with a page lookup per row), each key
// block's page lookups issued one block ahead (their latency then overlaps the waits for the ring); role: kLoadAll
// (one warp loads everything), or kLoadQK / kLoadV (two warps share the work: Q and K, or V).
enum FwdLoadRole { kLoadQK = 0, kLoadV = 1, kLoadAll = 2 };
template <typename T, typename Tr, bool kPaged, typename TileAt>
__device__ __forceinline__ void fwd_ws_load(const Params& p, const Sm90FwdTma& tma, const FwdWsSmem<T, Tr>& sm,
                                            const TileAt& tile_at, int num_tiles, int lane, bool bias_smem,
                                            int role = kLoadAll) {
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, HD = Tr::kHeadDim, S = Tr::kStages, QS = Tr::kQStages;
  int it = 0;  // key blocks loaded so far by this block (stage it % S, use it / S)
  int qi = 0;  // Q tiles loaded so far (buffer qi % QS, use qi / QS)
  for (int64_t L = blockIdx.x; L < num_tiles; L += gridDim.x) {
    const FwdWsTile t = tile_at(L);
    if (t.nblocks == 0) continue;
    const SeqInfo& sq = t.sq;
    const int nbatch = p.varlen ? 0 : t.n;
    // kPaged: lane c's chunk of a key block lying in the sequence (its page, looked up once for K and V)
    const int chunks = kPaged && tma.ok != 0 ? BN / tma.page_rows : 0;
    const auto lookup = [&](int nb) {
      return kPaged && tma.ok != 0 && (nb + 1) * BN <= sq.len_kv
                 ? paged_chunk(p, t.n, nb * BN, tma.page_rows, chunks, lane)
                 : PagedChunk{0, 0};
    };
    PagedChunk next_at = lookup(t.nb_lo);
    // Q: TMA when every row of the block lies in the sequence, else cp.async (rows past len_q zero-filled),
    // once the consumers have released the Q tile QS tiles back.
    if (role != kLoadV) {
      const int qs = qi % QS;
      T* sQ = sm.sQ + qs * BM * HD;
      mbar_wait(&sm.q_empty[qs], ((qi / QS) & 1) ^ 1);  // a fresh barrier's previous phase counts as complete
      if (tma.ok != 0 && t.m0 + BM <= sq.len_q) {
        if (lane == 0)
          tma_load_tile_sw<BM, HD>(sQ, &tma.q, static_cast<int>(sq.q_start) + t.m0, t.h, nbatch, &sm.q_full[qs]);
      } else {
        const T* qg = row_ptr<const T>(p.q, p.q_st, t.n, sq.q_start + t.m0, t.h);
        load_tile_sw_rolled<BM, HD>(sQ, qg, p.q_st.s, sq.len_q - t.m0, p.d, lane, 32);
        cp_async_arrive_warp(&sm.q_full[qs], lane);
      }
    }
    ++qi;
    const T* kg = row_ptr<const T>(p.k, p.k_st, t.n, sq.kv_start, t.hk);
    const T* vg = row_ptr<const T>(p.v, p.v_st, t.n, sq.kv_start, t.hk);
    // K_j then V_j for every key block, into stage it % S once the consumers have released it.
    for (int i = 0; i < t.nblocks; ++i, ++it) {
      const int nb = t.nb_lo + i, j0 = nb * BN, s = it % S;
      const uint32_t empty_parity = ((it / S) & 1) ^ 1;
      const bool full = tma.ok != 0 && (nb + 1) * BN <= sq.len_kv;
      const PagedChunk chunk_at = next_at;
      if (kPaged && i + 1 < t.nblocks) next_at = lookup(nb + 1);
#pragma unroll
      for (int v = 0; v < 2; ++v) {
        if (role != kLoadAll && v != role) continue;
        uint64_t* empty = v ? &sm.v_empty[s] : &sm.k_empty[s];
        uint64_t* fullb = v ? &sm.v_full[s] : &sm.k_full[s];
        T* dst = (v ? sm.sV : sm.sK) + s * BN * HD;
        mbar_wait(empty, empty_parity);
        if constexpr (kPaged) {
          if (full) {
            tma_load_paged_tile<BN, HD>(dst, v ? &tma.v : &tma.k, chunk_at, tma.page_rows, chunks, t.hk, fullb, lane);
          } else {
            if (v)
              load_tile_sw_paged<BN, HD>(dst, static_cast<const T*>(p.v), p.v_st.b, p.v_st.s, t.hk * p.v_st.h, p, t.n,
                                         j0, sq.len_kv - j0, p.d_v, lane, 32);
            else
              load_tile_sw_paged<BN, HD>(dst, static_cast<const T*>(p.k), p.k_st.b, p.k_st.s, t.hk * p.k_st.h, p, t.n,
                                         j0, sq.len_kv - j0, p.d, lane, 32);
            cp_async_arrive_warp(fullb, lane);
          }
        } else if (full) {
          if (lane == 0)
            tma_load_tile_sw<BN, HD>(dst, v ? &tma.v : &tma.k, static_cast<int>(sq.kv_start) + j0, t.hk, nbatch,
                                     fullb);
        } else {
          if (v)
            load_tile_sw_rolled<BN, HD>(dst, vg + j0 * p.v_st.s, p.v_st.s, sq.len_kv - j0, p.d_v, lane, 32);
          else
            load_tile_sw_rolled<BN, HD>(dst, kg + j0 * p.k_st.s, p.k_st.s, sq.len_kv - j0, p.d, lane, 32);
          cp_async_arrive_warp(fullb, lane);
        }
        if (v == 0 && bias_smem) {
          // kBias: the block's bias tile (queries m0 .., keys j0 ..; zeros outside the tensor) with K_j, which
          // S_j needs too; its own ring stage, released by the consumers after their softmax step.
          mbar_wait(&sm.b_empty[s], empty_parity);
          if (lane == 0)
            load_bias_tile_fwd<BM, BN>(sm.sB + s * Tr::kBiasTile, tma.bias, p, t.n, t.h, t.m0, j0, &sm.b_full[s]);
        }
      }
    }
  }
}

// A consumer warp's arrival on an "empty" barrier (one per warp), once every lane is done with the buffer.
__device__ __forceinline__ void release_warp(uint64_t* bar, int lane) {
  __syncwarp();
  if (lane == 0) mbar_arrive(bar);
}

// What a consumer warp adds to a tile's key-block steps in the kBias and kDropout variants (nothing in the others):
// the key block at position i of the tile (ring position it + i) with query rows row_w .. row_w + 15 of head h.
//   prefetch(i), after its S is issued and before it is waited for: kBias: the block's bias into registers, from the
//     staged tile (bias_smem; bias_staging.cuh) or from global memory; kDropout: the keep bits of its first kCS
//     slices (Dropout::keep_bits: the Philox chains run beside the wgmmas);
//   softmax(s, alpha, i): fwd_softmax_step (with the bias), then kBias: the staged tile's buffer released; kDropout:
//     P * keep / (1 - p) for the P V product, the other slices' keep bits from the producer's ring
//     (keep_producers.cuh).
template <typename T, typename Tr, bool kBias, bool kDropout>
struct FwdWsBlockExtras {
  static constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, NT = BN / 8, S = Tr::kStages, kCS = Tr::kConsumerSlices;
  const Params& p;
  const FwdWsSmem<T, Tr>& smem;
  const SeqInfo& sq;
  const int n, h, row_w, nb_lo, it, c, wl, lane;
  const bool bias_smem;
  BiasPrefetch<T, NT> bias;
  BiasSmemView<T, NT, false, SwOffset<BM>> bias_view{SwOffset<BM>{}};
  uint64_t own_keep = 0;

  __device__ __forceinline__ void prefetch(int i) {
    if constexpr (kBias) {
      if (bias_smem) {  // waits for block i's staged tile, views it
        stage_bias_fwd<Tr>(bias_view, smem.sB, smem.b_full, it + i, c * 64 + wl * 16, lane);
        bias.load_smem(bias_view);
      } else {
        bias.load(p, n, h, row_w, (nb_lo + i) * BN, sq.len_q, sq.len_kv, lane);
      }
    }
    if constexpr (kDropout && kCS > 0)
      own_keep = Dropout(p, n, h).template keep_bits<false, kCS>(row_w, (nb_lo + i) * BN, p.s_kv, lane);
  }
  __device__ __forceinline__ void softmax(OnlineSoftmax<NT>& sm, const Mask& mk, float (&s)[NT][4], float (&alpha)[2],
                                          int i) {
    fwd_softmax_step<T, kBias, kDropout>(sm, s, alpha, p, mk, n, h, row_w, (nb_lo + i) * BN, lane,
                                         kBias ? &bias : nullptr);
    if constexpr (kBias) {
      if (bias_smem) release_warp(&smem.b_empty[(it + i) % S], lane);
    }
    if constexpr (kDropout) {
      drop_p_fwd<Tr>(s, own_keep, smem.sKeep, smem.keep_full, smem.keep_empty, it + i, c, wl, lane,
                     [&](uint64_t* bar) { release_warp(bar, lane); });
    }
  }
};

// The consumer warpgroups (threads 128 ..): every tile of the block (tile_at(L), L = blockIdx.x, + gridDim.x, ...):
// its key blocks' steps in the pipeline order of the header above (written out here: fwd_sm90_mainloop.cuh says
// why), then the epilogue. Consumer c takes its wgmma turn after named barrier 1 + c and passes it on to c + 1.
template <typename T, typename Tr, bool kBias, bool kDropout, typename TileAt>
__device__ __forceinline__ void fwd_ws_consumers(const Params& p, const FwdWsSmem<T, Tr>& smem, const TileAt& tile_at,
                                                 int num_tiles, int c, int ctid, int wl, int lane,
                                                 bool bias_smem) {
  constexpr int BN = Tr::kBlockN, NT = BN / 8, NO = Tr::kHeadDim / 8, NC = Tr::kNC, S = Tr::kStages;
  constexpr int QS = Tr::kQStages;
  const int my_bar = 1 + c, next_bar = 1 + (c + 1) % NC;
  auto my_turn = [&] { named_bar_sync(my_bar, 256); };
  auto pass_turn = [&] { named_bar_arrive(next_bar, 256); };
  auto full_parity = [](int it) { return static_cast<uint32_t>((it / S) & 1); };
  int it = 0, qi = 0;  // key blocks and Q tiles taken so far (ring positions, as the producer counts them)
  // The turns run round robin over every tile of the block (each consumer takes nblocks + 1 turns per tile), so
  // a consumer can never arrive twice at a barrier whose phase is still open: consumer NC - 1 opens the first
  // turn here and consumer 0 takes its last arrival after the loop.
  if (c == NC - 1) named_bar_arrive(1, 256);
  for (int64_t L = blockIdx.x; L < num_tiles; L += gridDim.x) {
    const FwdWsTile t = tile_at(L);
    if (!t.real) continue;
    const SeqInfo& sq = t.sq;
    const int h = t.h, n = t.n, m0 = t.m0, nb_lo = t.nb_lo, nblocks = t.nblocks;
    T* out = row_ptr<T>(p.out, p.out_st, n, sq.q_start + m0, h);
    const float sigma = sink_value(p, h);
    if (t.padding) {  // padding rows of a dense batch
      fwd_store_padding_rows(p, sq, n, h, out, m0, min(Tr::kBlockM, sq.rows_q - m0), sigma, ctid, 128 * NC);
      continue;
    }
    const Mask mk(p, sq);
    const int row_w = m0 + c * 64 + wl * 16;  // first query row of this warp (within the sequence)
    OnlineSoftmax<NT> sm;
    // kDropout: P * keep / (1 - p) is rounded as one value for the P V product (SPEC 5; OnlineSoftmax::init)
    sm.init(sigma, sigma, lane, kDropout ? p.dropout_rscale : 1.f);
    float acc[NO][4];
    zero_acc(acc);

    if (nblocks > 0) {
      const int qs = qi % QS;
      const T* sQ_wg = smem.sQ + qs * Tr::kBlockM * Tr::kHeadDim + c * 64 * 64;  // rows 64 c .. of every panel
      mbar_wait(&smem.q_full[qs], (qi / QS) & 1);
      // The steps of fwd_sm90_mainloop.cuh on the key block of ring position k_it / v_it (stage % S).
      auto issue_s = [&](float (&s)[NT][4], int k_it) {
        fwd_issue_s<T, Tr::kBlockM, Tr::kHeadDim>(s, sQ_wg, smem.sK + (k_it % S) * BN * Tr::kHeadDim);
      };
      auto issue_pv = [&](const uint32_t (&ap)[BN / 16][4], int v_it) {
        fwd_issue_pv<T>(acc, ap, smem.sV + (v_it % S) * BN * Tr::kHeadDim);
      };
      FwdWsBlockExtras<T, Tr, kBias, kDropout> ex{p, smem, sq, n, h, row_w, nb_lo, it, c, wl, lane, bias_smem};
      uint32_t ap[BN / 16][4];
      {
        float s[NT][4];
        mbar_wait(&smem.k_full[it % S], full_parity(it));
        my_turn();
        wgmma_fence();
        issue_s(s, it);
        pass_turn();
        ex.prefetch(0);
        wgmma_wait<0>();
        fence_acc(s);
        release_warp(&smem.k_empty[it % S], lane);
        float alpha[2];
        ex.softmax(sm, mk, s, alpha, 0);  // O = 0: alpha not needed
        pack_a_frags<T>(s, ap);
      }
      for (int i = 1; i < nblocks; ++i) {
        const int cur = it + i, prev = it + i - 1;
        float s[NT][4];
        mbar_wait(&smem.k_full[cur % S], full_parity(cur));
        mbar_wait(&smem.v_full[prev % S], full_parity(prev));
        my_turn();
        wgmma_fence();
        issue_s(s, cur);
        issue_pv(ap, prev);
        pass_turn();
        ex.prefetch(i);
        wgmma_wait<1>();
        fence_acc(s);
        release_warp(&smem.k_empty[cur % S], lane);
        float alpha[2];
        ex.softmax(sm, mk, s, alpha, i);
        wgmma_wait<0>();
        fence_acc(acc);
        release_warp(&smem.v_empty[prev % S], lane);
        rescale_rows(acc, alpha);
        pack_a_frags<T>(s, ap);
      }
      const int last = it + nblocks - 1;
      mbar_wait(&smem.v_full[last % S], full_parity(last));
      my_turn();
      wgmma_fence();
      issue_pv(ap, last);
      pass_turn();
      wgmma_wait<0>();
      fence_acc(acc);
      release_warp(&smem.v_empty[last % S], lane);
      release_warp(&smem.q_empty[qs], lane);  // every wgmma of this tile that reads Q has retired
      it += nblocks;
      ++qi;
    }

    // Epilogue (as fwd_kernel): out_i = O_i / l_i (0 for a row that saw nothing), LSE_i; padding rows of a
    // dense batch get exact zeros. kDropout: O = sum_j (P_j / (1 - p)) keep_j V_j and l carry 1 / (1 - p).
    fwd_store_rows<T, kDropout>(p, sq, n, h, out + (c * 64 + wl * 16) * p.out_st.s, row_w, sm, acc, lane);
  }
  if (c == 0) named_bar_sync(1, 256);
}

// kBias: the variant for calls with a bias (fwd_softmax_step adds it to S; launched only then). kDropout: the variant
// for calls with dropout (SPEC.md section 2): the normaliser l sums the undropped P, the P V product takes
// P * keep / (1 - p) (the keep bits of the first tiles::sm90_ws_dropout_consumer_slices 8-key slices of a key block
// drawn by the consumer itself while S runs, those of the other slices by fwd_keep_producer into sKeep). The factor
// 1 / (1 - p) is in P and l from the start (OnlineSoftmax::init with rscale, step_scaled), so P is rounded to T with
// it, as SPEC 5's plain implementation rounds it: rounding P first and scaling O afterwards lost P's low bits where a
// large sink makes P subnormal in fp16 (10x the plain error at p = 0.9; tests/gpu/cases/edge-cases-sinkattn.json
// dropout-fwd-ws-fp16-sink-subnormal-p). kPaged: the plain variant for paged KV (a prefill chunk reading K / V
// through the page table): only the loading warp differs (fwd_ws_load, paged_kv_sm90.cuh).
template <typename T, int HD, int NC_, bool kBias = false, bool kDropout = false, bool kPaged = false, int QS = 1>
__global__ void __launch_bounds__(FwdWsTraits<HD, NC_, kBias, kDropout, QS>::kThreads, 1)
    fwd_sm90_ws_kernel(const Params p, const __grid_constant__ Sm90FwdTma tma, const int num_tiles) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(!(kBias && kDropout), "no variant with both (dispatch.cpp)");
  static_assert(!kPaged || (!kBias && !kDropout), "paged KV: the plain variant (validation refuses bias / dropout)");
  using Tr = FwdWsTraits<HD, NC_, kBias, kDropout, QS>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN;
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const FwdWsSmem<T, Tr> smem(smem_raw);
  // kBias: the block's bias tile is staged by TMA (uniform over the launch), else each consumer thread loads its
  // fragment from global memory.
  const bool bias_smem = Tr::kBiasStages > 0 && tma.bias_ok != 0;

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wg = warp >> 2;  // warpgroup 0: producer; 1 .. NC: consumers
  const int mblocks = (p.s_q + BM - 1) / BM;
  const bool heavy_last = p.window_right >= 0;

  if (tid == 0) smem.init_barriers();
  __syncthreads();

  // Everything a role needs of one tile (both roles compute it alike, so they agree on which tiles load).
  auto tile_at = [&](int64_t L) { return fwd_ws_tile<BM, BN>(p, L, mblocks, heavy_last); };

  if (wg == 0) {
    // ---------------- producer: one warp loads; the others give their registers away and wait at the end -------
    // (kDropout: they draw the keep bits)
    setmaxnreg_dec<Tr::kProducerRegs>();
    if constexpr (kDropout) {
      if (warp != 0)
        fwd_keep_producer<BM, BN, Tr::kKeepStages, Tr::kKeepThreads, Tr::kConsumerSlices / 2>(
            p, num_tiles, tile_at, smem.sKeep, smem.keep_full, smem.keep_empty, tid - 32);
    }
    // kPaged: warp 0 loads Q and K, warp 1 V (a key block of small pages is many TMA boxes; measured:
    // bench/log/2026-12-06-paged-prefill-hopper.md); else warp 0 loads all
    if (warp == 0 || (kPaged && warp == 1))
      fwd_ws_load<T, Tr, kPaged>(p, tma, smem, tile_at, num_tiles, lane, bias_smem,
                                 kPaged ? (warp == 0 ? kLoadQK : kLoadV) : kLoadAll);
  } else {
    // ---------------- consumers ----------------
    setmaxnreg_inc<Tr::kConsumerRegs>();
    // consumer c = wg - 1 (0 .. NC - 1), its thread tid - 128 of 128 NC
    fwd_ws_consumers<T, Tr, kBias, kDropout>(p, smem, tile_at, num_tiles, wg - 1, tid - 128, warp & 3, lane, bias_smem);
  }
#endif
}

}  // namespace sinkattn::cuda::sm90

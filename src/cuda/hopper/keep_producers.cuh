// CUDA backend, Hopper: the keep-bit producers of the dropout variants (SPEC.md section 2; the bits themselves:
// dropout.cuh, Dropout::keep_key_quad): threads that draw the Philox keep bits of a tile into shared memory while the
// math warpgroups compute, so that the tensor cores do not wait for the Philox chains.
//   keep_producer:     the dK dV kernel's third warpgroup at head dim 64 (bwd_dkdv_sm90.cuh, kDropout): the bits of
//                      every step into two buffers, handed over on the KeepBars mbarriers;
//   fwd_keep_producer: warps 1 .. 3 of the warp-specialised forward's producer warpgroup (fwd_sm90_ws.cuh,
//                      kDropout): the bits of the key-block slices the consumers leave, into a ring of stages.
#pragma once

#include <cstdint>

#include "cuda/dropout.cuh"
#include "cuda/hopper/sm90_common.cuh"
#include "cuda/mask.cuh"
#include "cuda/params.cuh"

namespace sinkattn::cuda::sm90 {

// The dK dV kernel's variant with a keep producer (DkvSm90Traits::kKeepProducer): named barrier kBarMath synchronises
// the math warpgroups alone (256 threads, their step barriers; 0 is __syncthreads). The keep buffers are handed over
// on mbarriers after sKeep (KeepBars): full[b] (128 arrivals, one per producer thread, after its stores) and empty[b]
// (256, one per math thread, after its loads; a warpgroup without work in the step arrives without waiting for
// full[b]: the math warpgroups' step barrier keeps it from arriving for a later step first). Named barriers
// (bar.arrive / bar.sync) did the same handover; racecheck reported hazards on sKeep under them
// (bench/log/2026-12-02-dropout-backward-producer.md, H200, 0bd71a3).
constexpr int kBarMath = 1;
struct KeepBars {
  uint64_t full[2], empty[2];
};

// A math thread's keep bits of one step of the dK dV kernel (kDropout): its fragment rows r0, r0 + 8 (keys) x the
// step's queries, in the kernel's lo / hi; DkvKeepBits(nt, e): element (nt, e) is kept. With the producer:
// take_keep_bits reads them from its buffer, shifted so that bit 8 nt + (e & 1) of lo (row r0) / hi (row r0 + 8) is
// element (nt, e)'s query column 8 nt + 2 t + (e & 1), and hands the buffer back. Without it (head dim 128): drawn
// by the thread while S^T / dP^T run (Dropout::keep_bits), bit 4 nt + e of lo.
template <int BN>
__device__ __forceinline__ void take_keep_bits(const uint64_t* sKeep, KeepBars* kb, int buf, int it, int r0, int t,
                                               uint64_t& lo, uint64_t& hi) {
  mbar_wait(&kb->full[buf], (it >> 1) & 1);
  lo = sKeep[buf * BN + r0] >> (2 * t);
  hi = sKeep[buf * BN + r0 + 8] >> (2 * t);
  mbar_arrive(&kb->empty[buf]);
}
template <bool kProducer>
struct DkvKeepBits {
  const uint64_t &lo, &hi;
  __device__ __forceinline__ bool operator()(int nt, int e) const {
    if constexpr (kProducer)
      return ((e >> 1 ? hi : lo) >> (8 * nt + (e & 1))) & 1u;
    else
      return (lo >> (4 * nt + e)) & 1u;
  }
};

// kDropout's keep producer, the third warpgroup (rt = 0 .. 127): for every step of the block, in the math warpgroups'
// order, the keep bits of the step's BM queries x BN keys into sKeep[b] (b = step % 2; row r, bit c: key j0 + r,
// query i0 + c), once the math warpgroups have read what the buffer held two steps before. Thread rt: keys j0 + 4 m
// .. + 3 (m = rt / 4) x queries i0 + 16 q .. + 15 (q = rt % 4), 16 Philox blocks (keep_key_quad), kIlp at a time; a
// group of kIlp queries that sees no key of the quad is skipped (bits 0: P = 0 there).
// bench/log/2026-12-02-dropout-backward-producer.md, H200, 0bd71a3: GPT-OSS full + dropout backward 8.2 -> 5.0 ms
// against the math warpgroups drawing the bits themselves between the S^T / dP^T issue and their waits (2 warps per
// scheduler, both in the same phase: the tensor cores wait while their Philox chains run; inferred, not profiled); 4
// blocks in flight per thread measured as fast as 8 and faster than 16.
template <int BM, int BN, typename Order, typename KeyTileT>
__device__ __forceinline__ void keep_producer(const Params& p, const KeyTileT& kt, const Mask& mk, int qb_lo, int nq,
                                              uint64_t* sKeep, KeepBars* kb, int rt) {
  static_assert(BM == 64 && BN == 128, "128 threads x (4 keys x 16 queries)");
  constexpr int kIlp = 4;
  const int m = rt >> 2, q = rt & 3;
  const int jq = kt.j0 + 4 * m;  // this thread's first key
  int vlo = 0, vhi = 0;          // queries that see a key of the quad
  if (jq < mk.len_kv) mk.query_range(jq, min(jq + 4, mk.len_kv), vlo, vhi);
  uint16_t* keep16 = reinterpret_cast<uint16_t*>(sKeep);
  const int iters = nq * p.group;
  int ih, iq;
  Order::first(nq, p.group, ih, iq);
  for (int it = 0; it < iters; ++it) {
    const int buf = it & 1;
    if (it >= 2) mbar_wait(&kb->empty[buf], ((it >> 1) - 1) & 1);  // the math threads' loads of step it - 2
    const Dropout dr(p, kt.n, kt.hk * p.group + ih);
    const int ib = (qb_lo + iq) * BM + 16 * q;
    uint32_t rows[4] = {0u, 0u, 0u, 0u};  // bit c: query ib + c, key jq + k
    auto draw = [&](auto aligned) {  // aligned: s_kv % 4 == 0 (Dropout::by_key_alignment), once per step
#pragma unroll 1
      for (int c0 = 0; c0 < 16; c0 += kIlp) {
        if (ib + c0 + kIlp > vlo && ib + c0 < vhi) {
          uint32_t kq[kIlp];
#pragma unroll
          for (int c = 0; c < kIlp; ++c)
            kq[c] = dr.template keep_key_quad<decltype(aligned)::value>(ib + c0 + c, jq, p.s_kv);
#pragma unroll
          for (int c = 0; c < kIlp; ++c)
#pragma unroll
            for (int k = 0; k < 4; ++k) rows[k] |= ((kq[c] >> k) & 1u) << (c0 + c);
        }
      }
    };
    Dropout::by_key_alignment(p.s_kv, draw);
#pragma unroll
    for (int k = 0; k < 4; ++k) keep16[(buf * BN + 4 * m + k) * 4 + q] = static_cast<uint16_t>(rows[k]);
    mbar_arrive(&kb->full[buf]);
    Order::next(nq, p.group, ih, iq);
  }
}

// kDropout's keep producer (warps 1 .. 3 of the producer warpgroup, rt = 0 .. 95): for every key block the consumers
// will visit, in their order (the ring position `it` counts the block's key blocks over its tiles, as theirs does),
// the keep bits of the tile's BM queries x BN keys (SPEC.md section 2, Dropout::keep_key_quad: 4 keys of one
// query per Philox block) into sKeep[it % KS] once the consumers have read what the stage held KS blocks before.
// Unit u = (row u / C, 16-key chunk CH0 + u % C; chunks below CH0 are the consumers' own, never written): 4 Philox
// blocks in flight when s_kv % 4 == 0 (keep_key_quad<true>; otherwise one block per key, drawn one after another),
// bits 0 for a row past len_q or a chunk the row sees no key of (P = 0 there). keep_full[s] takes
// one arrival per producer thread, keep_empty[s] one per consumer warp.
template <int BM, int BN, int KS, int NTHR, int CH0, typename TileAt>
__device__ __forceinline__ void fwd_keep_producer(const Params& p, int num_tiles, const TileAt& tile_at,
                                                  uint16_t* sKeep, uint64_t* keep_full, uint64_t* keep_empty,
                                                  int rt) {
  constexpr int C = BN / 16 - CH0, kUnits = BM * C;  // chunks CH0 .. BN / 16 - 1 of every row
  int it = 0;
  for (int64_t L = blockIdx.x; L < num_tiles; L += gridDim.x) {
    const auto t = tile_at(L);
    if (t.nblocks == 0) continue;
    const Mask mk(p, t.sq);
    const Dropout dr(p, t.n, t.h);
    for (int i = 0; i < t.nblocks; ++i, ++it) {
      const int s = it % KS, j0 = (t.nb_lo + i) * BN;
      mbar_wait(&keep_empty[s], ((it / KS) & 1) ^ 1);  // a fresh barrier's previous phase counts as complete
      uint16_t* dst = sKeep + s * BM * (BN / 16);
      auto draw = [&](auto aligned) {  // aligned: s_kv % 4 == 0 (Dropout::by_key_alignment), once per block
#pragma unroll 1
        for (int u = rt; u < kUnits; u += NTHR) {
          const int r = u / C, ch = CH0 + u % C, row = t.m0 + r, jc = j0 + 16 * ch;
          uint32_t bits = 0;
          if (row < t.sq.len_q) {
            int lo, hi;
            mk.key_range(row, row + 1, lo, hi);
            if (jc < hi && jc + 16 > lo) {
              uint32_t kq[4];
#pragma unroll
              for (int q = 0; q < 4; ++q)
                kq[q] = dr.template keep_key_quad<decltype(aligned)::value>(row, jc + 4 * q, p.s_kv);
              bits = kq[0] | kq[1] << 4 | kq[2] << 8 | kq[3] << 12;
            }
          }
          dst[r * (BN / 16) + ch] = static_cast<uint16_t>(bits);
        }
      };
      Dropout::by_key_alignment(p.s_kv, draw);
      mbar_arrive(&keep_full[s]);
    }
  }
}

// The warp-specialised forward's consumers (kDropout), after the softmax step of the key block at ring position ki:
// P * keep / (1 - p) for the P V product (s keeps the undropped P / (1 - p) up to here: l has summed it). Slices
// nt < kConsumerSlices from own (drawn by the thread, Dropout::keep_bits, bit 4 nt + e), the others from the words
// fwd_keep_producer wrote to stage ki % KS: the thread's rows g, g + 8 of warp wl of consumer c, keys 8 nt + 2 t +
// (e & 1) of the block (words shifted by 2 t; word 0, keys 0 .. 63, only where the producer drew some of them); the
// stage is handed back (release: the warp's arrival on keep_empty) once read.
template <typename Tr, int NT, typename Release>
__device__ __forceinline__ void drop_p_fwd(float (&s)[NT][4], uint64_t own, const uint16_t* sKeep, uint64_t* keep_full,
                                           uint64_t* keep_empty, int ki, int c, int wl, int lane,
                                           const Release& release) {
  constexpr int KS = Tr::kKeepStages, kCS = Tr::kConsumerSlices;
  const int ks = ki % KS;
  mbar_wait(&keep_full[ks], static_cast<uint32_t>((ki / KS) & 1));
  const uint16_t* kr = sKeep + ks * Tr::kKeepTile + (c * 64 + wl * 16 + (lane >> 2)) * Tr::kKeepChunks;
  static_assert(Tr::kBlockN == 128, "two 64-bit words of keep bits per row");
  const uint64_t* k0 = reinterpret_cast<const uint64_t*>(kr);
  const uint64_t* k8 = reinterpret_cast<const uint64_t*>(kr + 8 * Tr::kKeepChunks);
  const int sh = 2 * (lane & 3);
  constexpr bool kWord0 = kCS < 8;
  const uint64_t w[2][2] = {{kWord0 ? k0[0] >> sh : 0, k0[1] >> sh}, {kWord0 ? k8[0] >> sh : 0, k8[1] >> sh}};
  release(&keep_empty[ks]);
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const bool kept = nt < kCS ? (own >> (4 * nt + e)) & 1u : (w[e >> 1][nt >> 3] >> (8 * (nt & 7) + (e & 1))) & 1u;
      if (!kept) s[nt][e] = 0.f;
    }
}

}  // namespace sinkattn::cuda::sm90

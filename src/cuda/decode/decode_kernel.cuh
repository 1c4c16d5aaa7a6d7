// CUDA backend: the decode kernel (SPEC.md section 2 for s_q = 1 .. 16 query rows per sequence, dense or varlen
// queries, contiguous or paged KV), flash-decoding style (NOTES-kernels.md, "Decode and paged KV").
//
// Grid (m_blocks * num_splits, h_kv, b): one CTA per (block of packed rows, split of the key range, KV head,
// sequence). The query heads of a KV group are packed into the M dimension of the tile: packed row R = i * group + g
// is query row i of head hk * group + g (GQA 8, s_q = 1: 8 rows of one 16-row tile, instead of 1 row per head), so
// one CTA streams the KV head's keys once for all its query heads.
//
// Keys: the union of the block's visible bands [k_lo, k_hi) (mask.cuh), in tiles of kBlockN keys starting at
// k_lo rounded down to 16; tiles (and pages) outside the band are never read, so a sliding window reads only the
// window. The tiles are cut into num_splits splits of consecutive tiles; rows of a tile outside [k_lo, k_hi) are
// zero-filled without being read (paged_kv.cuh: neither are their page-table entries). K and V tiles stream
// through a kStages-deep cp.async ring.
//
// Q in registers (QR, the configuration for short key ranges: a sliding window's row sees at most 3 tiles): the
// warps read their Q fragments once, and Q's shared memory is the ring's last K buffer, which the first key tile's
// refill overwrites only after a barrier that follows those reads. With 3 stages the block then takes 55,296 bytes
// at head dim 64 and 16 rows, and 4 blocks fit on an SM (228 KiB, 1 KiB reserved per block) where 3 fit with Q
// stored beside a 4-stage ring (76,032 bytes): one block streams a short range's few tiles and exits, so the warps
// resident at once, not the ring's depth, hide the chain sequence length -> page table -> K / V.
//
// Warps: 4 per CTA, kWM along M (16 * kMT rows each) x WN along the keys of a tile (kBlockN / WN keys each): every
// warp runs its own online softmax (softmax.cuh) over its keys; at the end the WN partial states of a row are
// merged in shared memory (m = max m_w, l = sum l_w 2^(m_w - m), acc likewise). With one warp along M (WN = 4:
// the configurations of 16 and 32 packed rows), a warp's 16 keys of a tile are read by it alone, so each warp
// loads its own K / V rows into the ring and waits for its own copies (__syncwarp): the warps step through the
// tiles without a block barrier, and each lane looks up one row's page where the block loader's threads look up
// four (paged_kv.cuh, load_kv_warp_rows_async).
//
// The sink (SPEC 2, NOTES-kernels.md): the split num_splits - 1 carries it, as an already-seen key of warp column 0
// (OnlineSoftmax::init(sigma)); every other split and warp starts vanilla. Without splits the CTA writes out and
// softmax_lse itself (dense padding rows i >= len_q: out = 0, LSE = sigma). With splits every split, also an empty
// one, makes its partial (o = acc / l, lse; an empty split: o = 0, lse = -inf, or sigma for the carrying one):
//   - in global memory (ws_o_part, ws_lse_part) for the rows i < len_q, merged by decode_combine.cuh's kernel;
//   - or, Params::decode_cluster (Hopper, 2 .. kDecodeClusterMaxSplits splits), in its own shared memory: the splits
//     of a block of rows are one thread-block cluster (block rank = split), and after a cluster barrier block c
//     merges rows c, c + S, ... of every split's partial, read through distributed shared memory, by the combine
//     kernel's formula (lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) o_s), for all of the block's rows
//     (dense padding rows too: only the carrying split has their lse, sigma, and every o_s is 0); a second cluster
//     barrier keeps every block's shared memory until its peers have read it. One kernel, no workspace.
#pragma once

#include <cooperative_groups.h>

#include "cuda/common.cuh"
#include "cuda/decode/decode_merge.cuh"
#include "cuda/decode/decode_rules.hpp"
#include "cuda/mainloop.cuh"
#include "cuda/mask.cuh"
#include "cuda/paged_kv.cuh"
#include "cuda/params.cuh"
#include "cuda/softmax.cuh"

namespace sinkattn::cuda {

// The merge's shared memory, over the dead tiles: each warp column's acc (its own m), m (base 2), l, the factor
// 2^(m_w - m) / l of column w, the natural-log LSE of each row, and the cluster combine's weights.
template <int BM, int WN, int AL>
struct DecodeMergeSmem {
  float* acc;  // [WN][BM][AL]
  float* m;    // [WN][BM]
  float* l;    // [WN][BM]
  float* f;    // [WN][BM]
  float* lse;  // [BM]
  float* w;    // [BM][kDecodeClusterMaxSplits]
  static constexpr int kBytes = (WN * BM * AL + 3 * WN * BM + BM + BM * kDecodeClusterMaxSplits) * 4;
  __device__ __forceinline__ explicit DecodeMergeSmem(unsigned char* raw)
      : acc(reinterpret_cast<float*>(raw)), m(acc + WN * BM * AL), l(m + WN * BM), f(l + WN * BM), lse(f + WN * BM),
        w(lse + BM) {}
};

// Tile shapes. HD: head-dim tile (64 or 128); MT: m-tiles of 16 rows per warp; WN: warps along the keys; QR: Q in
// registers, 3 stages (above).
template <int HD, int MT, int WN, bool QR = false>
struct DecodeTraits {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kWM = kWarps / WN;
  static constexpr int kBlockM = 16 * MT * kWM;  // packed rows per CTA
  // keys per tile: 64; 32 for head dim 128 with one warp along the keys (32 query rows x 64 keys of scores beside
  // a 32 x 128 accumulator per warp would spill)
  static constexpr int kBlockN = HD > 64 && WN == 1 ? 32 : 64;
  static constexpr int kKeysPerWarp = kBlockN / WN;
  static constexpr int kStages = HD <= 64 && !QR ? 4 : 3;
  static constexpr int kStride = HD + 8;     // bf16 / fp16 rows in shared memory
  static constexpr int kAccStride = HD + 4;  // fp32 rows of the merge
  static constexpr int kSmemTiles = ((QR ? 0 : kBlockM) + 2 * kStages * kBlockN) * kStride * 2;
  static constexpr int kSmemMerge = DecodeMergeSmem<kBlockM, WN, kAccStride>::kBytes;  // the merge, after the tiles
  static constexpr int kSmem = kSmemTiles > kSmemMerge ? kSmemTiles : kSmemMerge;
  // __launch_bounds__ minimum blocks per SM: what 227 KiB of shared memory holds (1 KiB reserved per block)
  static constexpr int kMinBlocks = (227 * 1024) / (kSmem + 1024) < 1 ? 1 : (227 * 1024) / (kSmem + 1024);
  static_assert(kWarps % WN == 0 && kKeysPerWarp % 16 == 0, "tile shape");
  static_assert(!QR || kBlockM <= kBlockN, "Q fits in a K buffer of the ring");
  // With one warp along M (WN = kWarps), no two warps read the same keys: each loads its own (kOwnKeys).
  static constexpr bool kOwnKeys = WN == kWarps;
  static_assert(!kOwnKeys || kKeysPerWarp == 16, "a warp's keys: 16 rows (load_kv_warp_rows_async)");
};

// The configurations compiled: index -> (MT, WN, QR), kBlockM = 16, 32, 64, 128 packed rows; 4: 16 rows with Q in
// registers (head-dim tile 64 only: kDecodeShortConfig, for rows that see few tiles; decode.cu's plan).
constexpr int kDecodeConfigs = 5;
constexpr int kDecodeShortConfig = 4;
constexpr int kDecodeMT[kDecodeConfigs] = {1, 2, 2, 2, 1};
constexpr int kDecodeWN[kDecodeConfigs] = {4, 4, 2, 1, 4};
constexpr bool kDecodeQR[kDecodeConfigs] = {false, false, false, false, true};
constexpr int kDecodeBlockM[kDecodeConfigs] = {16, 32, 64, 128, 16};

// The cluster combine (Params::decode_cluster; the file comment): every split's partial of the block's rows is in its
// block's shared memory: o (normalised) at sO[r * AL + col], its LSE at sLse[r]. Block `rank` (= split) merges rows
// rank, rank + S, ...: per row the weights w_s = exp(lse_s - lse) into sW, then out = sum_s w_s o_s and
// softmax_lse = lse (decode_merge.cuh's formula, as the combine kernel's). Cluster barriers before (the partials are
// written) and after (the peers have read them).
template <typename T, int HD, int BM, int NTH, int AL, typename RowFn, typename HeadFn>
__device__ __forceinline__ void cluster_combine(const Params& p, float* sO, float* sLse, float* sW, int rank,
                                                int rows_here, int R0, int n, const SeqInfo& sq,
                                                const RowFn& query_row, const HeadFn& head_of) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  const cg::cluster_group cl = cg::this_cluster();
  const int S = p.num_splits, tid = static_cast<int>(threadIdx.x);
  const int mine = rows_here > rank ? (rows_here - rank + S - 1) / S : 0;  // rows this block merges
  cl.sync();
  for (int rr = tid; rr < mine; rr += NTH) {
    const int r = rank + rr * S;
    float ls[kDecodeClusterMaxSplits];
    float mx = -INFINITY;
#pragma unroll
    for (int s = 0; s < kDecodeClusterMaxSplits; ++s) {
      ls[s] = s < S ? *cl.map_shared_rank(sLse + r, s) : -INFINITY;
      mx = fmaxf(mx, ls[s]);
    }
    float sum = 0.f;
    if (mx != -INFINITY) {
#pragma unroll
      for (int s = 0; s < kDecodeClusterMaxSplits; ++s) sum += merge_term(ls[s], mx);
    }
    const float lse = merged_lse(mx, sum);
#pragma unroll
    for (int s = 0; s < kDecodeClusterMaxSplits; ++s)
      sW[rr * kDecodeClusterMaxSplits + s] = merge_weight(ls[s], lse);
    const int R = R0 + r, i = query_row(R);
    p.softmax_lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, head_of(R, i), sq.q_start + i)] = lse;
  }
  __syncthreads();
  constexpr int kPairs = HD / 2;
  for (int idx = tid; idx < mine * kPairs; idx += NTH) {
    const int rr = idx / kPairs, col = 2 * (idx % kPairs);
    if (col >= p.d_v) continue;
    const int r = rank + rr * S;
    float a0 = 0.f, a1 = 0.f;
    for (int s = 0; s < S; ++s) {  // a split of weight 0 (no key, no sink) is not read
      const float w = sW[rr * kDecodeClusterMaxSplits + s];
      if (w != 0.f) {
        const float2 o = *reinterpret_cast<const float2*>(cl.map_shared_rank(sO + r * AL + col, s));
        a0 += w * o.x;
        a1 += w * o.y;
      }
    }
    const int R = R0 + r, i = query_row(R);
    T* out = row_ptr<T>(p.out, p.out_st, n, sq.q_start + i, head_of(R, i)) + col;
    *reinterpret_cast<uint32_t*>(out) = ElemTraits<T>::pack(a0, a1);
  }
  cl.sync();
#else
  (void)p, (void)sO, (void)sLse, (void)sW, (void)rank, (void)rows_here, (void)R0, (void)n, (void)sq, (void)query_row,
      (void)head_of;
  __trap();  // the dispatch clusters decode splits on compute capability 9.0 and above only
#endif
}

// The visible key range [lo, hi) and the sink (or -inf) of each of a thread's fragment rows (mt, g4 + 8 rr), packed
// row R = R0 + warp_m * 16 MT + mt * 16 + g4 + 8 rr: empty for padding rows (R >= valid_packed) and rows past the
// sequence; the sink only in the carrying split's warp column 0.
template <int MT, typename RowFn, typename HeadFn>
__device__ __forceinline__ void fragment_rows(const Params& p, const Mask& mk, int (&lo)[MT][2], int (&hi)[MT][2],
                                              float (&sig)[MT][2], int R0, int warp_m, int warp_n, int g4,
                                              int rows_packed, int valid_packed, bool carries_sink,
                                              const RowFn& query_row, const HeadFn& head_of) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int R = R0 + warp_m * 16 * MT + mt * 16 + g4 + 8 * rr;
      lo[mt][rr] = hi[mt][rr] = 0;
      sig[mt][rr] = -INFINITY;
      if (R < rows_packed) {
        const int i = query_row(R);
        if (R < valid_packed) mk.key_range(i, i + 1, lo[mt][rr], hi[mt][rr]);
        if (carries_sink && warp_n == 0) sig[mt][rr] = sink_value(p, head_of(R, i));
      }
    }
}

// Q's packed rows of the block into sQ (zero beyond the real queries, beyond d, and where the split has no tile), a
// compile-time count of 16-byte chunks a thread.
template <typename T, int HD, int BM, int NTH, int LD, typename RowFn, typename HeadFn>
__device__ __forceinline__ void decode_load_q(const Params& p, T* sQ, int R0, int valid_packed, int n,
                                              const SeqInfo& sq, bool has_tiles, int tid, const RowFn& query_row,
                                              const HeadFn& head_of) {
  constexpr int kChunks = HD / 8;
  const T* q = static_cast<const T*>(p.q);
#pragma unroll 4
  for (int it = 0; it < (BM * kChunks + NTH - 1) / NTH; ++it) {
    const int idx = tid + it * NTH;
    if ((BM * kChunks) % NTH != 0 && idx >= BM * kChunks) break;
    const int r = idx / kChunks, cc = idx % kChunks;
    const int R = R0 + r;
    const bool ok = R < valid_packed && cc * 8 < p.d && has_tiles;
    const T* src = q;
    if (ok) {
      const int i = query_row(R);
      src = row_ptr<const T>(p.q, p.q_st, n, sq.q_start + i, head_of(R, i)) + cc * 8;
    }
    cp_async16(sQ + r * LD + cc * 8, src, ok);
  }
}

// Merges the WN warp columns' online-softmax states of every row: m = max m_w, l = sum l_w 2^(m_w - m), the factors
// 2^(m_w - m) / l (0 for a row that saw nothing) and lse = natural_lse(m, l, sigma). Ends with a block barrier.
template <int MT, int NT, int NO, int WN, int BM, int NTH, int AL, typename RowFn, typename HeadFn>
__device__ __forceinline__ void merge_warp_columns(const Params& p, const DecodeMergeSmem<BM, WN, AL>& ms,
                                                   const OnlineSoftmax<NT> (&sm)[MT], const float (&acc)[MT][NO][4],
                                                   int warp_m, int warp_n, int lane, int tid, int R0,
                                                   const RowFn& query_row, const HeadFn& head_of) {
  const int g4 = lane >> 2, t4 = lane & 3;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int r = warp_m * 16 * MT + mt * 16 + g4 + 8 * rr;
      const float lt = quad_sum(sm[mt].l[rr]);
      if (t4 == 0) {
        ms.m[warp_n * BM + r] = sm[mt].m[rr];
        ms.l[warp_n * BM + r] = lt;
      }
#pragma unroll
      for (int o = 0; o < NO; ++o) {
        float* dst = ms.acc + (warp_n * BM + r) * AL + o * 8 + 2 * t4;
        dst[0] = acc[mt][o][2 * rr];
        dst[1] = acc[mt][o][2 * rr + 1];
      }
    }
  __syncthreads();
  for (int r = tid; r < BM; r += NTH) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < WN; ++w) m = fmaxf(m, ms.m[w * BM + r]);
    float l = 0.f;
    if (m != -INFINITY) {
#pragma unroll
      for (int w = 0; w < WN; ++w) l += ms.l[w * BM + r] * fast_exp2(ms.m[w * BM + r] - m);
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
#pragma unroll
    for (int w = 0; w < WN; ++w) ms.f[w * BM + r] = l > 0.f ? fast_exp2(ms.m[w * BM + r] - m) * inv : 0.f;
    const int R = R0 + r;
    ms.lse[r] = natural_lse(m, l, sink_value(p, head_of(R, query_row(R))));
  }
  __syncthreads();
}

// The merged rows' o = sum_w f_w acc_w, HD / 2 column pairs a row (a compile-time count; pairs at or past d_v / 2
// skipped): to out without splits, to the split's partial in the workspace, or (cluster) in place of warp column
// 0's acc for cluster_combine (each thread alone read its pair).
template <typename T, int HD, int WN, int BM, int NTH, int AL, typename RowFn, typename HeadFn>
__device__ __forceinline__ void write_merged_rows(const Params& p, const DecodeMergeSmem<BM, WN, AL>& ms, int rows_here,
                                                  int split, bool split_kv, bool cluster, int R0, int n,
                                                  const SeqInfo& sq, int tid, const RowFn& query_row,
                                                  const HeadFn& head_of) {
  constexpr int kPairs = HD / 2;
#pragma unroll 4
  for (int it = 0; it < (BM * kPairs + NTH - 1) / NTH; ++it) {
    const int idx = tid + it * NTH;
    const int r = idx / kPairs, col = 2 * (idx % kPairs);
    if (r >= rows_here || col >= p.d_v) continue;
    float v0 = 0.f, v1 = 0.f;
#pragma unroll
    for (int w = 0; w < WN; ++w) {
      const float f = ms.f[w * BM + r];
      v0 += ms.acc[(w * BM + r) * AL + col] * f;
      v1 += ms.acc[(w * BM + r) * AL + col + 1] * f;
    }
    if (cluster) {
      *reinterpret_cast<float2*>(ms.acc + r * AL + col) = make_float2(v0, v1);
      continue;
    }
    const int R = R0 + r, i = query_row(R), h = head_of(R, i);
    if (split_kv) {
      const int64_t at = (static_cast<int64_t>(split) * p.h_q + h) * p.rows_total_q + ws_row(p, sq, n, i);
      *reinterpret_cast<float2*>(p.ws_o_part + at * p.d_v + col) = make_float2(v0, v1);
    } else {
      T* out = row_ptr<T>(p.out, p.out_st, n, sq.q_start + i, h) + col;
      *reinterpret_cast<uint32_t*>(out) = ElemTraits<T>::pack(v0, v1);
    }
  }
}

template <typename T, int HD, int MT, int WN, bool QR = false>
__global__ void __launch_bounds__(DecodeTraits<HD, MT, WN, QR>::kThreads, DecodeTraits<HD, MT, WN, QR>::kMinBlocks)
    decode_kernel(const Params p) {
  using Tr = DecodeTraits<HD, MT, WN, QR>;
  constexpr int BM = Tr::kBlockM, BN = Tr::kBlockN, LD = Tr::kStride, KW = Tr::kKeysPerWarp, NT = KW / 8;
  constexpr int NO = HD / 8, ST = Tr::kStages, NTH = Tr::kThreads, AL = Tr::kAccStride;
  extern __shared__ __align__(16) unsigned char smem_raw[];
  T* sK = reinterpret_cast<T*>(smem_raw) + (QR ? 0 : BM * LD);  // [ST][BN][LD]
  T* sV = sK + ST * BN * LD;                                      // [ST][BN][LD]
  T* sQ = QR ? sK + (ST - 1) * BN * LD : reinterpret_cast<T*>(smem_raw);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int warp_m = warp / WN, warp_n = warp % WN;
  const int g4 = lane >> 2, t4 = lane & 3;
  const int mb = static_cast<int>(p.splits_div.div(blockIdx.x));
  const int split = static_cast<int>(blockIdx.x) - mb * p.num_splits;
  const int hk = blockIdx.y, n = blockIdx.z;
  const int group = p.group;
  // packed row R -> query row i = R / group and query head hk * group + R % group (p.group_div: no division)
  auto query_row = [&](int R) { return static_cast<int>(p.group_div.div(static_cast<uint32_t>(R))); };
  auto head_of = [&](int R, int i) { return hk * group + (R - i * group); };
  const SeqInfo sq = seq_info(p, n);
  const int R0 = mb * BM;                        // first packed row of the block
  const int rows_packed = sq.rows_q * group;     // rows this sequence owns (dense: padding rows too)
  const int valid_packed = sq.len_q * group;     // rows of real queries
  if (R0 >= rows_packed) return;
  const bool split_kv = p.num_splits > 1;
  const bool cluster = split_kv && p.decode_cluster != 0;  // the splits combine in the cluster (uniform in it)
  if (split_kv && !cluster && R0 >= valid_packed) return;  // padding only: the combine kernel writes it

  // ---- the block's key range and this split's tiles ----
  const Mask mk(p, sq);
  int k_lo = 0, k_hi = 0;
  if (R0 < valid_packed) mk.key_range(query_row(R0), query_row(min(R0 + BM, valid_packed) - 1) + 1, k_lo, k_hi);
  const int t_base = k_lo & ~15;
  const int tiles = k_hi > k_lo ? (k_hi - t_base + BN - 1) / BN : 0;
  const int per = static_cast<int>(p.splits_div.div(static_cast<uint32_t>(tiles + p.num_splits - 1)));
  const int tile_lo = min(tiles, split * per), tile_hi = min(tiles, tile_lo + per);
  const bool carries_sink = split == p.num_splits - 1;

  // ---- this thread's rows: visible key range and sink per fragment row (mt, g4 + 8 rr) ----
  int lo[MT][2], hi[MT][2];
  float sig[MT][2];
  fragment_rows<MT>(p, mk, lo, hi, sig, R0, warp_m, warp_n, g4, rows_packed, valid_packed, carries_sink, query_row,
                    head_of);

  // ---- Q: packed rows (zero beyond the real queries and beyond d) ----
  decode_load_q<T, HD, BM, NTH, LD>(p, sQ, R0, valid_packed, n, sq, tile_lo < tile_hi, tid, query_row, head_of);
  const KvRows kr(p, sq, n, hk);
  const T* kp = static_cast<const T*>(p.k);
  const T* vp = static_cast<const T*>(p.v);
  // kOwnKeys: the warp loads the K / V rows of its own keys of every tile and waits for its own copies (__syncwarp);
  // else the block loads whole tiles (__syncthreads).
  constexpr bool kOwnKeys = Tr::kOwnKeys;
  auto load_tile = [&](int t) {
    const int stage = (t - tile_lo) % ST;
    if constexpr (kOwnKeys) {
      const int j0 = t_base + t * BN + warp_n * KW, at = stage * BN * LD + warp_n * KW * LD;
      load_kv_warp_rows_async<HD>(sK + at, sV + at, kp, vp, kr, j0, k_lo - j0, k_hi - j0, p.d, p.d_v, lane);
    } else {
      const int j0 = t_base + t * BN;
      load_kv_tiles_async<BN, HD, NTH>(sK + stage * BN * LD, sV + stage * BN * LD, kp, vp, kr, j0, k_lo - j0, k_hi - j0,
                                       p.d, p.d_v, tid);
    }
  };
  auto sync_tile = [] {
    if constexpr (kOwnKeys)
      __syncwarp();
    else
      __syncthreads();
  };
#pragma unroll
  for (int s = 0; s < ST - 1; ++s) {
    if (tile_lo + s < tile_hi) load_tile(tile_lo + s);
    cp_async_commit();  // one group per stage, empty or not, so that the wait below counts stages
  }

  // Q (every warp reads rows other warps copied): once tile_lo's group (which holds Q's copies) has landed, a block
  // barrier. QR: the warps then read their Q fragments, and a second barrier precedes the refill of the buffer Q
  // occupies (the first tile's loads in the loop, which with kOwnKeys no block barrier precedes).
  uint32_t qa[QR ? HD / 16 : 1][MT][4];
  (void)qa;
  if constexpr (QR || kOwnKeys) {
    cp_async_wait<ST - 2>();
    __syncthreads();
  }
  if constexpr (QR) {
    load_a_m<MT, HD, LD>(qa, sQ + warp_m * 16 * MT * LD, lane);
    __syncthreads();
  }

  OnlineSoftmax<NT> sm[MT];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) sm[mt].init(sig[mt][0], sig[mt][1], lane);
  float acc[MT][NO][4];
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) zero_acc(acc[mt]);

  for (int t = tile_lo; t < tile_hi; ++t) {
    cp_async_wait<ST - 2>();  // tile t has landed
    sync_tile();              // ... for every thread that reads it, and each is done with the stage refilled next
    if (t + ST - 1 < tile_hi) load_tile(t + ST - 1);
    cp_async_commit();
    const int stage = (t - tile_lo) % ST;
    const int j0 = t_base + t * BN + warp_n * KW;  // this warp's first key
    float s[MT][NT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) zero_acc(s[mt]);
    if constexpr (QR)
      gemm_abt_m_reg<T, MT, NT, HD, LD>(s, qa, sK + stage * BN * LD + warp_n * KW * LD, lane);
    else
      gemm_abt_m<T, MT, NT, HD, LD>(s, sQ + warp_m * 16 * MT * LD, sK + stage * BN * LD + warp_n * KW * LD, lane);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      // S_ij = softmax_scale * q_i . k_j in base 2, -inf outside the row's visible keys (SPEC 2, masks)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int j = j0 + nt * 8 + 2 * t4 + (e & 1), rr = e >> 1;
          s[mt][nt][e] = (j >= lo[mt][rr] && j < hi[mt][rr]) ? s[mt][nt][e] * p.scale_log2 : -INFINITY;
        }
      float alpha[2];
      sm[mt].step(s[mt], alpha);
      rescale_rows(acc[mt], alpha);
    }
    gemm_pb_m<T, MT, NT, NO, LD>(acc, s, sV + stage * BN * LD + warp_n * KW * LD, lane);
  }
  // The key loop is done: the split combine, launched after this grid with KernelChoice::decode_pdl, may start once
  // every block is here (it waits for this grid's end before it reads a partial).
  if (split_kv && !cluster) pdl_launch_dependents();
  cp_async_wait<0>();
  __syncthreads();  // the tiles are dead: the merge reuses shared memory

  // ---- merge the WN warp columns of every row (shared memory), then write ----
  const DecodeMergeSmem<BM, WN, AL> ms(smem_raw);
  merge_warp_columns<MT, NT, NO, WN, BM, NTH, AL>(p, ms, sm, acc, warp_m, warp_n, lane, tid, R0, query_row, head_of);
  const int rows_here = min(BM, (split_kv && !cluster ? valid_packed : rows_packed) - R0);
  write_merged_rows<T, HD, WN, BM, NTH, AL>(p, ms, rows_here, split, split_kv, cluster, R0, n, sq, tid, query_row,
                                            head_of);
  if (cluster) {
    cluster_combine<T, HD, BM, NTH, AL>(p, ms.acc, ms.lse, ms.w, split, rows_here, R0, n, sq, query_row, head_of);
    return;
  }
  for (int r = tid; r < rows_here; r += NTH) {
    const int R = R0 + r, i = query_row(R), h = head_of(R, i);
    if (split_kv)
      p.ws_lse_part[(static_cast<int64_t>(split) * p.h_q + h) * p.rows_total_q + ws_row(p, sq, n, i)] = ms.lse[r];
    else
      p.softmax_lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, sq.q_start + i)] = ms.lse[r];
  }
}

}  // namespace sinkattn::cuda

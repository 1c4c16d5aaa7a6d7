// fp32 path of the CUDA backend: the per-thread work of every pass, written once as __host__ __device__
// functions so the same code runs in the kernels (fwd_f32.cu, bwd_f32.cu) and in a host emulation (tests).
// Plain SIMT fp32 code: fp32 inputs, fp32 math and accumulation, except D_i and dP_ij, accumulated in double
// (preprocess_row says why; SPEC.md sections 1, 5: 1e-5 / 1e-4).
//
// Work decomposition (no float atomics anywhere, so every output is bitwise reproducible):
//   forward    one thread per (n, h, query row i): online softmax over the row's visible keys (SPEC.md 2)
//   preprocess one thread per (n, h, i): D_i = dot(d_out_i, out_i), D_i - d_lse_i, and the d_sinks term
//              P_sink_i * (d_lse_i - D_i) of the row (SPEC.md 3)
//   d_sinks    one block per query head: fixed-order sum of the row terms (written, never accumulated into)
//   dq         one thread per (n, h, i): dq_i = softmax_scale * sum_j dS_ij k_j, dS_ij written for d_bias
//   dk dv      one thread per (n, kv head, key j): loops over the group's query heads and the query rows that
//              see key j: dk_j = softmax_scale * sum dS_ij q_i, dv_j = sum P_ij keep_ij / (1 - p) d_out_i
//   d_bias     one thread per d_bias element: fixed-order sum of dS over the broadcast dimensions
// Only the visible keys [lo, hi) of a row (and the visible rows of a key) are ever read: masked, padded and
// out-of-window values never enter arithmetic (SPEC.md 2, "must not reach any output").
#pragma once

#include <cmath>
#include <cstdint>

#include "common/mask.hpp"
#include "common/rows.hpp"
#include "common/seq.hpp"
#include "common/sink.hpp"
#include "core/kv_rows.hpp"
#include "core/philox.hpp"

#if defined(__CUDACC__)
#define F32_HD __host__ __device__ __forceinline__
#else
#define F32_HD inline
#endif
// `#pragma unroll` of the device code: these functions are compiled for the host too, whose compiler has no such
// pragma.
#if defined(__CUDA_ARCH__)
#define F32_UNROLL _Pragma("unroll")
#else
#define F32_UNROLL
#endif

namespace sinkattn::cuda_f32 {

// Keys per chunk of the row loops (forward, dq) and query rows per chunk of the dk/dv loop.
constexpr int kKeyChunk = 8;
constexpr int kRowChunk = 8;
constexpr int kThreads = 128;       // threads per block of the row / key kernels
constexpr int kReduceThreads = 256; // threads of the d_sinks reduction block

// DESIGN.md "Row addressing" (common/rows.hpp): element (n, row, head, col) is ptr[row_offset(st, n, row, head) + col].
using Rows = sinkattn::RowStrides;

// The kernel-side call (filled from sinkattn::Call by make_kparams, f32_params.hpp). Pointers are device
// pointers on the GPU (host pointers in the host emulation); absent tensors are nullptr. The batch description
// (SPEC.md 1: the int32 batch tensors, in device memory on the GPU, and the extents s_q, s_kv) is common/seq.hpp's
// BatchTensors.
struct KParams : BatchTensors {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* out = nullptr;         // forward: written; backward: read (D_i)
  float* lse = nullptr;         // forward: written; backward: read
  const float* d_out = nullptr;
  const float* d_lse = nullptr;
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  float* d_sinks = nullptr;
  const float* bias = nullptr;  // fp32 (bias dtype is fp32 or q's = fp32)
  float* d_bias = nullptr;
  const float* sinks = nullptr;
  int64_t sinks_st = 0, d_sinks_st = 0;

  Rows q_st, k_st, v_st, out_st, dout_st, dq_st, dk_st, dv_st;  // paged: k_st / v_st = {page, row in page, head}
  int64_t pt_n = 0, pt_p = 0, page_size = 1;  // paged KV (BatchTensors::page_table): page-table strides, page size
  int64_t lse_b = 0, lse_h = 0, lse_s = 0;
  int64_t dlse_b = 0, dlse_h = 0, dlse_s = 0;
  int64_t bias_b = 0, bias_h = 0, bias_i = 0, bias_j = 0;     // 0 on broadcast dims
  int64_t dbias_b = 0, dbias_h = 0, dbias_i = 0, dbias_j = 0; // d_bias tensor strides
  int64_t bias_nb = 0, bias_nh = 0;                           // d_bias extents: 1 or b, 1 or h_q
  // Where the dq pass writes dS_ij: d_bias itself (no broadcast dim) or the fp32 workspace [b][h_q][s_q][s_kv]
  // that the d_bias pass reduces over the broadcast dims.
  float* ds_dst = nullptr;
  int64_t ds_b = 0, ds_h = 0, ds_i = 0, ds_j = 0;


  // Sizes (s_q / s_kv, from BatchTensors: the dense extents or varlen max_seqlen_q / max_seqlen_kv).
  int64_t b = 0, h_q = 0, h_kv = 0, group = 1, d = 0, d_v = 0, total_q = 0, total_kv = 0;

  sinkattn_softmax_type_t softmax_type = SINKATTN_SOFTMAX_VANILLA;
  float scale = 1.f;     // softmax_scale
  int64_t wl = -1, wr = -1;  // window_left / window_right (-1 unbounded; Call's clamp, common/mask.hpp)
  int align_br = 1;          // bottom-right alignment

  int dropout = 0;
  uint32_t threshold = 0;
  float rdrop = 1.f;              // 1 / (1 - p)
  const int64_t* rng_in = nullptr;  // forward: rng_seed_offset (optional); backward: rng_state
  int64_t rng_in_st = 0;
  uint64_t seed = 0, offset = 0;  // used when rng_in is null
  int64_t* rng_out = nullptr;     // forward: rng_state (optional)
  int64_t rng_out_st = 0;

  // Backward workspace, rows indexed densely by n * s_q + i (varlen too).
  double* ws_dm = nullptr;    // [h_q][b * s_q]: D_i - d_lse_i (double: dS_ij = P_ij (dP_ij - D_i) cancels)
  float* ws_dsink = nullptr;  // [h_q][b * s_q]: P_sink_i * (d_lse_i - D_i); 0 on padding rows (learnable only)
};

// ---------------------------------------------------------------- sequences and masks

// One sequence's place in the tensors (SPEC.md 1, DESIGN.md "Actual lengths"; common/seq.hpp), held inside the
// extents the grids cover (s_q, s_kv), so a call that breaks the max_seqlen contract cannot index outside.
using Seq = SeqSpan<int64_t>;

F32_HD Seq seq_of(const KParams& p, int64_t n) {
  return clamp_to_extents(seq_span<int64_t>(p, n), p.s_q, p.s_kv);
}

// SPEC.md 2, masks (common/mask.hpp). keys / queries: the range of one row / one key, empty as [0, 0) so that a row
// past the keys (lo > len_kv) never indexes beyond them.
struct Mask {
  BandMask<int64_t> m;
  F32_HD Mask(const KParams& p, const Seq& s) : m(p.align_br != 0, p.wl, p.wr, s.len_q, s.len_kv) {}
  // Keys [lo, hi) visible to query row i.
  F32_HD void keys(int64_t i, int64_t* lo, int64_t* hi) const {
    m.key_range(i, i + 1, *lo, *hi);
    if (*hi <= *lo) *lo = *hi = 0;
  }
  // Query rows [lo, hi) that see key j.
  F32_HD void queries(int64_t j, int64_t* lo, int64_t* hi) const {
    m.query_range(j, j + 1, *lo, *hi);
    if (*hi <= *lo) *lo = *hi = 0;
  }
};

// sigma of SPEC.md 2 (common/sink.hpp). Never scaled.
F32_HD float sink_of(const KParams& p, int64_t h) { return sink_sigma(p.softmax_type, p.sinks, p.sinks_st, h); }

// ---------------------------------------------------------------- dropout (SPEC.md 2)
// keep_ij / (1 - p) with idx = ((n * h_q + h) * max_s_q + i) * max_s_kv + j (max_s_q = s_q, max_s_kv = s_kv),
// keep = Philox4x32_10(idx / 4, offset; seed)[idx % 4] >= threshold (src/core/philox.hpp). The Philox block of
// the last counter is cached: consecutive j of one row share it.
struct Dropout {
  uint64_t seed = 0, offset = 0;
  uint64_t ctr = ~uint64_t(0);
  uint32_t w[4] = {0, 0, 0, 0};
  uint32_t threshold = 0;
  float rdrop = 1.f;
  F32_HD explicit Dropout(const KParams& p) {
    if (p.rng_in) {
      seed = static_cast<uint64_t>(p.rng_in[0]);
      offset = static_cast<uint64_t>(p.rng_in[p.rng_in_st]);
    } else {
      seed = p.seed;
      offset = p.offset;
    }
    threshold = p.threshold;
    rdrop = p.rdrop;
  }
  F32_HD static uint64_t index(const KParams& p, int64_t n, int64_t h, int64_t i, int64_t j) {
    return sinkattn::dropout_index(static_cast<uint64_t>(n), static_cast<uint64_t>(h), static_cast<uint64_t>(i),
                                   static_cast<uint64_t>(j), static_cast<uint64_t>(p.h_q),
                                   static_cast<uint64_t>(p.s_q), static_cast<uint64_t>(p.s_kv));
  }
  F32_HD float factor(uint64_t idx) {
    if ((idx >> 2) != ctr) {
      ctr = idx >> 2;
      const Philox4 r = sinkattn::dropout_block(seed, offset, idx);
      w[0] = r.w[0];
      w[1] = r.w[1];
      w[2] = r.w[2];
      w[3] = r.w[3];
    }
    return w[idx & 3] >= threshold ? rdrop : 0.f;
  }
};

// ---------------------------------------------------------------- forward (SPEC.md 2)
// Thread (n, h, i). The row state starts as if the sink were an already-seen key with score sigma and value 0:
// m = sigma, l = 1, acc = 0 (vanilla: m = -inf, l = 0). For each chunk of visible keys:
//   S_ij = softmax_scale * dot(q_i, k_j) + bias_ij
//   m' = max(m, max_j S_ij), alpha = exp(m - m'), l = alpha l + sum_j exp(S_ij - m'),
//   acc = alpha acc + sum_j exp(S_ij - m') keep_ij / (1 - p) v_j
// and out_i = acc / l, LSE_i = m + log(l) (l = 0: out = 0, LSE = -inf). A row with no visible key (or only -inf
// logits) ends with out = 0, LSE = sigma; padding rows too.
// Row of key j of sequence n (KV head kvh) in k or v (core/kv_rows.hpp: contiguous, varlen or through the page
// table).
F32_HD const float* kv_row(const KParams& p, const float* base, const Rows& st, int64_t n, const Seq& s, int64_t kvh,
                           int64_t j) {
  const KvRowIndex r = kv_row_index<int64_t>(p.page_table, p.pt_n, p.pt_p, p.page_size, n, s.kv_start, j, p.varlen != 0);
  return base + r.b * st.b + r.s * st.s + kvh * st.h;
}

template <int HD>
F32_HD void forward_row(const KParams& p, int64_t n, int64_t h, int64_t i) {
  const Seq s = seq_of(p, n);
  if (i >= s.rows_q) return;
  const int64_t row = s.q_start + i;
  const float sigma = sink_of(p, h);
  float m = sigma;
  float l = sigma > -INFINITY ? 1.f : 0.f;
  float acc[HD];
  for (int64_t c = 0; c < p.d_v; ++c) acc[c] = 0.f;

  if (i < s.len_q) {
    const Mask mask(p, s);
    int64_t lo, hi;
    mask.keys(i, &lo, &hi);
    const int64_t kvh = h / p.group;
    float qr[HD];
    const float* qp = p.q + row_offset(p.q_st, n, row, h);
    for (int64_t c = 0; c < p.d; ++c) qr[c] = qp[c];
    const float* brow = p.bias ? p.bias + n * p.bias_b + h * p.bias_h + i * p.bias_i : nullptr;
    Dropout drop(p);
    const uint64_t drow = p.dropout ? Dropout::index(p, n, h, i, 0) : 0;

    // Chunks start at multiples of kKeyChunk, so under causal / sliding-window masks the lanes of a warp still
    // read the same key rows; keys j0 + [ja, je) of a chunk are the visible ones, the others are not read.
    for (int64_t j0 = lo - lo % kKeyChunk; j0 < hi; j0 += kKeyChunk) {
      const int ja = static_cast<int>(lo > j0 ? lo - j0 : 0);
      const int je = static_cast<int>(hi - j0 < kKeyChunk ? hi - j0 : kKeyChunk);
      float sc[kKeyChunk];
      const float* kr[kKeyChunk];  // the chunk's key and value rows (kv_row; invisible ones are never read)
      const float* vr[kKeyChunk];
F32_UNROLL
      for (int jj = 0; jj < kKeyChunk; ++jj) {
        sc[jj] = 0.f;
        const bool vis = jj >= ja && jj < je;
        kr[jj] = vis ? kv_row(p, p.k, p.k_st, n, s, kvh, j0 + jj) : p.k;
        vr[jj] = vis ? kv_row(p, p.v, p.v_st, n, s, kvh, j0 + jj) : p.v;
      }
      // dot(q_i, k_j) for the chunk's visible keys; the other rows are not read.
      for (int64_t c = 0; c < p.d; ++c) {
        const float qc = qr[c];
F32_UNROLL
        for (int jj = 0; jj < kKeyChunk; ++jj)
          if ((jj >= ja && jj < je)) sc[jj] = fmaf(qc, kr[jj][c], sc[jj]);
      }
      float mx = m;
F32_UNROLL
      for (int jj = 0; jj < kKeyChunk; ++jj) {
        if ((jj >= ja && jj < je)) {
          float sv = sc[jj] * p.scale;
          if (brow) sv += brow[(j0 + jj) * p.bias_j];
          sc[jj] = sv;
          mx = fmaxf(mx, sv);
        } else {
          sc[jj] = -INFINITY;
        }
      }
      if (mx == -INFINITY) continue;  // every logit so far is -inf and there is no sink: nothing seen yet
      const float alpha = expf(m - mx);  // m = -inf -> 0 (mx is finite here)
      float psum = 0.f;
      float pw[kKeyChunk];
F32_UNROLL
      for (int jj = 0; jj < kKeyChunk; ++jj) {
        const float pv = (jj >= ja && jj < je) ? expf(sc[jj] - mx) : 0.f;
        psum += pv;
        // the normaliser uses the undropped P; the value sum uses P * keep / (1 - p)
        pw[jj] = (p.dropout && (jj >= ja && jj < je)) ? pv * drop.factor(drow + static_cast<uint64_t>(j0 + jj)) : pv;
      }
      l = l * alpha + psum;
      m = mx;
      for (int64_t c = 0; c < p.d_v; ++c) {
        float a = acc[c] * alpha;
F32_UNROLL
        for (int jj = 0; jj < kKeyChunk; ++jj)
          if ((jj >= ja && jj < je)) a = fmaf(pw[jj], vr[jj][c], a);
        acc[c] = a;
      }
    }
  }

  const float inv = l > 0.f ? 1.f / l : 0.f;
  float* o = p.out + row_offset(p.out_st, n, row, h);
  for (int64_t c = 0; c < p.d_v; ++c) o[c] = acc[c] * inv;
  p.lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, row)] = l > 0.f ? m + logf(l) : -INFINITY;
}

// Forward: rng_state = {seed, offset} (from rng_seed_offset when given, otherwise the scalars).
F32_HD void write_rng_state(const KParams& p) {
  const Dropout drop(p);
  p.rng_out[0] = static_cast<int64_t>(drop.seed);
  p.rng_out[p.rng_out_st] = static_cast<int64_t>(drop.offset);
}

// ---------------------------------------------------------------- backward (SPEC.md 3)

// Workspace row index of (n, h, i).
F32_HD int64_t ws_index(const KParams& p, int64_t n, int64_t h, int64_t i) { return h * (p.b * p.s_q) + n * p.s_q + i; }

// Thread (n, h, i), i < s_q: D_i = dot(d_out_i, out_i) (from the fp32 out passed to the backward, accumulated in
// double), ws_dm = D_i - d_lse_i, ws_dsink = P_sink_i * (d_lse_i - D_i) with P_sink_i = exp(sigma - LSE_i)
// (learnable). D_i and dP_ij are accumulated in double on this path: dS_ij = P_ij (dP_ij - D_i) and the d_sinks
// terms are differences of nearly equal dot products where a row sees one key beside the sink, and fp32 sums
// over d there miss SPEC.md section 5's fixed fp32 bound (bench/log/2026-12-01-fp32-double-accumulation.md).
// Padding rows (and grid rows past a varlen sequence) write 0 to both and read nothing.
F32_HD void preprocess_row(const KParams& p, int64_t n, int64_t h, int64_t i) {
  const Seq s = seq_of(p, n);
  const int64_t w = ws_index(p, n, h, i);
  if (i >= s.len_q) {
    p.ws_dm[w] = 0.0;
    if (p.ws_dsink) p.ws_dsink[w] = 0.f;
    return;
  }
  const int64_t row = s.q_start + i;
  const float* o = p.out + row_offset(p.out_st, n, row, h);
  const float* g = p.d_out + row_offset(p.dout_st, n, row, h);
  double D = 0.0;
  for (int64_t c = 0; c < p.d_v; ++c) D = fma(static_cast<double>(g[c]), static_cast<double>(o[c]), D);
  const double dlse = p.d_lse ? p.d_lse[lse_offset(p.dlse_b, p.dlse_h, p.dlse_s, n, h, row)] : 0.f;
  p.ws_dm[w] = D - dlse;
  if (p.ws_dsink) {
    const float sigma = sink_of(p, h);
    const float lse = p.lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, row)];
    const float psink = sink_probability(sigma, lse);
    p.ws_dsink[w] = static_cast<float>(psink * (dlse - D));
  }
}

// d_sinks[h] = sum over n, valid i of P_sink_i (d_lse_i - D_i) (SPEC.md 3): thread t of kReduceThreads sums
// rows t, t + T, ... in double; the partials are then added in thread order. Fixed order: deterministic.
F32_HD double dsinks_partial(const KParams& p, int64_t h, int t, int T) {
  const int64_t rows = p.b * p.s_q;
  const float* part = p.ws_dsink + h * rows;
  double acc = 0.0;
  for (int64_t r = t; r < rows; r += T) acc += static_cast<double>(part[r]);
  return acc;
}

// Thread (n, h, i): dq_i = softmax_scale * sum_j dS_ij k_j over the visible keys, with
//   P_ij = exp(S_ij - LSE_i), dP_ij = dot(d_out_i, v_j) keep_ij / (1 - p), dS_ij = P_ij (dP_ij - D_i + d_lse_i).
// With bias, dS_ij is written to ds_dst for every j of the row (0 where not visible). Padding rows and rows
// whose LSE is -inf (no key, vanilla) get dq = 0.
template <int HD>
F32_HD void dq_row(const KParams& p, int64_t n, int64_t h, int64_t i) {
  const Seq s = seq_of(p, n);
  if (i >= s.rows_q) return;
  const int64_t row = s.q_start + i;
  float* dq = p.dq + row_offset(p.dq_st, n, row, h);
  float* ds = p.ds_dst ? p.ds_dst + n * p.ds_b + h * p.ds_h + i * p.ds_i : nullptr;
  int64_t lo = 0, hi = 0;
  float lse = -INFINITY;
  if (i < s.len_q) {
    lse = p.lse[lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, row)];
    if (lse != -INFINITY) Mask(p, s).keys(i, &lo, &hi);
  }
  if (ds) {  // dS = 0 outside the visible keys (and on padding rows): d_bias is written, not accumulated
    for (int64_t j = 0; j < lo; ++j) ds[j * p.ds_j] = 0.f;
    for (int64_t j = hi; j < p.s_kv; ++j) ds[j * p.ds_j] = 0.f;
  }
  if (lo >= hi) {
    for (int64_t c = 0; c < p.d; ++c) dq[c] = 0.f;
    return;
  }
  const int64_t kvh = h / p.group;
  float qr[HD], gr[HD], acc[HD];
  const float* qp = p.q + row_offset(p.q_st, n, row, h);
  const float* gp = p.d_out + row_offset(p.dout_st, n, row, h);
  for (int64_t c = 0; c < p.d; ++c) {
    qr[c] = qp[c];
    acc[c] = 0.f;
  }
  for (int64_t c = 0; c < p.d_v; ++c) gr[c] = gp[c];
  const double dm = p.ws_dm[ws_index(p, n, h, i)];
  const float* kb = p.k + row_offset(p.k_st, n, s.kv_start, kvh);
  const float* vb = p.v + row_offset(p.v_st, n, s.kv_start, kvh);
  const float* brow = p.bias ? p.bias + n * p.bias_b + h * p.bias_h + i * p.bias_i : nullptr;
  Dropout drop(p);
  const uint64_t drow = p.dropout ? Dropout::index(p, n, h, i, 0) : 0;

  for (int64_t j0 = lo - lo % kKeyChunk; j0 < hi; j0 += kKeyChunk) {  // aligned chunks, as in forward_row
    const int ja = static_cast<int>(lo > j0 ? lo - j0 : 0);
    const int je = static_cast<int>(hi - j0 < kKeyChunk ? hi - j0 : kKeyChunk);
    float sc[kKeyChunk];
    double dp[kKeyChunk];
F32_UNROLL
    for (int jj = 0; jj < kKeyChunk; ++jj) sc[jj] = 0.f, dp[jj] = 0.0;
    for (int64_t c = 0; c < p.d; ++c) {
      const float qc = qr[c];
F32_UNROLL
      for (int jj = 0; jj < kKeyChunk; ++jj)
        if ((jj >= ja && jj < je)) sc[jj] = fmaf(qc, kb[(j0 + jj) * p.k_st.s + c], sc[jj]);
    }
    for (int64_t c = 0; c < p.d_v; ++c) {
      const double gc = gr[c];
F32_UNROLL
      for (int jj = 0; jj < kKeyChunk; ++jj)
        if ((jj >= ja && jj < je)) dp[jj] = fma(gc, static_cast<double>(vb[(j0 + jj) * p.v_st.s + c]), dp[jj]);
    }
F32_UNROLL
    for (int jj = 0; jj < kKeyChunk; ++jj) {
      float dS = 0.f;
      if ((jj >= ja && jj < je)) {
        float sv = sc[jj] * p.scale;
        if (brow) sv += brow[(j0 + jj) * p.bias_j];
        const float P = expf(sv - lse);  // S = -inf -> 0
        const float f = p.dropout ? drop.factor(drow + static_cast<uint64_t>(j0 + jj)) : 1.f;
        dS = static_cast<float>(P * (dp[jj] * f - dm));
        if (ds) ds[(j0 + jj) * p.ds_j] = dS;
      }
      sc[jj] = dS;
    }
    for (int64_t c = 0; c < p.d; ++c) {
      float a = acc[c];
F32_UNROLL
      for (int jj = 0; jj < kKeyChunk; ++jj)
        if ((jj >= ja && jj < je)) a = fmaf(sc[jj], kb[(j0 + jj) * p.k_st.s + c], a);
      acc[c] = a;
    }
  }
  for (int64_t c = 0; c < p.d; ++c) dq[c] = p.scale * acc[c];
}

// Thread (n, kv head g, key j): for every query head h of the group and every query row i that sees key j
// (and whose LSE is finite):
//   dv_j += P_ij keep_ij / (1 - p) d_out_i,   dk_j += dS_ij q_i,   dk_j *= softmax_scale at the end.
// Keys no query sees (past len_kv, or outside every window) get dk = dv = 0.
template <int HD>
F32_HD void dkdv_key(const KParams& p, int64_t n, int64_t g, int64_t j) {
  const Seq s = seq_of(p, n);
  if (j >= s.rows_kv) return;
  const int64_t krow = s.kv_start + j;
  float* dk = p.dk + row_offset(p.dk_st, n, krow, g);
  float* dv = p.dv + row_offset(p.dv_st, n, krow, g);
  float ak[HD], av[HD];
  for (int64_t c = 0; c < p.d; ++c) ak[c] = 0.f;
  for (int64_t c = 0; c < p.d_v; ++c) av[c] = 0.f;
  if (j < s.len_kv) {
    int64_t lo, hi;
    Mask(p, s).queries(j, &lo, &hi);
    if (lo < hi) {
      float kr[HD], vr[HD];
      const float* kp = p.k + row_offset(p.k_st, n, krow, g);
      const float* vp = p.v + row_offset(p.v_st, n, krow, g);
      for (int64_t c = 0; c < p.d; ++c) kr[c] = kp[c];
      for (int64_t c = 0; c < p.d_v; ++c) vr[c] = vp[c];
      Dropout drop(p);
      for (int64_t hh = 0; hh < p.group; ++hh) {
        const int64_t h = g * p.group + hh;
        const float* qb = p.q + row_offset(p.q_st, n, s.q_start, h);
        const float* gb = p.d_out + row_offset(p.dout_st, n, s.q_start, h);
        const float* lb = p.lse + lse_offset(p.lse_b, p.lse_h, p.lse_s, n, h, s.q_start);
        const float* bcol = p.bias ? p.bias + n * p.bias_b + h * p.bias_h + j * p.bias_j : nullptr;
        const double* dmb = p.ws_dm + ws_index(p, n, h, 0);
        // Row chunks start at multiples of kRowChunk (lanes of a warp read the same query rows); rows
        // i0 + [ra, re) of a chunk see key j, the others are not read.
        for (int64_t i0 = lo - lo % kRowChunk; i0 < hi; i0 += kRowChunk) {
          const int ra = static_cast<int>(lo > i0 ? lo - i0 : 0);
          const int re = static_cast<int>(hi - i0 < kRowChunk ? hi - i0 : kRowChunk);
          float wk[kRowChunk], wv[kRowChunk];  // dS_ij and P_ij keep_ij / (1 - p) of the chunk's rows
F32_UNROLL
          for (int rr = 0; rr < kRowChunk; ++rr) {
            wk[rr] = wv[rr] = 0.f;
            if (rr < ra || rr >= re) continue;
            const int64_t i = i0 + rr;
            const float lse = lb[i * p.lse_s];
            if (lse == -INFINITY) continue;  // the row sees no key (vanilla): P = 0
            const float* qi = qb + i * p.q_st.s;
            const float* gi = gb + i * p.dout_st.s;
            float sv = 0.f;
            double dp = 0.0;
            for (int64_t c = 0; c < p.d; ++c) sv = fmaf(qi[c], kr[c], sv);
            for (int64_t c = 0; c < p.d_v; ++c) dp = fma(static_cast<double>(gi[c]), static_cast<double>(vr[c]), dp);
            sv *= p.scale;
            if (bcol) sv += bcol[i * p.bias_i];
            const float P = expf(sv - lse);
            const float f = p.dropout ? drop.factor(Dropout::index(p, n, h, i, j)) : 1.f;
            wk[rr] = static_cast<float>(P * (dp * f - dmb[i]));
            wv[rr] = P * f;
          }
          for (int64_t c = 0; c < p.d; ++c) {
            float a = ak[c];
F32_UNROLL
            for (int rr = 0; rr < kRowChunk; ++rr)
              if (rr >= ra && rr < re) a = fmaf(wk[rr], qb[(i0 + rr) * p.q_st.s + c], a);
            ak[c] = a;
          }
          for (int64_t c = 0; c < p.d_v; ++c) {
            float a = av[c];
F32_UNROLL
            for (int rr = 0; rr < kRowChunk; ++rr)
              if (rr >= ra && rr < re) a = fmaf(wv[rr], gb[(i0 + rr) * p.dout_st.s + c], a);
            av[c] = a;
          }
        }
      }
    }
  }
  for (int64_t c = 0; c < p.d; ++c) dk[c] = p.scale * ak[c];
  for (int64_t c = 0; c < p.d_v; ++c) dv[c] = av[c];
}

// d_bias element e of [bias_nb, bias_nh, s_q, s_kv]: the sum of dS over the broadcast dims, n then h order.
F32_HD void dbias_reduce(const KParams& p, int64_t e) {
  const int64_t j = e % p.s_kv, i = (e / p.s_kv) % p.s_q;
  const int64_t hb = (e / (p.s_kv * p.s_q)) % p.bias_nh, nb = e / (p.s_kv * p.s_q * p.bias_nh);
  const int64_t n0 = p.bias_nb == 1 ? 0 : nb, n1 = p.bias_nb == 1 ? p.b : nb + 1;
  const int64_t h0 = p.bias_nh == 1 ? 0 : hb, h1 = p.bias_nh == 1 ? p.h_q : hb + 1;
  float acc = 0.f;
  for (int64_t n = n0; n < n1; ++n)
    for (int64_t h = h0; h < h1; ++h) acc += p.ds_dst[n * p.ds_b + h * p.ds_h + i * p.ds_i + j * p.ds_j];
  p.d_bias[nb * p.dbias_b + hb * p.dbias_h + i * p.dbias_i + j * p.dbias_j] = acc;
}

}  // namespace sinkattn::cuda_f32

// CPU backward (SPEC.md section 3), deterministic by construction: every output element is produced by exactly one
// task, in an order that does not depend on the thread count, and partial sums are reduced in a fixed order.
//
//   1. preprocess, tasks (n, h):  D_i = dot(d_out_i, out_i) accumulated in double (from the out tensor given), into the
//      workspace, with fp32 copies of the valid q and d_out rows; then per head h:
//      d_sinks[h] = sum_{n, valid i} exp(sigma_h - LSE_i) * (d_lse_i - D_i)  (double, fixed order).
//      K and V are converted once to fp32 panels (cpu_panels.hpp).
//   2. dk / dv, tasks (n, kv head, key block): loops over the query heads of the KV group and the query blocks
//      that can see the key block, recomputing
//          P_ij  = exp(softmax_scale * dot(q_i, k_j) + bias_ij - LSE_i)
//          dP_ij = dot(d_out_i, v_j) * keep_ij / (1 - p)
//          dS_ij = P_ij * (dP_ij - D_i + d_lse_i)
//      and accumulating  dv_j += P_ij * keep_ij / (1 - p) * d_out_i,  dk_j += dS_ij * q_i  (dk *= softmax_scale).
//   3. dq (+ d_bias), tasks (bias slab, query block): dq_i = softmax_scale * sum_j dS_ij k_j; d_bias_ij = dS_ij
//      summed over the broadcast dimensions of bias (the task loops over the (n, h) that share its slab).
// Only visible (i, j) pairs are ever combined; masked, padded and out-of-window values are never read into
// arithmetic that survives. Padding rows get dq = 0, keys no query sees get dk = dv = 0.
#include <cmath>
#include <cstring>

#include "common/sink.hpp"
#include "cpu/cpu_common.hpp"
#include "cpu/cpu_panels.hpp"
#include "cpu/cpu_passes.hpp"

namespace sinkattn::cpu {

namespace {

// Workspace layout (floats): D [h_q * rows_total], then (bias given, d_bias not fp32) the fp32 d_bias
// accumulator [Bb * Hb * s_q * s_kv], then the fp32 K / V panels (cpu_panels.hpp: K^T, K rows, V^T), then fp32
// copies of q and d_out rows [h_q][rows_total][dp | dvp] (valid rows only; filled by the preprocess), so the
// tile loops read contiguous fp32 rows instead of converting strided rows again for every key block.
struct BwdLayout {
  int64_t rows_total = 0;  // varlen: total_q; dense: b * s_q
  int64_t d_floats = 0;
  int64_t bias_b = 0, bias_h = 0;  // slabs of d_bias: Bb = 1 or b, Hb = 1 or h_q
  bool bcast_b = false, bcast_h = false;
  bool bias_ws = false;            // d_bias accumulated in the workspace (not fp32)
  int64_t bias_floats = 0;
  int64_t q_floats = 0, do_floats = 0, fin_floats = 0;
  KvPanels kv;

  explicit BwdLayout(const Call& c) : kv(c, known_kv_lengths(c), /*kt=*/true, /*k=*/true, /*v=*/false, /*vt=*/true) {
    rows_total = c.plan.varlen ? c.total_q : c.b * c.s_q;
    d_floats = (c.h_q * rows_total + 15) & ~int64_t(15);
    q_floats = (c.h_q * rows_total * round_up8(c.d) + 15) & ~int64_t(15);
    do_floats = (c.h_q * rows_total * round_up8(c.d_v) + 15) & ~int64_t(15);
    fin_floats = ((c.h_q * rows_total + 3) / 4 + 15) & ~int64_t(15);
    bias_b = c.b;
    bias_h = c.h_q;
    if (c.plan.d_bias == Use::kRequired) {
      bcast_b = c.p->bias.shape[0] == 1;
      bcast_h = c.p->bias.shape[1] == 1;
      bias_b = bcast_b ? 1 : c.b;
      bias_h = bcast_h ? 1 : c.h_q;
      bias_ws = c.bias_dtype != SINKATTN_F32;
      if (bias_ws) bias_floats = (bias_b * bias_h * c.s_q * c.s_kv + 15) & ~int64_t(15);
    }
  }
  size_t bytes() const {
    return static_cast<size_t>(d_floats + bias_floats + kv.floats() + q_floats + do_floats + 2 * fin_floats) *
           sizeof(float);
  }
};

struct Bwd {
  const Ctx& x;
  const BwdLayout& lay;
  const KvPanels& kv;
  float* D;        // [h_q * rows_total]
  float* bias_ws;  // fp32 d_bias accumulator or nullptr
  float* qf;       // fp32 q rows [h_q * rows_total][dp]
  float* dof;      // fp32 d_out rows [h_q * rows_total][dvp]
  uint8_t* q_fin;  // per (h, row): the q row is finite
  uint8_t* do_fin; // per (h, row): the d_out row is finite

  int64_t d_index(int64_t n, int64_t h, int64_t i) const {
    const int64_t grow = x.c.plan.varlen ? x.seq[n].q_start + i : n * x.c.s_q + i;
    return h * lay.rows_total + grow;
  }
  // fp32 row i of (n, h) of q / d_out; rows i .. i + nr - 1 are contiguous (leading dimension dp / dvp).
  float* q_at(int64_t n, int64_t h, int64_t i) const { return qf + d_index(n, h, i) * x.dp; }
  float* do_at(int64_t n, int64_t h, int64_t i) const { return dof + d_index(n, h, i) * x.dvp; }
};

struct BwdTiles {
  uint8_t active[kBlockQ];  // row r has nonzero P / dS in the current tile
  float *s, *dp, *acc1, *acc2, *lse, *D, *dlse, *brow, *drow, *tmp;
};

// Loads the per-row statistics LSE_i, D_i, d_lse_i of query rows i0 .. i0 + nr - 1 of (n, h).
void load_row_stats(const Bwd& w, BwdTiles& t, int64_t n, int64_t h, int64_t i0, int64_t nr) {
  const Ctx& x = w.x;
  const Call& c = x.c;
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t row = x.q_row(n, i0 + r);
    t.lse[r] = *x.lse_ptr(x.p.softmax_lse, c.lse, n, h, row);
    t.D[r] = w.D[w.d_index(n, h, i0 + r)];
    t.dlse[r] = c.plan.d_lse == Use::kRequired ? *x.lse_ptr(x.p.d_lse, c.d_lse, n, h, row) : 0.f;
  }
}

// From t.s = Q K^T (unscaled) and t.dp = dO V^T for rows [0, nr) and key tile [j0, j0 + jn), computes in place
//   t.s  <- P_ij * keep_ij / (1 - p)        (the dv weights)
//   t.dp <- dS_ij = P_ij * (dP_ij * keep_ij / (1 - p) - D_i + d_lse_i)
// with both exactly 0 outside the visible columns of each row. A row whose LSE is -inf sees no key.
void compute_ds(const Bwd& w, BwdTiles& t, const RowRanges& rr, int64_t n, int64_t h, int64_t i0, int64_t nr,
                int64_t j0, int64_t jn) {
  const Ctx& x = w.x;
  const Call& c = x.c;
  const int64_t jnp = round_up8(jn);
  const bool has_bias = c.plan.bias == Use::kRequired;
  const bool dropout = c.plan.dropout;
  const __m256 vscale = _mm256_set1_ps(c.softmax_scale);
  const __m256 zero = _mm256_setzero_ps();
  for (int64_t r = 0; r < nr; ++r) {
    float* s = t.s + r * kBlockK;
    float* dp = t.dp + r * kBlockK;
    int64_t a, e;
    rr.cols(r, j0, jn, &a, &e);
    const float lse = t.lse[r];
    t.active[r] = 0;
    if (a >= e || lse == -INFINITY) {
      std::memset(s, 0, sizeof(float) * static_cast<size_t>(jnp));
      std::memset(dp, 0, sizeof(float) * static_cast<size_t>(jnp));
      continue;
    }
    t.active[r] = 1;
    if (has_bias) load_bias_row(c, n, h, i0 + r, j0, a, e, jnp, t.brow);
    if (dropout) {
      for (int64_t jj = 0; jj < jnp; ++jj) t.drow[jj] = 0.f;
      dropout_row(c, x.seed, x.offset, x.rdrop, n, h, i0 + r, j0, a, e, t.drow);
    }
    const __m256 vlse = _mm256_set1_ps(lse);
    const __m256 vdd = _mm256_set1_ps(t.dlse[r] - t.D[r]);  // d_lse_i - D_i
    for (int64_t jj = 0; jj < jnp; jj += 8) {
      const __m256 mask = range_mask(jj, a, e);
      __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(s + jj), vscale);
      if (has_bias) sv = _mm256_add_ps(sv, _mm256_loadu_ps(t.brow + jj));
      const __m256 pv = _mm256_blendv_ps(zero, exp_ps(_mm256_sub_ps(sv, vlse)), mask);
      __m256 dpv = _mm256_loadu_ps(dp + jj);
      __m256 pw = pv;
      if (dropout) {
        const __m256 kf = _mm256_loadu_ps(t.drow + jj);
        dpv = _mm256_mul_ps(dpv, kf);
        pw = _mm256_mul_ps(pv, kf);
      }
      const __m256 ds = _mm256_blendv_ps(zero, _mm256_mul_ps(pv, _mm256_add_ps(dpv, vdd)), mask);
      _mm256_storeu_ps(s + jj, pw);
      _mm256_storeu_ps(dp + jj, ds);
    }
  }
}

// ---- 1. preprocess ----------------------------------------------------------------------------------------------

void preprocess(const Bwd& w) {
  const Ctx& x = w.x;
  const Call& c = x.c;
  const sinkattn_params_t& p = x.p;
  const int64_t tasks = c.b * c.h_q;
#pragma omp parallel num_threads(x.threads)
  {
    Scratch sc(scratch_floats({size_t(x.dvp)}));
    float* o = sc.take(size_t(x.dvp));
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t n = task / c.h_q, h = task % c.h_q;
      for (int64_t i = 0; i < x.seq[n].len_q; ++i) {  // valid rows only: padding rows are never read
        const int64_t row = x.q_row(n, i);
        float* g = w.do_at(n, h, i);
        float* qr = w.q_at(n, h, i);
        load_row(x.in_row(p.q, c.q, n, row, h), c.dtype, c.d, qr, x.dp);
        load_row(x.in_row(p.out, c.out, n, row, h), c.dtype, c.d_v, o, x.dvp);
        load_row(x.in_row(p.d_out, c.d_out, n, row, h), c.dtype, c.d_v, g, x.dvp);
        w.q_fin[w.d_index(n, h, i)] = row_finite(qr, c.d) ? 1 : 0;
        w.do_fin[w.d_index(n, h, i)] = row_finite(g, c.d_v) ? 1 : 0;
        w.D[w.d_index(n, h, i)] = static_cast<float>(dot_f64(o, g, c.d_v));
      }
    }
    if (c.plan.d_sinks == Use::kRequired) {
      // d_sinks[h] = sum over n, valid i of P_sink_i * (d_lse_i - D_i), P_sink_i = exp(sigma_h - LSE_i)
      // (sink_probability: 1 for a key-less row of a -inf sink).
      // Summed in double in a fixed order; never over the heads of a GQA group, never over padding rows.
#pragma omp for schedule(static)
      for (int64_t h = 0; h < c.h_q; ++h) {
        const double sigma = x.sink(h);
        double sum = 0.0;
        for (int64_t n = 0; n < c.b; ++n) {
          for (int64_t i = 0; i < x.seq[n].len_q; ++i) {
            const int64_t row = x.q_row(n, i);
            const double lse = *x.lse_ptr(p.softmax_lse, c.lse, n, h, row);
            const double dlse = c.plan.d_lse == Use::kRequired ? *x.lse_ptr(p.d_lse, c.d_lse, n, h, row) : 0.0;
            const double psink = sink_probability(sigma, lse);
            sum += psink * (dlse - static_cast<double>(w.D[w.d_index(n, h, i)]));
          }
        }
        static_cast<float*>(p.d_sinks.data)[h * p.d_sinks.strides[0]] = static_cast<float>(sum);
      }
    }
  }
}

// ---- 2. dk, dv ----------------------------------------------------------------------------------------------

void dkdv_block(const Bwd& w, BwdTiles& t, int64_t n, int64_t kvh, int64_t kb) {
  const Ctx& x = w.x;
  const Call& c = x.c;
  const sinkattn_params_t& p = x.p;
  const SeqBounds& sb = x.seq[n];
  const int64_t j0 = kb * kBlockK;
  const int64_t jn_total = std::min<int64_t>(kBlockK, x.alloc_kv[n] - j0);  // key rows this task writes
  if (jn_total <= 0) return;
  const int64_t jn = std::clamp<int64_t>(sb.len_kv - j0, 0, jn_total);      // keys that are not masked
  const int64_t d = c.d, dv = c.d_v, dp = x.dp, dvp = x.dvp;
  // Masked keys (past seqlens_kv / seqused_kv): dk = dv = 0.
  for (int64_t jj = jn; jj < jn_total; ++jj) {
    const int64_t row = x.kv_row(n, j0 + jj);
    zero_row(x.out_row(p.dk, c.dk, n, row, kvh), c.dtype, d);
    zero_row(x.out_row(p.dv, c.dv, n, row, kvh), c.dtype, dv);
  }
  if (jn == 0) return;
  const int64_t jnp = round_up8(jn);
  float* dk_acc = t.acc1;  // [kBlockK][dp]
  float* dv_acc = t.acc2;  // [kBlockK][dvp]
  std::memset(dk_acc, 0, sizeof(float) * static_cast<size_t>(jn * dp));
  std::memset(dv_acc, 0, sizeof(float) * static_cast<size_t>(jn * dvp));
  const int64_t nqb = (sb.len_q + kBlockQ - 1) / kBlockQ;
  const int64_t ldk = w.kv.ld(x, n);
  RowRanges rr;
  for (int64_t qb = 0; qb < nqb; ++qb) {
    const int64_t i0 = qb * kBlockQ;
    const int64_t nr = std::min<int64_t>(kBlockQ, sb.len_q - i0);
    // lo and hi of visible_keys are non-decreasing in i: a quick test on the block's first and last rows.
    const KeyRange first = visible_keys(c, i0, sb.len_q, sb.len_kv);
    const KeyRange last = visible_keys(c, i0 + nr - 1, sb.len_q, sb.len_kv);
    if (last.hi <= j0 || first.lo >= j0 + jn) continue;
    rr.compute(c, i0, nr, sb.len_q, sb.len_kv);
    if (rr.khi <= j0 || rr.klo >= j0 + jn) continue;
    for (int64_t h = kvh * c.group; h < (kvh + 1) * c.group; ++h) {
      const float* qt = w.q_at(n, h, i0);
      const float* dot = w.do_at(n, h, i0);
      load_row_stats(w, t, n, h, i0, nr);
      gemm_tile<false>(t.s, kBlockK, qt, dp, 1, w.kv.kt_at(n, kvh, j0), ldk, nr, jnp, d);      // S  = Q K^T
      gemm_tile<false>(t.dp, kBlockK, dot, dvp, 1, w.kv.vt_at(n, kvh, j0), ldk, nr, jnp, dv);  // dP = dO V^T
      compute_ds(w, t, rr, n, h, i0, nr, j0, jn);
      if (all_set(w.q_fin + w.d_index(n, h, i0), nr) && all_set(w.do_fin + w.d_index(n, h, i0), nr)) {
        gemm_tile<true>(dv_acc, dvp, t.s, 1, kBlockK, dot, dvp, jn, dvp, nr);  // dv += (P keep/(1-p))^T dO
        gemm_tile<true>(dk_acc, dp, t.dp, 1, kBlockK, qt, dp, jn, dp, nr);     // dk += dS^T Q
      } else {  // a non-finite q or d_out row: each key sums only the rows that see it
        for (int64_t r = 0; r < nr; ++r) {
          if (!t.active[r]) continue;
          int64_t a, e;
          rr.cols(r, j0, jn, &a, &e);
          for (int64_t jj = a; jj < e; ++jj) {
            axpy8(dv_acc + jj * dvp, t.s[r * kBlockK + jj], dot + r * dvp, dvp);
            axpy8(dk_acc + jj * dp, t.dp[r * kBlockK + jj], qt + r * dp, dp);
          }
        }
      }
    }
  }
  for (int64_t jj = 0; jj < jn; ++jj) {
    const int64_t row = x.kv_row(n, j0 + jj);
    store_row_scaled(dk_acc + jj * dp, d, c.softmax_scale, x.out_row(p.dk, c.dk, n, row, kvh), c.dtype, t.tmp);
    store_row(dv_acc + jj * dvp, dv, x.out_row(p.dv, c.dv, n, row, kvh), c.dtype);
  }
}

// ---- 3. dq, d_bias ----------------------------------------------------------------------------------------------

// Row i of the fp32 d_bias accumulator of slab (bb, hb); *js receives the column stride.
float* dbias_acc_row(const Bwd& w, int64_t bb, int64_t hb, int64_t i, int64_t* js) {
  const Call& c = w.x.c;
  if (w.lay.bias_ws) {
    *js = 1;
    return w.bias_ws + ((bb * w.lay.bias_h + hb) * c.s_q + i) * c.s_kv;
  }
  *js = c.d_bias.j;
  return static_cast<float*>(c.p->d_bias.data) + (bb * c.d_bias.b + hb * c.d_bias.h + i * c.d_bias.i);
}

void dq_head_block(const Bwd& w, BwdTiles& t, int64_t n, int64_t h, int64_t qb, int64_t bb, int64_t hb) {
  const Ctx& x = w.x;
  const Call& c = x.c;
  const sinkattn_params_t& p = x.p;
  const SeqBounds& sb = x.seq[n];
  const int64_t i0 = qb * kBlockQ;
  const int64_t nr_total = std::min<int64_t>(kBlockQ, x.alloc_q[n] - i0);
  if (nr_total <= 0) return;
  const int64_t nr = std::clamp<int64_t>(sb.len_q - i0, 0, nr_total);
  const int64_t kvh = h / c.group;
  const int64_t d = c.d, dv = c.d_v, dp = x.dp, dvp = x.dvp;
  const bool has_bias = c.plan.d_bias == Use::kRequired;
  // Padding rows of a dense batch: dq = 0.
  for (int64_t r = nr; r < nr_total; ++r) zero_row(x.out_row(p.dq, c.dq, n, x.q_row(n, i0 + r), h), c.dtype, d);
  if (nr == 0) return;
  RowRanges rr;
  rr.compute(c, i0, nr, sb.len_q, sb.len_kv);
  float* dq_acc = t.acc1;  // [kBlockQ][dp]
  std::memset(dq_acc, 0, sizeof(float) * static_cast<size_t>(nr * dp));
  const float* qt = w.q_at(n, h, i0);
  const float* dot = w.do_at(n, h, i0);
  if (rr.klo < rr.khi) load_row_stats(w, t, n, h, i0, nr);
  for (int64_t j0 = rr.klo; j0 < rr.khi; j0 += kBlockK) {
    const int64_t jn = std::min<int64_t>(kBlockK, rr.khi - j0);
    const int64_t jnp = round_up8(jn);
    const int64_t ldk = w.kv.ld(x, n);
    gemm_tile<false>(t.s, kBlockK, qt, dp, 1, w.kv.kt_at(n, kvh, j0), ldk, nr, jnp, d);      // S  = Q K^T
    gemm_tile<false>(t.dp, kBlockK, dot, dvp, 1, w.kv.vt_at(n, kvh, j0), ldk, nr, jnp, dv);  // dP = dO V^T
    compute_ds(w, t, rr, n, h, i0, nr, j0, jn);
    if (has_bias) {  // d_bias_ij += dS_ij on visible (i, j)
      for (int64_t r = 0; r < nr; ++r) {
        int64_t a, e, js;
        rr.cols(r, j0, jn, &a, &e);
        float* acc = dbias_acc_row(w, bb, hb, i0 + r, &js);
        const float* ds = t.dp + r * kBlockK;
        for (int64_t jj = a; jj < e; ++jj) acc[(j0 + jj) * js] += ds[jj];
      }
    }
    // dq += dS K (keys of the visible band; exact per-row sums when a K row of the tile is not finite)
    if (w.kv.k_finite(n, kvh, j0, jn)) {
      gemm_tile<true>(dq_acc, dp, t.dp, kBlockK, 1, w.kv.k_at(n, kvh, j0), dp, nr, dp, jn);
    } else {
      gemm_tile_ranged(dq_acc, dp, t.dp, kBlockK, 1, w.kv.k_at(n, kvh, j0), dp, nr, dp,
                       [&](int64_t r, int64_t* lo, int64_t* hi) {
                         rr.cols(r, j0, jn, lo, hi);
                         if (!t.active[r]) *hi = *lo;
                       });
    }
  }
  for (int64_t r = 0; r < nr; ++r)
    store_row_scaled(dq_acc + r * dp, d, c.softmax_scale, x.out_row(p.dq, c.dq, n, x.q_row(n, i0 + r), h), c.dtype,
                     t.tmp);
}

// One task: d_bias slab (bb, hb) (or, without bias, the single (n, h) = (bb, hb)) and query block qb.
void dq_task(const Bwd& w, BwdTiles& t, int64_t bb, int64_t hb, int64_t qb) {
  const Ctx& x = w.x;
  const Call& c = x.c;
  const BwdLayout& lay = w.lay;
  const bool has_bias = c.plan.d_bias == Use::kRequired;
  const int64_t i0 = qb * kBlockQ;
  int64_t bias_rows = 0;
  if (has_bias) {  // zero the slab rows this task owns (d_bias is written, not accumulated into)
    bias_rows = std::min<int64_t>(kBlockQ, c.s_q - i0);
    for (int64_t r = 0; r < bias_rows; ++r) {
      int64_t js;
      float* acc = dbias_acc_row(w, bb, hb, i0 + r, &js);
      for (int64_t j = 0; j < c.s_kv; ++j) acc[j * js] = 0.f;
    }
  }
  const int64_t n_lo = lay.bcast_b ? 0 : bb, n_hi = lay.bcast_b ? c.b : bb + 1;
  const int64_t h_lo = lay.bcast_h ? 0 : hb, h_hi = lay.bcast_h ? c.h_q : hb + 1;
  for (int64_t n = n_lo; n < n_hi; ++n)
    for (int64_t h = h_lo; h < h_hi; ++h) dq_head_block(w, t, n, h, qb, bb, hb);
  if (has_bias && lay.bias_ws) {  // fp32 accumulator -> d_bias dtype
    const sinkattn_tensor_t& db = c.p->d_bias;
    for (int64_t r = 0; r < bias_rows; ++r) {
      int64_t js;
      const float* acc = dbias_acc_row(w, bb, hb, i0 + r, &js);
      const int64_t base = bb * c.d_bias.b + hb * c.d_bias.h + (i0 + r) * c.d_bias.i;
      for (int64_t j = 0; j < c.s_kv; ++j) store_scalar(db.data, base + j * c.d_bias.j, c.bias_dtype, acc[j]);
    }
  }
}

}  // namespace

size_t backward_workspace_bytes(const Call& c) { return BwdLayout(c).bytes(); }

std::string backward_workspace_report(const Call& c) {
  const BwdLayout lay(c);
  return "D, fp32 copies of q and d_out rows: " +
         std::to_string((lay.d_floats + lay.q_floats + lay.do_floats + 2 * lay.fin_floats) * 4) +
         " bytes; fp32 K^T, K and V^T panels: " + std::to_string(lay.kv.slots) + " key slots x " +
         std::to_string(c.h_kv) + " KV heads x " + std::to_string(lay.kv.bytes_per_slot() / std::max<int64_t>(c.h_kv, 1)) +
         " bytes" + (lay.bias_floats > 0 ? "; fp32 d_bias accumulator: " + std::to_string(lay.bias_floats * 4) + " bytes" : "");
}

Status run_backward(const Call& c) {
  Ctx x(c);
  BwdLayout lay(c);
  if (c.plan.dropout) {  // the backward reads {seed, offset} from rng_state (SPEC.md section 2)
    x.seed = c.p->seed;
    x.offset = c.p->offset;
    if (c.p->rng_state.rank > 0 && c.p->rng_state.data != nullptr) {
      const int64_t* st = static_cast<const int64_t*>(c.p->rng_state.data);
      x.seed = static_cast<uint64_t>(st[0]);
      x.offset = static_cast<uint64_t>(st[c.p->rng_state.strides[0]]);
    }
  }
  if (lay.bytes() > 0 && c.p->workspace == nullptr) return internal_error("cpu backward: workspace is NULL");
  float* ws = static_cast<float*>(c.p->workspace);
  lay.kv.bind(ws + lay.d_floats + lay.bias_floats);
  float* qf = ws + lay.d_floats + lay.bias_floats + lay.kv.floats();
  float* fin = qf + lay.q_floats + lay.do_floats;
  Bwd w{x,   lay, lay.kv, ws, lay.bias_ws ? ws + lay.d_floats : nullptr, qf, qf + lay.q_floats,
        reinterpret_cast<uint8_t*>(fin), reinterpret_cast<uint8_t*>(fin + lay.fin_floats)};

  if (c.b == 0) {
    if (c.plan.d_sinks == Use::kRequired)
      for (int64_t h = 0; h < c.h_q; ++h) static_cast<float*>(c.p->d_sinks.data)[h * c.p->d_sinks.strides[0]] = 0.f;
    return Status::ok();
  }
  preprocess(w);
  lay.kv.fill(x);

  const size_t tile_floats = scratch_floats(
      {size_t(kBlockQ * kBlockK), size_t(kBlockQ * kBlockK),
       size_t(std::max(kBlockQ, kBlockK) * x.dp), size_t(kBlockK * x.dvp), size_t(kBlockQ), size_t(kBlockQ),
       size_t(kBlockQ), size_t(kBlockK), size_t(kBlockK), size_t(std::max(x.dp, x.dvp))});
  const int64_t dkdv_tasks = c.b * c.h_kv * x.nkb;
  const int64_t dq_tasks = lay.bias_b * lay.bias_h * x.nqb;
#pragma omp parallel num_threads(x.threads)
  {
    Scratch sc(tile_floats);
    BwdTiles t;
    t.s = sc.take(size_t(kBlockQ * kBlockK));
    t.dp = sc.take(size_t(kBlockQ * kBlockK));
    t.acc1 = sc.take(size_t(std::max(kBlockQ, kBlockK) * x.dp));
    t.acc2 = sc.take(size_t(kBlockK * x.dvp));
    t.lse = sc.take(size_t(kBlockQ));
    t.D = sc.take(size_t(kBlockQ));
    t.dlse = sc.take(size_t(kBlockQ));
    t.brow = sc.take(size_t(kBlockK));
    t.drow = sc.take(size_t(kBlockK));
    t.tmp = sc.take(size_t(std::max(x.dp, x.dvp)));
#pragma omp for schedule(dynamic, 1) nowait
    for (int64_t task = 0; task < dkdv_tasks; ++task) {
      const int64_t kb = task % x.nkb, nh = task / x.nkb;
      dkdv_block(w, t, nh / c.h_kv, nh % c.h_kv, kb);
    }
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < dq_tasks; ++task) {
      const int64_t qb = x.nqb - 1 - task % x.nqb, s = task / x.nqb;
      dq_task(w, t, s / lay.bias_h, s % lay.bias_h, qb);
    }
  }
  return Status::ok();
}

}  // namespace sinkattn::cpu

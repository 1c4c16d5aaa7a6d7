// CPU forward: tiled online softmax with the sink as an already-seen key (SPEC.md section 2).
//
// One task per (sequence n, query head h, block of kBlockQ query rows), run with OpenMP. Per row the state starts
// as if the sink were a seen key with score sigma and value 0: m = sigma, l = 1, acc = 0 (vanilla: m = -inf,
// l = 0). For each kBlockK-key tile of the block's visible band:
//     S_ij = softmax_scale * dot(q_i, k_j) + bias_ij     (visible j only; -inf elsewhere)
//     m'   = max(m, max_j S_ij),  alpha = exp(m - m'),  P_ij = exp(S_ij - m')
//     l    = alpha * l + sum_j P_ij,  acc = alpha * acc + sum_j P_ij * keep_ij / (1 - p) * v_j
// and at the end out_i = acc / l, LSE_i = m + log(l). A row with no visible key keeps m = sigma, l = 1 and ends
// with out = 0, LSE = sigma (vanilla: l = 0 -> out = 0, LSE = -inf). Dense padding rows get the same values.
// K and V are converted once to fp32 panels in the workspace (cpu_panels.hpp); only the key tiles that
// intersect the block's visible band are visited, so a sliding window costs O(s * window). Paged KV (SPEC.md
// section 1) only changes where the panels read their rows from (Ctx::kv_in_row).
//
// Split-KV (num_splits, flash-decoding): the key tiles of a block's band are cut into S splits of consecutive tiles
// (ceil(tiles / S) each; the last splits are empty when there are fewer tiles than splits). Each split runs the
// online softmax above over its tiles alone and writes a partial (o_s = acc_s / l_s, lse_s = m_s + log l_s) to the
// workspace; a combine pass merges them, lse = log sum_s exp(lse_s), out = sum_s exp(lse_s - lse) o_s. Exactly one
// split carries the sink (starts with m = sigma, l = 1): the last one, which is the empty one whenever a band has
// fewer tiles than splits, so its partial is then the sink alone (o = 0, lse = sigma). Every other split starts
// vanilla, and an empty one has lse = -inf and weight 0 (it cannot overwrite a valid LSE); a row whose every
// partial is -inf (vanilla, no key) ends with out = 0, LSE = -inf. The same scheme as the CUDA decode kernels.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "cpu/cpu_common.hpp"
#include "cpu/cpu_panels.hpp"
#include "cpu/cpu_passes.hpp"

namespace sinkattn::cpu {

// K transposed and V rows in fp32 (cpu_panels.hpp), for the keys each sequence reads.
static KvPanels forward_panels(const Call& c, const std::vector<int64_t>& len_kv) {
  return KvPanels(c, len_kv, /*kt=*/true, /*k=*/false, /*v=*/true, /*vt=*/false);
}

// The number of key splits of a forward (SPEC.md section 4: num_splits 0 = heuristic, 1 = none, N = at most N).
// `len_kv`: known_kv_lengths(c) (empty: a shape-only size query).
static int64_t forward_num_splits(const Call& c, const std::vector<int64_t>& len_kv) {
  int64_t splits = 1;
  if (c.num_splits > 0) {
    splits = std::min<int64_t>(c.num_splits, kMaxSplits);
  } else {
    // Heuristic: split only when the (sequence, head, query block) tasks leave threads idle, into splits of at
    // least 4 key tiles (from shapes).
    const int64_t nqb = (c.s_q + kBlockQ - 1) / kBlockQ;
    const int64_t tasks = c.b * c.h_q * nqb;
    const int64_t threads = cpu_threads(*c.p);
    if (tasks == 0 || tasks >= threads) return 1;
    const int64_t tiles = (c.s_kv + kBlockK - 1) / kBlockK;
    splits = std::clamp<int64_t>(std::min((threads + tasks - 1) / tasks, tiles / 4), 1, kMaxSplits);
  }
  // No more splits than one per key tile of the longest band plus the sink's: a band of t tiles cut into S > t
  // splits gives one tile to each of the first t and leaves the others empty, the sink in the last, so S and t + 1
  // splits give the same partials in the same order, bit for bit (an empty split weighs exactly 0), and the
  // partials' workspace follows the keys the call reads, not a page table's capacity. A shape-only size query bounds
  // the keys by s_kv, which gives at least as many splits as the run.
  int64_t longest = c.s_kv;
  if (!len_kv.empty()) longest = *std::max_element(len_kv.begin(), len_kv.end());
  if (c.b > 0) splits = std::min(splits, (longest + kBlockK - 1) / kBlockK + 1);
  return std::max<int64_t>(splits, 1);
}

namespace {

// Partial results of the splits (S > 1) after the panels in the workspace: per (split, query head, row) the
// normalised partial output o (dvp floats) and its lse. Rows: dense n * s_q + i, varlen the packed row.
struct SplitPartials {
  int64_t splits = 1, rows = 0, dvp = 0, h_q = 0;
  float *o = nullptr, *lse = nullptr;
  SplitPartials(const Call& c, int64_t s) : splits(s), dvp(round_up8(c.d_v)), h_q(c.h_q) {
    rows = c.plan.varlen ? c.total_q : c.b * c.s_q;
  }
  int64_t floats() const { return splits > 1 ? ((splits * h_q * rows * (dvp + 1)) + 15) & ~int64_t(15) : 0; }
  void bind(float* ws) {
    o = ws;
    lse = ws + splits * h_q * rows * dvp;
  }
  int64_t index(int64_t split, int64_t h, int64_t row) const { return (split * h_q + h) * rows + row; }
};

// Reads the forward's seed / offset (SPEC.md section 2, dropout): rng_seed_offset when given, otherwise the
// scalars of the params; writes rng_state = {seed, offset} when given.
void resolve_rng(const Call& c, Ctx* ctx) {
  const sinkattn_params_t& p = *c.p;
  ctx->seed = p.seed;
  ctx->offset = p.offset;
  if (p.rng_seed_offset.rank > 0 && p.rng_seed_offset.data != nullptr) {
    const int64_t* t = static_cast<const int64_t*>(p.rng_seed_offset.data);
    ctx->seed = static_cast<uint64_t>(t[0]);
    ctx->offset = static_cast<uint64_t>(t[p.rng_seed_offset.strides[0]]);
  }
  if (p.rng_state.rank > 0 && p.rng_state.data != nullptr) {
    int64_t* t = static_cast<int64_t*>(p.rng_state.data);
    t[0] = static_cast<int64_t>(ctx->seed);
    t[p.rng_state.strides[0]] = static_cast<int64_t>(ctx->offset);
  }
}

struct FwdTiles {
  float *q, *s, *acc, *m, *l, *brow, *drow, *tmp;
};

// Split `split` of `parts.splits` of the block's band (all of it without splits).
void forward_block(const Ctx& x, const KvPanels& kv, const SplitPartials& parts, FwdTiles& t, int64_t n, int64_t h,
                   int64_t qb, int64_t split) {
  const Call& c = x.c;
  const sinkattn_params_t& p = x.p;
  const SeqBounds& sb = x.seq[n];
  const int64_t i0 = qb * kBlockQ;
  const int64_t nr_total = std::min<int64_t>(kBlockQ, x.alloc_q[n] - i0);  // rows this task writes
  if (nr_total <= 0) return;
  const int64_t nr = std::clamp<int64_t>(sb.len_q - i0, 0, nr_total);      // rows that are not padding
  const float sigma = x.sink(h);
  const float empty_lse = sigma;  // LSE of a row that sees no key: sigma, 0 (off_by_one), -inf (vanilla)
  const bool split_kv = parts.splits > 1;
  const bool carries_sink = split == parts.splits - 1;  // the one split that starts with the sink
  const float seed_m = carries_sink ? sigma : -INFINITY;
  const int64_t kvh = h / c.group;
  const int64_t d = c.d, dv = c.d_v, dp = x.dp, dvp = x.dvp;
  const float scale = c.softmax_scale;
  const bool has_bias = c.plan.bias == Use::kRequired;
  const bool dropout = c.plan.dropout;

  // Padding rows of a dense batch: out = 0, LSE = the empty-row value (SPEC.md section 2); written by split 0.
  for (int64_t r = nr; r < nr_total && split == 0; ++r) {
    const int64_t row = x.q_row(n, i0 + r);
    zero_row(x.out_row(p.out, c.out, n, row, h), c.dtype, dv);
    *x.lse_ptr(p.softmax_lse, c.lse, n, h, row) = empty_lse;
  }
  if (nr == 0) return;

  RowRanges rr;
  rr.compute(c, i0, nr, sb.len_q, sb.len_kv);
  // This split's tiles: [t_lo, t_hi) of the band's tiles (keys rr.klo + t * kBlockK ...).
  const int64_t tiles = (rr.khi - rr.klo + kBlockK - 1) / kBlockK;
  const int64_t per = (tiles + parts.splits - 1) / parts.splits;
  const int64_t t_lo = std::min(tiles, split * per), t_hi = std::min(tiles, t_lo + per);
  const int64_t j_lo = rr.klo + t_lo * kBlockK, j_hi = std::min(rr.khi, rr.klo + t_hi * kBlockK);

  for (int64_t r = 0; r < nr; ++r) {
    t.m[r] = seed_m;
    t.l[r] = seed_m > -INFINITY ? 1.f : 0.f;
  }
  std::memset(t.acc, 0, sizeof(float) * static_cast<size_t>(nr * dvp));

  if (j_lo < j_hi) {
    load_tile(c.dtype, nr, d, dp, t.q, [&](int64_t r) { return x.in_row(p.q, c.q, n, x.q_row(n, i0 + r), h); });
  }
  uint8_t active[kBlockQ];  // row r has a nonzero P in the current tile
  const __m256 neg_inf = _mm256_set1_ps(-INFINITY);
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int64_t j0 = j_lo; j0 < j_hi; j0 += kBlockK) {
    const int64_t jn = std::min<int64_t>(kBlockK, j_hi - j0);
    const int64_t jnp = round_up8(jn);
    // S = Q K^T (unscaled dot products; columns past jn are discarded below).
    gemm_tile<false>(t.s, kBlockK, t.q, dp, 1, kv.kt_at(n, kvh, j0), kv.ld(x, n), nr, jnp, d);

    for (int64_t r = 0; r < nr; ++r) {
      float* s = t.s + r * kBlockK;
      int64_t a, e;
      rr.cols(r, j0, jn, &a, &e);
      active[r] = 0;
      if (a >= e) {  // this row sees no key of this tile: P = 0, state unchanged
        std::memset(s, 0, sizeof(float) * static_cast<size_t>(jnp));
        continue;
      }
      if (has_bias) load_bias_row(c, n, h, i0 + r, j0, a, e, jnp, t.brow);
      // S_ij = scale * dot + bias on visible columns, -inf elsewhere (the masked value is replaced, not scaled).
      __m256 vmax = neg_inf;
      for (int64_t jj = 0; jj < jnp; jj += 8) {
        __m256 sv = _mm256_mul_ps(_mm256_loadu_ps(s + jj), vscale);
        if (has_bias) sv = _mm256_add_ps(sv, _mm256_loadu_ps(t.brow + jj));
        sv = _mm256_blendv_ps(neg_inf, sv, range_mask(jj, a, e));
        _mm256_storeu_ps(s + jj, sv);
        vmax = _mm256_max_ps(vmax, sv);
      }
      const float m_old = t.m[r];
      const float m_new = std::max(m_old, hmax_ps(vmax));
      if (m_new == -INFINITY) {  // every logit so far is -inf (and no sink): nothing seen yet
        std::memset(s, 0, sizeof(float) * static_cast<size_t>(jnp));
        continue;
      }
      active[r] = 1;
      const __m256 vm = _mm256_set1_ps(m_new);
      __m256 vsum = _mm256_setzero_ps();
      for (int64_t jj = 0; jj < jnp; jj += 8) {
        const __m256 pv = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(s + jj), vm));
        _mm256_storeu_ps(s + jj, pv);
        vsum = _mm256_add_ps(vsum, pv);
      }
      const float alpha = m_old == -INFINITY ? 0.f : std::exp(m_old - m_new);
      t.l[r] = t.l[r] * alpha + hsum_ps(vsum);
      t.m[r] = m_new;
      if (alpha != 1.f) {
        float* acc = t.acc + r * dvp;
        const __m256 va = _mm256_set1_ps(alpha);
        for (int64_t col = 0; col < dvp; col += 8) _mm256_storeu_ps(acc + col, _mm256_mul_ps(_mm256_loadu_ps(acc + col), va));
      }
      if (dropout) {  // the normaliser l uses the undropped P; the value sum uses P * keep / (1 - p)
        dropout_row(c, x.seed, x.offset, x.rdrop, n, h, i0 + r, j0, a, e, t.drow);
        for (int64_t jj = a; jj < e; ++jj) s[jj] *= t.drow[jj];
      }
    }
    // acc += P V (keys j0 .. j0 + jn - 1 all lie in the block's visible band). P is exactly 0 where a row does not
    // see a key; that is exact when every V row of the tile is finite, otherwise each row sums its own keys only.
    if (kv.v_finite(n, kvh, j0, jn)) {
      gemm_tile<true>(t.acc, dvp, t.s, kBlockK, 1, kv.v_at(n, kvh, j0), dvp, nr, dvp, jn);
    } else {
      gemm_tile_ranged(t.acc, dvp, t.s, kBlockK, 1, kv.v_at(n, kvh, j0), dvp, nr, dvp,
                       [&](int64_t r, int64_t* lo, int64_t* hi) {
                         rr.cols(r, j0, jn, lo, hi);
                         if (!active[r]) *hi = *lo;
                       });
    }
  }

  // Finalize: out = acc / l, LSE = m + log(l) (with splits: this split's partial o = acc / l and lse).
  for (int64_t r = 0; r < nr; ++r) {
    const int64_t row = x.q_row(n, i0 + r);
    const float l = t.l[r];
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const float lse = l > 0.f ? static_cast<float>(static_cast<double>(t.m[r]) + std::log(static_cast<double>(l)))
                              : -INFINITY;
    if (split_kv) {
      const int64_t at = parts.index(split, h, c.plan.varlen ? row : n * c.s_q + i0 + r);
      float* o = parts.o + at * parts.dvp;
      for (int64_t col = 0; col < dv; ++col) o[col] = t.acc[r * dvp + col] * inv;
      parts.lse[at] = lse;
      continue;
    }
    store_row_scaled(t.acc + r * dvp, dv, inv, x.out_row(p.out, c.out, n, row, h), c.dtype, t.tmp);
    *x.lse_ptr(p.softmax_lse, c.lse, n, h, row) = lse;
  }
}

// The combine of the splits' partials of rows [0, len_q) of (n, h): lse = log sum_s exp(lse_s) (computed from the
// largest), out = sum_s exp(lse_s - lse) o_s. Partials with lse_s = -inf (empty, vanilla splits) weigh 0.
void combine_row(const Ctx& x, const SplitPartials& parts, int64_t n, int64_t h, int64_t i, float* acc, float* tmp) {
  const Call& c = x.c;
  const int64_t row = x.q_row(n, i);
  const int64_t prow = c.plan.varlen ? row : n * c.s_q + i;
  float m = -INFINITY;
  for (int64_t s = 0; s < parts.splits; ++s) m = std::max(m, parts.lse[parts.index(s, h, prow)]);
  std::fill(acc, acc + c.d_v, 0.f);
  float lse = -INFINITY;
  if (m > -INFINITY) {
    double sum = 0;
    for (int64_t s = 0; s < parts.splits; ++s) sum += std::exp(static_cast<double>(parts.lse[parts.index(s, h, prow)]) - m);
    lse = static_cast<float>(m + std::log(sum));
    for (int64_t s = 0; s < parts.splits; ++s) {
      const int64_t at = parts.index(s, h, prow);
      const float w = static_cast<float>(std::exp(static_cast<double>(parts.lse[at]) - lse));
      if (w == 0.f) continue;  // also keeps an empty split's o (zeros) out of the sum
      const float* o = parts.o + at * parts.dvp;
      for (int64_t col = 0; col < c.d_v; ++col) acc[col] += w * o[col];
    }
  }
  store_row_scaled(acc, c.d_v, 1.f, x.out_row(x.p.out, c.out, n, row, h), c.dtype, tmp);
  *x.lse_ptr(x.p.softmax_lse, c.lse, n, h, row) = lse;
}

}  // namespace

size_t forward_workspace_bytes(const Call& c) {
  const std::vector<int64_t> len_kv = known_kv_lengths(c);
  const SplitPartials parts(c, forward_num_splits(c, len_kv));
  return static_cast<size_t>(forward_panels(c, len_kv).floats() + parts.floats()) * sizeof(float);
}

std::string forward_workspace_report(const Call& c) {
  const std::vector<int64_t> len_kv = known_kv_lengths(c);
  const KvPanels kv = forward_panels(c, len_kv);
  const SplitPartials parts(c, forward_num_splits(c, len_kv));
  std::string s = "fp32 K^T and V panels: " + std::to_string(kv.slots) + " key slots x " + std::to_string(c.h_kv) +
                  " KV heads x " + std::to_string(kv.bytes_per_slot() / c.h_kv) + " bytes (" +
                  (len_kv.empty() && c.b > 0 ? "a bound from shapes: this size query has no batch tensor data"
                                             : "the keys each sequence reads, each rounded up to 8, + 8") +
                  ")";
  if (parts.splits > 1)
    s += "; " + std::to_string(parts.splits) + " key splits' partial outputs: " + std::to_string(parts.floats() * 4) +
         " bytes";
  return s;
}

Status run_forward(const Call& c) {
  Ctx x(c);
  resolve_rng(c, &x);
  const std::vector<int64_t> len_kv = known_kv_lengths(c);
  SplitPartials parts(c, forward_num_splits(c, len_kv));
  const int64_t blocks = c.b * c.h_q * x.nqb;
  const int64_t tasks = blocks * parts.splits;
  if (tasks == 0) return Status::ok();
  KvPanels kv = forward_panels(c, len_kv);
  if (kv.floats() + parts.floats() > 0 && c.p->workspace == nullptr) return internal_error("cpu forward: workspace is NULL");
  kv.bind(static_cast<float*>(c.p->workspace));
  parts.bind(static_cast<float*>(c.p->workspace) + kv.floats());
  kv.fill(x);
  const size_t floats = scratch_floats({size_t(kBlockQ * x.dp), size_t(kBlockQ * kBlockK), size_t(kBlockQ * x.dvp), size_t(kBlockQ),
                                        size_t(kBlockQ), size_t(kBlockK), size_t(kBlockK),
                                        size_t(std::max(x.dp, x.dvp))});
#pragma omp parallel num_threads(x.threads)
  {
    Scratch sc(floats);
    FwdTiles t;
    t.q = sc.take(size_t(kBlockQ * x.dp));
    t.s = sc.take(size_t(kBlockQ * kBlockK));
    t.acc = sc.take(size_t(kBlockQ * x.dvp));
    t.m = sc.take(size_t(kBlockQ));
    t.l = sc.take(size_t(kBlockQ));
    t.brow = sc.take(size_t(kBlockK));
    t.drow = sc.take(size_t(kBlockK));
    t.tmp = sc.take(size_t(std::max(x.dp, x.dvp)));
    // Task order: query blocks from the last (the most keys under a causal mask) to the first, for balance; the
    // splits of one block are consecutive tasks.
#pragma omp for schedule(dynamic, 1)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t split = task % parts.splits, blk = task / parts.splits;
      const int64_t qb = x.nqb - 1 - blk % x.nqb;
      const int64_t nh = blk / x.nqb;
      forward_block(x, kv, parts, t, nh / c.h_q, nh % c.h_q, qb, split);
    }
    if (parts.splits > 1) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t nh = 0; nh < c.b * c.h_q; ++nh) {
        const int64_t n = nh / c.h_q, h = nh % c.h_q;
        for (int64_t i = 0; i < x.seq[n].len_q; ++i) combine_row(x, parts, n, h, i, t.acc, t.tmp);
      }
    }
  }
  return Status::ok();
}

}  // namespace sinkattn::cpu

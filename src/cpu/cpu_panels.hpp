// fp32 copies of K and V, converted once per call into the layouts the tile products read directly (no
// conversion or transpose inside the tile loops):
//   kt [d][ld_n]   K transposed      (S = Q K^T: columns are keys)
//   k  [ld_n][dp]  K rows            (dq += dS K)
//   v  [ld_n][dvp] V rows            (out += P V)
//   vt [d_v][ld_n] V transposed      (dP = dO V^T)
// per (sequence n, KV head), with ld_n = round_up8(len_kv_n) + 8 key slots: keys past len_kv_n are zeros, so a
// tile may read up to 7 columns past its last key. The panels hold the keys each sequence reads (len_kv_n:
// seqlens_kv, seqused_kv, the cu_seqlens_kv differences), never the capacity of the tensors they come from: a page
// table of 65,536 pages per sequence whose sequences use 100 keys costs 100 keys (SPEC.md section 1: entries past
// ceil(seqused_kv / page_size) are never read). The size query reads the lengths when it is given the batch
// tensors (as every run is); a shape-only query (NULL data) gets the bound from shapes. Masked keys inside the sequence (out of window) keep their
// values; the kernels never let them reach an output: their scores are replaced by -inf and their P and dS by
// exactly 0, and a product with K or V rows (P V, dS K) runs on the fast tile kernel only when every key row of
// the tile is finite (0 * finite = 0), else on the exact per-row kernel over visible keys only (k_fin / v_fin
// flag the finite rows). Lives in the workspace (SPEC.md section 4).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cpu/cpu_common.hpp"

namespace sinkattn::cpu {

// The keys each sequence reads (SeqSpan::len_kv), when the call's batch tensors can be read here: q and every present
// batch tensor have data (host memory, whose contents resolve_call has checked). Empty for a shape-only size query
// (NULL data pointers), whose sizes then come from shapes alone.
inline std::vector<int64_t> known_kv_lengths(const Call& c) {
  const sinkattn_params_t& p = *c.p;
  if (p.q.data == nullptr || c.memory != Memory::kHost) return {};
  const bool need[] = {c.plan.varlen, c.plan.varlen && !c.paged.on, c.plan.seqused_kv, c.plan.seqlens_q,
                       c.plan.seqlens_kv};
  const sinkattn_tensor_t* tensors[] = {&p.cu_seqlens_q, &p.cu_seqlens_kv, &p.seqused_kv, &p.seqlens_q, &p.seqlens_kv};
  for (int i = 0; i < 5; ++i)
    if (need[i] && tensors[i]->data == nullptr) return {};
  const BatchTensors bt = batch_tensors(c);
  std::vector<int64_t> len(static_cast<size_t>(c.b));
  for (int64_t n = 0; n < c.b; ++n) len[n] = seq_span<int64_t>(bt, n).len_kv;
  return len;
}

struct KvPanels {
  bool want_kt = false, want_k = false, want_v = false, want_vt = false;
  int64_t slots = 0;             // key slots per KV head: sum_n ld(n), or a bound of it from shapes alone
  int64_t h_kv = 0;
  std::vector<int64_t> seq_off;  // first slot of sequence n
  float *kt = nullptr, *k = nullptr, *v = nullptr, *vt = nullptr;
  uint8_t *k_fin = nullptr, *v_fin = nullptr;  // per key slot: the K row / V row is finite
  int64_t d = 0, dv = 0, dp = 0, dvp = 0;

  // `len_kv`: known_kv_lengths(c). Known: exactly the slots fill() lays out, sum_n round_up8(len_kv_n) + 8. Unknown
  // (shape-only query): a bound of it, since each sequence holds at most s_kv keys (dense extent, max_pages *
  // page_size, or max_seqlen_kv for varlen queries over a page table), varlen ones at most their cu_seqlens_kv rows.
  // Pages shared between sequences are converted once per sequence.
  KvPanels(const Call& c, const std::vector<int64_t>& len_kv, bool kt_, bool k_, bool v_, bool vt_)
      : want_kt(kt_), want_k(k_), want_v(v_), want_vt(vt_), h_kv(c.h_kv), d(c.d), dv(c.d_v),
        dp(round_up8(c.d)), dvp(round_up8(c.d_v)) {
    if (!len_kv.empty() || c.b == 0) {
      slots = 0;
      for (int64_t l : len_kv) slots += round_up8(l) + 8;
    } else {
      slots = c.plan.varlen && !c.paged.on ? c.total_kv + 16 * c.b : c.b * (round_up8(c.s_kv) + 8);
    }
  }
  int64_t bytes_per_slot() const {
    return 4 * h_kv * ((want_kt ? d : 0) + (want_k ? dp : 0) + (want_v ? dvp : 0) + (want_vt ? dv : 0));
  }
  int64_t floats() const {
    const int64_t per_slot = (want_kt ? d : 0) + (want_k ? dp : 0) + (want_v ? dvp : 0) + (want_vt ? dv : 0);
    return ((slots * h_kv * per_slot + 15) & ~int64_t(15)) + 2 * flag_floats();
  }
  int64_t flag_floats() const { return ((slots * h_kv + 3) / 4 + 15) & ~int64_t(15); }
  // Carves the panels out of `ws` (floats() floats).
  void bind(float* ws) {
    float* at = ws;
    const int64_t s = slots * h_kv;
    if (want_kt) { kt = at; at += s * d; }
    if (want_k) { k = at; at += s * dp; }
    if (want_v) { v = at; at += s * dvp; }
    if (want_vt) { vt = at; at += s * dv; }
    at = ws + (((s * ((want_kt ? d : 0) + (want_k ? dp : 0) + (want_v ? dvp : 0) + (want_vt ? dv : 0))) + 15) &
               ~int64_t(15));
    k_fin = reinterpret_cast<uint8_t*>(at);
    v_fin = reinterpret_cast<uint8_t*>(at + flag_floats());
  }

  int64_t ld(const Ctx& x, int64_t n) const { return round_up8(x.seq[n].len_kv) + 8; }
  int64_t base(int64_t n, int64_t kvh) const { return kvh * slots + seq_off[n]; }
  // Key j of (n, kvh) in each layout (transposed ones: column j, leading dimension ld(n)).
  const float* kt_at(int64_t n, int64_t kvh, int64_t j) const { return kt + base(n, kvh) * d + j; }
  const float* vt_at(int64_t n, int64_t kvh, int64_t j) const { return vt + base(n, kvh) * dv + j; }
  const float* k_at(int64_t n, int64_t kvh, int64_t j) const { return k + (base(n, kvh) + j) * dp; }
  const float* v_at(int64_t n, int64_t kvh, int64_t j) const { return v + (base(n, kvh) + j) * dvp; }
  // Are the K rows / V rows of keys j .. j + count - 1 of (n, kvh) all finite?
  bool k_finite(int64_t n, int64_t kvh, int64_t j, int64_t count) const {
    return all_set(k_fin + base(n, kvh) + j, count);
  }
  bool v_finite(int64_t n, int64_t kvh, int64_t j, int64_t count) const {
    return all_set(v_fin + base(n, kvh) + j, count);
  }

  // Converts K and V of every (n, kvh) (parallel over them).
  void fill(const Ctx& x) {
    const Call& c = x.c;
    const sinkattn_params_t& p = x.p;
    seq_off.assign(static_cast<size_t>(c.b) + 1, 0);
    for (int64_t n = 0; n < c.b; ++n) seq_off[n + 1] = seq_off[n] + ld(x, n);
    const int64_t tasks = c.b * c.h_kv;
#pragma omp parallel num_threads(x.threads)
    {
      std::vector<float> tmp(static_cast<size_t>(std::max(dp, dvp)));
#pragma omp for schedule(dynamic, 1)
      for (int64_t task = 0; task < tasks; ++task) {
        const int64_t n = task / c.h_kv, kvh = task % c.h_kv;
        const int64_t len = x.seq[n].len_kv, l = ld(x, n);
        float* ktb = want_kt ? kt + base(n, kvh) * d : nullptr;
        float* vtb = want_vt ? vt + base(n, kvh) * dv : nullptr;
        for (int64_t j = 0; j < l; ++j) {
          if (want_kt || want_k) {
            float* row = want_k ? k + (base(n, kvh) + j) * dp : tmp.data();
            if (j < len) load_row(x.kv_in_row(p.k, c.k, n, j, kvh), c.dtype, d, row, dp);
            else std::fill(row, row + dp, 0.f);
            k_fin[base(n, kvh) + j] = row_finite(row, d) ? 1 : 0;
            if (want_kt) for (int64_t col = 0; col < d; ++col) ktb[col * l + j] = row[col];
          }
          if (want_v || want_vt) {
            float* row = want_v ? v + (base(n, kvh) + j) * dvp : tmp.data();
            if (j < len) load_row(x.kv_in_row(p.v, c.v, n, j, kvh), c.dtype, dv, row, dvp);
            else std::fill(row, row + dvp, 0.f);
            v_fin[base(n, kvh) + j] = row_finite(row, dv) ? 1 : 0;
            if (want_vt) for (int64_t col = 0; col < dv; ++col) vtb[col * l + j] = row[col];
          }
        }
      }
    }
  }
};

}  // namespace sinkattn::cpu

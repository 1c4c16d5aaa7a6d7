// Shared pieces of the CPU forward and backward: per-call context (sequence bounds, thread count), per-row visible
// key ranges of a query block, bias and dropout rows. SPEC.md sections 1-3; addressing as in DESIGN.md
// "Row addressing".
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "core/call.hpp"
#include "core/philox.hpp"
#include "cpu/cpu_simd.hpp"

namespace sinkattn::cpu {

// Tile sizes: kBlockQ query rows x kBlockK keys.
constexpr int64_t kBlockQ = 64;
constexpr int64_t kBlockK = 64;
// Split-KV: at most this many key splits per row (num_splits above it is clamped; the CUDA decode kernels agree).
constexpr int64_t kMaxSplits = 128;

// OpenMP threads of a call: all cores, or at most num_threads.
inline int cpu_threads(const sinkattn_params_t& p) {
  int threads = omp_get_max_threads();
  if (p.num_threads > 0) threads = std::min<int>(threads, p.num_threads);
  return std::max(threads, 1);
}

// Everything a pass needs that does not depend on the tile.
struct Ctx {
  const Call& c;
  const sinkattn_params_t& p;
  std::vector<SeqBounds> seq;  // per sequence n (host_seq_bounds)
  std::vector<int64_t> alloc_q, alloc_kv;  // rows sequence n owns in q-like / k-like tensors (dense: s_q, s_kv;
                                           // varlen: cu_seqlens differences, which include keys past seqused_kv)
  int64_t rows_q = 0;          // query rows per sequence the grid covers: dense s_q (padding rows too), varlen max
  int64_t rows_kv = 0;         // key rows per sequence the grid covers (dense s_kv, varlen max_seqlen_kv)
  int64_t nqb = 0, nkb = 0;    // query / key blocks per sequence
  int64_t dp = 0, dvp = 0;     // d, d_v rounded up to 8
  int threads = 1;
  uint64_t seed = 0, offset = 0;
  float rdrop = 1.f;           // 1 / (1 - p)

  explicit Ctx(const Call& call) : c(call), p(*call.p) {
    seq.resize(static_cast<size_t>(c.b));
    alloc_q.resize(static_cast<size_t>(c.b));
    alloc_kv.resize(static_cast<size_t>(c.b));
    const BatchTensors bt = batch_tensors(c);
    for (int64_t n = 0; n < c.b; ++n) {
      seq[n] = seq_span<int64_t>(bt, n);
      alloc_q[n] = seq[n].rows_q;
      alloc_kv[n] = seq[n].rows_kv;
    }
    rows_q = c.s_q;
    rows_kv = c.s_kv;
    nqb = (rows_q + kBlockQ - 1) / kBlockQ;
    nkb = (rows_kv + kBlockK - 1) / kBlockK;
    dp = round_up8(c.d);
    dvp = round_up8(c.d_v);
    threads = cpu_threads(p);
    if (c.plan.dropout) rdrop = static_cast<float>(1.0 / (1.0 - c.dropout_p));
  }

  // Rows of sequence n in the packed (varlen) or padded (dense) q-like tensors: global row of row i.
  int64_t q_row(int64_t n, int64_t i) const { return seq[n].q_start + i; }
  // Key row j of sequence n in k-like tensors that are not page pools (dk, dv of the backward).
  int64_t kv_row(int64_t n, int64_t j) const { return seq[n].kv_start + j; }
  // Key j of sequence n (head h) of k or v, through the page table for paged KV (core/kv_rows.hpp).
  const void* kv_in_row(const sinkattn_tensor_t& t, const RowStrides& s, int64_t n, int64_t j, int64_t h) const {
    const KvRowIndex r = host_kv_row(c, seq[n], n, j);
    return at<const char>(t.data, c.dtype, s, r.b, r.s, h);
  }

  // Element (n, row, head) of a q/k/v/out-like tensor.
  template <typename T>
  static T* at(void* base, sinkattn_dtype_t dt, const RowStrides& s, int64_t n, int64_t row, int64_t h) {
    const int64_t off = row_offset(s, n, row, h);
    return reinterpret_cast<T*>(static_cast<char*>(base) + off * (dt == SINKATTN_F32 ? 4 : 2));
  }
  const void* in_row(const sinkattn_tensor_t& t, const RowStrides& s, int64_t n, int64_t row, int64_t h) const {
    return at<const char>(t.data, c.dtype, s, n, row, h);
  }
  void* out_row(const sinkattn_tensor_t& t, const RowStrides& s, int64_t n, int64_t row, int64_t h) const {
    return at<char>(t.data, c.dtype, s, n, row, h);
  }
  float* lse_ptr(const sinkattn_tensor_t& t, const LseStrides& s, int64_t n, int64_t h, int64_t row) const {
    return static_cast<float*>(t.data) + lse_offset(s.b, s.h, s.s, n, h, row);
  }

  // sigma of SPEC.md section 2 and the LSE of a row that sees no key (sigma; -inf for vanilla).
  float sink(int64_t h) const { return host_sink(c, h); }
};

// Visible key ranges [lo[r], hi[r]) (within the sequence) of the query rows i0 .. i0 + nr - 1 of one sequence,
// and their union [klo, khi) (contiguous: lo and hi are non-decreasing in i and a window is never empty).
struct RowRanges {
  int64_t lo[kBlockQ], hi[kBlockQ];
  int64_t klo = 0, khi = 0;  // klo >= khi: no row sees a key

  void compute(const Call& c, int64_t i0, int64_t nr, int64_t len_q, int64_t len_kv) {
    klo = INT64_MAX;
    khi = INT64_MIN;
    for (int64_t r = 0; r < nr; ++r) {
      const KeyRange kr = visible_keys(c, i0 + r, len_q, len_kv);
      lo[r] = kr.lo;
      hi[r] = kr.hi;
      if (kr.lo < kr.hi) {
        klo = std::min(klo, kr.lo);
        khi = std::max(khi, kr.hi);
      }
    }
    if (klo >= khi) klo = khi = 0;
  }
  // Columns [a, e) of key tile [j0, j0 + jn) that row r sees (a >= e: none).
  void cols(int64_t r, int64_t j0, int64_t jn, int64_t* a, int64_t* e) const {
    *a = std::max<int64_t>(lo[r] - j0, 0);
    *e = std::min<int64_t>(hi[r] - j0, jn);
  }
};

// bias[n, h, i, j0 + [a, e)] in fp32 into dst[a .. e), zeros in dst[0 .. a) and dst[e .. jnp) (post-scale
// bias, SPEC.md section 2; broadcast dims have stride 0). Only visible positions are read.
inline void load_bias_row(const Call& c, int64_t n, int64_t h, int64_t i, int64_t j0, int64_t a, int64_t e,
                          int64_t jnp, float* dst) {
  const int64_t base = n * c.bias.b + h * c.bias.h + i * c.bias.i;
  const void* data = c.p->bias.data;
  for (int64_t jj = 0; jj < a; ++jj) dst[jj] = 0.f;
  for (int64_t jj = a; jj < e; ++jj) dst[jj] = load_scalar(data, base + (j0 + jj) * c.bias.j, c.bias_dtype);
  for (int64_t jj = e; jj < jnp; ++jj) dst[jj] = 0.f;
}

// Dropout multipliers of SPEC.md section 2 for (n, h, i) and keys j0 + [a, e): keep ? 1/(1-p) : 0, written to
// dst[a .. e). idx = ((n * h_q + h) * max_s_q + i) * max_s_kv + j; one Philox block per 4 consecutive idx.
inline void dropout_row(const Call& c, uint64_t seed, uint64_t offset, float rdrop, int64_t n, int64_t h, int64_t i,
                        int64_t j0, int64_t a, int64_t e, float* dst) {
  const uint64_t base = dropout_index(n, h, i, 0, c.h_q, c.s_q, c.s_kv);
  int64_t jj = a;
  while (jj < e) {
    const uint64_t idx = base + static_cast<uint64_t>(j0 + jj);
    const Philox4 w = dropout_block(seed, offset, idx);
    for (uint64_t lane = idx & 3; lane < 4 && jj < e; ++lane, ++jj)
      dst[jj] = w.w[lane] >= c.dropout_threshold ? rdrop : 0.f;
  }
}

// Tile loaders. `row(r)` gives the source row r (dtype c.dtype, `cols` contiguous elements).
// Row layout: dst[r * ld + col], columns [cols, ld) zero-filled.
template <typename RowFn>
inline void load_tile(sinkattn_dtype_t dt, int64_t nrows, int64_t cols, int64_t ld, float* dst, RowFn row) {
  for (int64_t r = 0; r < nrows; ++r) load_row(row(r), dt, cols, dst + r * ld, ld);
}
// Per-thread scratch: one allocation, carved into tiles.
struct Scratch {
  std::vector<float> buf;
  size_t used = 0;
  explicit Scratch(size_t floats) : buf(floats, 0.f) {}
  float* take(size_t n) {
    float* ptr = buf.data() + used;
    used += (n + 15) & ~size_t(15);
    return ptr;
  }
};
// Floats a Scratch needs for tiles of the given sizes (each rounded like take()).
inline size_t scratch_floats(std::initializer_list<size_t> sizes) {
  size_t t = 0;
  for (size_t s : sizes) t += (s + 15) & ~size_t(15);
  return t;
}

}  // namespace sinkattn::cpu

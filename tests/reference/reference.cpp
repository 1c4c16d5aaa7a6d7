// Naive float64 reference of SPEC.md sections 2-3 (see reference.hpp). Written for obviousness, not speed:
// every (sequence n, query head h, query row i) is evaluated on its own straight from the formulas.
// Independent of the library: nothing from src/ is included and no library function is called.
#include "reference.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <future>
#include <limits>
#include <stdexcept>

namespace sinkattn::ref {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> binary16, round to nearest even (overflow to inf, subnormals kept).
uint16_t float_to_half(float x) {
  const uint32_t f = float_bits(x);
  const uint16_t sign = static_cast<uint16_t>((f >> 16) & 0x8000u);
  const uint32_t a = f & 0x7fffffffu;
  if (a >= 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u));
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (a < 0x38800000u) {                                               // below 2^-14: subnormal half
    // units of 2^-24, rounded to nearest even (default FP rounding mode of nearbyint).
    const double units = std::nearbyint(static_cast<double>(bits_float(a)) * 16777216.0);
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(units));
  }
  const uint32_t exp = (a >> 23) - 127 + 15;
  const uint32_t mant = a & 0x7fffffu;
  uint32_t h = (exp << 10) | (mant >> 13);
  const uint32_t rem = mant & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // carry into the exponent is correct
  return static_cast<uint16_t>(sign | h);
}

int64_t product(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (int64_t x : s) n *= x;
  return n;
}

Array make(std::vector<int64_t> shape, double fill) {
  Array a;
  a.shape = std::move(shape);
  a.data.assign(static_cast<size_t>(product(a.shape)), fill);
  return a;
}

bool present(const sinkattn_tensor_t& t) { return t.rank > 0; }

// Element offset (in elements) of a multi-index of t.
int64_t offset_of(const sinkattn_tensor_t& t, const int64_t* idx) {
  int64_t off = 0;
  for (int r = 0; r < t.rank; ++r) off += idx[r] * t.strides[r];
  return off;
}

double load(const sinkattn_tensor_t& t, int64_t off) {
  switch (t.dtype) {
    case SINKATTN_F32: return static_cast<const float*>(t.data)[off];
    case SINKATTN_F16: return half_to_double(static_cast<const uint16_t*>(t.data)[off]);
    case SINKATTN_BF16: return bf16_to_double(static_cast<const uint16_t*>(t.data)[off]);
    case SINKATTN_I32: return static_cast<const int32_t*>(t.data)[off];
    case SINKATTN_I64: return static_cast<double>(static_cast<const int64_t*>(t.data)[off]);
  }
  throw std::invalid_argument("reference: unknown dtype");
}

void store(const sinkattn_tensor_t& t, int64_t off, double x) {
  switch (t.dtype) {
    case SINKATTN_F32: static_cast<float*>(t.data)[off] = static_cast<float>(x); return;
    case SINKATTN_F16: static_cast<uint16_t*>(t.data)[off] = double_to_half(x); return;
    case SINKATTN_BF16: static_cast<uint16_t*>(t.data)[off] = double_to_bf16(x); return;
    case SINKATTN_I32: static_cast<int32_t*>(t.data)[off] = static_cast<int32_t>(x); return;
    case SINKATTN_I64: static_cast<int64_t*>(t.data)[off] = static_cast<int64_t>(x); return;
  }
  throw std::invalid_argument("reference: unknown dtype");
}

// Visits every multi-index of `shape` in row-major order.
template <class F>
void for_each_index(const std::vector<int64_t>& shape, F&& f) {
  const int rank = static_cast<int>(shape.size());
  if (product(shape) == 0) return;
  int64_t idx[SINKATTN_MAX_RANK] = {0, 0, 0, 0};
  int64_t linear = 0;
  while (true) {
    f(idx, linear++);
    int r = rank - 1;
    while (r >= 0 && ++idx[r] == shape[r]) idx[r--] = 0;
    if (r < 0) return;
  }
}

// The resolved call, read into dense float64 arrays.
struct Problem {
  bool varlen = false;
  int64_t b = 0, s_q = 0, s_kv = 0, h_q = 0, h_kv = 0, d = 0, d_v = 0, total_q = 0, total_kv = 0, group = 1;
  std::vector<int64_t> cu_q, cu_kv, len_q, len_kv;
  Array q, k, v, bias, d_out, d_lse;
  Array given_out;  // p.out, read for DFrom::kGivenOut (backward only)
  bool has_bias = false, has_d_lse = false, d_from_given_out = false;
  sinkattn_dtype_t dtype = SINKATTN_F32, bias_dtype = SINKATTN_F32;
  std::vector<double> sigma;  // per query head
  double scale = 0;
  int64_t wl = -1, wr = -1;
  bool bottom_right = true;
  double p_drop = 0;
  uint64_t seed = 0, offset = 0;

  int64_t q_row(int64_t n, int64_t i) const { return varlen ? cu_q[n] + i : n * s_q + i; }
  bool varlen_kv_only = false;  // paged KV with dense queries: keys packed as varlen (parse_paged), queries dense
  int64_t kv_row(int64_t n, int64_t j) const { return varlen || varlen_kv_only ? cu_kv[n] + j : n * s_kv + j; }
  int64_t rows_of(int64_t n) const { return varlen ? cu_q[n + 1] - cu_q[n] : s_q; }       // rows in the buffer
  int64_t keys_of(int64_t n) const { return varlen ? cu_kv[n + 1] - cu_kv[n] : s_kv; }    // keys in the buffer
  int64_t lse_index(int64_t n, int64_t h, int64_t i) const {
    return varlen ? h * total_q + cu_q[n] + i : (n * h_q + h) * s_q + i;
  }
  // SPEC.md section 2, masks: the keys row i of sequence n sees.
  KeyRange keys(int64_t n, int64_t i) const { return visible_keys(i, len_q[n], len_kv[n], wl, wr, bottom_right); }
  double bias_at(int64_t n, int64_t h, int64_t i, int64_t j) const {
    const auto& s = bias.shape;
    const int64_t nb = s[0] == 1 ? 0 : n, hb = s[1] == 1 ? 0 : h;
    return bias.data[((nb * s[1] + hb) * s[2] + i) * s[3] + j];
  }
  int64_t bias_index(int64_t n, int64_t h, int64_t i, int64_t j) const {
    const auto& s = bias.shape;
    const int64_t nb = s[0] == 1 ? 0 : n, hb = s[1] == 1 ? 0 : h;
    return ((nb * s[1] + hb) * s[2] + i) * s[3] + j;
  }
};

void require(bool ok, const char* what) {
  if (!ok) throw std::invalid_argument(std::string("reference: ") + what);
}

// Paged KV (SPEC.md section 1): k, v are page pools [num_pages, page_size, h_kv, d | d_v]; key j < seqused_kv[n]
// of sequence n is row j % page_size of page page_table[n, j / page_size]. The keys of every sequence are gathered
// into a packed [sum_n seqused_kv[n], h_kv, d] array (sequence n at rows cu_kv[n] .., cu_kv the prefix sums of
// seqused_kv), described as a varlen key side with len_kv = seqused_kv; queries stay dense or varlen. Only the page
// table entries a sequence uses are read (entries past ceil(seqused_kv[n] / page_size) never are), and nothing is
// sized by the table's capacity max_pages * page_size. Forward only.
void parse_paged(const sinkattn_params_t& p, bool backward, Problem& pr) {
  require(!backward, "paged KV (page_table) is forward only");
  require(p.k.rank == 4 && p.v.rank == 4, "paged k, v must be page pools of rank 4");
  require(present(p.seqused_kv), "a page_table needs seqused_kv");
  require(!present(p.cu_seqlens_kv) && !present(p.seqlens_kv), "a page_table takes key lengths from seqused_kv");
  const int64_t num_pages = p.k.shape[0], page_size = p.k.shape[1];
  pr.h_kv = p.k.shape[2];
  pr.d_v = p.v.shape[3];
  require(p.v.shape[0] == num_pages && p.v.shape[1] == page_size && p.v.shape[2] == pr.h_kv, "k, v pools disagree");
  require(p.page_table.rank == 2, "page_table must be [b, max_pages]");
  const int64_t max_pages = p.page_table.shape[1], cap = max_pages * page_size;
  const auto table_entry = [&](int64_t n, int64_t pg) {
    const int64_t idx[2] = {n, pg};
    return static_cast<int64_t>(load(p.page_table, offset_of(p.page_table, idx)));
  };
  if (pr.varlen) {
    require(p.q.rank == 3, "varlen q must have rank 3");
    pr.total_q = p.q.shape[0];
    pr.h_q = p.q.shape[1];
    pr.d = p.q.shape[2];
    for (double x : read_tensor(p.cu_seqlens_q).data) pr.cu_q.push_back(static_cast<int64_t>(x));
    require(pr.cu_q.size() >= 1 && pr.cu_q[0] == 0, "cu_seqlens_q must start at 0");
    pr.b = static_cast<int64_t>(pr.cu_q.size()) - 1;
    int64_t longest_q = 0;
    for (int64_t n = 0; n < pr.b; ++n) {
      require(pr.cu_q[n + 1] >= pr.cu_q[n], "cu_seqlens_q must be non-decreasing");
      pr.len_q.push_back(pr.cu_q[n + 1] - pr.cu_q[n]);
      longest_q = std::max(longest_q, pr.len_q[n]);
    }
    pr.s_q = p.max_seqlen_q > 0 ? p.max_seqlen_q : longest_q;
  } else {
    require(p.q.rank == 4, "dense q must have rank 4");
    pr.b = p.q.shape[0];
    pr.s_q = p.q.shape[1];
    pr.h_q = p.q.shape[2];
    pr.d = p.q.shape[3];
    pr.total_q = pr.b * pr.s_q;
    for (int64_t n = 0; n < pr.b; ++n)
      pr.len_q.push_back(present(p.seqlens_q) ? static_cast<int64_t>(read_tensor(p.seqlens_q).data.at(n)) : pr.s_q);
  }
  require(p.k.shape[3] == pr.d && p.page_table.shape[0] == pr.b, "paged shapes disagree");
  const std::vector<double> used = read_tensor(p.seqused_kv).data;
  require(static_cast<int64_t>(used.size()) == pr.b, "seqused_kv must have b entries");
  pr.cu_kv.assign(1, 0);
  for (int64_t n = 0; n < pr.b; ++n) {
    const int64_t len = static_cast<int64_t>(used[n]);
    require(len >= 0 && len <= cap, "seqused_kv out of [0, max_pages * page_size]");
    pr.cu_kv.push_back(pr.cu_kv.back() + len);
  }
  Array k = make({pr.cu_kv.back(), pr.h_kv, pr.d}, kNaN), v = make({pr.cu_kv.back(), pr.h_kv, pr.d_v}, kNaN);
  int64_t longest_kv = 0;
  for (int64_t n = 0; n < pr.b; ++n) {
    const int64_t len = static_cast<int64_t>(used[n]);
    for (int64_t j = 0; j < len; ++j) {
      const int64_t page = table_entry(n, j / page_size);
      require(page >= 0 && page < num_pages, "page_table entry out of range");
      const int64_t src = page * page_size + j % page_size, dst = pr.cu_kv[n] + j;
      for (int64_t x = 0; x < pr.h_kv * pr.d; ++x) k.data[dst * pr.h_kv * pr.d + x] = pr.k.data[src * pr.h_kv * pr.d + x];
      for (int64_t x = 0; x < pr.h_kv * pr.d_v; ++x)
        v.data[dst * pr.h_kv * pr.d_v + x] = pr.v.data[src * pr.h_kv * pr.d_v + x];
    }
    pr.len_kv.push_back(len);
    longest_kv = std::max(longest_kv, len);
  }
  pr.k = std::move(k);
  pr.v = std::move(v);
  pr.total_kv = pr.cu_kv.back();
  pr.s_kv = pr.varlen ? (p.max_seqlen_kv > 0 ? p.max_seqlen_kv : longest_kv) : cap;
  // The key side as varlen: sequence n at rows cu_kv[n] (kv_row), in the gathered arrays.
  if (!pr.varlen) {  // dense queries: q rows n * s_q + i, keys through cu_kv
    pr.varlen_kv_only = true;
  }
}

Problem parse(const sinkattn_params_t& p, bool backward, DFrom d_from) {
  Problem pr;
  require(present(p.q) && present(p.k) && present(p.v), "q, k, v are required");
  pr.varlen = present(p.cu_seqlens_q);
  pr.dtype = p.q.dtype;
  pr.q = read_tensor(p.q);
  pr.k = read_tensor(p.k);
  pr.v = read_tensor(p.v);
  if (present(p.page_table)) {
    parse_paged(p, backward, pr);
  } else if (!pr.varlen) {
    require(p.q.rank == 4 && p.k.rank == 4 && p.v.rank == 4, "dense q, k, v must have rank 4");
    pr.b = p.q.shape[0];
    pr.s_q = p.q.shape[1];
    pr.h_q = p.q.shape[2];
    pr.d = p.q.shape[3];
    pr.s_kv = p.k.shape[1];
    pr.h_kv = p.k.shape[2];
    pr.d_v = p.v.shape[3];
    require(p.k.shape[0] == pr.b && p.v.shape[0] == pr.b && p.v.shape[1] == pr.s_kv && p.k.shape[3] == pr.d &&
                p.v.shape[2] == pr.h_kv,
            "dense shapes of q, k, v disagree");
    pr.total_q = pr.b * pr.s_q;
    pr.total_kv = pr.b * pr.s_kv;
    for (int64_t n = 0; n < pr.b; ++n) {
      pr.len_q.push_back(present(p.seqlens_q) ? static_cast<int64_t>(read_tensor(p.seqlens_q).data.at(n)) : pr.s_q);
      pr.len_kv.push_back(present(p.seqlens_kv) ? static_cast<int64_t>(read_tensor(p.seqlens_kv).data.at(n))
                                                : pr.s_kv);
      require(pr.len_q[n] >= 0 && pr.len_q[n] <= pr.s_q && pr.len_kv[n] >= 0 && pr.len_kv[n] <= pr.s_kv,
              "seqlens out of range");
    }
  } else {
    require(present(p.cu_seqlens_kv), "varlen needs cu_seqlens_kv");
    require(p.q.rank == 3 && p.k.rank == 3 && p.v.rank == 3, "varlen q, k, v must have rank 3");
    pr.total_q = p.q.shape[0];
    pr.h_q = p.q.shape[1];
    pr.d = p.q.shape[2];
    pr.total_kv = p.k.shape[0];
    pr.h_kv = p.k.shape[1];
    pr.d_v = p.v.shape[2];
    require(p.k.shape[2] == pr.d && p.v.shape[0] == pr.total_kv && p.v.shape[1] == pr.h_kv,
            "varlen shapes of q, k, v disagree");
    for (double x : read_tensor(p.cu_seqlens_q).data) pr.cu_q.push_back(static_cast<int64_t>(x));
    for (double x : read_tensor(p.cu_seqlens_kv).data) pr.cu_kv.push_back(static_cast<int64_t>(x));
    require(pr.cu_q.size() >= 1 && pr.cu_q.size() == pr.cu_kv.size(), "cu_seqlens sizes disagree");
    pr.b = static_cast<int64_t>(pr.cu_q.size()) - 1;
    require(pr.cu_q[0] == 0 && pr.cu_kv[0] == 0, "cu_seqlens must start at 0");
    std::vector<double> used;
    if (present(p.seqused_kv)) used = read_tensor(p.seqused_kv).data;
    int64_t longest_q = 0, longest_kv = 0;
    for (int64_t n = 0; n < pr.b; ++n) {
      require(pr.cu_q[n + 1] >= pr.cu_q[n] && pr.cu_kv[n + 1] >= pr.cu_kv[n], "cu_seqlens must be non-decreasing");
      pr.len_q.push_back(pr.cu_q[n + 1] - pr.cu_q[n]);
      const int64_t keys = pr.cu_kv[n + 1] - pr.cu_kv[n];
      pr.len_kv.push_back(used.empty() ? keys : std::min<int64_t>(keys, static_cast<int64_t>(used.at(n))));
      longest_q = std::max(longest_q, pr.len_q[n]);
      longest_kv = std::max(longest_kv, keys);
    }
    require(pr.cu_q[pr.b] <= pr.total_q && pr.cu_kv[pr.b] <= pr.total_kv, "cu_seqlens beyond the tensors");
    // max_seqlen_* are given by the caller (SPEC.md section 1); 0 means "the longest sequence".
    pr.s_q = p.max_seqlen_q > 0 ? p.max_seqlen_q : longest_q;
    pr.s_kv = p.max_seqlen_kv > 0 ? p.max_seqlen_kv : longest_kv;
  }
  require(pr.h_kv > 0 && pr.h_q % pr.h_kv == 0, "h_q % h_kv != 0");
  pr.group = pr.h_q / pr.h_kv;

  // sigma of SPEC.md section 2 (learnable: sinks[h]; off_by_one: 0; vanilla: -inf).
  pr.sigma.assign(static_cast<size_t>(pr.h_q), -kInf);
  if (p.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) {
    require(present(p.sinks), "learnable needs sinks");
    const Array s = read_tensor(p.sinks);
    require(static_cast<int64_t>(s.data.size()) == pr.h_q, "sinks must have h_q entries");
    pr.sigma = s.data;
  } else if (p.softmax_type == SINKATTN_SOFTMAX_OFF_BY_ONE) {
    pr.sigma.assign(static_cast<size_t>(pr.h_q), 0.0);
  }

  if (present(p.bias)) {
    require(!pr.varlen, "bias is not defined for varlen");
    require(p.bias.rank == 4 && (p.bias.shape[0] == 1 || p.bias.shape[0] == pr.b) &&
                (p.bias.shape[1] == 1 || p.bias.shape[1] == pr.h_q) && p.bias.shape[2] == pr.s_q &&
                p.bias.shape[3] == pr.s_kv,
            "bias must be [b|1, h_q|1, s_q, s_kv]");
    pr.has_bias = true;
    pr.bias = read_tensor(p.bias);
    pr.bias_dtype = p.bias.dtype;
  }
  pr.scale = std::isnan(p.softmax_scale) ? 1.0 / std::sqrt(static_cast<double>(pr.d))
                                         : static_cast<double>(p.softmax_scale);
  pr.wl = p.window_left;
  pr.wr = p.window_right;
  pr.bottom_right = p.mask_alignment == SINKATTN_ALIGN_BOTTOM_RIGHT;
  pr.p_drop = p.dropout_p;
  pr.seed = p.seed;
  pr.offset = p.offset;
  if (backward) {
    require(present(p.d_out), "backward needs d_out");
    pr.d_out = read_tensor(p.d_out);
    require(pr.d_out.data.size() == static_cast<size_t>(pr.total_q * pr.h_q * pr.d_v), "d_out has the wrong size");
    if (present(p.d_lse)) {
      pr.has_d_lse = true;
      pr.d_lse = read_tensor(p.d_lse);
      require(pr.d_lse.data.size() == static_cast<size_t>(pr.total_q * pr.h_q), "d_lse has the wrong size");
    }
    if (d_from == DFrom::kGivenOut) {
      require(present(p.out), "DFrom::kGivenOut needs p.out (the out the backward was given)");
      pr.given_out = read_tensor(p.out);
      require(pr.given_out.data.size() == static_cast<size_t>(pr.total_q * pr.h_q * pr.d_v), "out has the wrong size");
      pr.d_from_given_out = true;
    }
  }
  return pr;
}

// Evaluates in arithmetic type T. For Precision::kFloat64, T = double and nothing is rounded except the `out`
// that D reads (the stored output has the dtype of q). For kPlainLowPrecision, T = float: the plain
// low-precision implementation of SPEC.md section 5. Scores S, the softmax (LSE, P), dP = d_out @ V^T (times
// keep / (1 - p)), D and dS = P (dP - D + d_lse) are fp32 (accumulations too); P (as P * keep / (1 - p)) is
// rounded to the dtype of q before P @ V and P^T @ d_out, dS before dS @ K and dS^T @ Q; every output is rounded
// to its dtype (out, dq, dk, dv: that of q; d_bias: that of bias; softmax_lse, d_sinks: fp32). D reads the
// evaluation's own rounded out, or p.out (DFrom::kGivenOut).
template <class T>
Result run(const Problem& pr, bool backward, bool lowp) {
  auto rnd = [&](T x) -> T { return lowp ? static_cast<T>(round_to(pr.dtype, static_cast<double>(x))) : x; };
  const T scale = static_cast<T>(pr.scale);
  const T keep_scale = static_cast<T>(1.0 / (1.0 - pr.p_drop));
  const T neg_inf = -std::numeric_limits<T>::infinity();

  Result r;
  // Rows of q / keys of k that belong to no sequence (varlen buffers longer than cu_seqlens[b]) are
  // unspecified (NaN); everything owned starts at 0.
  const double unowned = pr.varlen ? kNaN : 0.0;
  if (pr.varlen) {
    r.out = make({pr.total_q, pr.h_q, pr.d_v}, unowned);
    r.softmax_lse = make({pr.h_q, pr.total_q}, unowned);
  } else {
    r.out = make({pr.b, pr.s_q, pr.h_q, pr.d_v}, 0.0);
    r.softmax_lse = make({pr.b, pr.h_q, pr.s_q}, kNaN);  // padding rows: unspecified (SPEC.md section 2)
  }
  std::vector<T> dq_acc, dk_acc, dv_acc, dbias_acc;
  std::vector<double> dsinks_acc;
  if (backward) {
    dq_acc.assign(static_cast<size_t>(pr.total_q * pr.h_q * pr.d), T(0));
    dk_acc.assign(static_cast<size_t>(pr.total_kv * pr.h_kv * pr.d), T(0));
    dv_acc.assign(static_cast<size_t>(pr.total_kv * pr.h_kv * pr.d_v), T(0));
    dsinks_acc.assign(static_cast<size_t>(pr.h_q), 0.0);
    if (pr.has_bias) dbias_acc.assign(pr.bias.data.size(), T(0));
  }
  if (pr.varlen) {  // mark the owned rows / keys as specified
    for (int64_t n = 0; n < pr.b; ++n) {
      for (int64_t i = 0; i < pr.rows_of(n); ++i) {
        for (int64_t h = 0; h < pr.h_q; ++h) {
          for (int64_t c = 0; c < pr.d_v; ++c) r.out.data[(pr.q_row(n, i) * pr.h_q + h) * pr.d_v + c] = 0.0;
        }
      }
    }
  }

  std::vector<T> S(1);  // grown to the longest sequence's keys below (never sized by a page table's capacity)
  std::vector<T> P(S.size()), Pd(S.size()), dS(S.size()), drop(S.size());
  std::vector<T> out_row(static_cast<size_t>(pr.d_v));

  for (int64_t n = 0; n < pr.b; ++n) {
    const int64_t len_q = pr.len_q[n], len_kv = pr.len_kv[n];
    if (len_kv > static_cast<int64_t>(S.size())) {
      S.resize(len_kv); P.resize(len_kv); Pd.resize(len_kv); dS.resize(len_kv); drop.resize(len_kv);
    }
    for (int64_t h = 0; h < pr.h_q; ++h) {
      const int64_t hk = h / pr.group;  // SPEC.md section 1: query head h reads KV head h / (h_q / h_kv)
      const T sigma = static_cast<T>(pr.sigma[h]);
      for (int64_t i = 0; i < len_q; ++i) {  // padding rows (i >= len_q) keep out = 0, dq = 0
        const int64_t qr = pr.q_row(n, i);
        const double* qi = &pr.q.data[(qr * pr.h_q + h) * pr.d];
        // S_ij = softmax_scale * dot(q_i, k_j) + bias_ij, -inf where masked (SPEC.md section 2). Keys outside
        // [kr.lo, kr.hi) are masked: every loop over j below only visits the visible range.
        const KeyRange kr = pr.keys(n, i);
        const int64_t j_lo = std::max<int64_t>(kr.lo, 0), j_hi = std::min<int64_t>(kr.hi, len_kv);
        T m = sigma;
        for (int64_t j = j_lo; j < j_hi; ++j) {
          const double* kj = &pr.k.data[(pr.kv_row(n, j) * pr.h_kv + hk) * pr.d];
          T dot = 0;
          for (int64_t c = 0; c < pr.d; ++c) dot += static_cast<T>(qi[c]) * static_cast<T>(kj[c]);
          S[j] = scale * dot + (pr.has_bias ? static_cast<T>(pr.bias_at(n, h, i, j)) : T(0));
          if (S[j] > m) m = S[j];
        }
        // LSE_i = log(exp(sigma) + sum_j exp(S_ij)), stably with m = max(sigma, max_j S_ij). A row whose
        // visible logits are all -inf (and vanilla) has m = -inf: out = 0, LSE = -inf (SPEC.md sections 2-3).
        T lse;
        if (m == neg_inf) {
          lse = neg_inf;
        } else {
          T l = std::exp(sigma - m);  // 0 for vanilla
          for (int64_t j = j_lo; j < j_hi; ++j) l += std::exp(S[j] - m);
          lse = m + std::log(l);
        }
        r.softmax_lse.data[pr.lse_index(n, h, i)] = static_cast<double>(lse);
        // P_ij = exp(S_ij - LSE_i); out_i = sum_j P_ij * keep_ij / (1 - p) * v_j (the sink has no value).
        for (int64_t j = j_lo; j < j_hi; ++j) {
          P[j] = lse != neg_inf ? std::exp(S[j] - lse) : T(0);
          T keep = T(1);
          if (pr.p_drop > 0)
            keep = dropout_keep(pr.seed, pr.offset, n, h, i, j, pr.h_q, pr.s_q, pr.s_kv, pr.p_drop) ? keep_scale
                                                                                                       : T(0);
          drop[j] = keep;
          Pd[j] = rnd(P[j] * keep);  // the dropped-and-rescaled probability that multiplies V
        }
        for (int64_t c = 0; c < pr.d_v; ++c) {
          T acc = 0;
          for (int64_t j = j_lo; j < j_hi; ++j)
            acc += Pd[j] * static_cast<T>(pr.v.data[(pr.kv_row(n, j) * pr.h_kv + hk) * pr.d_v + c]);
          out_row[c] = rnd(acc);
          r.out.data[(qr * pr.h_q + h) * pr.d_v + c] = static_cast<double>(out_row[c]);
        }
        if (!backward) continue;

        // ---- backward, SPEC.md section 3 ----
        const double* doi = &pr.d_out.data[(qr * pr.h_q + h) * pr.d_v];
        const T dlse = pr.has_d_lse ? static_cast<T>(pr.d_lse.data[pr.lse_index(n, h, i)]) : T(0);
        // D_i = dot(d_out_i, out_i) from the stored (rounded to the dtype of q) output: the evaluation's own, or
        // the out the backward was given (DFrom::kGivenOut).
        T D = 0;
        const double* given = pr.d_from_given_out ? &pr.given_out.data[(qr * pr.h_q + h) * pr.d_v] : nullptr;
        for (int64_t c = 0; c < pr.d_v; ++c)
          D += static_cast<T>(doi[c]) *
               static_cast<T>(given ? given[c] : round_to(pr.dtype, static_cast<double>(out_row[c])));
        // d_sinks[h] += P_sink_i * (d_lse_i - D_i), P_sink_i = exp(sigma - LSE_i) (learnable only). A row that
        // sees no key under a -inf sink has LSE = -inf and P_sink = 1, the limit of a finite sigma -> -inf
        // (SPEC.md section 3, "Sink values"); rows with keys then have P_sink = exp(-inf) = 0.
        const T p_sink = (sigma == neg_inf && lse == neg_inf) ? T(1) : std::exp(sigma - lse);
        dsinks_acc[h] += static_cast<double>(p_sink * (dlse - D));
        for (int64_t j = j_lo; j < j_hi; ++j) {
          if (P[j] == T(0)) {
            // P_ij = 0: dS_ij = 0 and nothing flows to dk_j, dv_j (never multiply a NaN by 0).
            dS[j] = 0;
            continue;
          }
          const double* vj = &pr.v.data[(pr.kv_row(n, j) * pr.h_kv + hk) * pr.d_v];
          T dot = 0;
          for (int64_t c = 0; c < pr.d_v; ++c) dot += static_cast<T>(doi[c]) * static_cast<T>(vj[c]);
          // dP_ij = dot(d_out_i, v_j) * keep_ij / (1 - p), in T (fp32 in the plain low-precision evaluation)
          const T dP = dot * drop[j];
          // dv_j += P_ij * keep_ij / (1 - p) * d_out_i
          T* dvj = &dv_acc[(pr.kv_row(n, j) * pr.h_kv + hk) * pr.d_v];
          for (int64_t c = 0; c < pr.d_v; ++c) dvj[c] += Pd[j] * static_cast<T>(doi[c]);
          // dS_ij = P_ij * (dP_ij - D_i + d_lse_i); dbias_ij = dS_ij
          const T ds = P[j] * (dP - D + dlse);
          if (pr.has_bias) dbias_acc[pr.bias_index(n, h, i, j)] += ds;
          dS[j] = rnd(ds);
        }
        // dq_i = softmax_scale * sum_j dS_ij k_j ; dk_j += softmax_scale * dS_ij q_i
        T* dqi = &dq_acc[(qr * pr.h_q + h) * pr.d];
        for (int64_t j = j_lo; j < j_hi; ++j) {
          if (dS[j] == T(0)) continue;
          const int64_t krow = pr.kv_row(n, j);
          const double* kj = &pr.k.data[(krow * pr.h_kv + hk) * pr.d];
          T* dkj = &dk_acc[(krow * pr.h_kv + hk) * pr.d];
          for (int64_t c = 0; c < pr.d; ++c) {
            dqi[c] += dS[j] * static_cast<T>(kj[c]);
            dkj[c] += dS[j] * static_cast<T>(qi[c]);
          }
        }
      }
    }
  }
  if (!backward) return r;

  auto finish = [&](const std::vector<T>& acc, std::vector<int64_t> shape, T factor) {
    Array a = make(std::move(shape), 0.0);
    for (size_t x = 0; x < acc.size(); ++x) a.data[x] = static_cast<double>(rnd(acc[x] * factor));
    return a;
  };
  if (pr.varlen) {
    r.dq = finish(dq_acc, {pr.total_q, pr.h_q, pr.d}, scale);
    r.dk = finish(dk_acc, {pr.total_kv, pr.h_kv, pr.d}, scale);
    r.dv = finish(dv_acc, {pr.total_kv, pr.h_kv, pr.d_v}, T(1));
    // Rows / keys that belong to no sequence are unspecified.
    for (int64_t x = pr.cu_q[pr.b]; x < pr.total_q; ++x)
      for (int64_t y = 0; y < pr.h_q * pr.d; ++y) r.dq.data[x * pr.h_q * pr.d + y] = kNaN;
    for (int64_t x = pr.cu_kv[pr.b]; x < pr.total_kv; ++x) {
      for (int64_t y = 0; y < pr.h_kv * pr.d; ++y) r.dk.data[x * pr.h_kv * pr.d + y] = kNaN;
      for (int64_t y = 0; y < pr.h_kv * pr.d_v; ++y) r.dv.data[x * pr.h_kv * pr.d_v + y] = kNaN;
    }
  } else {
    r.dq = finish(dq_acc, {pr.b, pr.s_q, pr.h_q, pr.d}, scale);
    r.dk = finish(dk_acc, {pr.b, pr.s_kv, pr.h_kv, pr.d}, scale);
    r.dv = finish(dv_acc, {pr.b, pr.s_kv, pr.h_kv, pr.d_v}, T(1));
  }
  // d_sinks (kept only for learnable by evaluate()), accumulated in double, fp32 output in low precision.
  r.d_sinks = make({pr.h_q}, 0.0);
  for (int64_t h = 0; h < pr.h_q; ++h)
    r.d_sinks.data[h] = lowp ? static_cast<double>(static_cast<float>(dsinks_acc[h])) : dsinks_acc[h];
  if (pr.has_bias) {
    r.d_bias = make(pr.bias.shape, 0.0);
    for (size_t x = 0; x < dbias_acc.size(); ++x)
      r.d_bias.data[x] = lowp ? round_to(pr.bias_dtype, static_cast<double>(dbias_acc[x]))
                              : static_cast<double>(dbias_acc[x]);
  }
  return r;
}

}  // namespace

int64_t Array::numel() const { return static_cast<int64_t>(data.size()); }

// ---- conversions ----
double half_to_double(uint16_t bits) {
  const int sign = (bits >> 15) & 1;
  const int exp = (bits >> 10) & 0x1f;
  const int mant = bits & 0x3ff;
  double v;
  if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), -24);  // subnormal: mant * 2^-24
  } else if (exp == 31) {
    v = mant ? kNaN : kInf;
  } else {
    v = std::ldexp(1.0 + mant / 1024.0, exp - 15);
  }
  return sign ? -v : v;
}
uint16_t double_to_half(double x) { return float_to_half(static_cast<float>(x)); }
double bf16_to_double(uint16_t bits) { return bits_float(static_cast<uint32_t>(bits) << 16); }
uint16_t double_to_bf16(double x) {
  const uint32_t u = float_bits(static_cast<float>(x));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  const uint32_t rounded = u + 0x7fffu + ((u >> 16) & 1u);                              // nearest even
  return static_cast<uint16_t>(rounded >> 16);
}
double round_to(sinkattn_dtype_t dtype, double x) {
  switch (dtype) {
    case SINKATTN_F32: return static_cast<double>(static_cast<float>(x));
    case SINKATTN_F16: return half_to_double(double_to_half(x));
    case SINKATTN_BF16: return bf16_to_double(double_to_bf16(x));
    default: return x;
  }
}

// ---- Philox4x32-10 (Random123: Salmon, Moraes, Dror, Shaw 2011) ----
void philox4x32_10(const uint32_t counter[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t x0 = counter[0], x1 = counter[1], x2 = counter[2], x3 = counter[3];
  uint32_t k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    if (round > 0) {  // bump the key between rounds
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const uint64_t p0 = static_cast<uint64_t>(0xD2511F53u) * x0;
    const uint64_t p1 = static_cast<uint64_t>(0xCD9E8D57u) * x2;
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t y0 = hi1 ^ x1 ^ k0, y1 = lo1, y2 = hi0 ^ x3 ^ k1, y3 = lo0;
    x0 = y0; x1 = y1; x2 = y2; x3 = y3;
  }
  out[0] = x0; out[1] = x1; out[2] = x2; out[3] = x3;
}

uint32_t dropout_threshold(double p) {
  // min(floor(p * 2^32), 2^32 - 1), computed in long double-free integer-safe steps.
  if (!(p > 0)) return 0;
  const double t = std::floor(p * 4294967296.0);
  if (t >= 4294967295.0) return 0xFFFFFFFFu;
  return static_cast<uint32_t>(t);
}

bool dropout_keep(uint64_t seed, uint64_t offset, int64_t n, int64_t h, int64_t i, int64_t j, int64_t h_q,
                  int64_t max_s_q, int64_t max_s_kv, double p) {
  // idx = ((n * h_q + h) * max_s_q + i) * max_s_kv + j (uint64); ctr = idx / 4, lane = idx % 4.
  const uint64_t idx = ((static_cast<uint64_t>(n) * static_cast<uint64_t>(h_q) + static_cast<uint64_t>(h)) *
                            static_cast<uint64_t>(max_s_q) +
                        static_cast<uint64_t>(i)) *
                           static_cast<uint64_t>(max_s_kv) +
                       static_cast<uint64_t>(j);
  const uint64_t ctr = idx / 4;
  const uint32_t counter[4] = {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32),
                               static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)};
  const uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  uint32_t words[4];
  philox4x32_10(counter, key, words);
  return words[idx % 4] >= dropout_threshold(p);
}

// ---- tensors ----
Array read_tensor(const sinkattn_tensor_t& t) {
  require(t.rank >= 0 && t.rank <= SINKATTN_MAX_RANK, "bad rank");
  Array a;
  a.shape.assign(t.shape, t.shape + t.rank);
  for (int64_t s : a.shape) require(s >= 0, "negative extent");
  a.data.resize(static_cast<size_t>(product(a.shape)));
  if (a.data.empty()) return a;
  require(t.data != nullptr, "tensor data is NULL");
  for_each_index(a.shape, [&](const int64_t* idx, int64_t linear) { a.data[linear] = load(t, offset_of(t, idx)); });
  return a;
}

void write_tensor(const sinkattn_tensor_t& t, const Array& a) {
  std::vector<int64_t> shape(t.shape, t.shape + t.rank);
  require(shape == a.shape, "write_tensor: shape mismatch");
  if (a.data.empty()) return;
  require(t.data != nullptr, "tensor data is NULL");
  for_each_index(shape, [&](const int64_t* idx, int64_t linear) { store(t, offset_of(t, idx), a.data[linear]); });
}

// ---- evaluation ----
Result evaluate(const sinkattn_params_t& p, bool backward, const Options& options) {
  const Problem pr = parse(p, backward, options.d_from);
  Result r = options.precision == Precision::kFloat64 ? run<double>(pr, backward, false)
                                                      : run<float>(pr, backward, true);
  if (!(backward && p.softmax_type == SINKATTN_SOFTMAX_LEARNABLE)) r.d_sinks = Array{};
  return r;
}

References references(const sinkattn_params_t& p, bool backward, DFrom d_from) {
  References r;
  // The plain implementation is a standalone evaluation: D from its own rounded out (SPEC.md section 5).
  std::future<Result> lowp = std::async(std::launch::async, [&] {
    return evaluate(p, backward, Options{Precision::kPlainLowPrecision, DFrom::kOwnOut});
  });
  try {
    r.ref64 = evaluate(p, backward, Options{Precision::kFloat64, d_from});
  } catch (...) {
    if (lowp.valid()) lowp.wait();
    throw;
  }
  if (lowp.valid()) r.lowp = lowp.get();
  return r;
}

KeyRange visible_keys(int64_t i, int64_t len_q, int64_t len_kv, int64_t window_left, int64_t window_right,
                      bool bottom_right) {
  // Key j is visible iff (wl < 0 or j >= i + off - wl) and (wr < 0 or j <= i + off + wr), 0 <= j < len_kv, with
  // off = len_kv - len_q (bottom_right) or 0 (top_left).
  const int64_t off = bottom_right ? len_kv - len_q : 0;
  KeyRange r{0, len_kv};
  if (window_left >= 0) r.lo = std::max<int64_t>(r.lo, i + off - window_left);
  if (window_right >= 0) r.hi = std::min<int64_t>(r.hi, i + off + window_right + 1);
  return r;
}

// ---- SPEC.md section 5 ----
double relative_error(const Array& actual, const Array& ref, double tiny) {
  if (actual.shape != ref.shape || actual.data.size() != ref.data.size())
    throw std::invalid_argument("relative_error: shapes differ");
  double max_ref = 0;
  for (double r : ref.data)
    if (std::isfinite(r)) max_ref = std::max(max_ref, std::fabs(r));
  double max_diff = 0;
  for (size_t x = 0; x < ref.data.size(); ++x) {
    const double a = actual.data[x], r = ref.data[x];
    if (std::isnan(r)) {  // unspecified: anything finite or -inf
      if (std::isnan(a) || a == kInf) return kInf;
      continue;
    }
    if (std::isnan(a)) return kInf;
    if (std::isinf(r) || std::isinf(a)) {
      if (a != r) return kInf;
      continue;
    }
    max_diff = std::max(max_diff, std::fabs(a - r));
  }
  return max_diff / std::max(max_ref, tiny);
}

std::vector<ErrorRow> error_table(const Result& actual, const Result& ref64, const Result& lowp,
                                  sinkattn_dtype_t dtype) {
  struct Item {
    const char* name;
    const Array Result::*field;
    bool gradient;
  };
  static const Item items[] = {{"out", &Result::out, false},     {"softmax_lse", &Result::softmax_lse, false},
                               {"dq", &Result::dq, true},        {"dk", &Result::dk, true},
                               {"dv", &Result::dv, true},        {"d_sinks", &Result::d_sinks, true},
                               {"d_bias", &Result::d_bias, true}};
  std::vector<ErrorRow> rows;
  for (const Item& it : items) {
    const Array& a = actual.*(it.field);
    if (a.empty()) continue;
    ErrorRow row;
    row.name = it.name;
    const Array& r = ref64.*(it.field);
    row.err = r.empty() ? kInf : relative_error(a, r);
    const Array& l = lowp.*(it.field);
    // The plain evaluation's error. Unspecified positions (NaN in the float64 reference) are unspecified in it
    // too: not part of its error.
    auto plain_err = [&] {
      if (l.empty() || r.empty() || l.data.size() != r.data.size()) return kInf;
      Array specified = l;
      for (size_t x = 0; x < r.data.size(); ++x)
        if (std::isnan(r.data[x])) specified.data[x] = 0;
      return relative_error(specified, r);
    };
    if (dtype == SINKATTN_F32) {  // the fixed bounds, or twice the plain fp32 evaluation's error where larger
      row.lowp_err = l.empty() ? 0 : plain_err();
      // a plain evaluation that failed (NaN against a finite reference: err = inf) sets no budget
      row.tolerance = std::max(it.gradient ? 1e-4 : 1e-5, std::isfinite(row.lowp_err) ? 2 * row.lowp_err : 0.0);
    } else {
      row.lowp_err = plain_err();
      row.tolerance = 2 * row.lowp_err + 1e-3;
    }
    row.pass = row.err <= row.tolerance;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace sinkattn::ref

// Shared harness of the GoogleTest suites: host tensors with any strides, a configurable attention call
// (dense / padded / varlen, GQA, windows, bias, dropout, d_lse, any dtype and layout), library runs with every
// output poisoned (NaN) before the call and the workspace filled with NaN, and comparison with the float64
// reference of SPEC.md (tests/reference) through the SPEC.md section 5 error table.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <random>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "reference.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn::test {

namespace ref = ::sinkattn::ref;

// Random123's kat_vectors for philox4x32_10 (SPEC.md section 2, dropout): counter, key, expected output.
struct PhiloxKat {
  uint32_t ctr[4], key[2], want[4];
};
inline constexpr PhiloxKat kPhiloxKnownAnswers[] = {
    {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
    {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
     {0xffffffffu, 0xffffffffu},
     {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
    {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
     {0xa4093822u, 0x299f31d0u},
     {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
};

// Element size in bytes. Its own table rather than sinkattn_dtype_size: test_reference links the float64 reference
// only, never the library it checks.
inline size_t dtype_size(sinkattn_dtype_t t) {
  switch (t) {
    case SINKATTN_F32: return 4;
    case SINKATTN_F16: return 2;
    case SINKATTN_BF16: return 2;
    case SINKATTN_I32: return 4;
    case SINKATTN_I64: return 8;
  }
  return 0;
}

inline const char* dtype_name(sinkattn_dtype_t t) {
  switch (t) {
    case SINKATTN_F32: return "fp32";
    case SINKATTN_F16: return "fp16";
    case SINKATTN_BF16: return "bf16";
    case SINKATTN_I32: return "i32";
    case SINKATTN_I64: return "i64";
  }
  return "?";
}

inline const char* softmax_name(sinkattn_softmax_type_t t) {
  switch (t) {
    case SINKATTN_SOFTMAX_VANILLA: return "vanilla";
    case SINKATTN_SOFTMAX_OFF_BY_ONE: return "off_by_one";
    case SINKATTN_SOFTMAX_LEARNABLE: return "learnable";
  }
  return "?";
}

// A byte buffer shared by one or more strided views (packed QKV / KV buffers share one).
struct Storage {
  std::vector<unsigned char> bytes;
  sinkattn_dtype_t dtype = SINKATTN_F32;
  // Fills every element with NaN (float dtypes) or 0x7f.. patterns (integers): "poison".
  void poison() {
    const size_t es = dtype_size(dtype);
    for (size_t x = 0; x + es <= bytes.size(); x += es) {
      if (dtype == SINKATTN_F32) {
        const uint32_t nan = 0x7fc00000u;
        std::memcpy(&bytes[x], &nan, 4);
      } else if (dtype == SINKATTN_F16) {
        const uint16_t nan = 0x7e00u;
        std::memcpy(&bytes[x], &nan, 2);
      } else if (dtype == SINKATTN_BF16) {
        const uint16_t nan = 0x7fc0u;
        std::memcpy(&bytes[x], &nan, 2);
      } else {
        std::memset(&bytes[x], 0x7f, es);
      }
    }
  }
};

// A strided host tensor (a view of a Storage).
struct HostTensor {
  std::shared_ptr<Storage> storage;
  sinkattn_tensor_t t{};
  bool present() const { return t.rank > 0; }
  std::vector<int64_t> shape() const { return std::vector<int64_t>(t.shape, t.shape + t.rank); }

  // Row-major contiguous tensor (elements outside nothing: the storage is exactly the tensor).
  static HostTensor contiguous(sinkattn_dtype_t dtype, const std::vector<int64_t>& shape) {
    std::vector<int> order(shape.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    return permuted(dtype, shape, order);
  }
  // A tensor whose memory order of logical dimensions is `order` (outermost first; the last must be the last
  // dimension, which stays contiguous). E.g. q [b, s, h, d] with order {1, 0, 2, 3} is SBHD.
  static HostTensor permuted(sinkattn_dtype_t dtype, const std::vector<int64_t>& shape, const std::vector<int>& order) {
    if (shape.size() > SINKATTN_MAX_RANK || order.size() != shape.size())
      throw std::invalid_argument("HostTensor: a view has rank 1 .. 4 (use HostTensor::buffer for more)");
    HostTensor h;
    h.storage = std::make_shared<Storage>();
    h.storage->dtype = dtype;
    int64_t numel = 1, stride = 1;
    for (int64_t s : shape) numel *= s;
    h.t.dtype = dtype;
    h.t.rank = static_cast<int32_t>(shape.size());
    for (int r = static_cast<int>(order.size()) - 1; r >= 0; --r) {
      h.t.shape[order[r]] = shape[order[r]];
      h.t.strides[order[r]] = stride;
      stride *= std::max<int64_t>(shape[order[r]], 1);
    }
    for (size_t i = 0; i < shape.size(); ++i) h.t.shape[i] = shape[i];
    // At least one element so that data is never NULL (empty tensors of zero-length calls included).
    h.storage->bytes.resize(static_cast<size_t>(std::max<int64_t>(numel, 1)) * dtype_size(dtype));
    h.t.data = h.storage->bytes.data();
    h.storage->poison();
    return h;
  }
  // Storage for views only (packed QKV / KV buffers of rank 5, which sinkattn_tensor_t cannot describe): poisoned
  // bytes for the product of `shape`, no view of its own (rank 0).
  static HostTensor buffer(sinkattn_dtype_t dtype, const std::vector<int64_t>& shape) {
    HostTensor h;
    h.storage = std::make_shared<Storage>();
    h.storage->dtype = dtype;
    int64_t numel = 1;
    for (int64_t s : shape) numel *= s;
    h.storage->bytes.resize(static_cast<size_t>(std::max<int64_t>(numel, 1)) * dtype_size(dtype));
    h.t.dtype = dtype;
    h.t.data = h.storage->bytes.data();
    h.storage->poison();
    return h;
  }
  // A view into `owner`'s storage at element offset `offset` with the given shape and strides.
  static HostTensor view(const HostTensor& owner, const std::vector<int64_t>& shape,
                         const std::vector<int64_t>& strides, int64_t offset) {
    HostTensor h;
    h.storage = owner.storage;
    h.t.dtype = owner.t.dtype;
    h.t.rank = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      h.t.shape[i] = shape[i];
      h.t.strides[i] = strides[i];
    }
    h.t.data = owner.storage->bytes.data() + offset * dtype_size(owner.t.dtype);
    return h;
  }
  void poison() { storage->poison(); }
  ref::Array read() const { return ref::read_tensor(t); }
  void write(const ref::Array& a) const { ref::write_tensor(t, a); }
  // Bytes of the whole storage: bitwise comparisons.
  const std::vector<unsigned char>& bytes() const { return storage->bytes; }
};

inline ref::Array random_array(std::mt19937_64& rng, const std::vector<int64_t>& shape, double lo = 0,
                               double hi = 0, bool normal = true) {
  ref::Array a;
  a.shape = shape;
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  a.data.resize(static_cast<size_t>(n));
  std::normal_distribution<double> nd(0.0, 1.0);
  std::uniform_real_distribution<double> ud(lo, hi);
  for (auto& x : a.data) x = normal ? nd(rng) : ud(rng);
  return a;
}

enum class Layout { kBSHD, kSBHD, kBHSD, kPackedQKV, kPackedKV };
inline const char* layout_name(Layout l) {
  switch (l) {
    case Layout::kBSHD: return "BSHD";
    case Layout::kSBHD: return "SBHD";
    case Layout::kBHSD: return "BHSD";
    case Layout::kPackedQKV: return "PackedQKV";
    case Layout::kPackedKV: return "PackedKV";
  }
  return "?";
}

enum class Batch { kDense, kPadded, kVarlen };
inline const char* batch_name(Batch b) {
  switch (b) {
    case Batch::kDense: return "dense";
    case Batch::kPadded: return "padded";
    case Batch::kVarlen: return "varlen";
  }
  return "?";
}

// One attention call. Sizes follow SPEC.md section 1. For kPadded, seqlens_q / seqlens_kv are the actual
// lengths of a dense batch of extents s_q, s_kv; for kVarlen they are the packed sequences' lengths (s_q and
// s_kv then become max_seqlen_q / max_seqlen_kv, defaulting to the longest).
struct Config {
  int64_t b = 2, s_q = 16, s_kv = 16, h_q = 4, h_kv = 2, d = 32, d_v = 32;
  sinkattn_dtype_t dtype = SINKATTN_F32;
  sinkattn_softmax_type_t softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
  std::vector<double> sinks;  // empty: head 0 log(s_kv), head 1 20, others uniform[-1, 3]
  double sink_lo = -1, sink_hi = 3;
  bool sinks_uniform = false;  // all heads uniform[sink_lo, sink_hi] (when `sinks` is empty)
  int64_t window_left = -1, window_right = -1;
  sinkattn_mask_alignment_t alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
  Batch batch = Batch::kDense;
  std::vector<int32_t> seqlens_q, seqlens_kv, seqused_kv;
  std::string bias;  // "", "BHSS", "1HSS", "B1SS", "11SS"
  sinkattn_dtype_t bias_dtype = SINKATTN_F32;
  double dropout_p = 0;
  uint64_t seed = 0, offset = 0;
  bool d_lse = false;
  int32_t deterministic = 0;
  int32_t num_threads = 0;
  float softmax_scale = std::numeric_limits<float>::quiet_NaN();
  Layout layout = Layout::kBSHD;
  uint64_t data_seed = 1;
  double q_scale = 1.0;  // multiplies q (larger logits)
  // kVarlen: rows after cu_seqlens_q[b] / cu_seqlens_kv[b] in every packed tensor (SPEC.md section 1: outside the
  // call). Inputs hold NaN there; outputs hold `tail_fill` there before every call (after the NaN poison).
  int64_t tail_q = 0, tail_kv = 0;
  double tail_fill = 7.0;

  std::string describe() const {
    std::ostringstream s;
    s << "b=" << b << " s_q=" << s_q << " s_kv=" << s_kv << " h_q=" << h_q << " h_kv=" << h_kv << " d=" << d
      << " d_v=" << d_v << " " << dtype_name(dtype) << " " << softmax_name(softmax_type) << " window=["
      << window_left << "," << window_right << "] "
      << (alignment == SINKATTN_ALIGN_BOTTOM_RIGHT ? "bottom_right" : "top_left") << " " << batch_name(batch)
      << " bias=" << (bias.empty() ? "none" : bias) << " p=" << dropout_p << " d_lse=" << d_lse << " layout="
      << layout_name(layout);
    return s.str();
  }
};

// Fills a workspace with NaN bytes so a backend that reads scratch before writing it is caught.
struct Workspace {
  std::vector<unsigned char> bytes;
  void prepare(size_t n) {
    bytes.assign(n + 1, 0xff);
  }
};

// A call with its tensors. Construction fills every input with random data (standard normal, sinks as
// Config says); outputs are allocated and poisoned.
class Problem {
 public:
  Config cfg;
  HostTensor q, k, v, sinks, bias, out, lse, d_out, d_lse, dq, dk, dv, d_sinks, d_bias;
  HostTensor cu_q, cu_kv, seqused, seqlens_q, seqlens_kv, rng_state;
  HostTensor qkv_buffer, kv_buffer;  // packed layouts
  sinkattn_params_t p{};
  Workspace ws;
  int64_t total_q = 0, total_kv = 0;  // rows of the packed tensors (varlen: with cfg.tail_q / tail_kv)
  int64_t used_q = 0, used_kv = 0;    // varlen: rows that belong to a sequence (cu_seqlens[b])

  explicit Problem(const Config& c) : cfg(c) { build(); }

  bool varlen() const { return cfg.batch == Batch::kVarlen; }

  // Actual lengths of sequence n (SPEC.md section 1).
  int64_t len_q(int64_t n) const {
    if (cfg.batch == Batch::kDense) return cfg.s_q;
    return cfg.seqlens_q.at(n);
  }
  int64_t len_kv(int64_t n) const {
    if (cfg.batch == Batch::kDense) return cfg.s_kv;
    if (cfg.batch == Batch::kVarlen && !cfg.seqused_kv.empty()) return cfg.seqused_kv.at(n);
    return cfg.seqlens_kv.at(n);
  }
  int64_t q_row(int64_t n, int64_t i) const {
    if (varlen()) {
      int64_t s = 0;
      for (int64_t m = 0; m < n; ++m) s += cfg.seqlens_q[m];
      return s + i;
    }
    return n * cfg.s_q + i;
  }
  int64_t kv_row(int64_t n, int64_t j) const {
    if (varlen()) {
      int64_t s = 0;
      for (int64_t m = 0; m < n; ++m) s += cfg.seqlens_kv[m];
      return s + j;
    }
    return n * cfg.s_kv + j;
  }

  // Rows [used, total) of a packed (varlen) tensor: outside the call. `lse_like`: [h_q, total] tensors.
  void fill_tail(const HostTensor& t, bool kv, double value, bool lse_like = false) const {
    if (!varlen() || !t.present()) return;
    const int64_t used = kv ? used_kv : used_q;
    ref::Array a = t.read();
    const int64_t rows = lse_like ? a.shape[1] : a.shape[0];
    const int64_t width = lse_like ? 1 : a.shape[1] * a.shape[2];
    for (int64_t outer = 0; outer < (lse_like ? a.shape[0] : 1); ++outer)
      for (int64_t r = used; r < rows; ++r)
        for (int64_t x = 0; x < width; ++x) a.data[(outer * rows + r) * width + x] = value;
    t.write(a);
  }
  bool has_tail() const { return varlen() && (cfg.tail_q > 0 || cfg.tail_kv > 0); }

  void poison_forward_outputs() {
    out.poison();
    lse.poison();
    if (rng_state.present()) rng_state.poison();
    if (has_tail()) {
      fill_tail(out, false, cfg.tail_fill);
      fill_tail(lse, false, cfg.tail_fill, true);
    }
  }
  void poison_backward_outputs() {
    dq.poison();
    dk.poison();
    dv.poison();
    if (d_sinks.present()) d_sinks.poison();
    if (d_bias.present()) d_bias.poison();
    if (has_tail()) {
      fill_tail(dq, false, cfg.tail_fill);
      fill_tail(dk, true, cfg.tail_fill);
      fill_tail(dv, true, cfg.tail_fill);
    }
  }

  // Runs the library forward: poisons outputs, sizes and poisons the workspace.
  sinkattn_status_t forward() {
    poison_forward_outputs();
    size_t bytes = 0;
    sinkattn_status_t st = sinkattn_forward_workspace_size(&p, &bytes);
    if (st != SINKATTN_OK) return st;
    ws.prepare(bytes);
    p.workspace = ws.bytes.data();
    p.workspace_bytes = bytes;
    return sinkattn_forward(&p);
  }
  sinkattn_status_t backward() {
    poison_backward_outputs();
    size_t bytes = 0;
    sinkattn_status_t st = sinkattn_backward_workspace_size(&p, &bytes);
    if (st != SINKATTN_OK) return st;
    ws.prepare(bytes);
    p.workspace = ws.bytes.data();
    p.workspace_bytes = bytes;
    return sinkattn_backward(&p);
  }

  // The library's outputs, read as float64 arrays of their logical shape.
  ref::Result actual(bool backward) const {
    ref::Result r;
    r.out = out.read();
    r.softmax_lse = lse.read();
    if (backward) {
      r.dq = dq.read();
      r.dk = dk.read();
      r.dv = dv.read();
      if (cfg.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) r.d_sinks = d_sinks.read();
      if (!cfg.bias.empty()) r.d_bias = d_bias.read();
    }
    return r;
  }

  // A standalone evaluation of the call (D from the evaluation's own rounded out).
  ref::Result reference(bool backward, ref::Precision prec = ref::Precision::kFloat64) const {
    return ref::evaluate(p, backward, prec);
  }
  // The evaluations SPEC.md section 5 judges the library's results by. A backward is judged with D_i from the out
  // it was given (p.out: what the library's forward wrote there, or what a test put there before backward()).
  ref::References judges(bool backward) const {
    return ref::references(p, backward, backward ? ref::DFrom::kGivenOut : ref::DFrom::kOwnOut);
  }

 private:
  void build() {
    std::mt19937_64 rng(cfg.data_seed);
    const Config& c = cfg;
#ifdef SINKATTN_TEST_NO_LIBRARY
    // Reference-only tests: the defaults of sinkattn_params_init spelled out (every field is set below).
    std::memset(&p, 0, sizeof p);
#else
    sinkattn_params_init(&p);
#endif
    const int64_t b = c.b;
    if (c.batch == Batch::kVarlen) {
      total_q = total_kv = 0;
      int64_t mq = 0, mk = 0;
      for (int64_t n = 0; n < b; ++n) {
        total_q += c.seqlens_q.at(n);
        total_kv += c.seqlens_kv.at(n);
        mq = std::max<int64_t>(mq, c.seqlens_q[n]);
        mk = std::max<int64_t>(mk, c.seqlens_kv[n]);
      }
      cfg.s_q = std::max<int64_t>(cfg.s_q, mq);
      cfg.s_kv = std::max<int64_t>(cfg.s_kv, mk);
      used_q = total_q;
      used_kv = total_kv;
      total_q += c.tail_q;
      total_kv += c.tail_kv;
    } else {
      total_q = b * c.s_q;
      total_kv = b * c.s_kv;
    }
    const bool vl = varlen();
    const std::vector<int64_t> qs = vl ? std::vector<int64_t>{total_q, c.h_q, c.d}
                                       : std::vector<int64_t>{b, c.s_q, c.h_q, c.d};
    const std::vector<int64_t> ks = vl ? std::vector<int64_t>{total_kv, c.h_kv, c.d}
                                       : std::vector<int64_t>{b, c.s_kv, c.h_kv, c.d};
    const std::vector<int64_t> vs = vl ? std::vector<int64_t>{total_kv, c.h_kv, c.d_v}
                                       : std::vector<int64_t>{b, c.s_kv, c.h_kv, c.d_v};
    const std::vector<int64_t> os = vl ? std::vector<int64_t>{total_q, c.h_q, c.d_v}
                                       : std::vector<int64_t>{b, c.s_q, c.h_q, c.d_v};
    const std::vector<int64_t> ls = vl ? std::vector<int64_t>{c.h_q, total_q} : std::vector<int64_t>{b, c.h_q, c.s_q};

    // ---- q, k, v in the requested layout (and their gradients in the same layout) ----
    auto layout_tensor = [&](const std::vector<int64_t>& shape) {
      if (vl || c.layout == Layout::kBSHD || c.layout == Layout::kPackedQKV || c.layout == Layout::kPackedKV)
        return HostTensor::contiguous(c.dtype, shape);
      if (c.layout == Layout::kSBHD) return HostTensor::permuted(c.dtype, shape, {1, 0, 2, 3});
      return HostTensor::permuted(c.dtype, shape, {0, 2, 1, 3});  // BHSD
    };
    if (!vl && c.layout == Layout::kPackedQKV) {
      // One buffer [b, s, 3, h, d]: q, k, v are views at offsets 0, h*d, 2*h*d (needs s_q == s_kv, h_q == h_kv,
      // d == d_v).
      qkv_buffer = HostTensor::buffer(c.dtype, {b, c.s_q, 3, c.h_q, c.d});
      const std::vector<int64_t> st = {c.s_q * 3 * c.h_q * c.d, 3 * c.h_q * c.d, c.d, 1};
      q = HostTensor::view(qkv_buffer, qs, st, 0);
      k = HostTensor::view(qkv_buffer, ks, st, c.h_q * c.d);
      v = HostTensor::view(qkv_buffer, vs, st, 2 * c.h_q * c.d);
    } else if (!vl && c.layout == Layout::kPackedKV) {
      // q contiguous; one KV buffer [b, s_kv, 2, h_kv, d] (needs d == d_v).
      q = HostTensor::contiguous(c.dtype, qs);
      kv_buffer = HostTensor::buffer(c.dtype, {b, c.s_kv, 2, c.h_kv, c.d});
      const std::vector<int64_t> st = {c.s_kv * 2 * c.h_kv * c.d, 2 * c.h_kv * c.d, c.d, 1};
      k = HostTensor::view(kv_buffer, ks, st, 0);
      v = HostTensor::view(kv_buffer, vs, st, c.h_kv * c.d);
    } else {
      q = layout_tensor(qs);
      k = layout_tensor(ks);
      v = layout_tensor(vs);
    }
    ref::Array qa = random_array(rng, qs);
    for (auto& x : qa.data) x *= c.q_scale;
    q.write(qa);
    k.write(random_array(rng, ks));
    v.write(random_array(rng, vs));
    out = layout_tensor(os);
    d_out = layout_tensor(os);
    if (!vl && (c.layout == Layout::kPackedQKV)) {
      HostTensor gbuf = HostTensor::buffer(c.dtype, {b, c.s_q, 3, c.h_q, c.d});
      const std::vector<int64_t> st = {c.s_q * 3 * c.h_q * c.d, 3 * c.h_q * c.d, c.d, 1};
      dq = HostTensor::view(gbuf, qs, st, 0);
      dk = HostTensor::view(gbuf, ks, st, c.h_q * c.d);
      dv = HostTensor::view(gbuf, vs, st, 2 * c.h_q * c.d);
    } else if (!vl && c.layout == Layout::kPackedKV) {
      dq = HostTensor::contiguous(c.dtype, qs);
      HostTensor gbuf = HostTensor::buffer(c.dtype, {b, c.s_kv, 2, c.h_kv, c.d});
      const std::vector<int64_t> st = {c.s_kv * 2 * c.h_kv * c.d, 2 * c.h_kv * c.d, c.d, 1};
      dk = HostTensor::view(gbuf, ks, st, 0);
      dv = HostTensor::view(gbuf, vs, st, c.h_kv * c.d);
    } else {
      dq = layout_tensor(qs);
      dk = layout_tensor(ks);
      dv = layout_tensor(vs);
    }
    d_out.write(random_array(rng, os));
    lse = HostTensor::contiguous(SINKATTN_F32, ls);
    if (c.d_lse) {
      d_lse = HostTensor::contiguous(SINKATTN_F32, ls);
      d_lse.write(random_array(rng, ls));
    }
    if (has_tail()) {  // inputs outside the call: NaN (they must not reach any output)
      fill_tail(q, false, NAN);
      fill_tail(k, true, NAN);
      fill_tail(v, true, NAN);
      fill_tail(d_out, false, NAN);
      fill_tail(d_lse, false, NAN, true);
    }

    // ---- sinks: large values by default (SPEC.md section 5: log(s_kv) and 20) ----
    sinks = HostTensor::contiguous(SINKATTN_F32, {c.h_q});
    {
      ref::Array s;
      s.shape = {c.h_q};
      std::uniform_real_distribution<double> ud(c.sink_lo, c.sink_hi);
      for (int64_t h = 0; h < c.h_q; ++h) {
        double x;
        if (!c.sinks.empty()) x = c.sinks.at(h);
        else if (c.sinks_uniform) x = ud(rng);
        else if (h == 0) x = std::log(static_cast<double>(std::max<int64_t>(c.s_kv, 2)));
        else if (h == 1) x = 20.0;
        else x = ud(rng);
        s.data.push_back(x);
      }
      sinks.write(s);
    }
    d_sinks = HostTensor::contiguous(SINKATTN_F32, {c.h_q});

    // ---- bias [b|1, h_q|1, s_q, s_kv] ----
    if (!c.bias.empty()) {
      const int64_t bb = c.bias[0] == 'B' ? b : 1, bh = c.bias[1] == 'H' ? c.h_q : 1;
      bias = HostTensor::contiguous(c.bias_dtype, {bb, bh, c.s_q, c.s_kv});
      bias.write(random_array(rng, {bb, bh, c.s_q, c.s_kv}));
      d_bias = HostTensor::contiguous(c.bias_dtype, {bb, bh, c.s_q, c.s_kv});
    }

    // ---- batch tensors ----
    auto i32 = [&](const std::vector<int32_t>& xs) {
      HostTensor h = HostTensor::contiguous(SINKATTN_I32, {static_cast<int64_t>(xs.size())});
      std::memcpy(h.t.data, xs.data(), xs.size() * 4);
      return h;
    };
    if (vl) {
      std::vector<int32_t> cq{0}, ck{0};
      for (int64_t n = 0; n < b; ++n) {
        cq.push_back(cq.back() + c.seqlens_q[n]);
        ck.push_back(ck.back() + c.seqlens_kv[n]);
      }
      cu_q = i32(cq);
      cu_kv = i32(ck);
      p.cu_seqlens_q = cu_q.t;
      p.cu_seqlens_kv = cu_kv.t;
      p.max_seqlen_q = cfg.s_q;
      p.max_seqlen_kv = cfg.s_kv;
      if (!c.seqused_kv.empty()) {
        seqused = i32(c.seqused_kv);
        p.seqused_kv = seqused.t;
      }
    } else if (c.batch == Batch::kPadded) {
      seqlens_q = i32(c.seqlens_q);
      seqlens_kv = i32(c.seqlens_kv);
      p.seqlens_q = seqlens_q.t;
      p.seqlens_kv = seqlens_kv.t;
    }

    p.q = q.t;
    p.k = k.t;
    p.v = v.t;
    if (c.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) p.sinks = sinks.t;
    if (!c.bias.empty()) p.bias = bias.t;
    p.out = out.t;
    p.softmax_lse = lse.t;
    p.d_out = d_out.t;
    if (c.d_lse) p.d_lse = d_lse.t;
    p.dq = dq.t;
    p.dk = dk.t;
    p.dv = dv.t;
    if (c.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) p.d_sinks = d_sinks.t;
    if (!c.bias.empty()) p.d_bias = d_bias.t;
    p.softmax_type = c.softmax_type;
    p.softmax_scale = c.softmax_scale;
    p.window_left = c.window_left;
    p.window_right = c.window_right;
    p.mask_alignment = c.alignment;
    p.dropout_p = c.dropout_p;
    p.seed = c.seed;
    p.offset = c.offset;
    if (c.dropout_p > 0) {
      rng_state = HostTensor::contiguous(SINKATTN_I64, {2});
      p.rng_state = rng_state.t;
    }
    p.deterministic = c.deterministic;
    p.num_threads = c.num_threads;
    p.backend = SINKATTN_BACKEND_CPU;
  }
};

inline std::string format_table(const std::vector<ref::ErrorRow>& rows) {
  std::ostringstream s;
  s << "  output        err          lowp_err     tolerance    pass\n";
  for (const auto& r : rows) {
    char line[160];
    std::snprintf(line, sizeof line, "  %-12s  %-11.4g  %-11.4g  %-11.4g  %s\n", r.name.c_str(), r.err, r.lowp_err,
                  r.tolerance, r.pass ? "yes" : "NO");
    s << line;
  }
  return s.str();
}

// Runs forward (and backward, fed by that forward's out and softmax_lse) on the library and checks every output
// against the float64 reference with SPEC.md section 5 tolerances (the backward with D from the out it was fed).
// Returns the error table.
inline std::vector<ref::ErrorRow> check_against_reference(Problem& pb, bool backward) {
  const sinkattn_status_t fs = pb.forward();
  EXPECT_EQ(fs, SINKATTN_OK) << sinkattn_last_error() << "\n" << pb.cfg.describe();
  if (fs != SINKATTN_OK) return {};
  if (backward) {
    const sinkattn_status_t bs = pb.backward();
    EXPECT_EQ(bs, SINKATTN_OK) << sinkattn_last_error() << "\n" << pb.cfg.describe();
    if (bs != SINKATTN_OK) return {};
  }
  const ref::Result act = pb.actual(backward);
  const auto rows = ref::error_table(act, pb.judges(backward), pb.cfg.dtype);
  bool all = true;
  for (const auto& r : rows) all = all && r.pass;
  EXPECT_TRUE(all) << pb.cfg.describe() << "\n" << format_table(rows);
  if (std::getenv("SINKATTN_TEST_VERBOSE")) std::printf("%s\n%s", pb.cfg.describe().c_str(), format_table(rows).c_str());
  return rows;
}

// The differentiable inputs of a problem (q, k, v; sinks when learnable; bias when present) with the gradient of
// each in `an` (SPEC.md section 3), for the finite-difference tests.
struct GradInput {
  const char* name;
  HostTensor* t;
  const ref::Array* grad;
};
inline std::vector<GradInput> gradient_inputs(Problem& pb, const ref::Result& an) {
  std::vector<GradInput> in = {{"q", &pb.q, &an.dq}, {"k", &pb.k, &an.dk}, {"v", &pb.v, &an.dv}};
  if (pb.cfg.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) in.push_back({"sinks", &pb.sinks, &an.d_sinks});
  if (!pb.cfg.bias.empty()) in.push_back({"bias", &pb.bias, &an.d_bias});
  return in;
}

// Central differences (loss(x + h e) - loss(x - h e)) / (step taken) for every element e of `t`; the step is read
// back from the tensor, since its dtype may round x +- h. `t` is restored afterwards.
inline std::vector<double> central_differences(HostTensor& t, double h, const std::function<double()>& loss) {
  const ref::Array x0 = t.read();
  std::vector<double> fd(x0.data.size());
  for (size_t e = 0; e < x0.data.size(); ++e) {
    ref::Array x = x0;
    x.data[e] = x0.data[e] + h;
    t.write(x);
    const double xp = t.read().data[e];
    const double lp = loss();
    x.data[e] = x0.data[e] - h;
    t.write(x);
    const double xm = t.read().data[e];
    const double lm = loss();
    t.write(x0);
    fd[e] = (lp - lm) / (xp - xm);
  }
  return fd;
}

// Element accessors on float64 arrays of the library's logical layout.
inline double at(const ref::Array& a, std::initializer_list<int64_t> idx) {
  int64_t lin = 0, r = 0;
  for (int64_t x : idx) lin = lin * a.shape[r++] + x;
  return a.data[static_cast<size_t>(lin)];
}

inline bool all_finite(const ref::Array& a) {
  for (double x : a.data)
    if (!std::isfinite(x)) return false;
  return true;
}

inline bool no_nan(const ref::Array& a) {
  for (double x : a.data)
    if (std::isnan(x)) return false;
  return true;
}

}  // namespace sinkattn::test

// GPU suite for the CUDA backend: every output of the CUDA backend against the CPU backend (same inputs,
// same parameters) and, when the call is small, against the float64 reference by SPEC.md section 5, on
//   - every case of tests/gpu/cases/edge-cases.json (a copy of ../shared/cases/edge-cases.json), and
//   - a randomized sweep over every axis (dtype, dense / padded / varlen / seqused_kv, layouts, GQA/MQA,
//     head dims 8..256 with d != d_v, softmax types with large sinks, windows and causal with both alignments,
//     bias shapes and dtypes, dropout, d_lse, deterministic). The sweep seed is printed; `--seed S --only K`
//     reruns configuration K alone.
// Outputs and workspace are filled with NaN before every CUDA call; padding rows must come back exactly 0;
// dropout keep masks are compared bit for bit with sinkattn_dropout_keep; backward (and forward) outputs
// must be bitwise identical across two runs. Plain C++ with its own checks (no GoogleTest needed).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mini_json.hpp"
#include "reference.hpp"
#include "sinkattn/sinkattn.h"

namespace {

int g_failures = 0;
int g_checks = 0;
bool g_verbose = false;
bool g_always_ref = false;  // --ref: compare with the float64 reference whatever the size
// --cpu-only: no GPU needed; runs the CPU backend part of every configuration (NaN-poisoned outputs, written
// checks) and judges it by SPEC.md section 5 where the reference runs. Exercises the suite's own logic
// (configurations, fp32 edge cases, the SPEC 5 judge) on a machine without a GPU.
bool g_cpu_only = false;

#define CUDA_OK(expr)                                                                                   \
  do {                                                                                                  \
    cudaError_t _e = (expr);                                                                            \
    if (_e != cudaSuccess) {                                                                            \
      std::fprintf(stderr, "CUDA error %s at %s:%d: %s\n", cudaGetErrorName(_e), __FILE__, __LINE__, #expr); \
      std::exit(2);                                                                                     \
    }                                                                                                   \
  } while (0)

// ---------------------------------------------------------------- host element conversion
uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
float bf2f(uint16_t h) {
  uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t f2h(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  if ((x & 0x7fffffffu) > 0x7f800000u) return 0x7e00;
  float a = std::fabs(f);
  if (a >= 65520.f) return static_cast<uint16_t>(sign | 0x7c00u);
  if (a < 6.103515625e-05f) {  // subnormal: round(a / 2^-24)
    const uint32_t m = static_cast<uint32_t>(std::nearbyint(a * 16777216.f));
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t ax = x & 0x7fffffffu;
  ax += 0xfffu + ((ax >> 13) & 1u);
  const uint32_t e = (ax >> 23) - 127 + 15, m = (ax >> 13) & 0x3ffu;
  return static_cast<uint16_t>(sign | (e << 10) | m);
}


// ---------------------------------------------------------------- tensors (host buffer + device mirror)
struct Buf {
  std::vector<unsigned char> host;
  void* dev = nullptr;
  sinkattn_tensor_t t{};  // view with host data pointer
  size_t bytes = 0;
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() {
    if (dev && !g_cpu_only) cudaFree(dev);
  }
  void alloc(sinkattn_dtype_t dt, std::vector<int64_t> shape, std::vector<int64_t> strides, size_t elems) {
    bytes = std::max<size_t>(elems, 1) * sinkattn_dtype_size(dt);
    host.assign(bytes, 0);
    t.dtype = dt;
    t.rank = static_cast<int32_t>(shape.size());
    for (size_t i = 0; i < shape.size(); ++i) {
      t.shape[i] = shape[i];
      t.strides[i] = strides[i];
    }
    t.data = host.data();
    if (g_cpu_only)
      dev = host.data();  // only marks the tensor as present; nothing is ever run on it
    else
      CUDA_OK(cudaMalloc(&dev, bytes));
  }
  void set(size_t idx, float v) {
    switch (t.dtype) {
      case SINKATTN_F32: std::memcpy(host.data() + idx * 4, &v, 4); break;
      case SINKATTN_BF16: { uint16_t h = f2bf(v); std::memcpy(host.data() + idx * 2, &h, 2); break; }
      case SINKATTN_F16: { uint16_t h = f2h(v); std::memcpy(host.data() + idx * 2, &h, 2); break; }
      default: break;
    }
  }
  void set_i32(size_t idx, int32_t v) { std::memcpy(host.data() + idx * 4, &v, 4); }
  void upload() {
    if (!g_cpu_only) CUDA_OK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  void poison_dev() { CUDA_OK(cudaMemset(dev, 0xFF, bytes)); }  // NaN in fp16, bf16 and fp32
  void poison_host() { std::memset(host.data(), 0xFF, host.size()); }  // NaN before a CPU call
  void download_to(std::vector<unsigned char>& dst) const {
    dst.resize(bytes);
    CUDA_OK(cudaMemcpy(dst.data(), dev, bytes, cudaMemcpyDeviceToHost));
  }
  sinkattn_tensor_t host_view() { sinkattn_tensor_t v = t; v.data = host.data(); return v; }
  sinkattn_tensor_t dev_view() const { sinkattn_tensor_t v = t; v.data = dev; return v; }
  sinkattn_tensor_t view_of(std::vector<unsigned char>& data) const { sinkattn_tensor_t v = t; v.data = data.data(); return v; }
};

// ---------------------------------------------------------------- configuration
struct Config {
  std::string name;
  sinkattn_dtype_t dtype = SINKATTN_BF16;
  int b = 1, s_q = 1, s_kv = 1, h_q = 1, h_kv = 1, d = 64, d_v = 64;
  int mode = 0;  // 0 dense, 1 dense with padding (seqlens_q/kv), 2 varlen
  std::vector<int> len_q, len_kv, used_kv;
  sinkattn_softmax_type_t st = SINKATTN_SOFTMAX_VANILLA;
  std::vector<float> sinks;
  float scale = NAN;
  int64_t wl = -1, wr = -1;
  sinkattn_mask_alignment_t align = SINKATTN_ALIGN_BOTTOM_RIGHT;
  double p = 0;
  uint64_t seed = 0, offset = 0;
  std::string bias;  // "", "BHSS", "1HSS", "B1SS", "11SS"
  bool bias_f32 = true;
  float bias_const = NAN;
  bool q_zero = false;
  // fp32 with every logit shifted by a large constant (edge case no-finite-minus-inf-sentinel, shift -1e5): the
  // shifted logits carry fp32 rounding of ulp(1e5) / 2 ~ 4e-3 absolute, so no fp32 evaluation meets SPEC 5's
  // 1e-5 on `out`; like tests/test_edge_cases.cpp (no_finite_sentinel), `out` is held to 2e-2 of float64 there.
  bool fp32_shifted_logits = false;
  bool grad = true, d_lse = false, deterministic = false;
  int layout = 0;  // 0 BSHD / THD, 1 BHSD / HTD, 2 SBHD (padded head stride)
  bool poison = true;
  uint64_t data_seed = 1;

  std::string describe() const {
    std::ostringstream o;
    o << name << " [" << (dtype == SINKATTN_BF16 ? "bf16" : dtype == SINKATTN_F16 ? "fp16" : "fp32") << " b=" << b
      << " s_q=" << s_q << " s_kv=" << s_kv << " h=" << h_q << "/" << h_kv << " d=" << d << "/" << d_v
      << " mode=" << (mode == 0 ? "dense" : mode == 1 ? "padded" : "varlen") << (used_kv.empty() ? "" : "+seqused")
      << " st=" << st << " win=(" << wl << "," << wr << ") align=" << align << " p=" << p << " bias=" << bias
      << (bias.empty() ? "" : bias_f32 ? "/f32" : "/lowp") << " grad=" << grad << " dlse=" << d_lse
      << " det=" << deterministic << " layout=" << layout << "]";
    if (!len_q.empty()) {  // per-sequence lengths (padded / varlen), to reproduce a failure
      o << " len_q=";
      for (size_t n = 0; n < len_q.size(); ++n) o << (n ? "," : "") << len_q[n];
      o << " len_kv=";
      for (size_t n = 0; n < len_kv.size(); ++n) o << (n ? "," : "") << len_kv[n];
    }
    return o.str();
  }
};

// Row tensor [b, s, h, d] (dense) or [total, h, d] (varlen) in one of the layouts.
void make_rows(Buf& buf, sinkattn_dtype_t dt, bool varlen, int64_t b, int64_t s, int64_t h, int64_t d, int layout) {
  const int64_t D = layout == 2 ? d + 8 : d;
  if (varlen) {
    if (layout == 1)  // [h, total, d] physical
      buf.alloc(dt, {s, h, d}, {D, s * D, 1}, static_cast<size_t>(h * s * D));
    else
      buf.alloc(dt, {s, h, d}, {h * D, D, 1}, static_cast<size_t>(s * h * D));
    return;
  }
  if (layout == 1)  // BHSD
    buf.alloc(dt, {b, s, h, d}, {h * s * D, D, s * D, 1}, static_cast<size_t>(b * h * s * D));
  else if (layout == 2)  // SBHD with padded head stride
    buf.alloc(dt, {b, s, h, d}, {h * D, b * h * D, D, 1}, static_cast<size_t>(s * b * h * D));
  else
    buf.alloc(dt, {b, s, h, d}, {s * h * D, h * D, D, 1}, static_cast<size_t>(b * s * h * D));
}

size_t elem_index(const sinkattn_tensor_t& t, std::initializer_list<int64_t> idx) {
  size_t off = 0;
  int k = 0;
  for (int64_t i : idx) off += static_cast<size_t>(i * t.strides[k++]);
  return off;
}

struct Problem {
  Config cfg;
  int64_t total_q = 0, total_kv = 0, max_q = 0, max_kv = 0;
  std::vector<int> cu_q, cu_kv;
  Buf q, k, v, sinks, bias, cu_q_t, cu_kv_t, used_t, lq_t, lkv_t, d_out, d_lse, rng;
  Buf out, lse, dq, dk, dv, d_sinks, d_bias;  // outputs (CPU results in host, CUDA run on dev)
};

// Row index of (n, i) in a row tensor, and its validity.
struct RowMap {
  const Problem& P;
  bool varlen() const { return P.cfg.mode == 2; }
};

void fill_random(Buf& b, std::mt19937_64& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  const size_t n = b.bytes / sinkattn_dtype_size(b.t.dtype);
  for (size_t i = 0; i < n; ++i) b.set(i, nd(rng));
}

void build(Problem& P) {
  Config& c = P.cfg;
  std::mt19937_64 rng(c.data_seed);
  const bool varlen = c.mode == 2;
  if (c.mode == 0) {
    c.len_q.assign(c.b, c.s_q);
    c.len_kv.assign(c.b, c.s_kv);
  }
  if (varlen) {
    P.cu_q = {0};
    P.cu_kv = {0};
    for (int n = 0; n < c.b; ++n) {
      P.cu_q.push_back(P.cu_q.back() + c.len_q[n]);
      P.cu_kv.push_back(P.cu_kv.back() + c.len_kv[n]);
      P.max_q = std::max<int64_t>(P.max_q, c.len_q[n]);
      P.max_kv = std::max<int64_t>(P.max_kv, c.len_kv[n]);
    }
    P.total_q = P.cu_q.back();
    P.total_kv = P.cu_kv.back();
    // max_seqlen is an upper bound: sometimes give a looser one.
    if (c.data_seed % 3 == 0) {
      P.max_q += 5;
      P.max_kv += 3;
    }
    c.s_q = static_cast<int>(P.max_q);
    c.s_kv = static_cast<int>(P.max_kv);
  }
  const int64_t rows_q = varlen ? P.total_q : c.s_q, rows_kv = varlen ? P.total_kv : c.s_kv;
  make_rows(P.q, c.dtype, varlen, c.b, rows_q, c.h_q, c.d, c.layout);
  make_rows(P.k, c.dtype, varlen, c.b, rows_kv, c.h_kv, c.d, c.layout);
  make_rows(P.v, c.dtype, varlen, c.b, rows_kv, c.h_kv, c.d_v, c.layout);
  make_rows(P.d_out, c.dtype, varlen, c.b, rows_q, c.h_q, c.d_v, c.layout);
  make_rows(P.out, c.dtype, varlen, c.b, rows_q, c.h_q, c.d_v, c.layout);
  make_rows(P.dq, c.dtype, varlen, c.b, rows_q, c.h_q, c.d, c.layout);
  make_rows(P.dk, c.dtype, varlen, c.b, rows_kv, c.h_kv, c.d, c.layout);
  make_rows(P.dv, c.dtype, varlen, c.b, rows_kv, c.h_kv, c.d_v, c.layout);
  fill_random(P.q, rng, c.q_zero ? 0.f : 1.f);
  fill_random(P.k, rng);
  fill_random(P.v, rng);
  fill_random(P.d_out, rng);
  if (varlen) {
    P.lse.alloc(SINKATTN_F32, {c.h_q, P.total_q}, {P.total_q, 1}, c.h_q * P.total_q);
    P.d_lse.alloc(SINKATTN_F32, {c.h_q, P.total_q}, {P.total_q, 1}, c.h_q * P.total_q);
  } else {
    P.lse.alloc(SINKATTN_F32, {c.b, c.h_q, c.s_q}, {c.h_q * c.s_q, c.s_q, 1}, c.b * c.h_q * c.s_q);
    P.d_lse.alloc(SINKATTN_F32, {c.b, c.h_q, c.s_q}, {c.h_q * c.s_q, c.s_q, 1}, c.b * c.h_q * c.s_q);
  }
  fill_random(P.d_lse, rng);
  // Poison never-visible positions (SPEC 2: they must not reach any output).
  if (c.poison) {
    const float poison[3] = {NAN, INFINITY, 1e10f};
    int pi = 0;
    auto poison_row = [&](Buf& t, int64_t n, int64_t row, int64_t heads, int64_t dim) {
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t x = 0; x < dim; ++x) {
          const size_t e = varlen ? elem_index(t.t, {row, h, x}) : elem_index(t.t, {n, row, h, x});
          t.set(e, poison[(pi++) % 3]);
        }
    };
    for (int n = 0; n < c.b; ++n) {
      if (c.mode == 1) {
        for (int i = c.len_q[n]; i < c.s_q; ++i) {
          poison_row(P.q, n, i, c.h_q, c.d);
          poison_row(P.d_out, n, i, c.h_q, c.d_v);
        }
        for (int j = c.len_kv[n]; j < c.s_kv; ++j) {
          poison_row(P.k, n, j, c.h_kv, c.d);
          poison_row(P.v, n, j, c.h_kv, c.d_v);
        }
        for (int h = 0; h < c.h_q; ++h)
          for (int i = c.len_q[n]; i < c.s_q; ++i) P.d_lse.set(elem_index(P.d_lse.t, {n, h, i}), NAN);
      } else if (varlen && !c.used_kv.empty()) {
        for (int j = P.cu_kv[n] + c.used_kv[n]; j < P.cu_kv[n + 1]; ++j) {
          poison_row(P.k, n, j, c.h_kv, c.d);
          poison_row(P.v, n, j, c.h_kv, c.d_v);
        }
      }
    }
  }
  if (c.st == SINKATTN_SOFTMAX_LEARNABLE) {
    P.sinks.alloc(SINKATTN_F32, {c.h_q}, {1}, c.h_q);
    P.d_sinks.alloc(SINKATTN_F32, {c.h_q}, {1}, c.h_q);
    for (int h = 0; h < c.h_q; ++h) P.sinks.set(h, c.sinks[h % c.sinks.size()]);
  }
  if (!c.bias.empty()) {
    const int64_t bb = c.bias[0] == 'B' ? c.b : 1, hb = c.bias[1] == 'H' ? c.h_q : 1;
    const sinkattn_dtype_t bd = c.bias_f32 ? SINKATTN_F32 : c.dtype;
    const int64_t S = c.s_q, K = c.s_kv;
    P.bias.alloc(bd, {bb, hb, S, K}, {hb * S * K, S * K, K, 1}, bb * hb * S * K);
    P.d_bias.alloc(bd, {bb, hb, S, K}, {hb * S * K, S * K, K, 1}, bb * hb * S * K);
    if (std::isnan(c.bias_const)) {
      fill_random(P.bias, rng);
      // a few -inf entries: such logits are masked
      std::uniform_int_distribution<size_t> pick(0, P.bias.bytes / sinkattn_dtype_size(bd) - 1);
      for (int r = 0; r < 8; ++r) P.bias.set(pick(rng), -INFINITY);
    } else {
      for (size_t e = 0; e < P.bias.bytes / sinkattn_dtype_size(bd); ++e) P.bias.set(e, c.bias_const);
    }
  }
  if (varlen) {
    P.cu_q_t.alloc(SINKATTN_I32, {c.b + 1}, {1}, c.b + 1);
    P.cu_kv_t.alloc(SINKATTN_I32, {c.b + 1}, {1}, c.b + 1);
    for (int n = 0; n <= c.b; ++n) {
      P.cu_q_t.set_i32(n, P.cu_q[n]);
      P.cu_kv_t.set_i32(n, P.cu_kv[n]);
    }
    if (!c.used_kv.empty()) {
      P.used_t.alloc(SINKATTN_I32, {c.b}, {1}, c.b);
      for (int n = 0; n < c.b; ++n) P.used_t.set_i32(n, c.used_kv[n]);
    }
  } else if (c.mode == 1) {
    P.lq_t.alloc(SINKATTN_I32, {c.b}, {1}, c.b);
    P.lkv_t.alloc(SINKATTN_I32, {c.b}, {1}, c.b);
    for (int n = 0; n < c.b; ++n) {
      P.lq_t.set_i32(n, c.len_q[n]);
      P.lkv_t.set_i32(n, c.len_kv[n]);
    }
  }
  P.rng.alloc(SINKATTN_I64, {2}, {1}, 2);
  std::memcpy(P.rng.host.data(), &c.seed, 8);
  std::memcpy(P.rng.host.data() + 8, &c.offset, 8);
  for (Buf* b : {&P.q, &P.k, &P.v, &P.sinks, &P.bias, &P.cu_q_t, &P.cu_kv_t, &P.used_t, &P.lq_t, &P.lkv_t, &P.d_out,
                 &P.d_lse, &P.rng})
    if (b->dev) b->upload();
}

// Fills a params struct; `dev` selects device pointers.
sinkattn_params_t make_params(Problem& P, bool dev, bool backward) {
  const Config& c = P.cfg;
  sinkattn_params_t p;
  sinkattn_params_init(&p);
  auto view = [&](Buf& b) { return b.dev ? (dev ? b.dev_view() : b.host_view()) : sinkattn_tensor_t{}; };
  p.q = view(P.q);
  p.k = view(P.k);
  p.v = view(P.v);
  if (c.st == SINKATTN_SOFTMAX_LEARNABLE) p.sinks = view(P.sinks);
  if (!c.bias.empty()) p.bias = view(P.bias);
  if (c.mode == 2) {
    p.cu_seqlens_q = view(P.cu_q_t);
    p.cu_seqlens_kv = view(P.cu_kv_t);
    if (!c.used_kv.empty()) p.seqused_kv = view(P.used_t);
    p.max_seqlen_q = P.max_q;
    p.max_seqlen_kv = P.max_kv;
  } else if (c.mode == 1) {
    p.seqlens_q = view(P.lq_t);
    p.seqlens_kv = view(P.lkv_t);
  }
  p.out = view(P.out);
  p.softmax_lse = view(P.lse);
  p.softmax_type = c.st;
  p.softmax_scale = c.scale;
  p.window_left = c.wl;
  p.window_right = c.wr;
  p.mask_alignment = c.align;
  p.dropout_p = c.p;
  p.seed = c.seed;
  p.offset = c.offset;
  p.deterministic = c.deterministic;
  p.backend = dev ? SINKATTN_BACKEND_CUDA : SINKATTN_BACKEND_CPU;
  if (backward) {
    p.d_out = view(P.d_out);
    if (c.d_lse) p.d_lse = view(P.d_lse);
    p.dq = view(P.dq);
    p.dk = view(P.dk);
    p.dv = view(P.dv);
    if (c.st == SINKATTN_SOFTMAX_LEARNABLE) p.d_sinks = view(P.d_sinks);
    if (!c.bias.empty()) p.d_bias = view(P.d_bias);
    if (c.p > 0) p.rng_state = view(P.rng);
  } else {
    p.rng_state = view(P.rng);
  }
  return p;
}

// ---------------------------------------------------------------- checks
bool has_nan(const sinkattn::ref::Array& a) {
  for (double x : a.data)
    if (std::isnan(x)) return true;
  return false;
}

double max_abs(const sinkattn::ref::Array& a) {  // over finite values
  double m = 0;
  for (double x : a.data)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// One unit in the last place of `dtype` at magnitude x (x = 0: the smallest subnormal step): fp16 has 10
// mantissa bits and subnormal step 2^-24 (5.96e-8), bf16 7 bits, fp32 23 bits.
double ulp(sinkattn_dtype_t dtype, double x) {
  const int mant = dtype == SINKATTN_F32 ? 23 : dtype == SINKATTN_F16 ? 10 : 7;
  const int min_exp = dtype == SINKATTN_F32 ? -126 : dtype == SINKATTN_F16 ? -14 : -126;  // smallest normal
  int e = min_exp;
  if (x > 0 && std::isfinite(x)) e = std::max(min_exp, std::ilogb(x));
  return std::ldexp(1.0, e - mant);
}

// CUDA against the CPU backend, used as the verdict only when the float64 reference does not run:
//   max|a - c| <= tol * max(max|c|, floor) + 2 * ulp(dtype at max|c|)
// (floor: a natural magnitude of the output, so that values that are 0 by cancellation or fp16 subnormals do
// not turn rounding noise into a failure). Infinities must agree exactly; NaN on either side fails.
struct Cmp {
  std::string msg;
  bool pass = false;
};
Cmp compare_cpu(const char* name, const sinkattn::ref::Array& a, const sinkattn::ref::Array& c, sinkattn_dtype_t dt,
                double tol, double floor) {
  double num = 0, den = 0;
  bool bad = a.data.size() != c.data.size();
  for (size_t i = 0; !bad && i < a.data.size(); ++i) {
    const double x = a.data[i], y = c.data[i];
    if (std::isnan(x) || std::isnan(y) || ((std::isinf(x) || std::isinf(y)) && x != y)) {
      bad = true;
      break;
    }
    if (std::isinf(x)) continue;
    num = std::max(num, std::fabs(x - y));
    den = std::max(den, std::fabs(y));
  }
  const double scale = std::max({den, floor, 1e-6});
  const double allowed = tol * scale + 2 * ulp(dt, den);
  Cmp r;
  r.pass = !bad && num <= allowed;
  char buf[256];
  if (bad)
    std::snprintf(buf, sizeof buf, "%s vs cpu: NaN, or infinities that differ%s", name, has_nan(c) ? " [cpu has NaN]" : "");
  else
    std::snprintf(buf, sizeof buf, "%s vs cpu: max abs diff %.3g > allowed %.3g (tol %.3g x scale %.3g + 2 ulp)", name,
                  num, allowed, tol, scale);
  r.msg = buf;
  return r;
}

// Zero LSE entries of dense padding rows (unspecified by SPEC 2).
void mask_lse(sinkattn::ref::Array& a, const Config& c) {
  if (c.mode != 1 || a.data.empty()) return;
  for (int n = 0; n < c.b; ++n)
    for (int h = 0; h < c.h_q; ++h)
      for (int i = c.len_q[n]; i < c.s_q; ++i) a.data[(static_cast<size_t>(n) * c.h_q + h) * c.s_q + i] = 0;
}

struct Ctx {
  std::vector<std::string> errors;
  std::vector<std::string> notes;  // printed with a failure (and with -v): CUDA-vs-CPU when the reference judged
  void fail(const std::string& s) { errors.push_back(s); }
  void check(bool ok, const std::string& s) {
    ++g_checks;
    if (!ok) fail(s);
  }
};

sinkattn::ref::Array read_dev(const Buf& b, std::vector<unsigned char>& store) {
  b.download_to(store);
  return sinkattn::ref::read_tensor(b.view_of(store));
}

// Every element SPEC.md defines must have been written (outputs are NaN-poisoned before each call): every
// element of out, dq, dk, dv (padding rows / invisible keys are 0), d_sinks, d_bias, and softmax_lse (padding
// rows: "finite or -inf, never NaN", SPEC 2). The suite's buffers hold no row outside a sequence.
void check_written(Ctx& ctx, const char* who, const char* name, const sinkattn::ref::Array& a) {
  ctx.check(!has_nan(a), std::string(who) + " " + name + ": NaN left in an element SPEC.md defines (not written?)");
}

const sinkattn::ref::Array* field_of(const sinkattn::ref::Result& r, const std::string& name) {
  return name == "out" ? &r.out : name == "softmax_lse" ? &r.softmax_lse : name == "dq" ? &r.dq : name == "dk" ? &r.dk
         : name == "dv" ? &r.dv : name == "d_sinks" ? &r.d_sinks : name == "d_bias" ? &r.d_bias : nullptr;
}

// SPEC.md section 5 verdict for one backend's results: the error table (fp32: 1e-5 out / lse, 1e-4 gradients;
// fp16 / bf16: 2x plain low precision + 1e-3). fp32 dq, dk, d_bias that are 0 by cancellation (dS = 0 in exact
// arithmetic, e.g. single-key vanilla rows; the float64 reference then holds 0, or rounding noise of the stored
// fp32 `out` that D reads, ~1e-7 relative, when dropout rescales it) make err = max|x - ref| / max|ref|
// ill-conditioned: when max|ref| <= 1e-5 * max|dv| they are bounded absolutely instead,
// max|x - ref| <= 1e-5 * max|dv| (as SingleKey.VanillaGradientsCancel in tests/test_attention.cpp).
void judge_spec5(Ctx& ctx, const char* who, const sinkattn::ref::Result& act, const sinkattn::ref::Result& r64,
                 const sinkattn::ref::Result& lowp, const Config& c) {
  const sinkattn_dtype_t dtype = c.dtype;
  char buf[320];
  const double dv_scale = max_abs(r64.dv);
  for (const auto& row : sinkattn::ref::error_table(act, r64, lowp, dtype)) {
    const sinkattn::ref::Array* ra = row.name == "dq" ? &r64.dq : row.name == "dk" ? &r64.dk
                                     : row.name == "d_bias" ? &r64.d_bias : nullptr;
    const sinkattn::ref::Array* aa = row.name == "dq" ? &act.dq : row.name == "dk" ? &act.dk
                                     : row.name == "d_bias" ? &act.d_bias : nullptr;
    if (dtype == SINKATTN_F32 && ra && !ra->data.empty() && max_abs(*ra) <= 1e-5 * dv_scale) {
      // row.err * max(max|ref|, 1e-6) is max|x - ref| (inf on NaN); relative_error's own definition, undone.
      const double m = has_nan(*aa) ? INFINITY : row.err * std::max(max_abs(*ra), 1e-6);
      std::snprintf(buf, sizeof buf,
                    "%s SPEC 5 %s (fp32, 0 by cancellation: max|fp64| %.3g): max|x - fp64| %.3g > 1e-5 * max|dv| = %.3g",
                    who, row.name.c_str(), max_abs(*ra), m, 1e-5 * dv_scale);
      ctx.check(m <= 1e-5 * dv_scale, buf);
      continue;
    }
    if (dtype == SINKATTN_F32 && c.fp32_shifted_logits && row.name == "out") {
      std::snprintf(buf, sizeof buf, "%s out (fp32, logits shifted by a large constant): err %.3g vs fp64 > 2e-2", who,
                    row.err);
      ctx.check(row.err <= 2e-2, buf);
      continue;
    }
    const sinkattn::ref::Array* rr = field_of(r64, row.name);
    const sinkattn::ref::Array* xx = field_of(act, row.name);
    std::snprintf(buf, sizeof buf,
                  "%s SPEC 5 %s: err %.3g vs fp64 > tol %.3g (plain low precision %.3g; max|fp64| %.3g, max|x| %.3g, "
                  "max|dv| %.3g)",
                  who, row.name.c_str(), row.err, row.tolerance, row.lowp_err, rr ? max_abs(*rr) : NAN,
                  xx ? max_abs(*xx) : NAN, dv_scale);
    ctx.check(row.pass, buf);
    if (!row.pass && g_verbose && rr && xx && rr->data.size() == xx->data.size()) {
      // Where the error is: the worst element's coordinates (row-major over the reference's shape) and values.
      size_t worst = 0;
      double wd = -1;
      for (size_t i = 0; i < rr->data.size(); ++i) {
        const double d = std::fabs(xx->data[i] - rr->data[i]);
        if (d > wd || std::isnan(d)) {
          wd = d;
          worst = i;
          if (std::isnan(d)) break;
        }
      }
      std::string coord;
      size_t rest = worst;
      for (size_t k = rr->shape.size(); k-- > 0;) {
        coord = std::to_string(rest % rr->shape[k]) + (coord.empty() ? "" : ",") + coord;
        rest /= rr->shape[k];
      }
      std::snprintf(buf, sizeof buf, "  worst %s element [%s]: %s %.6g, fp64 %.6g", row.name.c_str(), coord.c_str(), who,
                    xx->data[worst], rr->data[worst]);
      ctx.notes.push_back(buf);
    }
  }
}

// The float64 reference (and the plain low-precision one) of the call, with the suite's conventions applied.
void reference_results(Problem& P, bool grad, sinkattn::ref::Result& r64, sinkattn::ref::Result& lowp) {
  const Config& c = P.cfg;
  sinkattn_params_t rp = make_params(P, false, grad);
  r64 = sinkattn::ref::evaluate(rp, grad, sinkattn::ref::Precision::kFloat64);
  if (c.dtype != SINKATTN_F32) lowp = sinkattn::ref::evaluate(rp, grad, sinkattn::ref::Precision::kPlainLowPrecision);
  mask_lse(r64.softmax_lse, c);
  mask_lse(lowp.softmax_lse, c);
  if (c.mode == 1) {  // padding rows: out = 0 in every result; the reference may leave them undefined
    for (auto* arr : {&r64.out, &lowp.out})
      for (int n = 0; n < c.b; ++n)
        for (int i = c.len_q[n]; i < c.s_q; ++i)
          for (int h = 0; h < c.h_q; ++h)
            for (int x = 0; x < c.d_v; ++x)
              if (!arr->data.empty()) arr->data[((static_cast<size_t>(n) * c.s_q + i) * c.h_q + h) * c.d_v + x] = 0;
  }
}

// Reference work above which a failing CUDA-vs-CPU comparison is not re-judged here (tools/gpu-check.sh reruns
// failing sweep configurations with --ref instead).
constexpr double kMaxFailureRefWork = 4e9;
// b * h_q * s_q * s_kv * (d + d_v) below which the reference always runs.
constexpr double kRefWork = 1.2e8;

bool run_one(Problem& P, Ctx& ctx, bool with_reference, double work) {
  Config& c = P.cfg;
  build(P);
  const bool grad = c.grad;
  const bool f32 = c.dtype == SINKATTN_F32;
  // ---- CPU backend (host memory), outputs NaN-poisoned ----
  for (Buf* b : {&P.out, &P.lse, &P.dq, &P.dk, &P.dv, &P.d_sinks, &P.d_bias})
    if (b->dev) b->poison_host();
  sinkattn_params_t hp = make_params(P, false, false);
  size_t ws = 0;
  if (sinkattn_forward_workspace_size(&hp, &ws) != SINKATTN_OK) {
    ctx.fail(std::string("cpu forward workspace query: ") + sinkattn_last_error());
    return false;
  }
  std::vector<unsigned char> hws(std::max<size_t>(ws, 1));
  hp.workspace = hws.data();
  hp.workspace_bytes = ws;
  if (sinkattn_forward(&hp) != SINKATTN_OK) {
    ctx.fail(std::string("cpu forward: ") + sinkattn_last_error());
    return false;
  }
  // The backward of both backends uses the CPU forward's out and lse: upload them.
  P.out.upload();
  P.lse.upload();
  std::vector<unsigned char> cpu_out = P.out.host, cpu_lse = P.lse.host;
  if (grad) {
    sinkattn_params_t hb = make_params(P, false, true);
    if (sinkattn_backward_workspace_size(&hb, &ws) != SINKATTN_OK) {
      ctx.fail(std::string("cpu backward workspace query: ") + sinkattn_last_error());
      return false;
    }
    hws.assign(std::max<size_t>(ws, 1), 0);
    hb.workspace = hws.data();
    hb.workspace_bytes = ws;
    if (sinkattn_backward(&hb) != SINKATTN_OK) {
      ctx.fail(std::string("cpu backward: ") + sinkattn_last_error());
      return false;
    }
  }
  sinkattn::ref::Result cpu;
  cpu.out = sinkattn::ref::read_tensor(P.out.view_of(cpu_out));
  cpu.softmax_lse = sinkattn::ref::read_tensor(P.lse.view_of(cpu_lse));
  check_written(ctx, "cpu", "out", cpu.out);
  check_written(ctx, "cpu", "softmax_lse", cpu.softmax_lse);
  mask_lse(cpu.softmax_lse, c);
  if (grad) {
    cpu.dq = sinkattn::ref::read_tensor(P.dq.host_view());
    cpu.dk = sinkattn::ref::read_tensor(P.dk.host_view());
    cpu.dv = sinkattn::ref::read_tensor(P.dv.host_view());
    if (P.d_sinks.dev) cpu.d_sinks = sinkattn::ref::read_tensor(P.d_sinks.host_view());
    if (P.d_bias.dev) cpu.d_bias = sinkattn::ref::read_tensor(P.d_bias.host_view());
    check_written(ctx, "cpu", "dq", cpu.dq);
    check_written(ctx, "cpu", "dk", cpu.dk);
    check_written(ctx, "cpu", "dv", cpu.dv);
    if (P.d_sinks.dev) check_written(ctx, "cpu", "d_sinks", cpu.d_sinks);
    if (P.d_bias.dev) check_written(ctx, "cpu", "d_bias", cpu.d_bias);
  }

  if (g_cpu_only) {  // no GPU: judge the CPU backend by SPEC 5 where the reference runs, and stop
    if (with_reference) {
      try {
        sinkattn::ref::Result r64, lowp;
        reference_results(P, grad, r64, lowp);
        judge_spec5(ctx, "cpu", cpu, r64, lowp, c);
      } catch (const std::exception& e) {
        ctx.fail(std::string("reference: ") + e.what());
      }
    }
    return true;
  }

  // ---- CUDA backend: forward with NaN-poisoned outputs (to separate device buffers) ----
  Buf g_out, g_lse;
  g_out.alloc(P.out.t.dtype, std::vector<int64_t>(P.out.t.shape, P.out.t.shape + P.out.t.rank),
              std::vector<int64_t>(P.out.t.strides, P.out.t.strides + P.out.t.rank),
              P.out.bytes / sinkattn_dtype_size(P.out.t.dtype));
  g_lse.alloc(SINKATTN_F32, std::vector<int64_t>(P.lse.t.shape, P.lse.t.shape + P.lse.t.rank),
              std::vector<int64_t>(P.lse.t.strides, P.lse.t.strides + P.lse.t.rank), P.lse.bytes / 4);
  Buf g_rng;
  g_rng.alloc(SINKATTN_I64, {2}, {1}, 2);
  sinkattn_params_t dp = make_params(P, true, false);
  dp.out = g_out.dev_view();
  dp.softmax_lse = g_lse.dev_view();
  dp.rng_state = g_rng.dev_view();
  {
    sinkattn_backend_t chosen;
    char report[1024];
    sinkattn_params_t autop = dp;
    autop.backend = SINKATTN_BACKEND_AUTO;
    const sinkattn_status_t st = sinkattn_query_backend(&autop, 0, &chosen, report, sizeof(report));
    ctx.check(st == SINKATTN_OK && chosen == SINKATTN_BACKEND_CUDA,
              std::string("auto dispatch did not choose cuda for device memory: ") + report);
  }
  std::vector<unsigned char> st1, st2;
  auto cuda_forward = [&]() -> bool {
    size_t wsz = 0;
    if (sinkattn_forward_workspace_size(&dp, &wsz) != SINKATTN_OK) {
      ctx.fail(std::string("cuda forward workspace query: ") + sinkattn_last_error());
      return false;
    }
    void* dws = nullptr;
    if (wsz) {
      CUDA_OK(cudaMalloc(&dws, wsz));
      CUDA_OK(cudaMemset(dws, 0xFF, wsz));
    }
    dp.workspace = dws;
    dp.workspace_bytes = wsz;
    g_out.poison_dev();
    g_lse.poison_dev();
    g_rng.poison_dev();
    const sinkattn_status_t st = sinkattn_forward(&dp);
    const cudaError_t ce = cudaDeviceSynchronize();
    if (dws) cudaFree(dws);
    if (st != SINKATTN_OK || ce != cudaSuccess) {
      ctx.fail(std::string("cuda forward failed: ") + sinkattn_last_error() + " / " + cudaGetErrorString(ce));
      return false;
    }
    return true;
  };
  if (!cuda_forward()) return false;
  std::vector<unsigned char> s_out, s_lse, s_rng;
  sinkattn::ref::Array a_out = read_dev(g_out, s_out), a_lse = read_dev(g_lse, s_lse);
  g_rng.download_to(s_rng);
  ctx.check(std::memcmp(s_rng.data(), P.rng.host.data(), 16) == 0, "rng_state not written as {seed, offset}");
  check_written(ctx, "cuda", "out", a_out);
  check_written(ctx, "cuda", "softmax_lse", a_lse);
  mask_lse(a_lse, c);
  // CUDA vs CPU, per output (a verdict only when the float64 reference does not run; see compare_cpu). Both
  // backends are held to SPEC 5, so they may differ by twice its budget: fp32 2e-5 (out, lse), 2e-4 (gradients).
  const double tol = f32 ? 2e-4 : 2e-2;
  std::vector<Cmp> vs_cpu;
  vs_cpu.push_back(compare_cpu("out", a_out, cpu.out, c.dtype, f32 ? 2e-5 : 2e-2, 1e-6));
  vs_cpu.push_back(compare_cpu("softmax_lse", a_lse, cpu.softmax_lse, SINKATTN_F32, f32 ? 2e-5 : 1e-3, 1e-6));
  // Padding rows of a dense batch: out = 0 exactly.
  if (c.mode == 1) {
    bool zero = true;
    for (int n = 0; n < c.b; ++n)
      for (int i = c.len_q[n]; i < c.s_q; ++i)
        for (int h = 0; h < c.h_q; ++h)
          for (int x = 0; x < c.d_v; ++x)
            if (a_out.data[((static_cast<size_t>(n) * c.s_q + i) * c.h_q + h) * c.d_v + x] != 0.0) zero = false;
    ctx.check(zero, "out of padding rows is not exactly 0");
  }
  // Forward determinism (bitwise).
  if (c.deterministic) {
    if (!cuda_forward()) return false;
    std::vector<unsigned char> r_out, r_lse;
    g_out.download_to(r_out);
    g_lse.download_to(r_lse);
    ctx.check(r_out == s_out && r_lse == s_lse, "forward not bitwise reproducible");
  }

  sinkattn::ref::Result actual;
  actual.out = a_out;
  actual.softmax_lse = a_lse;
  if (grad) {
    Buf g_dq, g_dk, g_dv, g_ds, g_db;
    auto like = [](Buf& dst, const Buf& src) {
      dst.alloc(src.t.dtype, std::vector<int64_t>(src.t.shape, src.t.shape + src.t.rank),
                std::vector<int64_t>(src.t.strides, src.t.strides + src.t.rank),
                src.bytes / sinkattn_dtype_size(src.t.dtype));
    };
    like(g_dq, P.dq);
    like(g_dk, P.dk);
    like(g_dv, P.dv);
    if (P.d_sinks.dev) like(g_ds, P.d_sinks);
    if (P.d_bias.dev) like(g_db, P.d_bias);
    sinkattn_params_t bp = make_params(P, true, true);  // out / lse: the CPU forward's (uploaded)
    bp.dq = g_dq.dev_view();
    bp.dk = g_dk.dev_view();
    bp.dv = g_dv.dev_view();
    if (g_ds.dev) bp.d_sinks = g_ds.dev_view();
    if (g_db.dev) bp.d_bias = g_db.dev_view();
    size_t wsz = 0;
    if (sinkattn_backward_workspace_size(&bp, &wsz) != SINKATTN_OK) {
      ctx.fail(std::string("cuda backward workspace query: ") + sinkattn_last_error());
      return false;
    }
    void* dws = nullptr;
    if (wsz) CUDA_OK(cudaMalloc(&dws, wsz));
    // Workspace one byte too small: refused with an error, not a crash.
    if (wsz > 0) {
      bp.workspace = dws;
      bp.workspace_bytes = wsz - 1;
      ctx.check(sinkattn_backward(&bp) == SINKATTN_ERR_WORKSPACE_TOO_SMALL, "too-small workspace not refused");
    }
    std::vector<std::vector<unsigned char>> first;
    for (int rep = 0; rep < (c.deterministic ? 2 : 1); ++rep) {
      if (wsz) CUDA_OK(cudaMemset(dws, 0xFF, wsz));
      for (Buf* b : {&g_dq, &g_dk, &g_dv, &g_ds, &g_db})
        if (b->dev) b->poison_dev();
      bp.workspace = dws;
      bp.workspace_bytes = wsz;
      const sinkattn_status_t st = sinkattn_backward(&bp);
      const cudaError_t ce = cudaDeviceSynchronize();
      if (st != SINKATTN_OK || ce != cudaSuccess) {
        ctx.fail(std::string("cuda backward failed: ") + sinkattn_last_error() + " / " + cudaGetErrorString(ce));
        if (dws) cudaFree(dws);
        return false;
      }
      std::vector<std::vector<unsigned char>> now;
      for (Buf* b : {&g_dq, &g_dk, &g_dv, &g_ds, &g_db}) {
        now.emplace_back();
        if (b->dev) b->download_to(now.back());
      }
      if (rep == 0)
        first = now;
      else
        ctx.check(now == first, "backward not bitwise reproducible with deterministic = 1");
    }
    if (dws) cudaFree(dws);
    auto rd = [&](Buf& g, std::vector<unsigned char>& s) { return sinkattn::ref::read_tensor(g.view_of(s)); };
    actual.dq = rd(g_dq, first[0]);
    actual.dk = rd(g_dk, first[1]);
    actual.dv = rd(g_dv, first[2]);
    if (g_ds.dev) actual.d_sinks = rd(g_ds, first[3]);
    if (g_db.dev) actual.d_bias = rd(g_db, first[4]);
    check_written(ctx, "cuda", "dq", actual.dq);
    check_written(ctx, "cuda", "dk", actual.dk);
    check_written(ctx, "cuda", "dv", actual.dv);
    if (g_ds.dev) check_written(ctx, "cuda", "d_sinks", actual.d_sinks);
    if (g_db.dev) check_written(ctx, "cuda", "d_bias", actual.d_bias);
    // dq, dk, d_bias are 0 by cancellation in single-key vanilla rows (dS = 0): their natural magnitude is
    // 1e-3 x max|dv|. d_bias rounds to the dtype of bias.
    const double g_floor = 1e-3 * max_abs(cpu.dv);
    const sinkattn_dtype_t bias_dt = c.bias_f32 ? SINKATTN_F32 : c.dtype;
    vs_cpu.push_back(compare_cpu("dq", actual.dq, cpu.dq, c.dtype, tol, g_floor));
    vs_cpu.push_back(compare_cpu("dk", actual.dk, cpu.dk, c.dtype, tol, g_floor));
    vs_cpu.push_back(compare_cpu("dv", actual.dv, cpu.dv, c.dtype, tol, 1e-6));
    if (g_ds.dev) vs_cpu.push_back(compare_cpu("d_sinks", actual.d_sinks, cpu.d_sinks, SINKATTN_F32, tol, 1e-6));
    if (g_db.dev) vs_cpu.push_back(compare_cpu("d_bias", actual.d_bias, cpu.d_bias, bias_dt, tol, g_floor));
    if (c.mode == 1) {
      bool zero = true;
      for (int n = 0; n < c.b; ++n)
        for (int i = c.len_q[n]; i < c.s_q; ++i)
          for (int h = 0; h < c.h_q; ++h)
            for (int x = 0; x < c.d; ++x)
              if (actual.dq.data[((static_cast<size_t>(n) * c.s_q + i) * c.h_q + h) * c.d + x] != 0.0) zero = false;
      ctx.check(zero, "dq of padding rows is not exactly 0");
    }
  }

  // ---- verdict: SPEC.md section 5 against the float64 reference when it runs (small calls, --ref, and every
  // call whose CUDA-vs-CPU comparison failed); otherwise the CUDA-vs-CPU comparison ----
  bool cpu_agrees = true;
  for (const Cmp& x : vs_cpu) cpu_agrees = cpu_agrees && x.pass;
  if (!with_reference && !cpu_agrees && work <= kMaxFailureRefWork) {
    with_reference = true;
    ctx.notes.push_back("CUDA-vs-CPU comparison failed: judged by the float64 reference instead");
  }
  if (with_reference) {
    for (const Cmp& x : vs_cpu)
      if (!x.pass) ctx.notes.push_back("(log only) " + x.msg);
    try {
      sinkattn::ref::Result r64, lowp;
      reference_results(P, grad, r64, lowp);
      judge_spec5(ctx, "cuda", actual, r64, lowp, c);
      // The backends disagree: say whether the CPU side is off too.
      if (!cpu_agrees) judge_spec5(ctx, "cpu backend", cpu, r64, lowp, c);
    } catch (const std::exception& e) {
      ctx.fail(std::string("reference: ") + e.what());
    }
  } else {
    for (const Cmp& x : vs_cpu) ctx.check(x.pass, x.msg);
    if (!cpu_agrees) ctx.notes.push_back("reference too large to run here: rerun with --ref to decide");
  }
  return true;
}

// ---------------------------------------------------------------- random configurations
Config random_config(uint64_t seed, int index, bool small) {
  std::mt19937_64 r(seed * 1000003ull + static_cast<uint64_t>(index));
  auto U = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(r); };
  auto F = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(r); };
  Config c;
  c.name = "sweep#" + std::to_string(index);
  c.data_seed = r();
  // fp32 (the SIMT path of the CUDA backend, src/cuda/fp32) in 15% of the configurations, at moderate sizes.
  const int dt_pick = U(0, 99);
  c.dtype = dt_pick < 15 ? SINKATTN_F32 : dt_pick < 75 ? SINKATTN_BF16 : SINKATTN_F16;
  const bool f32 = c.dtype == SINKATTN_F32;
  const int mode_pick = U(0, 99);
  c.mode = mode_pick < 40 ? 0 : mode_pick < 65 ? 1 : 2;
  c.b = U(1, 3);
  auto pick_len = [&](int cap) {
    const int k = U(0, 9);
    if (k < 2) return U(1, 16);
    if (k < 4) return 64 * U(1, 4) + U(-1, 1);
    return U(1, cap);
  };
  const int cap = small ? 80 : f32 ? 160 : 300;
  c.s_q = std::max(1, pick_len(cap));
  c.s_kv = U(0, 1) ? c.s_q : std::max(1, pick_len(cap));
  c.h_kv = U(1, 3);
  const int groups[] = {1, 1, 2, 4, 8};
  c.h_q = c.h_kv * groups[U(0, 4)];
  const int tiles[] = {32, 64, 96, 128, 192, 256};
  c.d = U(0, 9) < 6 ? tiles[U(0, 5)] : 8 * U(1, 32);
  c.d_v = U(0, 9) < 7 ? c.d : 8 * U(1, 32);
  if (small) {
    c.d = std::min(c.d, 64);
    c.d_v = std::min(c.d_v, 64);
    c.h_kv = std::min(c.h_kv, 2);
    c.h_q = c.h_kv * std::min(c.h_q / c.h_kv, 2);
  }
  // keep the CPU reference affordable (fp32: smaller still, so that the reference always judges it)
  const double max_work = f32 ? 1.2e7 : 6e7;
  while (static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv * std::max(c.d, c.d_v) > max_work && c.h_q > c.h_kv)
    c.h_q -= c.h_kv;
  while (static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv * std::max(c.d, c.d_v) > max_work && c.b > 1) --c.b;
  if (c.mode == 1 || c.mode == 2) {
    for (int n = 0; n < c.b; ++n) {
      const int k = U(0, 9);
      c.len_q.push_back(k == 0 ? 0 : k == 1 ? c.s_q : U(1, c.s_q));
      const int kk = U(0, 9);
      c.len_kv.push_back(kk == 0 ? 0 : kk == 1 ? c.s_kv : U(1, c.s_kv));
    }
    if (c.mode == 2 && U(0, 4) == 0)
      for (int n = 0; n < c.b; ++n) c.used_kv.push_back(U(0, c.len_kv[n]));
  }
  const int stp = U(0, 99);
  c.st = stp < 60 ? SINKATTN_SOFTMAX_LEARNABLE : stp < 75 ? SINKATTN_SOFTMAX_OFF_BY_ONE : SINKATTN_SOFTMAX_VANILLA;
  for (int h = 0; h < c.h_q; ++h) {
    const int k = U(0, 4);
    c.sinks.push_back(k == 0 ? std::log(static_cast<float>(std::max(c.s_kv, 2))) : k == 1 ? 20.f
                      : k == 2 ? -5.f : static_cast<float>(F(-1, 3)));
  }
  const int w = U(0, 99);
  if (w < 30) {
    c.wl = c.wr = -1;
  } else if (w < 55) {
    c.wl = -1, c.wr = 0;
  } else if (w < 75) {
    c.wl = U(0, 150), c.wr = 0;
  } else if (w < 90) {
    c.wl = U(0, 100), c.wr = U(0, 100);
  } else {
    c.wl = -1, c.wr = U(0, 40);
  }
  c.align = U(0, 1) ? SINKATTN_ALIGN_BOTTOM_RIGHT : SINKATTN_ALIGN_TOP_LEFT;
  if (U(0, 4) == 0) c.scale = static_cast<float>(F(0.03, 0.4));
  if (c.mode != 2 && U(0, 99) < 15) {
    const char* codes[] = {"BHSS", "1HSS", "B1SS", "11SS"};
    c.bias = codes[U(0, 3)];
    c.bias_f32 = U(0, 1);
  }
  if (U(0, 99) < 15) {
    const double ps[] = {0.1, 0.5, 0.9};
    c.p = ps[U(0, 2)];
    c.seed = r();
    c.offset = r() >> U(0, 63);
  }
  c.grad = U(0, 99) < 85;
  c.d_lse = U(0, 99) < 30;
  c.deterministic = U(0, 99) < 30;
  c.layout = U(0, 2);
  if (c.mode == 2 && c.layout == 2) c.layout = 0;
  return c;
}

// ---------------------------------------------------------------- edge cases from JSON
std::vector<Config> cases_from_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    std::exit(2);
  }
  std::stringstream ss;
  ss << f.rdbuf();
  const mini_json::Value root = mini_json::parse(ss.str());
  std::vector<Config> out;
  std::mt19937_64 r(7);
  for (const auto& cj : root.arr) {
    const auto& sh = cj["shape"];
    std::vector<int> dims;
    if (sh["d"].is_arr())
      for (const auto& x : sh["d"].arr) dims.push_back(static_cast<int>(x.num));
    else
      dims.push_back(static_cast<int>(sh["d"].num));
    for (size_t di = 0; di < dims.size(); ++di) {
      Config c;
      c.name = cj["name"].str + (dims.size() > 1 ? "/d" + std::to_string(dims[di]) : "");
      c.data_seed = 1000 + out.size();
      c.b = static_cast<int>(sh["b"].num);
      c.s_q = static_cast<int>(sh["s_q"].num);
      c.s_kv = static_cast<int>(sh["s_kv"].num);
      c.h_q = static_cast<int>(sh["h_q"].num);
      c.h_kv = static_cast<int>(sh["h_kv"].num);
      c.d = dims[di];
      c.d_v = sh["d_v"].is_num() ? static_cast<int>(sh["d_v"].num) : c.d;
      const std::string dt = cj.has("dtype") ? cj["dtype"].str : "bf16";
      // fp32 cases run in fp32 (the CUDA backend's SIMT path, src/cuda/fp32)
      c.dtype = dt == "fp16" ? SINKATTN_F16 : dt == "fp32" ? SINKATTN_F32 : SINKATTN_BF16;
      for (const char* key : {"varlen", "padding"}) {
        if (!cj.has(key)) continue;
        c.mode = std::string(key) == "varlen" ? 2 : 1;
        for (const auto& x : cj[key]["seqlens_q"].arr) c.len_q.push_back(static_cast<int>(x.num));
        for (const auto& x : cj[key]["seqlens_kv"].arr) c.len_kv.push_back(static_cast<int>(x.num));
      }
      const std::string st = cj.has("softmax_type") ? cj["softmax_type"].str : "vanilla";
      c.st = st == "learnable" ? SINKATTN_SOFTMAX_LEARNABLE
             : st == "off_by_one" ? SINKATTN_SOFTMAX_OFF_BY_ONE
                                  : SINKATTN_SOFTMAX_VANILLA;
      if (cj.has("sinks")) {
        if (cj["sinks"].is_arr()) {
          for (const auto& x : cj["sinks"].arr) c.sinks.push_back(static_cast<float>(x.num));
        } else {
          const auto& u = cj["sinks"]["uniform"].arr;
          std::uniform_real_distribution<float> ud(static_cast<float>(u[0].num), static_cast<float>(u[1].num));
          for (int h = 0; h < c.h_q; ++h) c.sinks.push_back(ud(r));
          c.sinks[0] = std::log(static_cast<float>(std::max(c.s_kv, 2)));  // and a large one (SPEC 5)
          if (c.h_q > 1) c.sinks[1] = 20.f;
        }
      } else {
        c.sinks = {std::log(static_cast<float>(std::max(c.s_kv, 2))), 20.f};
      }
      if (cj.has("window")) {
        c.wl = static_cast<int64_t>(cj["window"].arr[0].num);
        c.wr = static_cast<int64_t>(cj["window"].arr[1].num);
      }
      if (cj.has("alignment"))
        c.align = cj["alignment"].str == "top_left" ? SINKATTN_ALIGN_TOP_LEFT : SINKATTN_ALIGN_BOTTOM_RIGHT;
      if (cj.has("dropout_p")) c.p = cj["dropout_p"].num;
      if (cj.has("seed")) c.seed = static_cast<uint64_t>(cj["seed"].num);
      if (cj.has("offset")) c.offset = static_cast<uint64_t>(cj["offset"].num);
      if (cj.has("bias")) c.bias = cj["bias"].str;
      if (cj.has("scores_shift")) {
        c.bias = "11SS";
        c.bias_const = static_cast<float>(cj["scores_shift"].num);
        c.fp32_shifted_logits = c.dtype == SINKATTN_F32 && std::fabs(c.bias_const) > 1e3f;
      }
      if (cj.has("all_logits")) {
        c.bias = "11SS";
        c.bias_const = static_cast<float>(cj["all_logits"].num);
        c.q_zero = true;
      }
      c.grad = cj.has("grad") && cj["grad"].b;
      c.d_lse = cj.has("d_lse") && cj["d_lse"].b;
      c.deterministic = cj.has("deterministic") && cj["deterministic"].b;
      if (c.mode == 2) {
        c.s_q = *std::max_element(c.len_q.begin(), c.len_q.end());
        c.s_kv = *std::max_element(c.len_kv.begin(), c.len_kv.end());
      }
      out.push_back(c);
      // Every case also runs deterministic and in a second layout.
      Config c2 = c;
      c2.name += "/layout1+det";
      c2.layout = 1;
      c2.deterministic = true;
      c2.data_seed += 77;
      out.push_back(c2);
    }
  }
  return out;
}

// ---------------------------------------------------------------- dropout keep mask, bit for bit
// With one-hot value vectors (d_v = s_kv, v_j = e_j), out_i[j] = keep_ij / (1 - p) * P_ij, which is non-zero
// exactly when (i, j) is kept: the CUDA keep mask is read off the output and compared with sinkattn_dropout_keep.
void dropout_mask_test(Ctx& ctx) {
  struct DC {
    int b, s_q, s_kv, h;
    double p;
    uint64_t seed, offset;
    bool varlen;
    sinkattn_dtype_t dtype;
  } dcs[] = {{2, 70, 64, 3, 0.5, 1234, 64, false, SINKATTN_BF16},
             {1, 33, 64, 2, 0.9, 0xdeadbeefcafeull, (1ull << 40) + 3, false, SINKATTN_BF16},
             {3, 40, 48, 2, 0.25, 42, 7, true, SINKATTN_BF16},
             {1, 64, 128, 1, 0.97, 99, 0, false, SINKATTN_BF16},
             {2, 70, 64, 3, 0.5, 1234, 64, false, SINKATTN_F32},  // the fp32 path draws the same mask
             {3, 40, 48, 2, 0.25, 42, 7, true, SINKATTN_F32}};
  for (const DC& x : dcs) {
    Problem P;
    Config& c = P.cfg;
    c.name = "dropout-mask";
    c.dtype = x.dtype;
    c.b = x.b;
    c.s_q = x.s_q;
    c.s_kv = x.s_kv;
    c.h_q = c.h_kv = x.h;
    c.d = 64;
    c.d_v = x.s_kv;
    c.st = SINKATTN_SOFTMAX_LEARNABLE;
    c.sinks = {1.f};
    c.p = x.p;
    c.seed = x.seed;
    c.offset = x.offset;
    c.scale = 0.05f;
    c.grad = false;
    c.poison = false;
    if (x.varlen) {
      c.mode = 2;
      for (int n = 0; n < c.b; ++n) {
        c.len_q.push_back(x.s_q - 7 * n);
        c.len_kv.push_back(x.s_kv - 5 * n);
      }
    }
    build(P);
    // one-hot v: v[n, j, h, c] = (c == j)
    for (size_t e = 0; e < P.v.bytes / sinkattn_dtype_size(c.dtype); ++e) P.v.set(e, 0.f);
    for (int n = 0; n < c.b; ++n)
      for (int j = 0; j < (x.varlen ? c.len_kv[n] : c.s_kv); ++j)
        for (int h = 0; h < c.h_kv; ++h) {
          const size_t e = x.varlen ? elem_index(P.v.t, {P.cu_kv[n] + j, h, j}) : elem_index(P.v.t, {n, j, h, j});
          P.v.set(e, 1.f);
        }
    P.v.upload();
    sinkattn_params_t dp = make_params(P, true, false);
    P.out.poison_dev();
    P.lse.poison_dev();
    if (sinkattn_forward(&dp) != SINKATTN_OK || cudaDeviceSynchronize() != cudaSuccess) {
      ctx.fail(std::string("dropout mask test: cuda forward failed: ") + sinkattn_last_error());
      continue;
    }
    std::vector<unsigned char> s;
    const sinkattn::ref::Array o = read_dev(P.out, s);
    int64_t mism = 0, kept = 0, total = 0;
    const int64_t max_q = x.varlen ? P.max_q : c.s_q, max_kv = x.varlen ? P.max_kv : c.s_kv;
    for (int n = 0; n < c.b; ++n) {
      const int lq = x.varlen ? c.len_q[n] : c.s_q, lk = x.varlen ? c.len_kv[n] : c.s_kv;
      for (int i = 0; i < lq; ++i)
        for (int h = 0; h < c.h_q; ++h)
          for (int j = 0; j < lk; ++j) {
            const size_t row = x.varlen ? static_cast<size_t>(P.cu_q[n] + i) : static_cast<size_t>(n) * c.s_q + i;
            const double val = o.data[(row * c.h_q + h) * c.d_v + j];
            const bool k_gpu = val != 0.0;
            const bool k_ref = sinkattn_dropout_keep(c.seed, c.offset, n, h, i, j, c.h_q, max_q, max_kv, c.p) != 0;
            mism += k_gpu != k_ref;
            kept += k_ref;
            ++total;
          }
    }
    char buf[200];
    std::snprintf(buf, sizeof buf, "dropout keep mask (%s p=%.2f seed=%llu offset=%llu%s): %lld of %lld differ (%lld kept)",
                  x.dtype == SINKATTN_F32 ? "fp32" : "bf16", x.p, static_cast<unsigned long long>(x.seed),
                  static_cast<unsigned long long>(x.offset), x.varlen ? " varlen" : "", static_cast<long long>(mism), static_cast<long long>(total),
                  static_cast<long long>(kept));
    ctx.check(mism == 0, buf);
    std::printf("  %s\n", buf);
  }
}

// ---------------------------------------------------------------- rejections (SPEC 4)
void rejection_test(Ctx& ctx) {
  auto expect_reject = [&](Config c, const char* what) {
    Problem P;
    P.cfg = c;
    build(P);
    sinkattn_params_t dp = make_params(P, true, false);
    const sinkattn_status_t st = sinkattn_forward(&dp);
    const std::string msg = sinkattn_last_error();
    std::printf("  reject %-28s -> status %d: %s\n", what, st, msg.c_str());
    ctx.check(st != SINKATTN_OK && !msg.empty(), std::string("cuda backend accepted ") + what);
  };
  Config c;
  c.name = "reject";
  c.b = 1, c.s_q = 16, c.s_kv = 16, c.h_q = c.h_kv = 1;
  c.poison = false;
  // fp32 runs on the GPU now (src/cuda/fp32): what is still refused is checked here.
  Config hd = c;
  hd.d = hd.d_v = 12;
  expect_reject(hd, "head dim 12");
  Config f32 = c;
  f32.dtype = SINKATTN_F32;
  f32.d = f32.d_v = 264;  // fp32 path: head dims up to 256
  expect_reject(f32, "fp32 head dim 264");

  // Batch tensors in device memory are validated too (SPEC 4): their contents are read back with a synchronising
  // copy (outside CUDA-graph capture). Each case corrupts the device copy after build() and expects a refusal
  // whose message names the tensor, with the outputs left poisoned.
  auto expect_bad_batch = [&](Config c, const char* what, const char* name, auto corrupt) {
    Problem P;
    P.cfg = c;
    build(P);
    corrupt(P);
    P.out.poison_dev();
    sinkattn_params_t dp = make_params(P, true, false);
    const sinkattn_status_t st = sinkattn_forward(&dp);
    const std::string msg = sinkattn_last_error();
    std::printf("  reject %-28s -> status %d: %s\n", what, st, msg.c_str());
    ctx.check(st == SINKATTN_ERR_INVALID_ARGUMENT && msg.find(name) != std::string::npos,
              std::string("device batch tensor not validated: ") + what + " (" + msg + ")");
    std::vector<unsigned char> host;
    P.out.download_to(host);
    bool poisoned = true;
    for (unsigned char x : host) poisoned = poisoned && x == 0xFF;
    ctx.check(poisoned, std::string("outputs written although validation failed: ") + what);
  };
  Config vl = c;
  vl.mode = 2;
  vl.b = 3;
  vl.len_q = {4, 6, 6};
  vl.len_kv = {4, 6, 6};
  vl.s_q = vl.s_kv = 6;
  expect_bad_batch(vl, "device cu_seqlens_q 0,6,4,16", "cu_seqlens_q", [](Problem& P) {
    P.cu_q_t.set_i32(1, 6);
    P.cu_q_t.set_i32(2, 4);
    P.cu_q_t.upload();
  });
  expect_bad_batch(vl, "device cu_seqlens_kv[0] = 1", "cu_seqlens_kv", [](Problem& P) {
    P.cu_kv_t.set_i32(0, 1);
    P.cu_kv_t.upload();
  });
  Config pd = c;
  pd.mode = 1;
  pd.b = 2;
  pd.len_q = {16, 9};
  pd.len_kv = {16, 12};
  expect_bad_batch(pd, "device seqlens_kv 17 > s_kv", "seqlens_kv", [](Problem& P) {
    P.lkv_t.set_i32(1, 17);
    P.lkv_t.upload();
  });
}

}  // namespace

int main(int argc, char** argv) {
  std::string cases = "tests/gpu/cases/edge-cases.json";
  int sweep = 500;
  uint64_t seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007ull;
  int only = -1;
  bool small = false, no_cases = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--cases") cases = next();
    else if (a == "--sweep") sweep = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--only") only = std::stoi(next());
    else if (a == "--small") small = true;
    else if (a == "--no-cases") no_cases = true;
    else if (a == "-v") g_verbose = true;
    else if (a == "--ref") g_always_ref = true;
    else if (a == "--cpu-only") g_cpu_only = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--cases FILE] [--sweep N] [--seed S] [--only K] [--small] [--no-cases] [--ref] "
                   "[--cpu-only] [-v]\n",
                   argv[0]);
      return 2;
    }
  }
  if (g_cpu_only) {
    std::printf("sinkattn GPU suite, --cpu-only (CPU backend and the suite's own checks, no GPU); sweep seed %llu\n",
                static_cast<unsigned long long>(seed));
  } else {
    int dev_count = 0;
    CUDA_OK(cudaGetDeviceCount(&dev_count));
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    std::printf("sinkattn GPU suite on %s (sm_%d%d); sweep seed %llu (rerun: --seed %llu --only K)\n", prop.name,
                prop.major, prop.minor, static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
    char info[4096];
    sinkattn_backend_describe(SINKATTN_BACKEND_CUDA, info, sizeof info);
    std::printf("%s", info);
  }

  int run = 0, failed = 0;
  int by_dtype[3] = {0, 0, 0}, failed_by_dtype[3] = {0, 0, 0};  // bf16, fp16, fp32
  auto run_config = [&](Config c) {
    const int di = c.dtype == SINKATTN_BF16 ? 0 : c.dtype == SINKATTN_F16 ? 1 : 2;
    ++by_dtype[di];
    Problem P;
    P.cfg = c;
    Ctx ctx;
    const auto t0 = std::chrono::steady_clock::now();
    const double work = static_cast<double>(c.b) * c.h_q * std::max(c.s_q, 1) * std::max(c.s_kv, 1) * (c.d + c.d_v);
    // The float64 reference judges every call where it is cheap (and, inside run_one, every call whose
    // CUDA-vs-CPU comparison fails).
    run_one(P, ctx, g_always_ref || work < kRefWork, work);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    ++run;
    if (!ctx.errors.empty()) {
      ++failed;
      ++failed_by_dtype[di];
      std::printf("FAIL %s\n", P.cfg.describe().c_str());
      for (const auto& e : ctx.errors) std::printf("     %s\n", e.c_str());
      for (const auto& e : ctx.notes) std::printf("     note: %s\n", e.c_str());
    } else if (g_verbose) {
      std::printf("ok   %s (%.0f ms)\n", P.cfg.describe().c_str(), ms);
      for (const auto& e : ctx.notes) std::printf("     note: %s\n", e.c_str());
    }
    std::fflush(stdout);
  };

  if (only < 0) {
    Ctx ctx;
    if (!g_cpu_only) {
      std::printf("-- rejections\n");
      rejection_test(ctx);
      std::printf("-- dropout keep masks vs sinkattn_dropout_keep\n");
      dropout_mask_test(ctx);
      ++run;
    }
    if (!ctx.errors.empty()) {
      ++failed;
      for (const auto& e : ctx.errors) std::printf("FAIL %s\n", e.c_str());
    }
    if (!no_cases) {
      const auto cs = cases_from_json(cases);
      std::printf("-- %zu edge-case configurations from %s\n", cs.size(), cases.c_str());
      for (const auto& c : cs) {
        if (small && static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv > 2e6) continue;
        run_config(c);
      }
    }
    std::printf("-- randomized sweep: %d configurations, seed %llu\n", sweep, static_cast<unsigned long long>(seed));
    for (int k = 0; k < sweep; ++k) run_config(random_config(seed, k, small));
  } else {
    run_config(random_config(seed, only, small));
  }
  std::printf("SUMMARY: %d configurations, %d failed, %d checks (bf16 %d/%d failed, fp16 %d/%d, fp32 %d/%d)\n", run,
              failed, g_checks, failed_by_dtype[0], by_dtype[0], failed_by_dtype[1], by_dtype[1], failed_by_dtype[2],
              by_dtype[2]);
  return failed == 0 ? 0 : 1;
}

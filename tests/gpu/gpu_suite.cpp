// GPU suite for the CUDA backend. It judges what a user's pipeline computes: the CUDA backward fed by the CUDA
// forward's out and softmax_lse. Configurations:
//   - every case of tests/gpu/cases/edge-cases.json (a copy of ../shared/cases/edge-cases.json) and of the
//     project's own tests/gpu/cases/edge-cases-sinkattn.json (sink values, rows that see no key, rows outside
//     every sequence, NaN / +inf sinks), each also deterministic and in a second layout;
//   - a randomized sweep over every axis (dtype, dense / padded / varlen / seqused_kv with rows after
//     cu_seqlens[b], layouts, GQA/MQA, head dims 8..256 with d != d_v, softmax types with large and -inf sinks,
//     windows and causal with both alignments, bias shapes and dtypes, dropout, d_lse, deterministic). The
//     sweep seed is printed; `--seed S --only K` reruns configuration K alone.
// For each configuration it runs the CPU and CUDA forwards, the CUDA backward fed by the CUDA forward (the
// pipeline) and fed by the CPU forward (isolates backward errors), and the CPU backward fed by each, and
//   - judges every CUDA output by SPEC.md section 5 against the float64 reference of tests/reference (gradients
//     with D_i from the out that backward was given) whenever the reference fits the budget kRefWork (every
//     edge case, and every configuration of the default sweep); CUDA against the CPU backend on the same inputs
//     is extra evidence, and the verdict only for calls the reference does not judge;
//   - checks exact properties everywhere: outputs and workspace NaN-poisoned before every call and fully
//     written; rows that see no key get out = 0, dq = 0 and LSE exactly sigma / 0 / -inf (SPEC 2); padding rows
//     out = dq = 0; elements outside the call (varlen rows after cu_seqlens[b], layout gaps) hold a sentinel
//     before the call and keep it bit for bit, and NaN there in the inputs reaches nothing (SPEC 1); a -inf sink
//     gives the out of -1e30 bit for bit and the same gradients (SPEC 3); a NaN / +inf sink in head 0 changes
//     no bit of any other head (SPEC 3); deterministic calls are bitwise reproducible; dropout keep masks
//     match sinkattn_dropout_keep bit for bit; invalid calls are refused.
// The reference runs on worker threads (one per spare core) while the GPU goes on with the next configurations;
// results are printed in order. SUMMARY gives, per output, the worst err / tolerance of the CUDA pipeline.
// Plain C++ with its own checks (no GoogleTest needed). --cpu-only runs the CPU backend part (and every
// check that applies to it) on a machine without a GPU.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cuda_check.hpp"
#include "mini_json.hpp"
#include "reference.hpp"
#include "sinkattn/sinkattn.h"

namespace {

namespace ref = sinkattn::ref;
using Bytes = std::vector<unsigned char>;

std::atomic<int> g_checks{0};
bool g_verbose = false;
bool g_always_ref = false;  // --ref: judge by the float64 reference whatever the size
// --cpu-only: no GPU needed; runs the CPU backend part of every configuration (NaN-poisoned outputs, written
// checks, exact properties) and judges it by SPEC.md section 5 where the reference runs. Exercises the suite's
// own logic on a machine without a GPU.
bool g_cpu_only = false;
int g_sm = 0;  // the device's compute capability (major * 10 + minor); 0 with --cpu-only

// Value written before every call into the elements of an output buffer that are outside the call (SPEC 1:
// "no backend reads or writes them"); they must still hold it afterwards. Exact in fp16, bf16 and fp32.
constexpr float kSentinel = 7.0f;

// ---------------------------------------------------------------- tensors (host buffer + device mirror)
struct Buf {
  Bytes host;
  void* dev = nullptr;
  bool present = false;
  sinkattn_tensor_t t{};  // view with host data pointer
  size_t bytes = 0;
  // Element indices of the buffer outside the call: rows after cu_seqlens_q[b] / cu_seqlens_kv[b] of a varlen
  // call and gaps of padded layouts. Inputs hold NaN there; outputs hold kSentinel before every call.
  std::vector<size_t> outside;

  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  ~Buf() { free_dev(); }
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
    present = true;
    if (!g_cpu_only) CK(cudaMalloc(&dev, bytes));
  }
  void free_dev() {
    if (dev) cudaFree(dev);
    dev = nullptr;
  }
  size_t esize() const { return sinkattn_dtype_size(t.dtype); }
  size_t elems() const { return bytes / esize(); }
  // Element idx of `dst` (a byte image of this buffer) set to v in the buffer's dtype.
  void put(Bytes& dst, size_t idx, float v) const {
    switch (t.dtype) {
      case SINKATTN_F32: std::memcpy(dst.data() + idx * 4, &v, 4); break;
      case SINKATTN_BF16: { const uint16_t h = ref::double_to_bf16(v); std::memcpy(dst.data() + idx * 2, &h, 2); break; }
      case SINKATTN_F16: { const uint16_t h = ref::double_to_half(v); std::memcpy(dst.data() + idx * 2, &h, 2); break; }
      default: break;
    }
  }
  void set(size_t idx, float v) { put(host, idx, v); }
  void set_i32(size_t idx, int32_t v) { std::memcpy(host.data() + idx * 4, &v, 4); }
  void fill_host(const Bytes& src) { std::copy(src.begin(), src.end(), host.begin()); }
  void upload() {
    if (dev) CK(cudaMemcpy(dev, host.data(), bytes, cudaMemcpyHostToDevice));
  }
  void upload(const Bytes& src) { CK(cudaMemcpy(dev, src.data(), bytes, cudaMemcpyHostToDevice)); }
  void poison_dev() { CK(cudaMemset(dev, 0xFF, bytes)); }  // NaN in fp16, bf16 and fp32
  void download_to(Bytes& dst) const {
    dst.resize(bytes);
    CK(cudaMemcpy(dst.data(), dev, bytes, cudaMemcpyDeviceToHost));
  }
  sinkattn_tensor_t host_view() { sinkattn_tensor_t v = t; v.data = host.data(); return v; }
  sinkattn_tensor_t dev_view() const { sinkattn_tensor_t v = t; v.data = dev; return v; }
  // A view of a byte image of this buffer (read only by the callers).
  sinkattn_tensor_t view_of(const Bytes& data) const {
    sinkattn_tensor_t v = t;
    v.data = const_cast<unsigned char*>(data.data());
    return v;
  }
  // The image an output has before a call: NaN everywhere (0xFF bytes), kSentinel outside the call.
  Bytes poisoned() const {
    Bytes img(bytes, 0xFF);
    for (size_t e : outside) put(img, e, kSentinel);
    return img;
  }
  // `src` as the input of a call: NaN outside the call (values there must not reach any output).
  Bytes as_input(const Bytes& src) const {
    Bytes img = src;
    for (size_t e : outside) put(img, e, NAN);
    return img;
  }
};

ref::Array read_bytes(const Buf& b, const Bytes& data) { return ref::read_tensor(b.view_of(data)); }

// ---------------------------------------------------------------- configuration
struct Config {
  std::string name;
  sinkattn_dtype_t dtype = SINKATTN_BF16;
  int b = 1, s_q = 1, s_kv = 1, h_q = 1, h_kv = 1, d = 64, d_v = 64;
  int mode = 0;  // 0 dense, 1 dense with padding (seqlens_q/kv), 2 varlen
  std::vector<int> len_q, len_kv, used_kv;
  int tail_q = 0, tail_kv = 0;  // varlen: rows after cu_seqlens_q[b] / cu_seqlens_kv[b] in the packed tensors
  sinkattn_softmax_type_t st = SINKATTN_SOFTMAX_VANILLA;
  std::vector<float> sinks;  // may hold -inf (SPEC 3: "any finite value, or -inf")
  std::vector<float> isolate_head0;  // NaN / +inf: extra runs with sinks[0] set to each (SPEC 3, other heads unaffected)
  float scale = NAN;
  int64_t wl = -1, wr = -1;
  sinkattn_mask_alignment_t align = SINKATTN_ALIGN_BOTTOM_RIGHT;
  double p = 0;
  uint64_t seed = 0, offset = 0;
  std::string bias;  // "", "BHSS", "1HSS", "B1SS", "11SS"
  bool bias_f32 = true;     // JSON "bias_dtype": "f32" (default) or "lowp" (the dtype of q)
  bool bias_masked_nan = false;  // JSON "bias_masked": "nan": NaN at every bias element no call row may see
  float bias_const = NAN;
  bool q_zero = false;
  // fp32 with every logit shifted by a large constant (edge case no-finite-minus-inf-sentinel, shift -1e5): the
  // shifted logits carry fp32 rounding of ulp(1e5) / 2 ~ 4e-3 absolute, so no fp32 evaluation meets SPEC 5's
  // 1e-5 on `out`; like tests/test_edge_cases.cpp (no_finite_sentinel), `out` is held to 2e-2 of float64 there.
  bool fp32_shifted_logits = false;
  bool grad = true, d_lse = false, deterministic = false;
  int layout = 0;  // 0 BSHD / THD, 1 BHSD / HTD, 2 SBHD (padded head stride)
  bool poison = true;
  bool edge = false;  // an edge case: the CPU-fed CUDA backward is judged by the reference too
  // The project's case file, "kernels": {"forward": ..., "backward": ...}: parts of sinkattn_query_backend's
  // report that the call must show on an sm_90 device (the kernel the case exists to exercise; checked there so
  // that a dispatch change cannot move the case off that kernel unnoticed).
  std::vector<std::string> want_fwd_kernel, want_bwd_kernel;
  uint64_t data_seed = 1;

  std::string describe() const {
    std::ostringstream o;
    o << name << " [" << (dtype == SINKATTN_BF16 ? "bf16" : dtype == SINKATTN_F16 ? "fp16" : "fp32") << " b=" << b
      << " s_q=" << s_q << " s_kv=" << s_kv << " h=" << h_q << "/" << h_kv << " d=" << d << "/" << d_v
      << " mode=" << (mode == 0 ? "dense" : mode == 1 ? "padded" : "varlen") << (used_kv.empty() ? "" : "+seqused")
      << " st=" << st << " win=(" << wl << "," << wr << ") align=" << align << " p=" << p << " bias=" << bias
      << (bias.empty() ? "" : bias_f32 ? "/f32" : "/lowp") << (bias_masked_nan ? "+nan-masked" : "")
      << " grad=" << grad << " dlse=" << d_lse
      << " det=" << deterministic << " layout=" << layout << "]";
    if (!len_q.empty()) {  // per-sequence lengths (padded / varlen), to reproduce a failure
      o << " len_q=";
      for (size_t n = 0; n < len_q.size(); ++n) o << (n ? "," : "") << len_q[n];
      o << " len_kv=";
      for (size_t n = 0; n < len_kv.size(); ++n) o << (n ? "," : "") << len_kv[n];
    }
    if (tail_q || tail_kv) o << " tail_rows=" << tail_q << "/" << tail_kv;
    if (st == SINKATTN_SOFTMAX_LEARNABLE) {
      o << " sinks=";
      for (int h = 0; h < h_q; ++h) o << (h ? "," : "") << sinks[h % sinks.size()];
    }
    if (!isolate_head0.empty()) {
      o << " isolate_head0=";
      for (size_t x = 0; x < isolate_head0.size(); ++x) o << (x ? "," : "") << isolate_head0[x];
    }
    return o.str();
  }
};

// Row tensor [b, s, h, d] (dense) or [s, h, d] (varlen, s packed rows) in one of the layouts.
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

// Visits every logical index of t (row-major), with its element offset.
template <class F>
void for_each_element(const sinkattn_tensor_t& t, F&& f) {
  int64_t n = 1;
  for (int r = 0; r < t.rank; ++r) n *= t.shape[r];
  int64_t idx[SINKATTN_MAX_RANK] = {0, 0, 0, 0};
  for (int64_t lin = 0; lin < n; ++lin) {
    int64_t rest = lin, off = 0;
    for (int r = t.rank - 1; r >= 0; --r) {
      idx[r] = rest % t.shape[r];
      rest /= t.shape[r];
      off += idx[r] * t.strides[r];
    }
    f(idx, static_cast<size_t>(off), lin);
  }
}

// Fills buf.outside: the elements of the buffer that are not an element of the call. `row_dim` is the dimension
// that indexes packed rows and `used` how many of them belong to a sequence (-1: all).
void mark_outside(Buf& buf, int row_dim, int64_t used) {
  std::vector<char> owned(buf.elems(), 0);
  for_each_element(buf.t, [&](const int64_t* idx, size_t off, int64_t) {
    if (used < 0 || idx[row_dim] < used) owned[off] = 1;
  });
  buf.outside.clear();
  for (size_t e = 0; e < owned.size(); ++e)
    if (!owned[e]) buf.outside.push_back(e);
}

struct Problem {
  Config cfg;
  int64_t total_q = 0, total_kv = 0;  // varlen: rows that belong to a sequence (cu_seqlens[b])
  int64_t alloc_q = 0, alloc_kv = 0;  // varlen: rows of the packed tensors (with the rows after cu_seqlens[b])
  int64_t max_q = 0, max_kv = 0;
  std::vector<int> cu_q, cu_kv;
  Buf q, k, v, sinks, bias, cu_q_t, cu_kv_t, used_t, lq_t, lkv_t, d_out, d_lse, rng;
  Buf out, lse, dq, dk, dv, d_sinks, d_bias;  // outputs
  std::vector<Buf*> all() {
    return {&q, &k, &v, &sinks, &bias, &cu_q_t, &cu_kv_t, &used_t, &lq_t, &lkv_t, &d_out, &d_lse, &rng,
            &out, &lse, &dq, &dk, &dv, &d_sinks, &d_bias};
  }
  void free_dev() {
    for (Buf* b : all()) b->free_dev();
  }
  // Keys of sequence n the call uses (seqused_kv limits them), and its query rows.
  int keys(int n) const { return cfg.used_kv.empty() ? cfg.len_kv[n] : std::min(cfg.used_kv[n], cfg.len_kv[n]); }
  int rows(int n) const { return cfg.len_q[n]; }
};

void fill_random(Buf& b, std::mt19937_64& rng, float scale = 1.f) {
  std::normal_distribution<float> nd(0.f, scale);
  const size_t n = b.elems();
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
  if (!varlen) c.tail_q = c.tail_kv = 0;
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
    P.alloc_q = P.total_q + c.tail_q;
    P.alloc_kv = P.total_kv + c.tail_kv;
    // max_seqlen is an upper bound: sometimes give a looser one.
    if (c.data_seed % 3 == 0) {
      P.max_q += 5;
      P.max_kv += 3;
    }
    c.s_q = static_cast<int>(P.max_q);
    c.s_kv = static_cast<int>(P.max_kv);
  }
  const int64_t rows_q = varlen ? P.alloc_q : c.s_q, rows_kv = varlen ? P.alloc_kv : c.s_kv;
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
    P.lse.alloc(SINKATTN_F32, {c.h_q, P.alloc_q}, {P.alloc_q, 1}, c.h_q * P.alloc_q);
    P.d_lse.alloc(SINKATTN_F32, {c.h_q, P.alloc_q}, {P.alloc_q, 1}, c.h_q * P.alloc_q);
  } else {
    P.lse.alloc(SINKATTN_F32, {c.b, c.h_q, c.s_q}, {c.h_q * c.s_q, c.s_q, 1}, c.b * c.h_q * c.s_q);
    P.d_lse.alloc(SINKATTN_F32, {c.b, c.h_q, c.s_q}, {c.h_q * c.s_q, c.s_q, 1}, c.b * c.h_q * c.s_q);
  }
  fill_random(P.d_lse, rng);
  // Elements outside the call (SPEC 1): rows after cu_seqlens[b], gaps of the padded layout. NaN in the inputs.
  if (varlen || c.layout == 2) {
    const int64_t uq = varlen ? P.total_q : -1, ukv = varlen ? P.total_kv : -1;
    for (Buf* b : {&P.q, &P.d_out, &P.out, &P.dq}) mark_outside(*b, 0, uq);
    for (Buf* b : {&P.k, &P.v, &P.dk, &P.dv}) mark_outside(*b, 0, ukv);
    if (varlen) {
      mark_outside(P.lse, 1, uq);
      mark_outside(P.d_lse, 1, uq);
    }
    for (Buf* b : {&P.q, &P.k, &P.v, &P.d_out, &P.d_lse})
      for (size_t e : b->outside) b->set(e, NAN);
  }
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
      std::uniform_int_distribution<size_t> pick(0, P.bias.elems() - 1);
      for (int r = 0; r < 8; ++r) P.bias.set(pick(rng), -INFINITY);
    } else {
      for (size_t e = 0; e < P.bias.elems(); ++e) P.bias.set(e, c.bias_const);
    }
    if (c.bias_masked_nan) {
      // NaN wherever no (sequence, row) that reads the element sees its key (SPEC 2's mask, padding rows and keys
      // included): kernels that stage whole bias tiles read such elements and must not let them in (0 * NaN, a
      // NaN max). Dense calls only (bias is not defined for varlen).
      const bool br = c.align == SINKATTN_ALIGN_BOTTOM_RIGHT;
      for (int64_t nb = 0; nb < bb; ++nb)
        for (int64_t i = 0; i < S; ++i)
          for (int64_t j = 0; j < K; ++j) {
            bool seen = false;
            for (int n = 0; n < c.b && !seen; ++n) {
              if (bb > 1 && n != nb) continue;
              if (i >= P.rows(n)) continue;
              const ref::KeyRange kr = ref::visible_keys(i, P.rows(n), P.keys(n), c.wl, c.wr, br);
              seen = j >= kr.lo && j < kr.hi;
            }
            if (!seen)
              for (int64_t hh = 0; hh < hb; ++hh) P.bias.set(((nb * hb + hh) * S + i) * K + j, NAN);
          }
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
    if (b->present) b->upload();
}

// Fills a params struct; `dev` selects device pointers.
sinkattn_params_t make_params(Problem& P, bool dev, bool backward) {
  const Config& c = P.cfg;
  sinkattn_params_t p;
  sinkattn_params_init(&p);
  auto view = [&](Buf& b) { return b.present ? (dev ? b.dev_view() : b.host_view()) : sinkattn_tensor_t{}; };
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
bool has_nan(const ref::Array& a) {
  for (double x : a.data)
    if (std::isnan(x)) return true;
  return false;
}

double max_abs(const ref::Array& a) {  // over finite values
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

// One backend's results against another's (CUDA against the CPU backend on the same inputs; a run against its
// twin), the verdict only where the float64 reference does not judge:
//   max|a - c| <= tol * max(max|c|, floor) + 2 * ulp(dtype at max|c|)
// (floor: a natural magnitude of the output, so that values that are 0 by cancellation or fp16 subnormals do
// not turn rounding noise into a failure). Infinities must agree exactly; NaN on either side fails.
struct Cmp {
  std::string msg;
  bool pass = false;
};
Cmp compare_cpu(const std::string& name, const ref::Array& a, const ref::Array& c, sinkattn_dtype_t dt, double tol,
                double floor, const char* other = "cpu") {
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
  char buf[320];
  if (bad)
    std::snprintf(buf, sizeof buf, "%s vs %s: NaN, or infinities that differ%s", name.c_str(), other,
                  has_nan(c) ? " [the other side has NaN]" : "");
  else
    std::snprintf(buf, sizeof buf, "%s vs %s: max abs diff %.3g > allowed %.3g (tol %.3g x scale %.3g + 2 ulp)",
                  name.c_str(), other, num, allowed, tol, scale);
  r.msg = buf;
  return r;
}

// Zero LSE entries of dense padding rows (unspecified by SPEC 2).
void mask_lse(ref::Array& a, const Config& c) {
  if (c.mode != 1 || a.data.empty()) return;
  for (int n = 0; n < c.b; ++n)
    for (int h = 0; h < c.h_q; ++h)
      for (int i = c.len_q[n]; i < c.s_q; ++i) a.data[(static_cast<size_t>(n) * c.h_q + h) * c.s_q + i] = 0;
}

struct Ctx {
  std::vector<std::string> errors;
  std::vector<std::string> notes;  // printed with a failure (and with -v): CUDA-vs-CPU when the reference judged
  std::map<std::string, double> worst;  // output -> worst err / tolerance of the judged pipeline in this config
  bool judged_by_reference = false;
  double reference_ms = 0, work = 0;  // time the reference took, its work estimate (reference_work)
  void fail(const std::string& s) { errors.push_back(s); }
  void check(bool ok, const std::string& s) {
    ++g_checks;
    if (!ok) fail(s);
  }
  void ratio(const std::string& name, double r) {
    double& w = worst[name];
    w = std::max(w, std::isnan(r) ? INFINITY : r);
  }
};

sinkattn::ref::Array read_dev(const Buf& b, Bytes& store) {
  b.download_to(store);
  return read_bytes(b, store);
}

const ref::Array* field_of(const ref::Result& r, const std::string& name) {
  return name == "out" ? &r.out : name == "softmax_lse" ? &r.softmax_lse : name == "dq" ? &r.dq : name == "dk" ? &r.dk
         : name == "dv" ? &r.dv : name == "d_sinks" ? &r.d_sinks : name == "d_bias" ? &r.d_bias : nullptr;
}

// SPEC.md section 5 verdict for one backend's results: the error table (fp32: 1e-5 out / lse, 1e-4 gradients, or
// 2x the plain fp32 evaluation's error where larger; fp16 / bf16: 2x plain low precision + 1e-3; the plain
// evaluation with D from its own out, never from the judged backend's: ref::references). dq, dk, d_bias that are 0 by cancellation (dS = 0 in exact
// arithmetic, e.g. single-key vanilla rows; the float64 reference then holds 0, or rounding noise of the stored
// `out` that D reads when dropout rescales it) make err = max|x - ref| / max|ref| ill-conditioned, for fp16 /
// bf16 too: the plain low-precision implementation computes dP and D in fp32 from the same products and cancels
// exactly as well, so its error gives no slack. When max|ref| <= 1e-5 * max|dv| they are bounded absolutely
// instead, max|x - ref| <= 1e-5 * max|dv| (as SingleKey.VanillaGradientsCancel in tests/test_attention.cpp).
// `record`: the err / tolerance ratios go into ctx.worst (the run's drift report).
void judge_spec5(Ctx& ctx, const std::string& who, const ref::Result& act, const ref::References& refs,
                 const Config& c, bool record) {
  const ref::Result& r64 = refs.ref64;
  const sinkattn_dtype_t dtype = c.dtype;
  char buf[400];
  const double dv_scale = max_abs(r64.dv);
  for (const auto& row : ref::error_table(act, refs, dtype)) {
    const ref::Array* ra = row.name == "dq" ? &r64.dq : row.name == "dk" ? &r64.dk
                           : row.name == "d_bias" ? &r64.d_bias : nullptr;
    const ref::Array* aa = row.name == "dq" ? &act.dq : row.name == "dk" ? &act.dk
                           : row.name == "d_bias" ? &act.d_bias : nullptr;
    if (ra && !ra->data.empty() && max_abs(*ra) <= 1e-5 * dv_scale) {
      // row.err * max(max|ref|, 1e-6) is max|x - ref| (inf on NaN); relative_error's own definition, undone.
      const double m = has_nan(*aa) ? INFINITY : row.err * std::max(max_abs(*ra), 1e-6);
      const double bound = 1e-5 * dv_scale;
      std::snprintf(buf, sizeof buf,
                    "%s SPEC 5 %s (0 by cancellation: max|fp64| %.3g): max|x - fp64| %.3g > 1e-5 * max|dv| = %.3g",
                    who.c_str(), row.name.c_str(), max_abs(*ra), m, bound);
      ctx.check(m <= bound, buf);
      if (record) ctx.ratio(row.name, bound > 0 ? m / bound : (m > 0 ? INFINITY : 0));
      continue;
    }
    if (dtype == SINKATTN_F32 && c.fp32_shifted_logits && row.name == "out") {
      std::snprintf(buf, sizeof buf, "%s out (fp32, logits shifted by a large constant): err %.3g vs fp64 > 2e-2",
                    who.c_str(), row.err);
      ctx.check(row.err <= 2e-2, buf);
      if (record) ctx.ratio(row.name, row.err / 2e-2);
      continue;
    }
    const ref::Array* rr = field_of(r64, row.name);
    const ref::Array* xx = field_of(act, row.name);
    std::snprintf(buf, sizeof buf,
                  "%s SPEC 5 %s: err %.3g vs fp64 > tol %.3g (plain evaluation %.3g; max|fp64| %.3g, max|x| %.3g, "
                  "max|dv| %.3g)",
                  who.c_str(), row.name.c_str(), row.err, row.tolerance, row.lowp_err, rr ? max_abs(*rr) : NAN,
                  xx ? max_abs(*xx) : NAN, dv_scale);
    ctx.check(row.pass, buf);
    if (record) ctx.ratio(row.name, row.err / row.tolerance);
    if (!row.pass && g_verbose && rr && xx && rr->data.size() == xx->data.size()) {
      // Where the error is: the worst element's coordinates (row-major over the reference's shape) and values.
      // A NaN reference marks an element no sequence owns (reference.hpp): not compared, so not the worst.
      size_t worst = 0;
      double wd = -1;
      for (size_t i = 0; i < rr->data.size(); ++i) {
        if (std::isnan(rr->data[i])) continue;
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
      std::snprintf(buf, sizeof buf, "  worst %s element [%s]: %s %.6g, fp64 %.6g", row.name.c_str(), coord.c_str(),
                    who.c_str(), xx->data[worst], rr->data[worst]);
      ctx.notes.push_back(buf);
    }
  }
}

// The float64 reference and the plain low-precision evaluation of the call (SPEC 5), gradients with D_i from
// `given_out` (the out the judged backward was fed), with the suite's conventions applied.
ref::References reference_results(Problem& P, bool grad, const Bytes& given_out) {
  const Config& c = P.cfg;
  sinkattn_params_t rp = make_params(P, false, grad);
  rp.out = P.out.view_of(given_out);
  const ref::DFrom d_from = grad ? ref::DFrom::kGivenOut : ref::DFrom::kOwnOut;
  // The plain implementation of the dtype (fp32: the formulas in fp32) reads D from its own rounded out, as SPEC 5
  // defines it (ref::references); its error sets the budget of fp16 / bf16 and, where it exceeds the fixed bounds,
  // of fp32.
  ref::References refs = ref::references(rp, grad, d_from);
  mask_lse(refs.ref64.softmax_lse, c);
  mask_lse(refs.lowp.softmax_lse, c);
  if (c.mode == 1) {  // padding rows: out = 0 in every result; the reference may leave them undefined
    for (auto* arr : {&refs.ref64.out, &refs.lowp.out})
      for (int n = 0; n < c.b; ++n)
        for (int i = c.len_q[n]; i < c.s_q; ++i)
          for (int h = 0; h < c.h_q; ++h)
            for (int x = 0; x < c.d_v; ++x)
              if (!arr->data.empty()) arr->data[((static_cast<size_t>(n) * c.s_q + i) * c.h_q + h) * c.d_v + x] = 0;
  }
  return refs;
}

// ---------------------------------------------------------------- running one backend
enum class Dev { kCpu, kCuda };

// Output bytes of one forward (out, lse, rng) or backward (dq, dk, dv, ds, db) call.
struct Outs {
  Bytes out, lse, rng, dq, dk, dv, ds, db;
};

// Workspace of `bytes` bytes (NaN-filled) on the device or the host, for one call.
struct Scratch {
  Dev dev;
  Bytes host;
  void* d = nullptr;
  Scratch(Dev where, size_t bytes) : dev(where) {
    if (dev == Dev::kCpu) {
      host.assign(std::max<size_t>(bytes, 1), 0xFF);
    } else if (bytes) {
      CK(cudaMalloc(&d, bytes));
      CK(cudaMemset(d, 0xFF, bytes));
    }
  }
  ~Scratch() {
    if (d) cudaFree(d);
  }
  void* ptr() { return dev == Dev::kCpu ? static_cast<void*>(host.data()) : d; }
};

// Puts `img` into the buffer the call on `dev` reads / writes.
void stage(Buf& b, Dev dev, const Bytes& img) {
  if (dev == Dev::kCpu) b.fill_host(img);
  else b.upload(img);
}
void fetch(const Buf& b, Dev dev, Bytes& dst) {
  if (dev == Dev::kCpu) dst = b.host;
  else b.download_to(dst);
}

// Whether a call on `dev` succeeded (status, and on the device the synchronisation after it); records a failure.
bool call_ok(Ctx& ctx, Dev dev, sinkattn_status_t st, const std::string& what) {
  const std::string msg = st != SINKATTN_OK ? sinkattn_last_error() : "";
  const cudaError_t ce = dev == Dev::kCuda ? cudaDeviceSynchronize() : cudaSuccess;
  if (st == SINKATTN_OK && ce == cudaSuccess) return true;
  ctx.fail(what + " failed: " + msg + (ce != cudaSuccess ? std::string(" / ") + cudaGetErrorString(ce) : ""));
  return false;
}

// sinkattn_forward on `dev` with every output NaN-poisoned (kSentinel outside the call) and a NaN workspace.
bool run_forward(Problem& P, Dev dev, Outs& o, Ctx& ctx, const std::string& who) {
  sinkattn_params_t p = make_params(P, dev == Dev::kCuda, false);
  stage(P.out, dev, P.out.poisoned());
  stage(P.lse, dev, P.lse.poisoned());
  stage(P.rng, dev, Bytes(P.rng.bytes, 0xFF));
  size_t ws = 0;
  if (sinkattn_forward_workspace_size(&p, &ws) != SINKATTN_OK) {
    ctx.fail(who + " forward workspace query: " + sinkattn_last_error());
    return false;
  }
  Scratch scratch(dev, ws);
  p.workspace = scratch.ptr();
  p.workspace_bytes = ws;
  if (!call_ok(ctx, dev, sinkattn_forward(&p), who + " forward")) return false;
  fetch(P.out, dev, o.out);
  fetch(P.lse, dev, o.lse);
  fetch(P.rng, dev, o.rng);
  return true;
}

// sinkattn_backward on `dev` fed by the forward outputs `fwd` (out, softmax_lse, rng_state; NaN put outside the
// call), every output NaN-poisoned (kSentinel outside the call), a NaN workspace. `reps` > 1: the outputs must be
// bitwise identical across the repeats (deterministic). `small_ws`: a workspace one byte short is refused.
bool run_backward(Problem& P, Dev dev, const Outs& fwd, Outs& o, Ctx& ctx, const std::string& who, int reps,
                  bool small_ws) {
  stage(P.out, dev, P.out.as_input(fwd.out));
  stage(P.lse, dev, P.lse.as_input(fwd.lse));
  stage(P.rng, dev, fwd.rng);
  sinkattn_params_t p = make_params(P, dev == Dev::kCuda, true);
  size_t ws = 0;
  if (sinkattn_backward_workspace_size(&p, &ws) != SINKATTN_OK) {
    ctx.fail(who + " backward workspace query: " + sinkattn_last_error());
    return false;
  }
  Scratch scratch(dev, ws);
  if (small_ws && ws > 0) {  // workspace one byte too small: refused with an error, not a crash
    p.workspace = scratch.ptr();
    p.workspace_bytes = ws - 1;
    ctx.check(sinkattn_backward(&p) == SINKATTN_ERR_WORKSPACE_TOO_SMALL, who + ": too-small workspace not refused");
  }
  Buf* outs[] = {&P.dq, &P.dk, &P.dv, &P.d_sinks, &P.d_bias};
  Bytes* dst[] = {&o.dq, &o.dk, &o.dv, &o.ds, &o.db};
  std::vector<Bytes> first;
  for (int rep = 0; rep < reps; ++rep) {
    if (dev == Dev::kCpu) std::fill(scratch.host.begin(), scratch.host.end(), 0xFF);
    else if (ws) CK(cudaMemset(scratch.d, 0xFF, ws));
    for (Buf* b : outs)
      if (b->present) stage(*b, dev, b->poisoned());
    p.workspace = scratch.ptr();
    p.workspace_bytes = ws;
    if (!call_ok(ctx, dev, sinkattn_backward(&p), who + " backward")) return false;
    for (int x = 0; x < 5; ++x) {
      dst[x]->clear();
      if (outs[x]->present) fetch(*outs[x], dev, *dst[x]);
    }
    if (rep == 0) {
      for (int x = 0; x < 5; ++x) first.push_back(*dst[x]);
    } else {
      bool same = true;
      for (int x = 0; x < 5; ++x) same = same && first[x] == *dst[x];
      ctx.check(same, who + ": backward not bitwise reproducible with deterministic = 1");
    }
  }
  return true;
}

// The results of a forward (and backward) as float64 arrays of their logical shapes.
ref::Result results(const Problem& P, const Outs& f, const Outs* b) {
  ref::Result r;
  r.out = read_bytes(P.out, f.out);
  r.softmax_lse = read_bytes(P.lse, f.lse);
  mask_lse(r.softmax_lse, P.cfg);
  if (b) {
    r.dq = read_bytes(P.dq, b->dq);
    r.dk = read_bytes(P.dk, b->dk);
    r.dv = read_bytes(P.dv, b->dv);
    if (P.d_sinks.present) r.d_sinks = read_bytes(P.d_sinks, b->ds);
    if (P.d_bias.present) r.d_bias = read_bytes(P.d_bias, b->db);
  }
  return r;
}

// ---------------------------------------------------------------- exact properties of one run
// Elements outside the call (varlen rows after cu_seqlens[b], layout gaps) still hold kSentinel, bit for bit.
void check_outside(Ctx& ctx, const std::string& who, const char* name, const Buf& b, const Bytes& data) {
  if (b.outside.empty()) return;
  Bytes want(b.esize());
  b.put(want, 0, kSentinel);
  size_t changed = 0, first = 0;
  for (size_t e : b.outside)
    if (std::memcmp(data.data() + e * b.esize(), want.data(), b.esize()) != 0 && changed++ == 0) first = e;
  char buf[300];
  std::snprintf(buf, sizeof buf,
                "%s %s: %zu of %zu elements outside the call (rows after cu_seqlens[b] / layout gaps) written "
                "(first: element %zu); SPEC 1: no backend writes them",
                who.c_str(), name, changed, b.outside.size(), first);
  ctx.check(changed == 0, buf);
}

// Every element SPEC.md defines must have been written (outputs are NaN-poisoned before each call): every
// element of out, dq, dk, dv (padding rows / invisible keys are 0), d_sinks, d_bias, and softmax_lse (padding
// rows: "finite or -inf, never NaN", SPEC 2). Elements outside the call hold kSentinel (checked apart).
void check_written(Ctx& ctx, const std::string& who, const char* name, const ref::Array& a) {
  ctx.check(!has_nan(a), who + " " + name + ": NaN left in an element SPEC.md defines (not written?)");
}

// LSE of a row that sees no key (SPEC 2): sigma (learnable; -inf for a -inf sink), 0 (off_by_one), -inf (vanilla).
double keyless_lse(const Config& c, int h) {
  if (c.st == SINKATTN_SOFTMAX_LEARNABLE) return static_cast<double>(c.sinks[h % c.sinks.size()]);
  if (c.st == SINKATTN_SOFTMAX_OFF_BY_ONE) return 0.0;
  return -INFINITY;
}

// Row index helpers on the logical (float64) arrays of the suite's tensors.
size_t row_index(const Problem& P, int n, int i) {
  return P.cfg.mode == 2 ? static_cast<size_t>(P.cu_q[n] + i) : static_cast<size_t>(n) * P.cfg.s_q + i;
}
size_t lse_index(const Problem& P, int n, int h, int i) {
  return P.cfg.mode == 2 ? static_cast<size_t>(h) * P.alloc_q + P.cu_q[n] + i
                         : (static_cast<size_t>(n) * P.cfg.h_q + h) * P.cfg.s_q + i;
}

// Exact properties of one forward (and backward) run, SPEC 1-3:
//   - rows that see no key (by the mask and the sequence lengths): out = 0 and LSE exactly sigma / 0 / -inf;
//     backward dq = 0;
//   - padding rows of a dense batch: out = 0; backward dq = 0;
//   - every element SPEC.md defines written; elements outside the call untouched.
// `forward` = false: the forward outputs `f` only fed the backward `b` and are checked elsewhere.
void check_run(Ctx& ctx, const Problem& P, const std::string& who, const Outs& f, const Outs* b,
               bool forward = true) {
  const Config& c = P.cfg;
  const ref::Result r = results(P, f, b);
  if (forward) {
    check_written(ctx, who, "out", r.out);
    check_written(ctx, who, "softmax_lse", r.softmax_lse);
    check_outside(ctx, who, "out", P.out, f.out);
    check_outside(ctx, who, "softmax_lse", P.lse, f.lse);
  }
  if (b) {
    check_written(ctx, who, "dq", r.dq);
    check_written(ctx, who, "dk", r.dk);
    check_written(ctx, who, "dv", r.dv);
    if (P.d_sinks.present) check_written(ctx, who, "d_sinks", r.d_sinks);
    if (P.d_bias.present) check_written(ctx, who, "d_bias", r.d_bias);
    check_outside(ctx, who, "dq", P.dq, b->dq);
    check_outside(ctx, who, "dk", P.dk, b->dk);
    check_outside(ctx, who, "dv", P.dv, b->dv);
  }
  auto row_zero = [&](const ref::Array& a, size_t row, int h, int width) {
    for (int x = 0; x < width; ++x)
      if (a.data[(row * c.h_q + h) * width + x] != 0.0) return false;
    return true;
  };
  int64_t keyless_rows = 0, bad_lse = 0, bad_out = 0, bad_dq = 0, bad_pad_out = 0, bad_pad_dq = 0;
  std::string first_lse;
  for (int n = 0; n < c.b; ++n) {
    const int lq = P.rows(n), lk = P.keys(n);
    for (int i = 0; i < (c.mode == 1 ? c.s_q : lq); ++i) {
      const size_t row = row_index(P, n, i);
      if (i >= lq) {  // padding row of a dense batch
        for (int h = 0; h < c.h_q; ++h) {
          if (forward) bad_pad_out += !row_zero(r.out, row, h, c.d_v);
          if (b) bad_pad_dq += !row_zero(r.dq, row, h, c.d);
        }
        continue;
      }
      if (!ref::visible_keys(i, lq, lk, c.wl, c.wr, c.align == SINKATTN_ALIGN_BOTTOM_RIGHT).empty()) continue;
      for (int h = 0; h < c.h_q; ++h) {
        ++keyless_rows;
        const double got = r.softmax_lse.data[lse_index(P, n, h, i)], want = keyless_lse(c, h);
        if (forward && !(got == want) && bad_lse++ == 0) {
          char buf[160];
          std::snprintf(buf, sizeof buf, "(n %d, h %d, i %d): %.9g, want %.9g", n, h, i, got, want);
          first_lse = buf;
        }
        if (forward) bad_out += !row_zero(r.out, row, h, c.d_v);
        if (b) bad_dq += !row_zero(r.dq, row, h, c.d);
      }
    }
  }
  char buf[400];
  std::snprintf(buf, sizeof buf,
                "%s softmax_lse of rows that see no key: %lld of %lld (row, head) not exactly sigma / 0 / -inf "
                "(SPEC 2), first %s",
                who.c_str(), static_cast<long long>(bad_lse), static_cast<long long>(keyless_rows), first_lse.c_str());
  ctx.check(bad_lse == 0, buf);
  std::snprintf(buf, sizeof buf, "%s out of rows that see no key: %lld (row, head) not exactly 0", who.c_str(),
                static_cast<long long>(bad_out));
  ctx.check(bad_out == 0, buf);
  std::snprintf(buf, sizeof buf, "%s dq of rows that see no key: %lld (row, head) not exactly 0", who.c_str(),
                static_cast<long long>(bad_dq));
  ctx.check(bad_dq == 0, buf);
  std::snprintf(buf, sizeof buf, "%s padding rows: out not exactly 0 in %lld (row, head), dq in %lld", who.c_str(),
                static_cast<long long>(bad_pad_out), static_cast<long long>(bad_pad_dq));
  ctx.check(bad_pad_out == 0 && bad_pad_dq == 0, buf);
}

// ---------------------------------------------------------------- comparisons between runs
// CUDA against the CPU backend on the same inputs. Both are held to SPEC 5, so they may differ by twice its
// budget: fp32 2e-5 (out, lse), 2e-4 (gradients); low precision 2e-2 (1e-3 for the fp32 LSE).
void compare_forward(std::vector<Cmp>& v, const ref::Result& a, const ref::Result& c, const Config& cfg) {
  const bool f32 = cfg.dtype == SINKATTN_F32;
  v.push_back(compare_cpu("out", a.out, c.out, cfg.dtype, f32 ? 2e-5 : 2e-2, 1e-6));
  v.push_back(compare_cpu("softmax_lse", a.softmax_lse, c.softmax_lse, SINKATTN_F32, f32 ? 2e-5 : 1e-3, 1e-6));
}
void compare_backward(std::vector<Cmp>& v, const std::string& what, const ref::Result& a, const ref::Result& c,
                      const Config& cfg, const char* other = "cpu") {
  const bool f32 = cfg.dtype == SINKATTN_F32;
  const double tol = f32 ? 2e-4 : 2e-2;
  // dq, dk, d_bias are 0 by cancellation in single-key vanilla rows (dS = 0): their natural magnitude is
  // 1e-3 x max|dv|. d_bias rounds to the dtype of bias.
  const double g_floor = 1e-3 * max_abs(c.dv);
  const sinkattn_dtype_t bias_dt = cfg.bias_f32 ? SINKATTN_F32 : cfg.dtype;
  v.push_back(compare_cpu("dq" + what, a.dq, c.dq, cfg.dtype, tol, g_floor, other));
  v.push_back(compare_cpu("dk" + what, a.dk, c.dk, cfg.dtype, tol, g_floor, other));
  v.push_back(compare_cpu("dv" + what, a.dv, c.dv, cfg.dtype, tol, 1e-6, other));
  if (!c.d_sinks.empty()) v.push_back(compare_cpu("d_sinks" + what, a.d_sinks, c.d_sinks, SINKATTN_F32, tol, 1e-6, other));
  if (!c.d_bias.empty()) v.push_back(compare_cpu("d_bias" + what, a.d_bias, c.d_bias, bias_dt, tol, g_floor, other));
}
bool all_pass(const std::vector<Cmp>& v) {
  for (const Cmp& x : v)
    if (!x.pass) return false;
  return true;
}

// Runs the forward and the backward fed by it (the pipeline) on `dev`.
bool run_pipeline(Problem& P, Dev dev, Outs& f, Outs& b, Ctx& ctx, const std::string& who) {
  if (!run_forward(P, dev, f, ctx, who)) return false;
  return !P.cfg.grad || run_backward(P, dev, f, b, ctx, who, 1, false);
}

// SPEC 3, "Sink values": a -inf sink is the limit of a finite one. The call with every -inf sink replaced by
// -1e30 gives the same out bit for bit, the same LSE except on rows that see no key (-inf there, exactly -1e30
// in the twin), the same dq, dk, dv, d_bias (bit for bit where the call is reproducible) and d_sinks (fp32
// rounding: a -inf head's d_sinks is the sum of d_lse over its rows that see no key).
void minus_inf_twin(Ctx& ctx, Problem& P, Dev dev, const Outs& f, const Outs* b, const std::string& who) {
  Config& c = P.cfg;
  if (c.st != SINKATTN_SOFTMAX_LEARNABLE) return;
  const std::vector<float> saved = c.sinks;
  bool any = false;
  for (float& s : c.sinks)
    if (s == -INFINITY) {
      s = -1e30f;
      any = true;
    }
  if (!any) return;
  const Bytes saved_host = P.sinks.host;
  for (int h = 0; h < c.h_q; ++h) P.sinks.set(h, c.sinks[h % c.sinks.size()]);
  P.sinks.upload();
  const std::string tw = who + " (-inf sinks as -1e30)";
  Outs tf, tb;
  const bool ok = run_pipeline(P, dev, tf, tb, ctx, tw);
  if (ok) check_run(ctx, P, tw, tf, b ? &tb : nullptr);  // rows that see no key: LSE exactly -1e30 there
  c.sinks = saved;
  P.sinks.fill_host(saved_host);
  P.sinks.upload();
  if (!ok) return;
  ctx.check(tf.out == f.out, who + ": out with a -inf sink differs from out with -1e30 (SPEC 3: bit for bit)");
  // (padding rows of a dense batch: LSE unspecified, masked by results())
  const ref::Array l0 = results(P, f, nullptr).softmax_lse, l1 = results(P, tf, nullptr).softmax_lse;
  int64_t bad = 0;
  for (size_t x = 0; x < l0.data.size(); ++x) {
    if (l0.data[x] == -INFINITY) bad += l1.data[x] != static_cast<double>(-1e30f);
    else bad += !(std::fabs(l1.data[x] - l0.data[x]) <= 1e-6 * std::max(1.0, std::fabs(l0.data[x])));
  }
  ctx.check(bad == 0, who + ": softmax_lse with -inf sinks and with -1e30 differ in " + std::to_string(bad) +
                          " elements (rows that see no key: -inf against exactly -1e30; others within 1e-6)");
  if (!b) return;
  const bool exact = dev == Dev::kCpu || c.deterministic;
  const ref::Result r0 = results(P, f, b), r1 = results(P, tf, &tb);
  if (exact) {
    ctx.check(tb.dq == b->dq && tb.dk == b->dk && tb.dv == b->dv && tb.db == b->db,
              who + ": dq, dk, dv or d_bias differ between -inf and -1e30 sinks (deterministic: bit for bit)");
  } else {
    std::vector<Cmp> v;
    compare_backward(v, " (-1e30 twin)", r1, r0, c, "the -inf run");
    for (const Cmp& x : v)
      if (x.msg.rfind("d_sinks", 0) != 0) ctx.check(x.pass, who + ": " + x.msg);
  }
  const double scale = std::max(1.0, max_abs(r0.d_sinks));
  double diff = 0;
  for (size_t h = 0; h < r0.d_sinks.data.size(); ++h) {
    const double dd = std::fabs(r1.d_sinks.data[h] - r0.d_sinks.data[h]);
    diff = std::isnan(dd) ? INFINITY : std::max(diff, dd);
  }
  char buf[240];
  std::snprintf(buf, sizeof buf, "%s: d_sinks with -inf sinks and with -1e30 differ by %.3g > 1e-5 * %.3g", who.c_str(),
                diff, scale);
  ctx.check(diff <= 1e-5 * scale, buf);
}

// Elements of `a` (a run with a NaN / +inf sink in head 0) against `base` (the run with a finite one), except
// those of head `skip_head` along logical dimension `head_dim`: bit for bit where the base run is reproducible
// (`exact`), otherwise finite where base is and within `tol` of max|base|.
void compare_other_heads(Ctx& ctx, const std::string& who, const char* name, const Buf& buf, const Bytes& a,
                         const Bytes& base, bool exact, int head_dim, int skip_head, double tol) {
  const ref::Array A = read_bytes(buf, a), B = read_bytes(buf, base);
  const double scale = std::max(max_abs(B), 1e-6);
  int64_t bad = 0, compared = 0;
  for_each_element(buf.t, [&](const int64_t* idx, size_t, int64_t lin) {
    if (idx[head_dim] == skip_head) return;
    ++compared;
    const double x = A.data[lin], y = B.data[lin];
    if (exact) bad += std::isnan(x) || std::memcmp(&x, &y, sizeof x) != 0;
    else bad += std::isnan(x) || std::isfinite(x) != std::isfinite(y) || (std::isfinite(x) && std::fabs(x - y) > tol * scale);
  });
  ctx.check(bad == 0, who + " " + name + ": " + std::to_string(bad) + " of " + std::to_string(compared) +
                          " elements of the other heads changed (" + (exact ? "bit for bit" : "beyond run-to-run noise") +
                          "; SPEC 3: a NaN / +inf sink leaves the other heads unaffected)");
}

// SPEC 3: a +inf or NaN sink in head 0 leaves head 0's outputs unspecified; the call does not fail or crash and
// every output of every other head is bit for bit that of the call with a finite sink (dk, dv: every KV head but
// head 0's; d_bias when it has a head dimension). Where the base call is not reproducible (atomics of a
// non-deterministic backward), a rerun tells which outputs are; the others are held to run-to-run noise.
void sink_isolation(Ctx& ctx, Problem& P, Dev dev, const Outs& f, const Outs* b, const std::string& who) {
  const Config& c = P.cfg;
  if (c.st != SINKATTN_SOFTMAX_LEARNABLE || c.isolate_head0.empty() || c.h_q < 2) return;
  Outs rf = f, rb;
  if (b) rb = *b;
  if (dev == Dev::kCuda && !c.deterministic) {
    if (!run_forward(P, dev, rf, ctx, who + " (rerun)")) return;
    if (b && !run_backward(P, dev, f, rb, ctx, who + " (rerun)", 1, false)) return;
  }
  const bool vl = c.mode == 2;
  const double tol = c.dtype == SINKATTN_F32 ? 1e-4 : 1e-2;
  for (float v : c.isolate_head0) {
    const std::string iw = who + " (sinks[0] = " + std::to_string(v) + ")";
    const Bytes saved = P.sinks.host;
    P.sinks.set(0, v);
    P.sinks.upload();
    Outs xf, xb;
    const bool ok = run_pipeline(P, dev, xf, xb, ctx, iw);
    P.sinks.fill_host(saved);
    P.sinks.upload();
    if (!ok) continue;
    check_outside(ctx, iw, "out", P.out, xf.out);
    check_outside(ctx, iw, "softmax_lse", P.lse, xf.lse);
    compare_other_heads(ctx, iw, "out", P.out, xf.out, f.out, rf.out == f.out, vl ? 1 : 2, 0, tol);
    compare_other_heads(ctx, iw, "softmax_lse", P.lse, xf.lse, f.lse, rf.lse == f.lse, vl ? 0 : 1, 0, tol);
    if (!b) continue;
    check_outside(ctx, iw, "dq", P.dq, xb.dq);
    check_outside(ctx, iw, "dk", P.dk, xb.dk);
    check_outside(ctx, iw, "dv", P.dv, xb.dv);
    compare_other_heads(ctx, iw, "dq", P.dq, xb.dq, b->dq, rb.dq == b->dq, vl ? 1 : 2, 0, tol);
    // Query head 0 reads KV head 0 (SPEC 1): its dk, dv may change; the other KV heads' may not.
    compare_other_heads(ctx, iw, "dk", P.dk, xb.dk, b->dk, rb.dk == b->dk, vl ? 1 : 2, 0, tol);
    compare_other_heads(ctx, iw, "dv", P.dv, xb.dv, b->dv, rb.dv == b->dv, vl ? 1 : 2, 0, tol);
    compare_other_heads(ctx, iw, "d_sinks", P.d_sinks, xb.ds, b->ds, rb.ds == b->ds, 0, 0, tol);
    if (P.d_bias.present && P.d_bias.t.shape[1] == c.h_q)
      compare_other_heads(ctx, iw, "d_bias", P.d_bias, xb.db, b->db, rb.db == b->db, 1, 0, tol);
  }
}

// ---------------------------------------------------------------- one configuration
// Cost of the float64 reference of a call (tests/reference visits the visible keys of every row, forward and
// backward): h_q * sum over rows of (visible keys + 1) * (d + d_v). Measured on the 2-core development machine:
// about 2.5e7-4e7 units per second for the pair of evaluations (float64 and plain low precision, concurrently;
// 7.5e8 units of a 100-configuration sweep in 17 s, sink-gradient-large-batch's 9.8e8 in about 40 s).
double reference_work(const Problem& P) {
  const Config& c = P.cfg;
  double pairs = 0;
  for (int n = 0; n < c.b; ++n) {
    const int lq = P.rows(n), lk = P.keys(n);
    for (int i = 0; i < lq; ++i) {
      const ref::KeyRange kr = ref::visible_keys(i, lq, lk, c.wl, c.wr, c.align == SINKATTN_ALIGN_BOTTOM_RIGHT);
      pairs += 1 + std::max<int64_t>(0, std::min<int64_t>(kr.hi, lk) - std::max<int64_t>(kr.lo, 0));
    }
  }
  return pairs * c.h_q * (c.d + c.d_v);
}

// Reference work up to which every call is judged by the float64 reference (SPEC 5); larger calls are judged
// by CUDA against the CPU backend on the same inputs. Every edge case and every configuration of the default
// sweep is below it (sweep calls: at most ~1.5e8; edge cases: at most ~1e9, sink-gradient-large-batch).
constexpr double kRefWork = 2e9;
// Reference work up to which the CUDA backward fed by the CPU forward of an edge case is judged by the reference
// too (every edge case but gpt-oss-sliding-layer and sink-gradient-large-batch; those are compared with the CPU
// backward on the same inputs).
constexpr double kCpuFedRefWork = 2e8;
// Reference work up to which a call above kRefWork is still judged by the reference when the CUDA-vs-CPU
// comparison fails (tools/gpu-check.sh reruns larger failing configurations with --ref instead).
constexpr double kMaxFailureRefWork = 2e10;

// What the main thread hands to a worker: the problem (its device memory released) and every run's outputs.
struct Job {
  std::shared_ptr<Problem> P;
  Ctx ctx;
  double work = 0;
  bool with_reference = false;
  bool complete = false;  // every run of prepare() succeeded (otherwise its failure is in ctx and nothing is judged)
  Outs cpu_f, cpu_b, cu_f, cu_b, cu_b_cpu, cpu_b_cu;  // cpu_b: fed by cpu_f; cu_b_cpu: CUDA fed by cpu_f; ...
  std::vector<Cmp> pipe_cmp, cpufed_cmp;  // CUDA vs CPU on the same inputs: the pipeline (forward, backward fed
                                          // by the CUDA forward), the backward fed by the CPU forward
};

ref::Result backward_only(const ref::Result& r) {
  ref::Result b = r;
  b.out = ref::Array{};
  b.softmax_lse = ref::Array{};
  return b;
}

// Main thread: every backend run and every check that needs no reference.
std::unique_ptr<Job> prepare(const Config& cfg) {
  auto job = std::make_unique<Job>();
  job->P = std::make_shared<Problem>();
  Problem& P = *job->P;
  Ctx& ctx = job->ctx;
  P.cfg = cfg;
  build(P);
  const Config& c = P.cfg;
  const bool grad = c.grad;
  job->work = reference_work(P);
  job->with_reference = g_always_ref || job->work <= kRefWork;
  Bytes want_rng(16);
  std::memcpy(want_rng.data(), &c.seed, 8);
  std::memcpy(want_rng.data() + 8, &c.offset, 8);

  // ---- CPU backend ----
  if (!run_forward(P, Dev::kCpu, job->cpu_f, ctx, "cpu")) return job;
  ctx.check(job->cpu_f.rng == want_rng, "cpu: rng_state not written as {seed, offset}");
  if (grad && !run_backward(P, Dev::kCpu, job->cpu_f, job->cpu_b, ctx, "cpu", 1, g_cpu_only)) return job;
  check_run(ctx, P, "cpu", job->cpu_f, grad ? &job->cpu_b : nullptr);
  if (g_cpu_only) {  // no GPU: the CPU pipeline's own sink checks, then the reference judges it
    minus_inf_twin(ctx, P, Dev::kCpu, job->cpu_f, grad ? &job->cpu_b : nullptr, "cpu");
    sink_isolation(ctx, P, Dev::kCpu, job->cpu_f, grad ? &job->cpu_b : nullptr, "cpu");
    job->complete = true;
    return job;
  }

  // ---- CUDA backend: the pipeline (forward, backward fed by it) ----
  {
    sinkattn_params_t autop = make_params(P, true, false);
    autop.backend = SINKATTN_BACKEND_AUTO;
    sinkattn_backend_t chosen;
    char report[1024];
    const sinkattn_status_t st = sinkattn_query_backend(&autop, 0, &chosen, report, sizeof(report));
    ctx.check(st == SINKATTN_OK && chosen == SINKATTN_BACKEND_CUDA,
              std::string("auto dispatch did not choose cuda for device memory: ") + report);
    // The kernels the case was written for (sm_90 only: elsewhere the sm_80 kernels run every call).
    if (g_sm == 90) {
      for (const std::string& part : c.want_fwd_kernel)
        ctx.check(std::string(report).find(part) != std::string::npos,
                  "forward not on the case's kernel (\"" + part + "\"): " + report);
      if (grad && !c.want_bwd_kernel.empty()) {
        sinkattn_params_t bp = make_params(P, true, true);
        bp.backend = SINKATTN_BACKEND_AUTO;
        char breport[1024];
        const sinkattn_status_t bst = sinkattn_query_backend(&bp, 1, &chosen, breport, sizeof(breport));
        ctx.check(bst == SINKATTN_OK, std::string("backward query_backend failed: ") + breport);
        for (const std::string& part : c.want_bwd_kernel)
          ctx.check(std::string(breport).find(part) != std::string::npos,
                    "backward not on the case's kernel (\"" + part + "\"): " + breport);
      }
    }
  }
  if (!run_forward(P, Dev::kCuda, job->cu_f, ctx, "cuda")) return job;
  ctx.check(job->cu_f.rng == want_rng, "cuda: rng_state not written as {seed, offset}");
  if (c.deterministic) {  // forward determinism (bitwise)
    Outs again;
    if (!run_forward(P, Dev::kCuda, again, ctx, "cuda (repeat)")) return job;
    ctx.check(again.out == job->cu_f.out && again.lse == job->cu_f.lse, "cuda: forward not bitwise reproducible");
  }
  if (grad) {
    if (!run_backward(P, Dev::kCuda, job->cu_f, job->cu_b, ctx, "cuda", c.deterministic ? 2 : 1, true)) return job;
    // The same backward inputs on the CPU backend (evidence; the verdict where the reference does not judge).
    if (!run_backward(P, Dev::kCpu, job->cu_f, job->cpu_b_cu, ctx, "cpu (fed by the cuda forward)", 1, false))
      return job;
    // The CUDA backward fed by the CPU forward: isolates backward errors from forward ones.
    if (!run_backward(P, Dev::kCuda, job->cpu_f, job->cu_b_cpu, ctx, "cuda (fed by the cpu forward)", 1, false))
      return job;
  }
  check_run(ctx, P, "cuda", job->cu_f, grad ? &job->cu_b : nullptr);
  if (grad) {
    check_run(ctx, P, "cuda (fed by the cpu forward)", job->cpu_f, &job->cu_b_cpu, false);
    check_run(ctx, P, "cpu (fed by the cuda forward)", job->cu_f, &job->cpu_b_cu, false);
  }
  const ref::Result cu = results(P, job->cu_f, grad ? &job->cu_b : nullptr);
  compare_forward(job->pipe_cmp, cu, results(P, job->cpu_f, nullptr), c);
  if (grad) {
    compare_backward(job->pipe_cmp, "", cu, results(P, job->cu_f, &job->cpu_b_cu), c);
    compare_backward(job->cpufed_cmp, " (fed by the cpu forward)", results(P, job->cpu_f, &job->cu_b_cpu),
                     results(P, job->cpu_f, &job->cpu_b), c);
  }
  minus_inf_twin(ctx, P, Dev::kCuda, job->cu_f, grad ? &job->cu_b : nullptr, "cuda");
  sink_isolation(ctx, P, Dev::kCuda, job->cu_f, grad ? &job->cu_b : nullptr, "cuda");
  job->complete = true;
  return job;
}

// Worker thread: the SPEC 5 verdict against the float64 reference (or, for calls too large for it, CUDA
// against the CPU backend on the same inputs).
void judge(Job* job) {
  Problem& P = *job->P;
  Ctx& ctx = job->ctx;
  const Config& c = P.cfg;
  const bool grad = c.grad;
  if (!job->complete) return;  // a call failed (recorded in ctx): nothing to judge
  try {
    if (g_cpu_only) {
      if (job->with_reference) {
        const ref::References refs = reference_results(P, grad, job->cpu_f.out);
        judge_spec5(ctx, "cpu", results(P, job->cpu_f, grad ? &job->cpu_b : nullptr), refs, c, true);
        ctx.judged_by_reference = true;
      }
      return;
    }
    const bool pipe_agree = all_pass(job->pipe_cmp), cpufed_agree = all_pass(job->cpufed_cmp);
    bool with_reference = job->with_reference;
    if (!with_reference && !(pipe_agree && cpufed_agree) && job->work <= kMaxFailureRefWork) {
      with_reference = true;
      ctx.notes.push_back("CUDA-vs-CPU comparison failed: judged by the float64 reference instead");
    }
    if (!with_reference) {
      for (const Cmp& x : job->pipe_cmp) ctx.check(x.pass, x.msg);
      for (const Cmp& x : job->cpufed_cmp) ctx.check(x.pass, x.msg);
      if (!(pipe_agree && cpufed_agree)) ctx.notes.push_back("reference too large to run here: rerun with --ref to decide");
      return;
    }
    for (const Cmp& x : job->pipe_cmp)
      if (!x.pass) ctx.notes.push_back("(log only) " + x.msg);
    for (const Cmp& x : job->cpufed_cmp)
      if (!x.pass) ctx.notes.push_back("(log only) " + x.msg);
    // The verdict: the user's pipeline, gradients with D from the CUDA forward's out.
    const ref::References pipe = reference_results(P, grad, job->cu_f.out);
    judge_spec5(ctx, "cuda", results(P, job->cu_f, grad ? &job->cu_b : nullptr), pipe, c, true);
    ctx.judged_by_reference = true;
    // The backends disagree: say whether the CPU side is off too (its forward; its backward on the same inputs).
    if (!pipe_agree)
      judge_spec5(ctx, "cpu backend", results(P, job->cpu_f, grad ? &job->cpu_b_cu : nullptr), pipe, c, false);
    if (grad && ((c.edge && job->work <= kCpuFedRefWork) || g_always_ref || !cpufed_agree)) {
      const ref::References cpufed = reference_results(P, grad, job->cpu_f.out);
      judge_spec5(ctx, "cuda (backward fed by the cpu forward)", backward_only(results(P, job->cpu_f, &job->cu_b_cpu)),
                  cpufed, c, false);
      if (!cpufed_agree)
        judge_spec5(ctx, "cpu backend (its own pipeline)", results(P, job->cpu_f, &job->cpu_b), cpufed, c, false);
    }
  } catch (const std::exception& e) {
    ctx.fail(std::string("reference: ") + e.what());
  }
}

Ctx finish(std::unique_ptr<Job> job) {
  const auto t0 = std::chrono::steady_clock::now();
  judge(job.get());
  job->ctx.work = job->work;
  job->ctx.reference_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  return std::move(job->ctx);
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
    if (c.mode == 2 && U(0, 2) > 0) {  // rows after cu_seqlens[b] (SPEC 1: outside the call)
      c.tail_q = U(1, 9);
      c.tail_kv = U(1, 9);
    }
  }
  const int stp = U(0, 99);
  c.st = stp < 60 ? SINKATTN_SOFTMAX_LEARNABLE : stp < 75 ? SINKATTN_SOFTMAX_OFF_BY_ONE : SINKATTN_SOFTMAX_VANILLA;
  for (int h = 0; h < c.h_q; ++h) {  // large sinks (SPEC 5), and -inf (SPEC 3: that head is vanilla)
    const int k = U(0, 11);
    c.sinks.push_back(k < 3 ? std::log(static_cast<float>(std::max(c.s_kv, 2))) : k < 6 ? 20.f
                      : k < 8 ? -5.f : k < 11 ? static_cast<float>(F(-1, 3)) : -INFINITY);
  }
  // SPEC 3: a NaN / +inf sink in head 0 leaves every other head's outputs unchanged.
  if (c.st == SINKATTN_SOFTMAX_LEARNABLE && c.h_q > 1 && U(0, 99) < 8) c.isolate_head0 = {U(0, 1) ? NAN : INFINITY};
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
// A number of a case file; the strings "-inf", "inf" and "nan" stand for the values JSON cannot spell.
float json_float(const mini_json::Value& x) {
  if (!x.is_str()) return static_cast<float>(x.num);
  if (x.str == "-inf") return -INFINITY;
  if (x.str == "inf" || x.str == "+inf") return INFINITY;
  if (x.str == "nan") return NAN;
  throw std::runtime_error("case file: not a number: " + x.str);
}

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
      // the project's case file: the inputs of a given seed (a case whose data is known to expose a failure)
      if (cj.has("data_seed")) c.data_seed = static_cast<uint64_t>(cj["data_seed"].num);
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
          for (const auto& x : cj["sinks"].arr) c.sinks.push_back(json_float(x));
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
      if (cj.has("bias_dtype")) c.bias_f32 = cj["bias_dtype"].str != "lowp";
      if (cj.has("bias_masked")) c.bias_masked_nan = cj["bias_masked"].str == "nan";
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
      if (cj.has("tail_rows")) {  // the project's case file: rows after cu_seqlens[b] (varlen)
        c.tail_q = static_cast<int>(cj["tail_rows"]["q"].num);
        c.tail_kv = static_cast<int>(cj["tail_rows"]["kv"].num);
      }
      if (cj.has("isolate_head0"))  // the project's case file: NaN / +inf sinks for head 0
        for (const auto& x : cj["isolate_head0"].arr) c.isolate_head0.push_back(json_float(x));
      if (cj.has("kernels")) {  // each a string or a list of strings
        auto parts = [&](const char* key, std::vector<std::string>& v) {
          if (!cj["kernels"].has(key)) return;
          const auto& x = cj["kernels"][key];
          auto part = [&](const auto& e) {  // a non-empty string: "" would match every report
            if (!e.is_str() || e.str.empty())
              throw std::runtime_error("case file: " + cj["name"].str + ": kernels." + key +
                                       ": not a non-empty string");
            v.push_back(e.str);
          };
          if (x.is_arr())
            for (const auto& e : x.arr) part(e);
          else
            part(x);
        };
        parts("forward", c.want_fwd_kernel);
        parts("backward", c.want_bwd_kernel);
      }
      c.edge = true;
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
  std::vector<std::string> cases;
  int sweep = 500;
  uint64_t seed = static_cast<uint64_t>(std::chrono::system_clock::now().time_since_epoch().count()) % 1000000007ull;
  int only = -1;
  bool small = false, no_cases = false;
  std::string match;  // --match: only the edge cases whose name contains it
  unsigned workers = std::max(1u, std::thread::hardware_concurrency() > 2 ? std::thread::hardware_concurrency() - 2 : 1u);
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() { return std::string(i + 1 < argc ? argv[++i] : ""); };
    if (a == "--cases") cases.push_back(next());
    else if (a == "--sweep") sweep = std::stoi(next());
    else if (a == "--seed") seed = std::stoull(next());
    else if (a == "--only") only = std::stoi(next());
    else if (a == "--small") small = true;
    else if (a == "--no-cases") no_cases = true;
    else if (a == "--match") match = next();
    else if (a == "--workers") workers = static_cast<unsigned>(std::max(1, std::stoi(next())));
    else if (a == "-v") g_verbose = true;
    else if (a == "--ref") g_always_ref = true;
    else if (a == "--cpu-only") g_cpu_only = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--cases FILE]... [--match NAME_PART] [--sweep N] [--seed S] [--only K] [--small] "
                   "[--no-cases] [--ref] [--workers N] [--cpu-only] [-v]\n",
                   argv[0]);
      return 2;
    }
  }
  if (cases.empty()) cases = {"tests/gpu/cases/edge-cases.json", "tests/gpu/cases/edge-cases-sinkattn.json"};
  if (g_cpu_only) {
    std::printf("sinkattn GPU suite, --cpu-only (CPU backend and the suite's own checks, no GPU); sweep seed %llu\n",
                static_cast<unsigned long long>(seed));
  } else {
    int dev_count = 0;
    CK(cudaGetDeviceCount(&dev_count));
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    g_sm = prop.major * 10 + prop.minor;
    std::printf("sinkattn GPU suite on %s (sm_%d%d); sweep seed %llu (rerun: --seed %llu --only K)\n", prop.name,
                prop.major, prop.minor, static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed));
    char info[4096];
    sinkattn_backend_describe(SINKATTN_BACKEND_CUDA, info, sizeof info);
    std::printf("%s", info);
  }
  std::printf("reference: judges every call up to %.3g units of work (%u worker threads)\n", kRefWork, workers);

  int run = 0, failed = 0, judged = 0, judged_possible = 0;
  int by_dtype[3] = {0, 0, 0}, failed_by_dtype[3] = {0, 0, 0};  // bf16, fp16, fp32
  // Per output: the worst err / tolerance of the judged pipeline (CUDA; --cpu-only: CPU) and its configuration.
  const char* kOutputs[] = {"out", "softmax_lse", "dq", "dk", "dv", "d_sinks", "d_bias"};
  std::map<std::string, std::pair<double, std::string>> worst;
  struct Pending {
    std::string describe;
    int di;
    std::chrono::steady_clock::time_point t0;
    std::future<Ctx> result;
  };
  std::deque<Pending> pending;
  auto report = [&](Pending& p) {
    Ctx ctx = p.result.get();
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p.t0).count();
    ++run;
    ++judged_possible;
    judged += ctx.judged_by_reference;
    for (const auto& [name, r] : ctx.worst) {
      auto& w = worst[name];
      if (w.second.empty() || r > w.first) w = {r, p.describe};
    }
    if (!ctx.errors.empty()) {
      ++failed;
      ++failed_by_dtype[p.di];
      std::printf("FAIL %s\n", p.describe.c_str());
      for (const auto& e : ctx.errors) std::printf("     %s\n", e.c_str());
      for (const auto& e : ctx.notes) std::printf("     note: %s\n", e.c_str());
    } else if (g_verbose) {
      std::printf("ok   %s (%.0f ms; reference %.0f ms, work %.3g%s)\n", p.describe.c_str(), ms, ctx.reference_ms,
                  ctx.work, ctx.judged_by_reference ? "" : ", not judged by it");
      for (const auto& e : ctx.notes) std::printf("     note: %s\n", e.c_str());
    }
    std::fflush(stdout);
  };
  auto ready = [](Pending& p) { return p.result.wait_for(std::chrono::seconds(0)) == std::future_status::ready; };
  // Reports finished configurations in order; `all`: waits for every one.
  auto drain = [&](bool all) {
    while (!pending.empty() && (all || ready(pending.front()))) {
      report(pending.front());
      pending.pop_front();
    }
  };
  // Waits while `workers` references are running (finished ones wait for their turn to be reported).
  auto throttle = [&]() {
    while (true) {
      drain(false);
      size_t running = 0;
      Pending* first = nullptr;
      for (Pending& p : pending)
        if (!ready(p)) {
          ++running;
          if (!first) first = &p;
        }
      if (running < workers) return;
      first->result.wait_for(std::chrono::milliseconds(20));
    }
  };
  auto run_config = [&](const Config& c) {
    const int di = c.dtype == SINKATTN_BF16 ? 0 : c.dtype == SINKATTN_F16 ? 1 : 2;
    ++by_dtype[di];
    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Job> job = prepare(c);
    const std::string describe = job->P->cfg.describe();
    job->P->free_dev();  // the worker calls no CUDA API
    pending.push_back({describe, di, t0, std::async(std::launch::async, finish, std::move(job))});
    throttle();
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
      for (const auto& file : cases) {
        const auto cs = cases_from_json(file);
        std::printf("-- %zu edge-case configurations from %s\n", cs.size(), file.c_str());
        for (const auto& c : cs) {
          if (small && static_cast<double>(c.b) * c.h_q * c.s_q * c.s_kv > 2e6) continue;
          if (!match.empty() && c.name.find(match) == std::string::npos) continue;
          run_config(c);
        }
        drain(true);
      }
    }
    std::printf("-- randomized sweep: %d configurations, seed %llu\n", sweep, static_cast<unsigned long long>(seed));
    for (int k = 0; k < sweep; ++k) run_config(random_config(seed, k, small));
  } else {
    run_config(random_config(seed, only, small));
  }
  drain(true);

  // Drift report: per output, the worst err / tolerance (SPEC 5) of the judged pipeline over the run.
  std::string ratios;
  std::printf("-- worst err / tolerance (SPEC 5) of the %s, per output\n",
              g_cpu_only ? "CPU backend" : "CUDA pipeline (backward fed by the CUDA forward)");
  for (const char* name : kOutputs) {
    char buf[64];
    auto it = worst.find(name);
    if (it == worst.end()) {
      std::snprintf(buf, sizeof buf, " %s -", name);
    } else {
      std::snprintf(buf, sizeof buf, " %s %.3f", name, it->second.first);
      std::printf("  %-12s %.3f  %s\n", name, it->second.first, it->second.second.c_str());
    }
    ratios += buf;
  }
  std::printf("SUMMARY: %d configurations, %d failed, %d checks (bf16 %d/%d failed, fp16 %d/%d, fp32 %d/%d); "
              "%d of %d judged by the float64 reference; worst err/tol:%s\n",
              run, failed, g_checks.load(), failed_by_dtype[0], by_dtype[0], failed_by_dtype[1], by_dtype[1],
              failed_by_dtype[2], by_dtype[2], judged, judged_possible, ratios.c_str());
  return failed == 0 ? 0 : 1;
}

// GPU suite of the decode path and paged KV (SPEC.md sections 1, 2, 4, 5) on the CUDA backend, judged against the
// float64 reference (tests/reference, which reads the page pools itself) by SPEC.md section 5:
//   - decode kernels (s_q 1 .. 16, GQA packed, dense and varlen queries, contiguous and paged KV, page sizes 8 .. 256,
//     head dims 32 .. 128, fp16 / bf16, windows at page edges, empty sequences, lengths ending mid-page) and the
//     paged prefill path (s_q > 16, head dim 256), for every split count given (1, the heuristic, several, more
//     splits than key tiles: the sink-carrying split empty, 128), and paged prefill on the Hopper forward (page sizes
//     8 .. 256, TMA boxes of page chunks, cp.async past a sequence's end, every head-dim tile 64 .. 256);
//   - every unread pool slot is NaN and every page-table entry past a sequence's pages is garbage;
//   - paged == contiguous on the same keys, bit for bit, where both run the decode kernels or the Hopper forward;
//   - outputs and workspace NaN-poisoned before every call; every output element written, no NaN;
//   - a CUDA-graph capture (global mode: no synchronisation or allocation allowed) of decode calls with splits,
//     replayed: bit-identical to the direct call;
//   - page indices and seqused_kv in device memory validated by the read-back (and refused with the message);
//   - a serving engine's decode batch (b = 256, GPT-OSS-120B heads) over a page table of 65,536 pages of 16 per
//     sequence of which 1 .. 256 keys are used: the workspace size query within the stated bound, which does not
//     grow with the table's capacity (CUDA: the partial outputs of at most 128 key splits of the query rows, 4 x 128
//     x h_q x rows x (d_v + 1) bytes + 512; the CPU backend: its K / V panels of the keys used and its partials).
// Usage: sinkattn_gpu_decode [--small] [--cpu-only] [-v]   (--small: the cases compute-sanitizer runs; --cpu-only:
// no GPU, the same cases on the CPU backend, which checks the suite's own logic). Exit status 1 on failure.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "paged_layout.hpp"
#include "reference.hpp"
#include "cuda_check.hpp"
#include "kernel_report.hpp"
#include "sinkattn/sinkattn.h"

namespace {

namespace ref = sinkattn::ref;
using sinkattn::test::PageLayout;

int g_failures = 0, g_checks = 0;
bool g_verbose = false;
bool g_cpu_only = false;  // no CUDA call at all: "device" buffers are the host ones, the backend is the CPU
bool g_hopper = false;    // device 0 has compute capability 9.0 (the cases' expect_family applies)


void check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok) {
    ++g_failures;
    std::printf("FAIL %s\n", what.c_str());
  }
}

// A contiguous host tensor with a device mirror.
struct Buf {
  std::vector<unsigned char> host;
  void* dev = nullptr;
  sinkattn_tensor_t t{};
  Buf() = default;
  Buf(const Buf&) = delete;
  Buf& operator=(const Buf&) = delete;
  std::vector<unsigned char> shadow;  // --cpu-only: the "device" copy
  ~Buf() {
    if (dev && !g_cpu_only) cudaFree(dev);
  }
  void alloc(sinkattn_dtype_t dt, const std::vector<int64_t>& shape) {
    int64_t n = 1;
    for (int64_t s : shape) n *= s;
    host.assign(static_cast<size_t>(std::max<int64_t>(n, 1)) * sinkattn_dtype_size(dt), 0xFF);  // NaN / garbage
    t = sinkattn_make_tensor(host.data(), dt, static_cast<int32_t>(shape.size()), shape.data(), nullptr);
    if (g_cpu_only) {
      shadow.assign(host.size(), 0xFF);
      dev = shadow.data();
    } else {
      CK(cudaMalloc(&dev, host.size()));
    }
  }
  bool present() const { return t.rank > 0; }
  void upload() {
    if (g_cpu_only) shadow = host, dev = shadow.data();
    else CK(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
  }
  void poison_dev() {
    if (g_cpu_only) std::fill(shadow.begin(), shadow.end(), 0xFF);
    else CK(cudaMemset(dev, 0xFF, host.size()));
  }
  void download() {
    if (g_cpu_only) host = shadow, t.data = host.data();
    else CK(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
  }
  sinkattn_tensor_t dview() const {
    sinkattn_tensor_t v = t;
    v.data = dev;
    return v;
  }
  ref::Array read() const { return ref::read_tensor(t); }
};

struct Case {
  std::string name;
  sinkattn_dtype_t dtype = SINKATTN_BF16;
  int64_t h_q = 64, h_kv = 8, d = 64, d_v = 64;
  std::vector<int32_t> seqused;  // keys per sequence
  std::vector<int32_t> len_q;    // varlen query lengths (empty: dense s_q)
  int64_t s_q = 1;
  int64_t page_size = 16;        // 0: contiguous cache
  sinkattn_softmax_type_t st = SINKATTN_SOFTMAX_LEARNABLE;
  int64_t wl = -1, wr = -1;
  std::vector<int32_t> splits = {1, 0, 3, 128};
  bool twin = true;              // also run the contiguous twin (paged cases) and compare bit for bit
  bool small = true;             // part of --small (compute-sanitizer)
  int64_t table_pages = 0;       // > 0: the page table has this many columns (garbage past the pages used)
  const char* expect_family = "";  // on a Hopper GPU (and a library with its kernels): the forward's kernel family
  const char* expect_kernel = "";  // on any CUDA GPU: a part of the forward's kernel report (e.g. its configuration)
  // Forced split counts (from `splits`) whose report on a Hopper GPU must say where the splits are merged:
  // "one cluster" (decode_rules.hpp, decode_cluster_splits) or "+ the combine kernel".
  std::vector<int32_t> cluster_splits, combine_splits;
};

// The workspace bound stated for a paged call (header comment), in bytes.
int64_t paged_workspace_bound(const Case& c, int64_t rows, int32_t splits) {
  if (!g_cpu_only) return 4 * 128 * c.h_q * rows * (c.d_v + 1) + 512;
  int64_t slots = 0, longest = 0;
  for (int32_t u : c.seqused) slots += u + 16, longest = std::max<int64_t>(longest, u);
  const int64_t s = splits == 0 ? 128 : std::min<int64_t>(splits, (longest + 63) / 64 + 1);
  return 4 * c.h_kv * (c.d + c.d_v) * slots + (s > 1 ? 4 * s * c.h_q * rows * (c.d_v + 9) + 64 : 0);
}

// One call's buffers: q, the cache (pools + page table, or a dense padded cache), outputs.
struct Problem {
  Case c;
  PageLayout L;
  int64_t b = 0, cap = 0, total_q = 0, s_q = 0;
  Buf q, k, v, sinks, table, used, cu_q, out, lse;
  Buf kd, vd, lens, ident;  // contiguous twin: [b, cap, h_kv, d] with seqlens_kv (varlen: as b pages, ident)
  sinkattn_params_t host_p{}, twin_p{};

  explicit Problem(const Case& cs) : c(cs) {
    std::mt19937_64 rng(std::hash<std::string>{}(c.name));
    std::normal_distribution<double> nd(0.0, 1.0);
    b = static_cast<int64_t>(c.seqused.size());
    const bool varlen = !c.len_q.empty();
    int64_t longest = 0;
    for (int32_t u : c.seqused) longest = std::max<int64_t>(longest, u);
    const int64_t ps = c.page_size > 0 ? c.page_size : std::max<int64_t>(longest, 1);
    L = sinkattn::test::make_page_layout(c.seqused, ps, /*share_prefix=*/c.page_size > 0, /*extra_pages=*/2,
                                         /*extra_cols=*/c.page_size > 0 ? 2 : 0, rng);
    cap = L.capacity();
    s_q = c.s_q;
    total_q = b * c.s_q;
    if (varlen) {
      total_q = 0;
      s_q = 1;
      for (int32_t l : c.len_q) total_q += l, s_q = std::max<int64_t>(s_q, l);
    }
    // keys of every sequence (NaN wherever nothing is read)
    k.alloc(c.dtype, {L.num_pages, ps, c.h_kv, c.d});
    v.alloc(c.dtype, {L.num_pages, ps, c.h_kv, c.d_v});
    kd.alloc(c.dtype, {b, cap, c.h_kv, c.d});
    vd.alloc(c.dtype, {b, cap, c.h_kv, c.d_v});
    ref::Array kp = k.read(), vp = v.read(), kdd = kd.read(), vdd = vd.read();
    for (int64_t n = 0; n < b; ++n)
      for (int64_t j = 0; j < c.seqused[n]; ++j) {
        const int64_t slot = L.slot(n, j);
        for (int64_t x = 0; x < c.h_kv * c.d; ++x) {
          double& e = kp.data[slot * c.h_kv * c.d + x];
          if (std::isnan(e)) e = nd(rng);
          kdd.data[(n * cap + j) * c.h_kv * c.d + x] = e;
        }
        for (int64_t x = 0; x < c.h_kv * c.d_v; ++x) {
          double& e = vp.data[slot * c.h_kv * c.d_v + x];
          if (std::isnan(e)) e = nd(rng);
          vdd.data[(n * cap + j) * c.h_kv * c.d_v + x] = e;
        }
      }
    ref::write_tensor(k.t, kp);
    ref::write_tensor(v.t, vp);
    ref::write_tensor(kd.t, kdd);
    ref::write_tensor(vd.t, vdd);
    const int64_t table_pages = std::max(L.max_pages, c.table_pages);
    table.alloc(SINKATTN_I32, {b, table_pages});
    for (int64_t n = 0; n < b; ++n)
      std::memcpy(table.host.data() + n * table_pages * 4, L.table.data() + n * L.max_pages, L.max_pages * 4);
    used.alloc(SINKATTN_I32, {b});
    std::memcpy(used.host.data(), c.seqused.data(), c.seqused.size() * 4);
    lens.alloc(SINKATTN_I32, {b});
    std::memcpy(lens.host.data(), c.seqused.data(), c.seqused.size() * 4);
    const std::vector<int64_t> qs = varlen ? std::vector<int64_t>{total_q, c.h_q, c.d}
                                           : std::vector<int64_t>{b, c.s_q, c.h_q, c.d};
    const std::vector<int64_t> os = varlen ? std::vector<int64_t>{total_q, c.h_q, c.d_v}
                                           : std::vector<int64_t>{b, c.s_q, c.h_q, c.d_v};
    q.alloc(c.dtype, qs);
    ref::Array qa = q.read();
    for (double& x : qa.data) x = nd(rng);
    ref::write_tensor(q.t, qa);
    out.alloc(c.dtype, os);
    lse.alloc(SINKATTN_F32, varlen ? std::vector<int64_t>{c.h_q, total_q} : std::vector<int64_t>{b, c.h_q, c.s_q});
    sinks.alloc(SINKATTN_F32, {c.h_q});
    {
      ref::Array s = sinks.read();
      std::uniform_real_distribution<double> ud(-1.0, 3.0);
      for (int64_t h = 0; h < c.h_q; ++h)
        s.data[h] = h % 8 == 0 ? std::log(static_cast<double>(std::max<int64_t>(longest, 2))) : h % 8 == 1 ? 20.0 : ud(rng);
      ref::write_tensor(sinks.t, s);
    }
    sinkattn_params_init(&host_p);
    host_p.q = q.t;
    host_p.out = out.t;
    host_p.softmax_lse = lse.t;
    host_p.softmax_type = c.st;
    if (c.st == SINKATTN_SOFTMAX_LEARNABLE) host_p.sinks = sinks.t;
    host_p.window_left = c.wl;
    host_p.window_right = c.wr;
    if (varlen) {
      std::vector<int32_t> cq{0};
      for (int32_t l : c.len_q) cq.push_back(cq.back() + l);
      cu_q.alloc(SINKATTN_I32, {b + 1});
      std::memcpy(cu_q.host.data(), cq.data(), cq.size() * 4);
      host_p.cu_seqlens_q = cu_q.t;
      host_p.max_seqlen_q = s_q;
      host_p.max_seqlen_kv = cap;
    }
    twin_p = host_p;
    host_p.k = k.t;
    host_p.v = v.t;
    host_p.page_table = table.t;
    host_p.seqused_kv = used.t;
    // Contiguous twin: dense queries with seqlens_kv over [b, cap] (varlen queries: the same cache as b pages of
    // cap rows, the twin of a contiguous cache that the JAX binding uses too).
    twin_p.k = kd.t;
    twin_p.v = vd.t;
    if (varlen) {
      ident.alloc(SINKATTN_I32, {b, 1});
      for (int64_t n = 0; n < b; ++n) reinterpret_cast<int32_t*>(ident.host.data())[n] = static_cast<int32_t>(n);
      twin_p.page_table = ident.t;
      twin_p.seqused_kv = used.t;
    } else {
      twin_p.seqlens_kv = lens.t;
    }
    if (c.page_size == 0) host_p = twin_p;  // a contiguous-cache case: the call itself is the dense one
    for (Buf* x : bufs())
      if (x->present()) x->upload();
  }
  std::vector<Buf*> bufs() { return {&q, &k, &v, &sinks, &table, &used, &cu_q, &out, &lse, &kd, &vd, &lens, &ident}; }

  // The device-memory copy of a params struct: every tensor points at its buffer's device mirror.
  sinkattn_params_t device(const sinkattn_params_t& h) {
    sinkattn_params_t p = h;
    for (sinkattn_tensor_t* t : {&p.q, &p.k, &p.v, &p.sinks, &p.page_table, &p.seqused_kv, &p.seqlens_kv,
                                 &p.cu_seqlens_q, &p.out, &p.softmax_lse})
      for (Buf* x : bufs())
        if (t->rank > 0 && x->present() && t->data == x->host.data()) t->data = x->dev;
    p.backend = g_cpu_only ? SINKATTN_BACKEND_CPU : SINKATTN_BACKEND_CUDA;
    return p;
  }
};

// Runs a device call with poisoned outputs and workspace; returns the status and the outputs (out, lse bytes).
struct Result {
  sinkattn_status_t st = SINKATTN_OK;
  size_t workspace = 0;  // bytes the size query reported
  std::string msg;
  std::vector<unsigned char> out, lse;
  ref::Result r;
};
Result run(Problem& P, sinkattn_params_t p, int32_t splits, cudaStream_t stream = nullptr) {
  Result res;
  p.num_splits = splits;
  p.stream = stream;
  P.out.poison_dev();
  P.lse.poison_dev();
  size_t bytes = 0;
  res.st = sinkattn_forward_workspace_size(&p, &bytes);
  res.workspace = bytes;
  void* ws = nullptr;
  std::vector<unsigned char> host_ws;
  if (res.st == SINKATTN_OK) {
    if (bytes && g_cpu_only) {
      host_ws.assign(bytes, 0xFF);
      ws = host_ws.data();
    } else if (bytes) {
      CK(cudaMalloc(&ws, bytes));
      CK(cudaMemset(ws, 0xFF, bytes));
    }
    p.workspace = ws;
    p.workspace_bytes = bytes;
    res.st = sinkattn_forward(&p);
  }
  res.msg = sinkattn_last_error();
  if (!g_cpu_only) {
    CK(cudaDeviceSynchronize());
    if (ws) cudaFree(ws);
  }
  P.out.download();
  P.lse.download();
  res.out = P.out.host;
  res.lse = P.lse.host;
  res.r.out = P.out.read();
  res.r.softmax_lse = P.lse.read();
  return res;
}

std::string split_name(int32_t s) { return s == 0 ? "heuristic" : std::to_string(s); }

// The forward's kernel family as sinkattn_query_backend reports it ("decode", "hopper fwd", "sm80 fwd"; "not CUDA"
// where the call runs elsewhere).
std::string kernel_family(const sinkattn_params_t& p) {
  const std::string k = sinkattn_test::cuda_kernels(p);
  if (k.empty()) return "not CUDA";
  std::string f = k.substr(0, k.find_first_of("(,"));
  while (!f.empty() && f.back() == ' ') f.pop_back();
  return f;
}

// Where a forced split count's partials are merged, as the kernel report says ("; 5 key splits, one cluster",
// "; 7 key splits + the combine kernel"): the path the case expects on a Hopper GPU, unless
// SINKATTN_CUDA_NO_DECODE_CLUSTER turns the cluster off (then the combine kernel for every split count).
void check_split_path(const Case& c, sinkattn_params_t p, int32_t s, const std::string& who) {
  const auto has = [s](const std::vector<int32_t>& v) { return std::find(v.begin(), v.end(), s) != v.end(); };
  if (g_cpu_only || !g_hopper || !(has(c.cluster_splits) || has(c.combine_splits))) return;
  // a switch is on when set to anything but "" or "0" (dispatch.hpp, Switches)
  const char* off = std::getenv("SINKATTN_CUDA_NO_DECODE_CLUSTER");
  const bool cluster_off = off != nullptr && off[0] != '\0' && std::string(off) != "0";
  const bool cluster = has(c.cluster_splits) && !cluster_off;
  p.num_splits = s;
  const std::string k = sinkattn_test::cuda_kernels(p);
  const std::string want =
      std::to_string(s) + (cluster ? " key splits, one cluster" : " key splits + the combine kernel");
  check(k.find(want) != std::string::npos, who + ": runs " + k + ", expected \"" + want + "\"");
  if (g_verbose) std::printf("  %s: %s\n", who.c_str(), k.c_str());
}

void run_case(const Case& c) {
  Problem P(c);
  const ref::Result r64 = ref::evaluate(P.host_p, false);
  const ref::Result lowp = ref::evaluate(P.host_p, false, ref::Precision::kPlainLowPrecision);
  Result first;
  for (size_t si = 0; si < c.splits.size(); ++si) {
    const int32_t s = c.splits[si];
    const std::string who = c.name + " (num_splits " + split_name(s) + ")";
    Result res = run(P, P.device(P.host_p), s);
    check(res.st == SINKATTN_OK, who + ": status " + std::to_string(res.st) + ": " + res.msg);
    if (res.st != SINKATTN_OK) continue;
    if (c.table_pages > 0) {
      const int64_t bound = paged_workspace_bound(c, P.total_q, s);
      check(static_cast<int64_t>(res.workspace) <= bound, who + ": workspace " + std::to_string(res.workspace) +
                                                              " bytes > the bound " + std::to_string(bound));
      std::printf("  %s: workspace %.2f MiB (bound %.2f MiB) for a page table of %lld pages per sequence\n",
                  who.c_str(), res.workspace / 1048576.0, bound / 1048576.0, static_cast<long long>(c.table_pages));
    }
    for (const auto& row : ref::error_table(res.r, r64, lowp, c.dtype)) {
      char buf[256];
      std::snprintf(buf, sizeof buf, "%s: SPEC 5 %s err %.3g > tol %.3g (plain low precision %.3g)", who.c_str(),
                    row.name.c_str(), row.err, row.tolerance, row.lowp_err);
      check(row.pass, buf);
      if (g_verbose) std::printf("  %-48s %-12s err %.3g tol %.3g\n", who.c_str(), row.name.c_str(), row.err, row.tolerance);
    }
    if (si == 0) first = res;
    check_split_path(c, P.device(P.host_p), s, who);
  }
  if (!g_cpu_only && c.expect_kernel[0] != '\0') {
    const std::string k = sinkattn_test::cuda_kernels(P.device(P.host_p));
    check(k.find(c.expect_kernel) != std::string::npos, c.name + ": runs " + k + ", expected " + c.expect_kernel);
  }
  if (c.twin && c.page_size > 0 && !c.splits.empty()) {
    Result t = run(P, P.device(P.twin_p), c.splits[0]);
    check(t.st == SINKATTN_OK, c.name + " contiguous twin: " + t.msg);
    // Bit for bit where both run the same kernel family: the decode kernels (s_q <= 16, head dims <= 128) or the
    // Hopper forward (its paged variant differs from the contiguous one in the loading warp only).
    const std::string kp = kernel_family(P.device(P.host_p)), kt = kernel_family(P.device(P.twin_p));
    if (g_verbose) std::printf("  %s: paged %s, contiguous twin %s\n", c.name.c_str(), kp.c_str(), kt.c_str());
    if (c.expect_family[0] != '\0')
      check(!g_hopper || kp.rfind(c.expect_family, 0) == 0,
            c.name + ": runs " + kp + ", expected " + c.expect_family);
    const bool same = kp == kt && (kp.rfind("decode", 0) == 0 || kp.rfind("hopper fwd", 0) == 0);
    if (t.st == SINKATTN_OK && same)
      check(t.out == first.out && t.lse == first.lse, c.name + ": paged != contiguous on the same keys (bitwise)");
  }
}

std::vector<Case> cases(bool small) {
  std::vector<Case> cs;
  auto add = [&](Case c) {
    if (!small || c.small) cs.push_back(c);
  };
  // GPT-OSS decode: GQA 8 packed into one 16-row tile, learnable sinks, pages of 16 and 64, ragged lengths.
  for (int64_t ps : {16, 64}) {
    Case c;
    c.name = "gptoss-decode-ps" + std::to_string(ps);
    c.page_size = ps;
    c.seqused = {1000, 17, 0, 1, 64, 333};
    c.splits = {1, 0, 2, 7, 16, 64, 128};
    c.cluster_splits = {2};  // 6 x 8 = 48 blocks: 7 splits would need 336 SMs for one block an SM
    c.combine_splits = {7, 16, 64, 128};
    add(c);
    c.cluster_splits.clear(), c.combine_splits.clear();
    c.name = "gptoss-sliding-ps" + std::to_string(ps);
    c.wl = 127, c.wr = 0;
    c.seqused = {1000, 127, 128, 129, 143, 144, 145};  // windows starting at, before and after page edges
    add(c);  // 56 blocks: the default 16-row configuration (the short-range one takes more blocks than 3 an SM hold)
  }
  // The splits merged in their cluster (decode_cluster_splits: up to 8 splits where the grid's blocks x splits fit one
  // block an SM, 64 at most here): 8 KV heads of one sequence at every cluster size; a group of 4 (4 rows a block)
  // with 5 and 8 splits, where splits 4.. merge no row, beside an empty sequence (only the sink in its carrying split).
  {
    Case c;
    c.name = "gptoss-decode-cluster-b1";
    c.seqused = {2999};
    c.splits = {3, 0, 2, 4, 5, 6, 7, 8};
    c.cluster_splits = {2, 3, 4, 5, 6, 7, 8};
    add(c);
    c.name = "bf16-decode-cluster-g4-empty";
    c.h_q = 16, c.h_kv = 4;
    c.page_size = 64;
    c.seqused = {2000, 0};
    c.splits = {5, 0, 8};
    c.cluster_splits = {5, 8};
    add(c);
  }
  // The short-range configuration (decode_rules.hpp, decode_short_keys: a short key range over more blocks, b x h_kv,
  // than the default configuration's 3 an SM hold: 640 here, above 3 x 132 and 3 x 148) at its edges: a window of
  // exactly 3 tiles (175 keys + 2 rows + 15 below a 16-key boundary: the ring's 3 stages all used, the third
  // refilling Q's buffer), 16 query rows of one head per block with a two-sided window and varlen queries (rows that
  // see no key, empty sequences), head dim 32 with 4 query rows of a group of 4 and pages of 8.
  const auto lengths = [](std::vector<int32_t> pattern, size_t n) {
    std::vector<int32_t> v;
    for (size_t i = 0; i < n; ++i) v.push_back(pattern[i % pattern.size()] + static_cast<int32_t>(i / pattern.size()));
    return v;
  };
  {
    Case c;
    c.name = "gptoss-short-window-3-tiles";
    c.wl = 175, c.wr = 0;
    c.page_size = 64;
    c.seqused = lengths({1000, 176, 191, 192, 500, 1, 0, 63}, 80);
    c.splits = {1, 0, 2, 3, 128};
    c.expect_kernel = "short key range";
    add(c);
  }
  {
    Case c;
    c.name = "fp16-short-window-twosided-varlen";
    c.dtype = SINKATTN_F16;
    c.h_q = 64, c.h_kv = 64;
    c.len_q = {16, 5, 0, 16, 1, 16, 9, 0, 16, 2};
    c.seqused = {300, 20, 7, 16, 0, 150, 99, 40, 1, 64};
    c.wl = 100, c.wr = 20;
    c.expect_kernel = "short key range";
    add(c);
  }
  {
    Case c;
    c.name = "bf16-short-window-d32-g4-sq4";
    c.h_q = 128, c.h_kv = 32, c.d = c.d_v = 32;
    c.s_q = 4;
    c.seqused = lengths({1000, 3, 64, 65, 0}, 20);
    c.wl = 60, c.wr = 0;
    c.page_size = 8;
    c.st = SINKATTN_SOFTMAX_OFF_BY_ONE;
    c.expect_kernel = "short key range";
    add(c);
  }
  {  // fp16, speculative decoding (4 tokens, causal), varlen queries
    Case c;
    c.name = "fp16-spec4-varlen";
    c.dtype = SINKATTN_F16;
    c.seqused = {300, 40, 0, 1000};
    c.len_q = {4, 1, 0, 3};
    c.wr = 0;
    c.st = SINKATTN_SOFTMAX_OFF_BY_ONE;
    add(c);
  }
  {  // 16 queries per sequence (128 packed rows), window, vanilla
    Case c;
    c.name = "bf16-chunk16-window-vanilla";
    c.s_q = 16;
    c.seqused = {500, 16, 40};
    c.wl = 50, c.wr = 0;
    c.st = SINKATTN_SOFTMAX_VANILLA;
    c.page_size = 32;
    add(c);
  }
  {  // head dim 128 (tile 128), MHA-like group 2, page size 256
    Case c;
    c.name = "bf16-d128-ps256";
    c.h_q = 8, c.h_kv = 4, c.d = c.d_v = 128;
    c.seqused = {700, 256, 255};
    c.s_q = 2;
    c.wr = 0;
    c.page_size = 256;
    add(c);
  }
  {  // head dims 32 / 96 (padded tiles), d != d_v, page size 8 (not a multiple of 16)
    Case c;
    c.name = "fp16-d96-dv32-ps8";
    c.dtype = SINKATTN_F16;
    c.h_q = 4, c.h_kv = 1, c.d = 96, c.d_v = 32;
    c.seqused = {90, 8, 9};
    c.page_size = 8;
    add(c);
  }
  {  // contiguous cache, decode kernel over dense KV (no page table)
    Case c;
    c.name = "bf16-contiguous-decode";
    c.page_size = 0;
    c.seqused = {4000, 5, 0};
    c.splits = {1, 0, 5, 128};
    c.small = false;
    add(c);
  }
  {  // the prefill forward through the page table: 40 queries (s_q > 16), and head dim 256 (no decode kernel)
    Case c;
    c.name = "bf16-paged-prefill-sq40";
    c.s_q = 40;
    c.h_q = 8, c.h_kv = 2;
    c.seqused = {300, 40, 64};
    c.wr = 0;
    c.splits = {0};
    add(c);
    c.name = "fp16-paged-prefill-d256";
    c.dtype = SINKATTN_F16;
    c.s_q = 3;
    c.d = c.d_v = 256;
    c.seqused = {200, 3};
    add(c);
  }
  // Paged prefill on the Hopper forward (kPaged): TMA boxes of gcd(page_size, keys per step) rows of one page (8, 16,
  // 64, 128), cp.async with a page lookup per row for the blocks reaching past a sequence's end and where no tensor
  // map fits (head dim 48); every tile 64 .. 256; lengths ending mid-page and mid-block, empty sequences, varlen
  // queries, a sliding window, shared prefix pages; the contiguous twin bit for bit (same consumers).
  {
    Case c;
    c.name = "gptoss-paged-prefill-ps16";
    c.s_q = 200;
    c.h_q = 16, c.h_kv = 2;
    c.seqused = {1000, 200, 333, 257};
    c.wr = 0;
    c.splits = {0};
    c.expect_family = "hopper fwd";
    add(c);
    c.name = "bf16-paged-prefill-ps48-d128-full";
    c.d = c.d_v = 128;
    c.h_q = 4, c.h_kv = 4;
    c.s_q = 130;
    c.page_size = 48;
    c.seqused = {700, 130, 385};
    c.wr = -1;
    c.st = SINKATTN_SOFTMAX_OFF_BY_ONE;
    add(c);
    c.name = "fp16-paged-prefill-ps8-varlen";
    c.dtype = SINKATTN_F16;
    c.d = c.d_v = 64;
    c.h_q = 8, c.h_kv = 1;
    c.page_size = 8;
    c.len_q = {64, 17, 0, 100};
    c.seqused = {64, 500, 0, 1000};
    c.wr = 0;
    c.st = SINKATTN_SOFTMAX_LEARNABLE;
    add(c);
    c.name = "bf16-paged-prefill-ps256-d256";
    c.dtype = SINKATTN_BF16;
    c.len_q.clear();
    c.d = c.d_v = 256;
    c.h_q = 4, c.h_kv = 2;
    c.s_q = 80;
    c.page_size = 256;
    c.seqused = {300, 80, 600};
    add(c);
    c.name = "fp16-paged-prefill-ps128-d192-vanilla";
    c.dtype = SINKATTN_F16;
    c.d = c.d_v = 192;
    c.page_size = 128;
    c.st = SINKATTN_SOFTMAX_VANILLA;
    c.seqused = {500, 80, 129};
    add(c);
    c.name = "bf16-paged-prefill-ps24-sliding600";
    c.dtype = SINKATTN_BF16;
    c.d = c.d_v = 64;
    c.h_q = 8, c.h_kv = 2;
    c.s_q = 300;
    c.page_size = 24;
    c.wl = 600, c.wr = 0;
    c.st = SINKATTN_SOFTMAX_LEARNABLE;
    c.seqused = {2000, 300, 901};
    add(c);
    c.name = "bf16-paged-prefill-ps16-d48-cpasync";
    c.wl = -1;
    c.d = c.d_v = 48;
    c.page_size = 16;
    c.seqused = {700, 300, 517};
    add(c);
    // A page size that is not a multiple of 8: the sm_80 forward through the page table.
    c.name = "bf16-paged-prefill-ps12-sm80";
    c.d = c.d_v = 64;
    c.page_size = 12;
    c.seqused = {400, 300, 31};
    c.expect_family = "sm80 fwd";
    add(c);
  }
  {  // long context, few sequences: many splits
    Case c;
    c.name = "gptoss-long-ps16";
    c.seqused = {32768, 5000};
    c.splits = {0, 1, 128};
    c.small = false;
    add(c);
  }
  {  // a serving engine's decode batch: b = 256 over a page table of 65,536 pages of 16 per sequence (room for
     // 1,048,576 keys each), 1 .. 256 keys used; the workspace must not follow the table's capacity
    Case c;
    c.name = "gptoss-decode-b256-table65536";
    std::mt19937_64 rng(39);
    for (int n = 0; n < 256; ++n) c.seqused.push_back(1 + static_cast<int32_t>(rng() % 256));
    c.seqused[0] = 1, c.seqused[1] = 256;
    c.table_pages = 65536;
    c.splits = {1, 0, 3, 128};
    c.small = false;
    add(c);
  }
  return cs;
}

// A decode call with splits captured into a CUDA graph (global capture mode: a synchronisation or allocation inside
// the call would invalidate the capture), replayed twice: the same bits as the direct call.
void graph_capture_test() {
  Case c;
  c.name = "graph-capture";
  c.seqused = {3000, 70, 1};
  Problem P(c);
  for (int32_t s : {0, 8}) {
    sinkattn_params_t p = P.device(P.host_p);
    const Result direct = run(P, p, s);
    check(direct.st == SINKATTN_OK, "graph test direct call: " + direct.msg);
    cudaStream_t stream;
    CK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    p.num_splits = s;
    p.stream = stream;
    size_t bytes = 0;
    check(sinkattn_forward_workspace_size(&p, &bytes) == SINKATTN_OK, "graph test size query");
    void* ws = nullptr;
    if (bytes) CK(cudaMalloc(&ws, bytes));
    p.workspace = ws;
    p.workspace_bytes = bytes;
    P.out.poison_dev();
    P.lse.poison_dev();
    cudaGraph_t graph;
    CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeGlobal));
    const sinkattn_status_t st = sinkattn_forward(&p);
    const std::string msg = sinkattn_last_error();
    const cudaError_t ce = cudaStreamEndCapture(stream, &graph);
    check(st == SINKATTN_OK && ce == cudaSuccess,
          "graph capture (num_splits " + split_name(s) + "): status " + std::to_string(st) + " " + msg + ", capture " +
              cudaGetErrorString(ce));
    if (st == SINKATTN_OK && ce == cudaSuccess) {
      cudaGraphExec_t exec;
      CK(cudaGraphInstantiate(&exec, graph, 0));
      for (int rep = 0; rep < 2; ++rep) {
        P.out.poison_dev();
        P.lse.poison_dev();
        CK(cudaDeviceSynchronize());  // the poisoning (cudaMemset: legacy stream) before the replay on the non-blocking
                                      // stream, which is not ordered after it
        CK(cudaGraphLaunch(exec, stream));
        CK(cudaStreamSynchronize(stream));
        P.out.download();
        P.lse.download();
        check(P.out.host == direct.out && P.lse.host == direct.lse,
              "graph replay " + std::to_string(rep) + " (num_splits " + split_name(s) + ") != direct call");
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    if (ws) cudaFree(ws);
    cudaStreamDestroy(stream);
  }
  std::printf("  graph capture: done\n");
}

// Contents of device batch tensors are validated by the read-back outside capture (SPEC.md section 4).
void device_validation_test() {
  Case c;
  c.name = "device-validation";
  c.seqused = {40, 17};
  Problem P(c);
  auto expect = [&](const char* what, const char* arg) {
    const Result r = run(P, P.device(P.host_p), 1);
    std::vector<unsigned char> poisoned(P.out.host.size(), 0xFF);
    check(r.st == SINKATTN_ERR_INVALID_ARGUMENT && r.msg.rfind(arg, 0) == 0,
          std::string("device ") + what + " not refused: status " + std::to_string(r.st) + " " + r.msg);
    check(r.out == poisoned, std::string("outputs written although validation failed: ") + what);
    std::printf("  reject device %-28s -> %s\n", what, r.msg.c_str());
  };
  std::vector<int32_t> t = P.L.table;
  int32_t* tab = reinterpret_cast<int32_t*>(P.table.host.data());
  tab[1] = static_cast<int32_t>(P.L.num_pages);  // sequence 0's second page: out of range
  P.table.upload();
  expect("page index out of range", "page_table");
  std::memcpy(P.table.host.data(), t.data(), t.size() * 4);
  P.table.upload();
  reinterpret_cast<int32_t*>(P.used.host.data())[1] = static_cast<int32_t>(P.cap + 1);
  P.used.upload();
  expect("seqused_kv over capacity", "seqused_kv");
}

}  // namespace

int main(int argc, char** argv) {
  bool small = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--small") small = true;
    else if (a == "--cpu-only") g_cpu_only = true;
    else if (a == "-v") g_verbose = true;
    else {
      std::fprintf(stderr, "usage: %s [--small] [--cpu-only] [-v]\n", argv[0]);
      return 2;
    }
  }
  if (g_cpu_only) {
    std::printf("sinkattn GPU decode suite, --cpu-only (the CPU backend, no GPU)%s\n", small ? ", --small" : "");
  } else {
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    std::printf("sinkattn GPU decode suite on %s (sm_%d%d)%s\n", prop.name, prop.major, prop.minor,
                small ? ", --small" : "");
    g_hopper = prop.major == 9 && prop.minor == 0;
  }
  const auto cs = cases(small);
  for (const auto& c : cs) {
    const int before = g_failures;
    run_case(c);
    std::printf("%s %s\n", g_failures == before ? "ok  " : "FAIL", c.name.c_str());
    std::fflush(stdout);
  }
  if (!g_cpu_only) {
    graph_capture_test();
    device_validation_test();
  }
  std::printf("DECODE SUMMARY: %zu cases, %d checks, %d failed\n", cs.size(), g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}

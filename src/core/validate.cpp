// Validation of a sinkattn_params_t at the boundary (SPEC.md section 4) and its resolution into a Call.
//
// Every rule returns INVALID_ARGUMENT with a message that starts with the argument's name and states the rule.
// `decide_tensors` is the one place that decides which optional tensors a call has; forward and backward both
// validate and run against its answer.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "core/backend.hpp"
#include "core/call.hpp"
#include "core/philox.hpp"
#include "core/validate.hpp"

namespace sinkattn {
namespace {

// The integer a caller stored in an enum field of sinkattn_params_t or sinkattn_tensor_t. C allows any int there, and in
// C++ a load of a value outside the enum's range is undefined (UBSan's -fsanitize=enum reports it), so every enum
// field is read through its bits until it has been checked.
template <typename E>
int32_t enum_bits(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t), "C enums of the ABI are int-sized");
  int32_t v;
  std::memcpy(&v, &e, sizeof v);
  return v;
}

const char* dtype_name(int32_t t) {
  switch (t) {
    case SINKATTN_F32: return "fp32";
    case SINKATTN_F16: return "fp16";
    case SINKATTN_BF16: return "bf16";
    case SINKATTN_I32: return "int32";
    case SINKATTN_I64: return "int64";
  }
  return "unknown";
}

bool present(const sinkattn_tensor_t& t) { return t.rank > 0; }

std::string shape_str(const sinkattn_tensor_t& t) {
  std::ostringstream s;
  s << "[";
  for (int i = 0; i < t.rank && i < SINKATTN_MAX_RANK; ++i) s << (i ? ", " : "") << t.shape[i];
  s << "]";
  return s.str();
}

std::string dims_str(const std::vector<int64_t>& d) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < d.size(); ++i) s << (i ? ", " : "") << d[i];
  s << "]";
  return s.str();
}

// Checks that shared by every tensor: rank in range, shape >= 0, strides >= 0, last dim contiguous, data present
// (unless shape-only), memory kind equal to q's.
class Checker {
 public:
  Checker(bool shape_only, Memory memory) : shape_only_(shape_only), memory_(memory) {}

  Status basic(const char* name, const sinkattn_tensor_t& t) const {
    if (t.rank < 1 || t.rank > SINKATTN_MAX_RANK)
      return invalid(std::string(name) + ": rank must be between 1 and 4, got " + std::to_string(t.rank));
    for (int i = 0; i < t.rank; ++i) {
      if (t.shape[i] < 0) return invalid(std::string(name) + ": shape " + shape_str(t) + " has a negative extent");
      if (t.strides[i] < 0)
        return invalid(std::string(name) + ": stride " + std::to_string(t.strides[i]) + " of dimension " +
                       std::to_string(i) + " is negative");
    }
    if (t.strides[t.rank - 1] != 1 && t.shape[t.rank - 1] > 1)
      return invalid(std::string(name) + ": the last dimension must be contiguous (stride 1), got stride " +
                     std::to_string(t.strides[t.rank - 1]));
    if (!shape_only_) {
      bool empty = false;
      for (int i = 0; i < t.rank; ++i) empty |= t.shape[i] == 0;
      if (t.data == nullptr && !empty) return invalid(std::string(name) + ": data pointer is NULL");
      if (t.data != nullptr) {
        const Memory m = pointer_memory(t.data);
        if (m != memory_)
          return invalid(std::string(name) + ": is in " + (m == Memory::kDevice ? "device" : "host") +
                         " memory but q is in " + (memory_ == Memory::kDevice ? "device" : "host") +
                         " memory; all tensors of a call must be in the same memory");
      }
    }
    return Status::ok();
  }

  // `like`: the tensor whose dtype `want` is (q for k, v, out and the gradients; bias for d_bias), named in the
  // message so that a caller who mixed dtypes learns which one must change.
  Status dtype(const char* name, const sinkattn_tensor_t& t, sinkattn_dtype_t want, const char* like = nullptr) const {
    const int32_t got = enum_bits(t.dtype);
    if (got == want) return Status::ok();
    if (like != nullptr)
      return invalid(std::string(name) + ": dtype must match " + like + "'s (" + dtype_name(want) + "), got " +
                     dtype_name(got));
    return invalid(std::string(name) + ": dtype must be " + dtype_name(want) + ", got " + dtype_name(got));
  }

  // Full check against an expected shape.
  Status exact(const char* name, const sinkattn_tensor_t& t, sinkattn_dtype_t want_dtype,
               const std::vector<int64_t>& want, const char* like = nullptr) const {
    SINKATTN_RETURN_IF_ERROR(basic(name, t));
    SINKATTN_RETURN_IF_ERROR(dtype(name, t, want_dtype, like));
    bool same = t.rank == static_cast<int>(want.size());
    for (int i = 0; same && i < t.rank; ++i) same = t.shape[i] == want[i];
    if (!same) return invalid(std::string(name) + ": shape must be " + dims_str(want) + ", got " + shape_str(t));
    return Status::ok();
  }

 private:
  bool shape_only_;
  Memory memory_;
};

RowStrides row_strides(const sinkattn_tensor_t& t, bool varlen) {
  if (varlen) return {0, t.strides[0], t.strides[1]};
  return {t.strides[0], t.strides[1], t.strides[2]};
}

LseStrides lse_strides(const sinkattn_tensor_t& t, bool varlen) {
  if (varlen) return {0, t.strides[0], t.strides[1]};
  return {t.strides[0], t.strides[1], t.strides[2]};
}

BiasStrides bias_strides(const sinkattn_tensor_t& t) {
  return {t.shape[0] == 1 ? 0 : t.strides[0], t.shape[1] == 1 ? 0 : t.strides[1], t.strides[2], t.strides[3]};
}

bool is_float_dtype(int32_t t) { return t == SINKATTN_F32 || t == SINKATTN_F16 || t == SINKATTN_BF16; }

// A batch tensor's int32 entries as host memory: the caller's pointer when the tensor is in host memory, else a
// copy of the span it covers read by device_to_host (ordered on the call's stream). `ok` is false when device
// contents cannot be read now (the stream is being captured into a CUDA graph): they are then not checked.
struct HostI32 {
  const int32_t* data = nullptr;
  int64_t stride = 1;
  std::vector<int32_t> copy;
  bool ok = false;
  int32_t operator[](int64_t i) const { return data[i * stride]; }
};

HostI32 host_view(const Call& c, const sinkattn_tensor_t& t, int64_t count) {
  HostI32 v;
  v.stride = t.strides[0];
  if (c.memory == Memory::kHost) {
    v.data = static_cast<const int32_t*>(t.data);
    v.ok = true;
    return v;
  }
  if (c.p->trust_device_batch_tensors) return v;  // the caller vouches for them: no read-back, no synchronisation
  const int64_t span = count > 0 ? (count - 1) * v.stride + 1 : 0;
  v.copy.resize(static_cast<size_t>(span));
  v.ok = span == 0 || device_to_host(t.data, v.copy.data(), static_cast<size_t>(span) * sizeof(int32_t), c.p->stream);
  v.data = v.copy.data();
  return v;
}

// Checks the contents of the int32 batch tensors (SPEC.md sections 1 and 4). In device memory they are read with a
// synchronising copy on the call's stream (b + 1 entries; the page table's b x max_pages), except while that stream
// is being captured into a CUDA graph, where nothing may synchronise, or when the caller sets
// trust_device_batch_tensors: the contents are then trusted.
Status check_batch_contents(const Call& c) {
  const sinkattn_params_t& p = *c.p;
  const bool paged = c.paged.on;
  // Keys of each sequence as the contents say: the cu_seqlens_kv differences (varlen without pages), capped by
  // seqused_kv when given; the bound they must respect is checked below.
  HostI32 used;
  if (c.plan.seqused_kv) {
    if (p.seqused_kv.data == nullptr) return Status::ok();  // shape-only
    used = host_view(c, p.seqused_kv, c.b);
    if (!used.ok) return Status::ok();
  }
  if (c.plan.varlen) {
    if (p.cu_seqlens_q.data == nullptr || (!paged && p.cu_seqlens_kv.data == nullptr)) return Status::ok();
    const HostI32 cq = host_view(c, p.cu_seqlens_q, c.b + 1);
    HostI32 ck;
    if (!paged) ck = host_view(c, p.cu_seqlens_kv, c.b + 1);
    if (!cq.ok || (!paged && !ck.ok)) return Status::ok();
    if (cq[0] != 0) return invalid("cu_seqlens_q: must start at 0, got " + std::to_string(cq[0]));
    if (!paged && ck[0] != 0) return invalid("cu_seqlens_kv: must start at 0, got " + std::to_string(ck[0]));
    for (int64_t n = 0; n < c.b; ++n) {
      const int64_t lq = int64_t(cq[n + 1]) - cq[n];
      if (lq < 0)
        return invalid("cu_seqlens_q: must be non-decreasing, but entry " + std::to_string(n + 1) + " (" +
                       std::to_string(cq[n + 1]) + ") < entry " + std::to_string(n) + " (" + std::to_string(cq[n]) + ")");
      if (lq > c.s_q)
        return invalid("max_seqlen_q: sequence " + std::to_string(n) + " has " + std::to_string(lq) +
                       " query rows, more than max_seqlen_q = " + std::to_string(c.s_q));
      if (paged) continue;  // key lengths: seqused_kv, checked below
      const int64_t lk = int64_t(ck[n + 1]) - ck[n];
      if (lk < 0)
        return invalid("cu_seqlens_kv: must be non-decreasing, but entry " + std::to_string(n + 1) + " (" +
                       std::to_string(ck[n + 1]) + ") < entry " + std::to_string(n) + " (" + std::to_string(ck[n]) + ")");
      if (lk > c.s_kv)
        return invalid("max_seqlen_kv: sequence " + std::to_string(n) + " has " + std::to_string(lk) +
                       " keys, more than max_seqlen_kv = " + std::to_string(c.s_kv));
      if (used.data != nullptr) {
        const int32_t u = used[n];
        if (u < 0 || u > lk)
          return invalid("seqused_kv: entry " + std::to_string(n) + " is " + std::to_string(u) +
                         ", must be in [0, cu_seqlens_kv[n+1] - cu_seqlens_kv[n]] = [0, " + std::to_string(lk) + "]");
      }
    }
    if (cq[c.b] > c.total_q)
      return invalid("cu_seqlens_q: last entry " + std::to_string(cq[c.b]) + " exceeds total_q = " +
                     std::to_string(c.total_q) + " (rows of q)");
    if (!paged && ck[c.b] > c.total_kv)
      return invalid("cu_seqlens_kv: last entry " + std::to_string(ck[c.b]) + " exceeds total_kv = " +
                     std::to_string(c.total_kv) + " (rows of k)");
  } else {
    const struct {
      bool used;
      const sinkattn_tensor_t& t;
      const char* name;
      const char* extent;
      int64_t max;
    } dense[] = {{c.plan.seqlens_q, p.seqlens_q, "seqlens_q", "s_q", c.s_q},
                 {c.plan.seqlens_kv, p.seqlens_kv, "seqlens_kv", "s_kv", c.s_kv}};
    for (const auto& d : dense) {
      if (!d.used || d.t.data == nullptr) continue;
      const HostI32 v = host_view(c, d.t, c.b);
      if (!v.ok) continue;
      for (int64_t n = 0; n < c.b; ++n) {
        const int32_t l = v[n];
        if (l < 0 || l > d.max)
          return invalid(std::string(d.name) + ": entry " + std::to_string(n) + " is " + std::to_string(l) +
                         ", must be in [0, " + d.extent + " = " + std::to_string(d.max) + "]");
      }
    }
  }
  if (!paged) return Status::ok();
  // Paged KV: seqused_kv[n] in [0, max_pages * page_size] (and max_seqlen_kv for varlen queries); the page table
  // entries a sequence uses, n < b and p < ceil(seqused_kv[n] / page_size), in [0, num_pages). Entries past them are
  // never read (SPEC.md section 1), here neither.
  const int64_t cap = c.paged.capacity();
  const int64_t bound = c.plan.varlen ? std::min(cap, c.s_kv) : cap;
  for (int64_t n = 0; n < c.b; ++n) {
    const int32_t u = used[n];
    if (u < 0 || u > bound)
      return invalid("seqused_kv: entry " + std::to_string(n) + " is " + std::to_string(u) + ", must be in [0, " +
                     (c.plan.varlen && c.s_kv < cap ? "max_seqlen_kv = " + std::to_string(c.s_kv)
                                                    : "max_pages * page_size = " + std::to_string(cap)) +
                     "]");
  }
  if (p.page_table.data == nullptr) return Status::ok();
  HostI32 table;
  if (c.memory == Memory::kHost) {
    table = host_view(c, p.page_table, 0);
  } else if (!p.trust_device_batch_tensors) {
    // One read-back of the span the table covers: (b - 1) * pt_n + (max_pages - 1) * pt_p + 1 entries.
    const int64_t span = c.b > 0 && c.paged.max_pages > 0
                             ? (c.b - 1) * c.paged.pt_n + (c.paged.max_pages - 1) * c.paged.pt_p + 1
                             : 0;
    table.copy.resize(static_cast<size_t>(span));
    table.ok = span == 0 || device_to_host(p.page_table.data, table.copy.data(),
                                           static_cast<size_t>(span) * sizeof(int32_t), p.stream);
    table.data = table.copy.data();
  }
  if (!table.ok) return Status::ok();
  for (int64_t n = 0; n < c.b; ++n) {
    const int64_t pages = (int64_t(used[n]) + c.paged.page_size - 1) / c.paged.page_size;
    for (int64_t pg = 0; pg < pages; ++pg) {
      const int32_t e = table.data[n * c.paged.pt_n + pg * c.paged.pt_p];
      if (e < 0 || e >= c.paged.num_pages)
        return invalid("page_table: entry [" + std::to_string(n) + ", " + std::to_string(pg) + "] is " +
                       std::to_string(e) + ", must be a page of k / v in [0, num_pages = " +
                       std::to_string(c.paged.num_pages) + ") (sequence " + std::to_string(n) + " uses " +
                       std::to_string(pages) + " pages for seqused_kv = " + std::to_string(used[n]) + ")");
    }
  }
  return Status::ok();
}

}  // namespace

TensorPlan decide_tensors(const sinkattn_params_t& p, Pass pass) {
  TensorPlan t;
  const bool backward = pass == Pass::kBackward;
  const bool learnable = p.softmax_type == SINKATTN_SOFTMAX_LEARNABLE;
  t.varlen = present(p.cu_seqlens_q) || present(p.cu_seqlens_kv);
  t.seqused_kv = present(p.seqused_kv);
  t.seqlens_q = present(p.seqlens_q);
  t.seqlens_kv = present(p.seqlens_kv);
  t.page_table = present(p.page_table);
  t.dropout = p.dropout_p > 0.0;
  t.sinks = learnable ? Use::kRequired : Use::kAbsent;
  t.bias = present(p.bias) ? Use::kRequired : Use::kAbsent;
  t.d_sinks = backward && learnable ? Use::kRequired : Use::kAbsent;
  t.d_bias = backward && present(p.bias) ? Use::kRequired : Use::kAbsent;
  t.d_lse = backward && present(p.d_lse) ? Use::kRequired : Use::kAbsent;
  // Forward: rng_state is an optional output (written when given). Backward: required input with dropout.
  t.rng_state = backward ? (t.dropout ? Use::kRequired : Use::kAbsent)
                         : (present(p.rng_state) ? Use::kRequired : Use::kAbsent);
  return t;
}

Status resolve_call(const sinkattn_params_t* pp, Pass pass, bool shape_only, Call* out) {
  if (pp == nullptr) return invalid("params: pointer is NULL");
  const sinkattn_params_t& p = *pp;
  Call c;
  c.p = pp;
  c.pass = pass;
  const bool backward = pass == Pass::kBackward;

  // ---- options ----
  const int32_t softmax_type = enum_bits(p.softmax_type), alignment = enum_bits(p.mask_alignment),
                backend_id = enum_bits(p.backend);
  if (softmax_type != SINKATTN_SOFTMAX_VANILLA && softmax_type != SINKATTN_SOFTMAX_OFF_BY_ONE &&
      softmax_type != SINKATTN_SOFTMAX_LEARNABLE)
    return invalid("softmax_type: must be VANILLA, OFF_BY_ONE or LEARNABLE, got " + std::to_string(softmax_type));
  if (alignment != SINKATTN_ALIGN_BOTTOM_RIGHT && alignment != SINKATTN_ALIGN_TOP_LEFT)
    return invalid("mask_alignment: must be BOTTOM_RIGHT or TOP_LEFT, got " + std::to_string(alignment));
  if (backend_id != SINKATTN_BACKEND_AUTO && backend_id != SINKATTN_BACKEND_CPU && backend_id != SINKATTN_BACKEND_CUDA)
    return invalid("backend: must be AUTO, CPU or CUDA, got " + std::to_string(backend_id));
  if (!(p.dropout_p >= 0.0 && p.dropout_p < 1.0))
    return invalid("dropout_p: must be in [0, 1), got " + std::to_string(p.dropout_p));
  if (!std::isnan(p.softmax_scale) && !std::isfinite(p.softmax_scale))
    return invalid("softmax_scale: must be finite (or NaN for the default 1/sqrt(d))");
  if (p.num_threads < 0) return invalid("num_threads: must be >= 0 (0 = all cores), got " + std::to_string(p.num_threads));
  if (p.num_splits < 0)
    return invalid("num_splits: must be >= 0 (0 = the backend's heuristic, 1 = no split), got " +
                   std::to_string(p.num_splits));

  // ---- memory: q decides ----
  if (p.q.rank <= 0) return invalid("q: is required (rank 0 means absent)");
  if (p.q.data != nullptr) {
    c.memory = pointer_memory(p.q.data);
  } else {
    if (!shape_only) return invalid("q: data pointer is NULL");
    c.memory = p.backend == SINKATTN_BACKEND_CUDA ? Memory::kDevice : Memory::kHost;
  }
  const Checker chk(shape_only, c.memory);
  c.plan = decide_tensors(p, pass);
  const TensorPlan& plan = c.plan;
  const bool varlen = plan.varlen;
  const bool paged = plan.page_table;
  if (paged && backward)
    return invalid("page_table: paged KV is forward only (SPEC.md section 1); a backward with a page table is "
                   "rejected");
  c.num_splits = p.num_splits;

  // ---- q, k, v ----
  SINKATTN_RETURN_IF_ERROR(chk.basic("q", p.q));
  if (!is_float_dtype(enum_bits(p.q.dtype)))
    return invalid(std::string("q: dtype must be fp32, fp16 or bf16, got ") + dtype_name(enum_bits(p.q.dtype)));
  c.dtype = p.q.dtype;
  const int qrank = varlen ? 3 : 4;
  const char* qlayout = varlen ? "[total_q, h_q, d] (varlen)" : "[b, s_q, h_q, d] (dense)";
  if (p.q.rank != qrank)
    return invalid("q: rank must be " + std::to_string(qrank) + " for " + qlayout + ", got " + std::to_string(p.q.rank));
  // Paged KV (SPEC.md section 1): k, v are page pools [num_pages, page_size, h_kv, d | d_v] whatever q's layout.
  const int kvrank = paged ? 4 : qrank;
  for (const auto& [name, t] : {std::pair<const char*, const sinkattn_tensor_t*>{"k", &p.k}, {"v", &p.v}}) {
    if (!present(*t)) return invalid(std::string(name) + ": is required");
    SINKATTN_RETURN_IF_ERROR(chk.basic(name, *t));
    SINKATTN_RETURN_IF_ERROR(chk.dtype(name, *t, c.dtype, "q"));
    if (paged && t->rank != 4)
      return invalid(std::string(name) + ": with a page_table it is a page pool [num_pages, page_size, h_kv, " +
                     (t == &p.k ? "d" : "d_v") + "] (rank 4), got rank " + std::to_string(t->rank));
    if (t->rank != kvrank)
      return invalid(std::string(name) + ": rank must be " + std::to_string(qrank) + " like q, got " +
                     std::to_string(t->rank));
  }
  const int o = varlen ? 0 : 1;  // offset of the row dimension of q
  const int ok = paged ? 1 : o;  // offset of the row dimension of k / v (the row within a page when paged)
  if (varlen) {
    c.total_q = p.q.shape[0];
    c.total_kv = p.k.shape[0];
  } else {
    c.b = p.q.shape[0];
    c.s_q = p.q.shape[1];
    c.s_kv = p.k.shape[1];
    if (!paged && (p.k.shape[0] != c.b || p.v.shape[0] != c.b))
      return invalid("k: batch size must equal q's (" + std::to_string(c.b) + "), got k " + shape_str(p.k) + ", v " +
                     shape_str(p.v));
  }
  c.h_q = p.q.shape[o + 1];
  c.d = p.q.shape[o + 2];
  c.h_kv = p.k.shape[ok + 1];
  c.d_v = p.v.shape[ok + 2];
  if (paged) {
    c.paged.on = true;
    c.paged.num_pages = p.k.shape[0];
    c.paged.page_size = p.k.shape[1];
    c.total_kv = c.paged.num_pages * c.paged.page_size;  // rows of the pools
    if (c.paged.page_size < 1)
      return invalid("k: page_size (dimension 1 of the page pool) must be >= 1, got " + shape_str(p.k));
    if (p.v.shape[0] != p.k.shape[0] || p.v.shape[1] != p.k.shape[1])
      return invalid("v: page pool must have the num_pages and page_size of k (" + shape_str(p.k) + "), got " +
                     shape_str(p.v));
  }
  if (p.v.shape[ok] != p.k.shape[ok])
    return invalid("v: must have as many rows as k (" + std::to_string(p.k.shape[ok]) + "), got " + shape_str(p.v));
  if (p.v.shape[ok + 1] != c.h_kv)
    return invalid("v: must have h_kv = " + std::to_string(c.h_kv) + " heads like k, got " + shape_str(p.v));
  if (p.k.shape[ok + 2] != c.d)
    return invalid("k: head dim must equal q's d = " + std::to_string(c.d) + ", got " + shape_str(p.k));
  if (c.h_q < 1) return invalid("q: h_q must be >= 1, got " + shape_str(p.q));
  if (c.h_kv < 1) return invalid("k: h_kv must be >= 1, got " + shape_str(p.k));
  if (c.d < 1) return invalid("q: head dim d must be >= 1, got " + shape_str(p.q));
  if (c.d_v < 1) return invalid("v: head dim d_v must be >= 1, got " + shape_str(p.v));
  if (c.h_q % c.h_kv != 0)
    return invalid("k: h_q % h_kv must be 0 (query head h reads KV head h / (h_q / h_kv)), got h_q = " +
                   std::to_string(c.h_q) + ", h_kv = " + std::to_string(c.h_kv));
  c.group = c.h_q / c.h_kv;

  // ---- batch description ----
  if (varlen) {
    if (paged && present(p.cu_seqlens_kv))
      return invalid("cu_seqlens_kv: with a page_table k and v are page pools and the key lengths are seqused_kv; "
                     "cu_seqlens_kv must be absent (varlen queries give cu_seqlens_q only)");
    if (!present(p.cu_seqlens_q) || (!paged && !present(p.cu_seqlens_kv)))
      return invalid(std::string(present(p.cu_seqlens_q) ? "cu_seqlens_kv" : "cu_seqlens_q") +
                     ": varlen needs both cu_seqlens_q and cu_seqlens_kv");
    SINKATTN_RETURN_IF_ERROR(chk.basic("cu_seqlens_q", p.cu_seqlens_q));
    SINKATTN_RETURN_IF_ERROR(chk.dtype("cu_seqlens_q", p.cu_seqlens_q, SINKATTN_I32));
    if (p.cu_seqlens_q.rank != 1 || p.cu_seqlens_q.shape[0] < 1)
      return invalid("cu_seqlens_q: shape must be [b + 1] with b >= 0, got " + shape_str(p.cu_seqlens_q));
    c.b = p.cu_seqlens_q.shape[0] - 1;
    if (!paged) SINKATTN_RETURN_IF_ERROR(chk.exact("cu_seqlens_kv", p.cu_seqlens_kv, SINKATTN_I32, {c.b + 1}));
    if (plan.seqused_kv) SINKATTN_RETURN_IF_ERROR(chk.exact("seqused_kv", p.seqused_kv, SINKATTN_I32, {c.b}));
    if (plan.seqlens_q || plan.seqlens_kv)
      return invalid(std::string(plan.seqlens_q ? "seqlens_q" : "seqlens_kv") +
                     ": is for dense batches; varlen calls use cu_seqlens_q / cu_seqlens_kv / seqused_kv");
    if (p.max_seqlen_q < 0) return invalid("max_seqlen_q: must be >= 0 for varlen, got " + std::to_string(p.max_seqlen_q));
    if (p.max_seqlen_kv < 0)
      return invalid("max_seqlen_kv: must be >= 0 for varlen, got " + std::to_string(p.max_seqlen_kv));
    c.s_q = p.max_seqlen_q;
    c.s_kv = p.max_seqlen_kv;
  } else {
    if (plan.seqused_kv && !paged)
      return invalid("seqused_kv: needs a varlen call (cu_seqlens_q / cu_seqlens_kv) or a page_table");
    if (plan.seqused_kv) SINKATTN_RETURN_IF_ERROR(chk.exact("seqused_kv", p.seqused_kv, SINKATTN_I32, {c.b}));
    if (plan.seqlens_q) SINKATTN_RETURN_IF_ERROR(chk.exact("seqlens_q", p.seqlens_q, SINKATTN_I32, {c.b}));
    if (plan.seqlens_kv && paged)
      return invalid("seqlens_kv: with a page_table the key lengths are seqused_kv (SPEC.md section 1); seqlens_kv "
                     "must be absent");
    if (plan.seqlens_kv) SINKATTN_RETURN_IF_ERROR(chk.exact("seqlens_kv", p.seqlens_kv, SINKATTN_I32, {c.b}));
  }
  if (paged) {
    // page_table int32 [b, max_pages], memory of q; seqused_kv [b] required (SPEC.md section 1).
    SINKATTN_RETURN_IF_ERROR(chk.basic("page_table", p.page_table));
    SINKATTN_RETURN_IF_ERROR(chk.dtype("page_table", p.page_table, SINKATTN_I32));
    if (p.page_table.rank != 2 || p.page_table.shape[0] != c.b)
      return invalid("page_table: shape must be [b, max_pages] with b = " + std::to_string(c.b) + ", got " +
                     shape_str(p.page_table));
    if (!plan.seqused_kv)
      return invalid("seqused_kv: is required with a page_table (int32 [b]: the keys of each sequence, SPEC.md "
                     "section 1)");
    c.paged.max_pages = p.page_table.shape[1];
    c.paged.pt_n = p.page_table.strides[0];
    c.paged.pt_p = p.page_table.strides[1];
    if (!varlen) c.s_kv = c.paged.capacity();  // dense queries: the most keys a sequence can hold
    if (plan.bias == Use::kRequired)
      return invalid("bias: is not defined with a page_table (paged KV is for inference, SPEC.md section 1)");
    if (plan.dropout)
      return invalid("dropout_p: must be 0 with a page_table (paged KV is for inference, SPEC.md section 1), got " +
                     std::to_string(p.dropout_p));
  }

  // ---- sinks, bias ----
  c.softmax_type = p.softmax_type;
  if (plan.sinks == Use::kRequired) {
    if (!present(p.sinks)) return invalid("sinks: softmax_type LEARNABLE requires sinks (fp32 [h_q])");
    SINKATTN_RETURN_IF_ERROR(chk.exact("sinks", p.sinks, SINKATTN_F32, {c.h_q}));
  }
  if (plan.bias == Use::kRequired) {
    if (varlen) return invalid("bias: is not defined for varlen calls (SPEC.md section 1)");
    SINKATTN_RETURN_IF_ERROR(chk.basic("bias", p.bias));
    if (enum_bits(p.bias.dtype) != SINKATTN_F32 && enum_bits(p.bias.dtype) != c.dtype)
      return invalid(std::string("bias: dtype must be fp32 or the dtype of q (") + dtype_name(c.dtype) + "), got " +
                     dtype_name(enum_bits(p.bias.dtype)));
    const auto& s = p.bias.shape;
    if (p.bias.rank != 4 || !(s[0] == c.b || s[0] == 1) || !(s[1] == c.h_q || s[1] == 1) || s[2] != c.s_q ||
        s[3] != c.s_kv)
      return invalid("bias: shape must be [b or 1, h_q or 1, s_q, s_kv] = [" + std::to_string(c.b) + "|1, " +
                     std::to_string(c.h_q) + "|1, " + std::to_string(c.s_q) + ", " + std::to_string(c.s_kv) +
                     "], got " + shape_str(p.bias));
    c.bias_dtype = p.bias.dtype;
    c.bias = bias_strides(p.bias);
    c.bias_per_head = p.bias.shape[1] != 1;
  }

  // ---- resolved options ----
  c.softmax_scale = std::isnan(p.softmax_scale) ? static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.d)))
                                                : p.softmax_scale;
  // The one window clamp (common/mask.hpp): -1 = unbounded; windows of s_q + s_kv or more restrict nothing.
  c.window_left = clamp_window(p.window_left, c.s_q, c.s_kv);
  c.window_right = clamp_window(p.window_right, c.s_q, c.s_kv);
  c.alignment = p.mask_alignment;
  c.dropout_p = p.dropout_p;
  c.dropout_threshold = dropout_threshold(p.dropout_p);
  c.deterministic = p.deterministic != 0;

  // ---- shapes of out / lse (inputs of the backward, outputs of the forward) ----
  const std::vector<int64_t> out_shape =
      varlen ? std::vector<int64_t>{c.total_q, c.h_q, c.d_v} : std::vector<int64_t>{c.b, c.s_q, c.h_q, c.d_v};
  const std::vector<int64_t> lse_shape =
      varlen ? std::vector<int64_t>{c.h_q, c.total_q} : std::vector<int64_t>{c.b, c.h_q, c.s_q};
  const auto shape_of = [](const sinkattn_tensor_t& t) { return std::vector<int64_t>(t.shape, t.shape + t.rank); };
  const auto required = [&](const char* name, const sinkattn_tensor_t& t, sinkattn_dtype_t dt,
                            const std::vector<int64_t>& shape, const char* like = nullptr) -> Status {
    if (!present(t)) return invalid(std::string(name) + ": is required for the " + (backward ? "backward" : "forward"));
    return chk.exact(name, t, dt, shape, like);
  };
  SINKATTN_RETURN_IF_ERROR(required("out", p.out, c.dtype, out_shape, "q"));
  SINKATTN_RETURN_IF_ERROR(required("softmax_lse", p.softmax_lse, SINKATTN_F32, lse_shape));
  c.out = row_strides(p.out, varlen);
  c.lse = lse_strides(p.softmax_lse, varlen);
  c.q = row_strides(p.q, varlen);
  c.k = row_strides(p.k, varlen && !paged);  // paged: {page, row in page, head}
  c.v = row_strides(p.v, varlen && !paged);

  if (plan.rng_state == Use::kRequired) {
    if (!present(p.rng_state)) return invalid("rng_state: the backward with dropout_p > 0 requires rng_state (int64 [2])");
    SINKATTN_RETURN_IF_ERROR(chk.exact("rng_state", p.rng_state, SINKATTN_I64, {2}));
  }
  if (!backward && present(p.rng_seed_offset))
    SINKATTN_RETURN_IF_ERROR(chk.exact("rng_seed_offset", p.rng_seed_offset, SINKATTN_I64, {2}));

  if (backward) {
    SINKATTN_RETURN_IF_ERROR(required("d_out", p.d_out, c.dtype, out_shape, "q"));
    SINKATTN_RETURN_IF_ERROR(required("dq", p.dq, c.dtype, shape_of(p.q), "q"));
    SINKATTN_RETURN_IF_ERROR(required("dk", p.dk, c.dtype, shape_of(p.k), "q"));
    SINKATTN_RETURN_IF_ERROR(required("dv", p.dv, c.dtype, shape_of(p.v), "q"));
    c.d_out = row_strides(p.d_out, varlen);
    c.dq = row_strides(p.dq, varlen);
    c.dk = row_strides(p.dk, varlen);
    c.dv = row_strides(p.dv, varlen);
    if (plan.d_lse == Use::kRequired) {
      SINKATTN_RETURN_IF_ERROR(chk.exact("d_lse", p.d_lse, SINKATTN_F32, lse_shape));
      c.d_lse = lse_strides(p.d_lse, varlen);
    }
    if (plan.d_sinks == Use::kRequired) {
      if (!present(p.d_sinks)) return invalid("d_sinks: softmax_type LEARNABLE requires d_sinks (fp32 [h_q]) in the backward");
      SINKATTN_RETURN_IF_ERROR(chk.exact("d_sinks", p.d_sinks, SINKATTN_F32, {c.h_q}));
    }
    if (plan.d_bias == Use::kRequired) {
      if (!present(p.d_bias)) return invalid("d_bias: a backward with bias requires d_bias (shape and dtype of bias)");
      SINKATTN_RETURN_IF_ERROR(chk.exact("d_bias", p.d_bias, p.bias.dtype, shape_of(p.bias), "bias"));
      c.d_bias = bias_strides(p.d_bias);
    }
  }

  SINKATTN_RETURN_IF_ERROR(check_batch_contents(c));
  *out = c;
  return Status::ok();
}

BatchTensors batch_tensors(const Call& c) {
  const sinkattn_params_t& p = *c.p;
  BatchTensors bt;
  bt.varlen = c.plan.varlen ? 1 : 0;
  bt.s_q = c.s_q;
  bt.s_kv = c.s_kv;
  const auto take = [](const sinkattn_tensor_t& t, const int32_t*& ptr, int64_t& st) {
    ptr = static_cast<const int32_t*>(t.data);  // host or device memory: not dereferenced here
    st = t.strides[0];
  };
  if (c.plan.varlen) {
    take(p.cu_seqlens_q, bt.cu_seqlens_q, bt.cu_q_st);
    if (!c.paged.on) take(p.cu_seqlens_kv, bt.cu_seqlens_kv, bt.cu_kv_st);
  } else {
    if (c.plan.seqlens_q) take(p.seqlens_q, bt.seqlens_q, bt.seqlens_q_st);
    if (c.plan.seqlens_kv) take(p.seqlens_kv, bt.seqlens_kv, bt.seqlens_kv_st);
  }
  // seqused_kv: the keys used (varlen), the keys in the pages (paged KV: the sequence's key count, kv_start 0).
  if (c.plan.seqused_kv) take(p.seqused_kv, bt.seqused_kv, bt.seqused_st);
  if (c.paged.on) bt.page_table = static_cast<const int32_t*>(p.page_table.data);
  return bt;
}

}  // namespace sinkattn

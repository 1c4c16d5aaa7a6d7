// Call capture files and result files (SPEC.md section 6). See capture.hpp.
#include "capture.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "dtype.hpp"

namespace sinkattn::cli {

using nlohmann::json;

const std::vector<std::string> kInputNames = {"q",           "k",           "v",          "sinks",
                                              "bias",        "d_out",       "d_lse",      "cu_seqlens_q",
                                              "cu_seqlens_kv", "seqused_kv", "seqlens_q", "seqlens_kv",
                                              "page_table"};

const std::vector<std::string> kResultNames = {"out", "softmax_lse", "d_q",    "d_k",      "d_v",
                                               "d_sinks", "d_bias",  "rng_state"};

namespace {

// Any present tensor needs a non-NULL pointer, also when it has no elements.
alignas(16) uint8_t g_empty_storage[16];

constexpr uint64_t kMaxHeaderBytes = 100u << 20;  // a sane bound; real headers are a few KB

[[noreturn]] void fail(const std::string& msg) { throw CaptureError(msg); }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string r = "[";
  for (size_t i = 0; i < s.size(); ++i) r += (i ? ", " : "") + std::to_string(s[i]);
  return r + "]";
}

template <class T>
T parse_number(const std::string& key, const std::string& value, const char* what) {
  T v{};
  const char* b = value.data();
  const char* e = b + value.size();
  auto [ptr, ec] = std::from_chars(b, e, v);
  if (ec != std::errc() || ptr != e || value.empty())
    fail("capture: __metadata__ key '" + key + "' = '" + value + "' is not " + what);
  return v;
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// HostTensor

HostTensor::HostTensor(sinkattn_dtype_t t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
  bytes.assign(static_cast<size_t>(numel() * dtype_size(dtype)), 0);
}

int64_t HostTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

sinkattn_tensor_t HostTensor::view() const {
  sinkattn_tensor_t t{};
  t.data = bytes.empty() ? static_cast<void*>(g_empty_storage) : const_cast<uint8_t*>(bytes.data());
  t.dtype = dtype;
  t.rank = static_cast<int32_t>(shape.size());
  int64_t stride = 1;
  for (int i = t.rank - 1; i >= 0; --i) {
    t.shape[i] = shape[i];
    t.strides[i] = stride;
    stride *= std::max<int64_t>(shape[i], 1);
  }
  return t;
}
sinkattn_tensor_t HostTensor::view() { return static_cast<const HostTensor*>(this)->view(); }

void HostTensor::fill_nan() {
  const int64_t n = numel();
  if (is_float_dtype(dtype)) {
    for (int64_t i = 0; i < n; ++i) store_float(bytes.data(), dtype, i, std::numeric_limits<float>::quiet_NaN());
  } else {
    std::fill(bytes.begin(), bytes.end(), uint8_t{0xA5});  // an unlikely bit pattern for integer outputs
  }
}

const HostTensor& Capture::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) fail("capture: tensor '" + name + "' is missing");
  return it->second;
}

// ---------------------------------------------------------------------------------------------------------
// safetensors container

Capture parse_safetensors(const std::vector<uint8_t>& file, const std::string& what) {
  Capture cap;
  if (file.size() < 8)
    fail(what + ": truncated: " + std::to_string(file.size()) + " bytes, shorter than the 8-byte header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file[i];
  if (n > file.size() - 8 || n > kMaxHeaderBytes)
    fail(what + ": header length " + std::to_string(n) + " exceeds the file (" + std::to_string(file.size()) +
         " bytes): truncated or not a safetensors file");
  const char* hb = reinterpret_cast<const char*>(file.data() + 8);
  json header = json::parse(hb, hb + n, nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) fail(what + ": header is not valid JSON");
  if (!header.is_object()) fail(what + ": header is not a JSON object");
  const uint64_t data_size = file.size() - 8 - n;
  const uint8_t* data = file.data() + 8 + n;

  struct Span {
    uint64_t b, e;
    std::string name;
  };
  std::vector<Span> spans;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) fail(what + ": __metadata__ is not an object");
      for (auto& [k, v] : entry.items()) {
        if (!v.is_string()) fail(what + ": __metadata__ key '" + k + "' is not a string (safetensors metadata is strings only)");
        cap.metadata[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = what + ": tensor '" + name + "'";
    if (!entry.is_object()) fail(where + ": entry is not an object");
    if (!entry.contains("dtype") || !entry["dtype"].is_string()) fail(where + ": missing string 'dtype'");
    const std::string dt = entry["dtype"].get<std::string>();
    auto dtype = dtype_from_name(dt);
    if (!dtype) fail(where + ": unsupported dtype '" + dt + "' (F32, F16, BF16, I32, I64)");
    if (!entry.contains("shape") || !entry["shape"].is_array()) fail(where + ": missing array 'shape'");
    if (entry["shape"].size() > SINKATTN_MAX_RANK)
      fail(where + ": rank " + std::to_string(entry["shape"].size()) + " exceeds " + std::to_string(SINKATTN_MAX_RANK));
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (auto& d : entry["shape"]) {
      if (!d.is_number_unsigned()) fail(where + ": shape entries must be non-negative integers");
      const uint64_t v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40)) fail(where + ": dimension " + std::to_string(v) + " is too large");
      if (v != 0 && numel > (uint64_t{1} << 56) / v) fail(where + ": element count overflows");
      numel *= v;
      shape.push_back(static_cast<int64_t>(v));
    }
    if (!entry.contains("data_offsets") || !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2 ||
        !entry["data_offsets"][0].is_number_unsigned() || !entry["data_offsets"][1].is_number_unsigned())
      fail(where + ": 'data_offsets' must be two non-negative integers [begin, end]");
    const uint64_t b = entry["data_offsets"][0].get<uint64_t>();
    const uint64_t e = entry["data_offsets"][1].get<uint64_t>();
    if (b > e) fail(where + ": data_offsets begin " + std::to_string(b) + " > end " + std::to_string(e));
    if (e > data_size)
      fail(where + ": data_offsets end " + std::to_string(e) + " is past the data section (" +
           std::to_string(data_size) + " bytes): truncated file or offsets out of range");
    const uint64_t want = numel * static_cast<uint64_t>(dtype_size(*dtype));
    if (e - b != want)
      fail(where + ": data_offsets span " + std::to_string(e - b) + " bytes but dtype " + dt + " and shape " +
           shape_str(shape) + " need " + std::to_string(want));
    if (e > b) spans.push_back({b, e, name});
    HostTensor t;
    t.dtype = *dtype;
    t.shape = std::move(shape);
    t.bytes.assign(data + b, data + e);
    cap.tensors[name] = std::move(t);
  }
  std::sort(spans.begin(), spans.end(), [](const Span& x, const Span& y) { return x.b < y.b; });
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].b < spans[i - 1].e)
      fail(what + ": tensors '" + spans[i - 1].name + "' and '" + spans[i].name + "' overlap in the data section");
  return cap;
}

std::vector<uint8_t> serialize_safetensors(const std::vector<std::pair<std::string, const HostTensor*>>& tensors,
                                           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  uint64_t off = 0;
  for (auto& [name, t] : tensors) {
    header[name] = {{"dtype", dtype_name(t->dtype)}, {"shape", t->shape}, {"data_offsets", {off, off + t->bytes.size()}}};
    off += t->bytes.size();
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::string h = header.dump();
  while (h.size() % 8 != 0) h.push_back(' ');  // safetensors pads the header to 8 bytes with spaces
  std::vector<uint8_t> out(8 + h.size() + off);
  uint64_t n = h.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, h.data(), h.size());
  uint8_t* p = out.data() + 8 + h.size();
  for (auto& [name, t] : tensors) {
    if (!t->bytes.empty()) std::memcpy(p, t->bytes.data(), t->bytes.size());
    p += t->bytes.size();
  }
  return out;
}

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open '" + path + "' for reading");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (f.bad()) fail("error reading '" + path + "'");
  return bytes;
}

void write_file(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) fail("cannot open '" + path + "' for writing");
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  f.close();
  if (!f) fail("error writing '" + path + "'");
}

// ---------------------------------------------------------------------------------------------------------
// options (SPEC.md section 6: `__metadata__`, all strings; a missing key takes the default)

CaptureOptions parse_options(const std::map<std::string, std::string>& md) {
  CaptureOptions o;
  auto get = [&](const char* k) -> const std::string* {
    auto it = md.find(k);
    return it == md.end() ? nullptr : &it->second;
  };
  if (auto* v = get("softmax_type")) {
    if (*v == "vanilla") o.softmax_type = SINKATTN_SOFTMAX_VANILLA;
    else if (*v == "off_by_one") o.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE;
    else if (*v == "learnable") o.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
    else fail("capture: __metadata__ key 'softmax_type' = '" + *v + "' is not vanilla|off_by_one|learnable");
  }
  if (auto* v = get("softmax_scale")) {
    const double s = parse_number<double>("softmax_scale", *v, "a number");
    if (!std::isfinite(s)) fail("capture: __metadata__ key 'softmax_scale' = '" + *v + "' is not finite");
    o.softmax_scale = static_cast<float>(s);
  }
  if (auto* v = get("window_left")) o.window_left = parse_number<int64_t>("window_left", *v, "an integer");
  if (auto* v = get("window_right")) o.window_right = parse_number<int64_t>("window_right", *v, "an integer");
  if (auto* v = get("mask_alignment")) {
    if (*v == "bottom_right") o.mask_alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
    else if (*v == "top_left") o.mask_alignment = SINKATTN_ALIGN_TOP_LEFT;
    else fail("capture: __metadata__ key 'mask_alignment' = '" + *v + "' is not top_left|bottom_right");
  }
  if (auto* v = get("dropout_p")) o.dropout_p = parse_number<double>("dropout_p", *v, "a number");
  if (auto* v = get("seed")) o.seed = parse_number<uint64_t>("seed", *v, "an unsigned 64-bit decimal");
  if (auto* v = get("offset")) o.offset = parse_number<uint64_t>("offset", *v, "an unsigned 64-bit decimal");
  if (auto* v = get("deterministic")) {
    if (*v == "0") o.deterministic = false;
    else if (*v == "1") o.deterministic = true;
    else fail("capture: __metadata__ key 'deterministic' = '" + *v + "' is not 0|1");
  }
  if (auto* v = get("max_seqlen_q")) o.max_seqlen_q = parse_number<int64_t>("max_seqlen_q", *v, "an integer");
  if (auto* v = get("max_seqlen_kv")) o.max_seqlen_kv = parse_number<int64_t>("max_seqlen_kv", *v, "an integer");
  return o;
}

std::map<std::string, std::string> format_options(const CaptureOptions& o) {
  std::map<std::string, std::string> md;
  md["softmax_type"] = o.softmax_type == SINKATTN_SOFTMAX_LEARNABLE    ? "learnable"
                       : o.softmax_type == SINKATTN_SOFTMAX_OFF_BY_ONE ? "off_by_one"
                                                                       : "vanilla";
  if (o.softmax_scale) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.9g", static_cast<double>(*o.softmax_scale));  // round-trips an fp32
    md["softmax_scale"] = buf;
  }
  md["window_left"] = std::to_string(o.window_left);
  md["window_right"] = std::to_string(o.window_right);
  md["mask_alignment"] = o.mask_alignment == SINKATTN_ALIGN_TOP_LEFT ? "top_left" : "bottom_right";
  {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", o.dropout_p);
    md["dropout_p"] = buf;
  }
  md["seed"] = std::to_string(o.seed);
  md["offset"] = std::to_string(o.offset);
  md["deterministic"] = o.deterministic ? "1" : "0";
  if (o.max_seqlen_q) md["max_seqlen_q"] = std::to_string(*o.max_seqlen_q);
  if (o.max_seqlen_kv) md["max_seqlen_kv"] = std::to_string(*o.max_seqlen_kv);
  return md;
}

// ---------------------------------------------------------------------------------------------------------
// semantic checks the command needs (the library validates the rest)

void validate_capture(const Capture& c) {
  for (const char* n : {"q", "k", "v"})
    if (!c.has(n)) fail(std::string("capture: required tensor '") + n + "' is missing (SPEC.md section 6)");
  const HostTensor& q = c.at("q");
  if (!is_float_dtype(q.dtype))
    fail(std::string("capture: tensor 'q' has dtype ") + dtype_name(q.dtype) + ", expected F32, F16 or BF16");
  if (q.shape.size() != 4 && q.shape.size() != 3)
    fail("capture: tensor 'q' has shape " + shape_str(q.shape) +
         ": expected rank 4 [b, s_q, h_q, d] (dense) or rank 3 [total_q, h_q, d] (varlen)");
  const bool paged = c.paged();
  for (const char* n : {"k", "v", "d_out"}) {
    if (!c.has(n)) continue;
    const HostTensor& t = c.at(n);
    if (t.dtype != q.dtype)
      fail(std::string("capture: tensor '") + n + "' has dtype " + dtype_name(t.dtype) + ", expected the dtype of q (" +
           dtype_name(q.dtype) + ")");
    const bool pool = paged && std::string(n) != "d_out";  // with page_table, k and v are page pools (rank 4)
    if (pool && t.shape.size() != 4)
      fail(std::string("capture: tensor '") + n + "' has rank " + std::to_string(t.shape.size()) +
           ", expected a page pool [num_pages, page_size, h_kv, d] (rank 4) with page_table");
    if (!pool && t.shape.size() != q.shape.size())
      fail(std::string("capture: tensor '") + n + "' has rank " + std::to_string(t.shape.size()) +
           ", expected the rank of q (" + std::to_string(q.shape.size()) + ")");
  }
  if (paged) {
    const HostTensor& t = c.at("page_table");
    if (t.dtype != SINKATTN_I32 || t.shape.size() != 2)
      fail(std::string("capture: tensor 'page_table' must be I32 [b, max_pages], got ") + dtype_name(t.dtype) + " " +
           shape_str(t.shape));
    if (!c.has("seqused_kv")) fail("capture: page_table needs tensor 'seqused_kv' (the keys of each sequence)");
    if (c.has("cu_seqlens_kv"))
      fail("capture: page_table with cu_seqlens_kv: with a page table the key lengths are seqused_kv (SPEC.md section 1)");
  }
  for (const char* n : {"cu_seqlens_q", "cu_seqlens_kv", "seqused_kv", "seqlens_q", "seqlens_kv"}) {
    if (!c.has(n)) continue;
    const HostTensor& t = c.at(n);
    if (t.dtype != SINKATTN_I32 || t.shape.size() != 1)
      fail(std::string("capture: tensor '") + n + "' must be I32 of rank 1, got " + dtype_name(t.dtype) + " " +
           shape_str(t.shape));
  }
  const bool varlen = q.shape.size() == 3;
  if (varlen && paged) {
    if (!c.has("cu_seqlens_q")) fail("capture: q has rank 3 (varlen) but cu_seqlens_q is not given");
    if (c.at("cu_seqlens_q").shape[0] < 1) fail("capture: cu_seqlens_q must have b + 1 >= 1 entries");
  } else if (varlen) {
    if (!c.has("cu_seqlens_q") || !c.has("cu_seqlens_kv"))
      fail("capture: q has rank 3 (varlen) but cu_seqlens_q and cu_seqlens_kv are not both given");
    if (c.at("cu_seqlens_q").shape[0] < 1 || c.at("cu_seqlens_kv").shape[0] < 1)
      fail("capture: cu_seqlens_q / cu_seqlens_kv must have b + 1 >= 1 entries");
  } else if (c.has("cu_seqlens_q") || c.has("cu_seqlens_kv")) {
    fail("capture: cu_seqlens_q / cu_seqlens_kv given but q has rank 4 (dense); varlen q is [total_q, h_q, d]");
  }
  if (c.has("sinks")) {
    const HostTensor& s = c.at("sinks");
    if (!is_float_dtype(s.dtype) || s.shape.size() != 1)
      fail(std::string("capture: tensor 'sinks' must be a float vector [h_q], got ") + dtype_name(s.dtype) + " " +
           shape_str(s.shape));
  }
  if (c.options.softmax_type == SINKATTN_SOFTMAX_LEARNABLE && !c.has("sinks"))
    fail("capture: softmax_type is learnable but tensor 'sinks' is missing (SPEC.md section 4)");
  // d_lse is an input of the backward only (SPEC.md section 3), and a capture runs its backward when it has d_out:
  // a d_lse without d_out would be silently unused, so the capture is refused instead.
  if (c.has("d_lse") && !c.has("d_out"))
    fail("capture: tensor 'd_lse' is given without 'd_out'; d_lse is a backward input and the backward runs only "
         "when the capture has d_out (add d_out, or remove d_lse to run the forward alone)");
  if (c.has("d_lse") && c.at("d_lse").dtype != SINKATTN_F32)
    fail(std::string("capture: tensor 'd_lse' must be F32, got ") + dtype_name(c.at("d_lse").dtype));
  if (c.has("bias") && !is_float_dtype(c.at("bias").dtype))
    fail(std::string("capture: tensor 'bias' must be F32 or the dtype of q, got ") + dtype_name(c.at("bias").dtype));
}

Capture read_capture(const std::string& path) {
  Capture c = parse_safetensors(read_file(path), path);
  c.options = parse_options(c.metadata);
  validate_capture(c);
  return c;
}

void write_capture(const std::string& path, const Capture& c) {
  std::vector<std::pair<std::string, const HostTensor*>> list;
  for (const auto& n : kInputNames)
    if (c.has(n)) list.emplace_back(n, &c.at(n));
  write_file(path, serialize_safetensors(list, format_options(c.options)));
}

// ---------------------------------------------------------------------------------------------------------
// one call

sinkattn_tensor_t sinkattn_params_t::*params_field(const std::string& name) {
  static const std::map<std::string, sinkattn_tensor_t sinkattn_params_t::*> fields = {
      {"q", &sinkattn_params_t::q},
      {"k", &sinkattn_params_t::k},
      {"v", &sinkattn_params_t::v},
      {"sinks", &sinkattn_params_t::sinks},
      {"bias", &sinkattn_params_t::bias},
      {"d_out", &sinkattn_params_t::d_out},
      {"d_lse", &sinkattn_params_t::d_lse},
      {"cu_seqlens_q", &sinkattn_params_t::cu_seqlens_q},
      {"cu_seqlens_kv", &sinkattn_params_t::cu_seqlens_kv},
      {"seqused_kv", &sinkattn_params_t::seqused_kv},
      {"seqlens_q", &sinkattn_params_t::seqlens_q},
      {"seqlens_kv", &sinkattn_params_t::seqlens_kv},
      {"page_table", &sinkattn_params_t::page_table},
      {"out", &sinkattn_params_t::out},
      {"softmax_lse", &sinkattn_params_t::softmax_lse},
      {"d_q", &sinkattn_params_t::dq},
      {"d_k", &sinkattn_params_t::dk},
      {"d_v", &sinkattn_params_t::dv},
      {"d_sinks", &sinkattn_params_t::d_sinks},
      {"d_bias", &sinkattn_params_t::d_bias},
      {"rng_state", &sinkattn_params_t::rng_state},
  };
  auto it = fields.find(name);
  return it == fields.end() ? nullptr : it->second;
}

namespace {
// Longest sequence of a cu_seqlens tensor (SPEC.md section 6: the max_seqlen default).
int64_t longest(const HostTensor& cu) {
  const int32_t* v = cu.as<int32_t>();
  int64_t m = 0;
  for (int64_t i = 0; i + 1 < cu.numel(); ++i) m = std::max<int64_t>(m, int64_t{v[i + 1]} - v[i]);
  return m;
}
}  // namespace

HostCall make_host_call(const Capture& c) {
  validate_capture(c);
  HostCall call;
  sinkattn_params_t& p = call.params;
  sinkattn_params_init(&p);
  const CaptureOptions& o = c.options;
  p.softmax_type = o.softmax_type;
  p.softmax_scale = o.softmax_scale ? *o.softmax_scale : std::numeric_limits<float>::quiet_NaN();
  p.window_left = o.window_left;
  p.window_right = o.window_right;
  p.mask_alignment = o.mask_alignment;
  p.dropout_p = o.dropout_p;
  p.seed = o.seed;
  p.offset = o.offset;
  p.deterministic = o.deterministic ? 1 : 0;

  for (const auto& name : kInputNames) {
    if (!c.has(name)) continue;
    p.*params_field(name) = c.at(name).view();
  }
  if (c.has("sinks") && c.at("sinks").dtype != SINKATTN_F32) {  // bindings may pass bf16/fp16 sinks: upcast
    const HostTensor& s = c.at("sinks");
    call.sinks_f32 = HostTensor(SINKATTN_F32, s.shape);
    for (int64_t i = 0; i < s.numel(); ++i)
      call.sinks_f32.as<float>()[i] = static_cast<float>(load_as_double(s.bytes.data(), s.dtype, i));
    p.sinks = call.sinks_f32.view();
  }

  const HostTensor& q = c.at("q");
  const HostTensor& k = c.at("k");
  const HostTensor& v = c.at("v");
  const bool varlen = c.varlen();
  if (varlen) {
    p.max_seqlen_q = o.max_seqlen_q ? *o.max_seqlen_q : longest(c.at("cu_seqlens_q"));
    if (o.max_seqlen_kv) {
      p.max_seqlen_kv = *o.max_seqlen_kv;
    } else if (c.paged()) {  // paged KV: the longest sequence has max(seqused_kv) keys
      const HostTensor& u = c.at("seqused_kv");
      int64_t m = 0;
      for (int64_t i = 0; i < u.numel(); ++i) m = std::max<int64_t>(m, u.as<int32_t>()[i]);
      p.max_seqlen_kv = m;
    } else {
      p.max_seqlen_kv = longest(c.at("cu_seqlens_kv"));
    }
  }

  // SPEC.md section 1 output shapes.
  std::vector<int64_t> out_shape = q.shape;
  out_shape.back() = v.shape.back();
  std::vector<int64_t> lse_shape = varlen ? std::vector<int64_t>{q.shape[1], q.shape[0]}                  // [h_q, total_q]
                                          : std::vector<int64_t>{q.shape[0], q.shape[2], q.shape[1]};     // [b, h_q, s_q]
  call.outputs["out"] = HostTensor(q.dtype, out_shape);
  call.outputs["softmax_lse"] = HostTensor(SINKATTN_F32, lse_shape);
  if (o.dropout_p > 0) call.outputs["rng_state"] = HostTensor(SINKATTN_I64, {2});
  call.backward = c.backward();
  if (call.backward) {
    call.outputs["d_q"] = HostTensor(q.dtype, q.shape);
    call.outputs["d_k"] = HostTensor(k.dtype, k.shape);
    call.outputs["d_v"] = HostTensor(v.dtype, v.shape);
    if (o.softmax_type == SINKATTN_SOFTMAX_LEARNABLE)
      call.outputs["d_sinks"] = HostTensor(SINKATTN_F32, {q.shape[varlen ? 1 : 2]});
    if (c.has("bias")) call.outputs["d_bias"] = HostTensor(c.at("bias").dtype, c.at("bias").shape);
  }
  for (auto& [name, t] : call.outputs) {
    t.fill_nan();
    p.*params_field(name) = t.view();
  }
  return call;
}

void write_results(const std::string& path, const HostCall& call, const CaptureOptions& options) {
  std::vector<std::pair<std::string, const HostTensor*>> list;
  for (const auto& n : kResultNames) {
    auto it = call.outputs.find(n);
    if (it != call.outputs.end()) list.emplace_back(n, &it->second);
  }
  auto md = format_options(options);
  md["producer"] = std::string("sinkattn ") + sinkattn_version();
  write_file(path, serialize_safetensors(list, md));
}

}  // namespace sinkattn::cli

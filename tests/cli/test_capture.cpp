// Capture-file I/O (SPEC.md section 6) and the `sinkattn` command.
//
// write_capture.py (Python struct + json only) writes small calls with known inputs; this test regenerates the
// same values with its own copy of the generator and checks that the C++ reader returns every tensor and option
// exactly, that the call built from it has the SPEC.md section 1 output shapes, that `sinkattn run` writes the
// results SPEC.md section 6 lists, and that malformed files give an error (exit status 1), never a crash.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "capture.hpp"
#include "dtype.hpp"

using namespace sinkattn::cli;

namespace {

const std::string kDir = SINKATTN_CLI_TEST_DIR;

// ---- independent copy of write_capture.py's generator ----
uint64_t name_seed(const std::string& name) {
  uint64_t s = name.size() * 1000;
  for (unsigned char c : name) s += c;
  return s;
}
std::vector<double> gen_values(const std::string& name, int64_t n) {
  uint64_t state = name_seed(name);
  std::vector<double> out;
  for (int64_t i = 0; i < n; ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t m = static_cast<int64_t>((state >> 33) % 192);
    out.push_back(static_cast<double>(m - 96 + (m >= 96 ? 1 : 0)) / 32.0);
  }
  return out;
}

struct Expected {
  std::string name;
  sinkattn_dtype_t dtype;
  std::vector<int64_t> shape;
  std::vector<double> values;  // empty: generated
};
struct Variant {
  std::string name;
  std::vector<Expected> tensors;
  CaptureOptions options;
};

std::vector<Variant> variants() {
  std::vector<Variant> v;
  {
    Variant x{"bf16-gqa-window", {}, {}};
    x.tensors = {{"q", SINKATTN_BF16, {2, 5, 4, 16}, {}},
                 {"k", SINKATTN_BF16, {2, 7, 2, 16}, {}},
                 {"v", SINKATTN_BF16, {2, 7, 2, 8}, {}},
                 {"sinks", SINKATTN_F32, {4}, {1.9459101090932196, 20.0, -1.5, 0.75}},
                 {"bias", SINKATTN_F32, {1, 4, 5, 7}, {}},
                 {"d_out", SINKATTN_BF16, {2, 5, 4, 8}, {}}};
    x.options.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
    x.options.softmax_scale = 0.3f;
    x.options.window_left = 3;
    x.options.window_right = 0;
    x.options.mask_alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
    x.options.deterministic = true;
    v.push_back(x);
  }
  {
    Variant x{"f32-varlen-dropout", {}, {}};
    x.tensors = {{"q", SINKATTN_F32, {7, 2, 8}, {}},
                 {"k", SINKATTN_F32, {7, 1, 8}, {}},
                 {"v", SINKATTN_F32, {7, 1, 8}, {}},
                 {"sinks", SINKATTN_F32, {2}, {2.0794415416798357, 20.0}},
                 {"d_out", SINKATTN_F32, {7, 2, 8}, {}},
                 {"d_lse", SINKATTN_F32, {2, 7}, {}},
                 {"cu_seqlens_q", SINKATTN_I32, {4}, {0, 3, 3, 7}},
                 {"cu_seqlens_kv", SINKATTN_I32, {4}, {0, 5, 7, 7}}};
    x.options.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
    x.options.window_left = -1;
    x.options.window_right = -1;
    x.options.mask_alignment = SINKATTN_ALIGN_TOP_LEFT;
    x.options.dropout_p = 0.25;
    x.options.seed = 12345678901234567890ull;
    x.options.offset = 7;
    v.push_back(x);
  }
  {
    Variant x{"f16-padding-offbyone", {}, {}};
    x.tensors = {{"q", SINKATTN_F16, {2, 6, 2, 8}, {}},     {"k", SINKATTN_F16, {2, 6, 2, 8}, {}},
                 {"v", SINKATTN_F16, {2, 6, 2, 8}, {}},     {"d_out", SINKATTN_F16, {2, 6, 2, 8}, {}},
                 {"seqlens_q", SINKATTN_I32, {2}, {6, 4}}, {"seqlens_kv", SINKATTN_I32, {2}, {5, 6}}};
    x.options.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE;
    x.options.window_right = 0;
    v.push_back(x);
  }
  {
    Variant x{"bf16-paged-decode", {}, {}};
    x.tensors = {{"q", SINKATTN_BF16, {3, 1, 8, 16}, {}},
                 {"k", SINKATTN_BF16, {7, 16, 2, 16}, {}},
                 {"v", SINKATTN_BF16, {7, 16, 2, 16}, {}},
                 {"sinks", SINKATTN_F32, {8}, {3.6888794541139363, 20.0, -1.5, 0.75, 1.0, 2.0, 0.25, -3.0}},
                 {"seqused_kv", SINKATTN_I32, {3}, {40, 0, 17}},
                 {"page_table", SINKATTN_I32, {3, 4}, {5, 0, 6, -1, 99, -7, 2147483647, 3, 0, 3, 1000, -5}}};
    x.options.softmax_type = SINKATTN_SOFTMAX_LEARNABLE;
    x.options.window_left = 31;
    x.options.window_right = 0;
    v.push_back(x);
  }
  {
    Variant x{"f16-paged-varlen", {}, {}};
    x.tensors = {{"q", SINKATTN_F16, {5, 2, 8}, {}},
                 {"k", SINKATTN_F16, {5, 8, 1, 8}, {}},
                 {"v", SINKATTN_F16, {5, 8, 1, 8}, {}},
                 {"cu_seqlens_q", SINKATTN_I32, {4}, {0, 2, 2, 5}},
                 {"seqused_kv", SINKATTN_I32, {3}, {9, 3, 16}},
                 {"page_table", SINKATTN_I32, {3, 2}, {4, 1, 2, -1, 0, 3}}};
    x.options.softmax_type = SINKATTN_SOFTMAX_OFF_BY_ONE;
    x.options.window_right = 0;
    v.push_back(x);
  }
  return v;
}

// Encodes expected values in a dtype, independently of HostTensor.
std::vector<uint8_t> encode(sinkattn_dtype_t t, const std::vector<double>& vals) {
  std::vector<uint8_t> out(vals.size() * static_cast<size_t>(dtype_size(t)));
  for (size_t i = 0; i < vals.size(); ++i) {
    if (t == SINKATTN_I32) {
      const int32_t x = static_cast<int32_t>(vals[i]);
      std::memcpy(out.data() + 4 * i, &x, 4);
    } else {
      store_float(out.data(), t, static_cast<int64_t>(i), static_cast<float>(vals[i]));
    }
  }
  return out;
}

int64_t numel(const std::vector<int64_t>& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

// Runs a shell command; returns its exit status, or -1 when it did not exit normally (signal = crash).
int run_cmd(const std::string& cmd) {
  const int st = std::system((cmd + " > /dev/null 2>&1").c_str());
  if (st == -1 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}
int run_cmd_verbose(const std::string& cmd) {
  const int st = std::system(cmd.c_str());
  if (st == -1 || !WIFEXITED(st)) return -1;
  return WEXITSTATUS(st);
}

// Files are named after the running test too: CTest runs the cases of this suite in parallel processes.
std::string unique_prefix(const std::string& variant) {
  std::string t = ::testing::UnitTest::GetInstance()->current_test_info()->name();
  for (char& c : t)
    if (c == '/') c = '_';
  return kDir + "/" + variant + "." + t;
}

std::string write_variant(const std::string& variant) {
  const std::string path = unique_prefix(variant) + ".safetensors";
  const std::string cmd = std::string(SINKATTN_PYTHON) + " " + SINKATTN_CAPTURE_WRITER + " --variant " + variant +
                          " --out " + path;
  EXPECT_EQ(run_cmd_verbose(cmd), 0) << cmd;
  return path;
}

void expect_options_equal(const CaptureOptions& a, const CaptureOptions& b) {
  EXPECT_EQ(a.softmax_type, b.softmax_type);
  EXPECT_EQ(a.softmax_scale.has_value(), b.softmax_scale.has_value());
  if (a.softmax_scale && b.softmax_scale) {
    EXPECT_EQ(*a.softmax_scale, *b.softmax_scale);
  }
  EXPECT_EQ(a.window_left, b.window_left);
  EXPECT_EQ(a.window_right, b.window_right);
  EXPECT_EQ(a.mask_alignment, b.mask_alignment);
  EXPECT_EQ(a.dropout_p, b.dropout_p);
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.offset, b.offset);
  EXPECT_EQ(a.deterministic, b.deterministic);
  EXPECT_EQ(a.max_seqlen_q, b.max_seqlen_q);
  EXPECT_EQ(a.max_seqlen_kv, b.max_seqlen_kv);
}

void expect_capture_matches(const Capture& c, const Variant& v) {
  EXPECT_EQ(c.tensors.size(), v.tensors.size());
  for (const auto& e : v.tensors) {
    SCOPED_TRACE(e.name);
    ASSERT_TRUE(c.has(e.name));
    const HostTensor& t = c.at(e.name);
    EXPECT_EQ(t.dtype, e.dtype);
    EXPECT_EQ(t.shape, e.shape);
    const std::vector<double> vals = e.values.empty() ? gen_values(e.name, numel(e.shape)) : e.values;
    ASSERT_EQ(static_cast<int64_t>(vals.size()), numel(e.shape));
    EXPECT_EQ(t.bytes, encode(e.dtype, vals));
    if (is_float_dtype(t.dtype)) {  // test data is never zero
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_NE(load_as_double(t.bytes.data(), t.dtype, i), 0.0) << i;
    }
  }
  expect_options_equal(c.options, v.options);
}

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

class CaptureVariant : public ::testing::TestWithParam<Variant> {};

}  // namespace

TEST(Dtype, HalfConversionsRoundTripAndRound) {
  // Every fp16 / bf16 bit pattern survives f16 -> f32 -> f16 (NaNs stay NaN).
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = f16_to_f32(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << h;
    const float g = bf16_to_f32(static_cast<uint16_t>(h));
    if (!std::isnan(g)) {
      ASSERT_EQ(f32_to_bf16(g), h) << h;
    }
  }
  // Round to nearest even.
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 1.0f / 2048)), 1.0f);                  // tie -> even (1.0)
  EXPECT_EQ(f16_to_f32(f32_to_f16(1.0f + 3.0f / 2048)), 1.0f + 2.0f / 1024);     // tie -> even (up)
  EXPECT_EQ(f16_to_f32(f32_to_f16(65520.f)), INFINITY);
  EXPECT_EQ(f16_to_f32(f32_to_f16(65519.f)), 65504.f);
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -24))), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(f16_to_f32(f32_to_f16(std::ldexp(1.0f, -25))), 0.0f);                   // tie -> 0
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 1.0f / 256)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f + 3.0f / 256)), 1.0f + 1.0f / 64);
}

TEST_P(CaptureVariant, ReaderReturnsEveryTensorAndOptionExactly) {
  const Variant& v = GetParam();
  const std::string path = write_variant(v.name);
  const Capture c = read_capture(path);
  expect_capture_matches(c, v);
}

TEST_P(CaptureVariant, WriteCaptureRoundTrips) {
  const Variant& v = GetParam();
  const Capture c = read_capture(write_variant(v.name));
  const std::string path2 = unique_prefix(v.name) + ".rewritten.safetensors";
  write_capture(path2, c);
  const Capture c2 = read_capture(path2);
  expect_capture_matches(c2, v);
}

TEST_P(CaptureVariant, HostCallHasSpecShapesAndPoisonedOutputs) {
  const Variant& v = GetParam();
  const Capture c = read_capture(write_variant(v.name));
  const HostCall call = make_host_call(c);
  const sinkattn_params_t& p = call.params;
  const auto& q = c.at("q").shape;
  const auto& vv = c.at("v").shape;
  EXPECT_EQ(call.backward, c.has("d_out"));  // paged variants are forward only (SPEC.md section 1)
  // Inputs point at the capture's bytes.
  EXPECT_EQ(p.q.data, c.at("q").bytes.data());
  EXPECT_EQ(p.k.data, c.at("k").bytes.data());
  EXPECT_EQ(p.v.data, c.at("v").bytes.data());
  if (call.backward) {
    EXPECT_EQ(p.d_out.data, c.at("d_out").bytes.data());
  }
  if (c.paged()) {
    EXPECT_EQ(p.page_table.data, c.at("page_table").bytes.data());
  }
  EXPECT_EQ(p.q.rank, static_cast<int32_t>(q.size()));
  EXPECT_EQ(p.q.strides[q.size() - 1], 1);
  EXPECT_EQ(p.softmax_type, v.options.softmax_type);
  EXPECT_EQ(p.window_left, v.options.window_left);
  EXPECT_EQ(p.window_right, v.options.window_right);
  EXPECT_EQ(p.seed, v.options.seed);
  EXPECT_EQ(p.offset, v.options.offset);
  EXPECT_EQ(p.dropout_p, v.options.dropout_p);
  if (v.options.softmax_scale) {
    EXPECT_EQ(p.softmax_scale, *v.options.softmax_scale);
  } else {
    EXPECT_TRUE(std::isnan(p.softmax_scale));
  }
  const bool varlen = q.size() == 3;
  if (varlen && !c.paged()) {
    EXPECT_EQ(p.max_seqlen_q, 4);   // cu_seqlens_q {0, 3, 3, 7}: longest 4
    EXPECT_EQ(p.max_seqlen_kv, 5);  // cu_seqlens_kv {0, 5, 7, 7}: longest 5
  } else if (varlen) {
    EXPECT_EQ(p.max_seqlen_q, 3);   // cu_seqlens_q {0, 2, 2, 5}: longest 3
    EXPECT_EQ(p.max_seqlen_kv, 16);  // seqused_kv {9, 3, 16}: longest 16
  }
  std::vector<int64_t> out_shape = q;
  out_shape.back() = vv.back();
  const std::vector<int64_t> lse_shape = varlen ? std::vector<int64_t>{q[1], q[0]} : std::vector<int64_t>{q[0], q[2], q[1]};
  std::map<std::string, std::pair<sinkattn_dtype_t, std::vector<int64_t>>> want = {
      {"out", {c.at("q").dtype, out_shape}}, {"softmax_lse", {SINKATTN_F32, lse_shape}}};
  if (call.backward) {
    want["d_q"] = {c.at("q").dtype, q};
    want["d_k"] = {c.at("q").dtype, c.at("k").shape};
    want["d_v"] = {c.at("q").dtype, vv};
  }
  if (call.backward && v.options.softmax_type == SINKATTN_SOFTMAX_LEARNABLE)
    want["d_sinks"] = {SINKATTN_F32, {q[varlen ? 1 : 2]}};
  if (c.has("bias")) want["d_bias"] = {c.at("bias").dtype, c.at("bias").shape};
  if (v.options.dropout_p > 0) want["rng_state"] = {SINKATTN_I64, {2}};
  ASSERT_EQ(call.outputs.size(), want.size());
  for (const auto& [name, dt_shape] : want) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(call.outputs.count(name));
    const HostTensor& t = call.outputs.at(name);
    EXPECT_EQ(t.dtype, dt_shape.first);
    EXPECT_EQ(t.shape, dt_shape.second);
    const sinkattn_tensor_t field = p.*params_field(name);
    EXPECT_EQ(field.data, t.bytes.data());
    EXPECT_EQ(field.rank, static_cast<int32_t>(t.shape.size()));
    if (is_float_dtype(t.dtype)) {
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_TRUE(std::isnan(load_as_double(t.bytes.data(), t.dtype, i)));
    }
  }
}

TEST_P(CaptureVariant, RunWritesEveryResultAndCheckPasses) {
  const Variant& v = GetParam();
  const std::string in = write_variant(v.name);
  const std::string res = unique_prefix(v.name) + ".result.safetensors";
  std::remove(res.c_str());
  ASSERT_EQ(run_cmd_verbose(std::string(SINKATTN_CLI) + " run --inputs " + in + " --out " + res), 0);
  const Capture c = read_capture(in);
  const Capture r = parse_safetensors(read_file(res), res);
  const HostCall call = make_host_call(c);  // the expected names, dtypes and shapes
  ASSERT_EQ(r.tensors.size(), call.outputs.size());
  for (const auto& [name, t] : call.outputs) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(r.has(name));
    const HostTensor& x = r.at(name);
    EXPECT_EQ(x.dtype, t.dtype);
    EXPECT_EQ(x.shape, t.shape);
    if (name == "rng_state") {
      EXPECT_EQ(x.as<uint64_t>()[0], v.options.seed);
      EXPECT_EQ(x.as<uint64_t>()[1], v.options.offset);
      continue;
    }
    // No NaN anywhere (the outputs were poisoned with NaN before the call); LSE may be -inf only for vanilla.
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double e = load_as_double(x.bytes.data(), x.dtype, i);
      ASSERT_FALSE(std::isnan(e)) << name << "[" << i << "]";
      if (name != "softmax_lse") {
        ASSERT_TRUE(std::isfinite(e)) << name << "[" << i << "]";
      }
    }
  }
  // The options travel into the result file's metadata.
  expect_options_equal(parse_options(r.metadata), v.options);
  EXPECT_EQ(run_cmd_verbose(std::string(SINKATTN_CLI) + " check --inputs " + in), 0);
}

INSTANTIATE_TEST_SUITE_P(Variants, CaptureVariant, ::testing::ValuesIn(variants()),
                         [](const ::testing::TestParamInfo<Variant>& i) {
                           std::string n = i.param.name;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// ---- malformed files ----

namespace {

std::vector<uint8_t> valid_image() {
  HostTensor q(SINKATTN_F32, {1, 2, 1, 8}), k(SINKATTN_F32, {1, 2, 1, 8}), v(SINKATTN_F32, {1, 2, 1, 8});
  for (HostTensor* t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i) t->as<float>()[i] = 0.25f * static_cast<float>(i + 1);
  return serialize_safetensors({{"q", &q}, {"k", &k}, {"v", &v}}, {{"softmax_type", "vanilla"}});
}

// An image with the given JSON header text and data bytes.
std::vector<uint8_t> image(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8 + header.size() + data_bytes, 0x3f);
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<uint8_t>(n >> (8 * i));
  std::memcpy(out.data() + 8, header.data(), header.size());
  return out;
}

const char* kQkv = R"("k":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[64,128]},)"
                   R"("v":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[128,192]})";

struct Malformed {
  std::string name;
  std::vector<uint8_t> bytes;
};

std::vector<Malformed> malformed_files() {
  std::vector<Malformed> m;
  const auto good = valid_image();
  m.push_back({"empty", {}});
  m.push_back({"shorter_than_length", std::vector<uint8_t>(good.begin(), good.begin() + 5)});
  m.push_back({"truncated_header", std::vector<uint8_t>(good.begin(), good.begin() + 20)});
  m.push_back({"truncated_data", std::vector<uint8_t>(good.begin(), good.end() - 10)});
  {
    auto b = good;
    b[7] = 0x7f;  // header length ~ 2^63
    m.push_back({"huge_header_length", b});
  }
  m.push_back({"not_json", image("this is not json at all!", 192)});
  m.push_back({"json_array", image("[1,2,3]", 0)});
  m.push_back({"bad_dtype", image(std::string(R"({"q":{"dtype":"F64","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"offsets_past_end", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 150)});
  m.push_back({"offsets_huge", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[18446744073709551000,18446744073709551064]},)") + kQkv + "}", 192)});
  m.push_back({"offsets_reversed", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[64,0]},)") + kQkv + "}", 192)});
  m.push_back({"size_mismatch", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,60]},)") + kQkv + "}", 192)});
  m.push_back({"overlap", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[32,96]},)") + kQkv + "}", 192)});
  m.push_back({"negative_dim", image(std::string(R"({"q":{"dtype":"F32","shape":[1,-2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"rank_5", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8,1],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"overflowing_shape", image(std::string(R"({"q":{"dtype":"F32","shape":[1099511627776,1099511627776,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"missing_offsets", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8]},)") + kQkv + "}", 192)});
  m.push_back({"metadata_not_string", image(std::string(R"({"__metadata__":{"window_left":3},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"bad_softmax_type", image(std::string(R"({"__metadata__":{"softmax_type":"sigmoid"},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"negative_seed", image(std::string(R"({"__metadata__":{"seed":"-1"},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"seed_overflow", image(std::string(R"({"__metadata__":{"seed":"18446744073709551616"},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"trailing_garbage_number", image(std::string(R"({"__metadata__":{"window_left":"3x"},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"bad_deterministic", image(std::string(R"({"__metadata__":{"deterministic":"yes"},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"missing_q", image(R"({"k":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},"v":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[64,128]}})", 192)});
  m.push_back({"int_q", image(std::string(R"({"q":{"dtype":"I32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"learnable_without_sinks", image(std::string(R"({"__metadata__":{"softmax_type":"learnable"},"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192)});
  m.push_back({"varlen_without_cu_seqlens", image(R"({"q":{"dtype":"F32","shape":[2,1,8],"data_offsets":[0,64]},"k":{"dtype":"F32","shape":[2,1,8],"data_offsets":[64,128]},"v":{"dtype":"F32","shape":[2,1,8],"data_offsets":[128,192]}})", 192)});
  // d_lse is a backward input: without d_out the capture would run the forward alone and drop it silently.
  m.push_back({"d_lse_without_d_out", image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},"d_lse":{"dtype":"F32","shape":[1,1,2],"data_offsets":[192,200]},)") + kQkv + "}", 200)});
  m.push_back({"k_dtype_differs", image(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},"k":{"dtype":"F16","shape":[1,2,1,16],"data_offsets":[64,128]},"v":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[128,192]}})", 192)});
  return m;
}

}  // namespace

TEST(Malformed, ValidImageReads) {
  // The base of the malformed cases is itself valid, and so is a header built by hand like the ones below.
  const std::string p = kDir + "/valid.safetensors";
  write_file(p, valid_image());
  EXPECT_NO_THROW(read_capture(p));
  write_file(p, image(std::string(R"({"q":{"dtype":"F32","shape":[1,2,1,8],"data_offsets":[0,64]},)") + kQkv + "}", 192));
  EXPECT_NO_THROW(read_capture(p));
  EXPECT_EQ(run_cmd(std::string(SINKATTN_CLI) + " run --inputs " + p + " --out " + kDir + "/valid.result.safetensors"), 0);
}

TEST(Malformed, ReaderThrowsAndCommandExitsWithError) {
  for (const auto& m : malformed_files()) {
    SCOPED_TRACE(m.name);
    const std::string p = kDir + "/malformed-" + m.name + ".safetensors";
    write_file(p, m.bytes);
    EXPECT_THROW(read_capture(p), CaptureError);
    // The command reports the error and exits with status 1: no crash (a signal gives -1 here), no output.
    const std::string res = kDir + "/malformed-" + m.name + ".result.safetensors";
    std::remove(res.c_str());
    EXPECT_EQ(run_cmd(std::string(SINKATTN_CLI) + " run --inputs " + p + " --out " + res), 1);
    EXPECT_EQ(run_cmd(std::string(SINKATTN_CLI) + " check --inputs " + p), 1);
    EXPECT_FALSE(std::filesystem::exists(res));
  }
}

TEST(Malformed, MissingFileIsAnError) {
  EXPECT_THROW(read_capture(kDir + "/does-not-exist.safetensors"), CaptureError);
  EXPECT_EQ(run_cmd(std::string(SINKATTN_CLI) + " run --inputs " + kDir + "/does-not-exist.safetensors --out " + kDir +
                    "/x.safetensors"),
            1);
}

TEST(Malformed, LibraryRejectionIsAnErrorExit) {
  // Well-formed file, invalid call (h_q % h_kv != 0): the library's message, exit status 1.
  HostTensor q(SINKATTN_F32, {1, 2, 3, 8}), k(SINKATTN_F32, {1, 2, 2, 8}), v(SINKATTN_F32, {1, 2, 2, 8});
  for (HostTensor* t : {&q, &k, &v})
    for (int64_t i = 0; i < t->numel(); ++i) t->as<float>()[i] = 0.5f + 0.01f * static_cast<float>(i);
  const std::string p = kDir + "/bad-heads.safetensors";
  write_file(p, serialize_safetensors({{"q", &q}, {"k", &k}, {"v", &v}}, {}));
  EXPECT_NO_THROW(read_capture(p));
  EXPECT_EQ(run_cmd(std::string(SINKATTN_CLI) + " run --inputs " + p + " --out " + kDir + "/bad-heads.result.safetensors"), 1);
}

// ---- errors in the user's words: a capture with a mistake names the tensor or metadata key as the file spells it
namespace {

// Runs the command, returns (exit status, stderr).
std::pair<int, std::string> run_capturing_stderr(const std::string& cmd, const std::string& err_path) {
  const int st = std::system((cmd + " > /dev/null 2> " + err_path).c_str());
  std::string text;
  if (FILE* f = std::fopen(err_path.c_str(), "rb")) {
    char buf[4096];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
    std::fclose(f);
  }
  return {st == -1 || !WIFEXITED(st) ? -1 : WEXITSTATUS(st), text};
}

HostTensor filled(sinkattn_dtype_t dt, std::vector<int64_t> shape) {
  HostTensor t(dt, std::move(shape));
  const std::vector<double> vals = gen_values("user-errors", t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) store_float(t.bytes.data(), dt, i, static_cast<float>(vals[i]));
  return t;
}

}  // namespace

TEST(UserErrors, CommandMessagesNameTheTensorOrKey) {
  struct Case {
    const char* name;
    std::function<void(std::map<std::string, HostTensor>&, std::map<std::string, std::string>&)> mistake;
    std::string want;  // the error line must contain this
  };
  const std::vector<Case> cases = {
      {"v-dtype", [](auto& t, auto&) { t["v"] = filled(SINKATTN_BF16, {1, 4, 2, 8}); },
       "tensor 'v' has dtype BF16, expected the dtype of q (F32)"},
      {"sinks-length", [](auto& t, auto&) { t["sinks"] = filled(SINKATTN_F32, {3}); },
       "sinks: shape must be [2], got [3]"},
      {"window-not-an-int", [](auto&, auto& m) { m["window_left"] = "(127, 0)"; }, "key 'window_left'"},
      {"head-dim-600",
       [](auto& t, auto&) {
         for (const char* n : {"q", "k", "v"}) t[n] = filled(SINKATTN_F32, {1, 4, 2, 600});
       },
       "no backend can run this call: cpu: q: head dim d = 600"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::map<std::string, HostTensor> t;
    for (const char* n : {"q", "k", "v"}) t[n] = filled(SINKATTN_F32, {1, 4, 2, 8});
    t["sinks"] = filled(SINKATTN_F32, {2});
    std::map<std::string, std::string> meta = {{"softmax_type", "learnable"}};
    c.mistake(t, meta);
    std::vector<std::pair<std::string, const HostTensor*>> list;
    for (const auto& [n, x] : t) list.push_back({n, &x});
    const std::string p = unique_prefix(std::string("user-error-") + c.name) + ".safetensors";
    write_file(p, serialize_safetensors(list, meta));
    for (const std::string& sub : {"run --out " + p + ".result.safetensors", std::string("check")}) {
      const auto [st, err] = run_capturing_stderr(std::string(SINKATTN_CLI) + " " + sub + " --inputs " + p, p + ".err");
      EXPECT_EQ(st, 1) << sub << ": " << err;
      EXPECT_NE(err.find(c.want), std::string::npos) << sub << ": " << err;
      EXPECT_EQ(err.find("cpu: cpu:"), std::string::npos) << err;
    }
  }
}

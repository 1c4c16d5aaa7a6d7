// See presets.hpp.
#include "presets.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <stdexcept>

#include "dtype.hpp"

namespace sinkattn::cli {

const std::vector<Preset>& presets() {
  static const std::vector<Preset> all = [] {
    const std::vector<LayerSpec> gpt_oss_layers = {{"sliding", 127, 0}, {"full", -1, 0}};
    return std::vector<Preset>{
        {"gpt-oss-20b", 64, 8, 64, SINKATTN_SOFTMAX_LEARNABLE, gpt_oss_layers},
        {"gpt-oss-120b", 64, 8, 64, SINKATTN_SOFTMAX_LEARNABLE, gpt_oss_layers},
        {"llama3-8b", 32, 8, 128, SINKATTN_SOFTMAX_VANILLA, {{"full", -1, 0}}},
    };
  }();
  return all;
}

const Preset& find_preset(const std::string& name) {
  std::string names;
  for (const auto& p : presets()) {
    if (p.name == name) return p;
    names += (names.empty() ? "" : ", ") + p.name;
  }
  throw std::invalid_argument("unknown preset '" + name + "' (known: " + names + ")");
}

std::vector<LayerSpec> select_layers(const Preset& p, const std::string& layer) {
  if (layer.empty() || layer == "both" || layer == "all") return p.layers;
  for (const auto& l : p.layers)
    if (l.name == layer) return {l};
  throw std::invalid_argument("preset " + p.name + " has no '" + layer + "' layer");
}

sinkattn_dtype_t parse_float_dtype(const std::string& s) {
  if (s == "bf16" || s == "bfloat16" || s == "BF16") return SINKATTN_BF16;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "F16") return SINKATTN_F16;
  if (s == "fp32" || s == "f32" || s == "float32" || s == "F32") return SINKATTN_F32;
  throw std::invalid_argument("--dtype must be bf16, fp16 or fp32, not '" + s + "'");
}

namespace {
HostTensor random_normal(sinkattn_dtype_t t, std::vector<int64_t> shape, std::mt19937_64& rng) {
  HostTensor x(t, std::move(shape));
  std::normal_distribution<float> dist(0.f, 1.f);
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) store_float(x.bytes.data(), t, i, dist(rng));
  return x;
}
}  // namespace

Capture make_random_capture(const Preset& p, const LayerSpec& layer, const RandomCallSpec& spec) {
  if (spec.batch < 1 || spec.seqlen < 1) throw std::invalid_argument("--batch and --seqlen must be positive");
  std::mt19937_64 rng(spec.seed);
  const int64_t b = spec.batch, s = spec.seqlen;
  Capture c;
  c.tensors["q"] = random_normal(spec.dtype, {b, s, p.h_q, p.d}, rng);
  c.tensors["k"] = random_normal(spec.dtype, {b, s, p.h_kv, p.d}, rng);
  c.tensors["v"] = random_normal(spec.dtype, {b, s, p.h_kv, p.d}, rng);
  if (p.softmax_type == SINKATTN_SOFTMAX_LEARNABLE) {
    // SPEC.md section 5: test sinks with large values (log(s_kv), 20), not only values near 0.
    HostTensor sinks(SINKATTN_F32, {p.h_q});
    std::uniform_real_distribution<float> u(-2.f, 2.f);
    for (int64_t h = 0; h < p.h_q; ++h)
      sinks.as<float>()[h] = h % 3 == 0 ? static_cast<float>(std::log(static_cast<double>(s))) : h % 3 == 1 ? 20.f : u(rng);
    c.tensors["sinks"] = std::move(sinks);
  }
  if (spec.backward) c.tensors["d_out"] = random_normal(spec.dtype, {b, s, p.h_q, p.d}, rng);
  if (spec.backward && spec.d_lse) c.tensors["d_lse"] = random_normal(SINKATTN_F32, {b, p.h_q, s}, rng);
  c.options.softmax_type = p.softmax_type;
  c.options.window_left = layer.window_left;
  c.options.window_right = layer.window_right;
  c.options.mask_alignment = SINKATTN_ALIGN_BOTTOM_RIGHT;
  c.options.dropout_p = spec.dropout_p;
  c.options.seed = spec.seed;
  c.options.offset = 0;
  c.options.deterministic = spec.deterministic;
  c.metadata = format_options(c.options);
  return c;
}

int64_t visible_pairs(int64_t s_q, int64_t s_kv, int64_t window_left, int64_t window_right,
                      sinkattn_mask_alignment_t alignment) {
  // SPEC.md section 2: j visible to i iff (wl < 0 or j >= i + off - wl) and (wr < 0 or j <= i + off + wr).
  const int64_t off = alignment == SINKATTN_ALIGN_BOTTOM_RIGHT ? s_kv - s_q : 0;
  int64_t total = 0;
  for (int64_t i = 0; i < s_q; ++i) {
    const int64_t lo = window_left < 0 ? 0 : std::max<int64_t>(0, i + off - window_left);
    const int64_t hi = window_right < 0 ? s_kv : std::min<int64_t>(s_kv, i + off + window_right + 1);
    if (hi > lo) total += hi - lo;
  }
  return total;
}

}  // namespace sinkattn::cli

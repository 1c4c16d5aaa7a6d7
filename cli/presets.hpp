// Model presets for `sinkattn check` and `sinkattn bench`: attention shapes of real models, random inputs,
// and the exact FLOP count of a masked call.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "capture.hpp"
#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

// One attention layer kind of a model: its mask.
struct LayerSpec {
  std::string name;                  // "full" or "sliding"
  int64_t window_left = -1, window_right = 0;
};

struct Preset {
  std::string name;
  int64_t h_q = 0, h_kv = 0, d = 0;
  sinkattn_softmax_type_t softmax_type = SINKATTN_SOFTMAX_VANILLA;
  std::vector<LayerSpec> layers;     // the layer kinds the model alternates between
};

// gpt-oss-20b, gpt-oss-120b: h_q 64, h_kv 8, d 64, learnable sink per head, layers alternate sliding window
// (window_left 127, window_right 0) and full causal. llama3-8b: h_q 32, h_kv 8, d 128, vanilla, causal.
const std::vector<Preset>& presets();
const Preset& find_preset(const std::string& name);  // throws std::invalid_argument listing the names

// The layers selected by --layer: "" or "both" -> every layer kind of the preset; "full" / "sliding" -> that one
// (throws std::invalid_argument when the preset has no such layer).
std::vector<LayerSpec> select_layers(const Preset& p, const std::string& layer);

// "bf16" | "fp16" | "fp32" (also "f32", "f16", "float32", ...) -> dtype; throws std::invalid_argument.
sinkattn_dtype_t parse_float_dtype(const std::string& s);

struct RandomCallSpec {
  int64_t batch = 1, seqlen = 256;
  sinkattn_dtype_t dtype = SINKATTN_BF16;
  uint64_t seed = 0;             // input generator seed
  bool backward = true;          // add d_out
  bool d_lse = false;            // add d_lse
  double dropout_p = 0.0;
  bool deterministic = false;
};

// A call capture of preset `p`, layer `layer`: dense [b, s, h, d], standard normal q, k, v, d_out (rounded to
// the dtype, from std::mt19937_64(seed)), causal bottom-right mask with the layer's window. Learnable sinks
// cycle through log(s_kv), 20 and uniform(-2, 2) per head so that the sink visibly changes the result.
Capture make_random_capture(const Preset& p, const LayerSpec& layer, const RandomCallSpec& spec);

// Exact number of visible (i, j) pairs of a dense call of one (batch, head) with SPEC.md section 2's mask.
int64_t visible_pairs(int64_t s_q, int64_t s_kv, int64_t window_left, int64_t window_right,
                      sinkattn_mask_alignment_t alignment);

}  // namespace sinkattn::cli

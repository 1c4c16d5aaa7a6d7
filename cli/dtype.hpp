// Element types of the capture files and the library (SPEC.md section 6: safetensors dtypes F32, F16, BF16,
// I32, I64) and exact conversions between fp32 and the 16-bit float formats.
#pragma once

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "sinkattn/sinkattn.h"

namespace sinkattn::cli {

// Bytes per element.
inline int64_t dtype_size(sinkattn_dtype_t t) { return static_cast<int64_t>(sinkattn_dtype_size(t)); }

// safetensors spelling of a dtype ("F32", "F16", "BF16", "I32", "I64").
inline const char* dtype_name(sinkattn_dtype_t t) {
  switch (t) {
    case SINKATTN_F32: return "F32";
    case SINKATTN_F16: return "F16";
    case SINKATTN_BF16: return "BF16";
    case SINKATTN_I32: return "I32";
    case SINKATTN_I64: return "I64";
  }
  return "?";
}

inline std::optional<sinkattn_dtype_t> dtype_from_name(std::string_view s) {
  if (s == "F32") return SINKATTN_F32;
  if (s == "F16") return SINKATTN_F16;
  if (s == "BF16") return SINKATTN_BF16;
  if (s == "I32") return SINKATTN_I32;
  if (s == "I64") return SINKATTN_I64;
  return std::nullopt;
}

inline bool is_float_dtype(sinkattn_dtype_t t) {
  return t == SINKATTN_F32 || t == SINKATTN_F16 || t == SINKATTN_BF16;
}

inline uint32_t f32_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float f32_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// bfloat16: the upper 16 bits of an fp32, rounded to nearest even (NaN stays a quiet NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t u = f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
inline float bf16_to_f32(uint16_t h) { return f32_from_bits(static_cast<uint32_t>(h) << 16); }

// IEEE binary16, round to nearest even, with subnormals, overflow to inf, NaN kept.
inline uint16_t f32_to_f16(float f) {
  const uint32_t u = f32_bits(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;          // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00u;         // >= 65520 rounds to inf (and inf itself)
  if (a < 0x33000001u) return sign;                    // <= 2^-25: rounds to +-0
  int32_t e = static_cast<int32_t>(a >> 23) - 127;
  uint32_t mant = (a & 0x7fffffu) | 0x800000u;         // 24-bit significand
  int32_t shift;                                        // bits to drop from the 24-bit significand
  uint32_t exp_field;
  if (e < -14) {                                        // subnormal half
    shift = 13 + (-14 - e);
    exp_field = 0;
  } else {
    shift = 13;
    exp_field = static_cast<uint32_t>(e + 15);
  }
  uint32_t r = mant >> shift;
  const uint32_t rem = mant & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (r & 1u))) ++r;
  uint32_t out;
  if (exp_field == 0) {
    out = r;  // may carry into the exponent field: that is the correct smallest normal
  } else {
    out = (exp_field << 10) + (r - 0x400u);  // r in [0x400, 0x800]; a carry bumps the exponent
  }
  return static_cast<uint16_t>(sign | out);
}
inline float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu;
  const uint32_t m = h & 0x3ffu;
  if (e == 0) {
    const float v = static_cast<float>(m) * 5.9604644775390625e-08f;  // m * 2^-24
    return sign ? -v : v;
  }
  if (e == 31) return f32_from_bits(sign | 0x7f800000u | (m << 13));
  return f32_from_bits(sign | ((e + 112) << 23) | (m << 13));
}

// Element i of a contiguous buffer of dtype t, as a double (ints exactly up to 2^53).
inline double load_as_double(const void* data, sinkattn_dtype_t t, int64_t i) {
  switch (t) {
    case SINKATTN_F32: return static_cast<const float*>(data)[i];
    case SINKATTN_F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case SINKATTN_BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case SINKATTN_I32: return static_cast<const int32_t*>(data)[i];
    case SINKATTN_I64: return static_cast<double>(static_cast<const int64_t*>(data)[i]);
  }
  return 0;
}

// Stores a float value (rounded to t) at element i of a contiguous buffer of float dtype t.
inline void store_float(void* data, sinkattn_dtype_t t, int64_t i, float v) {
  switch (t) {
    case SINKATTN_F32: static_cast<float*>(data)[i] = v; break;
    case SINKATTN_F16: static_cast<uint16_t*>(data)[i] = f32_to_f16(v); break;
    case SINKATTN_BF16: static_cast<uint16_t*>(data)[i] = f32_to_bf16(v); break;
    default: break;
  }
}

}  // namespace sinkattn::cli

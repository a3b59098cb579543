#include "core/fp8.hpp"

#include <cctype>
#include <limits>
#include <string>

namespace wb::fp8 {
namespace {

float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = std::uint32_t{h & 0x8000u} << 16;
  const std::uint32_t exponent = (h >> 10) & 0x1Fu;
  const std::uint32_t mantissa = h & 0x3FFu;
  if (exponent == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (mantissa << 13));
  if (exponent != 0) return std::bit_cast<float>(sign | ((exponent + 112u) << 23) | (mantissa << 13));
  // Zero or subnormal: mantissa * 2^-24, exact in float32.
  const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
  return sign ? -magnitude : magnitude;
}

/// The smallest power of two >= m (m > 0, finite), from the bits: 2^(e + (mantissa != 0)).
float ceil_power_of_two(float m) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(m);
  std::uint32_t exponent = (bits >> 23) & 0xFFu;
  if (exponent == 0) return std::ldexp(1.0f, static_cast<int>(std::ceil(std::log2(static_cast<double>(m)))));
  if ((bits & 0x7FFFFFu) != 0) ++exponent;  // 255: infinity
  return std::bit_cast<float>(exponent << 23);
}

}  // namespace

std::string_view scale_rule_name(ScaleRule rule) {
  switch (rule) {
    case ScaleRule::kPlain: return "plain";
    case ScaleRule::kPerBlockCast: return "per-block-cast";
    case ScaleRule::kUe8m0: return "ue8m0";
  }
  return "?";
}

std::optional<ScaleRule> parse_scale_rule(std::string_view text) {
  std::string t(text);
  for (char& c : t) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (t == "plain" || t == "amax") return ScaleRule::kPlain;
  if (t == "per-block-cast" || t == "per_block_cast" || t == "per_block_cast_to_fp8" || t == "sglang" ||
      t == "deepgemm")
    return ScaleRule::kPerBlockCast;
  if (t == "ue8m0" || t == "pow2") return ScaleRule::kUe8m0;
  return std::nullopt;
}

float e4m3_to_float(std::uint8_t code) {
  const bool negative = (code & 0x80u) != 0;
  const unsigned exponent = (code >> 3) & 0xFu;
  const unsigned mantissa = code & 0x7u;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) magnitude = std::numeric_limits<float>::quiet_NaN();
  else if (exponent == 0) magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  else magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, static_cast<int>(exponent) - 7);
  return negative ? -magnitude : magnitude;
}

BlockScale block_scale(ScaleRule rule, float amax) {
  const bool nan = amax != amax;
  switch (rule) {
    case ScaleRule::kPlain: {
      if (amax == 0.0f) return {1.0f, 1.0f, true};  // 0 / 0 avoided: scale 1, zeros
      const float s = amax / kE4m3Max;
      return {s, s, true};
    }
    case ScaleRule::kPerBlockCast: {
      const float a = nan ? amax : (amax > kAmaxFloor ? amax : kAmaxFloor);
      return {a / kE4m3Max, kE4m3Max / a, false};
    }
    case ScaleRule::kUe8m0: {
      const float a = nan ? amax : (amax > kAmaxFloor ? amax : kAmaxFloor);
      const float s = nan ? a : ceil_power_of_two(a / kE4m3Max);
      return {s, 1.0f / s, false};
    }
  }
  return {};
}

bool quantizable(DType dtype) {
  return dtype == DType::kBF16 || dtype == DType::kF16 || dtype == DType::kF32 || dtype == DType::kF64;
}

float load_float(DType dtype, const void* element) {
  switch (dtype) {
    case DType::kBF16: {
      std::uint16_t bits;
      std::memcpy(&bits, element, 2);
      return bf16_to_float(bits);
    }
    case DType::kF16: {
      std::uint16_t bits;
      std::memcpy(&bits, element, 2);
      return f16_to_float(bits);
    }
    case DType::kF32: {
      float v;
      std::memcpy(&v, element, 4);
      return v;
    }
    case DType::kF64: {
      double v;
      std::memcpy(&v, element, 8);
      return static_cast<float>(v);
    }
    default: return std::numeric_limits<float>::quiet_NaN();
  }
}

}  // namespace wb::fp8

// Element types a parameter or checkpoint tensor can have.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace wb {

enum class DType : std::uint8_t {
  kBF16,
  kF16,
  kF32,
  kF64,
  kI8,
  kU8,
  kI32,
  kI64,
  kF8E4M3,
  kF8E5M2,
};

inline constexpr int kNumDTypes = 10;

/// Bytes per element.
std::size_t dtype_size(DType dtype);

/// Short lower-case name used in specs, logs and the HDF5 `dtype` attribute: "bf16", "f8e4m3", ...
std::string_view dtype_name(DType dtype);

/// Name used by the safetensors header: "BF16", "F8_E4M3", ...
std::string_view dtype_safetensors_name(DType dtype);

/// Parses either spelling (case-insensitive); nullopt when unknown.
std::optional<DType> parse_dtype(std::string_view name);

/// True for the floating-point types (bf16, f16, f32, f64, fp8).
bool dtype_is_floating(DType dtype);

}  // namespace wb

#include "weightbridge/dtype.hpp"

#include <array>
#include <cctype>
#include <string>

namespace wb {
namespace {

struct DTypeRow {
  DType dtype;
  std::size_t size;
  std::string_view name;
  std::string_view safetensors_name;
  bool floating;
};

constexpr std::array<DTypeRow, kNumDTypes> kDTypes = {{
    {DType::kBF16, 2, "bf16", "BF16", true},
    {DType::kF16, 2, "f16", "F16", true},
    {DType::kF32, 4, "f32", "F32", true},
    {DType::kF64, 8, "f64", "F64", true},
    {DType::kI8, 1, "i8", "I8", false},
    {DType::kU8, 1, "u8", "U8", false},
    {DType::kI32, 4, "i32", "I32", false},
    {DType::kI64, 8, "i64", "I64", false},
    {DType::kF8E4M3, 1, "f8e4m3", "F8_E4M3", true},
    {DType::kF8E5M2, 1, "f8e5m2", "F8_E5M2", true},
}};

const DTypeRow& row(DType dtype) { return kDTypes[static_cast<std::size_t>(dtype)]; }

std::string lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

std::size_t dtype_size(DType dtype) { return row(dtype).size; }
std::string_view dtype_name(DType dtype) { return row(dtype).name; }
std::string_view dtype_safetensors_name(DType dtype) { return row(dtype).safetensors_name; }
bool dtype_is_floating(DType dtype) { return row(dtype).floating; }

std::optional<DType> parse_dtype(std::string_view name) {
  const std::string wanted = lower(name);
  for (const DTypeRow& r : kDTypes) {
    if (wanted == r.name || wanted == lower(r.safetensors_name)) return r.dtype;
  }
  // Common aliases (torch_dtype in config.json, numpy names).
  if (wanted == "bfloat16") return DType::kBF16;
  if (wanted == "float16" || wanted == "half") return DType::kF16;
  if (wanted == "float32" || wanted == "float") return DType::kF32;
  if (wanted == "float64" || wanted == "double") return DType::kF64;
  if (wanted == "int8") return DType::kI8;
  if (wanted == "uint8") return DType::kU8;
  if (wanted == "int32") return DType::kI32;
  if (wanted == "int64") return DType::kI64;
  if (wanted == "float8_e4m3fn" || wanted == "f8_e4m3fn") return DType::kF8E4M3;
  if (wanted == "float8_e5m2") return DType::kF8E5M2;
  return std::nullopt;
}

}  // namespace wb

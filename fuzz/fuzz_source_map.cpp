// libFuzzer target: the source-map decoder and the validation every consumer runs after it. Decoding
// either gives a map that encodes back to an equal map, or throws wb::Error; validation against a fixed
// checkpoint tensor list either passes, and then every copy writes inside its parameter, or throws.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "fuzz_util.hpp"
#include "weightbridge/source_map.hpp"

namespace {
const std::vector<wb::TensorInfo>& checkpoint_tensors() {
  static const std::vector<wb::TensorInfo> tensors = {{"model.embed_tokens.weight", wb::DType::kBF16, {100, 16}},
                                                      {"model.layers.0.mlp.gate.e_score_correction_bias", wb::DType::kF32, {8}},
                                                      {"model.layers.0.self_attn.q_proj.weight", wb::DType::kBF16, {32, 16}},
                                                      {"model.layers.0.mlp.experts.0.up_proj.weight", wb::DType::kF8E4M3, {4, 16, 8}},
                                                      {"step", wb::DType::kI64, {}}};
  return tensors;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  wb::SourceMap map;
  try {
    map = wb::deserialize_source_map(wb::fuzz::as_bytes(data, size));
  } catch (const wb::Error&) {
    return 0;
  }
  if (!(wb::deserialize_source_map(wb::serialize_source_map(map)).copies == map.copies)) std::abort();
  try {
    wb::validate_source_map(map, checkpoint_tensors());
  } catch (const wb::Error&) {
    return 0;
  }
  // Valid: the extreme elements of every copy lie inside its parameter.
  for (const wb::SliceCopy& c : map.copies) {
    if (c.numel() == 0) continue;
    std::int64_t low = c.offset, high = c.offset;
    for (std::size_t a = 0; a < c.strides.size(); ++a) {
      const std::int64_t span = (c.box.extent[a] - 1) * c.strides[a];
      (span < 0 ? low : high) += span;
    }
    if (low < 0 || high >= map.parameters[c.parameter].numel()) std::abort();
  }
  return 0;
}

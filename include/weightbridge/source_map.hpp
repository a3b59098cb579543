// Source maps: which checkpoint elements each of a worker's parameter elements holds, as the list of
// slice copies its load_weights performs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/tensor.hpp"

namespace wb {

/// "Box `box` of checkpoint tensor `tensor` lands in parameter `parameter`": the box element with
/// box-relative multi-index i goes to parameter element (flat, row-major) offset + Σ_a i[a]·strides[a].
/// Any strides: contiguous, strided, or transposed (a transpose is a permutation of the strides).
struct SliceCopy {
  std::uint32_t tensor = 0;     // index in the checkpoint's tensor list
  std::uint32_t parameter = 0;  // index in the worker's parameter list
  Box box;                      // in the checkpoint tensor
  std::int64_t offset = 0;      // flat element offset in the parameter of box element (0, ..., 0)
  Shape strides;                // per box axis, in parameter elements

  std::int64_t numel() const { return box.numel(); }
  bool operator==(const SliceCopy&) const = default;
};

/// One worker's source map: its parameters (names, dtypes, shapes) and the slice copies that fill them.
/// Parameter elements no copy reaches are padding.
struct SourceMap {
  std::vector<TensorInfo> parameters;
  std::vector<SliceCopy> copies;

  /// Elements the copies write (each element counted once per copy that writes it).
  std::int64_t copied_elements() const;
};

/// The canonical form used to compare source maps: copies sorted by (parameter, offset), and
/// neighbours that continue one another (same tensor and parameter, adjacent boxes along one axis,
/// consistent offset and strides) merged until none is left. Two maps that write the same checkpoint
/// element to every parameter element have the same canonical form when their copies are boxes on a
/// common grid, as every layout we know of produces.
SourceMap normalize_source_map(SourceMap map);

/// Compact binary form (variable-length integers; typically 20-40 bytes per copy).
std::vector<std::byte> serialize_source_map(const SourceMap& map);
/// Throws wb::Error (kCorruptData) on a truncated or malformed buffer.
SourceMap deserialize_source_map(std::span<const std::byte> bytes);

/// Checks every copy against the checkpoint's tensor list and the parameters: indices in range, box
/// inside its tensor, dtypes equal, every written element inside its parameter. Throws naming the
/// parameter, the tensor and the copy.
void validate_source_map(const SourceMap& map, const std::vector<TensorInfo>& checkpoint_tensors);

/// Performs the copies: reads each box from `checkpoint` and writes it into `params` (host memory),
/// which must match map.parameters. What load_weights would do, as the source map describes it.
void apply_source_map(const SourceMap& map, const CheckpointReader& checkpoint, const ParameterSet& params);

}  // namespace wb

// Non-owning tensor views and a worker's named parameters.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "weightbridge/dtype.hpp"

namespace wb {

enum class MemoryKind : std::uint8_t { kHost, kCuda };

using Shape = std::vector<std::int64_t>;

/// Product of the extents (1 for a scalar).
std::int64_t shape_numel(std::span<const std::int64_t> shape);
/// Row-major strides, in elements, of a contiguous tensor of this shape.
Shape contiguous_strides(std::span<const std::int64_t> shape);
/// "[4, 128]"
std::string shape_to_string(std::span<const std::int64_t> shape);

/// A box of a tensor: per axis an offset and an extent.
struct Box {
  Shape offset;
  Shape extent;

  /// The whole tensor of this shape.
  static Box whole(std::span<const std::int64_t> shape);
  int ndim() const { return static_cast<int>(extent.size()); }
  std::int64_t numel() const { return shape_numel(extent); }
  /// True when the box lies inside a tensor of this shape and has as many axes.
  bool fits_in(std::span<const std::int64_t> shape) const;
  std::string to_string() const;  // "[0:4, 128:256]"
  bool operator==(const Box&) const = default;
};

/// Pointer, dtype, shape and strides (in elements) of memory owned elsewhere, on the host or a CUDA
/// device. Strides may be any non-negative values, so a view can be a box, a strided slice or a
/// transpose of another.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kU8;
  Shape shape;
  Shape strides;
  MemoryKind memory = MemoryKind::kHost;
  int device = 0;

  /// A row-major view of contiguous memory.
  static TensorView contiguous(void* data, DType dtype, Shape shape, MemoryKind memory = MemoryKind::kHost,
                               int device = 0);

  int ndim() const { return static_cast<int>(shape.size()); }
  std::int64_t numel() const { return shape_numel(shape); }
  std::size_t element_size() const { return dtype_size(dtype); }
  /// Bytes of numel() elements (the footprint when contiguous).
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const;

  /// The elements [start, start + length) along `axis`; throws when out of range.
  TensorView narrow(int axis, std::int64_t start, std::int64_t length) const;
  /// The slice at `index` along `axis`, that axis dropped (one expert of a stacked [experts, rows, cols]
  /// tensor is select(0, e)); throws when out of range.
  TensorView select(int axis, std::int64_t index) const;
  /// The elements inside `box`; throws when it does not fit.
  TensorView box(const Box& box) const;
  /// Axis i of the result is axis order[i] of this view (order is a permutation).
  TensorView permute(std::span<const int> order) const;
  /// Swaps two axes.
  TensorView transpose(int axis_a, int axis_b) const;
  /// Splits `axis` into `parts` (outer) × shape[axis]/parts (inner); throws unless it divides.
  TensorView unflatten(int axis, std::int64_t parts) const;
  /// Byte address of the element at this multi-index.
  std::byte* element(std::span<const std::int64_t> index) const;
};

/// Copies src into dst element by element; same dtype and shape, any strides, host memory on both
/// sides (CUDA memory is copied by the kernels). Throws wb::Error on mismatch.
void copy_tensor(const TensorView& dst, const TensorView& src);

/// True when both views hold the same bytes element by element (any strides, host memory).
bool tensors_bitwise_equal(const TensorView& a, const TensorView& b);

/// One named parameter of a worker.
struct Parameter {
  std::string name;
  TensorView view;
};

/// A worker's named parameters, in the order the worker declared them. Names are unique.
class ParameterSet {
 public:
  /// Adds a parameter; throws when the name is already present.
  void add(std::string name, TensorView view);

  const Parameter* find(std::string_view name) const;
  /// Throws kNotFound naming the parameter when absent.
  const Parameter& at(std::string_view name) const;

  std::size_t size() const { return parameters_.size(); }
  bool empty() const { return parameters_.empty(); }
  const Parameter& operator[](std::size_t i) const { return parameters_[i]; }
  auto begin() const { return parameters_.begin(); }
  auto end() const { return parameters_.end(); }
  /// Sum of nbytes() over all parameters.
  std::size_t total_bytes() const;

 private:
  std::vector<Parameter> parameters_;
  std::unordered_map<std::string, std::size_t> index_;
};

}  // namespace wb

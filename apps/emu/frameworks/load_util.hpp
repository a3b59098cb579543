// Small helpers the emulated load_weights and export_weights share.
#pragma once

#include <string_view>

#include "weightbridge/checkpoint.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::emu {

/// Reads `box` of checkpoint tensor `tensor` and copies it into `destination`, a view (any strides,
/// possibly permuted) whose shape equals box.extent. Throws naming the tensor on a shape or dtype
/// mismatch.
void load_box(const CheckpointReader& checkpoint, std::string_view tensor, const Box& box,
              const TensorView& destination);

/// Same, for the whole tensor.
void load_tensor(const CheckpointReader& checkpoint, std::string_view tensor, const TensorView& destination);

/// A box covering rows [row_start, row_start + rows) and all of the remaining axes of `shape`.
Box row_box(const Shape& shape, std::int64_t row_start, std::int64_t rows);
/// A box covering columns [col_start, col_start + cols) of a 2-D `shape`.
Box column_box(const Shape& shape, std::int64_t col_start, std::int64_t cols);

}  // namespace wb::emu

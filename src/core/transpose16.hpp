// 2-byte transposes in 32 x 32 blocks of AVX-512BW registers, for copy_tensor and tensors_bitwise_equal
// (core/tensor.cpp) where the CPU has them (chosen at run time; the build targets baseline x86-64): a block
// reads 32 whole cache lines of one side and writes or compares 32 whole lines of the other, where the 8 x 8
// blocks of 16-byte vectors read half lines whose other halves come back from L2 a tile later.
#pragma once

#include <cstdint>

namespace wb::transpose16 {

/// Whether this CPU runs the blocks (AVX-512F and BW).
bool available();

/// a[c * a_line + r] = b[r * b_line + c] for r < rows and c < columns (both multiples of 32; strides in
/// elements), block row by block row. `stream`: streaming stores (the lines bypass the caches) where a
/// block's lines of a are 64-byte aligned. Call only where available().
void copy(std::uint16_t* a, std::int64_t a_line, const std::uint16_t* b, std::int64_t b_line, std::int64_t rows,
          std::int64_t columns, bool stream);

/// Whether a[c * a_line + r] == b[r * b_line + c] for every such r and c (the same walk); false at the first
/// block that differs. Call only where available().
bool equal(const std::uint16_t* a, std::int64_t a_line, const std::uint16_t* b, std::int64_t b_line, std::int64_t rows,
           std::int64_t columns);

}  // namespace wb::transpose16

// Strided tensor copy on a CUDA device: the host API of kernels/copy_kernels.cu.
//
// A plain C++ header (no CUDA types: a stream is passed as void*, nullptr for the default stream), so
// code compiled without nvcc can call it. The functions exist only in builds with CUDA (WB_HAVE_CUDA).
// They are on the update path: they never throw, and report failures as a wb::Status.
#pragma once

#include <cstdint>

#include "weightbridge/status.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::kernels {

/// Axes a copy may have after coalescing (src/core/strided.hpp).
inline constexpr int kMaxCopyDims = 8;

/// How copy_tensor_async will copy a pair of views; plan_copy fills it without touching a device.
struct CopyPlan {
  enum class Path : std::uint8_t {
    kNone,      // nothing to copy (zero elements)
    kRows,      // innermost axis contiguous on both sides: vector_bytes-wide loads along each row
    kElements,  // anything else: one element at a time (word_bytes-wide loads), index math per element
  };
  Path path = Path::kNone;
  int ndim = 0;              // axes after sorting by destination stride and coalescing
  Shape shape;               // those axes' extents
  Shape dst_strides;         // and strides, in elements
  Shape src_strides;
  int vector_bytes = 0;      // kRows: 16, 8, 4, 2 or 1: the widest load every row start allows, at most
                             // the row length; a row's last row_bytes % vector_bytes bytes go one by one
  int word_bytes = 0;        // kElements: element size, or less when a base address is not element-aligned
  bool wide_index = false;   // 64-bit index math (more than 2^32 - 1 rows, vectors or elements)
};

/// Checks the pair and computes the plan: same dtype and shape (kInvalidArgument), CUDA memory on the
/// same device on both sides (kUnsupported otherwise), consistent strides, a destination that does
/// not write one element twice (a stride 0 on an axis longer than 1 is kInvalidArgument), at most
/// kMaxCopyDims axes after coalescing (kUnsupported). Host only: needs no device.
Status plan_copy(const TensorView& dst, const TensorView& src, CopyPlan* plan);

/// Copies src into dst element by element on `stream` (a cudaStream_t on dst.device, or nullptr for
/// the default stream) with one kernel launch, and returns without waiting. Any strides, including
/// transposes and permutations; the views must not overlap. Makes dst.device current for the launch
/// and restores the caller's device afterwards. Errors as plan_copy, plus kCuda when the launch fails.
Status copy_tensor_async(const TensorView& dst, const TensorView& src, void* stream);

/// copy_tensor_async on the default stream, then waits for that stream.
Status copy_tensor(const TensorView& dst, const TensorView& src);

namespace testing {
/// Makes every following launch use 64-bit index math even where 32 bits suffice, so tests can run
/// the wide kernels on small tensors. Process-wide; tests only.
void force_wide_index(bool force);
}  // namespace testing

}  // namespace wb::kernels

// The copy kernel's host entry points: the only way into kernels/copy_work_kernel.cu, which defines them
// (builds with CUDA only). Plain functions taking a stream (a cudaStream_t as void*): the kernels depend on
// exec's descriptor (exec/copy_work_item.hpp), exec on no kernel header.
#pragma once

#include <cstddef>
#include <cstdint>

#include "exec/copy_work_item.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

/// The grid of a program of `items` items on `device` (the kernel's instantiation with tiles, or without):
/// a warp per item, at most one wave of blocks (the warps then stride over the items). Set-up code:
/// throws wb::Error (kCuda).
int copy_kernel_blocks(std::size_t items, bool tiles, int device);

/// Enqueues the copy kernel over the `count` items at `items` (device memory) on `stream` of the current
/// device, with `blocks` blocks, and returns without waiting. `src_base` and `dst_base` are added to the
/// items' addresses (0 on the parameter side, the buffer's address on the other). The result is the
/// launch's own (cudaLaunchKernel's), never an error left behind by an earlier call.
Status launch_copy_kernel(const CopyWorkItem* items, std::uint32_t count, bool tiles, std::uint64_t src_base,
                          std::uint64_t dst_base, int blocks, void* stream) noexcept;

}  // namespace wb::exec

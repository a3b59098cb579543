// The CUDA back end of the copy compiler: a round's pack or assemble as one descriptor array for the copy
// kernel (kernels/copy_work_kernel.cu), with the same copies and the same result as the CPU copy program
// (exec/pack.hpp):
//
//   pack      parameters (read only) -> buffer: each copy's box contiguous and row-major at its buffer offset
//   assemble  buffer -> parameters
//
// "Plan once, post many": at connect, compile_copy_work takes the compiled copies (exec/copy_compiler.hpp)
// and cuts every one into work items of at most a few KiB (pieces of contiguous runs, or 32-row tiles of a
// transposed pair of axes), all in one array; exec::DeviceCopyProgram uploads it once and every update
// launches one kernel for the whole array.
//
// The kernel runs the items in any order and in parallel, so the destinations of the copies must be
// disjoint: the compiler proves it, else compilation refuses the copies (the CPU program also accepts
// overlapping destinations, the later copy winning; a plan never has them).
//
// Needs no device: the descriptors are built, checked and interpreted on the host (tests).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "exec/copy_compiler.hpp"
#include "exec/copy_work_item.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

/// What compilation made of the copies (for tests, logs and benchmarks).
struct CopyWorkStats {
  std::int64_t copies = 0;           // input copies that move at least one element
  std::int64_t bytes = 0;            // payload bytes per execution
  std::int64_t items = 0;            // work items (descriptors)
  std::int64_t run_items = 0;
  std::int64_t transpose_items = 0;
  std::int64_t transposed_bytes = 0; // of those bytes, moved by transpose tiles
  std::int64_t descriptor_bytes = 0; // the array uploaded to the device
};

/// The compiled descriptor array, in host memory: exactly what DeviceCopyProgram uploads.
struct CopyWork {
  CopyDirection direction{};
  std::vector<CopyWorkItem> items;
  CopyWorkStats stats;
  bool has_transposes = false;
  std::uint64_t buffer = 0;  // the buffer's address at compilation; its alignment is built into the items
};

/// Lays out `compiled` for the kernel; needs no device. `parameters[p]` is parameter p's base address,
/// `buffer` the buffer's (device or mapped host addresses; nothing is dereferenced). Throws wb::Error:
/// kInvalidArgument for destinations that are not disjoint (naming the two copies, or the copy that
/// writes a byte twice, and where) or a parameter without a base address; kUnsupported when disjointness
/// could not be decided or past 2^31 work items.
CopyWork compile_copy_work(const CompiledCopies& compiled, std::span<std::byte* const> parameters, std::byte* buffer);

/// compile_copies (with its errors) and then the above.
CopyWork compile_copy_work(CopyDirection direction, std::span<const BufferCopy> copies,
                           std::span<std::byte* const> parameters, std::span<const std::int64_t> parameter_bytes,
                           std::byte* buffer, std::int64_t buffer_bytes);

/// Why the kernel could not execute `item` as the compiler promises (a kind, width or word it does not
/// know, misaligned vectors, a tile out of bounds), with `src` and `dst` its absolute addresses; empty
/// when it can.
std::string malformed_item(const CopyWorkItem& item, std::uint64_t src, std::uint64_t dst);

/// Checks that `buffer` (nullptr: the compiled one) may take `work` in the compiled buffer's place: the
/// same alignment modulo 16. kInvalidArgument otherwise.
Status check_buffer_alignment(const CopyWork& work, const std::byte* buffer);

namespace testing {
/// Performs `work` on host memory (compiled with host addresses) by interpreting the very descriptors the
/// kernel reads, with the kernel's own address arithmetic (exec/copy_work_item.hpp): run items vector by
/// vector and edge byte by edge byte, tiles through a tile of the kernel's pitch, loaded and stored in the
/// kernel's vectors and words; only the order of the lanes differs. `buffer` as for
/// DeviceCopyProgram::execute (nullptr: the compiled one). kInvalidArgument for a misaligned buffer or a
/// malformed item.
Status execute_on_host(const CopyWork& work, std::byte* buffer = nullptr);
}  // namespace testing

}  // namespace wb::exec

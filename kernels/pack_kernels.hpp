// Batched pack and assemble on a CUDA device: the host API of kernels/pack_kernels.cu.
//
// The device counterpart of exec::CopyProgram (src/exec/pack.hpp), with the same copies and the same result:
//
//   pack      parameters (read only) -> buffer: each copy's box contiguous and row-major at its buffer offset
//   assemble  buffer -> parameters
//
// "Plan once, post many": at connect, compile_copy_work validates the copies and cuts every one of them into
// work items of at most a few KiB (pieces of contiguous runs, or 32-row tiles of a transposed pair of axes),
// all in one descriptor array; DeviceCopyProgram uploads that array once. Every update, execute() launches
// one kernel for the whole array, and never throws.
//
// The kernel runs the items in any order and in parallel, so the destinations of the copies must be
// disjoint: compilation proves it or refuses the copies (exec::CopyProgram also accepts overlapping
// destinations, the later copy winning; a plan never has them).
//
// A plain C++ header (a stream is a void*, nullptr for the default stream), usable without nvcc. Its
// functions exist only in builds with CUDA (WB_HAVE_CUDA). nvcc compiles the kernels without MPI's headers,
// which weightbridge/round_schedule.hpp needs: so the compiler reads copies as CopyDescription, and the
// overloads taking BufferCopy (round_schedule.hpp) are inline, at the end, for code built by the host
// compiler.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "weightbridge/status.hpp"

namespace wb::exec {
// Defined in src/exec/pack.hpp with kPack = 0 and kAssemble = 1 (checked at the end of this header).
enum class CopyDirection : std::uint8_t;
}  // namespace wb::exec

namespace wb::kernels {

/// One BufferCopy, as the compiler reads it: the fields of BufferCopy and its SliceCopy, shapes as views.
struct CopyDescription {
  std::uint32_t parameter = 0;
  std::int64_t offset = 0;                   // in parameter elements, of box element (0, ..., 0)
  std::span<const std::int64_t> box_offset;  // in the checkpoint tensor (only named in errors)
  std::span<const std::int64_t> extent;
  std::span<const std::int64_t> strides;     // per box axis, in parameter elements
  std::int64_t buffer_offset = 0;            // bytes
  std::uint8_t element_bytes = 0;
};

/// One work item: what one warp copies. 32 bytes, read by the kernel with two 16-byte loads.
///
/// kRuns: `count` runs of `length` bytes; run i goes from src + i * src_stride to dst + i * dst_stride.
///   `width` (1, 2, 4, 8 or 16) is the vector each lane moves: src and dst agree modulo width, and so do
///   the strides when count > 1, so every run has the same unaligned head (up to the first width-aligned
///   source byte) and tail, which go byte by byte.
/// kTranspose: a tile of `count` (<= 32) source rows by `length` (<= 32, or 16 for 8-byte elements) source
///   columns of `width`-byte elements: element (r, c) goes from src + r * src_stride + c * width to
///   dst + c * dst_stride + r * width. `access` (dividing width) is the word the lanes load and store, as
///   wide as the addresses allow.
/// Parameter-side addresses are absolute; buffer-side ones are relative to the buffer, so that one program
/// serves every pipeline slot of equal alignment.
struct CopyWorkItem {
  enum Kind : std::uint8_t { kRuns = 0, kTranspose = 1 };
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::int32_t src_stride = 0;
  std::int32_t dst_stride = 0;
  std::uint16_t count = 0;
  std::uint16_t length = 0;
  std::uint8_t kind = kRuns;
  std::uint8_t width = 1;
  std::uint8_t access = 1;
  std::uint8_t padding = 0;  // to 32 bytes
};
static_assert(sizeof(CopyWorkItem) == 32);

/// Bytes a run item moves at most (a lane's eight 16-byte vectors, times the 32 lanes of a warp); a longer
/// run is cut into pieces of this size, the first one up to 15 bytes longer so the others start aligned.
inline constexpr std::int64_t kWorkItemBytes = 4096;
/// Source rows of a transpose tile; its columns: tile_columns(element bytes).
inline constexpr int kTileRows = 32;
constexpr int tile_columns(int element_bytes) { return element_bytes == 8 ? 16 : 32; }

/// What compilation made of the copies (for tests, logs and benchmarks).
struct DeviceCopyStats {
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
  exec::CopyDirection direction{};
  std::vector<CopyWorkItem> items;
  DeviceCopyStats stats;
  bool has_transposes = false;
  std::uint64_t buffer = 0;  // the buffer's address at compilation; its alignment is built into the items
};

/// Compiles `copies`; needs no device. `parameters[p]` is parameter p's base address and
/// `parameter_bytes[p]` its size, `buffer` and `buffer_bytes` the buffer's (device or mapped host
/// addresses; nothing is dereferenced). Copies with an empty box are ignored. Throws wb::Error
/// (kInvalidArgument) naming the direction, the copy's index, its parameter and box, for a copy that does
/// not fit, with the rules of exec::CopyProgram: parameter index out of range, element size 0, negative
/// extent or buffer offset, strides not one per axis, more than 16 axes, a range outside its parameter or
/// the buffer, sizes past 64 bits; and for destinations that are not disjoint (two copies, or one copy
/// with itself: "overlap"). kUnsupported past 2^31 work items.
CopyWork compile_copy_work(exec::CopyDirection direction, std::span<const CopyDescription> copies,
                           std::span<std::byte* const> parameters, std::span<const std::int64_t> parameter_bytes,
                           std::byte* buffer, std::int64_t buffer_bytes);

/// A compiled copy program in the memory of one device: the descriptor array, uploaded once.
class DeviceCopyProgram {
 public:
  /// An empty program: execute launches nothing.
  DeviceCopyProgram() = default;
  /// Uploads `work` to `device` and sizes the grid from its multiprocessors (set-up: throws kCuda when the
  /// runtime fails, kUnsupported without a device).
  DeviceCopyProgram(CopyWork work, int device);
  ~DeviceCopyProgram();
  DeviceCopyProgram(DeviceCopyProgram&& other) noexcept;
  DeviceCopyProgram& operator=(DeviceCopyProgram&& other) noexcept;
  DeviceCopyProgram(const DeviceCopyProgram&) = delete;
  DeviceCopyProgram& operator=(const DeviceCopyProgram&) = delete;

  /// Launches the one kernel that performs every copy on `stream` (a cudaStream_t of the program's device,
  /// or nullptr) and returns without waiting; nothing for an empty program. Makes the device current for
  /// the launch and restores the caller's. kCuda when the launch fails.
  Status execute(void* stream) const noexcept;
  /// The same on another buffer of the compiled size (another pipeline slot): it must have the compiled
  /// buffer's alignment modulo 16 (kInvalidArgument otherwise).
  Status execute(void* stream, std::byte* buffer) const noexcept;

  const CopyWork& work() const { return work_; }
  const DeviceCopyStats& stats() const { return work_.stats; }
  std::int64_t bytes() const { return work_.stats.bytes; }
  bool empty() const { return work_.items.empty(); }
  int device() const { return device_; }
  int blocks() const { return blocks_; }  // of the launch

 private:
  void release() noexcept;

  CopyWork work_;
  void* device_items_ = nullptr;
  int device_ = 0;
  int blocks_ = 0;
};

namespace testing {
/// Performs `work` on host memory (compiled with host addresses) by interpreting the very descriptors the
/// kernel reads, with the kernel's own address arithmetic: only the order of the lanes differs. `buffer`
/// as for DeviceCopyProgram::execute (nullptr: the compiled one). kInvalidArgument for a misaligned buffer
/// or a malformed descriptor.
Status execute_on_host(const CopyWork& work, std::byte* buffer = nullptr);
}  // namespace testing

}  // namespace wb::kernels

#ifndef __CUDACC__
#include "../src/exec/pack.hpp"
#include "weightbridge/round_schedule.hpp"

namespace wb::kernels {

static_assert(static_cast<int>(exec::CopyDirection::kPack) == 0 &&
              static_cast<int>(exec::CopyDirection::kAssemble) == 1);

/// Views of `copies` for compile_copy_work; valid while `copies` is.
inline std::vector<CopyDescription> describe_copies(std::span<const BufferCopy> copies) {
  std::vector<CopyDescription> described;
  described.reserve(copies.size());
  for (const BufferCopy& c : copies)
    described.push_back({c.copy.parameter, c.copy.offset, c.copy.box.offset, c.copy.box.extent, c.copy.strides,
                         c.buffer_offset, c.element_bytes});
  return described;
}

/// compile_copy_work on a round's list of BufferCopy.
inline CopyWork compile_copy_work(exec::CopyDirection direction, std::span<const BufferCopy> copies,
                                  std::span<std::byte* const> parameters, std::span<const std::int64_t> parameter_bytes,
                                  std::byte* buffer, std::int64_t buffer_bytes) {
  const std::vector<CopyDescription> described = describe_copies(copies);
  return compile_copy_work(direction, std::span<const CopyDescription>(described), parameters, parameter_bytes, buffer,
                           buffer_bytes);
}

}  // namespace wb::kernels
#endif

// The copy compiler: the one front end of the CPU copy programs (exec/pack.hpp) and the CUDA kernels'
// descriptor arrays (exec/copy_work.hpp). "Plan once, post many": at connect, each round's pack or
// assemble list of BufferCopy (round_schedule.hpp) is compiled once; both back ends only lay out what it
// produced.
//
// Compilation works in bytes:
//   1. every copy is validated against the parameter and buffer sizes and put in its byte normal form: a
//      run of `run` contiguous bytes (contiguous in the parameter and, the buffer being row-major, in the
//      buffer too) repeated over outer axes, each with a parameter and a buffer stride; unit axes dropped,
//      axes contiguous on both sides merged;
//   2. the destinations are proven disjoint or not (pack: buffer ranges; assemble: parameter bytes),
//      exactly for boxes of one affine map and translates of one shape, otherwise by listing the bytes
//      written;
//   3. copies that continue one another merge: when the destinations are disjoint, in buffer order (pieces
//      need not be listed one after the other), and the result runs in parameter order (pieces of one
//      tensor read or written one after the other); otherwise neighbours only, in the list's order (where
//      destinations overlap the later copy wins).
// The result of performing the compiled copies in order is that of performing the list in order, element
// by element (tests/support/schedule_replay.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "plan/round_schedule.hpp"

namespace wb::exec {

enum class CopyDirection : std::uint8_t {
  kPack,      // parameters -> buffer
  kAssemble,  // buffer -> parameters
};

/// "pack" or "assemble".
const char* direction_name(CopyDirection direction);

/// Most axes a copy may have, as round schedules allow; merging may add one.
inline constexpr std::size_t kMaxCopyAxes = 16;
inline constexpr std::size_t kMaxCompiledAxes = kMaxCopyAxes + 1;

/// One outer axis of a copy, strides in bytes.
struct ByteAxis {
  std::int64_t extent = 0;
  std::int64_t param_stride = 0;
  std::int64_t buffer_stride = 0;
  bool operator==(const ByteAxis&) const = default;
};

/// A copy in its byte normal form (outermost axis first; the innermost axis, if any, is not contiguous
/// on both sides: the run took every axis that was).
struct ByteCopy {
  std::uint32_t parameter = 0;
  std::int64_t param_offset = 0;   // bytes from the parameter's base
  std::int64_t buffer_offset = 0;  // bytes from the buffer's
  std::int64_t run = 0;            // contiguous bytes on both sides
  std::vector<ByteAxis> axes;
  std::int64_t bytes() const;
  /// True when no two of its elements land on the same parameter byte (a sufficient test: sorted by
  /// |stride|, each axis steps past everything the smaller ones reach).
  bool writes_each_parameter_byte_once() const;
};

/// What step 2 found.
enum class Destinations : std::uint8_t {
  kDisjoint,   // the copies may run in any order, also in parallel
  kOverlap,    // two copies (or one with itself) write a common byte: their order matters
  kUndecided,  // too many separate pieces to list: treated as overlapping
};

struct CompiledCopies {
  CopyDirection direction = CopyDirection::kPack;
  std::vector<ByteCopy> copies;  // merged, in execution order
  std::int64_t input_copies = 0;  // copies of the list that move at least one element
  std::int64_t bytes = 0;         // payload bytes per execution
  Destinations destinations = Destinations::kDisjoint;
  /// kOverlap: the later copy of the first overlapping pair and where, as an error message names them
  /// ("assemble copy 5 (parameter ...): its destination overlaps that of assemble copy 2 (...) at
  /// parameter 0 bytes [96, 128)"); kUndecided: why.
  std::string overlap;
};

/// Compiles `copies` (steps 1-3 above). `parameter_bytes[p]` is the size of parameter p in bytes,
/// `buffer_bytes` the size of the buffer: every range each copy touches must lie inside them. Copies with
/// an empty box are ignored. Throws wb::Error (kInvalidArgument) naming the direction, the copy's index,
/// its parameter and box for a copy that does not fit: parameter index out of range, element size 0,
/// negative extent or buffer offset, strides not one per axis, more than 16 axes, a range outside its
/// parameter or the buffer, sizes past 64 bits.
CompiledCopies compile_copies(CopyDirection direction, std::span<const BufferCopy> copies,
                              std::span<const std::int64_t> parameter_bytes, std::int64_t buffer_bytes);

/// "pack copy 3 (parameter 1, box [0:4, 2:5], offset 2, strides [8, 1], buffer offset 64, element bytes
/// 4)": how errors name a copy of the list.
std::string describe_copy(CopyDirection direction, std::size_t index, const BufferCopy& copy);

}  // namespace wb::exec

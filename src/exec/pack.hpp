// CPU pack and assemble of the round executor: "plan once, post many".
//
// At connect, each round's list of BufferCopy (round_schedule.hpp) is compiled once into a CopyProgram: the
// copy compiler (exec/copy_compiler.hpp, shared with the CUDA kernels' descriptors) validates, normalizes,
// proves destinations disjoint or not and merges; this back end turns each compiled copy into an op (a
// transposed pair of axes recognized) and chooses its stores. Every update then executes the program with
// the parameters' base addresses and the buffer: runs of bytes (memcpy, fixed-size copies for short runs,
// streaming stores for long runs of a large program, source prefetch for strided runs) and a cache-blocked
// SSE2/AVX2 transpose for 1/2/4/8-byte elements (exec/cpu_copy_kernels.hpp). Execution does no checks and
// cannot fail. Verifying, a program compiled with digest segments also digests them, in the same pass over
// the bytes (exec/digest.hpp).
//
//   pack      parameters (read only) -> buffer: the buffer holds each copy's box contiguous, row-major
//   assemble  buffer -> parameters
//
// Host memory only, one thread. The result equals the element-by-element definition (tests/support/
// schedule_replay.hpp) bit for bit, also when copies overlap: later copies win, and within one copy the
// later row-major element.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "exec/copy_compiler.hpp"
#include "exec/digest.hpp"
#include "plan/round_schedule.hpp"

namespace wb::exec {

/// Where the stores go. Streaming (non-temporal) stores skip the read-for-ownership of the destination and
/// leave the caches alone: the right thing when a program moves far more than the caches hold and nobody
/// on this core reads the destination soon (a send buffer handed to the NIC, parameters written for the
/// GPU or the next inference step).
enum class StoreHint : std::uint8_t {
  kAuto,       // kStreaming when the program moves at least kStreamingProgramBytes, else kCached
  kCached,     // ordinary stores only
  kStreaming,  // streaming stores for runs of at least kStreamingMinRunBytes and whole transpose tiles
               // (where the destination rows are 16-byte aligned)
};

/// A range of the buffer: one segment of a verified update (exec/verify.hpp).
struct BufferRange {
  std::int64_t offset = 0, bytes = 0;
};

struct CopyProgramOptions {
  StoreHint stores = StoreHint::kAuto;
  /// Verifying: the buffer's segments, sorted and disjoint. The program then digests every byte of them it
  /// moves into execute's `digests[segment]` (exec/digest.hpp) in the pass that copies it: the bytes are
  /// read once, for both. A byte several copies read (assemble) counts once; a pack whose destinations
  /// overlap digests the buffer after its copies instead (only the last write of a byte counts).
  std::span<const BufferRange> digest_segments;
  static constexpr std::int64_t kStreamingProgramBytes = std::int64_t{16} << 20;
  static constexpr std::int64_t kStreamingMinRunBytes = 1024;
};

/// What compilation made of the copies (for tests, logs and benchmarks).
struct CopyProgramStats {
  std::int64_t copies = 0;          // input copies that move at least one element
  std::int64_t ops = 0;             // operations after merging
  std::int64_t run_ops = 0;         // ops copying runs of bytes (possibly one run)
  std::int64_t transpose_ops = 0;   // ops using the blocked transpose
  std::int64_t bytes = 0;           // payload bytes per execution
  std::int64_t runs = 0;            // contiguous runs the run ops copy per execution
  std::int64_t transpose_elements = 0;
  bool streaming = false;           // some ops use streaming stores
  bool reordered = false;           // ops run in parameter order (destinations disjoint), not the list's
};

class CopyProgram {
 public:
  /// An empty program: execute does nothing.
  CopyProgram() = default;

  /// Compiles `copies` (compile_copies, copy_compiler.hpp): the result is that of performing them in
  /// order (later copies win where destinations overlap). Throws wb::Error (kInvalidArgument) naming the
  /// direction, the copy's index, its parameter and box for a copy that does not fit its parameter or the
  /// buffer.
  CopyProgram(CopyDirection direction, std::span<const BufferCopy> copies,
              std::span<const std::int64_t> parameter_bytes, std::int64_t buffer_bytes,
              CopyProgramOptions options = {});
  /// The program of copies already compiled.
  explicit CopyProgram(const CompiledCopies& compiled, CopyProgramOptions options = {});

  /// Performs the copies. `parameters[p]` is parameter p's base address (host memory; for a pack program
  /// only read), `buffer` the buffer's. Preconditions (not checked): `parameters` has an entry for every
  /// parameter a copy names, and the memory has at least the sizes given at compilation. Ranges read and
  /// written must not overlap each other (pack: parameters vs buffer; assemble: buffer vs parameters).
  /// Streaming stores are fenced before returning. `digests` (one per digest segment; may be null: no
  /// digests): what the copies move is added to them.
  void execute(std::span<std::byte* const> parameters, std::byte* buffer, DigestSums* digests = nullptr) const noexcept;

  CopyDirection direction() const { return direction_; }
  const CopyProgramStats& stats() const { return stats_; }
  /// Payload bytes per execution.
  std::int64_t bytes() const { return stats_.bytes; }
  bool empty() const { return ops_.empty(); }

  /// Per axis, in bytes, oriented from the source to the destination of the copy.
  struct Axis {
    std::int64_t extent = 0;
    std::int64_t src_stride = 0;
    std::int64_t dst_stride = 0;
  };
  enum class Kind : std::uint8_t {
    kRuns,       // `run` bytes at every point of the outer axes
    kTranspose,  // at every point of the outer axes: a rows x cols transpose of `run`-byte elements
  };
  struct Op {
    std::int64_t param_offset = 0;   // bytes from the parameter's base
    std::int64_t buffer_offset = 0;  // bytes from the buffer
    std::uint32_t parameter = 0;
    Kind kind = Kind::kRuns;
    bool streaming = false;
    std::int32_t prefetch_runs = 0;  // kRuns: prefetch the source this many runs ahead (0: none)
    std::uint16_t axis_count = 0;    // outer axes, outermost first
    std::uint32_t axis_begin = 0;    // in axes_
    std::int64_t run = 0;            // kRuns: bytes per run; kTranspose: element bytes (1, 2, 4 or 8)
    // kTranspose: source rows x cols elements, columns contiguous in the source; destination cols x rows,
    // rows contiguous. Strides in bytes.
    std::int64_t rows = 0, cols = 0, src_row_stride = 0, dst_row_stride = 0;
    std::uint32_t span_begin = 0, span_count = 0;  // digesting: the op's spans, in spans_
  };
  /// Digesting: a range of the buffer an op moves and the digest it goes to (segment -1: none, another op
  /// reads those bytes too and digests them, or no segment holds them). An op's spans cover its buffer
  /// range, in buffer order.
  struct DigestSpan {
    std::int64_t begin = 0, end = 0;  // buffer offsets
    std::int64_t segment_offset = 0;  // where the segment starts in the buffer
    std::int32_t segment = -1;
  };
  /// The compiled operations, in execution order (for tests).
  std::span<const Op> ops() const { return ops_; }
  std::span<const Axis> axes(const Op& op) const { return {axes_.data() + op.axis_begin, op.axis_count}; }
  std::span<const DigestSpan> spans(const Op& op) const { return {spans_.data() + op.span_begin, op.span_count}; }
  /// Digesting: whether the digests are taken after the copies, from the buffer (a pack whose destinations
  /// overlap), rather than as they copy.
  bool digests_after() const { return !after_segments_.empty(); }

 private:
  CopyDirection direction_ = CopyDirection::kPack;
  std::vector<Op> ops_;
  std::vector<Axis> axes_;
  std::vector<DigestSpan> spans_;
  std::vector<BufferRange> after_segments_;  // digests_after(): the segments, digested from the buffer
  void add_digest_spans(const CompiledCopies& compiled, std::span<const BufferRange> segments);
  CopyProgramStats stats_;
};

}  // namespace wb::exec

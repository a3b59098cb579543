// A round's FP8 pack cast straight into the send buffer (QuantizedPack::cast_in_pack): the pieces of the
// converted tensors are read from the trainer's own bf16 (f16, f32, f64) parameters and written to the
// buffer as e4m3 codes, with no shadow in between and no second copy of the codes.
//
// A block the piece covers whole, which this rank holds whole and shares with no other trainer, gets its
// amax from the same read: its rows are read once for the amax and again, from the cache, for the codes,
// and the scale is written to the scale parameter as it is taken. Every other block (cut by the piece's
// edges, held in part, shared and so waiting for the amax exchange, or packed as a scale in a round that
// does not cast it whole first) is marked at compile time (QuantizedPack::need_amax), and quantize takes
// its amax and scale before the rounds. The codes and scales equal the shadow path's bit for bit: the same
// elements make each amax, and the same kernels cast (core/fp8.hpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "exec/quantized_pack.hpp"
#include "plan/round_schedule.hpp"

namespace wb::exec {

class Fp8CastProgram {
 public:
  Fp8CastProgram() = default;
  /// Takes the copies of `copies` that read a shadow of `quantized`; the others are appended to `rest`, for
  /// the round's CopyProgram (run after this one: its scale copies read the scales the casts take). Throws
  /// wb::Error (kInternal) naming the copy when a cast is not 2-D, leaves the buffer or overlaps another
  /// copy's bytes in it.
  Fp8CastProgram(std::span<const BufferCopy> copies, QuantizedPack& quantized, std::int64_t buffer_bytes,
                 std::vector<BufferCopy>& rest);

  /// Casts into `buffer`; `parameters[p]` is the trainer's parameter p (host memory, read only). After
  /// QuantizedPack::quantize of the same update.
  void execute(std::span<std::byte* const> parameters, std::byte* buffer) const noexcept;

  bool empty() const { return casts_.empty(); }
  /// Code bytes per execution.
  std::int64_t bytes() const { return bytes_; }
  /// Blocks whose amax the casts take as they read them (for tests and benchmarks).
  std::int64_t own_amax_blocks() const { return own_amax_blocks_; }
  /// Blocks cast again since construction: their amax gave another scale than the last update's.
  std::int64_t recast_blocks() const { return recast_blocks_; }

 private:
  struct Cast {
    SliceCopy copy;                // in the trainer parameter's elements (the shadow's are the same)
    std::int64_t buffer_offset = 0;
    std::uint32_t parameter = 0;   // the trainer's
    DType dtype = DType::kBF16;
    fp8::BlockScale* scales = nullptr;  // the tensor's, per block
    float* scale_values = nullptr;      // its scale parameter
    std::int64_t scale_cols = 0;
    std::int64_t first_block_row = 0, first_block_col = 0, block_grid_cols = 0;
    std::vector<std::uint8_t> own_amax;  // per block of the cast's grid, row-major
    // Per chunk of a band: how many of its own blocks' scales changed at the last update (cast_rows).
    mutable std::vector<std::uint16_t> changed;
  };
  std::vector<Cast> casts_;
  fp8::ScaleRule rule_ = fp8::ScaleRule::kPerBlockCast;
  std::int64_t block_rows_ = 128, block_cols_ = 128;
  std::int64_t bytes_ = 0, own_amax_blocks_ = 0;
  mutable std::vector<std::uint16_t> running_;  // a chunk's column or block maxima (execute's scratch, one thread)
  mutable std::int64_t recast_blocks_ = 0;
  mutable std::vector<fp8::CastTable> tables_;  // a chunk's blocks' casts (the same)
  // Columns of a band cast together. Narrow chunks that stay in L2 (512 columns: 128 KiB) read the rows in
  // short runs, which the hardware prefetches badly: 11.6 ms for bench_fp8_pack's default against 8.8 ms
  // for whole rows of up to 8192 columns (2 MiB a band, the second read from L3).
  static constexpr std::int64_t kChunkColumns = 8192;
  // A chunk is cast speculatively while at most 1 in kSpeculateAtMost of its own blocks changed scale at the
  // last update.
  static constexpr std::int64_t kSpeculateAtMost = 8;
  void cast_rows(const Cast& cast, const std::uint16_t* values, std::byte* buffer) const noexcept;
  bool take_scale(const Cast& cast, std::int64_t block_row, std::int64_t g, float amax) const noexcept;
  /// Returns how many of the chunk's own blocks changed scale (and were cast again).
  std::int64_t cast_speculatively(const Cast& cast, const std::uint16_t* values, std::uint8_t* codes, std::int64_t i,
                          std::int64_t band_end, std::int64_t g0, std::int64_t g1, std::int64_t j0, std::int64_t j1) const noexcept;
};

}  // namespace wb::exec

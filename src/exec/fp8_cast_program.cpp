#include "exec/fp8_cast_program.hpp"

#include <algorithm>
#include <bit>
#include <limits>
#include <string>
#include <tuple>

#include "core/fp8.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {
namespace {

bool same_scale(const fp8::BlockScale& a, const fp8::BlockScale& b) {
  return std::bit_cast<std::uint32_t>(a.scale_inv) == std::bit_cast<std::uint32_t>(b.scale_inv) &&
         std::bit_cast<std::uint32_t>(a.factor) == std::bit_cast<std::uint32_t>(b.factor) && a.divide == b.divide;
}

std::string describe(const BufferCopy& c, std::size_t index) {
  return "FP8 pack: copy " + std::to_string(index) + " (tensor " + std::to_string(c.copy.tensor) + ", buffer bytes [" +
         std::to_string(c.buffer_offset) + ", " + std::to_string(c.buffer_offset + c.bytes()) + "))";
}

}  // namespace

Fp8CastProgram::Fp8CastProgram(std::span<const BufferCopy> copies, QuantizedPack& quantized, std::int64_t buffer_bytes,
                               std::vector<BufferCopy>& rest) {
  const layout::QuantizationConfig& config = quantized.config();
  rule_ = config.rule;
  block_rows_ = config.block_rows;
  block_cols_ = config.block_cols;
  std::vector<std::tuple<std::int64_t, std::int64_t, bool, std::size_t>> ranges;  // begin, end, cast, index
  std::vector<std::pair<std::uint32_t, std::int64_t>> own;                       // blocks cast with their amax
  std::vector<std::size_t> scale_copies;
  for (std::size_t k = 0; k < copies.size(); ++k) {
    const BufferCopy& c = copies[k];
    const std::optional<QuantizedPack::CastSource> source = quantized.cast_source(c.copy);
    if (c.bytes() > 0) ranges.emplace_back(c.buffer_offset, c.buffer_offset + c.bytes(), source.has_value(), k);
    if (!source) {
      if (quantized.scale_parameter(c.copy.parameter)) scale_copies.push_back(rest.size());
      rest.push_back(c);
      continue;
    }
    if (c.copy.box.ndim() != 2 || c.element_bytes != 1 || c.buffer_offset < 0 || c.buffer_offset + c.bytes() > buffer_bytes)
      throw Error(ErrorCode::kInternal, describe(c, k) + ": not a 2-D piece of fp8 codes inside the buffer of " +
                                            std::to_string(buffer_bytes) + " bytes");
    if (c.copy.numel() == 0) continue;
    Cast cast;
    cast.copy = c.copy;
    cast.buffer_offset = c.buffer_offset;
    cast.parameter = source->parameter;
    cast.dtype = source->dtype;
    cast.scales = quantized.block_scales(source->tensor_blocks);
    cast.scale_values = quantized.scale_memory(source->tensor_blocks);
    cast.scale_cols = quantized.scale_cols(source->tensor_blocks);
    const Box& box = c.copy.box;
    const std::int64_t r0 = box.offset[0], r1 = r0 + box.extent[0], c0 = box.offset[1], c1 = c0 + box.extent[1];
    cast.first_block_row = r0 / block_rows_;
    cast.first_block_col = c0 / block_cols_;
    cast.block_grid_cols = (c1 - 1) / block_cols_ - cast.first_block_col + 1;
    const std::int64_t grid_rows = (r1 - 1) / block_rows_ - cast.first_block_row + 1;
    cast.own_amax.assign(static_cast<std::size_t>(grid_rows * cast.block_grid_cols), 0);
    const std::int64_t chunk_blocks = std::max<std::int64_t>(1, kChunkColumns / block_cols_);
    cast.changed.assign(static_cast<std::size_t>(grid_rows * ((cast.block_grid_cols + chunk_blocks - 1) / chunk_blocks)),
                        std::numeric_limits<std::uint16_t>::max());  // no scale taken yet: the first update reads twice
    running_.resize(static_cast<std::size_t>(
        std::max({kChunkColumns, block_cols_, fp8::kMagnitudeLanes * std::max<std::int64_t>(1, kChunkColumns / block_cols_)})));
    tables_.resize(static_cast<std::size_t>(std::max<std::int64_t>(1, kChunkColumns / block_cols_)));
    const Shape& shape = quantized.tensor_shape(source->tensor_blocks);  // where the edge blocks end
    const bool rows_of_bf16 = cast.dtype == DType::kBF16 && c.copy.strides[1] == 1;
    for (std::int64_t gr = 0; gr < grid_rows; ++gr)
      for (std::int64_t gc = 0; gc < cast.block_grid_cols; ++gc) {
        const std::int64_t br = cast.first_block_row + gr, bc = cast.first_block_col + gc;
        const std::int64_t block = br * cast.scale_cols + bc;
        // Covered whole: the piece's box holds every row and column of the block that the tensor has.
        const bool covered = r0 <= br * block_rows_ && c0 <= bc * block_cols_ &&
                             r1 >= std::min(shape[0], (br + 1) * block_rows_) && c1 >= std::min(shape[1], (bc + 1) * block_cols_);
        if (rows_of_bf16 && covered && quantized.whole_block(source->tensor_blocks, block)) {
          cast.own_amax[static_cast<std::size_t>(gr * cast.block_grid_cols + gc)] = 1;
          own.emplace_back(source->tensor_blocks, block);
          ++own_amax_blocks_;
        } else {
          quantized.need_amax(source->tensor_blocks, block);
        }
      }
    bytes_ += c.bytes();
    casts_.push_back(std::move(cast));
  }
  // In buffer order: a range that starts before the furthest end so far overlaps some earlier range.
  std::sort(ranges.begin(), ranges.end());
  std::int64_t furthest = 0, furthest_cast = 0;  // ends, of all ranges and of the casts' ranges
  for (const auto& [begin, end, is_cast, index] : ranges) {
    if ((is_cast && begin < furthest) || begin < furthest_cast)
      throw Error(ErrorCode::kInternal, describe(copies[index], index) +
                                            " overlaps another copy in the buffer, where a cast cannot follow the copies' order");
    furthest = std::max(furthest, end);
    if (is_cast) furthest_cast = std::max(furthest_cast, end);
  }
  // A scale packed in this round is taken by a cast of this round (which runs first) or before the rounds.
  std::sort(own.begin(), own.end());
  for (const std::size_t k : scale_copies) {
    const BufferCopy& c = rest[k];
    const std::uint32_t at = *quantized.scale_parameter(c.copy.parameter);
    const std::int64_t cols = quantized.scale_cols(at);
    const Box& box = c.copy.box;
    for (std::int64_t i = 0; i < box.extent[0]; ++i)
      for (std::int64_t j = 0; j < box.extent[1]; ++j) {
        const std::int64_t block = (box.offset[0] + i) * cols + box.offset[1] + j;
        if (!std::binary_search(own.begin(), own.end(), std::make_pair(at, block))) quantized.need_amax(at, block);
      }
  }
}

void Fp8CastProgram::cast_rows(const Cast& cast, const std::uint16_t* values, std::byte* buffer) const noexcept {
  const SliceCopy& copy = cast.copy;
  const std::int64_t rows = copy.box.extent[0], cols = copy.box.extent[1];
  const std::int64_t r0 = copy.box.offset[0], c0 = copy.box.offset[1], lead = c0 % block_cols_;
  auto* codes = reinterpret_cast<std::uint8_t*>(buffer + cast.buffer_offset);
  // A band of block rows at a time, in chunks of whole block columns (kChunkColumns): where the cast takes
  // some of a chunk's amaxes, the magnitudes' column maxima over its rows first, then those blocks' scales,
  // then the chunk's codes, row by row, while its rows are still in the cache. From the second update on,
  // one read instead (cast_speculatively).
  const std::int64_t chunk_blocks = std::max<std::int64_t>(1, kChunkColumns / block_cols_);
  const std::int64_t chunks = (cast.block_grid_cols + chunk_blocks - 1) / chunk_blocks;
  for (std::int64_t i = 0; i < rows;) {
    const std::int64_t block_row = (r0 + i) / block_rows_;
    const std::int64_t band_end = std::min(rows, (block_row + 1) * block_rows_ - r0);
    const std::uint8_t* own =
        cast.own_amax.data() + static_cast<std::size_t>((block_row - cast.first_block_row) * cast.block_grid_cols);
    fp8::BlockScale* scales = cast.scales + block_row * cast.scale_cols + cast.first_block_col;
    for (std::int64_t g0 = 0; g0 < cast.block_grid_cols; g0 += chunk_blocks) {
      const std::int64_t g1 = std::min(cast.block_grid_cols, g0 + chunk_blocks);
      const std::int64_t j0 = g0 == 0 ? 0 : g0 * block_cols_ - lead, j1 = std::min(cols, g1 * block_cols_ - lead);
      const auto owned = static_cast<std::int64_t>(std::count(own + g0, own + g1, std::uint8_t{1}));
      std::uint16_t& changed = cast.changed[static_cast<std::size_t>((block_row - cast.first_block_row) * chunks + g0 / chunk_blocks)];
      // Speculating pays where few scales change: each change casts its block twice (bench_fp8_pack: with
      // every scale changing, 2.6 x the plain pack against 1.7 x for the two reads).
      if (owned > 0 && kSpeculateAtMost * changed <= owned) {
        changed = static_cast<std::uint16_t>(cast_speculatively(cast, values, codes, i, band_end, g0, g1, j0, j1));
        continue;
      }
      if (owned > 0) {
        changed = 0;
        std::uint16_t* running = running_.data();
        std::fill(running, running + (j1 - j0), std::uint16_t{0});
        fp8::bf16_magnitude_max_rows(values + copy.offset + i * copy.strides[0] + j0, copy.strides[0], band_end - i, j1 - j0,
                                     running);
        for (std::int64_t g = g0, j = j0; g < g1; ++g) {
          const std::int64_t run = std::min(j1 - j, block_cols_ - (g == 0 ? lead : 0));
          if (own[g] != 0) {
            if (take_scale(cast, block_row, g, fp8::bf16_amax(running + (j - j0), run))) ++changed;
          }
          j += run;
        }
      }
      for (std::int64_t g = g0; g < g1; ++g) fp8::make_cast_table(scales[g], tables_[static_cast<std::size_t>(g - g0)]);
      for (std::int64_t r = i; r < band_end; ++r)
        fp8::quantize_bf16_blocks(tables_.data(), block_cols_, g0 == 0 ? lead : 0, values + copy.offset + r * copy.strides[0] + j0,
                                  j1 - j0, codes + r * cols + j0);
    }
    i = band_end;
  }
}

// Block g of the cast's block row `block_row` takes the scale of `amax`, in the tensor's scales and its scale
// parameter; true where it differs from the one it had (the last update's).
bool Fp8CastProgram::take_scale(const Cast& cast, std::int64_t block_row, std::int64_t g, float amax) const noexcept {
  const std::int64_t block = block_row * cast.scale_cols + cast.first_block_col + g;
  const fp8::BlockScale fresh = fp8::block_scale(rule_, amax);
  cast.scale_values[block] = fresh.scale_inv;
  const bool changed = !same_scale(fresh, cast.scales[block]);
  cast.scales[block] = fresh;
  return changed;
}

// The rows of a band's chunk read once: cast with the scales of the last update, each block's amax taken
// from the same read (quantize_bf16_blocks_tracking). A block whose amax gives another scale than the one
// it was cast with is cast again, from the cache, with the new one; the others' codes are the ones the
// new scale gives (core/fp8.hpp). Between updates, training moves few bf16 weights by an ulp, so the
// largest element of a block, and with it the scale, mostly stays: one read of the rows instead of two.
std::int64_t Fp8CastProgram::cast_speculatively(const Cast& cast, const std::uint16_t* values, std::uint8_t* codes, std::int64_t i,
                                        std::int64_t band_end, std::int64_t g0, std::int64_t g1, std::int64_t j0,
                                        std::int64_t j1) const noexcept {
  const SliceCopy& copy = cast.copy;
  const std::int64_t cols = copy.box.extent[1], lead = copy.box.offset[1] % block_cols_;
  const std::int64_t block_row = (copy.box.offset[0] + i) / block_rows_;
  const std::uint8_t* own =
      cast.own_amax.data() + static_cast<std::size_t>((block_row - cast.first_block_row) * cast.block_grid_cols);
  fp8::BlockScale* scales = cast.scales + block_row * cast.scale_cols + cast.first_block_col;
  for (std::int64_t g = g0; g < g1; ++g) fp8::make_cast_table(scales[g], tables_[static_cast<std::size_t>(g - g0)]);
  std::uint16_t* magnitudes = running_.data();
  std::fill(magnitudes, magnitudes + fp8::kMagnitudeLanes * (g1 - g0), std::uint16_t{0});
  for (std::int64_t r = i; r < band_end; ++r)
    fp8::quantize_bf16_blocks_tracking(tables_.data(), block_cols_, g0 == 0 ? lead : 0, values + copy.offset + r * copy.strides[0] + j0,
                                       j1 - j0, codes + r * cols + j0, magnitudes);
  std::int64_t changed = 0;
  for (std::int64_t g = g0, j = j0; g < g1; ++g) {
    const std::int64_t run = std::min(j1 - j, block_cols_ - (g == 0 ? lead : 0));
    const std::int64_t at = j;
    j += run;
    if (own[g] == 0) continue;  // its scale was taken before the rounds: the codes are right
    if (!take_scale(cast, block_row, g, fp8::bf16_amax(magnitudes + fp8::kMagnitudeLanes * (g - g0), fp8::kMagnitudeLanes)))
      continue;
    fp8::CastTable& table = tables_[static_cast<std::size_t>(g - g0)];
    fp8::make_cast_table(scales[g], table);
    for (std::int64_t r = i; r < band_end; ++r)
      fp8::quantize_bf16_blocks(&table, block_cols_, 0, values + copy.offset + r * copy.strides[0] + at, run, codes + r * cols + at);
    ++recast_blocks_;
    ++changed;
  }
  return changed;
}

void Fp8CastProgram::execute(std::span<std::byte* const> parameters, std::byte* buffer) const noexcept {
  for (const Cast& cast : casts_) {
    const std::byte* base = parameters[cast.parameter];
    const SliceCopy& copy = cast.copy;
    if (cast.dtype == DType::kBF16 && copy.strides[1] == 1) {
      cast_rows(cast, reinterpret_cast<const std::uint16_t*>(base), buffer);
      continue;
    }
    // Other dtypes and strided rows (a parameter stored transposed): element by element, scales taken before.
    const auto size = static_cast<std::int64_t>(dtype_size(cast.dtype));
    auto* codes = reinterpret_cast<std::uint8_t*>(buffer + cast.buffer_offset);
    const std::int64_t rows = copy.box.extent[0], cols = copy.box.extent[1];
    for (std::int64_t i = 0; i < rows; ++i) {
      const std::int64_t block_row = (copy.box.offset[0] + i) / block_rows_ * cast.scale_cols;
      std::int64_t position = copy.offset + i * copy.strides[0];
      for (std::int64_t j = 0; j < cols; ++j, position += copy.strides[1])
        codes[i * cols + j] = fp8::quantize(cast.scales[block_row + (copy.box.offset[1] + j) / block_cols_],
                                            fp8::load_float(cast.dtype, base + position * size));
    }
  }
}

}  // namespace wb::exec

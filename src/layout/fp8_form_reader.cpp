// The FP8 form read from a source checkpoint (layout/fp8_form.hpp): a box of a quantized tensor or of
// its scales is computed from the bands of whole blocks it touches, so that a reader of any box gets the
// values of the whole tensor's quantization.
#include <algorithm>
#include <cstring>
#include <unordered_map>

#include "layout/fp8_form.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

class Fp8FormReader final : public CheckpointReader {
 public:
  Fp8FormReader(const CheckpointReader& source, const Fp8Form& form) : source_(source), form_(form) {
    for (std::size_t i = 0; i < form_.tensors.size(); ++i) by_name_.emplace(form_.tensors[i].name, i);
    for (const TensorInfo& t : form_.source_tensors) {
      const TensorInfo* held = source_.find(t.name);
      if (held == nullptr || held->dtype != t.dtype || held->shape != t.shape)
        throw Error(ErrorCode::kInvalidArgument, "FP8 form of " + source_.source() + ": tensor " + t.name +
                                                     (held == nullptr ? " is missing" : " differs in dtype or shape") +
                                                     " in the source checkpoint");
    }
  }

  const std::vector<TensorInfo>& tensors() const override { return form_.tensors; }
  std::string source() const override { return "FP8 form (" + form_.config.to_string() + ") of " + source_.source(); }

  void read_box(std::string_view name, const Box& box, void* destination) const override {
    const auto it = by_name_.find(std::string(name));
    if (it == by_name_.end())
      throw Error(ErrorCode::kNotFound, source() + ": no tensor " + std::string(name));
    const TensorInfo& info = form_.tensors[it->second];
    if (!box.fits_in(info.shape))
      throw Error(ErrorCode::kInvalidArgument, source() + ": box " + box.to_string() + " lies outside tensor " +
                                                   info.name + " " + shape_to_string(info.shape));
    const FormSource& from = form_.sources[it->second];
    const TensorInfo& weight = form_.source_tensors[from.source];
    if (from.role == FormRole::kCopied) return source_.read_box(weight.name, box, destination);
    if (box.numel() == 0) return;
    const std::int64_t b0 = form_.config.block_rows, b1 = form_.config.block_cols;
    const std::int64_t rows = weight.shape[0], cols = weight.shape[1];
    // The box in blocks (scales: the box itself) and, for the weight, in elements.
    const bool scales = from.role == FormRole::kScale;
    const std::int64_t block_row0 = scales ? box.offset[0] : box.offset[0] / b0;
    const std::int64_t block_row1 = scales ? box.offset[0] + box.extent[0] : (box.offset[0] + box.extent[0] - 1) / b0 + 1;
    const std::int64_t block_col0 = scales ? box.offset[1] : box.offset[1] / b1;
    const std::int64_t block_col1 = scales ? box.offset[1] + box.extent[1] : (box.offset[1] + box.extent[1] - 1) / b1 + 1;
    const std::int64_t col0 = block_col0 * b1, col1 = std::min(cols, block_col1 * b1), band_cols = col1 - col0;
    std::vector<std::byte> band(static_cast<std::size_t>(b0 * band_cols) * dtype_size(weight.dtype));
    std::vector<std::uint8_t> codes(static_cast<std::size_t>(b0 * band_cols));
    std::vector<float> band_scales(static_cast<std::size_t>(block_col1 - block_col0));
    auto* out = static_cast<std::byte*>(destination);
    for (std::int64_t block_row = block_row0; block_row < block_row1; ++block_row) {
      const std::int64_t row0 = block_row * b0, band_rows = std::min(rows, row0 + b0) - row0;
      source_.read_box(weight.name, Box{{row0, col0}, {band_rows, band_cols}}, band.data());
      quantize_band(form_.config, weight.dtype, band.data(), band_rows, band_cols, codes.data(), band_scales.data());
      if (scales) {
        std::memcpy(out + (block_row - block_row0) * box.extent[1] * 4, band_scales.data(),
                    band_scales.size() * sizeof(float));
        continue;
      }
      const std::int64_t r0 = std::max(row0, box.offset[0]), r1 = std::min(row0 + band_rows, box.offset[0] + box.extent[0]);
      for (std::int64_t r = r0; r < r1; ++r)
        std::memcpy(out + (r - box.offset[0]) * box.extent[1],
                    codes.data() + (r - row0) * band_cols + (box.offset[1] - col0), static_cast<std::size_t>(box.extent[1]));
    }
  }

 private:
  const CheckpointReader& source_;
  Fp8Form form_;
  std::unordered_map<std::string, std::size_t> by_name_;
};

}  // namespace

std::unique_ptr<CheckpointReader> open_fp8_form(const CheckpointReader& source, const Fp8Form& form) {
  return std::make_unique<Fp8FormReader>(source, form);
}

}  // namespace wb::layout

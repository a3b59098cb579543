#include "baselines/box_reader.hpp"

#include <algorithm>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/status.hpp"

namespace wb::bench {
BoxReader::BoxReader(std::vector<TensorInfo> tensors, std::string source)
    : tensors_(std::move(tensors)), source_(std::move(source)), held_(tensors_.size()) {
  for (std::size_t t = 0; t < tensors_.size(); ++t) index_.emplace(tensors_[t].name, t);
}

void BoxReader::add(std::size_t tensor, const Box& box, const std::byte* data) {
  if (tensor >= tensors_.size() || !box.fits_in(tensors_[tensor].shape))
    throw Error(ErrorCode::kInvalidArgument, source_ + ": box " + box.to_string() + " does not fit tensor " +
                                                 (tensor < tensors_.size() ? tensors_[tensor].name : std::to_string(tensor)));
  held_[tensor].push_back({box, data});
}

void BoxReader::read_box(std::string_view name, const Box& box, void* destination) const {
  const auto found = index_.find(std::string(name));
  if (found == index_.end())
    throw Error(ErrorCode::kNotFound, source_ + " has no tensor '" + std::string(name) + "'");
  const TensorInfo& info = tensors_[found->second];
  if (!box.fits_in(info.shape))
    throw Error(ErrorCode::kInvalidArgument, source_ + ": box " + box.to_string() + " is outside tensor " + info.name);
  std::vector<Box> covered;  // relative to `box`
  for (const Held& held : held_[found->second]) {
    Box part;
    bool empty = false;
    for (int a = 0; a < box.ndim(); ++a) {
      const std::int64_t lo = std::max(box.offset[a], held.box.offset[a]);
      const std::int64_t hi = std::min(box.offset[a] + box.extent[a], held.box.offset[a] + held.box.extent[a]);
      if (hi <= lo) {
        empty = true;
        break;
      }
      part.offset.push_back(lo);
      part.extent.push_back(hi - lo);
    }
    if (empty && box.numel() > 0) continue;
    Shape in_held(part.offset.size()), in_box(part.offset.size());
    for (std::size_t a = 0; a < part.offset.size(); ++a) {
      in_held[a] = part.offset[a] - held.box.offset[a];
      in_box[a] = part.offset[a] - box.offset[a];
    }
    const TensorView from = TensorView::contiguous(const_cast<std::byte*>(held.data), info.dtype, held.box.extent)
                                .box({in_held, part.extent});
    const TensorView to = TensorView::contiguous(destination, info.dtype, box.extent).box({in_box, part.extent});
    copy_tensor(to, from);
    covered.push_back({in_box, part.extent});
  }
  if (const auto gap = first_uncovered_box(box.extent, covered))
    throw Error(ErrorCode::kNotFound, source_ + " does not hold elements " + gap->to_string() + " (relative to box " +
                                          box.to_string() + ") of tensor " + info.name + ": this worker never received them");
}

}  // namespace wb::bench

#include "emu/check/checkpoint_check.hpp"

#include <algorithm>
#include <cstring>
#include <memory>
#include <set>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

// Marks in `mask` (one flag per element of `param`) the elements that `view` (a view into param) covers.
void mark_view(const TensorView& param, const TensorView& view, std::vector<bool>& mask) {
  const auto element = static_cast<std::int64_t>(param.element_size());
  const std::int64_t base = (static_cast<const std::byte*>(view.data) - static_cast<const std::byte*>(param.data)) / element;
  const int ndim = view.ndim();
  if (view.numel() == 0) return;
  std::vector<std::int64_t> index(static_cast<std::size_t>(ndim), 0);
  while (true) {
    std::int64_t offset = base;
    for (int a = 0; a < ndim; ++a) offset += index[static_cast<std::size_t>(a)] * view.strides[static_cast<std::size_t>(a)];
    mask[static_cast<std::size_t>(offset)] = true;
    int a = ndim - 1;
    for (; a >= 0; --a) {
      if (++index[static_cast<std::size_t>(a)] < view.shape[static_cast<std::size_t>(a)]) break;
      index[static_cast<std::size_t>(a)] = 0;
    }
    if (a < 0) break;
  }
}

const Parameter* owner_of(const ParameterSet& params, const TensorView& view) {
  const auto* address = static_cast<const std::byte*>(view.data);
  for (const Parameter& p : params) {
    const auto* begin = static_cast<const std::byte*>(p.view.data);
    if (address >= begin && address < begin + p.view.nbytes()) return &p;
  }
  return nullptr;
}

}  // namespace

CheckpointCheck check_against_checkpoint(const EmulatedWorker& worker, const ParameterSet& params,
                                         const CheckpointReader& checkpoint) {
  CheckpointCheck result;
  const std::vector<CheckpointPiece> pieces = worker.export_weights(params);
  result.pieces = pieces.size();
  std::vector<std::vector<bool>> covered(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) covered[i].assign(static_cast<std::size_t>(params[i].view.numel()), false);

  std::vector<std::byte> scratch;
  for (const CheckpointPiece& piece : pieces) {
    const TensorInfo* info = checkpoint.find(piece.tensor);
    if (info == nullptr) {
      result.failures.push_back(worker.describe() + ": holds " + piece.tensor + " which " + checkpoint.source() +
                                " does not have");
      continue;
    }
    scratch.resize(static_cast<std::size_t>(piece.box.numel()) * dtype_size(info->dtype));
    checkpoint.read_box(piece.tensor, piece.box, scratch.data());
    const TensorView expected = TensorView::contiguous(scratch.data(), info->dtype, piece.box.extent);
    if (!tensors_bitwise_equal(piece.view, expected))
      result.failures.push_back(worker.describe() + ": " + piece.tensor + piece.box.to_string() +
                                " differs from " + checkpoint.source());
    result.bytes_compared += scratch.size();
    const Parameter* owner = owner_of(params, piece.view);
    if (owner == nullptr) {
      result.failures.push_back(worker.describe() + ": piece of " + piece.tensor + " points outside its parameters");
      continue;
    }
    mark_view(owner->view, piece.view, covered[static_cast<std::size_t>(owner - &params[0])]);
  }

  // Padding: elements no checkpoint element reaches must be as allocated (zero).
  for (std::size_t i = 0; i < params.size(); ++i) {
    const TensorView& view = params[i].view;
    const auto element = view.element_size();
    const auto* bytes = static_cast<const std::byte*>(view.data);
    for (std::size_t e = 0; e < covered[i].size(); ++e) {
      if (covered[i][e]) continue;
      result.unsourced_bytes += element;
      for (std::size_t b = 0; b < element; ++b) {
        if (bytes[e * element + b] != std::byte{0}) {
          result.failures.push_back(worker.describe() + ": parameter " + params[i].name + " element " +
                                    std::to_string(e) + " has no checkpoint source but is not zero");
          e = covered[i].size();
          break;
        }
      }
    }
  }
  return result;
}

std::vector<std::string> coverage_gaps(const std::vector<TensorInfo>& tensors,
                                       const std::vector<std::vector<Box>>& boxes_per_tensor,
                                       const std::string& group) {
  std::vector<std::string> gaps;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const std::vector<Box> none;
    const auto& boxes = t < boxes_per_tensor.size() ? boxes_per_tensor[t] : none;
    if (auto gap = first_uncovered_box(tensors[t].shape, boxes))
      gaps.push_back(group + " holds no copy of " + tensors[t].name + gap->to_string());
  }
  return gaps;
}

std::string first_difference(const ParameterSet& got, const ParameterSet& want) {
  for (std::size_t i = 0; i < got.size(); ++i) {
    const auto* g = static_cast<const unsigned char*>(got[i].view.data);
    const auto* w = static_cast<const unsigned char*>(want[i].view.data);
    const std::size_t bytes = got[i].view.nbytes();
    if (std::memcmp(g, w, bytes) == 0) continue;
    std::size_t at = 0, wrong = 0;
    for (std::size_t b = 0; b < bytes; ++b)
      if (g[b] != w[b]) at = wrong++ == 0 ? b : at;
    return got[i].name + " differs in " + std::to_string(wrong) + " of " + std::to_string(bytes) +
           " bytes, first at byte " + std::to_string(at);
  }
  return "";
}

}  // namespace wb::emu

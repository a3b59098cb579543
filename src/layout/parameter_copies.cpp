#include "layout/parameter_copies.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/stream_copy.hpp"
#include "weightbridge/status.hpp"

namespace wb::layout {
namespace {

constexpr std::size_t kAlign = 64;

std::size_t aligned(std::size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

}  // namespace

ParameterCopies::ParameterCopies(const ParameterSet& params) : params_(params) {
  std::size_t total = 0;
  offsets_.reserve(params.size());
  for (const Parameter& p : params) {
    offsets_.push_back(total);
    total += aligned(p.view.nbytes());
    bytes_ += p.view.nbytes();
  }
  if (total > 0) {
    const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
    mapped_ = (total + page - 1) / page * page;
    void* memory = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (memory == MAP_FAILED)
      throw Error(ErrorCode::kSystem, "probe: cannot allocate host copies of the parameters (" +
                                          std::to_string(total) + " bytes): " + std::strerror(errno));
    memory_ = static_cast<std::byte*>(memory);
  }
}

const ParameterSet& ParameterCopies::views() const {
  if (!views_) {
    views_.emplace();
    for (std::size_t i = 0; i < params_.size(); ++i) {
      TensorView view = params_[i].view;
      view.data = data(i);
      view.memory = MemoryKind::kHost;
      view.device = 0;
      views_->add(params_[i].name, view);
    }
  }
  return *views_;
}

ParameterCopies::~ParameterCopies() {
  if (memory_ != nullptr) ::munmap(memory_, mapped_);
}

// Both ways with streaming stores: neither copy is read again soon, and glibc's memcpy would read every
// destination line first (1 GiB of bf16 parameters: 0.13-0.16 s each way, 0.06-0.09 streamed).
SavedParameters::SavedParameters(const ParameterSet& params) : params_(params), copies_(params) {
  for (std::size_t i = 0; i < params.size(); ++i)
    copy_streaming(copies_.data(i), static_cast<const std::byte*>(params[i].view.data), params[i].view.nbytes());
  fence_streaming_stores();
}

SavedParameters::~SavedParameters() {
  for (std::size_t i = 0; i < params_.size(); ++i)
    copy_streaming(static_cast<std::byte*>(params_[i].view.data), copies_.data(i), params_[i].view.nbytes());
  fence_streaming_stores();
}

}  // namespace wb::layout

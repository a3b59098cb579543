#include <cstdlib>
#include <cstring>
#include <new>

#include "emu/frameworks/backend.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {

void HostParameters::Free::operator()(std::byte* p) const { std::free(p); }

HostParameters::HostParameters(const std::vector<TensorInfo>& infos) {
  storage_.reserve(infos.size());
  for (const TensorInfo& info : infos) {
    // 64-byte alignment: the copy paths and, later, registration for one-sided writes want it.
    const std::size_t bytes = std::max<std::size_t>(64, (info.nbytes() + 63) / 64 * 64);
    auto* memory = static_cast<std::byte*>(std::aligned_alloc(64, bytes));
    if (memory == nullptr)
      throw Error(ErrorCode::kSystem, "cannot allocate " + std::to_string(bytes) + " bytes for parameter " + info.name);
    std::memset(memory, 0, bytes);
    storage_.emplace_back(memory);
    set_.add(info.name, TensorView::contiguous(memory, info.dtype, info.shape));
  }
}

}  // namespace wb::emu

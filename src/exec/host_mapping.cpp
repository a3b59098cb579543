#include "exec/host_mapping.hpp"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/host_pages.hpp"
#include "weightbridge/status.hpp"

namespace wb::exec {

HostMapping::HostMapping(std::size_t bytes) {
  if (bytes == 0) return;
  std::byte* memory = map_host_pages(bytes, mapped_);
  if (memory == nullptr)
    throw Error(ErrorCode::kSystem, "mmap of " + std::to_string(bytes) + " bytes of transfer buffers failed: " +
                                        std::strerror(errno));
  data_ = memory;
  size_ = bytes;
  // Populated now, in huge pages where the kernel has them: a first touch inside an update would be a page
  // fault per 4 KiB on the update path.
  advise_huge_pages(data_, data_ + mapped_);
  if (!populate_host_pages(data_, mapped_)) {
    const int error = errno;
    ::munmap(data_, mapped_);
    data_ = nullptr;
    throw Error(ErrorCode::kSystem, "populating " + std::to_string(bytes) + " bytes of transfer buffers failed: " +
                                        std::strerror(error));
  }
}

HostMapping::~HostMapping() {
  if (data_ == nullptr) return;
  if (::mmap(data_, mapped_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    ::munmap(data_, mapped_);
}

}  // namespace wb::exec

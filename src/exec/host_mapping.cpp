#include "exec/host_mapping.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "weightbridge/status.hpp"

namespace wb::exec {

HostMapping::HostMapping(std::size_t bytes) {
  if (bytes == 0) return;
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  mapped_ = (bytes + page - 1) / page * page;
  // Populated now: a first touch inside an update would be a page fault per 4 KiB on the update path.
  void* memory = ::mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
  if (memory == MAP_FAILED)
    throw Error(ErrorCode::kSystem, "mmap of " + std::to_string(bytes) + " bytes of transfer buffers failed: " +
                                        std::strerror(errno));
  data_ = static_cast<std::byte*>(memory);
  size_ = bytes;
}

HostMapping::~HostMapping() {
  if (data_ == nullptr) return;
  if (::mmap(data_, mapped_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    ::munmap(data_, mapped_);
}

}  // namespace wb::exec

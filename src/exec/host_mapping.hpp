// Host memory in a mapping of its own that is never handed back to the process: at destruction the range
// is replaced by one without access, so that a peer still writing into it (cma writes any mapped address
// of a process) fails with EFAULT instead of landing in memory the process has handed out again.
#pragma once

#include <cstddef>

namespace wb::exec {

class HostMapping {
 public:
  /// Zeroed and populated memory of `bytes` (nothing for 0). Set-up: throws wb::Error (kSystem).
  explicit HostMapping(std::size_t bytes);
  ~HostMapping();
  HostMapping(const HostMapping&) = delete;
  HostMapping& operator=(const HostMapping&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::byte* data_ = nullptr;
  std::size_t size_ = 0, mapped_ = 0;
};

}  // namespace wb::exec

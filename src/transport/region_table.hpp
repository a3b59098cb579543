// Private: the registrations every transport keeps, and the one check of a batch against them. A
// transport numbers the memory it registers (local ids) and the peer memory it imports (import ids, one
// numbering for the whole transport, each owned by the rank it came from); its own per-region data (an
// address, a key, a memory region) lives in its own arrays under the same ids.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb {

class RegionTable {
 public:
  /// `transport` names the transport in error messages ("cma", "libfabric", ...).
  explicit RegionTable(std::string transport) : transport_(std::move(transport)) {}

  std::uint32_t add_local(std::uint64_t bytes) {
    local_bytes_.push_back(bytes);
    return static_cast<std::uint32_t>(local_bytes_.size() - 1);
  }
  std::uint32_t add_remote(int owner, std::uint64_t bytes) {
    remote_bytes_.push_back(bytes);
    remote_owner_.push_back(owner);
    return static_cast<std::uint32_t>(remote_bytes_.size() - 1);
  }
  std::size_t locals() const { return local_bytes_.size(); }
  std::size_t remotes() const { return remote_bytes_.size(); }
  std::uint64_t local_bytes(std::uint32_t id) const { return local_bytes_[id]; }
  std::uint64_t remote_bytes(std::uint32_t id) const { return remote_bytes_[id]; }
  int remote_owner(std::uint32_t id) const { return remote_owner_[id]; }
  /// The first import id of `peer`'s memory, or -1.
  std::int64_t first_remote_of(int peer) const;

  /// Every write of a batch to `peer`: local memory registered here and the range inside it, remote memory
  /// imported from `peer` (not from another rank) and the range inside it. kInvalidArgument naming the
  /// transport, the rank, the write, the region and the offending range; nothing is checked twice.
  Status check(int peer, std::span<const WriteRequest> writes) const;

 private:
  std::string transport_;
  std::vector<std::uint64_t> local_bytes_;
  std::vector<std::uint64_t> remote_bytes_;
  std::vector<int> remote_owner_;
};

}  // namespace wb

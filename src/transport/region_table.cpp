#include "transport/region_table.hpp"

namespace wb {

std::int64_t RegionTable::first_remote_of(int peer) const {
  for (std::size_t id = 0; id < remote_owner_.size(); ++id)
    if (remote_owner_[id] == peer) return static_cast<std::int64_t>(id);
  return -1;
}

Status RegionTable::check(int peer, std::span<const WriteRequest> writes) const {
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const WriteRequest& w = writes[i];
    // The text is built only for a failure: this runs for every write of every batch.
    const auto head = [&] {
      return transport_ + " post_writes to rank " + std::to_string(peer) + ": write " + std::to_string(i) + " of " +
             std::to_string(writes.size());
    };
    if (w.local_memory >= local_bytes_.size())
      return Status(ErrorCode::kInvalidArgument, head() + " names local memory " + std::to_string(w.local_memory) + ", but " +
                                                     std::to_string(local_bytes_.size()) + " regions are registered here");
    if (w.remote_memory >= remote_bytes_.size())
      return Status(ErrorCode::kInvalidArgument, head() + " names remote memory " + std::to_string(w.remote_memory) + ", but " +
                                                     std::to_string(remote_bytes_.size()) + " regions were imported");
    if (remote_owner_[w.remote_memory] != peer)
      return Status(ErrorCode::kInvalidArgument, head() + " names remote memory " + std::to_string(w.remote_memory) +
                                                     ", which was imported from rank " +
                                                     std::to_string(remote_owner_[w.remote_memory]) + ", not from rank " +
                                                     std::to_string(peer));
    const std::uint64_t local_size = local_bytes_[w.local_memory];
    if (w.local_offset > local_size || w.bytes > local_size - w.local_offset)
      return Status(ErrorCode::kInvalidArgument, head() + " reads local memory " + std::to_string(w.local_memory) + " at offset " +
                                                     std::to_string(w.local_offset) + " + " + std::to_string(w.bytes) +
                                                     " bytes, past its " + std::to_string(local_size) + " registered bytes");
    const std::uint64_t remote_size = remote_bytes_[w.remote_memory];
    if (w.remote_offset > remote_size || w.bytes > remote_size - w.remote_offset)
      return Status(ErrorCode::kInvalidArgument, head() + " writes remote memory " + std::to_string(w.remote_memory) + " of rank " +
                                                     std::to_string(peer) + " at offset " + std::to_string(w.remote_offset) + " + " +
                                                     std::to_string(w.bytes) + " bytes, past its " +
                                                     std::to_string(remote_size) + " registered bytes");
  }
  return Status::ok();
}

}  // namespace wb

#include "transport/shm/memory_key.hpp"

#include <climits>

#include "transport/shm/mailbox.hpp"
#include "weightbridge/status.hpp"

namespace wb::shm {

codec::ByteWriter begin_key(const KeyFormat& format, const KeyOwner& owner) {
  codec::ByteWriter out;
  out.varint(format.magic);
  out.varint(format.version);
  out.signed_varint(owner.rank);
  out.varint(static_cast<std::uint64_t>(owner.pid));
  out.varint(owner.pid_namespace);
  return out;
}

std::vector<std::byte> seal_key(codec::ByteWriter& out) {
  std::vector<std::byte> bytes = out.take();
  append_checksum(bytes);
  return bytes;
}

KeyReader::KeyReader(TransportKind kind, const KeyFormat& format, int self, int peer, std::span<const std::byte> bytes)
    : what_(std::string(transport_name(kind)) + " memory key from rank " + std::to_string(peer) + " (imported on rank " +
            std::to_string(self) + ")"),
      in_(checked_body(bytes, what_), what_),
      peer_(peer) {
  if (in_.varint() != format.magic) in_.fail(std::string("not a ") + transport_name(kind) + " memory key");
  if (const std::uint64_t found = in_.varint(); found != format.version)
    in_.fail("version " + std::to_string(found) + ", this build reads " + std::to_string(format.version));
  owner_.rank = static_cast<int>(in_.bounded_signed(0, INT_MAX, "rank"));
  owner_.pid = static_cast<pid_t>(in_.bounded(INT_MAX, "pid"));
  owner_.pid_namespace = in_.varint();
}

void KeyReader::check_owner() const {
  if (owner_.rank != peer_)
    throw Error(ErrorCode::kInvalidArgument, what_ + " was registered by rank " + std::to_string(owner_.rank) +
                                                 ": keys were given to the wrong peer");
}

}  // namespace wb::shm

// Private: the frame of the same-machine transports' memory keys (cma, cuda_ipc). A key is the transport's
// magic and version, its owner (the rank that registered the memory, its pid and PID namespace), the
// transport's own fields, and a checksum (shm::append_checksum). Reading one checks the frame and says who
// owns it; the transport reads and checks its own fields in between.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/byte_codec.hpp"
#include "transport/transport.hpp"

namespace wb::shm {

/// What tells one transport's keys from another's, and one layout of them from the next.
struct KeyFormat {
  std::uint64_t magic = 0;
  std::uint64_t version = 0;
};

/// Who registered the memory a key names, and in which process.
struct KeyOwner {
  int rank = -1;
  pid_t pid = 0;
  std::uint64_t pid_namespace = 0;
};

/// A key with its magic, version and owner written; the transport appends its fields, then seal_key.
codec::ByteWriter begin_key(const KeyFormat& format, const KeyOwner& owner);
/// The key's bytes with the checksum appended.
std::vector<std::byte> seal_key(codec::ByteWriter& out);

/// A key of `kind` from `peer`, imported on rank `self`: the checksum, magic and version checked and the
/// owner read at construction (throws kCorruptData naming the key); the transport then reads its fields
/// from in(), calls in().expect_done(), checks them, and calls check_owner last.
class KeyReader {
 public:
  KeyReader(TransportKind kind, const KeyFormat& format, int self, int peer, std::span<const std::byte> bytes);
  codec::ByteReader& in() { return in_; }
  const KeyOwner& owner() const { return owner_; }
  /// kInvalidArgument when the key was registered by another rank than the peer it came from.
  void check_owner() const;

 private:
  std::string what_;  // "cma memory key from rank 3 (imported on rank 1)"
  codec::ByteReader in_;
  KeyOwner owner_;
  int peer_;
};

}  // namespace wb::shm

#include "transport/cma/cma_transport.hpp"

#include <sys/uio.h>
#include <unistd.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <vector>

#include "core/byte_codec.hpp"
#include "core/checks.hpp"
#include "transport/shm/mailbox.hpp"
#include "transport/shm/memory_key.hpp"
#include "transport/shm/peer_links.hpp"
#include "transport/traffic_counter.hpp"

namespace wb {
namespace {

constexpr shm::KeyFormat kKeyFormat{0x57424b43, 1};  // "WBKC", version 1
// process_vm_writev takes IOV_MAX segments a call; batches are cut into such calls, so this only bounds
// the scratch arrays.
constexpr std::size_t kMaxWritesPerBatch = std::size_t{1} << 20;

using shm::hex;

/// Registered memory of a peer: where it is in which process.
struct RemoteKey {
  shm::KeyOwner owner;
  std::uint64_t address = 0;
  std::uint64_t bytes = 0;
};

std::vector<std::byte> encode_key(const RemoteKey& key) {
  codec::ByteWriter out = shm::begin_key(kKeyFormat, key.owner);
  out.varint(key.address);
  out.varint(key.bytes);
  return shm::seal_key(out);
}

RemoteKey decode_key(int self, int peer, std::span<const std::byte> bytes) {
  shm::KeyReader reader(TransportKind::kCma, kKeyFormat, self, peer, bytes);
  codec::ByteReader& in = reader.in();
  RemoteKey key{reader.owner()};
  key.address = in.varint();
  key.bytes = in.varint();
  in.expect_done();
  if (key.address == 0 || key.bytes == 0 || key.address + key.bytes < key.address || key.owner.pid <= 0)
    in.fail("empty or wrapping region [" + hex(key.address) + ", +" + std::to_string(key.bytes) + ")");
  reader.check_owner();
  return key;
}

class CmaTransport final : public Transport {
 public:
  explicit CmaTransport(int rank) : links_(TransportKind::kCma, rank) {}

  TransportKind kind() const override { return TransportKind::kCma; }

  TransportCapabilities capabilities() const override { return links_.capabilities(kMaxWritesPerBatch); }

  MemoryRegistration register_memory(void* address, std::size_t bytes, MemoryKind memory, int device) override {
    links_.check_registration(address, bytes, memory, device);
    const std::uint32_t id = links_.add_local(address, bytes);
    const RemoteKey key{links_.owner(), reinterpret_cast<std::uint64_t>(address), bytes};
    return {id, encode_key(key)};
  }

  std::vector<std::byte> endpoint(int peer) override { return links_.endpoint(peer); }

  void connect(int peer, std::span<const std::byte> peer_endpoint) override {
    links_.add_peer(peer, links_.open(peer, peer_endpoint));
  }

  std::uint32_t import_memory(int peer, std::span<const std::byte> remote_key) override {
    const RemoteKey key = decode_key(links_.rank(), peer, remote_key);
    const std::uint64_t namespace_here = links_.address().pid_namespace;
    if (key.owner.pid_namespace != 0 && namespace_here != 0 && key.owner.pid_namespace != namespace_here)
      throw Error(ErrorCode::kUnsupported, "cma memory key from rank " + std::to_string(peer) +
                                               " names a process in another PID namespace: the cma transport "
                                               "needs both ranks in one");
    links_.check_key_owner(peer, key.owner.pid);
    return links_.add_remote(peer, key.owner.pid, key.address, key.bytes);
  }

  Status post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                     std::uint64_t token) override {
    WB_RETURN_IF_ERROR(links_.check_batch(peer, writes, kMaxWritesPerBatch));  // an error posts nothing
    shm::PeerLinks::Opened& target = links_.peer(peer);
    shm::PeerRing& ring = *target.ring;
    const pid_t pid = target.process.pid;
    local_iov_.clear();
    remote_iov_.clear();
    write_of_segment_.clear();
    for (std::size_t i = 0; i < writes.size(); ++i) {
      const WriteRequest& w = writes[i];
      if (w.bytes == 0) continue;
      local_iov_.push_back({links_.local_address(w.local_memory) + w.local_offset, w.bytes});
      remote_iov_.push_back({reinterpret_cast<void*>(links_.remote_address(w.remote_memory) + w.remote_offset), w.bytes});
      write_of_segment_.push_back(i);
    }
    WB_RETURN_IF_ERROR(ring.reserve());  // kRetryLater: nothing posted

    shm::VmFailure failure;
    if (!shm::vm_write(pid, local_iov_, remote_iov_, failure)) {
      ring.unreserve();
      const std::size_t i = write_of_segment_[failure.segment];
      const WriteRequest& w = writes[i];
      return Status(ErrorCode::kSystem,
                    "cma write " + std::to_string(i) + " to rank " + std::to_string(peer) + " (pid " +
                        std::to_string(pid) + ") failed at remote memory " + std::to_string(w.remote_memory) +
                        " offset " + std::to_string(w.remote_offset + failure.offset) + " (write of " +
                        std::to_string(w.bytes) + " bytes at offset " + std::to_string(w.remote_offset) +
                        "): process_vm_writev: " + shm::describe_vm_error(failure.error));
    }
    WB_RETURN_IF_ERROR(ring.notify(immediate));
    // process_vm_writev returned: the bytes are in the peer's memory and the source may be reused.
    done_.push_back({Completion::Kind::kWritesDone, peer, token, 0});
    traffic_.add(peer, batch_bytes(writes));
    return Status::ok();
  }

  Status poll(std::vector<Completion>& completions) override {
    completions.insert(completions.end(), done_.begin(), done_.end());
    done_.clear();
    return links_.mailbox().poll(completions);
  }

  std::vector<PeerTraffic> traffic() const override { return traffic_.snapshot(); }

 private:
  shm::PeerLinks links_;           // mailbox, registrations, imports and connected peers
  std::vector<Completion> done_;  // writes done, reported by the next poll
  TrafficCounter traffic_;
  // Scratch of post_writes, kept to allocate nothing once warm.
  std::vector<iovec> local_iov_, remote_iov_;
  std::vector<std::size_t> write_of_segment_;
};

}  // namespace

std::unique_ptr<Transport> make_cma_transport(int rank) { return std::make_unique<CmaTransport>(rank); }

}  // namespace wb

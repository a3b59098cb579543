// Private: what the same-machine transports (cma, cuda_ipc) set up alike around their mailbox and region
// table: the memory this rank registered and the memory it imported, each with its address in this
// process, under the region table's numbering; the endpoint record; connecting a peer (its endpoint
// checked, its ring opened and verified, its notifications watched); and the checks made before anything
// moves: an imported key's owner, a batch's peer, length and ranges. Error texts begin with the transport's
// name ("cma", "cuda_ipc"), as each transport wrote them before.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "transport/region_table.hpp"
#include "transport/shm/mailbox.hpp"
#include "transport/shm/memory_key.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::shm {

class PeerLinks {
 public:
  /// Maps this rank's mailbox (throws, as Mailbox does).
  PeerLinks(TransportKind kind, int rank);

  int rank() const { return rank_; }
  const ProcessAddress& address() const { return mailbox_.address(); }
  /// This rank and process, as its memory keys name them.
  KeyOwner owner() const { return {rank_, address().pid, address().pid_namespace}; }
  Mailbox& mailbox() { return mailbox_; }

  /// What a same-machine transport offers: the one kind of memory it registers (cma host memory, cuda_ipc
  /// CUDA memory), never between machines, at most `max_writes` writes a batch.
  TransportCapabilities capabilities(std::size_t max_writes) const;
  /// What register_memory checks before anything else: memory of the kind this transport registers
  /// (kUnsupported, naming the transport that takes the other kind), and a region that is not empty.
  void check_registration(const void* address, std::size_t bytes, MemoryKind memory, int device) const;
  /// Memory of this process (check_registration first); returns its local id.
  std::uint32_t add_local(void* address, std::size_t bytes);
  /// Memory of `peer` (process `pid`), at `address` as this process reaches it; returns its import id.
  std::uint32_t add_remote(int peer, pid_t pid, std::uint64_t address, std::uint64_t bytes);
  std::byte* local_address(std::uint32_t id) const { return local_[id].address; }
  std::uint64_t remote_address(std::uint32_t id) const { return remote_[id].address; }

  /// This rank's endpoint record for `peer`.
  std::vector<std::byte> endpoint(int peer) const;

  /// A peer whose endpoint checked out: its process, and its ring in that process's mailbox.
  struct Opened {
    ProcessAddress process;
    std::unique_ptr<PeerRing> ring;
  };
  /// Connecting, before the transport adds state of its own: throws when `peer` is connected already, its
  /// record is bad (shm::decode_endpoint), memory imported from it belongs to another process, or its ring
  /// cannot be verified; then watches its notifications. Nothing is kept until add_peer.
  Opened open(int peer, std::span<const std::byte> record);
  /// Keeps what open returned; the peer counts as connected from now on. Returns its ring.
  PeerRing& add_peer(int peer, Opened opened);
  bool connected(int peer) const { return peers_.contains(peer); }

  /// Throws kInvalidArgument when `peer` is connected and is not process `pid` (a key for another peer).
  void check_key_owner(int peer, pid_t pid) const;

  /// Everything post_writes checks before it moves a byte: `peer` connected, at most `max_writes` writes,
  /// every range inside its regions (RegionTable::check). kInvalidArgument naming the transport and ranks.
  Status check_batch(int peer, std::span<const WriteRequest> writes, std::size_t max_writes) const;
  /// A connected peer (check_batch said so): its process and ring.
  Opened& peer(int peer) { return peers_.at(peer); }

 private:
  struct Local {
    std::byte* address = nullptr;
    std::size_t bytes = 0;
  };
  struct Remote {
    int peer = -1;
    pid_t pid = 0;
    std::uint64_t address = 0;  // in this process
    std::uint64_t bytes = 0;
  };

  TransportKind kind_;
  const char* name_;
  int rank_;
  Mailbox mailbox_;
  std::vector<Local> local_;
  std::vector<Remote> remote_;
  RegionTable regions_;  // sizes and owners under the same ids: the batch check
  std::unordered_map<int, Opened> peers_;
};

}  // namespace wb::shm

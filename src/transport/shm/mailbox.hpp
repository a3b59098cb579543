// Private: what the same-machine transports (cma, cuda_ipc) share. Writes into another process's memory
// with process_vm_writev, the endpoint record that names a process on this machine, and the notification
// mailbox that tells a receiver a batch has landed, without MPI.
//
// Mailbox. Every rank maps at creation one mailbox in its own memory: a header, then one ring per world
// rank below `mailbox_ranks` (address space only: a ring's pages are touched once that rank writes to it).
// The ring of writer W in the mailbox of receiver R:
//
//   offset 0   consumed: 1 byte, written by R only: how many notifications R has taken, modulo 256
//   offset 64  slots[S], 16 bytes each: { u64 sequence, u32 immediate, u8 flag, 3 bytes unused }
//
// Notification n (n = 1, 2, ...) of W goes into slot (n - 1) % S. W writes it with two process_vm_writev
// calls: first the payload (sequence and immediate, 12 bytes), then, alone, the flag byte
// generation(n) = ((n - 1) / S) % 255 + 1. R takes notification n when its acquire load of the slot's flag
// reads generation(n); it then checks the payload's sequence, reads the immediate, and stores consumed
// with release.
//
// Why R never takes a half-written slot: the flag is one byte, so R reads either its old value or its new
// one, never a mix; consecutive occupants of a slot (n - S and n) have different generations, and an
// unused slot holds 0, which no generation equals. The payload's stores are complete before the flag's
// store begins: they are made by an earlier system call of the same thread, whose end unpins the pages
// with fully ordered atomics (and x86 keeps stores in order anyway). So once R sees the new flag, the
// payload is there. The same argument orders a batch's data writes (earlier calls still) before its flag.
// The payload's sequence number is checked as well: a mismatch is reported as corrupt, not taken.
//
// Back-pressure: W counts the notifications it has written (or reserved: cuda_ipc writes them later) and
// the ones it knows R has consumed. While fewer than S are outstanding it writes without asking. Otherwise
// it reads R's consumed byte with process_vm_readv: one byte cannot tear, and since at most S <= 255
// notifications are outstanding, consumed modulo 256 names the true count in [known, written]. If the ring
// is still full, post_writes returns kRetryLater with nothing posted. W reuses slot (n - 1) % S for n + S
// only after R's consumed store says n was taken, which R stores only after reading n's payload.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/hex.hpp"
#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::shm {

/// True when [offset, offset + bytes) lies inside [0, size), without overflow.
inline bool within(std::uint64_t offset, std::uint64_t bytes, std::uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

using wb::hex;  // "0x1f" in the messages of the transports built on this one

// --- process memory ---------------------------------------------------------------------------------

/// Where a vm_write stopped: the errno, the segment, and the bytes of that segment already written.
struct VmFailure {
  int error = 0;
  std::size_t segment = 0;
  std::uint64_t offset = 0;
};

/// Writes local[i] to remote[i] (pairwise equal lengths) in process `pid` with process_vm_writev, at
/// most IOV_MAX segments a call, resuming after partial transfers until every byte has landed. Advances
/// the iovecs it has written. Returns true when all landed; otherwise fills `failure`.
bool vm_write(pid_t pid, std::span<iovec> local, std::span<iovec> remote, VmFailure& failure);

/// Reads `bytes` at `remote` of process `pid` into `local`. Returns 0 or the errno.
int vm_read(pid_t pid, void* local, std::uint64_t remote, std::size_t bytes);

/// strerror of a process_vm_* errno, with a hint for the errors peers run into (EPERM: ptrace access;
/// ESRCH: the process is gone; EFAULT: the address is not mapped there).
std::string describe_vm_error(int error);

/// Allows processes of the same user to write into this one where Yama's ptrace_scope is 1
/// (prctl PR_SET_PTRACER_ANY); a no-op where Yama is absent. Once per process.
void allow_peer_writes();

/// This process's PID namespace (inode of /proc/self/ns/pid; 0 when unknown). Process ids name the
/// same process only inside one namespace.
std::uint64_t pid_namespace();

// --- endpoint record --------------------------------------------------------------------------------

/// What a peer needs to write into this process and notify it.
struct ProcessAddress {
  int rank = -1;                  // world rank of the owner
  pid_t pid = 0;
  std::uint64_t pid_namespace = 0;
  std::string machine;            // machine_id()
  std::uint64_t mailbox = 0;      // address of the mailbox in the owner's memory
  std::uint64_t nonce = 0;        // random, also in the mailbox header: proves pid names the owner
  std::uint32_t ring_slots = 0;
  std::uint32_t mailbox_ranks = 0;
};

/// The endpoint record of `self` for `peer`; the kind is part of the record.
std::vector<std::byte> encode_endpoint(TransportKind kind, int peer, const ProcessAddress& self);

/// Decodes and checks a peer's endpoint record on rank `self` (set-up: throws). Checks the checksum and
/// format, that it is a `kind` record made by `peer` for `self`, and that the peer is on this machine
/// (same machine_id, else an error naming both) and in this PID namespace.
ProcessAddress decode_endpoint(TransportKind kind, int self, int peer, std::span<const std::byte> record,
                               const ProcessAddress& mine);

/// FNV-1a over `bytes`: the checksum appended to endpoint records and memory keys.
std::uint64_t fnv1a(std::span<const std::byte> bytes);
/// Appends the checksum of `out` so far (8 bytes, little-endian).
void append_checksum(std::vector<std::byte>& out);
/// The bytes before the checksum; throws kCorruptData naming `what` when too short or the sum differs.
std::span<const std::byte> checked_body(std::span<const std::byte> record, const std::string& what);

// --- mailbox ----------------------------------------------------------------------------------------

/// This rank's mailbox (receiver side). Not thread-safe: one thread polls.
class Mailbox {
 public:
  /// Maps the mailbox; ring geometry from the mailbox_slots and mailbox_ranks settings. Throws.
  explicit Mailbox(int rank);
  ~Mailbox();
  Mailbox(const Mailbox&) = delete;
  Mailbox& operator=(const Mailbox&) = delete;

  /// This process's address record (pid, namespace, machine, mailbox, geometry).
  const ProcessAddress& address() const { return address_; }

  /// Starts taking notifications from `peer` (at connect). Throws when the peer's rank has no ring.
  void watch(int peer);

  /// Appends one kArrival per new notification, in order per peer. Never blocks; a slot whose payload
  /// does not match its flag is reported as kCorruptData naming the peer.
  Status poll(std::vector<Completion>& completions);

 private:
  struct Watched {
    int peer = 0;
    std::byte* ring = nullptr;
    std::uint64_t taken = 0;  // notifications taken from this ring
  };

  std::byte* ring(int peer) const;

  ProcessAddress address_;
  std::byte* base_ = nullptr;
  std::size_t mapped_bytes_ = 0;
  std::size_t ring_bytes_ = 0;
  std::vector<Watched> watched_;
};

/// The writer's side of its ring in one peer's mailbox. Not thread-safe.
class PeerRing {
 public:
  /// `peer` is the receiver, `self` this rank; checks the geometry allows `self` a ring (throws).
  PeerRing(int self, int peer, const ProcessAddress& receiver);

  /// Set-up: reads the receiver's mailbox header, which proves the pid names the right process and that
  /// this process may write into it (ptrace access). Throws with the cause.
  void verify() const;

  pid_t pid() const { return receiver_.pid; }

  /// Reserves the next notification: ok, kRetryLater when S are outstanding even after reading the
  /// receiver's consumed count, or the error of that read.
  Status reserve();
  /// Gives back the last reservation (its batch failed before anything could be notified).
  void unreserve();
  /// Writes the oldest reserved, unwritten notification with `immediate` (payload, then flag).
  Status notify(std::uint32_t immediate);

 private:
  std::string where() const;

  int self_ = 0;
  int peer_ = 0;
  ProcessAddress receiver_;
  std::uint64_t ring_ = 0;      // address of this rank's ring in the receiver's memory
  std::uint64_t reserved_ = 0;  // sequence numbers handed out
  std::uint64_t written_ = 0;   // notifications written
  std::uint64_t consumed_ = 0;  // lower bound of the receiver's consumed count
};

}  // namespace wb::shm

#include "transport/shm/mailbox.hpp"

#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstring>
#include <mutex>
#include <random>

#include "core/byte_codec.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"

#ifndef IOV_MAX
#define IOV_MAX 1024
#endif

namespace wb::shm {
namespace {

Setting<std::int64_t> mailbox_slots_setting(
    "mailbox_slots", 64,
    "Notifications a same-machine transport (cma, cuda_ipc) may have outstanding to one peer before "
    "post_writes returns kRetryLater (at most 255: a ring's consumed count is one byte).",
    1, 255);
Setting<std::int64_t> mailbox_ranks_setting(
    "mailbox_ranks", 65536,
    "World ranks a same-machine transport (cma, cuda_ipc) can take notifications from: its mailbox "
    "reserves a ring per rank below this (address space only; a ring is touched once its rank writes).",
    1, std::int64_t{1} << 24);

constexpr std::uint64_t kMailboxMagic = 0x57424d41494c4258ull;  // "WBMAILBX"
constexpr std::uint64_t kEndpointMagic = 0x57424d45;             // "WBME"
constexpr std::uint64_t kEndpointVersion = 1;
constexpr std::size_t kHeaderBytes = 64;
constexpr std::size_t kRingHeaderBytes = 64;

struct MailboxHeader {
  std::uint64_t magic;
  std::uint64_t nonce;
  std::uint32_t ring_slots;
  std::uint32_t ranks;
  std::int32_t rank;
  std::int32_t pid;
};
static_assert(sizeof(MailboxHeader) <= kHeaderBytes);

struct Slot {
  std::uint64_t sequence;
  std::uint32_t immediate;
  std::uint8_t flag;
  std::uint8_t unused[3];
};
static_assert(sizeof(Slot) == 16 && offsetof(Slot, flag) == 12);
constexpr std::size_t kPayloadBytes = offsetof(Slot, flag);

std::size_t ring_bytes(std::uint32_t slots) {
  const std::size_t bytes = kRingHeaderBytes + std::size_t{slots} * sizeof(Slot);
  return (bytes + 63) / 64 * 64;
}

std::uint8_t generation(std::uint64_t sequence, std::uint32_t slots) {
  return static_cast<std::uint8_t>((sequence - 1) / slots % 255 + 1);
}

std::uint64_t random_nonce() {
  std::random_device device;
  return (std::uint64_t{device()} << 32) ^ device() ^ static_cast<std::uint64_t>(::getpid());
}

std::string process_text(int rank, pid_t pid) {
  return "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ")";
}

}  // namespace

// --- process memory ---------------------------------------------------------------------------------

bool vm_write(pid_t pid, std::span<iovec> local, std::span<iovec> remote, VmFailure& failure) {
  std::size_t at = 0;  // first segment not yet fully written
  std::uint64_t done_in_segment = 0;
  while (at < local.size() && local[at].iov_len == 0) ++at;
  while (at < local.size()) {
    const std::size_t count = std::min<std::size_t>(IOV_MAX, local.size() - at);
    const ssize_t written = ::process_vm_writev(pid, &local[at], count, &remote[at], count, 0);
    if (written < 0) {
      if (errno == EINTR) continue;
      failure = {errno, at, done_in_segment};
      return false;
    }
    if (written == 0) {  // no progress: treat like a fault at this segment rather than spin
      failure = {EFAULT, at, done_in_segment};
      return false;
    }
    // Skip what has landed; a partial transfer resumes inside its segment.
    auto left = static_cast<std::uint64_t>(written);
    while (left > 0 && at < local.size()) {
      const std::uint64_t step = std::min<std::uint64_t>(left, local[at].iov_len);
      local[at].iov_base = static_cast<char*>(local[at].iov_base) + step;
      remote[at].iov_base = static_cast<char*>(remote[at].iov_base) + step;
      local[at].iov_len -= step;
      remote[at].iov_len -= step;
      left -= step;
      done_in_segment += step;
      if (local[at].iov_len == 0) {
        ++at;
        done_in_segment = 0;
      }
    }
    while (at < local.size() && local[at].iov_len == 0) ++at;
  }
  return true;
}

int vm_read(pid_t pid, void* local, std::uint64_t remote, std::size_t bytes) {
  iovec mine{local, bytes};
  iovec theirs{reinterpret_cast<void*>(remote), bytes};
  for (;;) {
    const ssize_t read = ::process_vm_readv(pid, &mine, 1, &theirs, 1, 0);
    if (read < 0 && errno == EINTR) continue;
    if (read < 0) return errno;
    return static_cast<std::size_t>(read) == bytes ? 0 : EFAULT;
  }
}

std::string describe_vm_error(int error) {
  std::string text = std::strerror(error);
  switch (error) {
    case EPERM:
      text += " (this process may not access the peer's memory: both must run as the same user and be "
              "dumpable, and kernel.yama.ptrace_scope must be 0 or 1)";
      break;
    case ESRCH: text += " (the peer process has exited, or runs in another PID namespace)"; break;
    case EFAULT: text += " (the range is not mapped in one of the processes: freed, or never registered)"; break;
    default: break;
  }
  return text;
}

void allow_peer_writes() {
  static std::once_flag once;
  std::call_once(once, [] {
    // With Yama's ptrace_scope = 1 only a declared tracer may use process_vm_writev on this process.
    if (::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == -1 && errno != EINVAL) {
      WB_LOG(kWarn) << "prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY) failed: " << std::strerror(errno)
                    << "; same-machine peers may not be able to write into this process";
    }
  });
}

std::uint64_t pid_namespace() {
  struct stat info {};
  if (::stat("/proc/self/ns/pid", &info) != 0) return 0;
  return static_cast<std::uint64_t>(info.st_ino);
}

// --- endpoint record --------------------------------------------------------------------------------

std::uint64_t fnv1a(std::span<const std::byte> bytes) {
  std::uint64_t hash = 0xcbf29ce484222325ull;
  for (std::byte b : bytes) {
    hash ^= static_cast<std::uint8_t>(b);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

void append_checksum(std::vector<std::byte>& out) {
  const std::uint64_t sum = fnv1a(out);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>(sum >> (8 * i)));
}

std::span<const std::byte> checked_body(std::span<const std::byte> record, const std::string& what) {
  if (record.size() < 9)
    throw Error(ErrorCode::kCorruptData, what + ": " + std::to_string(record.size()) + " bytes is too short");
  const auto body = record.first(record.size() - 8);
  std::uint64_t stored = 0;
  for (int i = 0; i < 8; ++i) stored |= std::uint64_t{static_cast<std::uint8_t>(record[body.size() + i])} << (8 * i);
  if (stored != fnv1a(body))
    throw Error(ErrorCode::kCorruptData, what + ": checksum mismatch (corrupt, truncated or not such a record)");
  return body;
}

std::vector<std::byte> encode_endpoint(TransportKind kind, int peer, const ProcessAddress& self) {
  codec::ByteWriter out;
  out.varint(kEndpointMagic);
  out.varint(kEndpointVersion);
  out.byte(static_cast<std::uint8_t>(kind));
  out.signed_varint(self.rank);
  out.signed_varint(peer);
  out.varint(static_cast<std::uint64_t>(self.pid));
  out.varint(self.pid_namespace);
  out.text(self.machine);
  out.varint(self.mailbox);
  out.varint(self.nonce);
  out.varint(self.ring_slots);
  out.varint(self.mailbox_ranks);
  std::vector<std::byte> record = out.take();
  append_checksum(record);
  return record;
}

ProcessAddress decode_endpoint(TransportKind kind, int self, int peer, std::span<const std::byte> record,
                               const ProcessAddress& mine) {
  const std::string what = std::string(transport_name(kind)) + " endpoint record of rank " + std::to_string(peer);
  codec::ByteReader in(checked_body(record, what), what);
  if (in.varint() != kEndpointMagic) in.fail("not an endpoint record of a same-machine transport");
  if (const std::uint64_t version = in.varint(); version != kEndpointVersion)
    in.fail("version " + std::to_string(version) + ", this build reads " + std::to_string(kEndpointVersion));
  if (const std::uint8_t k = in.byte(); k != static_cast<std::uint8_t>(kind))
    in.fail(std::string("made by the ") +
            (k <= static_cast<std::uint8_t>(TransportKind::kCudaIpc) ? transport_name(static_cast<TransportKind>(k)) : "unknown") +
            " transport");
  ProcessAddress theirs;
  theirs.rank = static_cast<int>(in.bounded_signed(0, INT_MAX, "rank"));
  const auto to = static_cast<int>(in.bounded_signed(-1, INT_MAX, "destination rank"));
  theirs.pid = static_cast<pid_t>(in.bounded(INT_MAX, "pid"));
  theirs.pid_namespace = in.varint();
  theirs.machine = in.text();
  theirs.mailbox = in.varint();
  theirs.nonce = in.varint();
  theirs.ring_slots = static_cast<std::uint32_t>(in.bounded(255, "ring slots"));
  theirs.mailbox_ranks = static_cast<std::uint32_t>(in.bounded(UINT32_MAX, "mailbox ranks"));
  in.expect_done();
  if (theirs.ring_slots == 0 || theirs.mailbox_ranks == 0 || theirs.pid <= 0) in.fail("empty mailbox geometry or pid");
  if (theirs.rank != peer)
    throw Error(ErrorCode::kInvalidArgument, what + " was made by rank " + std::to_string(theirs.rank) +
                                                 ": records were given to the wrong peer");
  if (to != self)
    throw Error(ErrorCode::kInvalidArgument, what + " was made for rank " + std::to_string(to) + ", not for rank " +
                                                 std::to_string(self));
  if (theirs.machine != mine.machine)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(peer) + " is on machine '" + theirs.machine + "' and rank " +
                    std::to_string(self) + " on machine '" + mine.machine + "': the " + transport_name(kind) +
                    " transport connects ranks on one machine only (ibverbs or libfabric connect machines)");
  if (theirs.pid_namespace != 0 && mine.pid_namespace != 0 && theirs.pid_namespace != mine.pid_namespace)
    throw Error(ErrorCode::kUnsupported,
                "rank " + std::to_string(peer) + " runs in another PID namespace (" +
                    std::to_string(theirs.pid_namespace) + ", here " + std::to_string(mine.pid_namespace) +
                    ") on machine '" + mine.machine + "': the " + transport_name(kind) +
                    " transport needs both ranks in one (run them in one container)");
  return theirs;
}

// --- mailbox ----------------------------------------------------------------------------------------

Mailbox::Mailbox(int rank) {
  const std::int64_t slots = *mailbox_slots_setting;  // both ranges are checked as they are read
  const std::int64_t ranks = *mailbox_ranks_setting;
  if (rank < 0) throw Error(ErrorCode::kInvalidArgument, "mailbox of rank " + std::to_string(rank));

  allow_peer_writes();
  address_.rank = rank;
  address_.pid = ::getpid();
  address_.pid_namespace = pid_namespace();
  address_.machine = machine_id();
  address_.nonce = random_nonce();
  address_.ring_slots = static_cast<std::uint32_t>(slots);
  address_.mailbox_ranks = static_cast<std::uint32_t>(ranks);
  ring_bytes_ = ring_bytes(address_.ring_slots);
  mapped_bytes_ = kHeaderBytes + static_cast<std::size_t>(ranks) * ring_bytes_;
  void* mapped = ::mmap(nullptr, mapped_bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (mapped == MAP_FAILED)
    throw Error(ErrorCode::kSystem, "mmap of a " + std::to_string(mapped_bytes_) + "-byte notification mailbox failed: " +
                                        std::strerror(errno) + " (lower WB_MAILBOX_RANKS)");
  base_ = static_cast<std::byte*>(mapped);
  address_.mailbox = reinterpret_cast<std::uint64_t>(base_);
  MailboxHeader header{kMailboxMagic, address_.nonce, address_.ring_slots, address_.mailbox_ranks, rank,
                       static_cast<std::int32_t>(address_.pid)};
  std::memcpy(base_, &header, sizeof header);
}

Mailbox::~Mailbox() {
  if (base_ == nullptr) return;
  // Not unmapped: a peer that has not noticed this side is gone (its update failed or timed out) may still
  // write a notification here, and an address the kernel handed out again would take it silently. The
  // pages are released and the range stays reserved without access, so such a write fails with EFAULT.
  if (::mmap(base_, mapped_bytes_, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0) == MAP_FAILED)
    ::munmap(base_, mapped_bytes_);
}

std::byte* Mailbox::ring(int peer) const { return base_ + kHeaderBytes + static_cast<std::size_t>(peer) * ring_bytes_; }

void Mailbox::watch(int peer) {
  if (peer < 0 || static_cast<std::uint64_t>(peer) >= address_.mailbox_ranks)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(peer) + " cannot notify rank " + std::to_string(address_.rank) +
                    ": mailboxes hold rings for ranks below " + std::to_string(address_.mailbox_ranks) +
                    " (raise WB_MAILBOX_RANKS)");
  for (const Watched& w : watched_)
    if (w.peer == peer) return;
  watched_.push_back({peer, ring(peer), 0});
}

Status Mailbox::poll(std::vector<Completion>& completions) {
  const std::uint32_t slots = address_.ring_slots;
  for (Watched& w : watched_) {
    for (std::uint32_t lap = 0; lap < slots; ++lap) {  // at most one lap per ring and call
      const std::uint64_t next = w.taken + 1;
      auto* slot = reinterpret_cast<Slot*>(w.ring + kRingHeaderBytes + (w.taken % slots) * sizeof(Slot));
      if (std::atomic_ref<std::uint8_t>(slot->flag).load(std::memory_order_acquire) != generation(next, slots)) break;
      const std::uint64_t sequence = std::atomic_ref<std::uint64_t>(slot->sequence).load(std::memory_order_relaxed);
      const std::uint32_t immediate = std::atomic_ref<std::uint32_t>(slot->immediate).load(std::memory_order_relaxed);
      if (sequence != next)
        return Status(ErrorCode::kCorruptData,
                      "notification mailbox of rank " + std::to_string(address_.rank) + ": the ring of rank " +
                          std::to_string(w.peer) + " holds sequence " + std::to_string(sequence) + " where " +
                          std::to_string(next) + " belongs");
      completions.push_back({Completion::Kind::kArrival, w.peer, 0, immediate});
      w.taken = next;
      // Release: the payload was read before the writer may see the slot as free.
      std::atomic_ref<std::uint8_t>(*reinterpret_cast<std::uint8_t*>(w.ring))
          .store(static_cast<std::uint8_t>(next), std::memory_order_release);
    }
  }
  return Status::ok();
}

// --- writer side ------------------------------------------------------------------------------------

PeerRing::PeerRing(int self, int peer, const ProcessAddress& receiver) : self_(self), peer_(peer), receiver_(receiver) {
  if (self < 0 || static_cast<std::uint64_t>(self) >= receiver.mailbox_ranks)
    throw Error(ErrorCode::kInvalidArgument,
                "rank " + std::to_string(self) + " cannot notify rank " + std::to_string(peer) +
                    ": its mailbox holds rings for ranks below " + std::to_string(receiver.mailbox_ranks) +
                    " (raise WB_MAILBOX_RANKS there)");
  ring_ = receiver.mailbox + kHeaderBytes + static_cast<std::uint64_t>(self) * ring_bytes(receiver.ring_slots);
}

std::string PeerRing::where() const { return process_text(peer_, receiver_.pid); }

void PeerRing::verify() const {
  MailboxHeader header{};
  if (const int error = vm_read(receiver_.pid, &header, receiver_.mailbox, sizeof header); error != 0)
    throw Error(ErrorCode::kSystem, "rank " + std::to_string(self_) + " cannot reach the memory of " + where() +
                                        ": process_vm_readv failed: " + describe_vm_error(error));
  if (header.magic != kMailboxMagic || header.nonce != receiver_.nonce || header.rank != peer_ ||
      header.pid != receiver_.pid)
    throw Error(ErrorCode::kInvalidArgument, "pid " + std::to_string(receiver_.pid) + " is not rank " +
                                                 std::to_string(peer_) +
                                                 "'s process (its mailbox does not match the endpoint record)");
  // process_vm_readv and process_vm_writev need the same (ptrace) access: this read proved both.
}

Status PeerRing::reserve() {
  const std::uint32_t slots = receiver_.ring_slots;
  if (reserved_ - consumed_ >= slots) {
    std::uint8_t byte = 0;
    if (const int error = vm_read(receiver_.pid, &byte, ring_, 1); error != 0)
      return Status(ErrorCode::kSystem, "reading the consumed count of " + where() +
                                            " failed: process_vm_readv: " + describe_vm_error(error));
    const auto advance = static_cast<std::uint8_t>(byte - static_cast<std::uint8_t>(consumed_));
    if (consumed_ + advance > written_)
      return Status(ErrorCode::kCorruptData, "the mailbox of " + where() + " says " + std::to_string(consumed_ + advance) +
                                                 " notifications of rank " + std::to_string(self_) +
                                                 " were consumed, but only " + std::to_string(written_) + " were written");
    consumed_ += advance;
    if (reserved_ - consumed_ >= slots)
      return Status(ErrorCode::kRetryLater, "rank " + std::to_string(peer_) + " has not yet taken the last " +
                                                std::to_string(slots) + " notifications of rank " + std::to_string(self_));
  }
  ++reserved_;
  return Status::ok();
}

void PeerRing::unreserve() {
  if (reserved_ > written_) --reserved_;
}

Status PeerRing::notify(std::uint32_t immediate) {
  if (written_ >= reserved_)
    return Status(ErrorCode::kInternal, "notification to " + where() + " without a reservation");
  const std::uint64_t sequence = written_ + 1;
  const std::uint32_t slots = receiver_.ring_slots;
  const std::uint64_t slot = ring_ + kRingHeaderBytes + (written_ % slots) * sizeof(Slot);
  Slot record{};
  record.sequence = sequence;
  record.immediate = immediate;
  record.flag = generation(sequence, slots);
  // Two calls: the payload, then the flag byte alone (the order the receiver relies on).
  iovec local[2] = {{&record, kPayloadBytes}, {&record.flag, 1}};
  iovec remote[2] = {{reinterpret_cast<void*>(slot), kPayloadBytes},
                     {reinterpret_cast<void*>(slot + offsetof(Slot, flag)), 1}};
  for (int part = 0; part < 2; ++part) {
    VmFailure failure;
    if (!vm_write(receiver_.pid, std::span(&local[part], 1), std::span(&remote[part], 1), failure))
      return Status(ErrorCode::kSystem, "notifying " + where() + " (notification " + std::to_string(sequence) +
                                            ") failed: process_vm_writev: " + describe_vm_error(failure.error));
  }
  written_ = sequence;
  return Status::ok();
}

}  // namespace wb::shm

// Private: rails and batch accounting of the ibverbs transport, with no device, so that tests check them.
//
// A rail is one RC queue pair to a peer: NIC pair i carries WB_IB_QPS_PER_CONNECTION rails. A batch is
// striped over the rails (plan_stripes); every rail ends its part with an RDMA_WRITE_WITH_IMM carrying the
// batch's immediate, so the receiver sees one arrival per rail and batch (ArrivalMatcher) and the sender
// one signalled completion per rail and batch (SendQueue, BatchTracker).
//
// Completion queue room (CompletionCredits): every posted work request may complete, with an error,
// when its queue pair fails (flushes ignore selective signalling), so a work request holds one entry of
// its NIC's completion queue from its post until its batch's signalled completion is polled, or, for a
// failed peer, until the drain marker posted after the failure is polled (SendQueue::outstanding then
// says what to give back). Each queue pair keeps one entry and one send-queue slot for its drain marker.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "transport/transport.hpp"
#include "weightbridge/status.hpp"

namespace wb::ibv {

// --- a growable FIFO that allocates only when it grows (reserve once, then never on the update path) --

template <class T>
class Ring {
 public:
  explicit Ring(std::size_t capacity = 0) { reserve(capacity); }

  void reserve(std::size_t capacity) {
    if (capacity <= slots_.size()) return;
    std::vector<T> grown(capacity);
    for (std::size_t i = 0; i < size_; ++i) grown[i] = slots_[(head_ + i) % slots_.size()];
    slots_ = std::move(grown);
    head_ = 0;
  }
  void push_back(const T& value) {
    if (size_ == slots_.size()) reserve(slots_.empty() ? 16 : 2 * slots_.size());
    slots_[(head_ + size_) % slots_.size()] = value;
    ++size_;
  }
  T& front() { return slots_[head_]; }
  const T& front() const { return slots_[head_]; }
  /// The i-th oldest entry (0 = front); i < size().
  T& at(std::size_t i) { return slots_[(head_ + i) % slots_.size()]; }
  const T& at(std::size_t i) const { return slots_[(head_ + i) % slots_.size()]; }
  void pop_front() {
    head_ = (head_ + 1) % slots_.size();
    --size_;
  }
  void clear() {
    head_ = 0;
    size_ = 0;
  }
  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

 private:
  std::vector<T> slots_;
  std::size_t head_ = 0;
  std::size_t size_ = 0;
};

// --- work request ids --------------------------------------------------------------------------------

/// wr_id of every receive, of the drain marker posted to a failed queue pair, and of a batch's work
/// requests: its sequence number on its peer (below 2^62), so that no token a caller picks can be taken
/// for a receive or a marker.
inline constexpr std::uint64_t kReceiveWrId = std::uint64_t{1} << 63;
inline constexpr std::uint64_t kDrainWrId = std::uint64_t{1} << 62;
inline constexpr std::uint64_t kMaxBatchSequence = kDrainWrId - 1;

/// The immediate on the wire is big-endian (htonl on post, ntohl on receipt).
std::uint32_t immediate_to_wire(std::uint32_t immediate);
std::uint32_t immediate_from_wire(std::uint32_t wire);

// --- checks ------------------------------------------------------------------------------------------

// --- striping ----------------------------------------------------------------------------------------

/// Rail r of a connection with `nic_pairs` NIC pairs runs over NIC pair r % nic_pairs, so that a batch cut
/// into fewer shares than rails still spreads over the NICs first.
inline int rail_nic(int rail, int nic_pairs) { return rail % nic_pairs; }
/// Its queue pair among the `qps_per_nic` of that NIC: rail / nic_pairs.
inline int rail_qp_on_nic(int rail, int nic_pairs) { return rail / nic_pairs; }

/// Bytes [offset, offset + bytes) of the batch counted from the start of writes[write]: one RDMA write. A
/// piece may run on into the following writes when they continue it on both sides (see plan_stripes).
struct Piece {
  std::uint32_t write = 0;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;
  bool operator==(const Piece&) const = default;
};

struct StripeOptions {
  int rails = 1;
  int first_rail = 0;                   // the rail of a batch too small to stripe (rotated by the caller)
  std::uint64_t max_message = 1u << 30; // longer pieces are split
  std::uint64_t min_stripe_bytes = 0;   // a batch below rails * this goes on one rail
  std::uint64_t alignment = 4096;       // stripe boundaries are multiples of this
};

/// Spreads a batch over the rails. Consecutive writes that continue each other on both sides (same
/// memories, local and remote offsets each where the previous write ended) are merged first, so a packed
/// buffer sent in many writes costs one work request. The batch's bytes, in order, are then cut into
/// `rails` contiguous shares of about equal size (boundaries aligned), each merged run becoming a piece
/// on every rail its bytes touch; pieces longer than max_message are split. Zero-byte writes make no
/// piece. `out` is resized to `rails` and reused (no allocation once warm).
void plan_stripes(std::span<const WriteRequest> writes, const StripeOptions& options,
                  std::vector<std::vector<Piece>>& out);

/// Work requests a rail posts for its pieces. Every rail ends its part of every batch with the immediate:
/// on the last piece (RDMA_WRITE_WITH_IMM carrying bytes), or, with `separate_immediate` (adaptive
/// routing: the bytes go as plain RDMA_WRITEs, which the NIC may place out of order) or no bytes on the
/// rail, as one more zero-length RDMA_WRITE_WITH_IMM.
inline std::size_t rail_work_requests(const std::vector<Piece>& pieces, bool separate_immediate) {
  return pieces.size() + (separate_immediate || pieces.empty() ? 1 : 0);
}

// --- accounting --------------------------------------------------------------------------------------

/// Send-queue slots of one queue pair. A batch's work requests hold their slots until its one signalled
/// work request completes (selective signalling: only the last is signalled; RC completes in order).
class SendQueue {
 public:
  SendQueue() = default;
  explicit SendQueue(std::uint32_t depth) { reset(depth); }
  void reset(std::uint32_t depth);

  std::uint32_t depth() const { return depth_; }
  std::uint32_t outstanding() const { return outstanding_; }
  std::uint32_t free_slots() const { return depth_ - outstanding_; }
  std::size_t batches_in_flight() const { return in_flight_.size(); }
  bool fits(std::size_t work_requests) const { return work_requests <= free_slots(); }

  /// Records a posted batch of `work_requests` whose signalled request carries wr_id = sequence. Requires fits.
  void push(std::uint64_t sequence, std::uint32_t work_requests);
  /// The signalled completion with this wr_id arrived: frees its batch's slots and returns how many.
  /// kInternal when it is not the oldest batch in flight.
  Status complete(std::uint64_t wr_id, std::uint32_t& freed);
  /// The queue pair was drained after a failure: everything is freed; returns how many work requests were
  /// outstanding (their completion-queue entries are free again).
  std::uint32_t drain();

 private:
  struct Batch {
    std::uint64_t sequence = 0;
    std::uint32_t work_requests = 0;
  };
  std::uint32_t depth_ = 0;
  std::uint32_t outstanding_ = 0;
  Ring<Batch> in_flight_;
};

/// Free entries of one NIC's completion queue for send completions (the receives own theirs).
class CompletionCredits {
 public:
  void reset(std::uint32_t entries) { available_ = entries; }
  std::uint32_t available() const { return available_; }
  bool take(std::uint32_t n) {
    if (n > available_) return false;
    available_ -= n;
    return true;
  }
  void give(std::uint32_t n) { available_ += n; }

 private:
  std::uint32_t available_ = 0;
};

/// The batches posted to one peer: each is complete when every rail has completed its part. Each rail
/// completes its parts in order, and every batch has a part on every rail, so batches complete in order.
class BatchTracker {
 public:
  void reset(int rails, std::size_t capacity);
  void push(std::uint64_t sequence, std::uint64_t token);
  /// `rail` completed its part of the oldest batch it had not yet completed, whose sequence number is
  /// `sequence`. kInternal when that is not what was posted.
  Status rail_done(int rail, std::uint64_t sequence);
  /// Pops the oldest batch when every rail has completed it; its caller's token.
  bool pop_complete(std::uint64_t& token);
  std::size_t in_flight() const { return batches_.size(); }
  /// The token of the batch in flight with this sequence number (for messages); false when none is.
  bool token_of(std::uint64_t sequence, std::uint64_t& token) const;
  void clear();

 private:
  struct Batch {
    std::uint64_t sequence = 0;
    std::uint64_t token = 0;
  };
  Ring<Batch> batches_;
  std::vector<std::size_t> done_;  // per rail: parts completed among batches_ (from the front)
};

/// Arrivals from one peer: every rail carries one WRITE_WITH_IMM per batch, each with the batch's
/// immediate; the batch has landed when it arrived on every rail (RC orders each rail). The k-th arrival
/// of every rail belongs to the same batch, so the immediates must agree.
class ArrivalMatcher {
 public:
  void reset(int rails);
  /// Records an arrival on `rail`; sets `complete` (and `immediate`) when that batch has now arrived on
  /// every rail. kCorruptData when the rails disagree about the immediate.
  Status arrive(int rail, std::uint32_t imm, bool& complete, std::uint32_t& immediate);
  std::size_t pending(int rail) const { return rails_[static_cast<std::size_t>(rail)].size(); }

 private:
  std::vector<Ring<std::uint32_t>> rails_;
};

// --- receive budget ----------------------------------------------------------------------------------

/// The receives one NIC's shared receive queue must hold so that no arriving WRITE_WITH_IMM finds none
/// (an RNR NAK, retried by the sender's NIC after a pause: slow, and with many writers a storm): every
/// writer connected through the NIC may have `batches_in_flight` batches unacknowledged, each taking one
/// receive on each of its rails on the NIC.
class ReceiveBudget {
 public:
  explicit ReceiveBudget(std::uint32_t capacity = 0) : capacity_(capacity) {}
  std::uint32_t capacity() const { return capacity_; }
  std::uint64_t needed() const { return needed_; }
  std::size_t writers() const { return writers_; }
  bool fits() const { return needed_ <= capacity_; }
  /// Adds a writer; returns fits().
  bool add_writer(std::uint64_t batches_in_flight, int rails_on_nic);
  /// What to tell the user when it does not fit ("" when it does).
  std::string shortfall(const std::string& nic) const;

 private:
  std::uint32_t capacity_ = 0;
  std::uint64_t needed_ = 0;
  std::size_t writers_ = 0;
};

}  // namespace wb::ibv

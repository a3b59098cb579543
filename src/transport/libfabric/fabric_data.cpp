// post_writes and poll: the update path. Returns Status, never throws, allocates nothing once warm (the
// batch records and their arrays are reused).
#include <algorithm>

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "core/checks.hpp"
#include "transport/libfabric/fabric_internal.hpp"

namespace wb::fabric {
namespace {

constexpr int kPollBatch = 64;

/// How many of the batch's writes may be handed to the provider now.
std::size_t postable_end(const Batch& batch, BatchCompletion mode) {
  if (mode == BatchCompletion::kOrdered || batch.awaiting_delivery == 0) return batch.messages.size();
  return batch.messages.size() - 1;  // two_phase: the last once every other write is delivered
}

}  // namespace

Status FabricTransport::post_writes(int peer, std::span<const WriteRequest> writes, std::uint32_t immediate,
                                    std::uint64_t token) {
  const auto found = peers_.find(peer);
  if (found == peers_.end())
    return Status(ErrorCode::kInvalidArgument,
                  "libfabric post_writes: rank " + std::to_string(peer) + " is not connected to rank " + std::to_string(rank_));
  if (!found->second.failed.is_ok()) return found->second.failed;
  const std::size_t limit = capabilities().max_writes_per_batch;
  if (writes.size() > limit)
    return Status(ErrorCode::kInvalidArgument, "libfabric post_writes to rank " + std::to_string(peer) + ": " +
                                                   std::to_string(writes.size()) + " writes, at most " +
                                                   std::to_string(limit) + " a batch");
  WB_RETURN_IF_ERROR(regions_.check(peer, writes));
  // A batch the provider cut short goes out before any other, so that posts keep their order.
  WB_RETURN_IF_ERROR(push_backlog());
  if (!backlog_.empty())
    return Status(ErrorCode::kRetryLater, "libfabric: the provider's transmit queue is full (rank " + std::to_string(rank_) + ")");

  std::size_t ops = 0;
  for (const WriteRequest& w : writes) ops += w.bytes > 0 ? 1 : 0;
  ops = std::max<std::size_t>(ops, 1);  // an empty batch is one zero-length write: the notification
  if (free_batches_.empty() || (in_flight_ops_ > 0 && in_flight_ops_ + ops > transmit_depth_))
    return Status(ErrorCode::kRetryLater, "libfabric: " + std::to_string(in_flight_ops_) + " writes in flight on rank " +
                                              std::to_string(rank_) + " (transmit queue " + std::to_string(transmit_depth_) + ")");

  const std::uint32_t index = take_batch();
  Batch& batch = batches_[index];
  batch.peer = peer;
  batch.token = token;
  batch.cq_data = encode_cq_data(rank_, immediate, rank_in_cq_data_);
  batch.bytes = 0;
  batch.next = 0;
  batch.messages.resize(ops);
  batch.local.resize(ops);
  batch.remote.resize(ops);
  batch.descs.resize(ops);
  batch.contexts.resize(ops);
  const fi_addr_t address = found->second.address;
  std::size_t op = 0;
  const auto add = [&](void* source, std::uint64_t bytes, void* desc, std::uint64_t target, std::uint64_t key) {
    batch.local[op] = {source, bytes};
    batch.descs[op] = desc;
    batch.remote[op] = {target, bytes, key};
    batch.contexts[op] = {};
    batch.contexts[op].batch = index;
    fi_msg_rma& m = batch.messages[op];
    m = {};
    m.msg_iov = &batch.local[op];
    m.desc = &batch.descs[op];
    m.iov_count = bytes > 0 ? 1 : 0;
    m.addr = address;
    m.rma_iov = &batch.remote[op];
    m.rma_iov_count = 1;
    m.context = &batch.contexts[op];
    batch.bytes += bytes;
    ++op;
  };
  for (const WriteRequest& w : writes) {
    if (w.bytes == 0) continue;
    const Local& source = local_[w.local_memory];
    const Remote& target = remote_[w.remote_memory];
    add(source.address + w.local_offset, w.bytes, source.desc, target.target_base + w.remote_offset, target.key);
  }
  if (op == 0) {
    // Nothing to move: a zero-length write into any region of the peer carries the notification.
    const std::int64_t first = regions_.first_remote_of(peer);
    if (first < 0) {
      free_batches_.push_back(index);
      return Status(ErrorCode::kInvalidArgument, "libfabric post_writes of an empty batch to rank " + std::to_string(peer) +
                                                     ": no memory of that rank is imported on rank " + std::to_string(rank_));
    }
    add(nullptr, 0, nullptr, remote_[static_cast<std::size_t>(first)].target_base, remote_[static_cast<std::size_t>(first)].key);
  }
  batch.contexts[ops - 1].last = true;
  batch.messages[ops - 1].data = batch.cq_data;
  batch.awaiting_delivery = completion_mode_ == BatchCompletion::kTwoPhase ? ops - 1 : 0;
  in_flight_ops_ += ops;

  const Status pushed = push(batch);
  if (!pushed) return fail_peer(peer, pushed);
  if (batch.next < postable_end(batch, completion_mode_)) backlog_.push_back(index);
  return Status::ok();
}

Status FabricTransport::push(Batch& batch) {
  const std::size_t end = postable_end(batch, completion_mode_);
  const std::size_t last = batch.messages.size() - 1;
  while (batch.next < end) {
    std::uint64_t flags = 0;
    if (batch.next == last)
      flags = FI_REMOTE_CQ_DATA | FI_COMPLETION | FI_DELIVERY_COMPLETE;
    else if (completion_mode_ == BatchCompletion::kTwoPhase)
      flags = FI_COMPLETION | FI_DELIVERY_COMPLETE;
    const ssize_t rc = fi_writemsg(ep_.get(), &batch.messages[batch.next], flags);
    if (rc == -FI_EAGAIN) return Status::ok();  // the rest goes from the backlog
    if (rc != 0)
      return Status(ErrorCode::kLibfabric, "fi_writemsg of write " + std::to_string(batch.next) + " of a batch to rank " +
                                               std::to_string(batch.peer) + " on rank " + std::to_string(rank_) +
                                               " (provider " + provider_ + ") failed: " + fi_strerror(static_cast<int>(-rc)));
    ++batch.next;
  }
  return Status::ok();
}

Status FabricTransport::push_backlog() {
  while (!backlog_.empty()) {
    Batch& batch = batches_[backlog_.front()];
    const Status pushed = push(batch);
    if (!pushed) {
      backlog_.pop_front();
      return fail_peer(batch.peer, pushed);
    }
    if (batch.next < postable_end(batch, completion_mode_)) return Status::ok();  // still full
    backlog_.pop_front();
  }
  return Status::ok();
}

std::uint32_t FabricTransport::take_batch() {
  const std::uint32_t index = free_batches_.back();
  free_batches_.pop_back();
  batches_[index].in_use = true;
  return index;
}

Status FabricTransport::fail_peer(int peer, Status status) {
  PeerState& state = peers_[peer];
  if (state.failed.is_ok()) state.failed = status;
  return status;
}

// A diagnosis, off the update path.
std::vector<int> FabricTransport::awaited_peers() const {
  std::vector<int> out;
  for (const Batch& batch : batches_)
    if (batch.in_use) out.push_back(batch.peer);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int FabricTransport::writer_of(fi_addr_t source) const {
  const auto it = rank_of_address_.find(source);
  return it == rank_of_address_.end() ? -1 : it->second;
}

Status FabricTransport::complete(OpContext& op, std::vector<Completion>& completions) {
  Batch& batch = batches_[op.batch];
  if (!batch.in_use) return Status::ok();  // a batch already failed: its other writes no longer count
  if (!op.last) {
    // two_phase: one more earlier write delivered; the last goes once all are.
    if (batch.awaiting_delivery > 0 && --batch.awaiting_delivery == 0) {
      const Status pushed = push(batch);
      if (!pushed) return fail_peer(batch.peer, pushed);
      if (batch.next < postable_end(batch, completion_mode_)) backlog_.push_back(op.batch);
    }
    return Status::ok();
  }
  in_flight_ops_ -= batch.messages.size();
  traffic_.add(batch.peer, batch.bytes);
  completions.push_back({Completion::Kind::kWritesDone, batch.peer, batch.token, 0});
  batch.in_use = false;
  free_batches_.push_back(op.batch);
  return Status::ok();
}

Status FabricTransport::read_error() {
  fi_cq_err_entry error{};
  const ssize_t rc = fi_cq_readerr(cq_.get(), &error, 0);
  if (rc == -FI_EAGAIN) return Status::ok();
  if (rc < 0)
    return Status(ErrorCode::kLibfabric, "fi_cq_readerr on rank " + std::to_string(rank_) + " (provider " + provider_ +
                                             ") failed: " + fi_strerror(static_cast<int>(-rc)));
  char text[256] = {};
  const char* detail = fi_cq_strerror(cq_.get(), error.prov_errno, error.err_data, text, sizeof text);
  const std::string cause = std::string(fi_strerror(error.err)) + (detail != nullptr && *detail ? std::string(" (") + detail + ")" : "");
  auto* op = static_cast<OpContext*>(error.op_context);
  if (op == nullptr || op->batch >= batches_.size() || !batches_[op->batch].in_use) {
    // Not one of this rank's writes: an incoming write with CQ data that failed here.
    return Status(ErrorCode::kLibfabric, "libfabric on rank " + std::to_string(rank_) + " (provider " + provider_ +
                                             "): a completion failed: " + cause);
  }
  Batch& batch = batches_[op->batch];
  const Status status(ErrorCode::kLibfabric, "libfabric write from rank " + std::to_string(rank_) + " to rank " +
                                                  std::to_string(batch.peer) + " failed (provider " + provider_ + "): " + cause);
  // The batch is given up: its writes no longer hold transmit-queue room, and its record is never reused
  // (the provider may still hold its other writes' contexts).
  in_flight_ops_ -= batch.messages.size();
  batch.in_use = false;
  for (auto it = backlog_.begin(); it != backlog_.end();)
    it = batches_[*it].peer == batch.peer ? backlog_.erase(it) : std::next(it);
  return fail_peer(batch.peer, status);
}

Status FabricTransport::poll(std::vector<Completion>& completions) {
  WB_RETURN_IF_ERROR(push_backlog());
  fi_cq_data_entry entries[kPollBatch];
  fi_addr_t sources[kPollBatch];
  for (;;) {
    const ssize_t n = rank_in_cq_data_ ? fi_cq_read(cq_.get(), entries, kPollBatch)
                                       : fi_cq_readfrom(cq_.get(), entries, kPollBatch, sources);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      WB_RETURN_IF_ERROR(read_error());
      continue;
    }
    if (n < 0)
      return Status(ErrorCode::kLibfabric, "fi_cq_read on rank " + std::to_string(rank_) + " (provider " + provider_ +
                                               ") failed: " + fi_strerror(static_cast<int>(-n)));
    for (ssize_t i = 0; i < n; ++i) {
      const fi_cq_data_entry& entry = entries[i];
      if ((entry.flags & FI_REMOTE_CQ_DATA) != 0) {
        Arrival arrival = decode_cq_data(entry.data, rank_in_cq_data_);
        if (!rank_in_cq_data_) arrival.writer = writer_of(sources[i]);
        if (arrival.writer < 0 || !peers_.contains(arrival.writer))
          return Status(ErrorCode::kCorruptData, "libfabric on rank " + std::to_string(rank_) +
                                                     ": a batch arrived from an unknown writer (rank " +
                                                     std::to_string(arrival.writer) + ", immediate " +
                                                     std::to_string(arrival.immediate) + ")");
        completions.push_back({Completion::Kind::kArrival, arrival.writer, 0, arrival.immediate});
        continue;
      }
      if (entry.op_context != nullptr) WB_RETURN_IF_ERROR(complete(*static_cast<OpContext*>(entry.op_context), completions));
    }
    if (n < kPollBatch) break;
  }
  return push_backlog();
}

}  // namespace wb::fabric

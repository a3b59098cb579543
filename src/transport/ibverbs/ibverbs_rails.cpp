// Rails and batch accounting of the ibverbs transport (see ibverbs_rails.hpp).
#include "transport/ibverbs/ibverbs_rails.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>

#include "core/hex.hpp"

namespace wb::ibv {
namespace {


/// Calls f(first_write, bytes) for each run of the batch: consecutive non-empty writes that are contiguous
/// on both sides (same memories, each starting where the previous ended) form one run, so the pieces of a
/// packed buffer cost one work request, not one per write.
template <class F>
void for_each_run(std::span<const WriteRequest> writes, F&& f) {
  const WriteRequest* last = nullptr;
  std::size_t first = 0;
  std::uint64_t bytes = 0;
  for (std::size_t i = 0; i < writes.size(); ++i) {
    const WriteRequest& w = writes[i];
    if (w.bytes == 0) continue;
    if (last != nullptr && w.local_memory == last->local_memory && w.remote_memory == last->remote_memory &&
        w.local_offset == last->local_offset + last->bytes && w.remote_offset == last->remote_offset + last->bytes) {
      bytes += w.bytes;
    } else {
      if (last != nullptr) f(first, bytes);
      first = i;
      bytes = w.bytes;
    }
    last = &w;
  }
  if (last != nullptr) f(first, bytes);
}

}  // namespace

void plan_stripes(std::span<const WriteRequest> writes, const StripeOptions& options,
                  std::vector<std::vector<Piece>>& out) {
  const int rails = std::max(options.rails, 1);
  const std::uint64_t max_message = std::max<std::uint64_t>(options.max_message, 1);
  out.resize(static_cast<std::size_t>(rails));
  for (auto& rail : out) rail.clear();

  auto emit = [&](int rail, std::size_t write, std::uint64_t offset, std::uint64_t bytes) {
    auto& pieces = out[static_cast<std::size_t>(rail)];
    while (bytes > 0) {
      const std::uint64_t take = std::min(bytes, max_message);
      pieces.push_back(Piece{static_cast<std::uint32_t>(write), offset, take});
      offset += take;
      bytes -= take;
    }
  };

  std::uint64_t total = 0;
  for (const WriteRequest& w : writes) total += w.bytes;
  const auto rails64 = static_cast<std::uint64_t>(rails);
  if (rails == 1 || total / rails64 < options.min_stripe_bytes || total < rails64) {
    const int rail = ((options.first_rail % rails) + rails) % rails;
    for_each_run(writes, [&](std::size_t write, std::uint64_t bytes) { emit(rail, write, 0, bytes); });
    return;
  }
  const std::uint64_t align = std::max<std::uint64_t>(options.alignment, 1);
  std::uint64_t share = (total + rails64 - 1) / rails64;
  share = (share + align - 1) / align * align;

  int rail = 0;
  std::uint64_t position = 0;  // bytes of the batch before the current point
  std::uint64_t rail_end = share;
  for_each_run(writes, [&](std::size_t write, std::uint64_t bytes) {
    std::uint64_t offset = 0;
    while (offset < bytes) {
      const std::uint64_t take = std::min(bytes - offset, rail_end - position);
      emit(rail, write, offset, take);
      offset += take;
      position += take;
      if (position == rail_end && rail < rails - 1) {
        ++rail;
        rail_end = rail == rails - 1 ? std::numeric_limits<std::uint64_t>::max() : rail_end + share;
      }
    }
  });
}


std::uint32_t immediate_to_wire(std::uint32_t immediate) { return htonl(immediate); }
std::uint32_t immediate_from_wire(std::uint32_t wire) { return ntohl(wire); }

// --- accounting --------------------------------------------------------------------------------------

void SendQueue::reset(std::uint32_t depth) {
  depth_ = depth;
  outstanding_ = 0;
  in_flight_.clear();
  in_flight_.reserve(depth);
}

void SendQueue::push(std::uint64_t sequence, std::uint32_t work_requests) {
  outstanding_ += work_requests;
  in_flight_.push_back(Batch{sequence, work_requests});
}

Status SendQueue::complete(std::uint64_t wr_id, std::uint32_t& freed) {
  freed = 0;
  if (in_flight_.empty())
    return Status(ErrorCode::kInternal, "send completion with wr_id " + std::to_string(wr_id) + " but no batch is in flight");
  const Batch oldest = in_flight_.front();
  if (oldest.sequence != wr_id)
    return Status(ErrorCode::kInternal, "send completion with wr_id " + std::to_string(wr_id) +
                                            " but the oldest batch in flight is number " + std::to_string(oldest.sequence));
  in_flight_.pop_front();
  outstanding_ -= oldest.work_requests;
  freed = oldest.work_requests;
  return Status::ok();
}

std::uint32_t SendQueue::drain() {
  const std::uint32_t freed = outstanding_;
  outstanding_ = 0;
  in_flight_.clear();
  return freed;
}

void BatchTracker::reset(int rails, std::size_t capacity) {
  batches_.clear();
  batches_.reserve(capacity);
  done_.assign(static_cast<std::size_t>(std::max(rails, 1)), 0);
}

void BatchTracker::push(std::uint64_t sequence, std::uint64_t token) { batches_.push_back(Batch{sequence, token}); }

Status BatchTracker::rail_done(int rail, std::uint64_t sequence) {
  if (rail < 0 || static_cast<std::size_t>(rail) >= done_.size())
    return Status(ErrorCode::kInternal, "completion on rail " + std::to_string(rail) + " of " + std::to_string(done_.size()));
  std::size_t& done = done_[static_cast<std::size_t>(rail)];
  if (done >= batches_.size())
    return Status(ErrorCode::kInternal, "rail " + std::to_string(rail) + " completed batch number " + std::to_string(sequence) +
                                            ", which was never posted");
  if (batches_.at(done).sequence != sequence)
    return Status(ErrorCode::kInternal, "rail " + std::to_string(rail) + " completed batch number " + std::to_string(sequence) +
                                            " where number " + std::to_string(batches_.at(done).sequence) + " was next");
  ++done;
  return Status::ok();
}

bool BatchTracker::pop_complete(std::uint64_t& token) {
  if (batches_.empty()) return false;
  for (const std::size_t done : done_)
    if (done == 0) return false;
  token = batches_.front().token;
  batches_.pop_front();
  for (std::size_t& done : done_) --done;
  return true;
}

bool BatchTracker::token_of(std::uint64_t sequence, std::uint64_t& token) const {
  for (std::size_t i = 0; i < batches_.size(); ++i) {
    if (batches_.at(i).sequence != sequence) continue;
    token = batches_.at(i).token;
    return true;
  }
  return false;
}

void BatchTracker::clear() {
  batches_.clear();
  std::fill(done_.begin(), done_.end(), 0);
}

void ArrivalMatcher::reset(int rails) {
  rails_.assign(static_cast<std::size_t>(std::max(rails, 1)), Ring<std::uint32_t>(16));
}

Status ArrivalMatcher::arrive(int rail, std::uint32_t imm, bool& complete, std::uint32_t& immediate) {
  complete = false;
  if (rail < 0 || static_cast<std::size_t>(rail) >= rails_.size())
    return Status(ErrorCode::kInternal, "arrival on rail " + std::to_string(rail) + " of " + std::to_string(rails_.size()));
  rails_[static_cast<std::size_t>(rail)].push_back(imm);
  for (const auto& queue : rails_)
    if (queue.empty()) return Status::ok();
  // Every rail has an arrival: the oldest of each belong to one batch.
  const std::uint32_t first = rails_[0].front();
  for (std::size_t r = 1; r < rails_.size(); ++r) {
    if (rails_[r].front() != first)
      return Status(ErrorCode::kCorruptData, "the rails disagree about a batch's immediate: rail 0 carried " + hex(first) +
                                                 ", rail " + std::to_string(r) + " carried " + hex(rails_[r].front()) +
                                                 " (a batch posted on only some rails, or a peer running another build?)");
  }
  for (auto& queue : rails_) queue.pop_front();
  complete = true;
  immediate = first;
  return Status::ok();
}

// --- receive budget ----------------------------------------------------------------------------------

bool ReceiveBudget::add_writer(std::uint64_t batches_in_flight, int rails_on_nic) {
  needed_ += batches_in_flight * static_cast<std::uint64_t>(std::max(rails_on_nic, 0));
  ++writers_;
  return fits();
}

std::string ReceiveBudget::shortfall(const std::string& nic) const {
  if (fits()) return "";
  return nic + ": " + std::to_string(writers_) + " connected writer(s) may have " + std::to_string(needed_) +
         " batches' immediates in flight to this rank, but its shared receive queue holds " + std::to_string(capacity_) +
         " receives: arrivals beyond that are refused (RNR) and retried by the writers' NICs, which slows every "
         "writer. Raise WB_IB_SRQ_DEPTH (up to the device's limit), lower WB_IB_BATCHES_IN_FLIGHT on the writers, "
         "or spread the writers over more NICs";
}

}  // namespace wb::ibv

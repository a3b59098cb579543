// The ring baseline: the broadcast RL frameworks get from NCCL. The head and the rollout workers form one
// chain, the workers of a machine next to each other (the head's own machine first), and every bucket goes
// down it in segments: a worker passes segment i on as soon as it has it, while segment i + 1 arrives. So
// the model crosses each machine's link once in and once out, and the update takes about M / B plus one
// segment's time per hop, where Open MPI's MPI_Bcast of whole buckets (the plain broadcast) sends about
// 2 x M per replica out of the first machines. Point-to-point MPI carries the segments, as MPI_Bcast's do.
#include <algorithm>
#include <chrono>
#include <deque>
#include <string>

#include "baselines/baseline_state.hpp"
#include "comm/backoff.hpp"
#include "core/checks.hpp"

namespace wb::bench {
namespace {

constexpr int kRingTag = 0x5763;

double seconds_since(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

void Baselines::State::setup_ring() {
  if (options.ring_segment_bytes < 1 || options.ring_segment_bytes > (std::int64_t{1} << 30) || options.ring_window < 1)
    throw Error(ErrorCode::kInvalidArgument, "ring broadcast: segments of 1 B..1 GiB and a window of at least 1 segment");
  // Machines in the order of their first rollout worker, the head's machine first.
  std::vector<std::string> order{machines[static_cast<std::size_t>(head)]};
  for (int r = 0; r < size; ++r)
    if (!roles[static_cast<std::size_t>(r)] && std::find(order.begin(), order.end(), machines[static_cast<std::size_t>(r)]) == order.end())
      order.push_back(machines[static_cast<std::size_t>(r)]);
  std::vector<int> chain{head};
  for (const std::string& machine : order)
    for (int r = 0; r < size; ++r)
      if (!roles[static_cast<std::size_t>(r)] && machines[static_cast<std::size_t>(r)] == machine) chain.push_back(r);
  const auto at = std::find(chain.begin(), chain.end(), rank);
  on_ring = at != chain.end();
  if (!on_ring) return;
  ring_previous = at == chain.begin() ? -1 : *(at - 1);
  ring_next = at + 1 == chain.end() ? -1 : *(at + 1);
}

void Baselines::State::ring_pass(std::int64_t offset, std::int64_t bytes, const std::string& what, BaselineUpdate& update) {
  if (!on_ring || bytes <= 0) return;
  const std::int64_t segment = options.ring_segment_bytes;
  const std::int64_t count = (bytes + segment - 1) / segment;
  const auto window = static_cast<std::size_t>(options.ring_window);
  const auto pointer = [&](std::int64_t i) { return staging.data() + offset + i * segment; };
  const auto length = [&](std::int64_t i) { return static_cast<int>(std::min(segment, bytes - i * segment)); };
  const bool receives = ring_previous >= 0, sends = ring_next >= 0;
  std::deque<MPI_Request> receiving, sending;  // oldest first: MPI keeps one pair's messages in order
  std::int64_t posted = 0, received = receives ? 0 : count, sent = 0;
  comm::Backoff backoff;
  auto last_progress = std::chrono::steady_clock::now();
  const auto oldest_done = [](std::deque<MPI_Request>& requests) {
    int done = 0;
    WB_CHECK_MPI(MPI_Test(&requests.front(), &done, MPI_STATUS_IGNORE));
    if (done) requests.pop_front();
    return done != 0;
  };
  while (received < count || (sends && sent < count) || !sending.empty()) {
    bool progressed = false;
    // A segment is asked for only while the ones before it can be passed on (bounded in flight both ways).
    while (receives && posted < count && receiving.size() < window && sending.size() < window) {
      receiving.emplace_back();
      WB_CHECK_MPI(MPI_Irecv(pointer(posted), length(posted), MPI_BYTE, ring_previous, kRingTag, world, &receiving.back()));
      ++posted;
      progressed = true;
    }
    while (!receiving.empty() && oldest_done(receiving)) {
      ++received;
      progressed = true;
    }
    while (sends && sent < received && sending.size() < window) {
      sending.emplace_back();
      WB_CHECK_MPI(MPI_Isend(pointer(sent), length(sent), MPI_BYTE, ring_next, kRingTag, world, &sending.back()));
      (same_machine(rank, ring_next) ? update.within_machine : update.between_machines) += length(sent);
      ++sent;
      progressed = true;
    }
    while (!sending.empty() && oldest_done(sending)) progressed = true;
    if (progressed) {
      last_progress = std::chrono::steady_clock::now();
      backoff.progressed();
      continue;
    }
    if (seconds_since(last_progress) > options.timeout_seconds)
      throw Error(ErrorCode::kTimeout, who() + ": " + what + ": " + std::to_string(received) + " of " + std::to_string(count) +
                                           " segments in from world rank " + std::to_string(ring_previous) + ", " +
                                           std::to_string(sent - static_cast<std::int64_t>(sending.size())) +
                                           " passed on to world rank " + std::to_string(ring_next) + ", nothing moved for " +
                                           std::to_string(options.timeout_seconds) + " s");
    backoff.pause();
  }
}

BaselineUpdate Baselines::ring_broadcast() {
  State& s = *s_;
  return s.run_broadcast("ring broadcast", [&s](const State::Bucket& bucket, BaselineUpdate& update) {
    s.ring_pass(bucket.offset, bucket.bytes, "ring broadcast of tensors " + s.tensors[bucket.first].name + " ...", update);
  });
}

}  // namespace wb::bench

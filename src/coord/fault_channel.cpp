#include "coord/fault_channel.hpp"

#include <algorithm>
#include <map>

#include "comm/backoff.hpp"
#include "comm/join.hpp"
#include "comm/status_message.hpp"
#include "coord/messages.hpp"
#include "core/checks.hpp"

namespace wb::coord {
namespace {

// Receives one message already matched by MPI_Improbe (whole, whatever its length).
Status receive_matched(MPI_Message& message, const MPI_Status& probe, std::vector<std::byte>& bytes) {
  int count = 0;
  WB_TRY_MPI(MPI_Get_count(&probe, MPI_BYTE, &count));
  bytes.resize(static_cast<std::size_t>(std::max(count, 0)));
  WB_TRY_MPI(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
  return Status::ok();
}

comm::OperationPtr send_bytes(std::vector<std::byte> bytes, int peer, int tag, MPI_Comm world) {
  comm::OperationPtr op = comm::make_operation();
  op->out = std::move(bytes);
  // Notices and answers are best effort: a peer that cannot be reached is one that failed already.
  if (MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, peer, tag, world, &op->request) != MPI_SUCCESS)
    op->request = MPI_REQUEST_NULL;
  return op;
}

}  // namespace

FaultChannel::FaultChannel(MPI_Comm world, const Roles& roles) : world_(world), roles_(roles) {
  const auto heads = [](const std::vector<int>& group) {
    return std::vector<int>(group.begin(), group.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(2, group.size())));
  };
  const std::vector<int> trainer_heads = heads(roles.trainers);
  std::vector<int> out;
  const bool head = roles.group_rank < 2;
  if (roles.trainer) {
    if (head) {
      out = roles.trainers;
      for (const auto& engine : roles.engines)
        for (int r : heads(engine)) out.push_back(r);
    } else {
      out = trainer_heads;
    }
  } else {
    const auto& engine = roles.engines[static_cast<std::size_t>(roles.engine)];
    out = head ? engine : heads(engine);
    out.insert(out.end(), trainer_heads.begin(), trainer_heads.end());
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  std::erase(out, roles.world_rank);
  neighbours_ = std::move(out);
  gave_up_.assign(static_cast<std::size_t>(roles.world_size), false);
  gave_up_why_.assign(static_cast<std::size_t>(roles.world_size), std::string());
  found_silent_.assign(static_cast<std::size_t>(roles.world_size), false);
  write_failed_.assign(static_cast<std::size_t>(roles.world_size), false);
  spans_jobs_ = comm::spans_jobs(world);
  lost_engine_.assign(roles.engines.size(), false);
}

void FaultChannel::note_job_gone(int world_rank) {
  std::lock_guard lock(mutex_);
  note_job_gone_locked(world_rank);
}

void FaultChannel::note_job_gone_locked(int world_rank) {
  if (!spans_jobs_ || world_rank < 0 || static_cast<std::size_t>(world_rank) >= roles_.engine_of_rank.size()) return;
  const int engine = roles_.engine_of_rank[static_cast<std::size_t>(world_rank)];
  if (engine >= 0 && static_cast<std::size_t>(engine) < lost_engine_.size()) lost_engine_[static_cast<std::size_t>(engine)] = true;
}

bool FaultChannel::in_gone_job_locked(int world_rank) const {
  if (world_rank < 0 || static_cast<std::size_t>(world_rank) >= roles_.engine_of_rank.size()) return false;
  const int engine = roles_.engine_of_rank[static_cast<std::size_t>(world_rank)];
  return engine >= 0 && static_cast<std::size_t>(engine) < lost_engine_.size() && lost_engine_[static_cast<std::size_t>(engine)];
}

void FaultChannel::add_neighbours(const std::vector<int>& ranks) {
  std::lock_guard lock(mutex_);
  for (int r : ranks)
    if (r != roles_.world_rank && r >= 0 && r < roles_.world_size) neighbours_.push_back(r);
  std::sort(neighbours_.begin(), neighbours_.end());
  neighbours_.erase(std::unique(neighbours_.begin(), neighbours_.end()), neighbours_.end());
}

void FaultChannel::announce(const Status& status, std::uint64_t next_step) {
  std::lock_guard lock(mutex_);
  // A relay (next_step = max) goes out once; a rank's own give-up once more after it, since only the
  // latter says which step it did not complete.
  const bool relay = next_step == std::numeric_limits<std::uint64_t>::max();
  if (announced_ && (relay || announced_origin_)) return;
  announced_ = true;
  announced_origin_ = !relay;
  const std::vector<std::byte> bytes = comm::encode_status(
      status, roles_.trainer ? -1 : roles_.engine, static_cast<std::int64_t>(std::min<std::uint64_t>(next_step, INT64_MAX)), gone_);
  for (int peer : neighbours_)
    if (!in_gone_job_locked(peer)) sends_.push_back(send_bytes(bytes, peer, kNoticeTag, world_));
}

void FaultChannel::note_gone(int world_rank) {
  std::lock_guard lock(mutex_);
  if (world_rank < 0 || world_rank >= roles_.world_size || world_rank == roles_.world_rank) return;
  found_silent_[static_cast<std::size_t>(world_rank)] = true;
  write_failed_[static_cast<std::size_t>(world_rank)] = true;
  note_job_gone_locked(world_rank);
  if (std::find(gone_.begin(), gone_.end(), world_rank) == gone_.end()) gone_.push_back(world_rank);
}

void FaultChannel::raise(const Status& status) {
  std::lock_guard lock(mutex_);
  if (first_.is_ok()) first_ = status;
}

void FaultChannel::take_notices_locked() {
  for (;;) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status probe;
    if (MPI_Improbe(MPI_ANY_SOURCE, kNoticeTag, world_, &found, &message, &probe) != MPI_SUCCESS || !found) return;
    std::vector<std::byte> bytes;
    if (!receive_matched(message, probe, bytes)) return;
    std::int64_t group = 0, gave_up_at = 0;
    std::vector<int> gone;  // ranks a write of the sender's failed to at its post
    Status status = comm::decode_status(bytes, &group, &gave_up_at, &gone);
    for (int r : gone)
      if (r >= 0 && r < roles_.world_size) {
        found_silent_[static_cast<std::size_t>(r)] = true;
        write_failed_[static_cast<std::size_t>(r)] = true;
        note_job_gone_locked(r);
      }
    if (status.is_ok()) status = Status(ErrorCode::kInternal, describe_worker(roles_, probe.MPI_SOURCE) + " gave up without a reason");
    // A joined job that left between updates, in its own notice, is sent nothing more: it may be inside
    // MPI_Finalize, where a message that reaches Open MPI's TCP progress thread can crash it (a component
    // already unloaded; Open MPI issue #5902): 2 of 18 leaving jobs here, when the trainers' notices of
    // the update it failed, and their verdict, came after it left.
    if (is_leave(status) && status.message().starts_with(describe_worker(roles_, probe.MPI_SOURCE) + " "))
      note_job_gone_locked(probe.MPI_SOURCE);
    if (probe.MPI_SOURCE >= 0 && static_cast<std::size_t>(probe.MPI_SOURCE) < gave_up_.size()) {
      gave_up_[static_cast<std::size_t>(probe.MPI_SOURCE)] = true;
      gave_up_why_[static_cast<std::size_t>(probe.MPI_SOURCE)] = status.message();
    }
    const bool own_group = roles_.trainer ? group == -1 : group == roles_.engine;
    if (own_group && gave_up_at >= 0) group_gave_up_at_ = std::min(group_gave_up_at_, static_cast<std::uint64_t>(gave_up_at));
    if (first_.is_ok()) first_ = std::move(status);
  }
}

void FaultChannel::answer_queries_locked(const WaitProbe* probe) {
  for (;;) {
    int found = 0;
    MPI_Message message = MPI_MESSAGE_NULL;
    MPI_Status status;
    if (MPI_Improbe(MPI_ANY_SOURCE, kQueryTag, world_, &found, &message, &status) != MPI_SUCCESS || !found) return;
    std::vector<std::byte> bytes;
    if (!receive_matched(message, status, bytes)) return;
    std::int64_t serial = 0;
    (void)comm::decode_status(bytes, &serial);
    std::string what = activity_;
    std::vector<int> waits = activity_waits_;
    if (probe != nullptr && *probe) {
      auto [text, ranks] = (*probe)();
      what += ": waiting for " + text;
      waits = std::move(ranks);
    } else if (transfer_wait_at_ >= 0 && comm::local_seconds() - transfer_wait_at_ < 0.05) {
      // This thread is in a group step; the transfer thread was waiting a moment ago.
      what += "; its transfer waits for " + transfer_wait_.first;
      for (int r : transfer_wait_.second)
        if (std::find(waits.begin(), waits.end(), r) == waits.end()) waits.push_back(r);
    }
    if (in_gone_job_locked(status.MPI_SOURCE)) continue;  // it asked before its job was found gone
    sends_.push_back(send_bytes(comm::encode_status(Status(ErrorCode::kOk, what), serial, static_cast<std::int64_t>(activity_step_), waits),
                                status.MPI_SOURCE, kAnswerTag, world_));
  }
}

Status FaultChannel::poll(const WaitProbe* probe, bool answer) {
  Status relay;
  {
    std::lock_guard lock(mutex_);
    take_notices_locked();
    if (answer) answer_queries_locked(probe);
    std::erase_if(sends_, [](comm::OperationPtr& op) {
      int done = 1;
      if (op->request != MPI_REQUEST_NULL && MPI_Test(&op->request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS) done = 1;
      return done != 0;
    });
    if (first_.is_ok() || announced_) return first_;
    relay = first_;
  }
  // Passed on at once, so that the wave does not wait for this rank's next step.
  announce(relay, std::numeric_limits<std::uint64_t>::max());
  return relay;
}

bool FaultChannel::voids(std::uint64_t step) {
  (void)poll();
  std::lock_guard lock(mutex_);
  return group_gave_up_at_ <= step;
}

void FaultChannel::set_activity(std::uint64_t step, std::string what, std::vector<int> waits) {
  std::lock_guard lock(mutex_);
  activity_step_ = step;
  activity_ = std::move(what);
  activity_waits_ = std::move(waits);
}

void FaultChannel::note_transfer_wait(std::pair<std::string, std::vector<int>> wait) {
  std::lock_guard lock(mutex_);
  transfer_wait_ = std::move(wait);
  transfer_wait_at_ = comm::local_seconds();
}

void FaultChannel::set_waits(std::vector<int> waits) {
  std::lock_guard lock(mutex_);
  activity_waits_ = std::move(waits);
}

std::string FaultChannel::trace(const std::vector<int>& ranks, double seconds) {
  struct Seen {
    bool answered = false;
    std::string activity;
    std::vector<int> waits;
  };
  std::map<int, Seen> seen;
  std::vector<int> frontier;
  for (int r : ranks)
    if (r != roles_.world_rank && seen.emplace(r, Seen{}).second) frontier.push_back(r);
  const double deadline = comm::local_seconds() + seconds;
  // Breadth first, a few hops: each hop asks the ranks the previous answers named.
  for (int hop = 0; hop < 4 && !frontier.empty() && comm::local_seconds() < deadline; ++hop) {
    std::uint64_t serial = 0;
    {
      std::lock_guard lock(mutex_);
      serial = ++query_serial_;
      // A rank of a job known gone is not asked: it stays unanswered, named silent.
      std::erase_if(frontier, [&](int r) { return in_gone_job_locked(r); });
      for (int r : frontier)
        sends_.push_back(send_bytes(comm::encode_status(Status::ok(), static_cast<std::int64_t>(serial)), r, kQueryTag, world_));
    }
    std::size_t pending = frontier.size();
    comm::Backoff backoff;
    while (pending > 0 && comm::local_seconds() < deadline) {
      bool any = false;
      {
        std::lock_guard lock(mutex_);
        answer_queries_locked(nullptr);  // two ranks may be asking each other
        int found = 0;
        MPI_Message message = MPI_MESSAGE_NULL;
        MPI_Status status;
        if (MPI_Improbe(MPI_ANY_SOURCE, kAnswerTag, world_, &found, &message, &status) == MPI_SUCCESS && found) {
          any = true;
          std::vector<std::byte> bytes;
          if (receive_matched(message, status, bytes)) {
            std::int64_t their_serial = 0, their_step = 0;
            std::vector<int> waits;
            const Status activity = comm::decode_status(bytes, &their_serial, &their_step, &waits);
            const auto it = seen.find(status.MPI_SOURCE);
            if (their_serial == static_cast<std::int64_t>(serial) && it != seen.end() && !it->second.answered) {
              it->second = {true, activity.message(), std::move(waits)};
              --pending;
            }
          }
        }
      }
      if (any) backoff.progressed();
      else backoff.pause();
    }
    std::vector<int> next;
    for (int r : frontier) {
      const Seen& one = seen[r];
      if (!one.answered) continue;
      for (int w : one.waits)
        if (w != roles_.world_rank && w >= 0 && w < roles_.world_size && seen.emplace(w, Seen{}).second) next.push_back(w);
    }
    frontier = std::move(next);
  }
  // The silent ranks hold everything up; the ranks that wait on them show the way there.
  // A rank that announced giving up has left the library: it is not silent, only gone.
  std::vector<bool> left;
  std::vector<std::string> why;
  {
    std::lock_guard lock(mutex_);
    take_notices_locked();
    left = gave_up_;
    why = gave_up_why_;
  }
  const auto silent_rank = [&](int r) { return !seen[r].answered && !left[static_cast<std::size_t>(r)]; };
  std::string silent, chain;
  for (const auto& [r, one] : seen)
    if (silent_rank(r)) silent += (silent.empty() ? "" : ", ") + describe_worker(roles_, r);
  {
    std::lock_guard lock(mutex_);
    for (const auto& [r, one] : seen)
      if (silent_rank(r)) found_silent_[static_cast<std::size_t>(r)] = true;
  }
  if (silent.empty()) {
    // Nobody silent among those asked, but a rank this one waits on gave up (its deadline came first):
    // what it said names what it waited for.
    std::string gone;
    for (const auto& [r, one] : seen)
      if (!one.answered && left[static_cast<std::size_t>(r)] && !why[static_cast<std::size_t>(r)].empty())
        gone += "; " + describe_worker(roles_, r) + " gave up waiting: " + why[static_cast<std::size_t>(r)];
    if (!gone.empty()) return gone;
    // Everyone answered: the ranks that wait on nobody are where the wait ends (a rank whose transfer
    // thread answers while its own code holds the next step, say).
    std::string ends;
    for (const auto& [r, one] : seen)
      if (one.answered && one.waits.empty())
        ends += (ends.empty() ? "; it comes down to " : "; and ") + describe_worker(roles_, r) + ", which answers: " + one.activity;
    return ends;
  }
  for (const auto& [r, one] : seen)
    if (one.answered && !one.waits.empty())
      for (int w : one.waits)
        if (seen.count(w) && silent_rank(w)) {
          chain += "; " + one.activity;
          break;
        }
  return "; it comes down to " + silent +
         ", which does not answer (not inside a WeightBridge call: busy in its own code, stopped, or dead)" + chain;
}

FaultChannel::Heard FaultChannel::heard() {
  std::lock_guard lock(mutex_);
  take_notices_locked();
  Heard out{found_silent_, std::vector<bool>(gave_up_why_.size(), false), write_failed_, gave_up_why_};
  for (std::size_t r = 0; r < out.silent.size(); ++r) {
    // A rank found silent that announced giving up since was alive after all (it answers nothing now: it
    // left). One a write failed to sends no notice: it is gone.
    out.silent[r] = out.silent[r] && !gave_up_[r];
    out.own[r] = gave_up_[r] && gave_up_why_[r].starts_with(describe_worker(roles_, static_cast<int>(r)) + " ");
  }
  return out;
}

}  // namespace wb::coord

#include "coord/control.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "core/checks.hpp"

namespace wb::coord {

double normalize_timeout(double seconds) {
  if (std::isnan(seconds)) throw Error(ErrorCode::kInvalidArgument, "timeout_seconds is not a number");
  if (seconds <= 0 || seconds >= 1e9) return kNoDeadline;  // 0 = none; 1e9 s (31 years) is none too
  return seconds;
}

std::string seconds_text(double seconds) {
  if (std::isinf(seconds)) return "no deadline";
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

double local_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

const char* request_name(RequestKind kind) {
  switch (kind) {
    case RequestKind::kNone: return "none";
    case RequestKind::kConnect: return "connect";
    case RequestKind::kUpdate: return "update";
    case RequestKind::kShutdown: return "shutdown";
    case RequestKind::kAbort: return "abort";
  }
  return "unknown";
}

// --- operations ----------------------------------------------------------------------------------------

OperationPtr make_operation(std::size_t out_bytes, std::size_t in_bytes) {
  auto operation = std::make_shared<Operation>();
  operation->out.resize(out_bytes);
  operation->in.resize(in_bytes);
  return operation;
}

namespace {

// Operations given up on, kept until MPI completes them. Reached through a pointer that is never freed, so
// that an operation still pending at exit is neither destroyed under MPI nor reported as a leak.
struct Abandoned {
  std::mutex mutex;
  std::vector<OperationPtr> operations;
};
Abandoned& abandoned() {
  static Abandoned* registry = new Abandoned;
  return *registry;
}

}  // namespace

void abandon(OperationPtr operation) {
  if (!operation || operation->request == MPI_REQUEST_NULL) return;
  Abandoned& registry = abandoned();
  std::lock_guard lock(registry.mutex);
  // Those that completed since are released (a failed test keeps the operation: it is never freed early).
  std::erase_if(registry.operations, [](const OperationPtr& op) {
    int done = 0;
    return MPI_Test(&op->request, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS && done;
  });
  registry.operations.push_back(std::move(operation));
}

// --- waits ---------------------------------------------------------------------------------------------

Status wait_for(const OperationPtr& operation, const Waiter& waiter, bool interruptible, const std::string& what) {
  const double start = local_seconds();
  for (int polls = 0;; ++polls) {
    int done = 0;
    const int rc = MPI_Test(&operation->request, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      abandon(operation);
      return Status(ErrorCode::kMpi, what + ": MPI_Test failed: " + detail::mpi_error_string(rc));
    }
    if (done) return Status::ok();
    // Notices and queries are looked at every few dozen polls: often enough to answer within
    // milliseconds, rarely enough to cost nothing next to the spinning.
    if (waiter.service && polls % 32 == 0) {
      Status status = waiter.service(interruptible);
      if (!status) {
        abandon(operation);
        return status;
      }
    }
    const double waited = local_seconds() - start;
    if (waited > waiter.timeout) {
      abandon(operation);
      return Status(ErrorCode::kTimeout, what + " did not complete within " + seconds_text(waiter.timeout));
    }
    // Spin first (answers usually come within microseconds), then yield the core.
    if (polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(waited > 0.1 ? 500 : 50));
  }
}

// --- roles ---------------------------------------------------------------------------------------------

std::string describe_worker(const Roles& roles, int world_rank) {
  const auto r = static_cast<std::size_t>(world_rank);
  const std::string world = " (world rank " + std::to_string(world_rank) + ")";
  if (r >= roles.engine_of_rank.size()) return "world rank " + std::to_string(world_rank);
  const int engine = roles.engine_of_rank[r];
  const int rank = r < roles.group_rank_of.size() ? roles.group_rank_of[r] : 0;
  if (engine < 0) return "trainer " + std::to_string(rank) + world;
  return "engine " + std::to_string(engine) + " worker " + std::to_string(rank) + world;
}

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_dup(comm, &copy));
  WB_CHECK_MPI(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN));
  return copy;
}

Roles exchange_roles(MPI_Comm world, MPI_Comm group, bool trainer, double timeout) {
  Roles roles;
  WB_CHECK_MPI(MPI_Comm_rank(world, &roles.world_rank));
  WB_CHECK_MPI(MPI_Comm_size(world, &roles.world_size));
  roles.trainer = trainer;
  WB_CHECK_MPI(MPI_Comm_rank(group, &roles.group_rank));
  WB_CHECK_MPI(MPI_Comm_size(group, &roles.group_size));
  roles.leader = roles.group_rank == 0;
  const Waiter waiter{timeout, {}};
  // The group's leader names the group: its world rank, broadcast inside the group.
  int leader = roles.world_rank;
  {
    OperationPtr op = make_operation(sizeof leader);
    std::memcpy(op->out.data(), &leader, sizeof leader);
    WB_CHECK_MPI(MPI_Ibcast(op->out.data(), sizeof leader, MPI_BYTE, 0, group, &op->request));
    throw_if_error(wait_for(op, waiter, false, "constructing the adapter: the group's leader"));
    std::memcpy(&leader, op->out.data(), sizeof leader);
  }
  const int mine[3] = {trainer ? 1 : 0, leader, roles.group_rank};
  const std::size_t n = static_cast<std::size_t>(roles.world_size);
  std::vector<int> all(3 * n);
  {
    OperationPtr op = make_operation(sizeof mine, sizeof(int) * all.size());
    std::memcpy(op->out.data(), mine, sizeof mine);
    WB_CHECK_MPI(MPI_Iallgather(op->out.data(), 3, MPI_INT, op->in.data(), 3, MPI_INT, world, &op->request));
    throw_if_error(wait_for(op, waiter, false,
                            "constructing the adapter: every world rank's role (some rank did not construct its adapter)"));
    std::memcpy(all.data(), op->in.data(), op->in.size());
  }
  for (std::size_t r = 0; r < n; ++r) {
    const bool is_trainer = all[3 * r] != 0;
    const int its_leader = all[3 * r + 1];
    if (is_trainer) {
      if (roles.trainer_leader >= 0 && roles.trainer_leader != its_leader)
        throw Error(ErrorCode::kInvalidArgument, "world ranks " + std::to_string(roles.trainer_leader) + " and " +
                                                     std::to_string(its_leader) +
                                                     " both lead a trainer group: all trainers must share one trainer_comm");
      roles.trainer_leader = its_leader;
    } else if (std::find(roles.engine_leaders.begin(), roles.engine_leaders.end(), its_leader) == roles.engine_leaders.end()) {
      roles.engine_leaders.push_back(its_leader);
    }
  }
  if (roles.trainer_leader < 0) throw Error(ErrorCode::kInvalidArgument, "no SenderAdapter in the world communicator");
  if (roles.engine_leaders.empty()) throw Error(ErrorCode::kInvalidArgument, "no ReceiverAdapter in the world communicator");
  std::sort(roles.engine_leaders.begin(), roles.engine_leaders.end());
  roles.engine_of_rank.assign(n, -1);
  roles.group_rank_of.assign(n, 0);
  roles.engines.assign(roles.engine_leaders.size(), {});
  std::vector<std::pair<int, int>> trainers;  // (trainer rank, world rank)
  std::vector<std::vector<std::pair<int, int>>> engines(roles.engine_leaders.size());
  for (std::size_t r = 0; r < n; ++r) {
    roles.group_rank_of[r] = all[3 * r + 2];
    if (all[3 * r] != 0) {
      trainers.emplace_back(all[3 * r + 2], static_cast<int>(r));
      continue;
    }
    const auto e = static_cast<std::size_t>(
        std::lower_bound(roles.engine_leaders.begin(), roles.engine_leaders.end(), all[3 * r + 1]) - roles.engine_leaders.begin());
    roles.engine_of_rank[r] = static_cast<int>(e);
    engines[e].emplace_back(all[3 * r + 2], static_cast<int>(r));
  }
  std::sort(trainers.begin(), trainers.end());
  for (const auto& [rank, world_rank] : trainers) roles.trainers.push_back(world_rank);
  for (std::size_t e = 0; e < engines.size(); ++e) {
    std::sort(engines[e].begin(), engines[e].end());
    for (const auto& [rank, world_rank] : engines[e]) roles.engines[e].push_back(world_rank);
  }
  roles.engine = roles.engine_of_rank[static_cast<std::size_t>(roles.world_rank)];
  return roles;
}

double measure_clock_offset(MPI_Comm world, const Roles& roles, double timeout) {
  return measure_clock_offset(world, timeout, [&roles](int rank) { return describe_worker(roles, rank); });
}

double measure_clock_offset(MPI_Comm world, double timeout, const std::function<std::string(int)>& name) {
  constexpr int kPings = 4;
  const Waiter waiter{timeout, {}};
  int world_rank = 0, world_size = 0;
  WB_CHECK_MPI(MPI_Comm_rank(world, &world_rank));
  WB_CHECK_MPI(MPI_Comm_size(world, &world_size));
  if (world_rank == 0) {
    // Rank 0 answers every rank in turn: each ping gets rank 0's time back.
    for (int r = 1; r < world_size; ++r)
      for (int k = 0; k < kPings; ++k) {
        OperationPtr ping = make_operation(0, 1);
        WB_CHECK_MPI(MPI_Irecv(ping->in.data(), 1, MPI_BYTE, r, kClockTag, world, &ping->request));
        throw_if_error(wait_for(ping, waiter, false, "measuring the job clock: clock ping from " + name(r)));
        OperationPtr reply = make_operation(sizeof(double));
        const double now = local_seconds();
        std::memcpy(reply->out.data(), &now, sizeof now);
        WB_CHECK_MPI(MPI_Isend(reply->out.data(), 1, MPI_DOUBLE, r, kClockTag, world, &reply->request));
        throw_if_error(wait_for(reply, waiter, false, "measuring the job clock: clock reply to " + name(r)));
      }
    return 0;
  }
  double best_round_trip = 1e30, offset = 0;
  for (int k = 0; k < kPings; ++k) {
    OperationPtr reply = make_operation(0, sizeof(double)), ping = make_operation(1);
    const double sent = local_seconds();
    WB_CHECK_MPI(MPI_Irecv(reply->in.data(), 1, MPI_DOUBLE, 0, kClockTag, world, &reply->request));
    WB_CHECK_MPI(MPI_Isend(ping->out.data(), 1, MPI_BYTE, 0, kClockTag, world, &ping->request));
    throw_if_error(wait_for(ping, waiter, false, "measuring the job clock: clock ping to " + name(0)));
    throw_if_error(wait_for(reply, waiter, false, "measuring the job clock: clock reply from " + name(0)));
    const double received = local_seconds();
    double theirs = 0;
    std::memcpy(&theirs, reply->in.data(), sizeof theirs);
    if (received - sent < best_round_trip) {
      best_round_trip = received - sent;
      offset = theirs - (sent + received) / 2;
    }
  }
  return offset;
}

// --- status codec --------------------------------------------------------------------------------------

std::vector<std::byte> encode_status(const Status& status, std::int64_t a, std::int64_t b, const std::vector<int>& ranks) {
  const std::int64_t head[4] = {static_cast<std::int64_t>(status.code()), a, b, static_cast<std::int64_t>(ranks.size())};
  std::vector<std::byte> bytes(sizeof head + ranks.size() * sizeof(int) + status.message().size());
  std::memcpy(bytes.data(), head, sizeof head);
  if (!ranks.empty()) std::memcpy(bytes.data() + sizeof head, ranks.data(), ranks.size() * sizeof(int));
  std::memcpy(bytes.data() + sizeof head + ranks.size() * sizeof(int), status.message().data(), status.message().size());
  return bytes;
}

Status decode_status(std::span<const std::byte> bytes, std::int64_t* a, std::int64_t* b, std::vector<int>* ranks) {
  std::int64_t head[4] = {static_cast<std::int64_t>(ErrorCode::kInternal), 0, 0, 0};
  if (bytes.size() < sizeof head) return Status(ErrorCode::kCorruptData, "a control message of " + std::to_string(bytes.size()) + " bytes");
  std::memcpy(head, bytes.data(), sizeof head);
  if (head[3] < 0 || static_cast<std::size_t>(head[3]) > (bytes.size() - sizeof head) / sizeof(int))
    return Status(ErrorCode::kCorruptData, "a control message with " + std::to_string(head[3]) + " ranks in " +
                                               std::to_string(bytes.size()) + " bytes");
  if (a != nullptr) *a = head[1];
  if (b != nullptr) *b = head[2];
  const std::size_t listed = static_cast<std::size_t>(head[3]) * sizeof(int);
  if (ranks != nullptr) {
    ranks->resize(static_cast<std::size_t>(head[3]));
    if (listed > 0) std::memcpy(ranks->data(), bytes.data() + sizeof head, listed);
  }
  std::string message(reinterpret_cast<const char*>(bytes.data()) + sizeof head + listed, bytes.size() - sizeof head - listed);
  if (head[0] < 0 || head[0] > static_cast<std::int64_t>(ErrorCode::kInternal))
    return Status(ErrorCode::kCorruptData, "a control message with error code " + std::to_string(head[0]));
  if (head[0] == 0) return Status(ErrorCode::kOk, std::move(message));
  return Status(static_cast<ErrorCode>(head[0]), std::move(message));
}

namespace {

// Receives one message already matched by MPI_Improbe (whole, whatever its length).
Status receive_matched(MPI_Message& message, const MPI_Status& probe, std::vector<std::byte>& bytes) {
  int count = 0;
  WB_TRY_MPI(MPI_Get_count(&probe, MPI_BYTE, &count));
  bytes.resize(static_cast<std::size_t>(std::max(count, 0)));
  WB_TRY_MPI(MPI_Mrecv(bytes.data(), count, MPI_BYTE, &message, MPI_STATUS_IGNORE));
  return Status::ok();
}

OperationPtr send_bytes(std::vector<std::byte> bytes, int peer, int tag, MPI_Comm comm) {
  OperationPtr op = make_operation();
  op->out = std::move(bytes);
  // Notices and answers are best effort: a peer that cannot be reached is one that failed already.
  if (MPI_Isend(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, peer, tag, comm, &op->request) != MPI_SUCCESS)
    op->request = MPI_REQUEST_NULL;
  return op;
}

}  // namespace

// --- fault channel -------------------------------------------------------------------------------------

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
  const std::vector<std::byte> bytes =
      encode_status(status, roles_.trainer ? -1 : roles_.engine, static_cast<std::int64_t>(std::min<std::uint64_t>(next_step, INT64_MAX)));
  for (int peer : neighbours_) sends_.push_back(send_bytes(bytes, peer, kNoticeTag, world_));
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
    Status status = decode_status(bytes, &group, &gave_up_at);
    if (status.is_ok()) status = Status(ErrorCode::kInternal, describe_worker(roles_, probe.MPI_SOURCE) + " gave up without a reason");
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
    (void)decode_status(bytes, &serial);
    std::string what = activity_;
    std::vector<int> waits = activity_waits_;
    if (probe != nullptr && *probe) {
      auto [text, ranks] = (*probe)();
      what += ": waiting for " + text;
      waits = std::move(ranks);
    } else if (transfer_wait_at_ >= 0 && local_seconds() - transfer_wait_at_ < 0.05) {
      // This thread is in a group step; the transfer thread was waiting a moment ago.
      what += "; its transfer waits for " + transfer_wait_.first;
      for (int r : transfer_wait_.second)
        if (std::find(waits.begin(), waits.end(), r) == waits.end()) waits.push_back(r);
    }
    sends_.push_back(send_bytes(encode_status(Status(ErrorCode::kOk, what), serial, static_cast<std::int64_t>(activity_step_), waits),
                                status.MPI_SOURCE, kAnswerTag, world_));
  }
}

Status FaultChannel::poll(const WaitProbe* probe, bool answer) {
  Status relay;
  {
    std::lock_guard lock(mutex_);
    take_notices_locked();
    if (answer) answer_queries_locked(probe);
    std::erase_if(sends_, [](OperationPtr& op) {
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
  transfer_wait_at_ = local_seconds();
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
  const double deadline = local_seconds() + seconds;
  // Breadth first, a few hops: each hop asks the ranks the previous answers named.
  for (int hop = 0; hop < 4 && !frontier.empty() && local_seconds() < deadline; ++hop) {
    std::uint64_t serial = 0;
    {
      std::lock_guard lock(mutex_);
      serial = ++query_serial_;
      for (int r : frontier)
        sends_.push_back(send_bytes(encode_status(Status::ok(), static_cast<std::int64_t>(serial)), r, kQueryTag, world_));
    }
    std::size_t pending = frontier.size();
    while (pending > 0 && local_seconds() < deadline) {
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
            const Status activity = decode_status(bytes, &their_serial, &their_step, &waits);
            const auto it = seen.find(status.MPI_SOURCE);
            if (their_serial == static_cast<std::int64_t>(serial) && it != seen.end() && !it->second.answered) {
              it->second = {true, activity.message(), std::move(waits)};
              --pending;
            }
          }
        }
      }
      if (!any) std::this_thread::sleep_for(std::chrono::microseconds(200));
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

// --- group steps ---------------------------------------------------------------------------------------

Group::Group(MPI_Comm comm, const Roles& roles, std::string name, bool own_group)
    : comm_(comm), roles_(roles), name_(std::move(name)), own_group_(own_group) {
  WB_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
  WB_CHECK_MPI(MPI_Comm_size(comm, &size_));
}

namespace {
// A step's record, reduced with MPI_MAX: the step's number both ways (ranks at different steps show as a
// spread), the lowest failing rank (as size - rank), the latest and the earliest entry time, the values.
constexpr int kSeq = 0, kNegSeq = 1, kFailure = 2, kLatest = 3, kNegEarliest = 4, kHeader = 5;
constexpr int kRecord = kHeader + Group::kValues;
}  // namespace

Status Group::step(const Status& mine, const Waiter& waiter, FaultChannel& faults, const std::string& what, bool commit,
                   bool* completed) {
  std::int64_t values[kValues] = {};
  return step(mine, std::span<std::int64_t, kValues>(values), waiter, faults, what, commit, completed);
}

Status Group::step(const Status& mine, std::span<std::int64_t, kValues> values, const Waiter& waiter, FaultChannel& faults,
                   const std::string& what, bool commit, bool* completed) {
  if (completed != nullptr) *completed = false;
  const std::uint64_t seq = next_++;
  {
    std::vector<int> others;  // a world step (connect) waits on everyone: not traced
    if (own_group_)
      for (int r : roles_.group())
        if (r != roles_.world_rank) others.push_back(r);
    faults.set_activity(seq, what + " (step " + std::to_string(seq) + " of " + name_ + ")", std::move(others));
  }
  const auto entered = static_cast<std::int64_t>((local_seconds() + clock_offset_) * 1e6);
  std::int64_t record[kRecord] = {};
  record[kSeq] = static_cast<std::int64_t>(seq);
  record[kNegSeq] = -static_cast<std::int64_t>(seq);
  // The lowest failing rank's message wins, but a cause (any error) before a consequence (a timeout).
  const std::int64_t priority = mine.code() == ErrorCode::kTimeout ? 1 : 2;
  record[kFailure] = mine ? 0 : priority * (size_ + 1) + (size_ - rank_);
  record[kLatest] = entered;
  record[kNegEarliest] = -entered;
  std::copy(values.begin(), values.end(), record + kHeader);
  OperationPtr op = make_operation(sizeof record, sizeof record);
  std::memcpy(op->out.data(), record, sizeof record);
  const int rc = MPI_Iallreduce(op->out.data(), op->in.data(), kRecord, MPI_INT64_T, MPI_MAX, comm_, &op->request);
  if (rc != MPI_SUCCESS) return make_call_error(ErrorCode::kMpi, "MPI_Iallreduce", what + ": " + detail::mpi_error_string(rc), __FILE__, __LINE__);
  // This rank's part is given, so it waits for the outcome every other rank sees: only a rank of the group
  // that gave up before completing this step ends the wait early (the step can never complete then).
  Waiter patient = waiter;
  bool voided = false;
  patient.service = [&](bool) {
    if (waiter.service) (void)waiter.service(false);
    if (!own_group_ || !faults.voids(seq)) return Status::ok();
    voided = true;
    const Status cause = faults.poll();
    return Status(cause.code(), what + ": another rank of " + name_ + " gave up before this step: " + cause.message());
  };
  Status status = wait_for(op, patient, true, what);
  if (!status) {
    if (status.code() == ErrorCode::kTimeout && own_group_ && !voided) {
      std::vector<int> others;
      for (int r : roles_.group())
        if (r != roles_.world_rank) others.push_back(r);
      status = Status(ErrorCode::kTimeout, status.message() + faults.trace(others, std::min(1.0, 0.5 * waiter.timeout)));
    }
    return status;
  }
  completed_ = seq + 1;
  std::int64_t out[kRecord];
  std::memcpy(out, op->in.data(), sizeof out);
  std::copy(out + kHeader, out + kRecord, values.begin());
  if (out[kSeq] != -out[kNegSeq])
    return Status(ErrorCode::kInternal, what + ": the ranks of " + name_ + " are at different steps (" +
                                            std::to_string(-out[kNegSeq]) + " to " + std::to_string(out[kSeq]) +
                                            "): one of them left a call the others are still in");
  // Every rank takes part in passing a failure on, whatever else it knows.
  if (out[kFailure] > 0) {
    Status failure = broadcast_failure(size_ - static_cast<int>(out[kFailure] % (size_ + 1)), mine, waiter, what);
    if (completed != nullptr) *completed = true;
    return failure;
  }
  const double spread = static_cast<double>(out[kLatest] + out[kNegEarliest]) / 1e6;
  // A rank of the group that gave up on this step (it timed out; this rank, late, completed it since) voids
  // it. Its notice left before this rank even entered the step; when the entries were far apart, this rank
  // gives the notice a few milliseconds of progress to show.
  if (own_group_ && spread > 0.5 * waiter.timeout)
    for (const double until = local_seconds() + 0.02; local_seconds() < until && !faults.voids(seq);)
      std::this_thread::sleep_for(std::chrono::microseconds(500));
  if (own_group_ && faults.voids(seq)) {
    Status cause = faults.poll();
    return Status(cause.code(), what + ": another rank of " + name_ + " gave up on this step: " + cause.message());
  }
  // Completion reaches every rank within a quarter of the timeout of the last entry, so a spread below
  // three quarters means no rank timed out; above, every rank that completes voids the step.
  if (commit && spread > 0.75 * waiter.timeout)
    return Status(ErrorCode::kTimeout, what + ": the ranks of " + name_ + " entered this step " + seconds_text(spread) +
                                           " apart, too close to the timeout (" + seconds_text(waiter.timeout) +
                                           ") for all of them to have seen it complete; it is void on every rank");
  if (completed != nullptr) *completed = true;
  return Status::ok();
}

Status Group::broadcast_failure(int root, const Status& mine, const Waiter& waiter, const std::string& what) {
  // The failing rank's message, whole: its length first, then its bytes.
  std::vector<std::byte> bytes = rank_ == root ? encode_status(mine) : std::vector<std::byte>{};
  std::int64_t length = static_cast<std::int64_t>(bytes.size());
  {
    OperationPtr op = make_operation(sizeof length);
    std::memcpy(op->out.data(), &length, sizeof length);
    WB_TRY_MPI(MPI_Ibcast(op->out.data(), sizeof length, MPI_BYTE, root, comm_, &op->request));
    WB_RETURN_IF_ERROR(wait_for(op, waiter, false, what + " (the failing rank's message)"));
    std::memcpy(&length, op->out.data(), sizeof length);
  }
  if (length < 0 || length > (1 << 30)) return Status(ErrorCode::kCorruptData, what + ": a failure message of " + std::to_string(length) + " bytes");
  OperationPtr op = make_operation(static_cast<std::size_t>(length));
  if (rank_ == root) op->out = std::move(bytes);
  WB_TRY_MPI(MPI_Ibcast(op->out.data(), static_cast<int>(length), MPI_BYTE, root, comm_, &op->request));
  WB_RETURN_IF_ERROR(wait_for(op, waiter, false, what + " (the failing rank's message)"));
  Status status = decode_status(op->out);
  if (status.is_ok()) return Status(ErrorCode::kInternal, what + ": a rank failed without a reason");
  return status;
}

}  // namespace wb::coord

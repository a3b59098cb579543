#include "comm/group.hpp"

#include <algorithm>
#include <cstring>

#include "comm/backoff.hpp"
#include "comm/status_message.hpp"
#include "core/checks.hpp"

namespace wb::comm {

Group::Group(MPI_Comm comm, std::string name, StepWatch* watch, std::vector<int> members, int self)
    : comm_(comm), name_(std::move(name)), watch_(watch), members_(std::move(members)), self_(self) {
  WB_CHECK_MPI(MPI_Comm_rank(comm, &rank_));
  WB_CHECK_MPI(MPI_Comm_size(comm, &size_));
  if (!members_.empty() && members_.size() != static_cast<std::size_t>(size_))
    throw Error(ErrorCode::kInvalidArgument, name_ + ": " + std::to_string(members_.size()) + " members named for a communicator of " +
                                                 std::to_string(size_) + " ranks");
}

std::vector<int> Group::others() const {
  std::vector<int> out;
  for (int m : members_)
    if (m != self_) out.push_back(m);
  return out;
}

namespace {
// A step's record, reduced with MPI_MAX: the step's number both ways (ranks at different steps show as a
// spread), the lowest failing rank (as size - rank), the latest and the earliest entry time, the values.
constexpr int kSeq = 0, kNegSeq = 1, kFailure = 2, kLatest = 3, kNegEarliest = 4, kHeaderSlots = 5;
constexpr int kRecord = kHeaderSlots + Group::kValues;
}  // namespace

Status Group::step(const Status& mine, const Waiter& waiter, const std::string& what, bool commit, bool* completed) {
  std::int64_t values[kValues] = {};
  return step(mine, std::span<std::int64_t, kValues>(values), waiter, what, commit, completed);
}

Status Group::step(const Status& mine, std::span<std::int64_t, kValues> values, const Waiter& waiter, const std::string& what,
                   bool commit, bool* completed) {
  if (completed != nullptr) *completed = false;
  const std::uint64_t seq = next_++;
  // A step without members (the job's, at connect) waits on everyone: not traced.
  const bool voidable = watch_ != nullptr && !members_.empty();
  if (watch_ != nullptr) watch_->entering(seq, what + " (step " + std::to_string(seq) + " of " + name_ + ")", others());
  const auto entered = static_cast<std::int64_t>((local_seconds() + clock_offset_) * 1e6);
  std::int64_t record[kRecord] = {};
  record[kSeq] = static_cast<std::int64_t>(seq);
  record[kNegSeq] = -static_cast<std::int64_t>(seq);
  // The lowest failing rank's message wins, but a cause (any error) before a consequence (a timeout).
  const std::int64_t priority = mine.code() == ErrorCode::kTimeout ? 1 : 2;
  record[kFailure] = mine ? 0 : priority * (size_ + 1) + (size_ - rank_);
  record[kLatest] = entered;
  record[kNegEarliest] = -entered;
  std::copy(values.begin(), values.end(), record + kHeaderSlots);
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
    if (!voidable || !watch_->voids(seq)) return Status::ok();
    voided = true;
    const Status cause = watch_->announced();
    return Status(cause.code(), what + ": another rank of " + name_ + " gave up before this step: " + cause.message());
  };
  Status status = wait_for(op, patient, true, what);
  if (!status) {
    if (status.code() == ErrorCode::kTimeout && voidable && !voided)
      status = Status(ErrorCode::kTimeout, status.message() + watch_->trace(others(), std::min(1.0, 0.5 * waiter.timeout)));
    return status;
  }
  completed_ = seq + 1;
  std::int64_t out[kRecord];
  std::memcpy(out, op->in.data(), sizeof out);
  std::copy(out + kHeaderSlots, out + kRecord, values.begin());
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
  if (voidable && spread > 0.5 * waiter.timeout) {
    Backoff backoff;
    for (const double until = local_seconds() + 0.02; local_seconds() < until && !watch_->voids(seq);) backoff.pause();
  }
  if (voidable && watch_->voids(seq)) {
    Status cause = watch_->announced();
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

}  // namespace wb::comm

#include "comm/collectives.hpp"

#include <climits>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

#include "comm/status_message.hpp"
#include "core/checks.hpp"

namespace wb::comm {
namespace {

// Sizes travel as int64: a negative one, -(n + 1), says that n bytes of an encoded failure follow instead
// of the payload.
std::int64_t failure_size(std::size_t encoded_bytes) { return -static_cast<std::int64_t>(encoded_bytes) - 1; }
std::size_t bytes_of(std::int64_t size) { return static_cast<std::size_t>(size < 0 ? -(size + 1) : size); }

struct Shape {
  int rank = 0, size = 1;
};
Shape shape_of(MPI_Comm comm, const std::string& what) {
  int inter = 0;
  WB_CHECK_MPI(MPI_Comm_test_inter(comm, &inter));
  if (inter)
    throw Error(ErrorCode::kUnsupported, what + ": a collective over an intercommunicator; merge it first (MPI_Intercomm_merge)");
  Shape s;
  WB_CHECK_MPI(MPI_Comm_rank(comm, &s.rank));
  WB_CHECK_MPI(MPI_Comm_size(comm, &s.size));
  return s;
}

[[noreturn]] void throw_delivered(std::span<const std::byte> encoded, const std::string& what) {
  Status status = decode_status(encoded);
  if (status.is_ok()) status = Status(ErrorCode::kInternal, what + ": a rank failed without a reason");
  throw Error(status);
}

// The MPI count of `bytes`, or the failure to send in its place.
Status count_fits(std::size_t bytes, const std::string& what) {
  if (bytes <= static_cast<std::size_t>(INT_MAX)) return Status::ok();
  return Status(ErrorCode::kUnsupported, what + ": " + std::to_string(bytes) + " bytes, more than an MPI count");
}

// The counts and displacements of a v-collective, kept with its operation (MPI reads them until it ends).
struct Layout {
  std::vector<int> counts, displacements;
};

}  // namespace

MPI_Comm duplicate(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_dup(comm, &copy));
  WB_CHECK_MPI(MPI_Comm_set_errhandler(copy, MPI_ERRORS_RETURN));
  return copy;
}

MPI_Comm duplicate(MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  // MPI writes the new communicator when the operation completes, so it lives with the operation.
  OperationPtr op = make_operation();
  auto copy = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  op->also = copy;
  WB_CHECK_MPI(MPI_Comm_idup(comm, copy.get(), &op->request));
  wait_or_throw(op, waiter, what);
  WB_CHECK_MPI(MPI_Comm_set_errhandler(*copy, MPI_ERRORS_RETURN));
  return *copy;
}

std::vector<std::byte> broadcast(std::vector<std::byte> bytes, int root, MPI_Comm comm, const Waiter& waiter,
                                 const std::string& what, const Status& root_failure) {
  const Shape s = shape_of(comm, what);
  Status failure = root_failure;
  if (s.rank == root && failure.is_ok()) failure = count_fits(bytes.size(), what);
  if (s.rank == root && !failure.is_ok()) bytes = encode_status(failure);
  std::int64_t size = s.rank != root ? 0 : failure.is_ok() ? static_cast<std::int64_t>(bytes.size()) : failure_size(bytes.size());
  {
    OperationPtr op = make_operation(sizeof size);
    std::memcpy(op->out.data(), &size, sizeof size);
    WB_CHECK_MPI(MPI_Ibcast(op->out.data(), 1, MPI_INT64_T, root, comm, &op->request));
    wait_or_throw(op, waiter, what + " (its size)");
    std::memcpy(&size, op->out.data(), sizeof size);
  }
  OperationPtr op = make_operation(bytes_of(size));
  if (s.rank == root) op->out = std::move(bytes);
  if (!op->out.empty()) {
    WB_CHECK_MPI(MPI_Ibcast(op->out.data(), static_cast<int>(op->out.size()), MPI_BYTE, root, comm, &op->request));
    wait_or_throw(op, waiter, what);
  }
  if (size < 0) throw_delivered(op->out, what);
  return std::move(op->out);
}

std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine, MPI_Comm comm, const Waiter& waiter,
                                              const std::string& what, const Status& my_failure) {
  const Shape s = shape_of(comm, what);
  Status failure = my_failure.is_ok() ? count_fits(mine.size(), what) : my_failure;
  std::vector<std::byte> sent;
  std::span<const std::byte> payload = mine;
  if (!failure.is_ok()) {
    sent = encode_status(failure);
    payload = sent;
  }
  const std::int64_t size = failure.is_ok() ? static_cast<std::int64_t>(payload.size()) : failure_size(payload.size());
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(s.size));
  {
    OperationPtr op = make_operation(sizeof size, sizeof(std::int64_t) * sizes.size());
    std::memcpy(op->out.data(), &size, sizeof size);
    WB_CHECK_MPI(MPI_Iallgather(op->out.data(), 1, MPI_INT64_T, op->in.data(), 1, MPI_INT64_T, comm, &op->request));
    wait_or_throw(op, waiter, what + " (their sizes)");
    std::memcpy(sizes.data(), op->in.data(), op->in.size());
  }
  auto layout = std::make_shared<Layout>();
  layout->counts.resize(sizes.size());
  layout->displacements.resize(sizes.size());
  long long total = 0;
  for (std::size_t r = 0; r < sizes.size(); ++r) {
    layout->displacements[r] = static_cast<int>(std::min<long long>(total, INT_MAX));
    layout->counts[r] = static_cast<int>(std::min<std::size_t>(bytes_of(sizes[r]), INT_MAX));
    total += static_cast<long long>(bytes_of(sizes[r]));
  }
  // Every rank sees the same sizes, so every rank refuses alike, and skips the bytes alike when there are none.
  if (total > INT_MAX)
    throw Error(ErrorCode::kUnsupported, what + ": all ranks' together take " + std::to_string(total) +
                                             " bytes, more than one MPI_Iallgatherv carries");
  if (total == 0) return std::vector<std::vector<std::byte>>(sizes.size());
  OperationPtr op = make_operation(payload.size(), static_cast<std::size_t>(total));
  if (!payload.empty()) std::memcpy(op->out.data(), payload.data(), payload.size());
  op->also = layout;
  WB_CHECK_MPI(MPI_Iallgatherv(op->out.data(), static_cast<int>(payload.size()), MPI_BYTE, op->in.data(),
                               layout->counts.data(), layout->displacements.data(), MPI_BYTE, comm, &op->request));
  wait_or_throw(op, waiter, what);
  const auto piece = [&](std::size_t r) {
    return std::span<const std::byte>(op->in).subspan(static_cast<std::size_t>(layout->displacements[r]),
                                                      static_cast<std::size_t>(layout->counts[r]));
  };
  for (std::size_t r = 0; r < sizes.size(); ++r)
    if (sizes[r] < 0) throw_delivered(piece(r), what);
  std::vector<std::vector<std::byte>> all(sizes.size());
  for (std::size_t r = 0; r < sizes.size(); ++r) all[r].assign(piece(r).begin(), piece(r).end());
  return all;
}

void agree(const Status& mine, MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  (void)allgather({}, comm, waiter, what, mine);
}

std::vector<std::byte> scatter(const std::vector<std::vector<std::byte>>& per_rank, int root, MPI_Comm comm,
                               const Waiter& waiter, const std::string& what, const Status& root_failure) {
  const Shape s = shape_of(comm, what);
  if (root < 0 || root >= s.size)  // every rank sees the same root, so every rank throws: no hang
    throw Error(ErrorCode::kInvalidArgument, what + ": root " + std::to_string(root) + " is not a rank of a communicator of " +
                                                 std::to_string(s.size));
  // The root checks its input first; what it finds wrong goes to every rank in place of the schedules.
  auto layout = std::make_shared<Layout>();
  std::vector<std::int64_t> sizes;
  std::vector<std::byte> all;
  Status failure = root_failure;
  if (s.rank == root) {
    if (failure.is_ok() && per_rank.size() != static_cast<std::size_t>(s.size))
      failure = Status(ErrorCode::kInvalidArgument, what + ": " + std::to_string(per_rank.size()) +
                                                        " parts given for a communicator of " + std::to_string(s.size) + " ranks");
    long long total = 0;
    for (std::size_t r = 0; r < per_rank.size() && failure.is_ok(); ++r) {
      const std::size_t bytes = per_rank[r].size();
      if (bytes > static_cast<std::size_t>(INT_MAX))
        failure = Status(ErrorCode::kUnsupported, what + ": the part of rank " + std::to_string(r) + " takes " +
                                                      std::to_string(bytes) + " bytes, more than an MPI count");
      else if ((total += static_cast<long long>(bytes)) > INT_MAX)
        failure = Status(ErrorCode::kUnsupported, what + ": the parts of ranks 0 to " + std::to_string(r) + " take " +
                                                      std::to_string(total) + " bytes, more than one MPI_Scatterv addresses (rank " +
                                                      std::to_string(r) + "'s takes " + std::to_string(bytes) + ")");
    }
    sizes.resize(static_cast<std::size_t>(s.size));
    layout->counts.resize(sizes.size());
    layout->displacements.assign(sizes.size(), 0);
    if (failure.is_ok()) {
      for (std::size_t r = 0; r < sizes.size(); ++r) {
        sizes[r] = static_cast<std::int64_t>(per_rank[r].size());
        layout->counts[r] = static_cast<int>(per_rank[r].size());
        layout->displacements[r] = static_cast<int>(all.size());
        all.insert(all.end(), per_rank[r].begin(), per_rank[r].end());
      }
    } else {
      // Every rank gets the same encoded failure: the send regions of a scatterv may overlap.
      all = encode_status(failure);
      sizes.assign(sizes.size(), failure_size(all.size()));
      layout->counts.assign(sizes.size(), static_cast<int>(all.size()));
    }
  }
  std::int64_t size = 0;
  {
    OperationPtr op = make_operation(sizeof(std::int64_t) * sizes.size(), sizeof size);
    if (!sizes.empty()) std::memcpy(op->out.data(), sizes.data(), op->out.size());
    WB_CHECK_MPI(MPI_Iscatter(op->out.data(), 1, MPI_INT64_T, op->in.data(), 1, MPI_INT64_T, root, comm, &op->request));
    wait_or_throw(op, waiter, what + " (their sizes)");
    std::memcpy(&size, op->in.data(), sizeof size);
  }
  OperationPtr op = make_operation(0, bytes_of(size));
  op->out = std::move(all);
  op->also = layout;
  WB_CHECK_MPI(MPI_Iscatterv(op->out.data(), layout->counts.data(), layout->displacements.data(), MPI_BYTE, op->in.data(),
                             static_cast<int>(op->in.size()), MPI_BYTE, root, comm, &op->request));
  wait_or_throw(op, waiter, what);
  if (size < 0) throw_delivered(op->in, what);
  return std::move(op->in);
}

void broadcast_fixed(std::span<std::byte> bytes, int root, MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  (void)shape_of(comm, what);
  throw_if_error(count_fits(bytes.size(), what));
  OperationPtr op = make_operation(bytes.size());
  if (!bytes.empty()) std::memcpy(op->out.data(), bytes.data(), bytes.size());
  WB_CHECK_MPI(MPI_Ibcast(op->out.data(), static_cast<int>(bytes.size()), MPI_BYTE, root, comm, &op->request));
  wait_or_throw(op, waiter, what);
  if (!bytes.empty()) std::memcpy(bytes.data(), op->out.data(), bytes.size());
}

std::vector<std::byte> allgather_fixed(std::span<const std::byte> mine, MPI_Comm comm, const Waiter& waiter,
                                       const std::string& what) {
  const Shape s = shape_of(comm, what);
  throw_if_error(count_fits(mine.size() * static_cast<std::size_t>(s.size), what));
  OperationPtr op = make_operation(mine.size(), mine.size() * static_cast<std::size_t>(s.size));
  if (!mine.empty()) std::memcpy(op->out.data(), mine.data(), mine.size());
  const int count = static_cast<int>(mine.size());
  WB_CHECK_MPI(MPI_Iallgather(op->out.data(), count, MPI_BYTE, op->in.data(), count, MPI_BYTE, comm, &op->request));
  wait_or_throw(op, waiter, what);
  return std::move(op->in);
}

void barrier(MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  OperationPtr op = make_operation();
  WB_CHECK_MPI(MPI_Ibarrier(comm, &op->request));
  wait_or_throw(op, waiter, what);
}

Status barrier_or_failure(MPI_Comm comm, const Waiter& waiter, const std::string& what) {
  OperationPtr op = make_operation();
  WB_TRY_MPI(MPI_Ibarrier(comm, &op->request));
  return wait_for(op, waiter, true, what);
}

bool barrier_within(MPI_Comm comm, double seconds) noexcept {
  MPI_Request request = MPI_REQUEST_NULL;
  if (MPI_Ibarrier(comm, &request) != MPI_SUCCESS) return false;
  return complete_within(std::span<MPI_Request>(&request, 1), seconds);
}

std::vector<std::byte> swap(int peer, std::span<const std::byte> mine, int tag, MPI_Comm comm, const Waiter& waiter,
                            const std::string& what) {
  throw_if_error(count_fits(mine.size(), what));
  std::uint64_t size = mine.size();
  OperationPtr send_size = make_operation(sizeof size), receive_size = make_operation(0, sizeof size);
  std::memcpy(send_size->out.data(), &size, sizeof size);
  WB_CHECK_MPI(MPI_Irecv(receive_size->in.data(), 1, MPI_UINT64_T, peer, tag, comm, &receive_size->request));
  WB_CHECK_MPI(MPI_Isend(send_size->out.data(), 1, MPI_UINT64_T, peer, tag, comm, &send_size->request));
  wait_or_throw(receive_size, waiter, what + " (its size)");
  wait_or_throw(send_size, waiter, what + " (its size)");
  std::memcpy(&size, receive_size->in.data(), sizeof size);
  throw_if_error(count_fits(size, what));
  OperationPtr send = make_operation(mine.size()), receive = make_operation(0, static_cast<std::size_t>(size));
  if (!mine.empty()) std::memcpy(send->out.data(), mine.data(), mine.size());
  WB_CHECK_MPI(MPI_Irecv(receive->in.data(), static_cast<int>(size), MPI_BYTE, peer, tag, comm, &receive->request));
  WB_CHECK_MPI(MPI_Isend(send->out.data(), static_cast<int>(mine.size()), MPI_BYTE, peer, tag, comm, &send->request));
  wait_or_throw(receive, waiter, what);
  wait_or_throw(send, waiter, what);
  return std::move(receive->in);
}

}  // namespace wb::comm

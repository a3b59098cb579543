// The collectives of connect, with deadlines and one error behaviour: the source maps' all-gather, the
// round schedules' scatter, broadcasts, barriers, and the exchange of a record with one peer. Every MPI
// collective of the library is called here (tests/unit/test_include_direction.cpp, CommRoom.*, reads the tree for it).
//
// One error behaviour: a rank that cannot give its part (a probe that failed, a plan that failed on the
// root, a payload past an MPI count) still takes part, with its failure in place of its bytes, and every
// rank throws that failure (the lowest failing rank's, its message whole) as soon as the collective
// completes; nobody waits for a deadline because one rank failed. A rank that does not take part at all
// makes the others throw kTimeout at the waiter's deadline, naming what did not complete. All of them are
// set-up calls: they throw wb::Error.
//
// Over intracommunicators (an engine that joined as a job of its own is merged into one first,
// MPI_Intercomm_merge); the operations of comm/operation.hpp take any communicator.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "comm/operation.hpp"

namespace wb::comm {

/// How one call over the control plane waits and speaks: its waiter (deadline, service), the words its
/// messages start with ("connect: "), and how a rank of its communicator is named ("rank N" when empty).
/// The exchanges of the library's forms (source maps, round schedules) take one, so that connect and the
/// tools and tests that call them blocking (Call{} waits with the timeout_seconds setting) go the same road.
struct Call {
  Waiter waiter = Waiter::from_settings();
  std::string context;
  std::function<std::string(int rank)> name_rank;
  std::string rank_name(int rank) const { return name_rank ? name_rank(rank) : "rank " + std::to_string(rank); }
};

/// MPI_Comm_dup with MPI_ERRORS_RETURN on the duplicate, so that in a job whose error handler is
/// MPI_ERRORS_ARE_FATAL a failing call still reaches the library's checks (a Status naming the call)
/// instead of aborting the job.
MPI_Comm duplicate(MPI_Comm comm);
/// The same under `waiter`'s deadline (MPI_Comm_idup): a rank of `comm` that never takes part (it passed
/// another communicator, or constructs no adapter) makes the others throw kTimeout naming `what`.
MPI_Comm duplicate(MPI_Comm comm, const Waiter& waiter, const std::string& what);

/// Root's `bytes` on every rank (the others pass anything; it is replaced). A root that passes a failure
/// makes every rank throw it.
std::vector<std::byte> broadcast(std::vector<std::byte> bytes, int root, MPI_Comm comm, const Waiter& waiter,
                                 const std::string& what, const Status& root_failure = Status::ok());

/// Every rank's bytes on every rank, in rank order (an MPI_Iallgather of the sizes, an MPI_Iallgatherv of
/// the bytes). A rank that passes a failure makes every rank throw the lowest failing rank's.
std::vector<std::vector<std::byte>> allgather(std::span<const std::byte> mine, MPI_Comm comm, const Waiter& waiter,
                                              const std::string& what, const Status& my_failure = Status::ok());

/// Every rank's status: returns when all are ok; otherwise every rank throws the lowest failing rank's
/// (one all-gather of the sizes when all are ok). What a collective step of a set-up path agrees on.
void agree(const Status& mine, MPI_Comm comm, const Waiter& waiter, const std::string& what);

/// `per_rank[r]` from root to rank r (an MPI_Iscatter of the sizes, an MPI_Iscatterv of the bytes); the
/// others pass an empty vector. A root whose input does not fit (not one entry per rank: kInvalidArgument;
/// an entry or all together past an MPI count: kUnsupported) or that passes a failure makes every rank
/// throw it.
std::vector<std::byte> scatter(const std::vector<std::vector<std::byte>>& per_rank, int root, MPI_Comm comm,
                               const Waiter& waiter, const std::string& what, const Status& root_failure = Status::ok());

/// The fixed-size forms, one MPI collective each, for records every rank knows the size of (and no
/// failure to carry): root's `bytes` on every rank; every rank's `mine` (all of one size) in rank order.
void broadcast_fixed(std::span<std::byte> bytes, int root, MPI_Comm comm, const Waiter& waiter, const std::string& what);
std::vector<std::byte> allgather_fixed(std::span<const std::byte> mine, MPI_Comm comm, const Waiter& waiter,
                                       const std::string& what);

/// Returns when every rank of `comm` reached it (MPI_Ibarrier); throws kTimeout at the deadline.
void barrier(MPI_Comm comm, const Waiter& waiter, const std::string& what);
/// The same for teardowns: false when `seconds` passed (or MPI failed) first; the request stays with MPI.
bool barrier_within(MPI_Comm comm, double seconds) noexcept;
/// The same on an update path: returns kTimeout at the deadline, or the failure the waiter's service
/// returns (a peer that gave up and so never arrives), instead of throwing.
Status barrier_or_failure(MPI_Comm comm, const Waiter& waiter, const std::string& what);

/// Swaps a record with `peer` (point to point, `tag`, both sides call it): returns the peer's.
std::vector<std::byte> swap(int peer, std::span<const std::byte> mine, int tag, MPI_Comm comm, const Waiter& waiter,
                            const std::string& what);

}  // namespace wb::comm

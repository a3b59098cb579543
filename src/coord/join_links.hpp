// Engines that join by address (issue 31): the coordinator's side of comm/join.hpp. A joined engine job
// gets a link of its own: the trainers and that job merged into one intracommunicator, over which the
// adapters construct, connect and update exactly as over a world. One link per engine job, never one
// communicator across two engine jobs (measured: it hangs in PMIx unless every pair of jobs connected); the
// widening may also span engine 0 of the trainers' own job, the replica a joiner catches up from.
#pragma once

#include <mpi.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "comm/group.hpp"
#include "comm/join.hpp"
#include "coord/catch_up.hpp"

namespace wb::coord {

/// The trainers' join port: open on trainer rank 0, its address (port and secret) known to every trainer
/// (trainer rank 1 knocks at close, since nothing wakes MPI_Comm_accept from inside its own process).
struct TrainersJoinPort {
  std::unique_ptr<comm::JoinPort> port;  // trainer rank 0 only
  comm::JoinAddress address;
  bool open = false;
};

/// Trainers, collective over `trainers`: trainer rank 0 opens the port and writes `address`. Refused on
/// every trainer alike when rank 0 cannot (no MPI_THREAD_MULTIPLE, a file that exists) or when the job has
/// one trainer (no other process could end the accept thread at close). A joined replica engine opens its
/// own the same way over its engine (`side`: how its ranks are named, "engine worker").
TrainersJoinPort open_join_port(MPI_Comm trainers, const std::string& address, double timeout,
                                const std::string& side = "trainer");

/// Trainers, each on its own (no step together: a trainer may be unwinding an exception, and its adapter
/// ends this way too): no more joins. Trainer rank 0 removes the address file and waits (up to twice the
/// timeout) for its accept thread to end; trainer rank 1 knocks, which ends it.
void close_join_port(TrainersJoinPort& port, MPI_Comm trainers, double timeout, const std::string& side = "trainer");

/// The join_answer_seconds setting, at most half of `timeout`: how long the trainers wait for a joiner's
/// answer to the take, and then trainer rank 0 for merging the leaders' link (comm::bridge_join).
double join_answer_seconds(double timeout);

/// Trainers, one step of `trainers`: when trainer rank 0's port holds an admitted joiner that answers the
/// take (comm::confirm_take) and merges the leaders' link (comm::bridge_join), each within
/// join_answer_seconds, its job and the trainers widened and merged (trainers first): the new link's world.
/// With `replica` (coord/catch_up.hpp: the trainers and engine 0) and `ask_replica()` true on trainer rank
/// 0 (it asked the replica to serve the joiner), the widening is over `replica` instead, and the replica's
/// part is cut off the link. nullopt when none waits, which costs that one step, or when the joiner did not
/// answer or died before the merge (a warning; it is never widened with). Throws when the widening fails
/// or passes the deadline. `before_take` (trainer rank 0, when given): run on the admitted joiner's
/// leaders' link before the take (the fleet link's meeting, coord/fleet_link.hpp): give up on the joiner,
/// take it, or take it once `leave_out` ran on every trainer (after the step that tells them): the fleet
/// link rebuilt without the jobs that were silent at the meeting (W3), `replica` set to the link to widen
/// (null: none left); false gives up on the joiner. On the fleet link `replica` is that link and
/// `ask_replica` asks its engines into the widening.
enum class BeforeTake { kGiveUp, kTake, kLeaveOutFirst };
std::optional<MPI_Comm> take_joiner(comm::JoinPort* port, comm::Group& trainers, const comm::Waiter& waiter,
                                    MPI_Comm replica = MPI_COMM_NULL, const std::function<bool()>& ask_replica = {},
                                    const std::function<BeforeTake(MPI_Comm)>& before_take = {},
                                    const std::function<bool(MPI_Comm&)>& leave_out = {});

/// A rollout engine job, collective over `engine`: joins the trainers whose address file is `address`;
/// returns its link (trainers first) and, when a replica engine of the trainers' job took part, the
/// catch-up link it gets its first version over. Every rank of the engine throws the same error when its
/// rank 0 was refused or timed out.
JoinedComms join_trainers(MPI_Comm engine, const std::string& address, double timeout);

/// join_trainers in its two parts, for a joiner that serves before the trainers take it (the fleet link's
/// joiner served by a replica): admitted at the trainers' port (rank 0's link to trainer 0, MPI_COMM_NULL on
/// the others; every rank throws alike when refused), then, once rank 0 saw the trainers' take begin
/// (fleet_offer_arrived, never blocking), taken onto their link at once.
MPI_Comm admit_at_trainers(MPI_Comm engine, const std::string& address, double timeout);
JoinedComms taken_by_trainers(MPI_Comm engine, MPI_Comm leaders, const std::string& address, double timeout);

}  // namespace wb::coord

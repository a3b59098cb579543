// The fleet link (relays across engine jobs, issue 31; docs/architecture.md, "Relays across engine jobs",
// W1-W8): the trainers and every joined engine job on one communicator, planned as one plan, so that the
// trainers write one model copy out whatever the number of joined jobs. A communicator across jobs forms
// only where every pair of them connected: a joiner opens a port of its own that each joined job's leader
// connects to, at trainer 0's request, before the fleet link is widened with the joiner. These are the
// messages and connections of that meeting, and of the rebuild after a job was lost in an update (who is
// alive, the verdict, the survivors' link); the widening and the re-links are the adapters'.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/join.hpp"
#include "coord/roles.hpp"
#include "weightbridge/status.hpp"

namespace wb::coord {

struct AdapterBase;

/// The fleet_link setting: joined engine jobs share one link with the trainers (both sides must agree).
bool fleet_link_enabled();
/// The fleet_replica setting: the trainers appoint the fleet link's replica (W4), which serves joiners
/// before the take.
bool fleet_replica_enabled();
/// The engine of `roles` (a fleet link's) that trainer 0 appoints the fleet's replica: the first of two
/// workers or more (a port needs a second worker to knock at its close); -1: none, or fleet_replica off.
int fleet_replica_candidate(const Roles& roles);
/// An engine at its connect on the fleet link (`roles`, the link's): whether it receives into staging as
/// the replica it will be appointed (the replica_staging setting; the rule above, which every worker of
/// the link applies alike, the trainers' fleet_replica setting taken to be set alike here; and
/// MPI_THREAD_MULTIPLE, without which it opens no port).
bool stages_as_fleet_replica(const Roles& roles);

/// The address file of a joiner's port for the joined jobs' leaders: the trainers' address with ".fleet"
/// after it (one joiner at a time holds it: the trainers take one per send_weights).
std::string fleet_address(const std::string& join_address);

/// Trainer 0, on the leaders' link of an admitted joiner, before its take: tells it how many joined jobs
/// will connect to its port (`jobs`; 0: none, it opens none) and waits up to `seconds` for its answer.
/// False: the joiner did not answer or could not open its port (it is not taken).
bool offer_fleet(MPI_Comm leaders, std::int64_t jobs, double seconds);

/// The joiner's leader, right after its admission: waits for trainer 0's offer while `watch` sees the
/// trainers' port alive (their next send_weights may be a long training step away); opens its port
/// (admitting exactly that many, none when 0, within `seconds`) and answers. `jobs`: the count offered.
Status answer_fleet(MPI_Comm leaders, const std::string& join_address, double seconds, comm::AddressWatch& watch,
                    std::unique_ptr<comm::JoinPort>& port, std::int64_t& jobs);

/// Why a joiner waiting to be taken stops: the trainers took it the other link's way, since their
/// fleet_link differs from its own (`offered`: they offered the fleet link to a joiner that does not run it).
Status fleet_link_differs(bool offered);

/// The joiner's leader, not blocking: whether trainer 0's offer has come (the take of this joiner began).
bool fleet_offer_arrived(MPI_Comm leaders);

/// The joiner's leader, once widened: the connections its port admitted, abandoned (only the runtime's
/// knowledge of each pair was wanted), and the port closed; bounded by `seconds`.
void close_fleet_port(std::unique_ptr<comm::JoinPort>& port, std::int64_t jobs, double seconds);

/// A joined engine's leader, asked by trainer 0 (RequestKind::kMeetJoiner): connects to the joiner's port,
/// lets the connection go and tells trainer 0 (`world`: the fleet link's message communicator) whether it
/// connected. `seconds`: trainer 0's wait for that note (the connect is bounded by half of it).
Status meet_joiner(MPI_Comm world, int trainer_leader, const std::string& join_address, double seconds);

/// Trainer 0: the note of the joined leader `leader` (a rank of `world`) that it met the joiner, within
/// `seconds`: met, failed (it answered that it could not connect), or silent (no note: stopped or gone).
enum class Met { kMet, kFailed, kSilent };
Met joiner_met(MPI_Comm world, int leader, double seconds);

/// Trainer 0, the fleet link's meeting (W1-W2): the admitted joiner opens a port for `fleet`'s engines (none
/// when null: the first joiner) and each of their leaders connects there, one at a time, each within
/// `seconds`. False (a warning) when the joiner did not open its port or a leader answered that it could not
/// connect: the joiner is not taken. `silent`, per engine of `fleet`: 1 where its leader said nothing within
/// `seconds` (its job stopped or died between updates): that job is left out of the fleet link before the
/// widening (W3, SenderAdapter's leave_out_fleet).
bool meet_fleet(MPI_Comm leaders, const AdapterBase* fleet, double seconds, std::vector<std::uint32_t>& silent);

/// The verdict after a loss on the fleet link (L3-L4), as every survivor learns it.
struct FleetVerdict {
  std::vector<std::int64_t> held;  // per engine of the old link: the version it holds, -1 when it was lost
  std::vector<int> survivors;      // ranks of the old link the new one is made of, trainers first
  int tag = 0;                     // the rebuild's (rebuild_link: rebuilds of one link may overlap)
  MPI_Comm rebuilt = MPI_COMM_NULL;
  // Trainer 0: the engines' notes: answered, not waited for (found lost by the failed update), silent past
  // the bound; and how long the wait took.
  int answered = 0, found_lost = 0, silent = 0;
  double wait_seconds = 0;
};

/// Trainers, every one, once the fleet link `old` failed an update (its state is failed; point-to-point
/// with its live ranks still works): trainer 0 takes each engine's note that it is alive and the version it
/// holds, within `seconds` of the first look (an engine silent past that is lost), except from the engines
/// a trainer found lost in the failed update (a rank of theirs silent at its deadline's trace, or their
/// leave announced) or names in `lost` (1 per engine: silent at a joiner's port, W3; the trainers agree on
/// them first), so that the wait ends as soon as every other engine answered; the trainers agree on it
/// over `trainers`, trainer 0 tells every engine the survivors (a stopped one reads it once resumed: it was
/// left out; with `lost`, the survivors only: tell_left_out the others), every rank of the survivors says
/// it enters the rebuild (an engine one of whose ranks does not within `seconds` is left out, with a
/// warning), and the survivors that did make their link (comm::rebuild_link; the lost never waited for).
/// `rebuilt` is null when no engine is alive (nothing is rebuilt). Throws wb::Error when a trainer step or
/// the rebuild fails.
FleetVerdict rebuild_fleet(const AdapterBase& old, MPI_Comm trainers, int tag, double seconds,
                           std::vector<std::uint32_t> lost = {});

/// Trainer 0, after a join that left fleet jobs out first (W3; rebuild_fleet with `lost`, which told only
/// the survivors): each engine of `old` the verdict left out is sent kLeaveOut and the verdict, so that one
/// stopped and resumed reads that it was left out. Not before the join: a message posted to a dead job's
/// leader then cost the rebuild and the widening 0.3 s and 0.7 s more (measured; its TCP connection refused).
void tell_left_out(const AdapterBase& old, const FleetVerdict& verdict);

/// Every worker of an engine on the fleet link whose update failed: its leader tells trainer 0 it is alive
/// (with `held`, the version it holds) and waits for the verdict (twice the timeout), which it passes to the
/// engine's other workers; each worker in it tells trainer 0 it enters the rebuild and waits for the
/// survivors that all did; they make their link, and this engine's workers a communicator of their own from
/// the old link (its group communicator may hold steps given up on). Null `rebuilt` when no verdict came or
/// this engine was left out: the failure stands.
struct EngineRebuild {
  MPI_Comm rebuilt = MPI_COMM_NULL, engine = MPI_COMM_NULL;
};
EngineRebuild rejoin_fleet(const AdapterBase& old, std::uint64_t held);

/// What a re-link carries from an adapter's state on the old world to the one on the new: the version,
/// the history of updates and the stalls.
void carry_over(const AdapterBase& from, AdapterBase& to);

}  // namespace wb::coord

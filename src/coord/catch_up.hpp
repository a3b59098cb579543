// A joiner's first version from a replica that holds it (issue 31): an engine job that joins gets the
// trainers' latest version from an engine of the trainers' own job, not from the trainers, and serves it
// before their next update. Engine 0 of the trainers' world is the replica: it is in the trainers' job, so
// one widening of the join spans the trainers, the replica and the joiner with no further connection
// between jobs (a communicator across jobs forms only where every pair of them connected). The widening is
// cut into the trainers' link (trainers and joiner, planned as before) and the catch-up link (replica and
// joiner), over which the replica's workers play the trainers' part once: planned from the maps both
// probed at their own connect (nobody probes again), one update of the version the replica holds, written
// straight into the joiner's parameters, then parted. The trainers write nothing for that version: their
// egress per update is unchanged. Both sides load one form: the checkpoint's, or FP8 of one quantization
// config, whose codes and scales the replica's workers copy as they are (each side kept its probe in the
// form it loads); a replica and a joiner of different forms refuse the catch-up, and the joiner gets the
// trainers' next version. A trainer job with no engine of its own (or without MPI_THREAD_MULTIPLE on the
// replica) appoints the first joined engine job of two workers or more
// instead: it opens a port of its own (its address file beside the trainers'), a joiner connects there
// before it joins the trainers, and the two jobs' leaders make the catch-up link from that connection
// (bridge and widening, as a join). With no replica at all, joiners get the trainers' next version.
// How a joiner finds the replica (its address file, the tensor list beside it, the admission at its
// port) is in replica_admission.cpp; the links and the copy are in catch_up.cpp.
#pragma once

#include <mpi.h>

#include <cstdint>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "comm/join.hpp"
#include "coord/connection.hpp"
#include "coord/roles.hpp"
#include "exec/transfer_memory.hpp"
#include "transport/spare_transports.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/status.hpp"

namespace wb::coord {

struct AdapterBase;

/// A catch-up link's transfer buffers, allocated and populated ahead on a thread: on the loaded emulated
/// cluster that took 60-90 ms of the copy link's connect on either side (a rank's: an eighth of its
/// parameters, at least 16 MiB, each way), on the path of every join (the connect 112-196 ms, with them
/// ready 29-67 ms). A joiner prepares them once it has probed, while it connects to the replica's port and
/// waits to be taken; the fleet's replica once it is appointed, and keeps them from one joiner to the next
/// (a catch-up's updates have ended before the next one's connect takes them over). Host parameters only
/// (device buffers are never taken over); an invalid future, or a failed allocation: the link allocates its
/// own, as before.
using PreparedBuffers = std::shared_future<std::shared_ptr<const exec::TransferBuffers>>;
PreparedBuffers prepare_catch_up_buffers(const ParameterSet& params, const ResolvedOptions& options);

/// The fleet's replica, its port open: a transport kept opened for the next joiner's catch-up link (where
/// its own links are between machines: the joiners' are too) and its transfer buffers, kept from one to the next.
void prepare_for_joiners(AdapterBase& replica, bool network_links);

/// A catch-up link made before its copy is asked (the fleet link's: the joiner probes meanwhile), with the
/// link's adapter constructed over it and the forms both sides load checked: those took 86-172 ms of every
/// copy after the ask on the emulated cluster (the adapter's duplicates, roles, fault channel and clock
/// offset, and one all-gather), leaving the plan (it needs the joiner's probe) and the transfer. One that
/// goes unused is abandoned with its communicators, never waited on (the other side may be gone).
struct LinkedCopy;
struct AbandonUnused {
  void operator()(LinkedCopy* copy) const noexcept;
};
using LinkedCopyPtr = std::unique_ptr<LinkedCopy, AbandonUnused>;
/// Its link (the replica's workers first): where the joiner's ask and the replica's answer go.
MPI_Comm link_of(const LinkedCopy& copy);

/// Who a rank is in the widening of a join.
enum class JoinSide : std::int32_t { kTrainer = 0, kReplica = 1, kJoiner = 2 };

/// What the widening of a join is cut into, on the ranks that are in each (MPI_COMM_NULL elsewhere).
struct JoinedComms {
  MPI_Comm link = MPI_COMM_NULL;      // trainers first, then the joiner's workers
  MPI_Comm catch_up = MPI_COMM_NULL;  // the replica's workers first, then the joiner's; none without a replica
  MPI_Comm replica_leaders = MPI_COMM_NULL;  // the joiner's leader: to a joined replica's leader, when it connected
  bool from_replica = false;                 // every rank of the joiner: its leader connected to a joined replica
};

/// The address file of the joined replica: the trainers' address with ".replica" after it. Written by that
/// job's leader (comm::JoinPort), removed when it goes (by the trainers when they drop it).
std::string replica_address(const std::string& join_address);
/// The replica's leader, once its port is open: the port keeps its address file fresh (JoinPort::keep_fresh),
/// and connect_replica connects only to a replica whose file is (its process runs).
void keep_replica_fresh(comm::JoinPort& port);

/// The file beside the replica's address that lists the checkpoint's tensors (owner-only, as the address):
/// written by a joined replica's leader whose engine loads the checkpoint's form when its port opens, so
/// that a joiner probes its load_weights before it connects, not while the replica (and, in sync, the
/// trainers' update the replica holds back) waits on the copy link for the probe. Removed with the address.
std::string replica_tensors_path(const std::string& join_address);
void write_replica_tensors(const std::string& join_address, const std::vector<TensorInfo>& tensors);
/// Removes the replica's address file and its tensor list.
void remove_replica_address(const std::string& join_address);
/// A joiner, collective over its `engine`, before connect_replica: where a replica's tensor list is there
/// (and this engine loads the checkpoint's form), probes its load_weights against it (`tensors`,
/// `probed`, `seconds`). kNoList: the joiner probes on the copy link; kFailed (`probed` empty): no copy,
/// and the trainers' connect probes again and says why.
enum class EarlyProbe { kNoList, kProbed, kFailed };
EarlyProbe probe_before_replica(MPI_Comm engine, const std::string& join_address, const ParameterSet& params, const LoadWeightsFn& load,
                                const ResolvedOptions& options, std::vector<TensorInfo>& tensors, SourceMap& probed, double& seconds);

/// A joiner, collective over its `engine` before it joins the trainers: its leader connects to the joined
/// replica whose address file exists (bounded by join_answer_seconds; none, or one that does not answer,
/// is no error: a warning). Sets `replica_leaders` (leader) and `from_replica` (everyone).
void connect_replica(MPI_Comm engine, const std::string& join_address, double timeout, JoinedComms& comms);
/// connect_replica in two halves, so that the connect runs beside the joiner's probe, off the join's path
/// (on the emulated cluster it was 0.1-0.4 s of every copy's 1.9-2.4 s): the leader starts it on a thread
/// (start_replica_admission; no MPI call on the other ranks), and every rank settles it, collectively
/// (settle_replica_admission). The replica takes a joiner only once its leader said "ready"
/// (comm::say_ready), so one admitted while it probes holds nothing of the replica.
using ReplicaAdmission = std::future<MPI_Comm>;
ReplicaAdmission start_replica_admission(MPI_Comm engine, const std::string& join_address, double timeout);
void settle_replica_admission(MPI_Comm engine, ReplicaAdmission admission, double timeout, JoinedComms& comms);

/// Collective over `merged` (the widening of a join; taken over): every rank says which side it is, and
/// when a replica took part, the widening is cut into the link and the catch-up link (and freed).
/// Bounded by `timeout`; throws wb::Error.
JoinedComms cut_widening(MPI_Comm merged, JoinSide mine, double timeout);

/// Collective over the adapters' world at connect (not over a joined link): the trainers and engine 0, the
/// replica that feeds joiners (trainers first, by trainer rank, then engine 0's workers). MPI_COMM_NULL on
/// the other ranks, and on all when the trainers take no joins (`joins`: this rank is a trainer with a
/// join address), there is no engine or fewer than two trainers, or some rank of them lacks
/// MPI_THREAD_MULTIPLE (the widening runs on a thread).
MPI_Comm make_replica_comm(MPI_Comm world, const Roles& roles, bool joins, double timeout);

/// The replica engine's workers, together, when trainer rank 0 asked them (RequestKind::kServeJoiner) and
/// their version is installed: they take part in the widening of the join over `replica_comm` and write
/// the version they hold to the joiner. A failure is the joiner's, not this engine's: the caller warns and
/// serves on. `bytes`: what this worker wrote.
Status serve_joiner(AdapterBase& replica, MPI_Comm replica_comm, std::int64_t& bytes);
/// The same for a joined replica, collective over its engine: its leader takes the joiner admitted at
/// `port` (null on the other ranks), or has taken it already (`taken`), and the two jobs make the catch-up
/// link; then the copy.
Status serve_joiner_at_port(AdapterBase& replica, comm::JoinPort* port, std::int64_t& bytes, MPI_Comm taken = MPI_COMM_NULL);
/// The fleet link's replica, serving a joiner the trainers have not taken yet, in two steps between its own
/// updates, so that nothing of the joiner's probe is on the copy's path nor held against the replica: at
/// once when its leader took the joiner (`taken`: it said "ready" as it was admitted, while it probes),
/// the catch-up link and its adapter, on every worker (null where that failed: warned); once the joiner
/// asked for the copy (comm::copy_asked, the leader's look, agreed at the engine's step), the copy over
/// it; or the link let go, with a warning (the joiner's probe failed, or it did not ask within the
/// timeout; it then gets the trainers' next version). Every step waits as long as a join's answer (nobody
/// but this engine waits for them).
LinkedCopyPtr link_joiner_at_port(AdapterBase& replica, MPI_Comm taken);
Status serve_linked_joiner(AdapterBase& replica, LinkedCopyPtr linked, std::int64_t& bytes);
enum class LetGo { kQuietly, kProbeFailed, kLate };  // why (kQuietly: the replica's own end, not warned)
void drop_linked_joiner(AdapterBase& replica, LinkedCopyPtr linked, LetGo why);

/// The joiner's workers, together, right after their link is connected: `hook(v)`, then version v from
/// the replica, straight into their parameters. `installed`: v, once every worker of both sides has it.
Status catch_up(AdapterBase& joiner, MPI_Comm catch_up_comm, const BeforeUpdateHook& hook, std::uint64_t& installed);
/// The same from a joined replica: the catch-up link made first from `replica_leaders` (the leader's; null
/// on the other ranks).
Status catch_up_from_port(AdapterBase& joiner, MPI_Comm replica_leaders, const BeforeUpdateHook& hook, std::uint64_t& installed);
/// The fleet link's joiner, collective over its `engine`, before it probes: its leader connects to the
/// fleet's replica's port, and every worker makes the catch-up link with the replica's, and the link's
/// adapter, on a thread while the probe runs (the widening over both jobs took 20-200 ms of every join
/// after the probe on the emulated cluster, the adapter 86-172 ms more). The replica takes it at once, and
/// copies once the joiner asks (catch_up_before_take).
struct EarlyCatchUpLink {
  struct Linked {
    LinkedCopyPtr link;         // the catch-up link and its adapter
    PreparedBuffers buffers;    // its transfer buffers, allocated once it was made
    bool admitted = false;      // the replica admitted this engine (alike on every worker)
    Status status;              // why there is no link where it admitted it
  };
  MPI_Comm engine = MPI_COMM_NULL;  // the thread's duplicate of the engine
  std::future<Linked> linked;
};
EarlyCatchUpLink start_catch_up_link(MPI_Comm engine, const ParameterSet& params, const LoadWeightsFn& load_weights,
                                     const ResolvedOptions& options);
/// Then, collective over its `engine`: the link awaited, the copy asked (`copy`: the probe before it
/// passed, or was not made; otherwise the replica is told "no copy"), and the replica's version over it,
/// its load_weights probed on the catch-up link (`probed`: its map, kept for its connect with the
/// trainers) unless it was probed before (`probed` given, against `probed_against`). `from_replica`: a
/// replica admitted it (none is no error). `waited`: from the call to the replica's answer to the copy
/// (TransferSummary::replica_wait_seconds).
Status catch_up_before_take(MPI_Comm engine, const ParameterSet& params, const LoadWeightsFn& load_weights, const AdapterOptions& options,
                            std::shared_ptr<SpareTransports> spares, const BeforeUpdateHook& hook, EarlyCatchUpLink early,
                            bool copy, bool& from_replica, std::uint64_t& installed, SourceMap& probed,
                            const std::vector<TensorInfo>& probed_against, double& waited);

}  // namespace wb::coord

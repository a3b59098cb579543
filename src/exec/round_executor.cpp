// The round executor's construction and teardown: the order of the lifecycle phases (round_executor.hpp).
#include "exec/round_executor.hpp"

#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "comm/backoff.hpp"
#include "comm/collectives.hpp"
#include "core/checks.hpp"
#include "core/cuda_device.hpp"
#include "core/device.hpp"
#include "core/laps.hpp"
#include "core/log.hpp"
#include "exec/connect_handshake.hpp"
#include "exec/executor_state.hpp"
#include "exec/parameter_check.hpp"
#include "exec/segment_padding.hpp"
#include "transport/spare_transports.hpp"

namespace wb {
namespace {

// How long a teardown waits for the peers once an update of this executor failed (they may be gone).
constexpr double kFailedTeardownSeconds = 10;

// Seconds left until `deadline` (comm::local_seconds()), never negative.
double left_until(double deadline) { return std::max(0.0, deadline - comm::local_seconds()); }

using State = RoundExecutor::State;

// The phases of construction, in order; each collective over the executor's communicator.

// The transport of every pair, decided by the machine every rank is on. Pairs between machines first:
// whether their transport registers device memory decides, with the others of this machine, whether the
// pairs on it go device to device (exec::pair_memory). Returns where every rank is.
exec::RankPlaces choose_transports(State& s, bool cuda_parameters, const comm::Waiter& waiter) {
  int size = 0;
  WB_CHECK_MPI(MPI_Comm_size(s.comm, &size));
  exec::RankPlaces places = exec::gather_rank_places(cuda_parameters, s.comm, waiter);
  s.collective_teardown = places.any_cuda;
  const auto same_machine = [&](int peer) {
    return places.machines[static_cast<std::size_t>(peer)] == places.machines[static_cast<std::size_t>(s.rank)];
  };
  const auto use = [&](int peer, TransportKind kind) {
    if (!s.transports.count(kind)) {
      const double began = comm::local_seconds();
      std::unique_ptr<Transport> spare = s.options.spares ? s.options.spares->take(kind, s.rank) : nullptr;
      const bool was_spare = spare != nullptr;
      s.transports.emplace(kind, spare ? std::move(spare) : make_transport(kind, s.rank));
      // Which one waited here, and how long (a missing spare held every rank of a join's link: measured).
      WB_LOG(kDebug) << "rank " << s.rank << ": transport " << transport_name(kind) << (was_spare ? ", a spare," : " opened")
                     << " in " << comm::local_seconds() - began << " s";
    }
    s.peers[peer].transport = s.transports[kind].get();
  };
  bool device_buffers = cuda_parameters;
  for (int peer : s.schedule.peers) {
    if (peer < 0 || peer >= size || peer == s.rank)
      throw Error(ErrorCode::kInvalidArgument, "round schedule names peer " + std::to_string(peer));
    if (same_machine(peer)) continue;
    use(peer, choose_transport(false, s.parameters.memory, s.options.transport));
    device_buffers = device_buffers && s.peers[peer].transport->capabilities().cuda_memory;
  }
  exec::gather_device_buffers(places, device_buffers, s.comm, waiter);
  for (int peer : s.schedule.peers)
    if (same_machine(peer)) use(peer, choose_transport(true, exec::pair_memory(places, s.rank, peer), s.options.transport));
  return places;
}

// Padded segments (segment_padding.hpp) where some rank's kernels address the buffers: a rank with CUDA
// parameters pads its own slots, and every rank learns the receive layouts of the peers it writes to
// (peers in ascending order on both sides, as in connect_pairs).
void pad_segments(State& s, const exec::RankPlaces& places, bool cuda_parameters, const comm::Waiter& waiter) {
  if (!places.any_cuda) return;
  exec::SlotLayout send, receive;
  if (cuda_parameters) {
    send = exec::pad_send_slot(s.schedule);
    receive = exec::pad_receive_slot(s.schedule);
  }
  std::map<int, exec::SlotLayout> peer_layouts;
  for (int peer : s.schedule.peers)
    peer_layouts.emplace(peer, exec::decode_layout(exec::swap_record(peer, exec::encode_layout_for(receive, s.schedule, peer), s.comm, waiter),
                                                   peer, s.rounds));
  s.schedule = exec::apply_layouts(s.schedule, send, receive, peer_layouts);
}

// The buffers: where every transport can register them, allocated once, and registered with each.
void allocate_buffers(State& s) {
  std::vector<std::pair<TransportKind, TransportCapabilities>> capabilities;
  for (const auto& [kind, transport] : s.transports) capabilities.emplace_back(kind, transport->capabilities());
  s.stats.buffer_memory = choose_buffer_memory(s.parameters.memory, capabilities);
  s.buffers = exec::allocate_transfer_buffers(s.parameters.memory, s.stats.buffer_memory, s.parameters.device, s.depth,
                                              s.schedule.send_slot_bytes, s.schedule.receive_slot_bytes,
                                              s.options.reuse_buffers.get());
  const auto register_buffers = [&] {
    for (const auto& [kind, transport] : s.transports) {
      const MemoryRegistration send =
          transport->register_memory(s.buffers.send->data(), s.buffers.send->size(), s.buffers.memory, s.buffers.device);
      const MemoryRegistration receive =
          transport->register_memory(s.buffers.receive->data(), s.buffers.receive->size(), s.buffers.memory, s.buffers.device);
      s.stats.registrations += 2;
      s.local_memory[kind] = {send.id, receive.id};
      s.receive_keys[kind] = receive.remote_key;
    }
  };
  try {
    register_buffers();
  } catch (const Error& error) {
    // A NIC that cannot register device memory after all (no dma-buf, no peer-memory module) is known only
    // by trying: the first registration of device buffers failing, the buffers move to pinned host memory,
    // which every transport of the rank must then register.
    const bool host_everywhere = std::all_of(capabilities.begin(), capabilities.end(),
                                             [](const auto& c) { return c.second.host_memory; });
    if (s.buffers.memory != MemoryKind::kCuda || s.stats.registrations != 0 || !host_everywhere) throw;
    static std::atomic<bool> logged{false};
    if (!logged.exchange(true)) {
      WB_LOG(kWarn) << "rank " << s.rank << ": the transports cannot register CUDA transfer buffers ("
                    << error.status().message() << "); using pinned host buffers, which the kernels reach over PCIe";
    }
    s.stats.buffer_memory = MemoryKind::kHost;
    s.buffers = exec::allocate_transfer_buffers(s.parameters.memory, MemoryKind::kHost, s.parameters.device, s.depth,
                                                s.schedule.send_slot_bytes, s.schedule.receive_slot_bytes,
                                                s.options.reuse_buffers.get());
    register_buffers();
  }
  s.options.reuse_buffers.reset();  // what was not taken over goes with its old executor
}

// Connects every pair (connect_handshake.hpp), peers in ascending order. Returns, per round, the arrivals
// each peer's split batches add.
std::vector<exec::ExtraArrivals> connect_pairs(State& s, const comm::Waiter& waiter) {
  const auto splits = exec::split_batches(s.schedule, [&](int peer) { return exec::writes_per_post(*s.peers.at(peer).transport); });
  for (const auto& [peer, list] : splits) s.stats.split_batches += static_cast<std::int64_t>(list.size());
  std::vector<exec::ExtraArrivals> extra_arrivals(static_cast<std::size_t>(s.rounds));
  for (auto& [peer, link] : s.peers) {
    exec::ConnectRecord mine;
    mine.transport = link.transport->kind();
    mine.receive_slot_stride = s.buffers.receive_slot_stride;
    mine.endpoint = link.transport->endpoint(peer);
    mine.receive_key = s.receive_keys[mine.transport];
    if (auto it = splits.find(peer); it != splits.end()) mine.splits = it->second;
    const exec::ConnectRecord theirs =
        exec::decode_connect_record(exec::swap_record(peer, exec::encode_connect_record(mine), s.comm, waiter), peer, s.rounds);
    if (theirs.transport != mine.transport)
      throw Error(ErrorCode::kInvalidArgument, "rank " + std::to_string(s.rank) + " would reach rank " + std::to_string(peer) +
                                                   " over " + transport_name(mine.transport) + ", the peer over " +
                                                   transport_name(theirs.transport));
    link.receive_slot_stride = theirs.receive_slot_stride;
    link.transport->connect(peer, theirs.endpoint);
    link.receive_memory = link.transport->import_memory(peer, theirs.receive_key);
    for (const exec::SplitBatch& split : theirs.splits)
      extra_arrivals[split.round][peer][split.stage] += static_cast<int>(split.posts) - 1;
  }
  return extra_arrivals;
}

// Per round: the batches, the arrivals expected, the writers to grant; the compiled pack and assemble (and
// the verifier's digests where asked); the progress ring sized for them.
void build_rounds(State& s, bool cuda_parameters, const std::vector<exec::ExtraArrivals>& extra_arrivals) {
  exec::BatchTargets targets;
  for (const auto& [peer, link] : s.peers) targets.peers[peer] = {link.transport, link.receive_memory};
  targets.local_memory = s.local_memory;
  if (s.options.verify) {
    if (cuda_parameters)
      throw Error(ErrorCode::kUnsupported, "verify checks host transfer buffers; these parameters are in CUDA memory");
    const std::vector<std::int64_t> parameter_bytes(s.parameters.bytes.begin(), s.parameters.bytes.end());
    s.verifier = std::make_unique<exec::Verifier>(s.schedule, s.comm, exec::kDigestTag, parameter_bytes,
                                                  s.schedule.send_slot_bytes, s.schedule.receive_slot_bytes);
  }
  s.engine = exec::make_copy_engine(s.rank, s.parameters, s.buffers, s.schedule, s.verifier.get());
  s.work.reserve(static_cast<std::size_t>(s.rounds));
  std::size_t most = 0;
  for (int r = 0; r < s.rounds; ++r) {
    const RoundPlan& plan = s.schedule.rounds[static_cast<std::size_t>(r)];
    s.work.push_back(exec::build_round_work(plan, targets, extra_arrivals[static_cast<std::size_t>(r)]));
    s.engine->add_round(plan);
    s.work.back().assembled_bytes = s.engine->assembled_bytes(static_cast<std::size_t>(r));
    for (const exec::Batch& batch : s.work.back().batches) most = std::max(most, std::min(batch.writes.size(), batch.writes_per_post));
  }
  s.scratch.reserve(most);
  s.ring.assign(static_cast<std::size_t>(4 * s.depth + 4), RoundProgress{});
  std::size_t most_writers = 0;
  for (const exec::RoundWork& work : s.work) most_writers = std::max(most_writers, work.writers.size());
  for (RoundProgress& p : s.ring) p.arrived_from.assign(most_writers, std::array<int, kStageCount>{});
  s.completions.reserve(1024);
  s.grant_requests.reserve(256);
}

}  // namespace

RoundExecutor::RoundExecutor(RoundSchedule schedule, ParameterMemory parameters, MPI_Comm comm, ExecutorOptions options)
    : state_(std::make_unique<State>()) {
  State& s = *state_;
  s.schedule = std::move(schedule);
  s.parameters = std::move(parameters);
  s.options = options;
  // The handshake's waits: the update's deadline, and the coordinator's notices served meanwhile (a peer
  // that gave up ends them at once).
  const wb::comm::Waiter waiter{options.timeout_seconds, [&s](bool) {
                                  return s.options.interrupt ? s.options.interrupt(nullptr) : Status::ok();
                                }};
  // A communicator of its own: grants left over from this executor's last update can never be taken
  // for another executor's. Errors return (to the checks) even where the job's handler aborts. Bounded, and
  // waited for as every wait is (comm::Backoff): MPI_Comm_dup spins in MPI until every rank arrived, and
  // over a link between two jobs on a loaded machine took 12-208 ms there (traced), 1-3 ms this way.
  Laps laps;
  s.comm = wb::comm::duplicate(comm, waiter, "connecting the transports: duplicating the executor's communicator");
  laps("duplicate");
  s.idle_sleep_us = comm::idle_sleep_setting();
  s.send_rounds = exec::send_rounds_in_flight_setting();
  WB_CHECK_MPI(MPI_Comm_rank(s.comm, &s.rank));
  if (s.schedule.rank != s.rank)
    throw Error(ErrorCode::kInvalidArgument, "round schedule of rank " + std::to_string(s.schedule.rank) +
                                                 " given to rank " + std::to_string(s.rank));
  const bool cuda_parameters = s.parameters.memory == MemoryKind::kCuda;
  if (cuda_parameters && cuda_device_count() == 0)
    throw Error(ErrorCode::kUnsupported, "rank " + std::to_string(s.rank) + ": parameters in CUDA memory, but no CUDA device (" +
                                             cuda_unavailable_reason() + ")");
  // The parameters' device is current while transports, buffers and programs are made (cuda_ipc, for
  // one, works on the device current when it is created).
  DeviceGuard device_guard;
  if (cuda_parameters) {
    throw_if_error(device_guard.enter(s.parameters.device));
    exec::check_device_parameters(s.rank, s.parameters);
  }
  s.depth = std::max(1, s.schedule.pipeline_depth);
  s.rounds = static_cast<int>(s.schedule.rounds.size());

  const exec::RankPlaces places = choose_transports(s, cuda_parameters, waiter);
  laps("transports");
  pad_segments(s, places, cuda_parameters, waiter);
  allocate_buffers(s);
  laps("buffers");
  const std::vector<exec::ExtraArrivals> extra_arrivals = connect_pairs(s, waiter);
  laps("pairs");
  build_rounds(s, cuda_parameters, extra_arrivals);
  laps("rounds");
  wb::comm::barrier(s.comm, waiter, "connecting the transports: every pair connected before anyone writes");
  laps("barrier");
  WB_LOG(kDebug) << "rank " << s.rank << ": the executor's steps: " << laps.text();
}

RoundExecutor::~RoundExecutor() {
  if (!state_) return;
  State& s = *state_;
  // Every wait of the teardown shares one deadline: the timeout after updates that succeeded (as long as
  // the peers take to get here), at most kFailedTeardownSeconds once an update failed (the peers may be
  // stopped or gone).
  const bool failed = s.failed || s.peers_failed;
  const double seconds = failed ? std::min(s.options.timeout_seconds, kFailedTeardownSeconds) : s.options.timeout_seconds;
  const double deadline = comm::local_seconds() + seconds;
  if (failed)
    for (const auto& [kind, transport] : s.transports) transport->abandon();  // a peer may be dead (Transport::abandon)
  // Grants are eager 8-byte messages: their sends complete whether or not anyone receives them, unless the
  // transport to a peer that stopped is full. Those still pending at the deadline keep their buffers for
  // the rest of the process (a small, deliberate leak), since MPI may still read them.
  if (!comm::complete_within(s.grant_requests, left_until(deadline))) {
    WB_LOG(kWarn) << "rank " << s.rank << ": grants to peers did not complete within " << seconds
                  << " s; their buffers are kept";
    comm::keep_alive(std::make_shared<std::deque<std::uint64_t>>(std::move(s.grant_buffers)));  // the elements stay put
  }
  if (s.collective_teardown) {
    // No exported memory freed while a peer has it open (CUDA IPC: undefined behaviour): this rank's own
    // kernels and writes end, its transports close what it imported, and only once every rank got that
    // far are the buffers freed. A peer that does not arrive (it failed, or is gone) leaves this rank's
    // device buffers allocated.
    if (s.engine) s.engine->synchronize();
    s.transports.clear();
    if (!comm::barrier_within(s.comm, left_until(deadline))) {
      WB_LOG(kWarn) << "rank " << s.rank << ": not every peer closed its CUDA IPC imports within " << seconds
                    << " s; the transfer buffers stay allocated";
      if (s.buffers.send) s.buffers.send->abandon();
      if (s.buffers.receive) s.buffers.receive->abandon();
    }
  }
  s.transports.clear();
  // Not freed: a freed context id goes to the next communicator, and a grant still in flight after a failed
  // update would then credit that communicator's executor with a slot it never released.
}

void RoundExecutor::note_peer_failure() { state_->peers_failed = true; }

bool RoundExecutor::rebind_parameter(std::size_t parameter, const std::byte* from, std::byte* to) {
  State& s = *state_;
  if (parameter >= s.parameters.data.size() || s.parameters.data[parameter] != from) return false;
  if (s.parameters.memory == MemoryKind::kCuda) {
    DeviceGuard device_guard;
    throw_if_error(device_guard.enter(s.parameters.device));
    ParameterMemory moved = s.parameters;
    moved.data[parameter] = to;
    exec::check_device_parameters(s.rank, moved);  // device memory of the same device, inside one allocation
  }
  s.engine->rebind(parameter, to, s.schedule);
  s.parameters.data[parameter] = to;
  return true;
}

MPI_Comm RoundExecutor::communicator() const { return state_->comm; }

int RoundExecutor::failed_write_peer() const { return state_->failed_write_peer.load(); }

std::shared_ptr<const exec::TransferBuffers> RoundExecutor::transfer_buffers() const {
  return std::make_shared<const exec::TransferBuffers>(state_->buffers);
}

void* RoundExecutor::completion_event() const { return state_->engine->completion_event(); }
const ExecutorStats& RoundExecutor::stats() const { return state_->stats; }
std::vector<ExecutorSpan> RoundExecutor::take_trace() { return std::exchange(state_->stats.trace, {}); }
const RoundSchedule& RoundExecutor::schedule() const { return state_->schedule; }

}  // namespace wb

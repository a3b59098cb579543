#include "coord/connection.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <functional>
#include <map>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "layout/probe.hpp"
#include "layout/source_map_exchange.hpp"
#include "plan/planned_schedules.hpp"
#include "plan/round_schedule.hpp"
#include "plan/round_schedule_scatter.hpp"
#include "transport/transport.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/source_map.hpp"

namespace wb::coord {
namespace {

Setting<bool> sender_staging_setting("sender_staging", false,
                                     "Trainers: copy the parameters to host staging and let send_weights return "
                                     "while the transfer runs in the background.");
Setting<bool> receiver_staging_setting("receiver_staging", false,
                                       "Rollouts: receive into host staging while generating, install at one step.");
Setting<std::int64_t> node_setting("node", -1,
                                   "This worker's node for the planner; -1: its machine (trainers and rollouts "
                                   "of one machine count as different nodes).",
                                   -1, INT_MAX);

// What each worker tells rank 0 about itself, besides its source map.
struct WorkerConfig {
  std::int64_t trainer = 0, engine = -1, node_key = 0, sender_staging = 0, receiver_staging = 0, buffer_bytes = 0,
               pipeline_depth = 0, verify = 0;
};

// The plan's figures, broadcast from rank 0.
struct SummaryRecord {
  double t_min = 0, simulated = 0;
  std::int64_t workers = 0, trainer_nodes = 0, rollout_nodes = 0, rounds = 0, model_bytes = 0, max_need = 0,
               bytes_per_update = 0, inter_node = 0, nodes = 0;
};

// Connect's collectives: non-blocking with the adapters' deadline, so that a rank that never arrives
// fails the others instead of holding them.
void broadcast(void* data, std::size_t bytes, int root, const ConnectInput& in, const std::string& what) {
  if (bytes > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::kUnsupported, "connect: " + what + " takes " + std::to_string(bytes) + " bytes, more than an MPI count");
  OperationPtr op = make_operation(bytes);
  std::memcpy(op->out.data(), data, bytes);
  WB_CHECK_MPI(MPI_Ibcast(op->out.data(), static_cast<int>(bytes), MPI_BYTE, root, in.world, &op->request));
  throw_if_error(wait_for(op, in.waiter, false, "connect: " + what));
  std::memcpy(data, op->out.data(), bytes);
}

// Every rank's bytes on every rank.
std::vector<std::vector<std::byte>> allgather(const std::vector<std::byte>& mine, const ConnectInput& in, const std::string& what) {
  const int size = in.roles->world_size;
  if (mine.size() > static_cast<std::size_t>(INT_MAX))
    throw Error(ErrorCode::kUnsupported, "connect: " + what + " of " + std::to_string(mine.size()) + " bytes exceeds an MPI count");
  std::vector<int> counts(static_cast<std::size_t>(size));
  {
    const int count = static_cast<int>(mine.size());
    OperationPtr op = make_operation(sizeof count, sizeof(int) * counts.size());
    std::memcpy(op->out.data(), &count, sizeof count);
    WB_CHECK_MPI(MPI_Iallgather(op->out.data(), 1, MPI_INT, op->in.data(), 1, MPI_INT, in.world, &op->request));
    throw_if_error(wait_for(op, in.waiter, false, "connect: " + what + " (sizes)"));
    std::memcpy(counts.data(), op->in.data(), op->in.size());
  }
  std::vector<int> displacements(counts.size());
  long long total = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    displacements[r] = static_cast<int>(total);
    total += counts[r];
  }
  if (total > INT_MAX)
    throw Error(ErrorCode::kUnsupported, "connect: " + what + " of all ranks take " + std::to_string(total) +
                                             " bytes, more than one MPI_Iallgatherv carries");
  OperationPtr op = make_operation(mine.size(), static_cast<std::size_t>(total));
  std::copy(mine.begin(), mine.end(), op->out.begin());
  // The counts and displacements must outlive the operation too: they travel in its input buffer's shadow.
  auto shape = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(counts, displacements);
  WB_CHECK_MPI(MPI_Iallgatherv(op->out.data(), static_cast<int>(mine.size()), MPI_BYTE, op->in.data(), shape->first.data(),
                               shape->second.data(), MPI_BYTE, in.world, &op->request));
  const Status status = wait_for(op, in.waiter, false, "connect: " + what);
  if (!status) {
    // Abandoned with its operation: the counts stay with it (never freed while MPI may read them).
    static std::vector<std::shared_ptr<void>>* kept = new std::vector<std::shared_ptr<void>>;
    kept->push_back(shape);
    throw Error(status);
  }
  std::vector<std::vector<std::byte>> all(counts.size());
  for (std::size_t r = 0; r < counts.size(); ++r)
    all[r].assign(op->in.begin() + displacements[r], op->in.begin() + displacements[r] + counts[r]);
  return all;
}

// The checkpoint a probe pass offers, with one more check: a name the trainers' tensor list lacks is
// reported in those words (the probe checkpoint itself only knows the list it was given).
class TrainersTensors final : public CheckpointReader {
 public:
  explicit TrainersTensors(const CheckpointReader& probe) : probe_(probe) {}
  const std::vector<TensorInfo>& tensors() const override { return probe_.tensors(); }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    if (probe_.find(name) == nullptr)
      throw Error(ErrorCode::kNotFound, "load_weights reads tensor '" + std::string(name) +
                                            "', which the trainers' tensor list (checkpoint_tensors, " +
                                            std::to_string(probe_.tensors().size()) +
                                            " tensors, given to SenderAdapter) does not have");
    probe_.read_box(name, box, destination);
  }
  std::string source() const override { return "the trainers' checkpoint_tensors (" + probe_.source() + ")"; }

 private:
  const CheckpointReader& probe_;
};

// World rank 0, once: the parameters load_weights never writes (a rotary cache, say) keep their own
// contents at every update; said once, so nobody wonders, with the names at debug level.
void report_untouched(const std::vector<SourceMap>& maps, const Roles& roles) {
  std::size_t count = 0, workers = 0;
  for (std::size_t r = 0; r < maps.size(); ++r) {
    std::vector<bool> written(maps[r].parameters.size(), false);
    for (const SliceCopy& copy : maps[r].copies)
      if (copy.parameter < written.size()) written[copy.parameter] = true;
    std::string names;
    std::size_t here = 0;
    for (std::size_t p = 0; p < written.size(); ++p)
      if (!written[p]) {
        ++here;
        names += (names.empty() ? "" : ", ") + maps[r].parameters[p].name;
      }
    if (here == 0) continue;
    count += here;
    ++workers;
    WB_LOG(kDebug) << describe_worker(roles, static_cast<int>(r)) << ": load_weights never writes " << names;
  }
  if (count > 0) {
    WB_LOG(kInfo) << "connect: " << count << " parameters on " << workers
                  << " workers are never written by their load_weights (e.g. rotary caches); the transfers leave them "
                     "alone (WB_LOG_LEVEL=debug names them)";
  }
}

}  // namespace

ResolvedOptions resolve_options(const AdapterOptions& options) {
  ResolvedOptions resolved;
  resolved.sender_staging = options.sender_staging.value_or(*sender_staging_setting);
  resolved.receiver_staging = options.receiver_staging.value_or(*receiver_staging_setting);
  resolved.verify = options.verify.value_or(exec::verify_setting_value());
  resolved.trace = options.trace.value_or(exec::timeline_setting_value());
  const PlanOptions planned = plan_options_from_settings();
  resolved.buffer_bytes = options.buffer_bytes.value_or(planned.buffer_bytes_per_worker);
  resolved.pipeline_depth = options.pipeline_depth.value_or(planned.pipeline_depth);
  resolved.timeout_seconds = normalize_timeout(options.timeout_seconds.value_or(exec::timeout_setting()));
  resolved.node = options.node.value_or(static_cast<int>(*node_setting));
  if (resolved.buffer_bytes < 4096)
    throw Error(ErrorCode::kInvalidArgument, "buffer_bytes " + std::to_string(resolved.buffer_bytes) + " is below 4 KiB");
  if (resolved.pipeline_depth < 1 || resolved.pipeline_depth > 64)
    throw Error(ErrorCode::kInvalidArgument, "pipeline_depth " + std::to_string(resolved.pipeline_depth) + " is not in 1..64");
  if (options.transport) {
    resolved.transport = *options.transport;
    (void)choose_transport(true, MemoryKind::kHost, resolved.transport);  // refuses an unknown name now
  }
  return resolved;
}

Connection establish_connection(const ConnectInput& input) {
  const Roles& roles = *input.roles;
  const ResolvedOptions& options = input.options;
  const double started = local_seconds();
  const int rank = roles.world_rank, size = roles.world_size;
  Group world(input.world, roles, "the job", false);
  const auto agree = [&](const Status& mine, const std::string& what) {
    throw_if_error(world.step(mine, input.waiter, *input.faults, "connect: " + what));
  };
  const std::string who = describe_worker(roles, rank) + ": ";

  // 1. The checkpoint's tensor list, from the trainer leader (a source map with no copies carries it).
  std::vector<TensorInfo> tensors;
  {
    std::vector<std::byte> bytes;
    if (rank == roles.trainer_leader) bytes = serialize_source_map(SourceMap{*input.checkpoint_tensors, {}});
    std::uint64_t count = bytes.size();
    broadcast(&count, sizeof count, roles.trainer_leader, input, "the checkpoint's tensor list");
    bytes.resize(count);
    broadcast(bytes.data(), count, roles.trainer_leader, input, "the checkpoint's tensor list");
    tensors = deserialize_source_map(bytes).parameters;
  }

  // 2. Probe this worker's load_weights. A failure anywhere stops every rank with the failing rank's message.
  SourceMap map;
  Status probed;
  try {
    const LoadWeightsFn& load = *input.load_weights;
    map = probe_source_map(tensors, *input.params, [&load](const CheckpointReader& probe, const ParameterSet& p) {
      load(TrainersTensors(probe), p);
    });
  } catch (const Error& error) {
    probed = Status(error.code() == ErrorCode::kNotFound ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument,
                    who + "probing load_weights failed: " + error.status().message());
  } catch (const std::exception& error) {
    probed = Status(ErrorCode::kInvalidArgument, who + "load_weights threw while probed: " + error.what());
  }
  agree(probed, "probing load_weights");

  // 3. Source maps and worker configurations to everyone (rank 0 plans; the others check agreement).
  std::vector<SourceMap> maps;
  {
    const std::vector<std::vector<std::byte>> all = allgather(serialize_source_map(map), input, "the source maps");
    for (std::size_t r = 0; r < all.size(); ++r) {
      try {
        maps.push_back(deserialize_source_map(all[r]));
      } catch (const Error& e) {
        throw Error(e.code(), "source map received from " + describe_worker(roles, static_cast<int>(r)) + ": " + e.status().message());
      }
    }
  }
  if (rank == 0) report_untouched(maps, roles);
  WorkerConfig mine;
  mine.trainer = roles.trainer ? 1 : 0;
  mine.engine = roles.engine;
  mine.node_key = options.node >= 0 ? options.node : static_cast<std::int64_t>(std::hash<std::string>{}(machine_id()) >> 1) + (1LL << 32);
  mine.sender_staging = options.sender_staging;
  mine.receiver_staging = options.receiver_staging;
  mine.buffer_bytes = options.buffer_bytes;
  mine.pipeline_depth = options.pipeline_depth;
  mine.verify = options.verify;
  std::vector<WorkerConfig> configs(static_cast<std::size_t>(size));
  {
    std::vector<std::byte> bytes(sizeof mine);
    std::memcpy(bytes.data(), &mine, sizeof mine);
    const std::vector<std::vector<std::byte>> all = allgather(bytes, input, "the workers' configurations");
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (all[r].size() != sizeof(WorkerConfig)) throw Error(ErrorCode::kCorruptData, "connect: a worker configuration of " + std::to_string(all[r].size()) + " bytes");
      std::memcpy(&configs[r], all[r].data(), sizeof(WorkerConfig));
    }
  }
  Connection connection;
  {
    // One mode for the job: every trainer stages or none does, likewise every rollout; verify everywhere or nowhere.
    const WorkerConfig& first_trainer = configs[static_cast<std::size_t>(roles.trainer_leader)];
    const WorkerConfig& first_rollout = configs[static_cast<std::size_t>(roles.engine_leaders.front())];
    const auto on_off = [](std::int64_t v) { return v ? "on" : "off"; };
    for (int r = 0; r < size; ++r) {
      const WorkerConfig& c = configs[static_cast<std::size_t>(r)];
      if (c.trainer && c.sender_staging != first_trainer.sender_staging)
        throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has sender_staging " + on_off(c.sender_staging) +
                                                     " but " + describe_worker(roles, roles.trainer_leader) + " has it " +
                                                     on_off(first_trainer.sender_staging));
      if (!c.trainer && c.receiver_staging != first_rollout.receiver_staging)
        throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has receiver_staging " + on_off(c.receiver_staging) +
                                                     " but " + describe_worker(roles, roles.engine_leaders.front()) + " has it " +
                                                     on_off(first_rollout.receiver_staging));
      if (c.verify != first_trainer.verify)
        throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has verify " + on_off(c.verify) + " but " +
                                                     describe_worker(roles, roles.trainer_leader) + " has it " +
                                                     on_off(first_trainer.verify));
    }
    connection.rollouts_stage = first_rollout.receiver_staging != 0;
  }

  // 4. Rank 0: correspondence, plan, every rank's schedule.
  std::vector<std::vector<std::byte>> serialized;
  SummaryRecord summary;
  std::vector<std::int64_t> node_figures;
  Status planned;
  if (rank == 0) {
    try {
      std::vector<Side> sides;
      Topology topology;
      std::map<std::pair<std::int64_t, std::int64_t>, int> nodes;  // (node key, trainer) -> node index
      const NetworkSettings network = network_from_settings();
      topology.node_bandwidth = network.node_bandwidth;
      topology.intra_node_bandwidth = network.intra_node_bandwidth;
      topology.message_latency = network.message_latency;
      // Rank 0's planner settings (relay fan-out, memory limit); buffers and depth fit every worker's.
      PlanOptions plan_options = plan_options_from_settings();
      plan_options.buffer_bytes_per_worker = INT64_MAX;
      plan_options.pipeline_depth = 64;
      for (const WorkerConfig& c : configs) {
        sides.push_back(c.trainer ? Side::kTrainer : Side::kRollout);
        const auto key = std::make_pair(c.node_key, c.trainer);
        const auto found = nodes.emplace(key, static_cast<int>(nodes.size())).first;
        topology.node_of_worker.push_back(found->second);
        plan_options.buffer_bytes_per_worker = std::min(plan_options.buffer_bytes_per_worker, c.buffer_bytes);
        plan_options.pipeline_depth = std::min(plan_options.pipeline_depth, static_cast<int>(c.pipeline_depth));
      }
      PlannedSchedules planned_schedules = plan_round_schedules(tensors, std::move(maps), std::move(sides), topology, plan_options);
      const Correspondence& correspondence = planned_schedules.correspondence;
      const TransferPlan& plan = planned_schedules.plan;
      serialized = std::move(planned_schedules.schedules);
      summary.t_min = plan.bound.t_min_seconds;
      summary.simulated = simulate(traffic_of(correspondence, plan), plan.topology).ewtt_seconds;
      summary.workers = size;
      summary.trainer_nodes = static_cast<std::int64_t>(plan.bound.trainer_nodes.size());
      summary.rollout_nodes = static_cast<std::int64_t>(plan.bound.rollout_nodes.size());
      summary.rounds = plan.rounds;
      summary.model_bytes = plan.bound.model_bytes;
      for (const LowerBound::RolloutNode& node : plan.bound.rollout_nodes)
        summary.max_need = std::max(summary.max_need, node.need_bytes);
      for (std::int64_t bytes : plan.worker_send_bytes) summary.bytes_per_update += bytes;
      for (std::int64_t bytes : plan.node_ingress_bytes) summary.inter_node += bytes;
      // Per node: the node of every worker, then planned inter-node bytes in, out and M_v.
      const std::size_t node_count = plan.node_ingress_bytes.size();
      summary.nodes = static_cast<std::int64_t>(node_count);
      for (int node : topology.node_of_worker) node_figures.push_back(node);
      node_figures.insert(node_figures.end(), plan.node_ingress_bytes.begin(), plan.node_ingress_bytes.end());
      node_figures.insert(node_figures.end(), plan.node_egress_bytes.begin(), plan.node_egress_bytes.end());
      std::vector<std::int64_t> need(node_count, 0);
      for (const LowerBound::RolloutNode& node : plan.bound.rollout_nodes)
        if (node.node >= 0 && static_cast<std::size_t>(node.node) < node_count) need[static_cast<std::size_t>(node.node)] = node.need_bytes;
      node_figures.insert(node_figures.end(), need.begin(), need.end());
    } catch (const Error& error) {
      planned = Status(error.code(), "planning on world rank 0 failed: " + error.status().message());
    } catch (const std::exception& error) {
      planned = Status(ErrorCode::kInternal, std::string("planning on world rank 0 failed: ") + error.what());
    }
  }
  agree(planned, "planning on world rank 0");
  broadcast(&summary, sizeof summary, 0, input, "the plan's summary");
  node_figures.resize(static_cast<std::size_t>(size + 3 * summary.nodes));
  broadcast(node_figures.data(), node_figures.size() * sizeof(std::int64_t), 0, input, "the plan's per-node figures");
  RoundSchedule schedule;
  {
    // The schedules from rank 0, each rank its own: the sizes, then the bytes.
    std::vector<int> counts(static_cast<std::size_t>(size), 0), displacements(static_cast<std::size_t>(size), 0);
    std::vector<std::byte> all;
    if (rank == 0) {
      for (int r = 0; r < size; ++r) {
        const auto& one = serialized[static_cast<std::size_t>(r)];
        if (all.size() + one.size() > static_cast<std::size_t>(INT_MAX))
          throw Error(ErrorCode::kUnsupported, "connect: the round schedules take more than one MPI_Scatterv addresses");
        counts[static_cast<std::size_t>(r)] = static_cast<int>(one.size());
        displacements[static_cast<std::size_t>(r)] = static_cast<int>(all.size());
        all.insert(all.end(), one.begin(), one.end());
      }
    }
    serialized.clear();
    int count = 0;
    {
      OperationPtr op = make_operation(sizeof(int) * counts.size(), sizeof count);
      std::memcpy(op->out.data(), counts.data(), op->out.size());
      WB_CHECK_MPI(MPI_Iscatter(op->out.data(), 1, MPI_INT, op->in.data(), 1, MPI_INT, 0, input.world, &op->request));
      throw_if_error(wait_for(op, input.waiter, false, "connect: the round schedules' sizes"));
      std::memcpy(&count, op->in.data(), sizeof count);
    }
    OperationPtr op = make_operation(all.size(), static_cast<std::size_t>(count));
    std::copy(all.begin(), all.end(), op->out.begin());
    auto shape = std::make_shared<std::pair<std::vector<int>, std::vector<int>>>(counts, displacements);
    WB_CHECK_MPI(MPI_Iscatterv(op->out.data(), shape->first.data(), shape->second.data(), MPI_BYTE, op->in.data(), count,
                               MPI_BYTE, 0, input.world, &op->request));
    const Status status = wait_for(op, input.waiter, false, "connect: the round schedules");
    if (!status) {
      static std::vector<std::shared_ptr<void>>* kept = new std::vector<std::shared_ptr<void>>;
      kept->push_back(shape);  // MPI may still read them: kept with the abandoned operation
      throw Error(status);
    }
    try {
      schedule = deserialize_round_schedule(op->in);
    } catch (const Error& e) {
      throw Error(e.code(), "round schedule received by " + describe_worker(roles, rank) + ": " + e.status().message());
    }
  }

  // 5. Staging for the side that stages: the bytes of the parameters this rank's schedule packs from or
  //    assembles into, nothing else.
  const bool stages = roles.trainer ? options.sender_staging : options.receiver_staging;
  if (stages) {
    std::vector<BufferCopy> copies;
    for (const RoundPlan& round : schedule.rounds)
      for (const BufferCopy& copy : roles.trainer ? round.pack : round.assemble) copies.push_back(copy);
    connection.staging = Staging(*input.params, touched_ranges(copies, input.params->size()));
    if (roles.trainer) throw_if_error(connection.staging.copy_from(*input.params));
  }

  // 6. Buffers, registrations and transport connections, once.
  ExecutorOptions executor_options;
  executor_options.timeout_seconds = options.timeout_seconds;
  executor_options.transport = options.transport;
  executor_options.verify = options.verify;
  executor_options.trace = options.trace;
  FaultChannel* faults = input.faults;
  executor_options.interrupt = [faults](const std::function<WaitState()>& waiting) {
    if (!waiting) return faults->poll();
    faults->note_transfer_wait(waiting());  // idle: at most every millisecond
    const FaultChannel::WaitProbe probe = [&waiting] { return waiting(); };
    return faults->poll(&probe);
  };
  // At a timeout, the peers waited on are asked what they wait on, to name the rank that holds it all up.
  const double trace_seconds = std::min(1.0, 0.5 * options.timeout_seconds);
  executor_options.explain = [faults, trace_seconds](const std::vector<int>& peers) {
    faults->set_waits(peers);  // a peer tracing the same hold-up through this rank is sent on to them
    return faults->trace(peers, trace_seconds);
  };
  executor_options.describe_rank = [&roles](int r) { return describe_worker(roles, r); };
  const ParameterSet* params = input.params;
  executor_options.describe_element = [params](std::uint32_t p, std::int64_t element) {
    if (p >= params->size()) return "parameter " + std::to_string(p) + " element " + std::to_string(element);
    const Shape& shape = (*params)[p].view.shape;
    Shape index(shape.size(), 0);
    for (std::size_t a = shape.size(); a-- > 0 && shape[a] > 0;) {
      index[a] = element % shape[a];
      element /= shape[a];
    }
    return (*params)[p].name + shape_to_string(index);
  };
  connection.executor = std::make_unique<RoundExecutor>(std::move(schedule), connection.staging.memory(*input.params),
                                                        input.world, executor_options);

  TransferSummary& s = connection.summary;
  s.workers = static_cast<int>(summary.workers);
  s.trainer_nodes = static_cast<int>(summary.trainer_nodes);
  s.rollout_nodes = static_cast<int>(summary.rollout_nodes);
  s.rounds = static_cast<int>(summary.rounds);
  s.model_bytes = summary.model_bytes;
  s.max_node_need_bytes = summary.max_need;
  s.bytes_per_update = summary.bytes_per_update;
  s.inter_node_bytes = summary.inter_node;
  s.t_min_seconds = summary.t_min;
  s.simulated_seconds = summary.simulated;
  {
    const auto at = [&](std::size_t i) { return node_figures[i]; };
    const auto nodes = static_cast<std::size_t>(summary.nodes), workers = static_cast<std::size_t>(size);
    for (std::size_t r = 0; r < workers; ++r) s.node_of_worker.push_back(static_cast<int>(at(r)));
    for (std::size_t n = 0; n < nodes; ++n) {
      s.node_ingress_bytes.push_back(at(workers + n));
      s.node_egress_bytes.push_back(at(workers + nodes + n));
      s.node_need_bytes.push_back(at(workers + 2 * nodes + n));
    }
  }
  s.connect_seconds = local_seconds() - started;
  broadcast(&s.connect_seconds, sizeof s.connect_seconds, 0, input, "the final handshake");
  if (rank == 0) {
    WB_LOG(kInfo) << "connected " << size << " workers: M = " << s.model_bytes << " bytes, " << s.rounds
                  << " rounds, T_min " << s.t_min_seconds << " s on the planned topology, connect "
                  << s.connect_seconds << " s";
  }
  return connection;
}

}  // namespace wb::coord

#include "coord/connection.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <sstream>

#include "weightbridge/checks.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/log.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/probe.hpp"
#include "weightbridge/round_schedule.hpp"
#include "weightbridge/round_schedule_scatter.hpp"
#include "weightbridge/settings.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/source_map.hpp"
#include "weightbridge/source_map_exchange.hpp"
#include "weightbridge/transport.hpp"

namespace wb::coord {
namespace {

Setting<bool> sender_staging_setting("sender_staging", false,
                                     "Trainers: copy the parameters to host staging and let send_weights return "
                                     "while the transfer runs in the background.");
Setting<bool> receiver_staging_setting("receiver_staging", false,
                                       "Rollouts: receive into host staging while generating, install at one step.");
Setting<double> timeout_setting("timeout_seconds", 120.0,
                                "Deadline of every wait of the coordinator and the executor, in seconds.");
Setting<std::int64_t> node_setting("node", -1,
                                   "This worker's node for the planner; -1: its machine (trainers and rollouts "
                                   "of one machine count as different nodes).");

// What each worker tells rank 0 about itself, besides its source map.
struct WorkerConfig {
  std::int64_t trainer = 0, engine = -1, node_key = 0, sender_staging = 0, receiver_staging = 0, buffer_bytes = 0,
               pipeline_depth = 0;
};
constexpr int kConfigFields = 7;

// The plan's figures, broadcast from rank 0.
struct SummaryRecord {
  double t_min = 0, simulated = 0;
  std::int64_t workers = 0, trainer_nodes = 0, rollout_nodes = 0, rounds = 0, model_bytes = 0, max_need = 0,
               bytes_per_update = 0, inter_node = 0, nodes = 0;
};

void broadcast(void* data, int bytes, int root, MPI_Comm comm, double timeout, const std::string& what) {
  MPI_Request request = MPI_REQUEST_NULL;
  WB_CHECK_MPI(MPI_Ibcast(data, bytes, MPI_BYTE, root, comm, &request));
  throw_if_error(wait_for(request, timeout, what));
}

std::string worker_prefix(const Roles& roles) { return describe_worker(roles, roles.world_rank) + ": "; }

}  // namespace

std::string seconds_text(double seconds) {
  std::ostringstream out;
  out << seconds << " s";
  return out.str();
}

std::string describe_worker(const Roles& roles, int world_rank) {
  const int engine = roles.engine_of_rank.empty() ? -1 : roles.engine_of_rank[static_cast<std::size_t>(world_rank)];
  if (engine < 0) return "trainer (world rank " + std::to_string(world_rank) + ")";
  return "rollout engine " + std::to_string(engine) + " (world rank " + std::to_string(world_rank) + ")";
}

ResolvedOptions resolve_options(const AdapterOptions& options) {
  ResolvedOptions resolved;
  resolved.sender_staging = options.sender_staging.value_or(*sender_staging_setting);
  resolved.receiver_staging = options.receiver_staging.value_or(*receiver_staging_setting);
  const PlanOptions planned = plan_options_from_settings();
  resolved.buffer_bytes = options.buffer_bytes.value_or(planned.buffer_bytes_per_worker);
  resolved.pipeline_depth = options.pipeline_depth.value_or(planned.pipeline_depth);
  resolved.timeout_seconds = options.timeout_seconds.value_or(*timeout_setting);
  resolved.node = options.node.value_or(static_cast<int>(*node_setting));
  if (resolved.buffer_bytes < 4096)
    throw Error(ErrorCode::kInvalidArgument, "buffer_bytes " + std::to_string(resolved.buffer_bytes) + " is below 4 KiB");
  if (resolved.pipeline_depth < 1 || resolved.pipeline_depth > 64)
    throw Error(ErrorCode::kInvalidArgument, "pipeline_depth " + std::to_string(resolved.pipeline_depth) + " is not in 1..64");
  if (!(resolved.timeout_seconds > 0))
    throw Error(ErrorCode::kInvalidArgument, "timeout_seconds must be positive");
  if (options.transport) {
    resolved.transport = *options.transport;
    (void)choose_transport(true, MemoryKind::kHost, resolved.transport);  // refuses an unknown name now
  }
  return resolved;
}

void Staging::Free::operator()(std::byte* p) const { std::free(p); }

Staging::Staging(const ParameterSet& params, const std::vector<bool>& used) {
  copies_.resize(params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    if (!used[p]) continue;
    const std::size_t bytes = params[p].view.nbytes();
    const std::size_t rounded = std::max<std::size_t>(64, (bytes + 63) / 64 * 64);
    copies_[p].reset(static_cast<std::byte*>(std::aligned_alloc(64, rounded)));
    if (!copies_[p]) throw Error(ErrorCode::kSystem, "cannot allocate " + std::to_string(bytes) + " bytes of staging");
    std::memcpy(copies_[p].get(), params[p].view.data, bytes);
    bytes_ += static_cast<std::int64_t>(bytes);
  }
}

void Staging::copy_from(const ParameterSet& params) const {
  for (std::size_t p = 0; p < copies_.size(); ++p)
    if (copies_[p]) std::memcpy(copies_[p].get(), params[p].view.data, params[p].view.nbytes());
}

void Staging::copy_to(const ParameterSet& params) const {
  for (std::size_t p = 0; p < copies_.size(); ++p)
    if (copies_[p]) std::memcpy(params[p].view.data, copies_[p].get(), params[p].view.nbytes());
}

ParameterMemory Staging::memory(const ParameterSet& params) const {
  ParameterMemory memory;
  for (std::size_t p = 0; p < params.size(); ++p) {
    const bool staged = p < copies_.size() && copies_[p];
    memory.data.push_back(staged ? copies_[p].get() : static_cast<std::byte*>(params[p].view.data));
    memory.bytes.push_back(params[p].view.nbytes());
  }
  return memory;
}

Connection establish_connection(const ConnectInput& input) {
  const Roles& roles = *input.roles;
  const ResolvedOptions& options = input.options;
  const double timeout = options.timeout_seconds;
  const double started = local_seconds();
  MPI_Comm world = input.world;
  const int rank = roles.world_rank, size = roles.world_size;

  // 1. The checkpoint's tensor list, from the trainer leader (a source map with no copies carries it).
  std::vector<TensorInfo> tensors;
  {
    std::vector<std::byte> bytes;
    if (rank == roles.trainer_leader) bytes = serialize_source_map(SourceMap{*input.checkpoint_tensors, {}});
    std::uint64_t count = bytes.size();
    broadcast(&count, sizeof count, roles.trainer_leader, world, timeout, "connect: the checkpoint's tensor list");
    bytes.resize(count);
    broadcast(bytes.data(), static_cast<int>(count), roles.trainer_leader, world, timeout,
              "connect: the checkpoint's tensor list");
    tensors = deserialize_source_map(bytes).parameters;
  }

  // 2. Probe this worker's load_weights. A failure anywhere stops every rank with the failing rank's message.
  SourceMap map;
  Status probed;
  try {
    map = probe_source_map(tensors, *input.params, *input.load_weights);
  } catch (const std::exception& error) {
    probed = Status(ErrorCode::kInvalidArgument, worker_prefix(roles) + "probing load_weights failed: " + error.what());
  }
  throw_if_error(agree(probed, world, timeout, "connect: probing load_weights"));

  // 3. Source maps and worker configurations to everyone (rank 0 plans; the others check agreement).
  std::vector<SourceMap> maps = allgather_source_maps(map, world);
  WorkerConfig mine;
  mine.trainer = roles.trainer ? 1 : 0;
  mine.engine = roles.engine;
  mine.node_key = options.node >= 0 ? options.node : static_cast<std::int64_t>(std::hash<std::string>{}(machine_id()) >> 1) + (1LL << 32);
  mine.sender_staging = options.sender_staging;
  mine.receiver_staging = options.receiver_staging;
  mine.buffer_bytes = options.buffer_bytes;
  mine.pipeline_depth = options.pipeline_depth;
  std::vector<WorkerConfig> configs(static_cast<std::size_t>(size));
  WB_CHECK_MPI(MPI_Allgather(&mine, kConfigFields, MPI_INT64_T, configs.data(), kConfigFields, MPI_INT64_T, world));
  Connection connection;
  {
    // One mode for the job: every trainer stages or none does, likewise every rollout.
    const WorkerConfig& first_trainer = configs[static_cast<std::size_t>(roles.trainer_leader)];
    const WorkerConfig& first_rollout = configs[static_cast<std::size_t>(roles.engine_leaders.front())];
    for (int r = 0; r < size; ++r) {
      const WorkerConfig& c = configs[static_cast<std::size_t>(r)];
      if (c.trainer && c.sender_staging != first_trainer.sender_staging)
        throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has sender_staging " +
                                                     (c.sender_staging ? "on" : "off") + " but trainer rank 0 has it " +
                                                     (first_trainer.sender_staging ? "on" : "off"));
      if (!c.trainer && c.receiver_staging != first_rollout.receiver_staging)
        throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has receiver_staging " +
                                                     (c.receiver_staging ? "on" : "off") + " but " +
                                                     describe_worker(roles, roles.engine_leaders.front()) + " has it " +
                                                     (first_rollout.receiver_staging ? "on" : "off"));
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
      PlanOptions plan_options;
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
      const Correspondence correspondence = build_correspondence(tensors, std::move(maps), std::move(sides));
      const TransferPlan plan = plan_transfer(correspondence, topology, plan_options);
      const RoundScheduleBuilder builder(correspondence, plan);
      for (int r = 0; r < size; ++r) serialized.push_back(serialize_round_schedule(builder.build(r)));
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
    } catch (const std::exception& error) {
      planned = Status(ErrorCode::kInvalidArgument, std::string("planning on world rank 0 failed: ") + error.what());
    }
  }
  throw_if_error(agree(planned, world, timeout, "connect: planning on world rank 0"));
  broadcast(&summary, sizeof summary, 0, world, timeout, "connect: the plan's summary");
  node_figures.resize(static_cast<std::size_t>(size + 3 * summary.nodes));
  broadcast(node_figures.data(), static_cast<int>(node_figures.size() * sizeof(std::int64_t)), 0, world, timeout,
            "connect: the plan's per-node figures");
  RoundSchedule schedule = scatter_round_schedules(serialized, 0, world);
  serialized.clear();

  // 5. Staging for the side that stages: the parameters this rank's schedule packs or assembles.
  const bool stages = roles.trainer ? options.sender_staging : options.receiver_staging;
  if (stages) {
    std::vector<bool> used(input.params->size(), false);
    for (const RoundPlan& round : schedule.rounds)
      for (const BufferCopy& copy : roles.trainer ? round.pack : round.assemble)
        if (copy.copy.parameter < used.size()) used[copy.copy.parameter] = true;
    connection.staging = Staging(*input.params, used);
  }

  // 6. Buffers, registrations and transport connections, once.
  ExecutorOptions executor_options;
  executor_options.timeout_seconds = timeout;
  executor_options.transport = options.transport;
  connection.executor = std::make_unique<RoundExecutor>(std::move(schedule), connection.staging.memory(*input.params),
                                                        world, executor_options);

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
  broadcast(&s.connect_seconds, sizeof s.connect_seconds, 0, world, timeout, "connect: the final handshake");
  if (rank == 0) {
    WB_LOG(kInfo) << "connected " << size << " workers: M = " << s.model_bytes << " bytes, " << s.rounds
                  << " rounds, T_min " << s.t_min_seconds << " s on the planned topology, connect "
                  << s.connect_seconds << " s";
  }
  return connection;
}

}  // namespace wb::coord

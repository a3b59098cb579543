#include "coord/connection.hpp"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string_view>

#include "comm/collectives.hpp"
#include "comm/interrupt.hpp"
#include "coord/connect_records.hpp"
#include "coord/element_accounting.hpp"
#include "core/byte_codec.hpp"
#include "core/checks.hpp"
#include "core/laps.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "layout/form_union.hpp"
#include "layout/probe.hpp"
#include "layout/source_map_exchange.hpp"
#include "plan/planned_schedules.hpp"
#include "plan/round_schedule.hpp"
#include "plan/round_schedule_scatter.hpp"
#include "transport/transport.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
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

Setting<std::string> join_address_setting("join_address", "",
                                          "Engines as jobs of their own: the address file the trainers publish their "
                                          "port in, and that a joining engine reads; empty: no joins.");

// One connect: its input, and how its collectives wait and speak (the adapters' deadline and fault
// channel; "connect: " before every message; ranks named by their role).
struct Connect {
  const ConnectInput& in;
  const Roles& roles;
  const ResolvedOptions& options;
  comm::Call call;
  int rank = 0, size = 1;

  explicit Connect(const ConnectInput& input)
      : in(input), roles(*input.roles), options(input.options), rank(roles.world_rank), size(roles.world_size) {
    call.waiter = input.waiter;
    call.context = "connect: ";
    const Roles* named = input.roles;
    call.name_rank = [named](int r) { return describe_worker(*named, r); };
  }
  std::string who() const { return describe_worker(roles, rank) + ": "; }
  /// What this rank is doing, for the answers to peers' queries while it waits.
  void doing(const std::string& what) const { in.faults->set_activity(0, "connect: " + what); }
};

// The checkpoint a probe pass offers, with one more check: a name the trainers' tensor list lacks is
// reported in those words (the probe checkpoint itself only knows the list it was given).
class TrainersTensors final : public CheckpointReader {
 public:
  explicit TrainersTensors(const CheckpointReader& probe) : probe_(probe) {}
  const std::vector<TensorInfo>& tensors() const override { return probe_.tensors(); }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    // One lookup per read (the probe checkpoint's own): an unknown name is its only kNotFound.
    try {
      probe_.read_box(name, box, destination);
    } catch (const Error& error) {
      if (error.code() != ErrorCode::kNotFound) throw;
      throw Error(ErrorCode::kNotFound, "load_weights reads tensor '" + std::string(name) +
                                            "', which the trainers' tensor list (checkpoint_tensors, " +
                                            std::to_string(probe_.tensors().size()) +
                                            " tensors, given to SenderAdapter) does not have");
    }
  }
  std::string source() const override { return "the trainers' checkpoint_tensors (" + probe_.source() + ")"; }
  bool wraps(const CheckpointReader& probe) const { return &probe == &probe_; }

 private:
  const CheckpointReader& probe_;
};

// The checkpoint's tensor list, from the trainer leader (a source map with no copies carries it).
std::vector<TensorInfo> share_tensor_list(const Connect& c) {
  c.doing("the checkpoint's tensor list");
  std::vector<std::byte> bytes;
  if (c.rank == c.roles.trainer_leader) bytes = serialize_source_map(SourceMap{*c.in.checkpoint_tensors, {}});
  bytes = comm::broadcast(std::move(bytes), c.roles.trainer_leader, c.in.world, c.call.waiter,
                          c.call.context + "the checkpoint's tensor list");
  return deserialize_source_map(bytes).parameters;
}

// The forms the engines load: each rollout rank says which (its FP8 config, or the checkpoint's own form)
// in one all-gather. An engine's workers load their leader's form, and the FP8 engines of a job one FP8
// config; BF16 and FP8 engines may mix (`mixed`). `form`: the FP8 form, when some engine loads it.
Status share_forms(const Connect& c, const std::vector<TensorInfo>& tensors, std::optional<layout::Fp8Form>& form,
                   bool& mixed) {
  c.doing("the forms the engines load");
  if (c.roles.engine_leaders.empty()) return Status::ok();  // a trainer job with no engine yet
  const auto describe = [](const std::optional<layout::QuantizationConfig>& q) {
    return q ? "the FP8 form (" + q->to_string() + ")" : std::string("the checkpoint's own form");
  };
  std::string mine;
  if (!c.roles.trainer) mine = c.options.fp8 ? "fp8\n" + layout::encode_quantization_config(*c.options.fp8) : "own";
  const auto all = comm::allgather(std::as_bytes(std::span(mine.data(), mine.size())), c.in.world, c.call.waiter,
                                   c.call.context + "the forms the engines load");
  try {
    std::vector<std::optional<layout::QuantizationConfig>> loads(all.size());
    for (std::size_t r = 0; r < all.size(); ++r) {
      const std::string_view text(reinterpret_cast<const char*>(all[r].data()), all[r].size());
      if (text.starts_with("fp8\n")) loads[r] = layout::decode_quantization_config(text.substr(4));
    }
    int fp8_leader = -1;
    bool own = false;
    for (std::size_t r = 0; r < all.size(); ++r) {
      if (c.roles.engine_of_rank[r] < 0) continue;
      const int leader = c.roles.engines[static_cast<std::size_t>(c.roles.engine_of_rank[r])].front();
      const int rank = static_cast<int>(r);
      if (loads[r] != loads[static_cast<std::size_t>(leader)])
        return Status(ErrorCode::kInvalidArgument, c.who() + describe_worker(c.roles, rank) + " loads " + describe(loads[r]) +
                                                       " but its leader " + describe_worker(c.roles, leader) + " loads " +
                                                       describe(loads[static_cast<std::size_t>(leader)]) +
                                                       ": every worker of an engine loads one form");
      if (!loads[r]) {
        own = true;
      } else if (fp8_leader < 0) {
        fp8_leader = rank;
      } else if (loads[r] != loads[static_cast<std::size_t>(fp8_leader)]) {
        return Status(ErrorCode::kInvalidArgument, c.who() + describe_worker(c.roles, rank) + " loads " + describe(loads[r]) +
                                                       " but " + describe_worker(c.roles, fp8_leader) + " loads " +
                                                       describe(loads[static_cast<std::size_t>(fp8_leader)]) +
                                                       ": the FP8 engines of a job load one FP8 form (BF16 engines may join them)");
      }
    }
    if (fp8_leader >= 0) form = layout::derive_fp8_form(tensors, *loads[static_cast<std::size_t>(fp8_leader)]);
    mixed = form && own;
  } catch (const Error& error) {
    return Status(error.code(), c.who() + error.status().message());
  }
  return Status::ok();
}

// Trainers, for FP8 engines: the quantizing pack of this trainer's map (its map then in the form's
// coordinates, or the union's in a mixed fleet), or why not.
Status make_quantized_pack(const Connect& c, const layout::Fp8Form& form, const layout::FormUnion* united, SourceMap& map,
                           std::unique_ptr<exec::QuantizedPack>& quantized) {
  try {
    quantized = std::make_unique<exec::QuantizedPack>(map, form);
    // Normalized, as the probe leaves every other map: the pack's copies coalesced, so that the planner
    // works in as few atoms as for a BF16 trainer (and wb-plan, describing the trainer, plans the same).
    map = normalize_source_map(united ? layout::trainer_map_in_union(map, quantized->form_map(), form, *united)
                                      : quantized->form_map());
  } catch (const Error& error) {
    return Status(ErrorCode::kInvalidArgument, c.who() + error.status().message());
  }
  return Status::ok();
}

// The blocks trainers hold in part, the union on every trainer (one all-gather of connect; the rollouts
// give none): the blocks of every update's amax exchange. Returns how many, on every rank.
std::int64_t share_partial_blocks(const Connect& c, exec::QuantizedPack* quantized) {
  c.doing("the FP8 blocks the trainers share");
  codec::ByteWriter writer;
  if (quantized)
    for (const exec::BlockKey& key : quantized->partial_blocks()) {
      writer.varint(key.tensor);
      writer.varint(static_cast<std::uint64_t>(key.block));
    }
  const auto all = comm::allgather(writer.take(), c.in.world, c.call.waiter, c.call.context + "the FP8 blocks the trainers share");
  std::vector<exec::BlockKey> shared;
  for (const std::vector<std::byte>& bytes : all) {
    codec::ByteReader reader(bytes, "the FP8 blocks the trainers share");
    while (!reader.done()) {
      exec::BlockKey key;
      key.tensor = static_cast<std::uint32_t>(reader.varint());
      key.block = static_cast<std::int64_t>(reader.varint());
      shared.push_back(key);
    }
  }
  std::sort(shared.begin(), shared.end());
  shared.erase(std::unique(shared.begin(), shared.end()), shared.end());
  const auto count = static_cast<std::int64_t>(shared.size());
  if (quantized) quantized->set_shared_blocks(std::move(shared));
  if (c.rank == c.roles.trainer_leader) {
    WB_LOG(kInfo) << "FP8 engines: " << count << " blocks split between trainers, " << 4 * count
                  << " control bytes per trainer per update for their amaxes";
  }
  return count;
}

// This worker's load_weights, probed: its source map, or why not (which every rank then throws).
Status probe_worker(const Connect& c, const std::vector<TensorInfo>& tensors, SourceMap& map) {
  c.doing("probing load_weights");
  return probe_load_weights(tensors, *c.in.params, *c.in.load_weights, c.options.not_loaded, !c.roles.trainer, c.who(), map);
}

// An FP8 engine: every element of a quantized tensor its load_weights takes comes with its block's scale.
Status check_scales_loaded(const Connect& c, const layout::Fp8Form& form, const SourceMap& map) {
  const std::string missing = layout::blocks_without_scales(form, map);
  if (missing.empty()) return Status::ok();
  return Status(ErrorCode::kInvalidArgument, c.who() + "its FP8 load_weights does not follow its block scales: " + missing);
}

// An FP8 engine whose probe failed: the weights its form left as they were for their dtype, which an fp8
// parameter cannot be loaded from.
Status with_fp8_hint(const layout::Fp8Form& form, const Status& failed) {
  const std::vector<std::string> left = layout::left_unquantized_by_dtype(form);
  if (left.empty()) return failed;
  std::string names;
  for (std::size_t i = 0; i < left.size() && i < 4; ++i) names += (i ? ", " : "") + left[i];
  if (left.size() > 4) names += " and " + std::to_string(left.size() - 4) + " more";
  return Status(failed.code(), failed.message() + " (if it asks for FP8 of a tensor the trainers hold in a type that is "
                                                  "not floating: the FP8 form leaves " + names +
                                                  " as they are; only bf16, f16, f32 and f64 weights are quantized)");
}

// Every worker's configuration on every rank (rank 0 plans with them; the others check agreement).
std::vector<WorkerConfig> gather_worker_configs(const Connect& c) {
  c.doing("the workers' configurations");
  const ResolvedOptions& options = c.options;
  WorkerConfig mine;
  mine.trainer = c.roles.trainer;
  mine.engine = c.roles.engine;
  mine.node_key = options.node >= 0 ? options.node : static_cast<std::int64_t>(std::hash<std::string>{}(machine_id()) >> 1) + (1LL << 32);
  mine.sender_staging = options.sender_staging;
  mine.receiver_staging = options.receiver_staging;
  mine.buffer_bytes = options.buffer_bytes;
  mine.pipeline_depth = options.pipeline_depth;
  mine.verify = options.verify;
  const std::vector<std::vector<std::byte>> all =
      comm::allgather(encode_worker_config(mine), c.in.world, c.call.waiter, c.call.context + "the workers' configurations");
  std::vector<WorkerConfig> configs;
  for (std::size_t r = 0; r < all.size(); ++r) {
    try {
      configs.push_back(decode_worker_config(all[r]));
    } catch (const Error& e) {
      throw Error(e.code(), c.call.context + "the configuration of " + c.call.rank_name(static_cast<int>(r)) + ": " +
                                e.status().message());
    }
  }
  return configs;
}

// The one mode of the job: every trainer stages or none does, likewise every rollout; verify everywhere or
// nowhere. Every rank has every configuration, so every rank refuses alike. Returns whether the rollouts stage.
bool check_one_mode(const Connect& c, const std::vector<WorkerConfig>& configs) {
  const Roles& roles = c.roles;
  const int size = c.size;
  const WorkerConfig& first_trainer = configs[static_cast<std::size_t>(roles.trainer_leader)];
  if (roles.engine_leaders.empty()) {
    for (int r = 0; r < size; ++r)
      if (configs[static_cast<std::size_t>(r)].verify != first_trainer.verify)
        throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " and " +
                                                     describe_worker(roles, roles.trainer_leader) + " disagree on verify");
    return false;
  }
  const WorkerConfig& first_rollout = configs[static_cast<std::size_t>(roles.engine_leaders.front())];
  const auto on_off = [](bool v) { return v ? "on" : "off"; };
  for (int r = 0; r < size; ++r) {
    const WorkerConfig& w = configs[static_cast<std::size_t>(r)];
    if (w.trainer && w.sender_staging != first_trainer.sender_staging)
      throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has sender_staging " + on_off(w.sender_staging) +
                                                   " but " + describe_worker(roles, roles.trainer_leader) + " has it " +
                                                   on_off(first_trainer.sender_staging));
    if (!w.trainer && w.receiver_staging != first_rollout.receiver_staging)
      throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has receiver_staging " + on_off(w.receiver_staging) +
                                                   " but " + describe_worker(roles, roles.engine_leaders.front()) + " has it " +
                                                   on_off(first_rollout.receiver_staging));
    if (w.verify != first_trainer.verify)
      throw Error(ErrorCode::kInvalidArgument, describe_worker(roles, r) + " has verify " + on_off(w.verify) + " but " +
                                                   describe_worker(roles, roles.trainer_leader) + " has it " +
                                                   on_off(first_trainer.verify));
  }
  return first_rollout.receiver_staging;
}

// What rank 0 plans: every rank's serialized schedule and the summary, or why it could not.
struct Planned {
  std::vector<std::vector<std::byte>> schedules;  // per world rank
  TransferSummary summary;
  Status status;
};

// World rank 0: correspondence, plan, every rank's schedule, and the plan's figures. The network model's
// EWTT is the planner's own simulation of the plan it chose (it simulates candidates to choose), not a
// simulation run again for the figure; 0 where it simulated none (a relay fan-out given by WB_RELAY_FAN_OUT):
// wb-plan simulates any plan.
Planned plan_on_rank_zero(const Connect& c, const std::vector<TensorInfo>& tensors, std::vector<SourceMap> maps,
                          const std::vector<WorkerConfig>& configs) {
  Planned out;
  if (c.rank != 0) return out;
  c.doing("planning on world rank 0");
  const int size = c.size;
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
    for (const WorkerConfig& w : configs) {
      sides.push_back(w.trainer ? Side::kTrainer : Side::kRollout);
      const auto key = std::make_pair(w.node_key, static_cast<std::int64_t>(w.trainer));
      const auto found = nodes.emplace(key, static_cast<int>(nodes.size())).first;
      topology.node_of_worker.push_back(found->second);
      plan_options.buffer_bytes_per_worker = std::min(plan_options.buffer_bytes_per_worker, w.buffer_bytes);
      plan_options.pipeline_depth = std::min(plan_options.pipeline_depth, w.pipeline_depth);
    }
    PlannedSchedules planned_schedules = plan_round_schedules(tensors, std::move(maps), std::move(sides), topology, plan_options);
    const TransferPlan& plan = planned_schedules.plan;
    out.schedules = std::move(planned_schedules.schedules);
    TransferSummary& s = out.summary;
    s.workers = size;
    s.trainer_nodes = static_cast<int>(plan.bound.trainer_nodes.size());
    s.rollout_nodes = static_cast<int>(plan.bound.rollout_nodes.size());
    s.rounds = plan.rounds;
    s.model_bytes = plan.bound.model_bytes;
    for (const LowerBound::RolloutNode& node : plan.bound.rollout_nodes)
      s.max_node_need_bytes = std::max(s.max_node_need_bytes, node.need_bytes);
    for (std::int64_t bytes : plan.worker_send_bytes) s.bytes_per_update += bytes;
    for (std::int64_t bytes : plan.node_ingress_bytes) s.inter_node_bytes += bytes;
    s.t_min_seconds = plan.bound.t_min_seconds;
    for (const ExchangeCandidate& candidate : plan.candidates)
      if (candidate.chosen) s.simulated_seconds = candidate.simulated_seconds;
    // Per node: planned inter-node bytes in, out, and M_v.
    s.node_of_worker = topology.node_of_worker;
    s.node_ingress_bytes = plan.node_ingress_bytes;
    s.node_egress_bytes = plan.node_egress_bytes;
    s.node_need_bytes.assign(plan.node_ingress_bytes.size(), 0);
    for (const LowerBound::RolloutNode& node : plan.bound.rollout_nodes)
      if (node.node >= 0 && static_cast<std::size_t>(node.node) < s.node_need_bytes.size())
        s.node_need_bytes[static_cast<std::size_t>(node.node)] = node.need_bytes;
  } catch (const Error& error) {
    out.status = Status(error.code(), "planning on world rank 0 failed: " + error.status().message());
  } catch (const std::exception& error) {
    out.status = Status(ErrorCode::kInternal, std::string("planning on world rank 0 failed: ") + error.what());
  }
  return out;
}

// Rank 0's schedules, each rank its own: a planning failure reaches every rank at once.
RoundSchedule deliver_schedules(const Connect& c, Planned& planned) {
  c.doing("the round schedules");
  RoundSchedule schedule = scatter_round_schedules(planned.schedules, 0, c.in.world, c.call, planned.status);
  planned.schedules.clear();
  return schedule;
}

// The plan's figures, from rank 0 to every rank.
TransferSummary share_summary(const Connect& c, const Planned& planned) {
  c.doing("the plan's summary");
  const std::vector<std::byte> bytes = comm::broadcast(c.rank == 0 ? encode_summary(planned.summary) : std::vector<std::byte>{},
                                                       0, c.in.world, c.call.waiter, c.call.context + "the plan's summary");
  return decode_summary(bytes);
}

// Trainers sending FP8: whether the rounds' packs cast the codes straight from the parameters instead of
// packing shadows quantized before or, sender-staged, by their rounds: host parameters read in place (before
// send_weights returns), not verified (the verifier digests the shadows it packs).
bool casts_in_pack(const ResolvedOptions& options, const ParameterSet& params) {
  const bool host = params.empty() || params[0].view.memory == MemoryKind::kHost;
  return !options.verify && host && !options.sender_staging;
}

// Staging for the side that stages: the bytes of the parameters this rank's schedule packs from or
// assembles into, nothing else (a trainer's: coord::stage_for_sending).
Staging stage_parameters(const Connect& c, const RoundSchedule& schedule, exec::QuantizedPack* quantized) {
  const ResolvedOptions& options = c.options;
  const Staging* share = c.in.share_staging;
  if (c.roles.trainer) return options.sender_staging ? stage_for_sending(*c.in.params, schedule, quantized, c.in.stage_whole, share) : Staging();
  Staging staging;
  if (stages(options, false)) {
    const std::size_t parameters = c.in.params->size();
    std::vector<BufferCopy> copies;
    for (const RoundPlan& round : schedule.rounds)
      for (const BufferCopy& copy : round.assemble)
        if (copy.copy.parameter < parameters) copies.push_back(copy);
    staging = Staging(*c.in.params, touched_ranges(copies, parameters), share);
    // Every staged page touched now, at connect: the first update's assembles would otherwise take the
    // page faults (measured at 4 replicas, 8 workers of 104 MB on 2 cores: that update 6 s, the next ones 2 s).
    staging.touch_at_connect(*c.in.params, share);
  }
  return staging;
}

// Buffers, registrations and transport connections, once; the executor's waits serve the fault channel
// and name ranks by their role.
std::unique_ptr<RoundExecutor> connect_executor(const Connect& c, RoundSchedule schedule, const Staging& staging,
                                               exec::QuantizedPack* quantized) {
  c.doing("connecting the transports");
  const Roles& roles = c.roles;
  const ResolvedOptions& options = c.options;
  ExecutorOptions executor_options;
  executor_options.timeout_seconds = options.timeout_seconds;
  executor_options.transport = options.transport;
  executor_options.verify = options.verify;
  executor_options.trace = options.trace;
  executor_options.enter_together = c.in.enter_together;
  executor_options.spares = c.in.spares;
  executor_options.reuse_buffers = c.in.reuse_buffers;
  FaultChannel* faults = c.in.faults;
  executor_options.interrupt = [faults, &roles](const std::function<WaitState()>& waiting) {
    if (Status stop = comm::poll_interrupt(); !stop)  // the caller's Ctrl-C, on its own thread
      return Status(stop.code(), describe_worker(roles, roles.world_rank) + ": " + stop.message());
    if (!waiting) return faults->poll();
    faults->note_transfer_wait(waiting());  // idle: at most every millisecond
    const FaultChannel::WaitProbe probe = [&waiting] { return waiting(); };
    return faults->poll(&probe);
  };
  // At a timeout, the peers waited on are asked what they wait on, to name the rank that holds it all up
  // (in the deadline's last trace_seconds).
  const double trace_seconds = std::min(1.0, 0.5 * options.timeout_seconds);
  executor_options.explain_seconds = trace_seconds;
  executor_options.explain = [faults, trace_seconds](const std::vector<int>& peers) {
    faults->set_waits(peers);  // a peer tracing the same hold-up through this rank is sent on to them
    return faults->trace(peers, trace_seconds);
  };
  executor_options.describe_rank = [&roles](int r) { return describe_worker(roles, r); };
  const ParameterSet* params = c.in.params;
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
  ParameterMemory memory = staging.memory(*c.in.params);
  if (quantized) {  // the shadow and scale buffers the FP8 pack fills, after the trainer's parameters
    if (memory.memory != MemoryKind::kHost) {
      try {
        quantized->use_device(memory.device);  // on the parameters' device, by the CUDA kernels
      } catch (const Error& error) {
        throw Error(error.code(), c.who() + error.status().message());
      }
    } else if (casts_in_pack(options, *c.in.params)) {
      // The rounds read the trainer's own parameters before send_weights returns: they cast the codes
      // straight into the send buffer. Staged, the shadows are the staged copy (half its bytes), quantized
      // by rounds; verified, the verifier's programs digest the shadows they pack.
      quantized->cast_in_pack();
    }
    quantized->extend_memory(memory);
  }
  return std::make_unique<RoundExecutor>(std::move(schedule), std::move(memory), c.in.world, executor_options);
}

// A trainer job with no engine yet: its load_weights was probed (a bad one fails now, not when the first
// engine joins) and nothing is planned: there is nobody to send to. No executor; updates go to nobody.
Connection connect_without_engines(const Connect& c, Connection connection, double started) {
  TransferSummary& s = connection.summary;
  s.workers = c.size;
  s.connect_seconds = comm::local_seconds() - started;
  comm::broadcast_fixed(std::as_writable_bytes(std::span(&s.connect_seconds, 1)), 0, c.in.world, c.call.waiter,
                        "connect: the final handshake");
  if (c.rank == 0) {
    WB_LOG(kInfo) << "connected " << c.size << " trainers and no engine: updates go to nobody";
  }
  return connection;
}

}  // namespace

namespace {

ResolvedOptions resolve_options_of_this_rank(const AdapterOptions& options) {
  ResolvedOptions resolved;
  resolved.sender_staging = options.sender_staging.value_or(*sender_staging_setting);
  resolved.receiver_staging = options.receiver_staging.value_or(*receiver_staging_setting);
  resolved.verify = options.verify.value_or(exec::verify_setting_value());
  resolved.trace = options.trace.value_or(exec::timeline_setting_value());
  const PlanOptions planned = plan_options_from_settings();
  resolved.buffer_bytes = options.buffer_bytes.value_or(planned.buffer_bytes_per_worker);
  resolved.pipeline_depth = options.pipeline_depth.value_or(planned.pipeline_depth);
  resolved.timeout_seconds = comm::normalize_timeout(options.timeout_seconds.value_or(comm::timeout_setting()));
  resolved.node = options.node.value_or(static_cast<int>(*node_setting));
  if (resolved.node < -1)
    throw Error(ErrorCode::kInvalidArgument,
                "node " + std::to_string(resolved.node) + " is not in [-1, " + std::to_string(INT_MAX) + "] (-1: this machine)");
  resolved.not_loaded = options.not_loaded;
  resolved.join_address = options.join_address.value_or(*join_address_setting);
  if (options.fp8) {
    layout::QuantizationConfig q;
    q.block_rows = options.fp8->block_rows;
    q.block_cols = options.fp8->block_cols;
    if (q.block_rows <= 0 || q.block_cols <= 0)
      throw Error(ErrorCode::kInvalidArgument, "fp8: block shape " + std::to_string(q.block_rows) + "x" +
                                                   std::to_string(q.block_cols) + " is not positive");
    q.rule = layout::parse_scale_rule_or_throw(options.fp8->scale_rule, "fp8.scale_rule");
    q.modules_to_not_convert = options.fp8->modules_to_not_convert;
    q.ignored_layers = options.fp8->ignored_layers;
    resolved.fp8 = std::move(q);
  }
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

}  // namespace

ResolvedOptions resolve_options(const AdapterOptions& options) {
  try {
    return resolve_options_of_this_rank(options);
  } catch (const Error& error) {
    // Thrown on this rank only (its peers then time out waiting for its adapter): say which rank it is.
    throw Error(error.code(), "world rank " + std::to_string(process_rank()) + ": adapter options: " + error.status().message());
  }
}

Connection establish_connection(const ConnectInput& input) {
  const double started = comm::local_seconds();
  Laps laps;
  const Connect c(input);
  const std::vector<TensorInfo> tensors = share_tensor_list(c);
  laps("tensor list");
  std::optional<layout::Fp8Form> form;
  bool mixed = false;
  Status probed = share_forms(c, tensors, form, mixed);
  // An FP8 engine probes its own loader against its own form; the trainers and BF16 engines against the
  // checkpoint. A mixed fleet plans in the union of both forms (layout/form_union.hpp).
  const bool fp8_engine = form && !c.roles.trainer && c.options.fp8;
  std::optional<layout::FormUnion> united;
  if (mixed) united = layout::unite_forms(*form);
  SourceMap map;
  double own_probe = 0;  // this worker's probe: none where its map is kept (a re-link)
  if (probed && input.probed) {
    map = *input.probed;
  } else if (probed) {
    const double began = comm::local_seconds();
    probed = probe_worker(c, fp8_engine ? form->tensors : tensors, map);
    own_probe = comm::local_seconds() - began;
  }
  if (fp8_engine) probed = probed ? check_scales_loaded(c, *form, map) : with_fp8_hint(*form, probed);
  Connection connection;
  if (probed) connection.probed = map;  // in the form this worker loads (before a mixed fleet's union)
  connection.tensors = fp8_engine ? form->tensors : tensors;
  if (probed && fp8_engine && united) map = layout::fp8_map_in_union(std::move(map), *united);
  laps("forms and probe");
  std::unique_ptr<exec::QuantizedPack> quantized;
  if (probed && form && c.roles.trainer) probed = make_quantized_pack(c, *form, united ? &*united : nullptr, map, quantized);
  c.doing("the source maps");
  std::vector<SourceMap> maps = allgather_source_maps(map, input.world, c.call, probed);
  const double probe_seconds = comm::local_seconds() - started;
  laps("source maps");
  const std::int64_t shared_blocks = form ? share_partial_blocks(c, quantized.get()) : 0;
  const std::vector<WorkerConfig> configs = gather_worker_configs(c);
  connection.rollouts_stage = check_one_mode(c, configs);
  if (input.roles->engine_leaders.empty()) return connect_without_engines(c, std::move(connection), started);
  Planned planned = plan_on_rank_zero(c, united ? united->tensors : form ? form->tensors : tensors, std::move(maps), configs);
  RoundSchedule schedule = deliver_schedules(c, planned);
  connection.summary = share_summary(c, planned);
  laps("configurations and plan");
  connection.summary.fp8_amax_bytes = static_cast<std::int64_t>(sizeof(std::uint32_t)) * shared_blocks;
  // Staging and the executor are this rank's own work: a rank that fails there warns the others (their
  // handshakes with it end at once), and all of them agree on the outcome, so every rank throws the same.
  Status made;
  try {
    connection.staging = stage_parameters(c, schedule, quantized.get());
    laps("staging");
    connection.executor = connect_executor(c, std::move(schedule), connection.staging, quantized.get());
    connection.quantized = std::move(quantized);
  } catch (const Error& error) {
    made = error.status();  // names the rank (the executor's errors do), or is a peer's failure passed on
  } catch (const std::exception& error) {
    made = Status(ErrorCode::kInternal, c.who() + error.what());
  }
  if (!made) input.faults->warn(made);
  comm::agree(made, input.world, input.waiter, "connect: staging and connecting the transports");
  laps("executor (transports, buffers, pairs)");

  TransferSummary& s = connection.summary;
  // The longest probe of one worker: at a join only the joiner probes, and the others wait for it at the
  // source maps, so this is the probe's share of the connect, reported apart.
  const std::vector<std::byte> probes = comm::allgather_fixed(std::as_bytes(std::span(&own_probe, 1)), input.world, input.waiter,
                                                              "connect: the workers' probe times");
  for (std::size_t r = 0; r < probes.size() / sizeof(double); ++r) {
    double t = 0;
    std::memcpy(&t, probes.data() + r * sizeof(double), sizeof(double));
    s.longest_probe_seconds = std::max(s.longest_probe_seconds, t);
  }
  double seconds[2] = {comm::local_seconds() - started, probe_seconds};
  comm::broadcast_fixed(std::as_writable_bytes(std::span(seconds)), 0, input.world, input.waiter, "connect: the final handshake");
  s.connect_seconds = seconds[0];
  s.probe_seconds = seconds[1];
  laps("final handshake");
  WB_LOG(kDebug) << c.who() << "connect's steps: " << laps.text();
  if (c.rank == 0) {
    WB_LOG(kInfo) << "connected " << c.size << " workers: M = " << s.model_bytes << " bytes, " << s.rounds
                  << " rounds, T_min " << s.t_min_seconds << " s on the planned topology, connect "
                  << s.connect_seconds << " s";
  }
  return connection;
}

Status probe_load_weights(const std::vector<TensorInfo>& tensors, const ParameterSet& params, const LoadWeightsFn& load,
                          const std::vector<std::string>& not_loaded, bool rollout, const std::string& who, SourceMap& map) {
  Status probed;
  try {
    ProbeReport report;
    // One wrapper for every pass (the probe checkpoint is one object whose values change between passes):
    // its name index is built once, not once per pass (100,000 tensors: 5 builds of 100,000 entries).
    std::unique_ptr<TrainersTensors> trainers;
    map = probe_source_map(
        tensors, params,
        [&load, &trainers](const CheckpointReader& probe, const ParameterSet& p) {
          if (!trainers || !trainers->wraps(probe)) trainers = std::make_unique<TrainersTensors>(probe);
          load(*trainers, p);
        },
        {}, &report);
    probed = account_elements(params, report.accounts, not_loaded, rollout, who);
  } catch (const Error& error) {
    probed = Status(error.code() == ErrorCode::kNotFound ? ErrorCode::kNotFound : ErrorCode::kInvalidArgument,
                    who + "probing load_weights failed: " + error.status().message());
  } catch (const std::exception& error) {
    probed = Status(ErrorCode::kInvalidArgument, who + "load_weights threw while probed: " + error.what());
  }
  return probed;
}

}  // namespace wb::coord

// A network model to judge transfer strategies at any scale: a pipelined rounds-by-stages schedule of
// point-to-point transfers, played on the topology's links. WeightBridge's plans and the paper's two
// baselines (broadcast, single-source P2P; §4.1) are expressed in the same form and simulated alike.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"

namespace wb {

/// `bytes` written by worker `from` to worker `to` as `messages` one-sided writes. A relay transfer (lag 1)
/// forwards what `from` received in the round before.
struct Transfer {
  int from = 0;
  int to = 0;
  std::int64_t bytes = 0;
  std::int32_t messages = 1;
  std::uint8_t lag = 0;
};

/// Rounds × stages of transfers. Stage s of round r starts when stage s-1 of round r (or the stages of
/// round r that stage_after names) and stage s of round r-1 are done; round r starts when round r -
/// pipeline_depth is done (its buffers are free again). Relays add two conditions: a relay transfer of
/// round r waits for every stage of round r - 1 in which its sender received from another node (it
/// forwards only what has fully arrived over the network), and a stage of round r that writes into a
/// worker which relays in round r - depth + 1 waits for those relays (they read the slot round r reuses).
struct TrafficSchedule {
  std::string strategy;                                   // "weightbridge", "broadcast", "p2p"
  std::vector<std::string> stage_names;
  /// Per stage, the stages of the same round it starts after, as bits (at most 8 stages); empty: each
  /// stage after the one before it.
  std::vector<std::uint8_t> stage_after;
  int pipeline_depth = setting_defaults::pipeline_depth();
  std::vector<std::vector<std::vector<Transfer>>> rounds;  // [round][stage] -> transfers
};

struct SimulationResult {
  double ewtt_seconds = 0;   // start of the first stage to the end of the last
  struct StageSummary {
    std::string name;
    std::int64_t bytes = 0;               // over every link this stage uses
    std::string busiest_link;             // e.g. "node 3 ingress", "worker 17 intra egress"
    std::int64_t busiest_link_bytes = 0;
    double seconds = 0;                   // sum over rounds of the stage's duration
  };
  std::vector<StageSummary> stages;
  std::vector<std::int64_t> node_ingress_bytes;  // inter-node, per node
  std::vector<std::int64_t> node_egress_bytes;   // inter-node, per node
};

/// Plays the schedule on the topology (a fluid, event-driven model). Links: per node an inter-node egress
/// and ingress link (node_bandwidth each); per worker an intra-node egress and ingress link
/// (intra_node_bandwidth each). A transfer between nodes uses its nodes' links, one inside a node its
/// workers' links, one from a worker to itself none. A task (round, stage) puts on each link it uses
/// bytes / bandwidth + messages × message_latency seconds of work; concurrently active tasks share a link
/// fairly (processor sharing), and a task is done when its work on every link is. Throws wb::Error
/// (kInvalidArgument) on a worker outside topology.node_of_worker, a round with more stages than names,
/// pipeline_depth < 1, non-positive bandwidths, a lag other than 0 or 1, a relay transfer in round 0, with
/// a pipeline depth of 1, or in a schedule of more than 8 stages, or a stage_after that does not fit the
/// stages or makes a cycle.
/// StageSummary::bytes sums the stage's transfers between distinct workers (each counted once, not once per
/// link); busiest_link_bytes is that link's bytes in the stage over all rounds.
SimulationResult simulate(const TrafficSchedule& schedule, const Topology& topology);

/// The WeightBridge plan as traffic: per round and stage, the bytes between every pair of workers, one
/// message per pair (the executor coalesces a round's bytes for one peer). Receive: sender -> origin
/// lander; external exchange: to every other lander at depth 1 from the origin; relay (a fourth stage,
/// only in plans that relay): to a lander at depth d > 1 from its relay tree parent, d - 1 rounds later,
/// after nothing else in its round (the executor posts relays once the round before has arrived);
/// internal exchange (after the external exchange and the relays): every lander -> each other distinct
/// needer worker on its node, in the round it landed, the node taken from plan.topology. A
/// plan whose topology is empty is accepted only when every needer is a lander (no internal exchange).
/// Throws wb::Error (kInvalidArgument) on an index out of range or a relay tree that does not fit its
/// segment, naming the segment.
TrafficSchedule traffic_of(const Correspondence& correspondence, const TransferPlan& plan);

/// The baselines as traffic, for the simulator (the same baselines as real transfers are wb-bench's,
/// apps/baselines/).
struct BaselineTrafficOptions {
  std::int64_t bucket_bytes = std::int64_t{1} << 30;  // bytes per round (Miles' update buckets)
  int pipeline_depth = setting_defaults::pipeline_depth();
  std::vector<int> engine_of_worker;                  // per worker; -1 for trainers (P2P needs the engines)
  /// Each transfer of a round goes as messages of at most this many bytes, each costing
  /// Topology::message_latency on its links; 0 (the default) sends one message per transfer and round, the
  /// accounting WeightBridge's plans get. NCCL and RDMA pipelines keep several chunks in flight, so their
  /// latencies overlap the data; charging every 4 MiB chunk 5 us of link time would cost the baselines a
  /// third of a 400 GB/s link that they do not lose in practice.
  std::int64_t message_bytes = 0;
};

/// Both baselines cut the model (M distinct needed bytes) into max(1, ceil(M / bucket_bytes)) rounds and
/// split every transfer evenly over them; each transfer of a round is one message, or messages of
/// options.message_bytes when that is set.
///
/// Miles' broadcast path (§4.1): the trainers gather every needed element to one head rank (the first
/// trainer worker: world rank 0 in Miles' layouts), which broadcasts the whole model to every rollout
/// worker through an NCCL-style pipelined ring relay.
/// Stage "gather": each atom comes from one of its holders (the head when it holds it, else the holder
/// with the least gather load so far). Stage "broadcast": a chain head -> rollout workers in (node, rank)
/// order, every hop carrying the whole bucket.
TrafficSchedule broadcast_baseline_traffic(const Correspondence& correspondence, const Topology& topology,
                                           const BaselineTrafficOptions& options);
/// Miles' P2P path (§4.1): per engine one trainer source gathers the model, then writes each rollout
/// worker of its engine exactly what that worker needs (no exchange between rollouts). The k-th engine
/// (ascending id) takes trainer node k mod T (T trainer nodes in ascending order) and the
/// (k / T mod n)-th of that node's n trainer workers as source. Stage "gather": each source gets every atom
/// its engines need from one holder (itself when it holds it, else the least loaded holder). Stage
/// "write": source -> every distinct needer worker of its engines, the bytes that worker needs. Throws
/// wb::Error (kInvalidArgument) when engine_of_worker does not have one entry per worker, a rollout worker
/// has no engine (< 0) or a trainer has one, or there is no trainer worker.
TrafficSchedule p2p_baseline_traffic(const Correspondence& correspondence, const Topology& topology,
                                     const BaselineTrafficOptions& options);

}  // namespace wb

// The global transfer planner (docs/architecture.md, component 2): the topology, the network's lower bound (M, M_v,
// T_min) and the plan: who sends which box of which atom to whom, in which stage and round.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weightbridge/correspondence.hpp"

namespace wb {

/// The defaults the planner's settings are declared with (buffer_mib, pipeline_depth, relay_fan_out,
/// node_gbps, intra_gbps, message_us), in the units of the fields below that start from them: options built
/// in code and options read from settings nobody set agree, and each number is written once, with its setting.
namespace setting_defaults {
std::int64_t buffer_bytes_per_worker();
int pipeline_depth();
int relay_fan_out();
double node_bandwidth();        // bytes per second
double intra_node_bandwidth();  // bytes per second
double message_latency();       // seconds
}  // namespace setting_defaults

/// Where the workers sit and how fast the links are. Bandwidths in bytes per second.
struct Topology {
  std::vector<int> node_of_worker;   // node index per worker (world rank)
  double node_bandwidth = setting_defaults::node_bandwidth();  // inter-node NIC bandwidth per node, each direction
  double intra_node_bandwidth = setting_defaults::intra_node_bandwidth();  // per worker, each direction (NVLink, or shared memory)
  double message_latency = setting_defaults::message_latency();  // seconds per one-sided write, added per message on its links

  /// Nodes of `gpus_per_node` consecutive ranks.
  static Topology uniform(int workers, int gpus_per_node, double node_bandwidth, double intra_node_bandwidth);
  int num_nodes() const;
};

/// The traffic any plan must carry and the time it takes at best (the paper's T_min).
struct LowerBound {
  std::int64_t model_bytes = 0;                  // M: distinct bytes some rollout needs
  std::vector<int> trainer_nodes;                // nodes holding trainer workers
  struct RolloutNode {
    int node = 0;
    std::int64_t need_bytes = 0;                 // M_v: distinct bytes the node's workers need
  };
  std::vector<RolloutNode> rollout_nodes;
  double trainer_egress_bandwidth = 0;           // B_T
  double t_min_seconds = 0;                      // max(M / B_T, max_v M_v / B_v)
};

/// Computes M, every M_v and T_min. Throws when a node hosts both trainer and rollout workers (their
/// traffic would not cross the inter-node network the bound is about).
LowerBound lower_bound(const Correspondence& correspondence, const Topology& topology);

/// The three stages of a round (paper §3.2), in pipeline order.
enum class Stage : std::uint8_t {
  kReceive = 0,           // trainer worker -> rollout worker on another node
  kExternalExchange = 1,  // rollout node -> rollout node: each node gets every needed element once
  kInternalExchange = 2,  // rollout worker -> rollout worker on the same node
};
inline constexpr int kStageCount = 3;
const char* stage_name(Stage stage);  // "receive", "external exchange", "internal exchange"

/// How the external exchange reaches the nodes that need an atom (PlanOptions::relay_fan_out).
inline constexpr int kRelayChoose = 0;     // simulate fan-outs 8, 4 (where it reaches every node in two levels) and
                                           // 16 (where that is all-to-all) at a few round counts, keep the fastest
inline constexpr int kRelayAllToAll = -1;  // every lander takes the piece straight from the origin

struct PlanOptions {
  /// Transfer-buffer memory per worker, all pipeline slots together (send and receive buffers).
  std::int64_t buffer_bytes_per_worker = setting_defaults::buffer_bytes_per_worker();
  int pipeline_depth = setting_defaults::pipeline_depth();  // round buffers in flight per worker (double buffering)
  int min_rounds = 8;                             // at least this many rounds, so the stages overlap
  /// Atoms are cut into pieces of about this size, the unit of balancing; 0 chooses it from the model
  /// size and the number of distinct roles (between 512 B and 16 MiB), not from the replica count.
  std::int64_t piece_bytes = 0;
  /// External exchange: kRelayChoose, kRelayAllToAll (whatever the group size), or F >= 1: relay trees in
  /// which a node forwards to at most F others per round, wherever more than F + 1 nodes need an atom (fewer
  /// take it all-to-all).
  int relay_fan_out = setting_defaults::relay_fan_out();  // kRelayChoose
  /// Memory the planner may take (its own structures and the schedules it builds, as estimated before
  /// planning); 0: no limit. A plan that would need more is refused with the estimate and the limit.
  std::int64_t memory_limit_bytes = 0;
};

/// A relay tree over the nodes that need an atom, by position in a segment's landers (ascending node
/// order): the root takes the piece from the trainer; every other position takes it from its parent. A
/// position at depth d > 1 takes it d - 1 rounds after the segment's round, from a parent that forwards in
/// that round what it received in the round before (a relay write, lag 1).
struct RelayTree {
  static constexpr std::uint16_t kRoot = UINT16_MAX;
  std::vector<std::uint16_t> parent;  // per position; kRoot for the root
  std::vector<std::uint8_t> depth;    // per position: hops from the root
  int height = 0;                     // the largest depth
};

/// One piece of an atom on its way to every worker that needs it. It leaves one trainer worker (the
/// sender) once, lands on one rollout worker of every node that needs it (the landers, one per node, in
/// ascending node order), of which the origin lander receives it from the trainer; the external exchange
/// brings it to the other landers, straight from the origin (all-to-all) or along a relay tree; every
/// lander hands it to the other workers of its node that need it (internal exchange) in the round it
/// lands.
struct Segment {
  static constexpr std::uint32_t kAllToAll = UINT32_MAX;
  std::uint32_t atom = 0;          // index into Correspondence::atoms
  Box box;                         // inside the atom's box, checkpoint coordinates
  std::uint32_t round = 0;         // the round the trainer sends it in
  std::uint32_t sender = 0;        // index into the atom's holders
  std::uint32_t first_lander = 0;  // into TransferPlan::landers: indices into the atom's needers
  std::uint16_t lander_count = 0;  // nodes that need the atom
  std::uint16_t origin = 0;        // which of the landers receives from the trainer (0 .. lander_count-1)
  std::uint32_t relay = kAllToAll; // kAllToAll, or an index into TransferPlan::relay_trees (rooted at origin)
};

/// One way of running the external exchange that the planner simulated (kRelayChoose), with its result.
struct ExchangeCandidate {
  std::string shape;          // "all-to-all" or "relay trees, fan-out F"
  int fan_out = 0;            // largest number of nodes one node forwards a piece to
  int height = 1;             // hops of the deepest relay tree (1: all-to-all)
  int rounds = 0;
  double simulated_seconds = 0;
  bool chosen = false;
};

struct TransferPlan {
  int rounds = 0;
  int pipeline_depth = setting_defaults::pipeline_depth();
  std::vector<Segment> segments;        // sorted by round, then by route
  std::vector<std::uint32_t> landers;   // see Segment
  std::vector<RelayTree> relay_trees;   // see Segment::relay
  Topology topology;                    // as planned for
  LowerBound bound;
  std::string exchange = "all-to-all";  // the external exchange's shape, as ExchangeCandidate::shape
  std::vector<ExchangeCandidate> candidates;  // what the planner simulated to choose it (may be empty)
  std::int64_t memory_estimate = 0;     // estimate_plan_memory, as plan_transfer checked it (0: no limit, not estimated)

  // Traffic tallies (bytes), filled by the planner. Inter-node traffic counts the receive and external
  // exchange stages; intra-node the internal exchange.
  std::vector<std::int64_t> worker_send_bytes;        // per worker, every stage
  std::vector<std::int64_t> worker_receive_bytes;     // per worker, every stage
  std::vector<std::int64_t> node_ingress_bytes;       // per node, inter-node only
  std::vector<std::int64_t> node_egress_bytes;        // per node, inter-node only
  std::vector<std::int64_t> worker_send_slot_bytes;     // per worker: largest round it packs
  std::vector<std::int64_t> worker_receive_slot_bytes;  // per worker: largest round it receives
  std::vector<std::int64_t> round_bytes;               // per round: bytes over every link, all stages

  /// Buffer memory a worker needs: depth × (send slot + receive slot).
  std::int64_t worker_buffer_bytes(int worker) const;
  std::span<const std::uint32_t> landers_of(const Segment& segment) const {
    return {landers.data() + segment.first_lander, segment.lander_count};
  }
  /// Hops from the origin to lander position k of `segment` (0 for the origin itself).
  int lander_depth(const Segment& segment, std::size_t k) const {
    if (k == segment.origin) return 0;
    return segment.relay == Segment::kAllToAll ? 1 : relay_trees[segment.relay].depth[k];
  }
  /// The lander position that forwards `segment` to position k (k must not be the origin).
  std::size_t lander_parent(const Segment& segment, std::size_t k) const {
    return segment.relay == Segment::kAllToAll ? segment.origin : relay_trees[segment.relay].parent[k];
  }
  /// The round in which lander position k receives `segment` (and hands it on inside its node).
  std::uint32_t landing_round(const Segment& segment, std::size_t k) const {
    const int depth = lander_depth(segment, k);
    return segment.round + static_cast<std::uint32_t>(depth > 1 ? depth - 1 : 0);
  }
};

/// PlanOptions from the settings buffer_mib, pipeline_depth, relay_fan_out and plan_memory_mib (WB_* variables,
/// --buffer-mib etc.). Throws on values out of range.
PlanOptions plan_options_from_settings();

/// The network the planner, T_min and the simulator assume, from the settings node_gbps, intra_gbps and
/// message_us (WB_NODE_GBPS / --node-gbps, ...): bandwidths in bytes per second, latency in seconds.
struct NetworkSettings {
  double node_bandwidth = setting_defaults::node_bandwidth();
  double intra_node_bandwidth = setting_defaults::intra_node_bandwidth();
  double message_latency = setting_defaults::message_latency();
};
NetworkSettings network_from_settings();

/// What planning `correspondence` on `topology` would take in memory, estimated from the pieces and the
/// round count it implies, before anything is allocated: the planner's own structures and every rank's
/// round schedule (built one at a time, serialized kept).
std::int64_t estimate_plan_memory(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options);

/// Plans the transfer (trainer de-duplication, rollout de-duplication in three stages, relays, balance,
/// rounds). Throws wb::Error when a piece cannot fit the buffer budget, naming the tensor, and
/// (kUnsupported) when the estimated memory exceeds options.memory_limit_bytes or an allocation fails,
/// with the estimate and the limit.
TransferPlan plan_transfer(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options);

}  // namespace wb

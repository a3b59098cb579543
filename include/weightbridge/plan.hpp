// The global transfer planner (docs/architecture.md, component 2): the topology, the network's lower bound (M, M_v,
// T_min) and the plan: who sends which box of which atom to whom, in which stage and round.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "weightbridge/correspondence.hpp"

namespace wb {

/// Where the workers sit and how fast the links are. Bandwidths in bytes per second.
struct Topology {
  std::vector<int> node_of_worker;   // node index per worker (world rank)
  double node_bandwidth = 400e9;     // inter-node NIC bandwidth per node, each direction
  double intra_node_bandwidth = 900e9;  // per worker, each direction (NVLink, or shared memory)
  double message_latency = 5e-6;     // seconds per one-sided write, added per message on its links

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

struct PlanOptions {
  /// Transfer-buffer memory per worker, all pipeline slots together (send and receive buffers).
  std::int64_t buffer_bytes_per_worker = std::int64_t{1} << 30;
  int pipeline_depth = 2;                         // round buffers in flight per worker (double buffering)
  int min_rounds = 8;                             // at least this many rounds, so the stages overlap
  /// Atoms are cut into pieces of about this size, the unit of balancing; 0 chooses it from the model
  /// size and worker count (between 512 B and 4 MiB).
  std::int64_t piece_bytes = 0;
};

/// One piece of an atom on its way to every worker that needs it. It leaves one trainer worker (the
/// sender) once, lands on one rollout worker of every node that needs it (the landers, one per node, in
/// ascending node order), of which the origin lander receives it from the trainer and forwards it to the
/// other landers (external exchange); every lander hands it to the other workers of its node that need it
/// (internal exchange).
struct Segment {
  std::uint32_t atom = 0;          // index into Correspondence::atoms
  Box box;                         // inside the atom's box, checkpoint coordinates
  std::uint32_t round = 0;
  std::uint32_t sender = 0;        // index into the atom's holders
  std::uint32_t first_lander = 0;  // into TransferPlan::landers: indices into the atom's needers
  std::uint16_t lander_count = 0;  // nodes that need the atom
  std::uint16_t origin = 0;        // which of the landers receives from the trainer (0 .. lander_count-1)
};

struct TransferPlan {
  int rounds = 0;
  int pipeline_depth = 2;
  std::vector<Segment> segments;        // sorted by round, then by route
  std::vector<std::uint32_t> landers;   // see Segment
  Topology topology;                    // as planned for
  LowerBound bound;

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
};

/// PlanOptions with buffer_bytes_per_worker and pipeline_depth from the settings buffer_mib and
/// pipeline_depth (WB_BUFFER_MIB, --buffer-mib; WB_PIPELINE_DEPTH, --pipeline-depth). Throws on values out of range.
PlanOptions plan_options_from_settings();

/// The network the planner, T_min and the simulator assume, from the settings node_gbps, intra_gbps and
/// message_us (WB_NODE_GBPS / --node-gbps, ...): bandwidths in bytes per second, latency in seconds.
struct NetworkSettings {
  double node_bandwidth = 400e9;
  double intra_node_bandwidth = 900e9;
  double message_latency = 5e-6;
};
NetworkSettings network_from_settings();

/// Plans the transfer (trainer de-duplication, rollout de-duplication in three stages, balance, rounds).
/// Throws wb::Error when a piece cannot fit the buffer budget, naming the tensor.
TransferPlan plan_transfer(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options);

}  // namespace wb

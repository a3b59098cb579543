// Planning inputs and the network's lower bound (DESIGN.md: M, M_v, T_min). The planner, its rounds and
// the simulator build on these.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "weightbridge/correspondence.hpp"

namespace wb {

/// Where the workers sit and how fast the links are. Bandwidths in bytes per second.
struct Topology {
  std::vector<int> node_of_worker;   // node index per worker (world rank)
  double node_bandwidth = 400e9;     // inter-node NIC bandwidth per node, each direction
  double intra_node_bandwidth = 900e9;
  double message_latency = 5e-6;     // seconds per message

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

}  // namespace wb

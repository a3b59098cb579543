#include <algorithm>
#include <map>
#include <cstdint>
#include <vector>

#include "weightbridge/plan.hpp"
#include "weightbridge/status.hpp"

namespace wb {

Topology Topology::uniform(int workers, int gpus_per_node, double node_bandwidth, double intra_node_bandwidth) {
  if (gpus_per_node <= 0) throw Error(ErrorCode::kInvalidArgument, "gpus per node must be positive");
  Topology topology;
  topology.node_of_worker.resize(static_cast<std::size_t>(workers));
  for (int w = 0; w < workers; ++w) topology.node_of_worker[static_cast<std::size_t>(w)] = w / gpus_per_node;
  topology.node_bandwidth = node_bandwidth;
  topology.intra_node_bandwidth = intra_node_bandwidth;
  return topology;
}

int Topology::num_nodes() const {
  return node_of_worker.empty() ? 0 : *std::max_element(node_of_worker.begin(), node_of_worker.end()) + 1;
}

LowerBound lower_bound(const Correspondence& correspondence, const Topology& topology) {
  const std::size_t workers = correspondence.sides.size();
  if (topology.node_of_worker.size() != workers)
    throw Error(ErrorCode::kInvalidArgument, "topology places " + std::to_string(topology.node_of_worker.size()) +
                                                 " workers, the correspondence has " + std::to_string(workers));
  std::map<int, bool> node_is_trainer;
  for (std::size_t w = 0; w < workers; ++w) {
    const int node = topology.node_of_worker[w];
    const bool trainer = correspondence.sides[w] == Side::kTrainer;
    auto [it, inserted] = node_is_trainer.try_emplace(node, trainer);
    if (!inserted && it->second != trainer)
      throw Error(ErrorCode::kInvalidArgument, "node " + std::to_string(node) +
                                                   " hosts trainer and rollout workers; the lower bound assumes "
                                                   "separate nodes (choose gpus-per-node accordingly)");
  }
  LowerBound bound;
  // Per rollout node (by node - lowest node, a vector: the atoms' needers are millions of lookups), its
  // need, and the last atom counted for it (each atom once per node).
  const int lowest = node_is_trainer.empty() ? 0 : node_is_trainer.begin()->first;
  const std::size_t span = node_is_trainer.empty() ? 0 : static_cast<std::size_t>(node_is_trainer.rbegin()->first - lowest) + 1;
  std::vector<std::int64_t> need(span, 0);
  std::vector<std::size_t> counted(span, SIZE_MAX);
  for (const auto& [node, trainer] : node_is_trainer)
    if (trainer) bound.trainer_nodes.push_back(node);
  for (std::size_t a = 0; a < correspondence.atoms.size(); ++a) {
    const Atom& atom = correspondence.atoms[a];
    const std::int64_t bytes =
        atom.box.numel() * static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
    bound.model_bytes += bytes;
    for (const AtomEndpoint& needer : atom.needers) {
      const auto slot = static_cast<std::size_t>(topology.node_of_worker[static_cast<std::size_t>(needer.worker)] - lowest);
      if (counted[slot] == a) continue;
      counted[slot] = a;
      need[slot] += bytes;
    }
  }
  bound.trainer_egress_bandwidth = topology.node_bandwidth * static_cast<double>(bound.trainer_nodes.size());
  double t_min = bound.trainer_egress_bandwidth > 0 ? static_cast<double>(bound.model_bytes) / bound.trainer_egress_bandwidth : 0;
  for (const auto& [node, trainer] : node_is_trainer) {
    if (trainer) continue;
    const std::int64_t bytes = need[static_cast<std::size_t>(node - lowest)];
    bound.rollout_nodes.push_back({node, bytes});
    t_min = std::max(t_min, static_cast<double>(bytes) / topology.node_bandwidth);
  }
  bound.t_min_seconds = t_min;
  return bound;
}

}  // namespace wb

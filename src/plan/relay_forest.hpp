// Relay forests: the trees along which the external exchange spreads what many nodes need, so that no node
// writes to more than a few others per round however many replicas there are.
#pragma once

#include <vector>

#include "weightbridge/plan.hpp"

namespace wb::plan_detail {

/// How the pieces that k nodes all need (positions 0..k-1, a segment's lander order) reach every one of
/// them. Either all-to-all: k stars, star t rooted at position t, each carrying 1/k of the pieces; or T relay
/// trees carrying 1/T each, in which every position has at most T children over all trees together. A
/// position with c children in a tree forwards c/T of the pieces, so no position sends more than it
/// receives, and per round a node writes to at most T others and hears from at most T (one parent per tree).
struct RelayForest {
  int positions = 0;
  bool all_to_all = true;
  std::vector<RelayTree> trees;  // relays only
  int fan_out = 0;               // the most children of one position in one round
  int height = 1;                // the deepest tree's depth

  int tree_count() const { return all_to_all ? positions : static_cast<int>(trees.size()); }
  int root(int tree) const;      // the position that takes the tree's pieces from the trainer
};

/// The forest for k positions and a fan-out of at most `fan_out` (>= 1): all-to-all when k - 1 <= fan_out,
/// else fan_out trees. Tree t is rooted at position floor(t k / T) and grown breadth first along the
/// positions from there, each position giving children while it has child slots left (T over all trees),
/// so the inner positions of the trees are about disjoint blocks and the depth is about log_T(k).
RelayForest relay_forest(int k, int fan_out);

}  // namespace wb::plan_detail

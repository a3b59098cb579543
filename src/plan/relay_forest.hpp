// Relay forests: the trees along which the external exchange spreads what many nodes need, so that no node
// writes to more than a few others per round however many replicas there are.
#pragma once

#include <span>
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

/// The columns (places in a node) whose pieces a tree carries: first..last. Two trees whose spans overlap
/// land pieces on the same worker of a node.
struct ColumnSpan {
  int first = 0;
  int last = 0;
  bool overlaps(const ColumnSpan& other) const { return first <= other.last && other.first <= last; }
};

/// The forest for k positions and a fan-out of at most `fan_out` (>= 1): all-to-all when k - 1 <= fan_out,
/// else fan_out trees, tree t rooted at position floor(t k / T).
///
/// Why the shape: a round's hops after the trainer's are store-and-forward, so every hop a round takes costs
/// the transfer about that round's share of its busiest link once, at the end. The first hop (the root
/// forwarding in the round it received) is charged by the root's share: the root gives only as many children
/// as it takes to reach all k positions within the fewest levels (hubs), and the hubs, which forward a round
/// later, take the rest. Hubs are the positions with the most child slots left, so that the levels stay few.
/// A root never gives all T of its slots to its own tree where fewer hubs reach everyone in two levels (it
/// would spend its whole share of the round forwarding in the round it receives): where the slots cannot be
/// cut for that, a few positions go a level deeper, below leaves that forward to one position each.
///
/// A root never relays in a tree whose columns overlap its own (`spans`, one per tree; empty: in no other
/// tree): that worker takes the trainer's next rounds into the slot such a relay would still be forwarding
/// from. The other trees' roots come last in every tree, as leaves where possible.
RelayForest relay_forest(int k, int fan_out, std::span<const ColumnSpan> spans = {});

}  // namespace wb::plan_detail

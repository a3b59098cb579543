// The planner's steps, in the order plan_transfer runs them (each in a file of its own):
//
//   pieces.cpp          cut every atom into pieces, the unit of balancing
//   assign_senders.cpp  trainer de-duplication: one sending holder per piece
//   assign_landers.cpp  rollout de-duplication: one landing worker per piece and node that needs it
//   assign_trees.cpp    the external exchange: nodes grouped by what they need, a relay forest per group,
//                       a tree (and so an origin) per piece
//   piece_rounds.cpp    every piece's round: equal shares of every sender and target per round, few targets
//                       per sender and round
//   assign_rounds.cpp   segments in those rounds, slot sizes, traffic tallies
//   planner.cpp         the whole, and the choice among exchange shapes by simulating each
#pragma once

#include <cstdint>
#include <vector>

#include "plan/atom_routes.hpp"
#include "plan/relay_forest.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/plan.hpp"
#include "weightbridge/simulator.hpp"

namespace wb::plan_detail {

/// Every atom cut into `count` slices of about equal size along its route's axis.
struct PieceTable {
  std::vector<std::uint32_t> first;  // per atom, into the per-piece arrays; one extra at the end
  std::vector<std::uint32_t> atom;   // per piece
  std::vector<std::int64_t> bytes;   // per piece
  std::vector<std::int64_t> begin;   // per piece: first unit along the atom's axis, box-relative
  std::vector<std::int64_t> end;     // per piece: one past its last unit

  std::size_t size() const { return atom.size(); }
};

/// The piece size: options.piece_bytes, or one from the model size and the number of distinct roles
/// (trainer workers, and rollout workers per replica of the model), never from the number of replicas,
/// so that piece counts and all that follows stay linear in the workers.
std::int64_t choose_piece_bytes(const Correspondence& correspondence, const LowerBound& bound, const PlanOptions& options);

/// estimate_plan_memory with the lower bound at hand.
std::int64_t estimate_plan_memory(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options,
                                  const LowerBound& bound);

/// Pieces of an atom of `bytes` (`units` slices along its axis) that `needers` distinct workers need, when an
/// atom's needers are `average_needers` on average (weighted by bytes).
std::int64_t atom_piece_count(std::int64_t bytes, std::int64_t units, std::int64_t piece_bytes, double needers, double average_needers);

PieceTable cut_pieces(const Correspondence& correspondence, const AtomRoutes& routes, std::int64_t piece_bytes);

/// Per piece, the holder (index into atom.holders) that sends it: the least loaded, then repaired along
/// augmenting paths. Fills `send_load` (bytes per worker).
std::vector<std::uint32_t> assign_senders(const Correspondence& correspondence, const AtomRoutes& routes,
                                          const PieceTable& pieces, const Topology& topology,
                                          std::vector<std::int64_t>& send_load);

/// Per piece and node that needs it (ascending node order), the worker that lands it there (index into
/// atom.needers). Workers with the same place in their node (a column) land the same pieces where they
/// can, so that a node pair's traffic in a round is a few worker pairs, not all of them.
struct Landing {
  std::vector<std::uint32_t> first;    // per piece, into `landers`; one extra at the end
  std::vector<std::uint32_t> landers;  // per piece, one per node of its atom
  std::vector<std::uint16_t> column;   // per piece: the place in the node of its landers
};
Landing assign_landers(const Correspondence& correspondence, const AtomRoutes& routes, const PieceTable& pieces,
                       const Topology& topology);

/// Atoms grouped by the exact set of nodes that need them.
struct NodeSets {
  std::vector<std::uint32_t> of_atom;  // per atom
  std::vector<int> size;               // per set: its node count
};
NodeSets group_node_sets(const AtomRoutes& routes);

/// The external exchange of one plan: per node set a forest, per piece a tree of its set's forest. A
/// group's pieces, ordered by column, are cut into as many runs of equal bytes as the forest has trees, run t
/// going to tree t: every tree carries an equal share (so no node sends more than it receives), and a node
/// hears in a round from one parent per column (plus one per run boundary), not one per tree and column.
struct Exchange {
  int fan_out = kRelayAllToAll;         // as PlanOptions::relay_fan_out (never kRelayChoose)
  std::vector<RelayForest> forests;     // per node set
  std::vector<std::uint16_t> tree;      // per piece
  int largest_fan_out = 0;              // over the forests in use
  int height = 1;                       // over the forests in use
};
Exchange assign_trees(const PieceTable& pieces, const Landing& landing, const NodeSets& sets,
                      int fan_out);

/// Per piece, the target piece_rounds balances besides its sender: its origin (its relay tree and column,
/// which land it on one origin worker), and what it weighs there: its bytes times the workers of a node that
/// take it (the lander and those it hands it on to), on average over its nodes.
struct RoundTargets {
  std::vector<std::uint32_t> origin;  // per piece, dense
  std::vector<double> weight;         // per piece
};

/// The trainer round (0 .. rounds-1) of every piece: every round carries about its share of every sender's
/// bytes and of every origin's weight, and a sender keeps writing to the same origin from round to round
/// where it can.
std::vector<std::uint32_t> piece_rounds(const Correspondence& correspondence, const PieceTable& pieces,
                                        const std::vector<std::uint32_t>& senders, const RoundTargets& targets, int rounds);

/// What every candidate plan of one transfer shares: the pieces, who sends and who lands each, the node sets,
/// and which pieces travel alike (the same sender, the same landing worker on every node and the same
/// needers: the same hops, once they share a relay tree and a round).
struct PlanBasis {
  const Correspondence& correspondence;
  const Topology& topology;
  const AtomRoutes& routes;
  const PieceTable& pieces;
  const std::vector<std::uint32_t>& senders;
  const Landing& landing;
  const NodeSets& sets;
  const PlanOptions& options;
  std::vector<std::uint32_t> piece_class;  // per piece
  std::uint32_t classes = 0;
};
/// Fills PlanBasis::piece_class.
void classify_pieces(PlanBasis& basis);

/// The pieces of one exchange in their rounds: every piece's trainer round (piece_rounds), the pieces summed
/// per flow (a class, a tree and a round, one representative segment each), and a skeleton plan that holds
/// what for_each_hop needs of a plan (rounds, relay trees, the pieces' landers as Landing lays them out) and
/// the slot sizes. Raises the round count while some worker's slots do not fit
/// options.buffer_bytes_per_worker; the relays' rounds after the trainer's are added.
struct RoutedRounds {
  struct Flow {
    Segment segment;  // one of its pieces' (box left empty; first_lander into skeleton.landers)
    std::int64_t bytes = 0;
  };
  std::vector<std::uint32_t> round;  // per piece
  std::vector<Flow> flows;
  TransferPlan skeleton;
};
RoutedRounds route_rounds(const PlanBasis& basis, const Exchange& exchange, int rounds);

/// The plan of one exchange with `rounds` trainer rounds: route_rounds, then segments (ordered by route,
/// neighbours merged) and traffic tallies.
TransferPlan assign_rounds(const PlanBasis& basis, const Exchange& exchange, int rounds);
/// The same from `routed`, what route_rounds made of `exchange` (the draft the planner chose).
TransferPlan assign_rounds(const PlanBasis& basis, const Exchange& exchange, RoutedRounds routed);

/// The traffic of the plan assign_rounds makes from `routed`, from its flows: the same transfers as
/// traffic_of that plan, at the cost of one set of hops per flow instead of per segment (what the planner
/// simulates to choose among candidates).
TrafficSchedule traffic_of(const PlanBasis& basis, const RoutedRounds& routed);

/// traffic_of with the atom routes already at hand (nullptr: computed here).
TrafficSchedule traffic_of(const Correspondence& correspondence, const TransferPlan& plan, const AtomRoutes* routes);

/// The fewest trainer rounds any plan of these pieces can have: options.min_rounds, or the busiest
/// worker's traffic over one slot of the budget.
int minimum_rounds(const Correspondence& correspondence, const AtomRoutes& routes, const PieceTable& pieces,
                   const std::vector<std::uint32_t>& senders, const PlanOptions& options);

}  // namespace wb::plan_detail

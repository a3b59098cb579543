// A WeightBridge transfer plan as traffic: per round and stage, the bytes every worker writes to every
// other, so that the plan is simulated like the baselines.
//
// A segment of B bytes (its box's elements × its tensor's element size) moves in three stages:
//   receive             sender (a holder of its atom) -> origin lander, in the segment's round
//   external exchange   to every lander at depth 1 (one per node that needs the atom): from the origin
//   relay               to every lander at depth d > 1 of a relay tree, d - 1 rounds later, from its parent,
//                       which forwards what it received the round before (lag 1). A stage of its own, only
//                       in plans that relay: it follows nothing else in its round, as the executor posts
//                       relays as soon as the round before has arrived
//   internal exchange   on every such node, its lander -> every distinct needer worker on that node other
//                       than the lander (a worker needing several copies of the atom receives it once), in
//                       the round the lander has it (after the external exchange and the relays)
// Transfers are summed per (round, stage, from, to); each such group counts as one message, since the
// executor coalesces a round's bytes for one peer into one batch. The node of a worker comes from the
// topology the plan was made for (TransferPlan::topology).
#include <algorithm>
#include <array>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "plan/planning.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

Error bad_plan(const std::string& what) { return Error(ErrorCode::kInvalidArgument, "traffic_of: " + what); }

constexpr std::size_t kRelayStage = kStageCount;  // the traffic's fourth stage, in plans that relay

// A hop's bytes for a (from, to) pair, the pair as one key: from << 32 | to.
struct PairBytes {
  std::uint64_t key;
  std::int64_t bytes;
};

// Sums bytes per pair with an open-addressing table that is kept from one call to the next (a hash map per
// round and stage, or sorting every hop, cost the planner more than the simulation of its candidates).
class PairSums {
 public:
  // The pairs of `hops`, each with its bytes summed, in key order (so in order of (from, to)).
  const std::vector<PairBytes>& sum(const std::vector<PairBytes>& hops) {
    sums_.clear();
    int bits = 4;
    while ((std::size_t{1} << bits) < 2 * hops.size()) ++bits;
    slots_.assign(std::size_t{1} << bits, kEmpty);
    const std::size_t mask = slots_.size() - 1;
    for (const PairBytes& hop : hops) {
      std::size_t at = static_cast<std::size_t>((hop.key * 0x9e3779b97f4a7c15ull) >> (64 - bits));
      while (slots_[at] != kEmpty && sums_[slots_[at]].key != hop.key) at = (at + 1) & mask;
      if (slots_[at] == kEmpty) {
        slots_[at] = static_cast<std::uint32_t>(sums_.size());
        sums_.push_back({hop.key, 0});
      }
      sums_[slots_[at]].bytes += hop.bytes;
    }
    std::sort(sums_.begin(), sums_.end(), [](const PairBytes& a, const PairBytes& b) { return a.key < b.key; });
    return sums_;
  }

 private:
  static constexpr std::uint32_t kEmpty = UINT32_MAX;
  std::vector<std::uint32_t> slots_;  // index into sums_, or kEmpty
  std::vector<PairBytes> sums_;
};

// One round's transfers: per stage, (from, to) -> bytes. Hops are kept as they come and summed per pair
// when the round is flushed.
class RoundTally {
 public:
  void add(std::size_t stage, int from, int to, std::int64_t bytes) {
    hops_[stage].push_back({static_cast<std::uint64_t>(static_cast<std::uint32_t>(from)) << 32 | static_cast<std::uint32_t>(to), bytes});
  }

  // Moves the round's sums into `stages` (one transfer per pair, one message each, relays with lag 1), in
  // order of (from, to).
  void flush(std::vector<std::vector<Transfer>>& stages, std::size_t stage_count, PairSums& sums) {
    stages.resize(stage_count);
    for (std::size_t s = 0; s < stage_count; ++s) {
      auto& out = stages[s];
      for (const PairBytes& pair : sums.sum(hops_[s]))
        out.push_back(Transfer{static_cast<int>(pair.key >> 32), static_cast<int>(pair.key & 0xffffffffu), pair.bytes, 1,
                               static_cast<std::uint8_t>(s == kRelayStage ? 1 : 0)});
      hops_[s] = {};
    }
  }

 private:
  std::array<std::vector<PairBytes>, kStageCount + 1> hops_;
};

void check_segment(const Correspondence& correspondence, const TransferPlan& plan, std::size_t i) {
  const Segment& segment = plan.segments[i];
  if (segment.round >= static_cast<std::uint32_t>(plan.rounds))
    throw bad_plan("segment " + std::to_string(i) + " is in round " + std::to_string(segment.round) + " of " + std::to_string(plan.rounds));
  if (segment.atom >= correspondence.atoms.size())
    throw bad_plan("segment " + std::to_string(i) + " names atom " + std::to_string(segment.atom) + " of " +
                   std::to_string(correspondence.atoms.size()));
  const Atom& atom = correspondence.atoms[segment.atom];
  if (segment.sender >= atom.holders.size())
    throw bad_plan("segment " + std::to_string(i) + " names holder " + std::to_string(segment.sender) + " of " +
                   std::to_string(atom.holders.size()));
  if (static_cast<std::size_t>(segment.first_lander) + segment.lander_count > plan.landers.size())
    throw bad_plan("segment " + std::to_string(i) + "'s landers lie outside the plan's lander list");
  if (segment.origin >= segment.lander_count)
    throw bad_plan("segment " + std::to_string(i) + " has origin " + std::to_string(segment.origin) + " of " +
                   std::to_string(segment.lander_count) + " landers");
  for (std::uint32_t needer : plan.landers_of(segment))
    if (needer >= atom.needers.size())
      throw bad_plan("segment " + std::to_string(i) + " lands on needer " + std::to_string(needer) + " of " +
                     std::to_string(atom.needers.size()));
  if (segment.relay == Segment::kAllToAll) return;
  if (segment.relay >= plan.relay_trees.size())
    throw bad_plan("segment " + std::to_string(i) + " names relay tree " + std::to_string(segment.relay) + " of " +
                   std::to_string(plan.relay_trees.size()));
  const RelayTree& tree = plan.relay_trees[segment.relay];
  if (tree.parent.size() != segment.lander_count || tree.depth.size() != segment.lander_count ||
      tree.parent[segment.origin] != RelayTree::kRoot)
    throw bad_plan("segment " + std::to_string(i) + "'s relay tree does not span its " + std::to_string(segment.lander_count) +
                   " landers from its origin");
  for (std::size_t k = 0; k < tree.parent.size(); ++k) {
    if (k == segment.origin) continue;
    const std::uint16_t parent = tree.parent[k];
    if (parent >= tree.parent.size() || tree.depth[k] != tree.depth[parent] + 1)
      throw bad_plan("segment " + std::to_string(i) + "'s relay tree has a bad parent or depth at position " + std::to_string(k));
    if (segment.round + tree.depth[k] - 1 >= static_cast<std::uint32_t>(plan.rounds))
      throw bad_plan("segment " + std::to_string(i) + " reaches depth " + std::to_string(tree.depth[k]) + " of its relay tree after the last round");
  }
}

}  // namespace

TrafficSchedule traffic_of(const Correspondence& correspondence, const TransferPlan& plan) {
  return plan_detail::traffic_of(correspondence, plan, nullptr);
}

namespace plan_detail {

TrafficSchedule traffic_of(const Correspondence& correspondence, const TransferPlan& plan, const AtomRoutes* known_routes) {
  if (plan.rounds < 0) throw bad_plan("negative round count " + std::to_string(plan.rounds));
  const std::size_t workers = correspondence.sides.size();
  const std::vector<int>& node_of_worker = plan.topology.node_of_worker;
  const bool has_topology = !node_of_worker.empty();
  if (has_topology && node_of_worker.size() < workers)
    throw bad_plan("the plan's topology places " + std::to_string(node_of_worker.size()) + " workers, the correspondence has " +
                   std::to_string(workers));
  TrafficSchedule schedule;
  schedule.strategy = "weightbridge";
  for (int s = 0; s < kStageCount; ++s) schedule.stage_names.emplace_back(stage_name(static_cast<Stage>(s)));
  schedule.pipeline_depth = plan.pipeline_depth;

  // Segments by round (the planner sorts them so; a hand-built plan need not be).
  std::vector<std::uint32_t> order(plan.segments.size());
  bool relays = false;
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    check_segment(correspondence, plan, i);
    const Segment& segment = plan.segments[i];
    relays = relays || (segment.relay != Segment::kAllToAll && plan.relay_trees[segment.relay].height > 1);
  }
  const std::size_t stage_count = relays ? kStageCount + 1 : kStageCount;
  if (relays) {
    schedule.stage_names.emplace_back("relay");
    constexpr auto bit = [](std::size_t s) { return static_cast<std::uint8_t>(1u << s); };
    schedule.stage_after = {0, bit(0), static_cast<std::uint8_t>(bit(1) | bit(kRelayStage)), 0};
  }
  const auto stage_of = [](Stage stage, std::uint8_t lag) { return lag != 0 ? kRelayStage : static_cast<std::size_t>(stage); };
  {
    std::vector<std::size_t> start(static_cast<std::size_t>(plan.rounds) + 1, 0);
    for (const Segment& segment : plan.segments) ++start[segment.round + 1];
    for (std::size_t r = 0; r < static_cast<std::size_t>(plan.rounds); ++r) start[r + 1] += start[r];
    for (std::size_t i = 0; i < plan.segments.size(); ++i) order[start[plan.segments[i].round]++] = static_cast<std::uint32_t>(i);
  }

  schedule.rounds.resize(static_cast<std::size_t>(plan.rounds));
  // Tallies of the rounds still receiving hops: a segment's hops fall in its round and the few after it.
  std::deque<RoundTally> open;
  PairSums sums;
  std::size_t first_open = 0;
  const auto tally = [&](std::uint32_t round) -> RoundTally& {
    while (first_open + open.size() <= round) open.emplace_back();
    return open[round - first_open];
  };
  const auto flush_before = [&](std::size_t round) {
    while (first_open < round && !open.empty()) {
      open.front().flush(schedule.rounds[first_open], stage_count, sums);
      open.pop_front();
      ++first_open;
    }
    first_open = std::max(first_open, round);
  };

  if (has_topology) {
    AtomRoutes computed;
    if (known_routes == nullptr) computed = atom_routes(correspondence, plan.topology);
    const AtomRoutes& routes = known_routes != nullptr ? *known_routes : computed;
    for (std::uint32_t i : order) {
      const Segment& segment = plan.segments[i];
      flush_before(segment.round);
      const std::int64_t bytes = plan_detail::segment_bytes(routes, segment);
      plan_detail::for_each_hop(correspondence, routes, plan, segment, [&](const plan_detail::Hop& hop) {
        tally(hop.round).add(stage_of(hop.stage, hop.lag), hop.from, hop.to, bytes);
      });
    }
  } else {
    // Without the topology there is no internal exchange: the landers must be all the needers there are.
    std::vector<int> needers;
    for (std::uint32_t i : order) {
      const Segment& segment = plan.segments[i];
      flush_before(segment.round);
      const Atom& atom = correspondence.atoms[segment.atom];
      const auto landers = plan.landers_of(segment);
      needers.clear();
      for (const AtomEndpoint& needer : atom.needers) needers.push_back(needer.worker);
      for (std::uint32_t lander : landers) std::erase(needers, atom.needers[lander].worker);
      if (!needers.empty())
        throw bad_plan("segment " + std::to_string(i) + ": rollout worker " + std::to_string(needers.front()) +
                       " needs the segment and is no lander; routing the internal exchange needs the plan's topology, "
                       "which is empty");
      const std::int64_t bytes = segment.box.numel() * static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
      const auto lander = [&](std::size_t k) { return atom.needers[landers[k]].worker; };
      tally(segment.round).add(static_cast<std::size_t>(Stage::kReceive), atom.holders[segment.sender].worker, lander(segment.origin), bytes);
      for (std::size_t k = 0; k < landers.size(); ++k)
        if (k != segment.origin)
          tally(plan.landing_round(segment, k))
              .add(stage_of(Stage::kExternalExchange, plan.lander_depth(segment, k) > 1 ? 1 : 0), lander(plan.lander_parent(segment, k)),
                   lander(k), bytes);
    }
  }
  flush_before(static_cast<std::size_t>(plan.rounds));
  for (auto& round : schedule.rounds) round.resize(stage_count);
  return schedule;
}

TrafficSchedule traffic_of(const PlanBasis& basis, const RoutedRounds& routed) {
  const TransferPlan& plan = routed.skeleton;
  TrafficSchedule schedule;
  schedule.strategy = "weightbridge";
  for (int s = 0; s < kStageCount; ++s) schedule.stage_names.emplace_back(stage_name(static_cast<Stage>(s)));
  schedule.pipeline_depth = plan.pipeline_depth;
  bool relays = false;
  for (const RoutedRounds::Flow& flow : routed.flows)
    relays = relays || (flow.segment.relay != Segment::kAllToAll && plan.relay_trees[flow.segment.relay].height > 1);
  const std::size_t stage_count = relays ? kStageCount + 1 : kStageCount;
  if (relays) {
    schedule.stage_names.emplace_back("relay");
    constexpr auto bit = [](std::size_t s) { return static_cast<std::uint8_t>(1u << s); };
    schedule.stage_after = {0, bit(0), static_cast<std::uint8_t>(bit(1) | bit(kRelayStage)), 0};
  }
  std::vector<RoundTally> tallies(static_cast<std::size_t>(plan.rounds));
  for (const RoutedRounds::Flow& flow : routed.flows)
    for_each_hop(basis.correspondence, basis.routes, plan, flow.segment, [&](const Hop& hop) {
      tallies[hop.round].add(hop.lag != 0 ? kRelayStage : static_cast<std::size_t>(hop.stage), hop.from, hop.to, flow.bytes);
    });
  schedule.rounds.resize(static_cast<std::size_t>(plan.rounds));
  PairSums sums;
  for (std::size_t r = 0; r < tallies.size(); ++r) tallies[r].flush(schedule.rounds[r], stage_count, sums);
  return schedule;
}

}  // namespace plan_detail
}  // namespace wb

// A WeightBridge transfer plan as traffic: per round and stage, the bytes every worker writes to every
// other, so that the plan is simulated like the baselines.
//
// A segment of B bytes (its box's elements × its tensor's element size) moves in three stages:
//   receive             sender (a holder of its atom) -> origin lander
//   external exchange   origin lander -> every other lander (one per node that needs the atom)
//   internal exchange   on every such node, its lander -> every distinct needer worker on that node other
//                       than the lander (a worker needing several copies of the atom receives it once)
// Transfers are summed per (round, stage, from, to); each such pair counts as one message, since the
// executor coalesces a round's bytes for one peer into one write. The node of a worker comes from the
// topology the plan was made for (TransferPlan::topology).
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

Error bad_plan(const std::string& what) { return Error(ErrorCode::kInvalidArgument, "traffic_of: " + what); }

// One round's transfers: (from, to) -> bytes per stage, summed.
class RoundTally {
 public:
  void add(Stage stage, int from, int to, std::int64_t bytes) {
    pairs_[static_cast<std::size_t>(stage)].push_back(
        {(static_cast<std::uint64_t>(static_cast<std::uint32_t>(from)) << 32) | static_cast<std::uint32_t>(to), bytes});
  }

  // Moves the round's sums into `stages` (one transfer per pair, one message each) and starts afresh.
  void flush(std::vector<std::vector<Transfer>>& stages) {
    stages.resize(kStageCount);
    for (std::size_t s = 0; s < pairs_.size(); ++s) {
      auto& pairs = pairs_[s];
      std::sort(pairs.begin(), pairs.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      auto& out = stages[s];
      for (const auto& [key, bytes] : pairs) {
        const int from = static_cast<int>(key >> 32);
        const int to = static_cast<int>(key & 0xffffffffu);
        if (!out.empty() && out.back().from == from && out.back().to == to) out.back().bytes += bytes;
        else out.push_back(Transfer{from, to, bytes, 1});
      }
      pairs.clear();
    }
  }

 private:
  std::array<std::vector<std::pair<std::uint64_t, std::int64_t>>, kStageCount> pairs_;
};

// Per atom, its distinct needer workers sorted by (node, worker), built on first use.
class NeedersByNode {
 public:
  NeedersByNode(const Correspondence& correspondence, const std::vector<int>* node_of_worker)
      : correspondence_(correspondence), node_of_worker_(node_of_worker), cache_(correspondence.atoms.size()) {}

  int node_of(int worker) const { return (*node_of_worker_)[static_cast<std::size_t>(worker)]; }

  const std::vector<std::pair<int, int>>& of(std::uint32_t atom_index) {
    auto& entry = cache_[atom_index];
    if (entry.empty()) {
      for (const AtomEndpoint& needer : correspondence_.atoms[atom_index].needers)
        entry.emplace_back(node_of_worker_ ? node_of(needer.worker) : 0, needer.worker);
      std::sort(entry.begin(), entry.end());
      entry.erase(std::unique(entry.begin(), entry.end()), entry.end());
    }
    return entry;
  }

 private:
  const Correspondence& correspondence_;
  const std::vector<int>* node_of_worker_;
  std::vector<std::vector<std::pair<int, int>>> cache_;
};

TrafficSchedule build_traffic(const Correspondence& correspondence, const TransferPlan& plan,
                              const std::vector<int>* node_of_worker) {
  if (plan.rounds < 0) throw bad_plan("negative round count " + std::to_string(plan.rounds));
  const std::size_t workers = correspondence.sides.size();
  if (node_of_worker && node_of_worker->size() < workers)
    throw bad_plan("the plan's topology places " + std::to_string(node_of_worker->size()) + " workers, the correspondence has " +
                   std::to_string(workers));
  TrafficSchedule schedule;
  schedule.strategy = "weightbridge";
  for (int s = 0; s < kStageCount; ++s) schedule.stage_names.emplace_back(stage_name(static_cast<Stage>(s)));
  schedule.pipeline_depth = plan.pipeline_depth;

  // Segments by round (the planner sorts them so; a hand-built plan need not be).
  std::vector<std::uint32_t> order(plan.segments.size());
  std::vector<std::size_t> round_start(static_cast<std::size_t>(plan.rounds) + 1, 0);
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const std::uint32_t round = plan.segments[i].round;
    if (round >= static_cast<std::uint32_t>(plan.rounds))
      throw bad_plan("segment " + std::to_string(i) + " is in round " + std::to_string(round) + " of " +
                     std::to_string(plan.rounds));
    ++round_start[round + 1];
  }
  for (std::size_t r = 0; r < static_cast<std::size_t>(plan.rounds); ++r) round_start[r + 1] += round_start[r];
  {
    std::vector<std::size_t> next(round_start.begin(), round_start.end() - 1);
    for (std::size_t i = 0; i < plan.segments.size(); ++i) order[next[plan.segments[i].round]++] = static_cast<std::uint32_t>(i);
  }

  schedule.rounds.resize(static_cast<std::size_t>(plan.rounds));
  RoundTally tally;
  NeedersByNode needers_by_node(correspondence, node_of_worker);
  std::vector<int> lander_workers;
  // Neighbouring segments of one atom on one route (sender, landers, origin) move as one: their bytes are
  // summed before the route's hops are listed.
  struct Route {
    std::uint32_t atom = 0;
    int sender = -1;
    int origin = -1;
    std::vector<int> landers;
    std::int64_t bytes = 0;
  } route;
  const auto emit = [&](std::size_t segment_index) {
    if (route.sender < 0) return;
    tally.add(Stage::kReceive, route.sender, route.origin, route.bytes);
    for (int lander : route.landers)
      if (lander != route.origin) tally.add(Stage::kExternalExchange, route.origin, lander, route.bytes);
    // Internal exchange: every lander serves the other needers of its node.
    const auto& needers = needers_by_node.of(route.atom);
    if (!node_of_worker) {
      // Without the topology the landers must be all the needers there are.
      for (const auto& [node, worker] : needers)
        if (std::find(route.landers.begin(), route.landers.end(), worker) == route.landers.end())
          throw bad_plan("segment " + std::to_string(segment_index) + ": rollout worker " + std::to_string(worker) +
                         " needs the segment and is no lander; routing the internal exchange needs the plan's "
                         "topology, which is empty");
    } else {
      for (int lander : route.landers) {
        const int node = needers_by_node.node_of(lander);
        auto it = std::lower_bound(needers.begin(), needers.end(), std::pair{node, -1});
        for (; it != needers.end() && it->first == node; ++it)
          if (it->second != lander) tally.add(Stage::kInternalExchange, lander, it->second, route.bytes);
      }
    }
    route.sender = -1;
  };

  for (std::size_t r = 0; r < static_cast<std::size_t>(plan.rounds); ++r) {
    std::size_t last = 0;
    for (std::size_t k = round_start[r]; k < round_start[r + 1]; ++k) {
      const std::size_t i = order[k];
      const Segment& segment = plan.segments[i];
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
      lander_workers.clear();
      for (std::uint32_t needer : plan.landers_of(segment)) {
        if (needer >= atom.needers.size())
          throw bad_plan("segment " + std::to_string(i) + " lands on needer " + std::to_string(needer) + " of " +
                         std::to_string(atom.needers.size()));
        lander_workers.push_back(atom.needers[needer].worker);
      }
      const std::int64_t bytes =
          segment.box.numel() * static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
      const int sender = atom.holders[segment.sender].worker;
      const int origin = lander_workers[segment.origin];
      if (route.sender == sender && route.atom == segment.atom && route.origin == origin && route.landers == lander_workers) {
        route.bytes += bytes;
      } else {
        emit(last);
        route.atom = segment.atom;
        route.sender = sender;
        route.origin = origin;
        route.landers.assign(lander_workers.begin(), lander_workers.end());
        route.bytes = bytes;
      }
      last = i;
    }
    emit(last);
    tally.flush(schedule.rounds[r]);
  }
  return schedule;
}

}  // namespace

TrafficSchedule traffic_of(const Correspondence& correspondence, const TransferPlan& plan) {
  const std::vector<int>& nodes = plan.topology.node_of_worker;
  return build_traffic(correspondence, plan, nodes.empty() ? nullptr : &nodes);
}

}  // namespace wb

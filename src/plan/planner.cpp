// The global planner (paper §3.2): de-duplicates both sides, routes every piece of every atom through the
// three stages, balances the load over the whole model, and cuts the transfer into rounds that fit the
// buffer budget. The external exchange is all-to-all or runs along relay trees of bounded fan-out; unless
// told which, the planner builds both, with a few fan-outs and round counts, simulates each on the
// topology's network model and keeps the fastest (planning.hpp lists the steps).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <new>
#include <optional>
#include <string>
#include <utility>

#include "core/parallel.hpp"
#include "plan/planning.hpp"
#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace wb {

const char* stage_name(Stage stage) {
  switch (stage) {
    case Stage::kReceive: return "receive";
    case Stage::kExternalExchange: return "external exchange";
    case Stage::kInternalExchange: return "internal exchange";
  }
  return "unknown stage";
}

std::int64_t TransferPlan::worker_buffer_bytes(int worker) const {
  const auto w = static_cast<std::size_t>(worker);
  return pipeline_depth * (worker_send_slot_bytes[w] + worker_receive_slot_bytes[w]);
}

namespace {

using namespace plan_detail;

std::string mib(std::int64_t bytes) { return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB"; }

std::string plan_error_prefix(const Correspondence& correspondence, const Atom& atom) {
  return "tensor " + correspondence.tensors[atom.tensor].name + " box " + atom.box.to_string();
}

// The fan-outs the planner simulates when it chooses. A node's writes per round grow with the fan-out
// (every one costs link time), and its relay trees get deeper as it shrinks (every level costs the transfer a
// round of fill at the end): 8 relays in two levels up to 73 nodes and in three up to 585; 4 writes half as
// often but reaches only 21 in two levels, and is tried only up to there (deeper, 8 is faster). Each is
// all-to-all in groups it reaches in one hop, and 16 is tried only where it is that (up to 17 nodes: one hop
// instead of two, for twice the writes).
constexpr int kMostFanOut = 16;
std::vector<int> relay_fan_outs(const NodeSets& sets) {
  int largest = 0;
  for (int size : sets.size) largest = std::max(largest, size);
  std::vector<int> fan_outs;
  if (largest - 1 > 8 && largest - 1 <= kMostFanOut) fan_outs.push_back(kMostFanOut);
  fan_outs.push_back(8);
  if (largest - 1 > 4 && largest <= 1 + 4 + 4 * 4) fan_outs.push_back(4);
  return fan_outs;
}

// Round counts the planner tries, as multiples of the fewest (minimum_rounds). More rounds make the fill at
// the end (a round per hop) smaller and cost every round's writes once more: the best lies in between, where
// the two are about equal, and the simulation finds it.
constexpr double kRoundMultiples[] = {1, 1.5, 2, 3, 4, 6, 8, 12, 16};
constexpr int kMultipleCount = static_cast<int>(std::size(kRoundMultiples));
constexpr int kMostRounds = 4096;

TransferPlan plan_checked(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options,
                          const LowerBound& bound) {
  const AtomRoutes routes = atom_routes(correspondence, topology);
  const auto& atoms = correspondence.atoms;

  // A slice along an atom's axis is the smallest thing a round can hold; each worker needs room for a
  // few of them per round.
  const std::int64_t slot_budget = options.buffer_bytes_per_worker / options.pipeline_depth;
  for (std::size_t a = 0; a < atoms.size(); ++a)
    if (routes.atoms[a].unit_bytes * 4 > slot_budget)
      throw Error(ErrorCode::kInvalidArgument,
                  plan_error_prefix(correspondence, atoms[a]) + ": one slice along axis " +
                      std::to_string(routes.atoms[a].axis) + " takes " + std::to_string(routes.atoms[a].unit_bytes) +
                      " bytes; a buffer budget of " + std::to_string(options.buffer_bytes_per_worker) +
                      " bytes per worker over " + std::to_string(options.pipeline_depth) +
                      " pipeline slots cannot hold it (raise the buffer budget)");

  const std::int64_t piece_bytes = std::max<std::int64_t>(1, std::min(choose_piece_bytes(correspondence, bound, options), slot_budget / 16));
  const PieceTable pieces = cut_pieces(correspondence, routes, piece_bytes);
  std::vector<std::int64_t> send_load;
  const std::vector<std::uint32_t> senders = assign_senders(correspondence, routes, pieces, topology, send_load);
  const Landing landing = assign_landers(correspondence, routes, pieces, topology);
  const NodeSets sets = group_node_sets(routes);
  const int base_rounds = minimum_rounds(correspondence, routes, pieces, senders, options);
  PlanBasis basis{correspondence, topology, routes, pieces, senders, landing, sets, options, {}, 0};
  classify_pieces(basis);

  if (options.relay_fan_out != kRelayChoose) {
    TransferPlan plan = assign_rounds(basis, assign_trees(pieces, landing, sets, options.relay_fan_out), base_rounds);
    plan.bound = bound;
    return plan;
  }

  // Choose, on the topology's network model: every shape at two round counts (twice and four times the
  // fewest; the fewest and twice when those are many already), then the fastest shape at neighbouring counts
  // while they help. Drafts are simulated from their flows, those of one step side by side on the host's
  // cores (each is routed and simulated on its own); the winner is built in full from its draft's routing.
  const auto rounds_at = [&](int multiple) {
    return static_cast<int>(std::min<double>(kMostRounds, std::max<double>(base_rounds, std::round(base_rounds * kRoundMultiples[multiple]))));
  };
  struct Shape {
    Exchange exchange;
    std::vector<double> seconds = std::vector<double>(kMultipleCount, -1);  // per multiple; -1: not simulated
    int best = -1;
    std::optional<RoutedRounds> best_routed;  // the draft of `best`
    // Drafts simulated ahead of being asked for (see below), by multiple: seconds and draft.
    std::vector<std::optional<std::pair<double, RoutedRounds>>> ahead = std::vector<std::optional<std::pair<double, RoutedRounds>>>(kMultipleCount);
  };
  std::vector<ExchangeCandidate> tried;
  // Simulates each (shape, multiple) not simulated yet, in parallel, and records them in the order given;
  // `ahead` are simulated in the same batch and kept until asked for (on `threads` threads, 0: the cores).
  const auto simulate_all = [&](const std::vector<std::pair<Shape*, int>>& wanted, const std::vector<std::pair<Shape*, int>>& ahead,
                                int threads) {
    const auto fresh = [](Shape* shape, int multiple) {
      return multiple >= 0 && multiple < kMultipleCount && shape->seconds[static_cast<std::size_t>(multiple)] < 0 &&
             !shape->ahead[static_cast<std::size_t>(multiple)];
    };
    std::vector<std::pair<Shape*, int>> jobs;
    for (const auto& [shape, multiple] : wanted)
      if (fresh(shape, multiple)) jobs.emplace_back(shape, multiple);
    for (const auto& [shape, multiple] : ahead)
      if (fresh(shape, multiple)) jobs.emplace_back(shape, multiple);
    std::vector<std::optional<RoutedRounds>> routed(jobs.size());
    std::vector<double> seconds(jobs.size());
    run_tasks(jobs.size(), threads, [&](std::size_t j, int) {
      routed[j] = route_rounds(basis, jobs[j].first->exchange, rounds_at(jobs[j].second));
      seconds[j] = simulate(traffic_of(basis, *routed[j]), topology).ewtt_seconds;
    });
    for (std::size_t j = 0; j < jobs.size(); ++j)
      jobs[j].first->ahead[static_cast<std::size_t>(jobs[j].second)].emplace(seconds[j], std::move(*routed[j]));
    for (const auto& [shape, multiple] : wanted) {
      if (multiple < 0 || multiple >= kMultipleCount) continue;
      auto& draft = shape->ahead[static_cast<std::size_t>(multiple)];
      if (!draft) continue;  // simulated and recorded before
      const double time = draft->first;
      tried.push_back({draft->second.skeleton.exchange, std::max(1, shape->exchange.largest_fan_out), shape->exchange.height,
                       draft->second.skeleton.rounds, time, false});
      shape->seconds[static_cast<std::size_t>(multiple)] = time;
      if (shape->best < 0 || time < shape->seconds[static_cast<std::size_t>(shape->best)]) {
        shape->best = multiple;
        shape->best_routed = std::move(draft->second);
      }
      draft.reset();
    }
  };
  const int first = base_rounds < 32 ? 2 : 0;  // index of 2x, or 1x
  std::vector<Shape> shapes;
  for (int f : relay_fan_outs(sets)) shapes.emplace_back().exchange = assign_trees(pieces, landing, sets, f);
  {
    std::vector<std::pair<Shape*, int>> start, ahead;
    for (Shape& shape : shapes) start.insert(start.end(), {{&shape, first}, {&shape, first + 2}});
    // With one shape, the climb below always asks for the multiple between the two (a neighbour of
    // whichever is faster): simulated in this batch, on a thread of its own, the three take the time of
    // two on two cores, where the climb's one would run alone.
    if (shapes.size() == 1) ahead.emplace_back(&shapes.front(), first + 1);
    simulate_all(start, ahead, ahead.empty() ? 0 : static_cast<int>(start.size() + ahead.size()));
  }
  Shape* fastest = &shapes.front();
  for (Shape& shape : shapes)
    if (shape.seconds[static_cast<std::size_t>(shape.best)] < fastest->seconds[static_cast<std::size_t>(fastest->best)]) fastest = &shape;
  // Climb to the best multiple: simulate the neighbours of the best so far until both are slower.
  for (int step = 0; step < kMultipleCount; ++step) {
    const int at = fastest->best;
    simulate_all({{fastest, at - 1}, {fastest, at + 1}}, {}, 0);
    if (fastest->best == at) break;
  }
  Shape& best = *fastest;
  const double best_seconds = best.seconds[static_cast<std::size_t>(best.best)];
  TransferPlan plan = assign_rounds(basis, best.exchange, std::move(*best.best_routed));
  plan.bound = bound;
  for (ExchangeCandidate& c : tried) c.chosen = c.shape == plan.exchange && c.rounds == plan.rounds && c.simulated_seconds == best_seconds;
  plan.candidates = std::move(tried);
  return plan;
}

}  // namespace

TransferPlan plan_transfer(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options) {
  if (options.pipeline_depth < 1 || options.buffer_bytes_per_worker <= 0 || options.min_rounds < 1)
    throw Error(ErrorCode::kInvalidArgument, "plan options: pipeline depth, buffer budget and minimum rounds must be positive");
  if (options.relay_fan_out < kRelayAllToAll)
    throw Error(ErrorCode::kInvalidArgument, "plan options: relay fan-out " + std::to_string(options.relay_fan_out) +
                                                 " (0: choose, -1: all-to-all, F >= 1: relay trees)");
  if (options.relay_fan_out >= 1 && options.pipeline_depth < 2)
    throw Error(ErrorCode::kInvalidArgument, "plan options: relay trees need a pipeline depth of at least 2 (a relay "
                                             "forwards from the previous round's buffer)");
  const LowerBound bound = lower_bound(correspondence, topology);  // also checks the topology against the workers
  std::int64_t estimate = 0;
  if (options.memory_limit_bytes > 0) {
    estimate = plan_detail::estimate_plan_memory(correspondence, topology, options, bound);
    if (estimate > options.memory_limit_bytes)
      throw Error(ErrorCode::kUnsupported,
                  "planning " + std::to_string(correspondence.sides.size()) + " workers would take about " + mib(estimate) +
                      " of memory, more than the limit of " + mib(options.memory_limit_bytes) +
                      " (plan_memory_mib; larger transfer buffers, buffer_mib, mean fewer pieces and rounds)");
  }
  PlanOptions effective = options;
  // Relays forward from the previous round's slot: with one slot there is none.
  if (effective.pipeline_depth < 2 && effective.relay_fan_out == kRelayChoose) effective.relay_fan_out = kRelayAllToAll;
  try {
    TransferPlan plan = plan_checked(correspondence, topology, effective, bound);
    plan.memory_estimate = estimate;
    return plan;
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kUnsupported, "planning " + std::to_string(correspondence.sides.size()) +
                                             " workers ran out of memory (estimated " +
                                             mib(estimate > 0 ? estimate : plan_detail::estimate_plan_memory(correspondence, topology, options, bound)) +
                                             (options.memory_limit_bytes > 0 ? ", limit " + mib(options.memory_limit_bytes) : std::string()) +
                                             "; raise buffer_mib for fewer pieces and rounds)");
  }
}

}  // namespace wb

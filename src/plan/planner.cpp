// The global planner (paper §3.2): de-duplicates both sides, routes every piece of every atom through the
// three stages, balances the load over the whole model, and cuts the transfer into rounds that fit the
// buffer budget. The external exchange is all-to-all or runs along relay trees of bounded fan-out; unless
// told which, the planner builds both, with a few fan-outs and round counts, simulates each on the
// topology's network model and keeps the fastest (planning.hpp lists the steps).
#include <algorithm>
#include <limits>
#include <new>
#include <string>

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

// The fan-outs the planner simulates when it chooses. The largest is all-to-all in every group of up to
// kMostFanOut + 1 nodes and relay trees beyond, so that no choice makes a node write to more than
// kMostFanOut others per round however many replicas there are. Smaller ones only where some group is
// larger than they reach in one hop. Fan-out 2 would double the depth of 4 to halve writes that trees by
// column (a node hears from one parent per column whatever the fan-out) no longer have.
constexpr int kMostFanOut = 16;
std::vector<int> relay_fan_outs(const NodeSets& sets) {
  int largest = 0;
  for (int size : sets.size) largest = std::max(largest, size);
  std::vector<int> fan_outs{kMostFanOut};
  for (int f : {8, 4})
    if (largest - 1 > f) fan_outs.push_back(f);
  return fan_outs;
}

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

  const auto build = [&](const Exchange& exchange, int rounds) {
    TransferPlan plan = assign_rounds(correspondence, topology, routes, pieces, senders, landing, sets, exchange, rounds, options);
    plan.bound = bound;
    return plan;
  };
  if (options.relay_fan_out != kRelayChoose) return build(assign_trees(pieces, landing, sets, options.relay_fan_out), base_rounds);

  // Choose, on the topology's network model: every shape with twice the fewest rounds (the fewest when
  // those are many already: a round of fill is then small), then the fastest with more rounds while that
  // helps, or with fewer (relays pay a round of fill per hop, so deeper trees want smaller rounds; every
  // round costs its writes' latency), and the runner-up once with fewer if that helped the fastest, else
  // with more, in case it gains more.
  // Drafts are simulated; the winner is built in full.
  const int first_multiple = base_rounds < 32 ? 2 : 1;
  struct Shape {
    Exchange exchange;
    double seconds = std::numeric_limits<double>::infinity();
    int multiple = 1;
  };
  std::vector<ExchangeCandidate> tried;
  const auto simulate_draft = [&](const Shape& shape, int multiple) {
    const TransferPlan draft = assign_rounds(correspondence, topology, routes, pieces, senders, landing, sets, shape.exchange,
                                             base_rounds * multiple, options, false);
    const double seconds = simulate(plan_detail::traffic_of(correspondence, draft, &routes), topology).ewtt_seconds;
    tried.push_back({draft.exchange, std::max(1, shape.exchange.largest_fan_out), shape.exchange.height, draft.rounds, seconds, false});
    return seconds;
  };
  // Tries `multiple` for `shape`; true when it was faster (and is kept).
  const auto improve = [&](Shape& shape, int multiple) {
    const double seconds = simulate_draft(shape, multiple);
    if (seconds >= shape.seconds) return false;
    shape.seconds = seconds;
    shape.multiple = multiple;
    return true;
  };
  std::vector<Shape> shapes;
  for (int f : relay_fan_outs(sets)) shapes.push_back({assign_trees(pieces, landing, sets, f), std::numeric_limits<double>::infinity(), first_multiple});
  for (Shape& shape : shapes) shape.seconds = simulate_draft(shape, shape.multiple);
  std::vector<std::size_t> by_speed(shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) by_speed[i] = i;
  std::stable_sort(by_speed.begin(), by_speed.end(), [&](std::size_t a, std::size_t b) { return shapes[a].seconds < shapes[b].seconds; });
  Shape& fastest = shapes[by_speed[0]];
  // With many rounds already (a buffer-bound plan), a round of fill is under 2 % and more rounds only add
  // their writes' latency: the shapes' first drafts decide.
  if (base_rounds < 64) {
    bool more = false;
    for (int multiple = first_multiple + 1; multiple <= first_multiple + 2 && improve(fastest, multiple); ++multiple) more = true;
    const bool fewer = !more && first_multiple > 1 && improve(fastest, first_multiple - 1);
    if (by_speed.size() > 1) improve(shapes[by_speed[1]], fewer ? first_multiple - 1 : first_multiple + 1);
  }
  const Shape& best = *std::min_element(shapes.begin(), shapes.end(), [](const Shape& a, const Shape& b) { return a.seconds < b.seconds; });
  TransferPlan plan = build(best.exchange, base_rounds * best.multiple);
  for (ExchangeCandidate& c : tried) c.chosen = c.shape == plan.exchange && c.rounds == plan.rounds && c.simulated_seconds == best.seconds;
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
    estimate = estimate_plan_memory(correspondence, topology, options);
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
    return plan_checked(correspondence, topology, effective, bound);
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::kUnsupported, "planning " + std::to_string(correspondence.sides.size()) +
                                             " workers ran out of memory (estimated " +
                                             mib(estimate > 0 ? estimate : estimate_plan_memory(correspondence, topology, options)) +
                                             (options.memory_limit_bytes > 0 ? ", limit " + mib(options.memory_limit_bytes) : std::string()) +
                                             "; raise buffer_mib for fewer pieces and rounds)");
  }
}

}  // namespace wb

// Rounds: every piece's trainer round (piece_rounds.cpp), then segments, slot sizes (more rounds while a
// worker's slots exceed its budget), and traffic tallies.
#include <algorithm>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_map>

#include "plan/planning.hpp"
#include "weightbridge/status.hpp"

namespace wb::plan_detail {
namespace {

// The most slots deepen_pipeline gives a worker (more bought nothing in the measurement it cites).
constexpr int kDeepestPipeline = 8;

// Lists of workers to ids, hashed (a std::map of vectors compared every list about log n times; the planner
// keys a few hundred thousand pieces and segments this way).
struct WorkerListHash {
  std::size_t operator()(const std::vector<int>& list) const {
    std::uint64_t h = 0xcbf29ce484222325ull;
    for (int v : list) h = (h ^ static_cast<std::uint32_t>(v)) * 0x100000001b3ull;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
};
using WorkerListIds = std::unordered_map<std::vector<int>, std::uint32_t, WorkerListHash>;

// Per atom, its distinct needer workers as one id (in order of first appearance): atoms with the same
// needers are handed on alike.
std::vector<std::uint32_t> needer_ids(const std::vector<Atom>& atoms) {
  std::vector<std::uint32_t> out(atoms.size());
  WorkerListIds ids;
  std::vector<int> workers;
  for (std::size_t a = 0; a < atoms.size(); ++a) {
    workers.clear();
    for (const AtomEndpoint& needer : atoms[a].needers) workers.push_back(needer.worker);
    workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
    out[a] = ids.try_emplace(workers, static_cast<std::uint32_t>(ids.size())).first->second;
  }
  return out;
}

// Within a round, segments of one route sit next to each other, so that the writes that forward them out
// of a receive buffer coalesce; neighbours along an atom's axis on one route become one segment.
void sort_and_merge(const Correspondence& correspondence, const AtomRoutes& routes, TransferPlan& plan) {
  const auto& atoms = correspondence.atoms;
  // Every distinct list of landing workers gets an id, in order of the lists (each list compared with the
  // others once, not on every comparison of the sort: a list has one entry per node).
  std::vector<std::uint32_t> route_id(plan.segments.size());
  {
    WorkerListIds first_seen;  // list -> its index in order of first appearance
    std::vector<const std::vector<int>*> lists;
    std::vector<int> workers;
    for (std::size_t i = 0; i < plan.segments.size(); ++i) {
      const Segment& s = plan.segments[i];
      workers.clear();
      for (std::uint32_t needer : plan.landers_of(s)) workers.push_back(atoms[s.atom].needers[needer].worker);
      const auto [it, added] = first_seen.try_emplace(workers, static_cast<std::uint32_t>(lists.size()));
      if (added) lists.push_back(&it->first);
      route_id[i] = it->second;
    }
    // Ids by the lists' order: the rank of every list among the distinct ones.
    std::vector<std::uint32_t> by_order(lists.size()), rank(lists.size());
    std::iota(by_order.begin(), by_order.end(), 0u);
    std::sort(by_order.begin(), by_order.end(), [&](std::uint32_t x, std::uint32_t y) { return *lists[x] < *lists[y]; });
    for (std::uint32_t r = 0; r < by_order.size(); ++r) rank[by_order[r]] = r;
    for (std::uint32_t& id : route_id) id = rank[id];
  }
  std::vector<std::uint32_t> order(plan.segments.size());
  std::iota(order.begin(), order.end(), 0u);
  // Atoms with the same needers are handed on inside their nodes to the same workers: side by side in a
  // receive buffer, they go on in one write per peer instead of one per atom.
  const std::vector<std::uint32_t> needer_id = needer_ids(atoms);
  // The keys, made once per segment rather than twice per comparison.
  using RouteKey = std::tuple<std::uint32_t, int, int, std::uint32_t, std::uint32_t, std::uint32_t, std::uint32_t>;
  std::vector<RouteKey> keys(plan.segments.size());
  for (std::size_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& s = plan.segments[i];
    const Atom& atom = atoms[s.atom];
    keys[i] = RouteKey{s.round, atom.holders[s.sender].worker, atom.needers[plan.landers[s.first_lander + s.origin]].worker, s.relay,
                       route_id[i], needer_id[s.atom], s.atom};
  }
  // Same route first (landers as workers), then the same needers, then checkpoint order.
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    if (keys[x] != keys[y]) return keys[x] < keys[y];
    return plan.segments[x].box.offset < plan.segments[y].box.offset;
  });
  std::vector<Segment> sorted;
  std::vector<std::uint32_t> landers;
  sorted.reserve(order.size());
  landers.reserve(plan.landers.size());
  for (std::uint32_t i : order) {
    Segment segment = std::move(plan.segments[i]);
    const auto list = plan.landers_of(segment);
    if (!sorted.empty()) {
      Segment& last = sorted.back();
      const auto axis = static_cast<std::size_t>(routes.atoms[segment.atom].axis);
      if (last.atom == segment.atom && last.round == segment.round && last.sender == segment.sender &&
          last.origin == segment.origin && last.relay == segment.relay && axis < segment.box.offset.size() &&
          last.box.offset[axis] + last.box.extent[axis] == segment.box.offset[axis] &&
          std::equal(list.begin(), list.end(), landers.begin() + last.first_lander)) {
        last.box.extent[axis] += segment.box.extent[axis];
        continue;
      }
    }
    const auto first = static_cast<std::uint32_t>(landers.size());
    landers.insert(landers.end(), list.begin(), list.end());
    segment.first_lander = first;
    sorted.push_back(std::move(segment));
  }
  plan.segments = std::move(sorted);
  plan.landers = std::move(landers);
}

// Rounds that fill less of their slots than the budget allows (a model small for the buffer, many rounds
// for the fill at the end): more slots in flight, up to kDeepestPipeline, within the same buffer memory. A
// relay holds its receive slot until its forwards are done, so with only the requested depth the trainers
// wait for slots while links idle: at 4 replicas on 1 Gbit/s links, 8 slots gave 1.09 x T_min where 4 gave
// 1.21 x (the same rounds). Depth 1 (no relays) stays.
void deepen_pipeline(TransferPlan& plan, std::int64_t budget) {
  if (plan.pipeline_depth < 2) return;
  std::int64_t largest = 1;
  for (std::size_t w = 0; w < plan.worker_send_slot_bytes.size(); ++w)
    largest = std::max(largest, plan.worker_send_slot_bytes[w] + plan.worker_receive_slot_bytes[w]);
  plan.pipeline_depth = static_cast<int>(std::clamp<std::int64_t>(budget / largest, plan.pipeline_depth, std::max(plan.pipeline_depth, kDeepestPipeline)));
}

}  // namespace

int minimum_rounds(const Correspondence& correspondence, const AtomRoutes& routes, const PieceTable& pieces,
                   const std::vector<std::uint32_t>& senders, const PlanOptions& options) {
  // Per worker: what it packs plus what it receives. Neither depends on the exchange's shape: every lander
  // and every other needer of a node receives each of its pieces once.
  const auto& atoms = correspondence.atoms;
  std::vector<std::int64_t> traffic(correspondence.sides.size(), 0);
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    const Atom& atom = atoms[pieces.atom[p]];
    const AtomRoute& route = routes.atoms[pieces.atom[p]];
    const std::int64_t bytes = pieces.bytes[p];
    traffic[static_cast<std::size_t>(atom.holders[senders[p]].worker)] += bytes;
    const NodeNeeders* nodes = routes.nodes_of(route);
    for (std::uint16_t k = 0; k < route.node_count; ++k) {
      const std::uint32_t* needers = routes.needers_of(nodes[k]);
      for (std::uint32_t i = 0; i < nodes[k].count; ++i) traffic[static_cast<std::size_t>(atom.needers[needers[i]].worker)] += bytes;
    }
  }
  const std::int64_t busiest = traffic.empty() ? 0 : *std::max_element(traffic.begin(), traffic.end());
  const std::int64_t slot_budget = options.buffer_bytes_per_worker / options.pipeline_depth;
  return static_cast<int>(std::max<std::int64_t>(options.min_rounds, (busiest + slot_budget - 1) / slot_budget));
}

void classify_pieces(PlanBasis& basis) {
  const auto& atoms = basis.correspondence.atoms;
  const PieceTable& pieces = basis.pieces;
  const std::vector<std::uint32_t> needers_of_atom = needer_ids(atoms);
  // Per piece: (sender worker, needers, landing workers), the last compared as a list.
  WorkerListIds ids;
  std::vector<int> key;
  basis.piece_class.resize(pieces.size());
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    const Atom& atom = atoms[pieces.atom[p]];
    key.assign({atom.holders[basis.senders[p]].worker, static_cast<int>(needers_of_atom[pieces.atom[p]])});
    for (std::uint32_t i = basis.landing.first[p]; i < basis.landing.first[p + 1]; ++i)
      key.push_back(atom.needers[basis.landing.landers[i]].worker);
    basis.piece_class[p] = ids.try_emplace(key, static_cast<std::uint32_t>(ids.size())).first->second;
  }
  basis.classes = static_cast<std::uint32_t>(ids.size());
}

RoutedRounds route_rounds(const PlanBasis& basis, const Exchange& exchange, int rounds) {
  const Correspondence& correspondence = basis.correspondence;
  const AtomRoutes& routes = basis.routes;
  const PieceTable& pieces = basis.pieces;
  const NodeSets& sets = basis.sets;
  const Landing& landing = basis.landing;
  const std::size_t workers = correspondence.sides.size();

  RoutedRounds routed;
  TransferPlan& plan = routed.skeleton;
  plan.pipeline_depth = basis.options.pipeline_depth;
  plan.topology = basis.topology;
  plan.landers = landing.landers;
  // Relay trees of the forests, and each piece's tree among all trees of all sets.
  std::vector<std::uint32_t> first_relay(sets.size.size(), Segment::kAllToAll);
  std::vector<std::size_t> first_tree(sets.size.size(), 0);
  std::size_t tree_count = 0;
  for (std::size_t s = 0; s < sets.size.size(); ++s) {
    const RelayForest& forest = exchange.forests[s];
    first_tree[s] = tree_count;
    tree_count += static_cast<std::size_t>(forest.tree_count());
    if (forest.all_to_all) continue;
    first_relay[s] = static_cast<std::uint32_t>(plan.relay_trees.size());
    plan.relay_trees.insert(plan.relay_trees.end(), forest.trees.begin(), forest.trees.end());
  }
  // Each piece's target: its relay tree and column, i.e. its origin worker, and its weight there.
  RoundTargets targets;
  targets.origin.resize(pieces.size());
  targets.weight.resize(pieces.size());
  std::vector<std::size_t> tree_of_piece(pieces.size());
  {
    std::unordered_map<std::uint64_t, std::uint32_t> origins;
    for (std::uint32_t p = 0; p < pieces.size(); ++p) {
      tree_of_piece[p] = first_tree[sets.of_atom[pieces.atom[p]]] + exchange.tree[p];
      targets.origin[p] =
          origins.try_emplace(static_cast<std::uint64_t>(tree_of_piece[p]) << 16 | landing.column[p], static_cast<std::uint32_t>(origins.size()))
              .first->second;
      const AtomRoute& route = routes.atoms[pieces.atom[p]];
      double takers = 0;
      for (std::uint16_t k = 0; k < route.node_count; ++k) takers += routes.nodes_of(route)[k].count;
      targets.weight[p] = static_cast<double>(pieces.bytes[p]) * takers / std::max<std::uint16_t>(1, route.node_count);
    }
  }
  // The rounds after the last trainer round in which relays still forward.
  const int tail = exchange.height > 1 ? exchange.height - 1 : 0;

  const std::int64_t budget = basis.options.buffer_bytes_per_worker;
  std::vector<std::int64_t> send_round, receive_round;
  std::unordered_map<std::uint64_t, std::uint32_t> flow_of;
  for (int attempt = 0;; ++attempt) {
    routed.round = piece_rounds(correspondence, pieces, basis.senders, targets, rounds);
    plan.rounds = rounds + tail;
    routed.flows.clear();
    flow_of.clear();
    for (std::uint32_t p = 0; p < pieces.size(); ++p) {
      const std::uint64_t key = (static_cast<std::uint64_t>(routed.round[p]) * basis.classes + basis.piece_class[p]) * tree_count + tree_of_piece[p];
      const auto [it, added] = flow_of.try_emplace(key, static_cast<std::uint32_t>(routed.flows.size()));
      if (added) {
        const std::uint32_t a = pieces.atom[p];
        const std::uint32_t set = sets.of_atom[a];
        const RelayForest& forest = exchange.forests[set];
        RoutedRounds::Flow flow;
        flow.segment.atom = a;
        flow.segment.round = routed.round[p];
        flow.segment.sender = basis.senders[p];
        flow.segment.first_lander = landing.first[p];
        flow.segment.lander_count = routes.atoms[a].node_count;
        flow.segment.origin = static_cast<std::uint16_t>(forest.root(exchange.tree[p]));
        flow.segment.relay = forest.all_to_all ? Segment::kAllToAll : first_relay[set] + exchange.tree[p];
        routed.flows.push_back(std::move(flow));
      }
      routed.flows[it->second].bytes += pieces.bytes[p];
    }
    // Slots: per worker, its largest round of packing and of receiving.
    const auto total = static_cast<std::size_t>(plan.rounds);
    send_round.assign(workers * total, 0);
    receive_round.assign(workers * total, 0);
    for (const RoutedRounds::Flow& flow : routed.flows)
      for_each_hop(correspondence, routes, plan, flow.segment, [&](const Hop& hop) {
        if (hop.stage == Stage::kReceive) send_round[static_cast<std::size_t>(hop.from) * total + hop.round] += flow.bytes;
        receive_round[static_cast<std::size_t>(hop.to) * total + hop.round] += flow.bytes;
      });
    plan.worker_send_slot_bytes.assign(workers, 0);
    plan.worker_receive_slot_bytes.assign(workers, 0);
    bool fits = true;
    for (std::size_t w = 0; w < workers; ++w) {
      for (std::size_t r = 0; r < total; ++r) {
        plan.worker_send_slot_bytes[w] = std::max(plan.worker_send_slot_bytes[w], send_round[w * total + r]);
        plan.worker_receive_slot_bytes[w] = std::max(plan.worker_receive_slot_bytes[w], receive_round[w * total + r]);
      }
      fits = fits && plan.worker_buffer_bytes(static_cast<int>(w)) <= budget;
    }
    if (fits) break;
    if (attempt == 40)
      throw Error(ErrorCode::kInvalidArgument, "cannot cut the transfer into rounds that fit a buffer budget of " +
                                                   std::to_string(budget) + " bytes per worker (raise the budget)");
    rounds += std::max(1, rounds / 8);
  }
  deepen_pipeline(plan, budget);
  if (exchange.fan_out == kRelayAllToAll || exchange.height <= 1) {
    plan.exchange = "all-to-all";
  } else {
    plan.exchange = "relay trees, fan-out " + std::to_string(exchange.fan_out);
  }
  return routed;
}

TransferPlan assign_rounds(const PlanBasis& basis, const Exchange& exchange, int rounds) {
  return assign_rounds(basis, exchange, route_rounds(basis, exchange, rounds));
}

TransferPlan assign_rounds(const PlanBasis& basis, const Exchange& exchange, RoutedRounds routed) {
  const Correspondence& correspondence = basis.correspondence;
  const AtomRoutes& routes = basis.routes;
  const PieceTable& pieces = basis.pieces;
  const Landing& landing = basis.landing;
  const auto& atoms = correspondence.atoms;
  const std::size_t workers = correspondence.sides.size();
  const std::size_t nodes = static_cast<std::size_t>(basis.topology.num_nodes());
  const auto node_of = [&](int worker) { return static_cast<std::size_t>(basis.topology.node_of_worker[static_cast<std::size_t>(worker)]); };

  // Traffic tallies, from the flows (their pieces' sums).
  TransferPlan& skeleton = routed.skeleton;
  skeleton.worker_send_bytes.assign(workers, 0);
  skeleton.worker_receive_bytes.assign(workers, 0);
  skeleton.node_ingress_bytes.assign(nodes, 0);
  skeleton.node_egress_bytes.assign(nodes, 0);
  skeleton.round_bytes.assign(static_cast<std::size_t>(skeleton.rounds), 0);
  for (const RoutedRounds::Flow& flow : routed.flows)
    for_each_hop(correspondence, routes, skeleton, flow.segment, [&](const Hop& hop) {
      skeleton.worker_send_bytes[static_cast<std::size_t>(hop.from)] += flow.bytes;
      skeleton.worker_receive_bytes[static_cast<std::size_t>(hop.to)] += flow.bytes;
      skeleton.round_bytes[hop.round] += flow.bytes;
      if (hop.stage != Stage::kInternalExchange) {
        skeleton.node_egress_bytes[node_of(hop.from)] += flow.bytes;
        skeleton.node_ingress_bytes[node_of(hop.to)] += flow.bytes;
      }
    });

  // A segment per piece, then ordered by route and merged.
  TransferPlan plan = std::move(skeleton);
  std::vector<std::uint32_t> first_relay(basis.sets.size.size(), Segment::kAllToAll);
  std::uint32_t relays = 0;
  for (std::size_t s = 0; s < exchange.forests.size(); ++s)
    if (!exchange.forests[s].all_to_all) {
      first_relay[s] = relays;
      relays += static_cast<std::uint32_t>(exchange.forests[s].trees.size());
    }
  plan.segments.reserve(pieces.size());
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    const std::uint32_t a = pieces.atom[p];
    const std::uint32_t set = basis.sets.of_atom[a];
    const RelayForest& forest = exchange.forests[set];
    Segment segment;
    segment.atom = a;
    segment.box = slice_box(atoms[a].box, routes.atoms[a].axis, pieces.begin[p], pieces.end[p]);
    segment.round = routed.round[p];
    segment.sender = basis.senders[p];
    segment.first_lander = landing.first[p];  // into plan.landers, which are Landing's
    segment.lander_count = routes.atoms[a].node_count;
    segment.origin = static_cast<std::uint16_t>(forest.root(exchange.tree[p]));
    segment.relay = forest.all_to_all ? Segment::kAllToAll : first_relay[set] + exchange.tree[p];
    plan.segments.push_back(std::move(segment));
  }
  sort_and_merge(correspondence, routes, plan);
  return plan;
}

}  // namespace wb::plan_detail

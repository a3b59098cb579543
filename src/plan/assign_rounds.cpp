// Rounds. A round lasts as long as its busiest link, so every round must carry about 1/R of every link's
// traffic: each sender's egress, and each relay tree's share of its node group (which is every node's
// ingress and every relay's egress in the group, a fixed number of rounds later for the deeper positions).
// Pieces, largest first, go to the round where they raise the fullest of their links the least (all rounds
// when there are few, otherwise a fixed pseudo-random sample of them). Then segments, slot sizes (more
// rounds while a worker's slots exceed its budget), and traffic tallies.
#include <algorithm>
#include <map>
#include <numeric>
#include <string>
#include <tuple>
#include <unordered_map>

#include "plan/planning.hpp"
#include "weightbridge/status.hpp"

namespace wb::plan_detail {
namespace {

// The trainer round of every piece: R rounds, balanced per sender, per relay tree (every node's ingress
// and every relay's egress in its group) and per group and column (every lander's receive slot).
std::vector<std::uint32_t> piece_rounds(const Correspondence& correspondence, const PieceTable& pieces,
                                        const std::vector<std::uint32_t>& senders, const std::vector<std::size_t>& tree_of_piece,
                                        std::size_t tree_count, const std::vector<std::size_t>& column_of_piece,
                                        std::size_t column_count, int rounds) {
  const auto& atoms = correspondence.atoms;
  const std::size_t workers = correspondence.sides.size();
  const auto R = static_cast<std::size_t>(rounds);
  std::vector<double> sender_total(workers, 0), tree_total(tree_count, 0), column_total(column_count, 0);
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    sender_total[static_cast<std::size_t>(atoms[pieces.atom[p]].holders[senders[p]].worker)] += static_cast<double>(pieces.bytes[p]);
    tree_total[tree_of_piece[p]] += static_cast<double>(pieces.bytes[p]);
    column_total[column_of_piece[p]] += static_cast<double>(pieces.bytes[p]);
  }
  std::vector<std::uint32_t> by_size(pieces.size());
  std::iota(by_size.begin(), by_size.end(), 0u);
  std::stable_sort(by_size.begin(), by_size.end(), [&](std::uint32_t x, std::uint32_t y) { return pieces.bytes[x] > pieces.bytes[y]; });
  std::vector<double> sender_load(workers * R, 0), tree_load(tree_count * R, 0), column_load(column_count * R, 0);
  const double r_count = rounds;
  const auto share = [&](double total) { return total > 0 ? total / r_count : 1.0; };
  constexpr std::size_t kSample = 16;
  std::vector<std::size_t> candidates;
  std::vector<std::uint32_t> round(pieces.size(), 0);
  for (std::uint32_t p : by_size) {
    const auto bytes = static_cast<double>(pieces.bytes[p]);
    const auto sender = static_cast<std::size_t>(atoms[pieces.atom[p]].holders[senders[p]].worker);
    const std::size_t tree = tree_of_piece[p];
    const std::size_t column = column_of_piece[p];
    candidates.clear();
    if (R <= kSample * 2) {
      for (std::size_t r = 0; r < R; ++r) candidates.push_back(r);
    } else {
      std::uint64_t state = (p + 1) * 0x9E3779B97F4A7C15ull;
      for (std::size_t i = 0; i < kSample; ++i) {
        state ^= state >> 31, state *= 0xBF58476D1CE4E5B9ull, state ^= state >> 27;
        candidates.push_back(static_cast<std::size_t>(state % R));
      }
    }
    std::size_t best = candidates[0];
    double best_cost = 0;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const std::size_t r = candidates[i];
      const double cost = std::max({(sender_load[sender * R + r] + bytes) / share(sender_total[sender]),
                                    (tree_load[tree * R + r] + bytes) / share(tree_total[tree]),
                                    (column_load[column * R + r] + bytes) / share(column_total[column])});
      if (i == 0 || cost < best_cost) {
        best = r;
        best_cost = cost;
      }
    }
    round[p] = static_cast<std::uint32_t>(best);
    sender_load[sender * R + best] += bytes;
    tree_load[tree * R + best] += bytes;
    column_load[column * R + best] += bytes;
  }
  return round;
}

// Within a round, segments of one route sit next to each other, so that the writes that forward them out
// of a receive buffer coalesce; neighbours along an atom's axis on one route become one segment.
void sort_and_merge(const Correspondence& correspondence, const AtomRoutes& routes, TransferPlan& plan) {
  const auto& atoms = correspondence.atoms;
  // Every distinct list of landing workers gets an id, in order of the lists (compared once each, not on
  // every comparison of the sort: a list has one entry per node).
  std::vector<std::uint32_t> route_id(plan.segments.size());
  {
    std::map<std::vector<int>, std::uint32_t> ids;
    std::vector<int> workers;
    for (std::size_t i = 0; i < plan.segments.size(); ++i) {
      const Segment& s = plan.segments[i];
      workers.clear();
      for (std::uint32_t needer : plan.landers_of(s)) workers.push_back(atoms[s.atom].needers[needer].worker);
      ids.emplace(workers, 0);
    }
    std::uint32_t next = 0;
    for (auto& [list, id] : ids) id = next++;
    for (std::size_t i = 0; i < plan.segments.size(); ++i) {
      const Segment& s = plan.segments[i];
      workers.clear();
      for (std::uint32_t needer : plan.landers_of(s)) workers.push_back(atoms[s.atom].needers[needer].worker);
      route_id[i] = ids.at(workers);
    }
  }
  std::vector<std::uint32_t> order(plan.segments.size());
  std::iota(order.begin(), order.end(), 0u);
  // Atoms with the same needers are handed on inside their nodes to the same workers: side by side in a
  // receive buffer, they go on in one write per peer instead of one per atom.
  std::vector<std::uint32_t> needer_id(atoms.size());
  {
    std::map<std::vector<int>, std::uint32_t> ids;
    std::vector<int> workers;
    for (std::size_t a = 0; a < atoms.size(); ++a) {
      workers.clear();
      for (const AtomEndpoint& needer : atoms[a].needers) workers.push_back(needer.worker);
      workers.erase(std::unique(workers.begin(), workers.end()), workers.end());
      needer_id[a] = ids.emplace(workers, static_cast<std::uint32_t>(ids.size())).first->second;
    }
  }
  const auto route_key = [&](std::uint32_t i) {
    const Segment& s = plan.segments[i];
    const Atom& atom = atoms[s.atom];
    return std::make_tuple(s.round, atom.holders[s.sender].worker, atom.needers[plan.landers[s.first_lander + s.origin]].worker, s.relay,
                           route_id[i], needer_id[s.atom], s.atom);
  };
  // Same route first (landers as workers), then the same needers, then checkpoint order.
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const auto ka = route_key(x), kb = route_key(y);
    if (ka != kb) return ka < kb;
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

TransferPlan assign_rounds(const Correspondence& correspondence, const Topology& topology, const AtomRoutes& routes,
                           const PieceTable& pieces, const std::vector<std::uint32_t>& senders,
                           const Landing& landing, const NodeSets& sets, const Exchange& exchange, int rounds,
                           const PlanOptions& options, bool final) {
  const auto& atoms = correspondence.atoms;
  const std::size_t workers = correspondence.sides.size();
  const std::size_t nodes = static_cast<std::size_t>(topology.num_nodes());
  const auto node_of = [&](int worker) { return static_cast<std::size_t>(topology.node_of_worker[static_cast<std::size_t>(worker)]); };

  TransferPlan plan;
  plan.pipeline_depth = options.pipeline_depth;
  plan.topology = topology;
  // Relay trees of the forests, and each piece's tree among all trees of all sets (for balancing).
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
  std::vector<std::size_t> tree_of_piece(pieces.size()), column_of_piece(pieces.size());
  std::unordered_map<std::uint64_t, std::size_t> columns;  // (set, column) -> index
  for (std::uint32_t p = 0; p < pieces.size(); ++p) {
    const std::uint32_t set = sets.of_atom[pieces.atom[p]];
    tree_of_piece[p] = first_tree[set] + exchange.tree[p];
    column_of_piece[p] = columns.emplace(static_cast<std::uint64_t>(set) << 16 | landing.column[p], columns.size()).first->second;
  }
  // The rounds after the last trainer round in which relays still forward.
  const int tail = exchange.height > 1 ? exchange.height - 1 : 0;

  const std::int64_t budget = options.buffer_bytes_per_worker;
  std::vector<std::int64_t> send_round, receive_round;
  for (int attempt = 0;; ++attempt) {
    const std::vector<std::uint32_t> piece_round =
        piece_rounds(correspondence, pieces, senders, tree_of_piece, tree_count, column_of_piece, columns.size(), rounds);
    plan.rounds = rounds + tail;
    plan.segments.clear();
    plan.landers.clear();
    plan.segments.reserve(pieces.size());
    plan.landers.reserve(landing.landers.size());
    for (std::uint32_t p = 0; p < pieces.size(); ++p) {
      const std::uint32_t a = pieces.atom[p];
      const std::uint32_t set = sets.of_atom[a];
      const RelayForest& forest = exchange.forests[set];
      Segment segment;
      segment.atom = a;
      segment.box = slice_box(atoms[a].box, routes.atoms[a].axis, pieces.begin[p], pieces.end[p]);
      segment.round = piece_round[p];
      segment.sender = senders[p];
      segment.first_lander = static_cast<std::uint32_t>(plan.landers.size());
      segment.lander_count = routes.atoms[a].node_count;
      segment.origin = static_cast<std::uint16_t>(forest.root(exchange.tree[p]));
      segment.relay = forest.all_to_all ? Segment::kAllToAll : first_relay[set] + exchange.tree[p];
      plan.landers.insert(plan.landers.end(), landing.landers.begin() + landing.first[p], landing.landers.begin() + landing.first[p + 1]);
      plan.segments.push_back(std::move(segment));
    }
    // Slots: per worker, its largest round of packing and of receiving.
    const auto total = static_cast<std::size_t>(plan.rounds);
    send_round.assign(workers * total, 0);
    receive_round.assign(workers * total, 0);
    for (const Segment& segment : plan.segments) {
      const std::int64_t bytes = segment_bytes(routes, segment);
      for_each_hop(correspondence, routes, plan, segment, [&](const Hop& hop) {
        if (hop.stage == Stage::kReceive) send_round[static_cast<std::size_t>(hop.from) * total + hop.round] += bytes;
        receive_round[static_cast<std::size_t>(hop.to) * total + hop.round] += bytes;
      });
    }
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
  if (exchange.fan_out == kRelayAllToAll || exchange.height <= 1) {
    plan.exchange = "all-to-all";
  } else {
    plan.exchange = "relay trees, fan-out " + std::to_string(exchange.fan_out);
  }
  if (!final) return plan;
  sort_and_merge(correspondence, routes, plan);

  plan.worker_send_bytes.assign(workers, 0);
  plan.worker_receive_bytes.assign(workers, 0);
  plan.node_ingress_bytes.assign(nodes, 0);
  plan.node_egress_bytes.assign(nodes, 0);
  plan.round_bytes.assign(static_cast<std::size_t>(plan.rounds), 0);
  for (const Segment& segment : plan.segments) {
    const std::int64_t bytes = segment_bytes(routes, segment);
    for_each_hop(correspondence, routes, plan, segment, [&](const Hop& hop) {
      plan.worker_send_bytes[static_cast<std::size_t>(hop.from)] += bytes;
      plan.worker_receive_bytes[static_cast<std::size_t>(hop.to)] += bytes;
      plan.round_bytes[hop.round] += bytes;
      if (hop.stage != Stage::kInternalExchange) {
        plan.node_egress_bytes[node_of(hop.from)] += bytes;
        plan.node_ingress_bytes[node_of(hop.to)] += bytes;
      }
    });
  }
  return plan;
}

}  // namespace wb::plan_detail

// The global planner (paper §3.2): de-duplicates both sides, routes every piece of every atom through the
// three stages, balances the load greedily over the whole model, and cuts the transfer into rounds that
// fit the buffer budget and carry about equal shares of every worker's traffic.
#include <algorithm>
#include <numeric>
#include <string>

#include "plan/atom_routes.hpp"
#include "weightbridge/plan.hpp"
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

namespace plan_detail {

Box slice_box(const Box& atom_box, int axis, std::int64_t begin, std::int64_t end) {
  Box box = atom_box;
  if (axis < box.ndim()) {
    box.offset[static_cast<std::size_t>(axis)] += begin;
    box.extent[static_cast<std::size_t>(axis)] = end - begin;
  }
  return box;
}

AtomRoutes atom_routes(const Correspondence& correspondence, const Topology& topology) {
  AtomRoutes routes;
  routes.atoms.reserve(correspondence.atoms.size());
  std::vector<std::pair<int, std::uint32_t>> holders;                    // (worker, holder index)
  std::vector<std::tuple<int, int, std::uint32_t>> needers;              // (node, worker, needer index)
  for (const Atom& atom : correspondence.atoms) {
    AtomRoute route;
    route.element_bytes = static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
    route.bytes = atom.box.numel() * route.element_bytes;
    route.axis = 0;
    while (route.axis + 1 < atom.box.ndim() && atom.box.extent[static_cast<std::size_t>(route.axis)] == 1) ++route.axis;
    const std::int64_t units = atom.box.ndim() == 0 ? 1 : atom.box.extent[static_cast<std::size_t>(route.axis)];
    route.unit_bytes = units > 0 ? route.bytes / units : 0;

    holders.clear();
    for (std::uint32_t i = 0; i < atom.holders.size(); ++i) holders.emplace_back(atom.holders[i].worker, i);
    std::sort(holders.begin(), holders.end());
    route.first_holder = static_cast<std::uint32_t>(routes.holders.size());
    for (std::size_t i = 0; i < holders.size(); ++i)
      if (i == 0 || holders[i].first != holders[i - 1].first) routes.holders.push_back(holders[i].second);
    route.holder_count = static_cast<std::uint16_t>(routes.holders.size() - route.first_holder);

    needers.clear();
    for (std::uint32_t i = 0; i < atom.needers.size(); ++i) {
      const int worker = atom.needers[i].worker;
      needers.emplace_back(topology.node_of_worker[static_cast<std::size_t>(worker)], worker, i);
    }
    std::sort(needers.begin(), needers.end());
    route.first_node = static_cast<std::uint32_t>(routes.nodes.size());
    for (std::size_t i = 0; i < needers.size(); ++i) {
      const auto [node, worker, index] = needers[i];
      if (i > 0 && std::get<1>(needers[i - 1]) == worker) continue;  // the worker's first copy stands for it
      if (routes.nodes.size() == route.first_node || routes.nodes.back().node != node)
        routes.nodes.push_back({node, static_cast<std::uint32_t>(routes.needers.size()), 0});
      routes.needers.push_back(index);
      ++routes.nodes.back().count;
    }
    route.node_count = static_cast<std::uint16_t>(routes.nodes.size() - route.first_node);
    routes.atoms.push_back(route);
  }
  return routes;
}

}  // namespace plan_detail

namespace {

using plan_detail::AtomRoute;
using plan_detail::AtomRoutes;
using plan_detail::NodeNeeders;

std::int64_t units_of(const Atom& atom, const AtomRoute& route) {
  return atom.box.ndim() == 0 ? 1 : atom.box.extent[static_cast<std::size_t>(route.axis)];
}

// Pieces of an atom: `count` slices of about equal size along the route's axis.
struct Pieces {
  std::vector<std::uint32_t> first;  // per atom, into the per-piece arrays; one extra at the end
  std::int64_t begin(const Atom& atom, const AtomRoute& route, std::size_t a, std::uint32_t p) const {
    const std::int64_t count = first[a + 1] - first[a];
    return units_of(atom, route) * p / count;
  }
};

// Atom indices in the order the greedy assignment takes them: the most constrained first (fewest
// candidates), then the largest, so forced loads are known before shared ones are spread over them.
std::vector<std::uint32_t> greedy_order(const std::vector<AtomRoute>& atoms, bool by_holders) {
  std::vector<std::uint32_t> order(atoms.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const AtomRoute& a = atoms[x];
    const AtomRoute& b = atoms[y];
    const int ca = by_holders ? a.holder_count : a.node_count;
    const int cb = by_holders ? b.holder_count : b.node_count;
    if (ca != cb) return ca < cb;
    return a.bytes > b.bytes;
  });
  return order;
}

// The greedy assignment of pieces to senders can strand load on a worker that shares its atoms with
// others whose load came later. Repair it with augmenting paths: from the most loaded sender, a chain of
// moves (piece from x to another holder y, which passes one of its own pieces on, ...) that ends at a
// worker that can take the last piece and stay below the maximum, with no worker on the way reaching it.
// Stops when the most loaded sender has no such chain, or after a bounded amount of work.
template <class PieceBytes>
void rebalance_senders(const Correspondence& correspondence, const AtomRoutes& routes, const Pieces& pieces,
                       std::vector<std::uint32_t>& piece_sender, std::vector<std::int64_t>& load,
                       const PieceBytes& piece_bytes_of) {
  const auto& atoms = correspondence.atoms;
  const std::size_t workers = load.size();
  std::vector<std::uint32_t> atom_of_piece(pieces.first.back());
  for (std::size_t a = 0; a < atoms.size(); ++a)
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) atom_of_piece[p] = static_cast<std::uint32_t>(a);
  std::vector<std::vector<std::uint32_t>> pieces_of(workers);
  for (std::uint32_t p = 0; p < atom_of_piece.size(); ++p)
    if (routes.atoms[atom_of_piece[p]].holder_count > 1)
      pieces_of[static_cast<std::size_t>(atoms[atom_of_piece[p]].holders[piece_sender[p]].worker)].push_back(p);
  const auto sender_of = [&](std::uint32_t p) { return atoms[atom_of_piece[p]].holders[piece_sender[p]].worker; };

  std::int64_t budget = 200'000'000;  // edges examined, over all searches
  std::vector<int> parent_worker(workers);
  std::vector<std::uint32_t> parent_piece(workers);
  std::vector<std::int64_t> gained(workers);
  std::vector<int> queue;
  while (budget > 0) {
    const int top = static_cast<int>(std::max_element(load.begin(), load.end()) - load.begin());
    const std::int64_t ceiling = load[static_cast<std::size_t>(top)];
    std::fill(parent_worker.begin(), parent_worker.end(), -2);
    parent_worker[static_cast<std::size_t>(top)] = -1;
    gained[static_cast<std::size_t>(top)] = 0;
    queue.assign(1, top);
    int found = -1;
    for (std::size_t head = 0; head < queue.size() && found < 0 && budget > 0; ++head) {
      const int x = queue[head];
      const auto xi = static_cast<std::size_t>(x);
      for (std::uint32_t p : pieces_of[xi]) {
        if (sender_of(p) != x) continue;  // moved away earlier (stale entry)
        const std::int64_t bytes = piece_bytes_of(atom_of_piece[p], p);
        // x gives p away; unless x is the top, it must stay below the ceiling after gaining its parent's piece.
        if (x != top && load[xi] + gained[xi] - bytes >= ceiling) continue;
        if (x == top && bytes == 0) continue;
        const Atom& atom = atoms[atom_of_piece[p]];
        const AtomRoute& route = routes.atoms[atom_of_piece[p]];
        const std::uint32_t* holders = routes.holders_of(route);
        for (std::uint16_t h = 0; h < route.holder_count && found < 0; ++h) {
          --budget;
          const int y = atom.holders[holders[h]].worker;
          const auto yi = static_cast<std::size_t>(y);
          if (parent_worker[yi] != -2) continue;
          parent_worker[yi] = x;
          parent_piece[yi] = p;
          gained[yi] = bytes;
          if (load[yi] + bytes < ceiling) {
            found = y;
          } else {
            queue.push_back(y);
          }
        }
        if (found >= 0) break;
      }
    }
    if (found < 0) return;
    // Apply the chain from its end: each worker on it takes its parent's piece.
    for (int y = found; parent_worker[static_cast<std::size_t>(y)] >= 0;) {
      const auto yi = static_cast<std::size_t>(y);
      const std::uint32_t p = parent_piece[yi];
      const int x = parent_worker[yi];
      const std::int64_t bytes = piece_bytes_of(atom_of_piece[p], p);
      const Atom& atom = atoms[atom_of_piece[p]];
      std::uint32_t holder = 0;
      while (atom.holders[holder].worker != y) ++holder;
      piece_sender[p] = holder;
      load[static_cast<std::size_t>(x)] -= bytes;
      load[yi] += bytes;
      pieces_of[yi].push_back(p);
      y = x;
    }
  }
}

std::string plan_error_prefix(const Correspondence& correspondence, const Atom& atom) {
  return "tensor " + correspondence.tensors[atom.tensor].name + " box " + atom.box.to_string();
}

}  // namespace

TransferPlan plan_transfer(const Correspondence& correspondence, const Topology& topology, const PlanOptions& options) {
  if (options.pipeline_depth < 1 || options.buffer_bytes_per_worker <= 0 || options.min_rounds < 1)
    throw Error(ErrorCode::kInvalidArgument, "plan options: pipeline depth, buffer budget and minimum rounds must be positive");
  TransferPlan plan;
  plan.pipeline_depth = options.pipeline_depth;
  plan.topology = topology;
  plan.bound = lower_bound(correspondence, topology);  // also checks the topology against the workers
  const AtomRoutes routes = plan_detail::atom_routes(correspondence, topology);
  const auto& atoms = correspondence.atoms;
  const std::size_t workers = correspondence.sides.size();
  const std::size_t nodes = static_cast<std::size_t>(topology.num_nodes());
  const auto node_of = [&](int worker) { return static_cast<std::size_t>(topology.node_of_worker[static_cast<std::size_t>(worker)]); };

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

  std::int64_t piece_bytes = options.piece_bytes;
  if (piece_bytes <= 0)
    piece_bytes = std::clamp<std::int64_t>(plan.bound.model_bytes / std::max<std::int64_t>(1, static_cast<std::int64_t>(workers) * 256),
                                           512, std::int64_t{16} << 20);
  piece_bytes = std::max<std::int64_t>(1, std::min(piece_bytes, slot_budget / 16));

  // Pieces: every atom cut into slices of about piece_bytes, the unit every assignment below works on.
  Pieces pieces;
  pieces.first.resize(atoms.size() + 1);
  for (std::size_t a = 0; a < atoms.size(); ++a) {
    const std::int64_t units = units_of(atoms[a], routes.atoms[a]);
    const std::int64_t count = std::clamp<std::int64_t>((routes.atoms[a].bytes + piece_bytes - 1) / piece_bytes, 1, std::max<std::int64_t>(units, 1));
    pieces.first[a + 1] = pieces.first[a] + static_cast<std::uint32_t>(count);
  }
  const std::size_t piece_total = pieces.first.back();
  std::vector<std::uint32_t> piece_sender(piece_total);   // index into atom.holders
  std::vector<std::uint16_t> piece_origin(piece_total);   // index into the atom's nodes
  std::vector<std::uint32_t> piece_lander_first(piece_total + 1);
  std::vector<std::uint32_t> piece_landers;               // index into atom.needers, per node of the atom
  {
    std::size_t total = 0;
    for (std::size_t a = 0; a < atoms.size(); ++a)
      for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
        piece_lander_first[p] = static_cast<std::uint32_t>(total);
        total += routes.atoms[a].node_count;
      }
    piece_lander_first[piece_total] = static_cast<std::uint32_t>(total);
    piece_landers.resize(total);
  }
  const auto piece_bytes_of = [&](std::size_t a, std::uint32_t p) {
    const std::uint32_t local = p - pieces.first[a];
    return (pieces.begin(atoms[a], routes.atoms[a], a, local + 1) - pieces.begin(atoms[a], routes.atoms[a], a, local)) *
           routes.atoms[a].unit_bytes;
  };

  // Trainer de-duplication: each piece leaves one holder, the least loaded (ties: its node's load).
  std::vector<std::int64_t> send_load(workers, 0), node_send_load(nodes, 0);
  for (std::uint32_t a : greedy_order(routes.atoms, true)) {
    const Atom& atom = atoms[a];
    const AtomRoute& route = routes.atoms[a];
    const std::uint32_t* holders = routes.holders_of(route);
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
      std::uint32_t best = holders[0];
      for (std::uint16_t h = 1; h < route.holder_count; ++h) {
        const int w = atom.holders[holders[h]].worker, b = atom.holders[best].worker;
        const auto wi = static_cast<std::size_t>(w), bi = static_cast<std::size_t>(b);
        if (send_load[wi] < send_load[bi] || (send_load[wi] == send_load[bi] && node_send_load[node_of(w)] < node_send_load[node_of(b)]))
          best = holders[h];
      }
      // Consecutive pieces stay with one sender while that costs at most one piece of balance, so that
      // they merge into one segment again.
      if (p > pieces.first[a]) {
        const std::uint32_t previous = piece_sender[p - 1];
        if (send_load[static_cast<std::size_t>(atom.holders[previous].worker)] <=
            send_load[static_cast<std::size_t>(atom.holders[best].worker)] + piece_bytes)
          best = previous;
      }
      piece_sender[p] = best;
      const std::int64_t bytes = piece_bytes_of(a, p);
      send_load[static_cast<std::size_t>(atom.holders[best].worker)] += bytes;
      node_send_load[node_of(atom.holders[best].worker)] += bytes;
    }
  }

  rebalance_senders(correspondence, routes, pieces, piece_sender, send_load, piece_bytes_of);

  // Rollout de-duplication: each piece enters each node that needs it once, at one of the node's workers
  // that needs it (its lander); one of those nodes, the origin, takes it from the trainer and forwards it
  // to the others. Origins balance the external exchange's egress, landers the workers' inter-node ingress.
  std::vector<std::int64_t> node_forward_load(nodes, 0), land_load(workers, 0);
  for (std::uint32_t a : greedy_order(routes.atoms, false)) {
    const Atom& atom = atoms[a];
    const AtomRoute& route = routes.atoms[a];
    const NodeNeeders* atom_nodes = routes.nodes_of(route);
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
      const std::int64_t bytes = piece_bytes_of(a, p);
      std::uint16_t origin = 0;
      for (std::uint16_t k = 1; k < route.node_count; ++k)
        if (node_forward_load[static_cast<std::size_t>(atom_nodes[k].node)] <
            node_forward_load[static_cast<std::size_t>(atom_nodes[origin].node)])
          origin = k;
      if (p > pieces.first[a] &&
          node_forward_load[static_cast<std::size_t>(atom_nodes[piece_origin[p - 1]].node)] <=
              node_forward_load[static_cast<std::size_t>(atom_nodes[origin].node)] + bytes * (route.node_count - 1))
        origin = piece_origin[p - 1];  // stay, as for senders
      piece_origin[p] = origin;
      node_forward_load[static_cast<std::size_t>(atom_nodes[origin].node)] += bytes * (route.node_count - 1);
      for (std::uint16_t k = 0; k < route.node_count; ++k) {
        const std::uint32_t* needers = routes.needers_of(atom_nodes[k]);
        std::uint32_t best = needers[0];
        for (std::uint32_t i = 1; i < atom_nodes[k].count; ++i)
          if (land_load[static_cast<std::size_t>(atom.needers[needers[i]].worker)] <
              land_load[static_cast<std::size_t>(atom.needers[best].worker)])
            best = needers[i];
        if (p > pieces.first[a]) {
          const std::uint32_t previous = piece_landers[piece_lander_first[p - 1] + k];
          if (land_load[static_cast<std::size_t>(atom.needers[previous].worker)] <=
              land_load[static_cast<std::size_t>(atom.needers[best].worker)] + bytes)
            best = previous;  // stay, as for senders
        }
        piece_landers[piece_lander_first[p] + k] = best;
        land_load[static_cast<std::size_t>(atom.needers[best].worker)] += bytes;
      }
    }
  }

  // Rounds. A round lasts as long as its busiest link, so every round must carry about 1/R of every
  // link's traffic: each sender's egress, each rollout node's ingress, each origin node's forwarding.
  // Pieces, largest first, go to the round where they raise the fullest of their links the least (all
  // rounds when there are few, otherwise a fixed pseudo-random sample of them).
  std::vector<std::uint32_t> atom_of_piece(piece_total);
  for (std::size_t a = 0; a < atoms.size(); ++a)
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) atom_of_piece[p] = static_cast<std::uint32_t>(a);
  std::vector<std::uint32_t> by_size(piece_total);
  std::iota(by_size.begin(), by_size.end(), 0u);
  std::stable_sort(by_size.begin(), by_size.end(), [&](std::uint32_t x, std::uint32_t y) {
    return piece_bytes_of(atom_of_piece[x], x) > piece_bytes_of(atom_of_piece[y], y);
  });
  std::vector<double> sender_total(workers, 0), ingress_total(nodes, 0), forward_total(nodes, 0);
  for (std::uint32_t p = 0; p < piece_total; ++p) {
    const std::uint32_t a = atom_of_piece[p];
    const AtomRoute& route = routes.atoms[a];
    const auto bytes = static_cast<double>(piece_bytes_of(a, p));
    const NodeNeeders* atom_nodes = routes.nodes_of(route);
    sender_total[static_cast<std::size_t>(atoms[a].holders[piece_sender[p]].worker)] += bytes;
    for (std::uint16_t k = 0; k < route.node_count; ++k) ingress_total[static_cast<std::size_t>(atom_nodes[k].node)] += bytes;
    forward_total[static_cast<std::size_t>(atom_nodes[piece_origin[p]].node)] += bytes * (route.node_count - 1);
  }
  std::vector<std::uint32_t> piece_round(piece_total, 0);
  const auto make_segments = [&](int rounds) {
    const auto R = static_cast<std::size_t>(rounds);
    std::vector<double> sender_load(workers * R, 0), ingress_load(nodes * R, 0), forward_load(nodes * R, 0);
    const double r_count = rounds;
    const auto share = [&](double total) { return total > 0 ? total / r_count : 1.0; };
    constexpr std::size_t kSample = 16;
    std::vector<std::size_t> candidates;
    for (std::uint32_t p : by_size) {
      const std::uint32_t a = atom_of_piece[p];
      const AtomRoute& route = routes.atoms[a];
      const NodeNeeders* atom_nodes = routes.nodes_of(route);
      const auto bytes = static_cast<double>(piece_bytes_of(a, p));
      const auto sender = static_cast<std::size_t>(atoms[a].holders[piece_sender[p]].worker);
      const auto origin = static_cast<std::size_t>(atom_nodes[piece_origin[p]].node);
      const double forward = bytes * (route.node_count - 1);
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
        double cost = (sender_load[sender * R + r] + bytes) / share(sender_total[sender]);
        if (route.node_count > 1) cost = std::max(cost, (forward_load[origin * R + r] + forward) / share(forward_total[origin]));
        for (std::uint16_t k = 0; k < route.node_count && cost < best_cost + (i == 0 ? 1e300 : 0); ++k) {
          const auto v = static_cast<std::size_t>(atom_nodes[k].node);
          cost = std::max(cost, (ingress_load[v * R + r] + bytes) / share(ingress_total[v]));
        }
        if (i == 0 || cost < best_cost) {
          best = r;
          best_cost = cost;
        }
      }
      piece_round[p] = static_cast<std::uint32_t>(best);
      sender_load[sender * R + best] += bytes;
      forward_load[origin * R + best] += forward;
      for (std::uint16_t k = 0; k < route.node_count; ++k)
        ingress_load[static_cast<std::size_t>(atom_nodes[k].node) * R + best] += bytes;
    }
    std::vector<Segment> segments;
    segments.reserve(piece_total);
    plan.landers.clear();
    for (std::size_t a = 0; a < atoms.size(); ++a) {
      const AtomRoute& route = routes.atoms[a];
      for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
        const std::uint32_t local = p - pieces.first[a];
        Segment segment;
        segment.atom = static_cast<std::uint32_t>(a);
        segment.box = plan_detail::slice_box(atoms[a].box, route.axis, pieces.begin(atoms[a], route, a, local),
                                             pieces.begin(atoms[a], route, a, local + 1));
        segment.round = piece_round[p];
        segment.sender = piece_sender[p];
        segment.first_lander = static_cast<std::uint32_t>(plan.landers.size());
        segment.lander_count = route.node_count;
        segment.origin = piece_origin[p];
        plan.landers.insert(plan.landers.end(), piece_landers.begin() + piece_lander_first[p],
                            piece_landers.begin() + piece_lander_first[p + 1]);
        segments.push_back(std::move(segment));
      }
    }
    return segments;
  };

  std::vector<std::int64_t> send_total(workers, 0), receive_total(workers, 0);
  {
    plan.rounds = 1;
    plan.segments = make_segments(1);
    for (const Segment& segment : plan.segments) {
      const std::int64_t bytes = plan_detail::segment_bytes(routes, segment);
      plan_detail::for_each_hop(correspondence, routes, plan, segment, [&](Stage stage, int from, int to) {
        if (stage == Stage::kReceive) send_total[static_cast<std::size_t>(from)] += bytes;
        receive_total[static_cast<std::size_t>(to)] += bytes;
      });
    }
  }
  std::int64_t busiest = 0;
  for (std::size_t w = 0; w < workers; ++w) busiest = std::max(busiest, send_total[w] + receive_total[w]);
  int rounds = static_cast<int>(std::max<std::int64_t>(options.min_rounds, (busiest + slot_budget - 1) / slot_budget));
  std::vector<std::int64_t> send_round, receive_round;
  for (int attempt = 0;; ++attempt) {
    plan.rounds = rounds;
    plan.segments = make_segments(rounds);
    send_round.assign(workers * static_cast<std::size_t>(rounds), 0);
    receive_round.assign(workers * static_cast<std::size_t>(rounds), 0);
    for (const Segment& segment : plan.segments) {
      const std::int64_t bytes = plan_detail::segment_bytes(routes, segment);
      const std::size_t r = segment.round;
      plan_detail::for_each_hop(correspondence, routes, plan, segment, [&](Stage stage, int from, int to) {
        if (stage == Stage::kReceive) send_round[static_cast<std::size_t>(from) * static_cast<std::size_t>(rounds) + r] += bytes;
        receive_round[static_cast<std::size_t>(to) * static_cast<std::size_t>(rounds) + r] += bytes;
      });
    }
    plan.worker_send_slot_bytes.assign(workers, 0);
    plan.worker_receive_slot_bytes.assign(workers, 0);
    bool fits = true;
    for (std::size_t w = 0; w < workers; ++w) {
      for (std::size_t r = 0; r < static_cast<std::size_t>(rounds); ++r) {
        plan.worker_send_slot_bytes[w] = std::max(plan.worker_send_slot_bytes[w], send_round[w * static_cast<std::size_t>(rounds) + r]);
        plan.worker_receive_slot_bytes[w] =
            std::max(plan.worker_receive_slot_bytes[w], receive_round[w * static_cast<std::size_t>(rounds) + r]);
      }
      fits = fits && plan.worker_buffer_bytes(static_cast<int>(w)) <= options.buffer_bytes_per_worker;
    }
    if (fits) break;
    if (attempt == 40)
      throw Error(ErrorCode::kInvalidArgument, "cannot cut the transfer into rounds that fit a buffer budget of " +
                                                   std::to_string(options.buffer_bytes_per_worker) +
                                                   " bytes per worker (raise the budget)");
    rounds += std::max(1, rounds / 4);
  }

  // Within a round, segments of one route sit next to each other, so that the writes that forward them
  // out of a receive buffer coalesce.
  {
    std::vector<std::uint32_t> order(plan.segments.size());
    std::iota(order.begin(), order.end(), 0u);
    const auto route_key = [&](const Segment& s) {
      const Atom& atom = atoms[s.atom];
      return std::make_tuple(s.round, atom.holders[s.sender].worker, atom.needers[plan.landers[s.first_lander + s.origin]].worker);
    };
    std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
      const Segment& a = plan.segments[x];
      const Segment& b = plan.segments[y];
      const auto ka = route_key(a), kb = route_key(b);
      if (ka != kb) return ka < kb;
      const auto la = plan.landers_of(a), lb = plan.landers_of(b);
      if (a.atom != b.atom) {
        // Same route first (landers as workers), then checkpoint order.
        const auto lex = std::lexicographical_compare_three_way(
            la.begin(), la.end(), lb.begin(), lb.end(), [&](std::uint32_t i, std::uint32_t j) {
              return atoms[a.atom].needers[i].worker <=> atoms[b.atom].needers[j].worker;
            });
        if (lex != 0) return lex < 0;
        return a.atom < b.atom;
      }
      return a.box.offset < b.box.offset;
    });
    std::vector<Segment> sorted;
    std::vector<std::uint32_t> landers;
    sorted.reserve(order.size());
    landers.reserve(plan.landers.size());
    for (std::uint32_t i : order) {
      Segment segment = std::move(plan.segments[i]);
      const auto list = plan.landers_of(segment);
      if (!sorted.empty()) {
        // A neighbour along the atom's axis on the same route: one segment.
        Segment& last = sorted.back();
        const auto axis = static_cast<std::size_t>(routes.atoms[segment.atom].axis);
        if (last.atom == segment.atom && last.round == segment.round && last.sender == segment.sender &&
            last.origin == segment.origin && axis < segment.box.offset.size() &&
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

  // Tallies.
  plan.worker_send_bytes.assign(workers, 0);
  plan.worker_receive_bytes.assign(workers, 0);
  plan.node_ingress_bytes.assign(nodes, 0);
  plan.node_egress_bytes.assign(nodes, 0);
  plan.round_bytes.assign(static_cast<std::size_t>(plan.rounds), 0);
  for (const Segment& segment : plan.segments) {
    const std::int64_t bytes = plan_detail::segment_bytes(routes, segment);
    plan_detail::for_each_hop(correspondence, routes, plan, segment, [&](Stage stage, int from, int to) {
      plan.worker_send_bytes[static_cast<std::size_t>(from)] += bytes;
      plan.worker_receive_bytes[static_cast<std::size_t>(to)] += bytes;
      plan.round_bytes[segment.round] += bytes;
      if (stage != Stage::kInternalExchange) {
        plan.node_egress_bytes[node_of(from)] += bytes;
        plan.node_ingress_bytes[node_of(to)] += bytes;
      }
    });
  }
  return plan;
}

}  // namespace wb

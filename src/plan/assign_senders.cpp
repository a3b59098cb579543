// Trainer de-duplication (paper §3.2): each piece leaves one of its holders, so that the trainers together
// send one copy of the model, spread as evenly over them as the holder sets allow.
#include <algorithm>
#include <numeric>

#include "plan/planning.hpp"

namespace wb::plan_detail {
namespace {

// Atoms in the order the greedy assignment takes them: the most constrained first (fewest holders), then
// the largest, so forced loads are known before shared ones are spread over them.
std::vector<std::uint32_t> greedy_order(const std::vector<AtomRoute>& atoms) {
  std::vector<std::uint32_t> order(atoms.size());
  std::iota(order.begin(), order.end(), 0u);
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t x, std::uint32_t y) {
    const AtomRoute& a = atoms[x];
    const AtomRoute& b = atoms[y];
    if (a.holder_count != b.holder_count) return a.holder_count < b.holder_count;
    return a.bytes > b.bytes;
  });
  return order;
}

// The greedy assignment can strand load on a worker that shares its atoms with others whose load came
// later. Repair it with augmenting paths: from the most loaded sender, a chain of moves (piece from x to
// another holder y, which passes one of its own pieces on, ...) that ends at a worker that can take the
// last piece and stay below the maximum, with no worker on the way reaching it. Stops when the most loaded
// sender has no such chain, or after a bounded amount of work.
void rebalance_senders(const Correspondence& correspondence, const AtomRoutes& routes, const PieceTable& pieces,
                       std::vector<std::uint32_t>& piece_sender, std::vector<std::int64_t>& load) {
  const auto& atoms = correspondence.atoms;
  const std::size_t workers = load.size();
  std::vector<std::vector<std::uint32_t>> pieces_of(workers);
  for (std::uint32_t p = 0; p < pieces.size(); ++p)
    if (routes.atoms[pieces.atom[p]].holder_count > 1)
      pieces_of[static_cast<std::size_t>(atoms[pieces.atom[p]].holders[piece_sender[p]].worker)].push_back(p);
  const auto sender_of = [&](std::uint32_t p) { return atoms[pieces.atom[p]].holders[piece_sender[p]].worker; };

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
        const std::int64_t bytes = pieces.bytes[p];
        // x gives p away; unless x is the top, it must stay below the ceiling after gaining its parent's piece.
        if (x != top && load[xi] + gained[xi] - bytes >= ceiling) continue;
        if (x == top && bytes == 0) continue;
        const Atom& atom = atoms[pieces.atom[p]];
        const AtomRoute& route = routes.atoms[pieces.atom[p]];
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
      const Atom& atom = atoms[pieces.atom[p]];
      std::uint32_t holder = 0;
      while (atom.holders[holder].worker != y) ++holder;
      piece_sender[p] = holder;
      load[static_cast<std::size_t>(x)] -= pieces.bytes[p];
      load[yi] += pieces.bytes[p];
      pieces_of[yi].push_back(p);
      y = x;
    }
  }
}

}  // namespace

std::vector<std::uint32_t> assign_senders(const Correspondence& correspondence, const AtomRoutes& routes,
                                          const PieceTable& pieces, const Topology& topology,
                                          std::vector<std::int64_t>& send_load) {
  const auto& atoms = correspondence.atoms;
  const auto node_of = [&](int worker) { return static_cast<std::size_t>(topology.node_of_worker[static_cast<std::size_t>(worker)]); };
  std::vector<std::uint32_t> piece_sender(pieces.size());
  send_load.assign(correspondence.sides.size(), 0);
  std::vector<std::int64_t> node_send_load(static_cast<std::size_t>(topology.num_nodes()), 0);
  for (std::uint32_t a : greedy_order(routes.atoms)) {
    const Atom& atom = atoms[a];
    const AtomRoute& route = routes.atoms[a];
    const std::uint32_t* holders = routes.holders_of(route);
    for (std::uint32_t p = pieces.first[a]; p < pieces.first[a + 1]; ++p) {
      // The least loaded holder (ties: its node's load).
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
            send_load[static_cast<std::size_t>(atom.holders[best].worker)] + pieces.bytes[p])
          best = previous;
      }
      piece_sender[p] = best;
      send_load[static_cast<std::size_t>(atom.holders[best].worker)] += pieces.bytes[p];
      node_send_load[node_of(atom.holders[best].worker)] += pieces.bytes[p];
    }
  }
  rebalance_senders(correspondence, routes, pieces, piece_sender, send_load);
  return piece_sender;
}

}  // namespace wb::plan_detail

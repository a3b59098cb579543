// The trainer round of every piece. A round lasts as long as its busiest link, so every round must carry its
// share of every link's traffic: each sender's egress and each target's (a relay tree's pieces of one column,
// landing on one origin worker: its ingress, every relay's egress in its group a fixed number of rounds
// later, and the hand-ons inside every node it reaches). And every write costs link time, so a sender should
// write to few origins per round.
//
// Both come from filling the rounds one after another: in round r every sender and every target takes its
// share of what it has left over the rounds left; each sender first continues the route (sender, target) it
// had in the round before, else takes the route with the most left whose target has room, and only then
// fills what room it has left from other routes. Where one route carries most of a sender's bytes (an expert
// shard that lands on one column), a sender writes to one origin in most rounds instead of to all of its
// targets in every round; elsewhere it still takes its share. Pieces of a route go in their order (an atom's
// pieces stay together), so that neighbouring pieces share a round and merge into one segment. What no round
// had room for goes, piece by piece, where it unbalances its sender and target least.
#include <algorithm>
#include <numeric>
#include <unordered_map>

#include "plan/planning.hpp"

namespace wb::plan_detail {
namespace {

// Of its even share, the most a sender or target takes in one round: what rounding and contention hold back
// catches up slowly rather than piling up in the last rounds (what is still left is placed afterwards).
constexpr double kMostShare = 1.25;
// A target's room is this much above its share of what it has left: its senders come to it in turn, and
// without the slack a sender that comes after the target filled up falls behind for good, and the rounds
// it catches up in (the last ones) get too much.
constexpr double kTargetSlack = 1.05;

}  // namespace

std::vector<std::uint32_t> piece_rounds(const Correspondence& correspondence, const PieceTable& pieces,
                                        const std::vector<std::uint32_t>& senders, const RoundTargets& targets,
                                        int rounds) {
  const auto& atoms = correspondence.atoms;
  std::vector<std::uint32_t> round(pieces.size(), 0);
  struct Route {
    std::uint32_t sender = 0;  // dense sender index
    std::uint32_t target = 0;
    std::vector<std::uint32_t> pieces;
    std::size_t next = 0;  // first piece not yet placed
    double left = 0;       // bytes not yet placed
  };
  std::vector<Route> routes;
  std::vector<std::vector<std::uint32_t>> routes_of;  // per sender
  std::vector<double> sender_left, target_left;       // bytes; weight (RoundTargets::weight)
  {
    std::unordered_map<int, std::uint32_t> sender_index;
    std::unordered_map<std::uint64_t, std::uint32_t> route_index;
    for (std::uint32_t p = 0; p < pieces.size(); ++p) {
      const int worker = atoms[pieces.atom[p]].holders[senders[p]].worker;
      const std::uint32_t sender = sender_index.try_emplace(worker, static_cast<std::uint32_t>(sender_index.size())).first->second;
      if (sender == routes_of.size()) {
        routes_of.emplace_back();
        sender_left.push_back(0);
      }
      const std::uint32_t target = targets.origin[p];
      if (target >= target_left.size()) target_left.resize(target + 1, 0);
      const auto [it, added] = route_index.try_emplace(static_cast<std::uint64_t>(sender) << 32 | target, static_cast<std::uint32_t>(routes.size()));
      if (added) {
        routes.push_back({sender, target, {}, 0, 0});
        routes_of[sender].push_back(it->second);
      }
      Route& route = routes[it->second];
      route.pieces.push_back(p);
      route.left += static_cast<double>(pieces.bytes[p]);
      sender_left[sender] += static_cast<double>(pieces.bytes[p]);
      target_left[target] += targets.weight[p];
    }
  }
  const std::vector<double> sender_total = sender_left, target_total = target_left;
  std::vector<double> sender_room(sender_left.size()), target_room(target_left.size());
  std::vector<std::int64_t> previous(sender_left.size(), -1);  // the route each sender took last

  for (int r = 0; r < rounds; ++r) {
    for (std::size_t s = 0; s < sender_left.size(); ++s)
      sender_room[s] = std::min(sender_left[s] / (rounds - r), kMostShare * sender_total[s] / rounds);
    for (std::size_t t = 0; t < target_left.size(); ++t)
      target_room[t] = std::min(target_left[t] / (rounds - r) * kTargetSlack, kMostShare * target_total[t] / rounds);
    // Places the route's next pieces in round r while they fit its sender's and its target's room (a piece
    // that half fits goes in); false when none did.
    const auto place = [&](std::uint32_t index) {
      Route& route = routes[index];
      const std::size_t first = route.next;
      while (route.next < route.pieces.size()) {
        const std::uint32_t p = route.pieces[route.next];
        const auto bytes = static_cast<double>(pieces.bytes[p]);
        const double weight = targets.weight[p];
        if (bytes / 2 > sender_room[route.sender] || weight / 2 > target_room[route.target]) break;
        round[p] = static_cast<std::uint32_t>(r);
        route.left -= bytes;
        sender_left[route.sender] -= bytes;
        sender_room[route.sender] -= bytes;
        target_left[route.target] -= weight;
        target_room[route.target] -= weight;
        ++route.next;
      }
      return route.next > first;
    };
    // Senders in turn, from a different one every round, so that none always comes first to a shared target.
    const auto for_each_sender = [&](auto&& fn) {
      for (std::size_t i = 0; i < sender_left.size(); ++i) fn((i + static_cast<std::size_t>(r)) % sender_left.size());
    };
    for (std::vector<std::uint32_t>& list : routes_of)
      std::stable_sort(list.begin(), list.end(), [&](std::uint32_t a, std::uint32_t b) { return routes[a].left > routes[b].left; });
    // The route it had, else its largest with room.
    for_each_sender([&](std::size_t s) {
      if (previous[s] >= 0 && place(static_cast<std::uint32_t>(previous[s]))) return;
      for (std::uint32_t index : routes_of[s])
        if (place(index)) {
          previous[s] = index;
          return;
        }
    });
    // What room is left, from its other routes, largest first.
    for_each_sender([&](std::size_t s) {
      for (std::uint32_t index : routes_of[s]) {
        if (!(sender_room[s] > 0)) break;
        place(index);
      }
    });
  }
  // What no round had room for (routes whose targets other senders filled first): each piece, largest first,
  // into the round where it raises the fuller of its sender's and its target's share the least.
  std::vector<std::uint32_t> left_over;
  for (const Route& route : routes)
    for (std::size_t i = route.next; i < route.pieces.size(); ++i) left_over.push_back(route.pieces[i]);
  if (left_over.empty()) return round;
  const auto R = static_cast<std::size_t>(rounds);
  std::vector<double> sender_load(sender_total.size() * R, 0), target_load(target_total.size() * R, 0);
  std::vector<std::uint32_t> route_of(pieces.size(), 0);
  for (std::uint32_t index = 0; index < routes.size(); ++index) {
    const Route& route = routes[index];
    for (std::size_t i = 0; i < route.pieces.size(); ++i) {
      const std::uint32_t p = route.pieces[i];
      route_of[p] = index;
      if (i >= route.next) continue;
      sender_load[route.sender * R + round[p]] += static_cast<double>(pieces.bytes[p]);
      target_load[route.target * R + round[p]] += targets.weight[p];
    }
  }
  std::stable_sort(left_over.begin(), left_over.end(), [&](std::uint32_t x, std::uint32_t y) { return pieces.bytes[x] > pieces.bytes[y]; });
  for (std::uint32_t p : left_over) {
    const Route& route = routes[route_of[p]];
    const auto bytes = static_cast<double>(pieces.bytes[p]);
    const double weight = targets.weight[p];
    const double sender_share = std::max(1.0, sender_total[route.sender] / rounds), target_share = std::max(1.0, target_total[route.target] / rounds);
    std::size_t best = 0;
    double best_cost = 0;
    for (std::size_t r = 0; r < R; ++r) {
      const double cost = std::max((sender_load[route.sender * R + r] + bytes) / sender_share, (target_load[route.target * R + r] + weight) / target_share);
      if (r == 0 || cost < best_cost) best = r, best_cost = cost;
    }
    round[p] = static_cast<std::uint32_t>(best);
    sender_load[route.sender * R + best] += bytes;
    target_load[route.target * R + best] += weight;
  }
  return round;
}

}  // namespace wb::plan_detail

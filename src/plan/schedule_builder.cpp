// Round schedules from a transfer plan. A receiver's buffer of one round is laid out as regions, one per
// (stage, lag, source peer) in that order, and a region holds its segments back to back in plan order. A
// sender's buffer holds its segments in plan order, which groups them by destination. Sender and receiver
// derive the same offsets from the same order, so nothing but the plan is shared.
//
// A lander at depth d > 1 of a relay tree receives a segment d - 1 rounds after the segment's round; it
// forwards it to its own children one round later still, from where it landed (a relay write, lag 1).
#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "plan/atom_routes.hpp"
#include "weightbridge/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb {

namespace {

struct Region {
  std::uint32_t round = 0;
  Stage stage = Stage::kReceive;
  std::uint8_t lag = 0;
  int source = 0;
  std::int64_t start = 0;
  std::int64_t bytes = 0;
  auto key() const { return std::make_tuple(round, stage, lag, source); }
};

// Where the box of `segment` sits in the parameter of an endpoint's copy.
SliceCopy copy_at(const Correspondence& correspondence, const Atom& atom, const AtomEndpoint& endpoint, const Box& box) {
  const SliceCopy& copy = correspondence.maps[static_cast<std::size_t>(endpoint.worker)].copies[endpoint.copy];
  SliceCopy result;
  result.tensor = atom.tensor;
  result.parameter = copy.parameter;
  result.box = box;
  result.offset = copy.offset;
  for (std::size_t a = 0; a < copy.strides.size(); ++a) result.offset += (box.offset[a] - copy.box.offset[a]) * copy.strides[a];
  result.strides = copy.strides;
  return result;
}

// The children of every position of every relay tree (compressed rows).
struct TreeChildren {
  std::vector<std::vector<std::uint32_t>> first;     // per tree: per position, one extra at the end
  std::vector<std::vector<std::uint16_t>> children;  // per tree

  explicit TreeChildren(const std::vector<RelayTree>& trees) {
    for (const RelayTree& tree : trees) {
      const std::size_t k = tree.parent.size();
      std::vector<std::uint32_t> offsets(k + 1, 0);
      for (std::uint16_t parent : tree.parent)
        if (parent != RelayTree::kRoot) ++offsets[parent + 1u];
      for (std::size_t p = 0; p < k; ++p) offsets[p + 1] += offsets[p];
      std::vector<std::uint16_t> list(offsets[k]);
      std::vector<std::uint32_t> next(offsets.begin(), offsets.end() - 1);
      for (std::size_t p = 0; p < k; ++p)
        if (tree.parent[p] != RelayTree::kRoot) list[next[tree.parent[p]]++] = static_cast<std::uint16_t>(p);
      first.push_back(std::move(offsets));
      children.push_back(std::move(list));
    }
  }
};

}  // namespace

struct RoundScheduleBuilder::Index {
  // A worker's part in one segment, in the round it plays it: as its sender (position -1), as the one who
  // receives it at its node position (a lander or an internal needer), or as a relay forwarding it one round
  // after it landed (relay set).
  struct Part {
    std::uint32_t round = 0;
    std::uint32_t segment = 0;
    std::int32_t position = -1;
    std::uint32_t relay = 0;
    auto key() const { return std::make_tuple(round, segment, relay); }
  };

  plan_detail::AtomRoutes routes;
  std::vector<std::vector<Region>> regions;  // per receiving worker, sorted by (round, stage, lag, source)
  std::vector<std::vector<Part>> parts;      // per worker, by round, then plan order
  TreeChildren children;

  explicit Index(const std::vector<RelayTree>& trees) : children(trees) {}

  std::int64_t region_start(int worker, std::uint32_t round, Stage stage, std::uint8_t lag, int source) const {
    const auto& list = regions[static_cast<std::size_t>(worker)];
    const auto key = std::make_tuple(round, stage, lag, source);
    const auto it = std::lower_bound(list.begin(), list.end(), key, [](const Region& r, const auto& k) { return r.key() < k; });
    if (it == list.end() || it->key() != key)
      throw Error(ErrorCode::kInternal, "round schedule: no region for worker " + std::to_string(worker));
    return it->start;
  }

  // Calls fn(k) for every child position of lander position k of `segment`.
  template <class Fn>
  void children_of(const Segment& segment, std::size_t k, Fn&& fn) const {
    if (segment.relay == Segment::kAllToAll) {
      if (k == segment.origin)
        for (std::size_t j = 0; j < segment.lander_count; ++j)
          if (j != k) fn(j);
      return;
    }
    const auto& first = children.first[segment.relay];
    const auto& list = children.children[segment.relay];
    for (std::uint32_t c = first[k]; c < first[k + 1]; ++c) fn(static_cast<std::size_t>(list[c]));
  }
};

RoundScheduleBuilder::RoundScheduleBuilder(const Correspondence& correspondence, const TransferPlan& plan)
    : correspondence_(correspondence), plan_(plan), index_(new Index(plan.relay_trees)) {
  Index& index = *index_;
  const std::size_t workers = correspondence.sides.size();
  index.routes = plan_detail::atom_routes(correspondence, plan.topology);
  index.regions.assign(workers, {});
  index.parts.assign(workers, {});
  for (std::uint32_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& segment = plan.segments[i];
    const std::int64_t bytes = plan_detail::segment_bytes(index.routes, segment);
    plan_detail::for_each_hop(correspondence, index.routes, plan, segment, [&](const plan_detail::Hop& hop) {
      index.regions[static_cast<std::size_t>(hop.to)].push_back({hop.round, hop.stage, hop.lag, hop.from, 0, bytes});
    });
    // Every worker's part: the sender, and per node position its lander and the other needers there.
    const Atom& atom = correspondence.atoms[segment.atom];
    index.parts[static_cast<std::size_t>(atom.holders[segment.sender].worker)].push_back({segment.round, i, -1, 0});
    const auto landers = plan.landers_of(segment);
    const plan_detail::NodeNeeders* nodes = index.routes.nodes_of(index.routes.atoms[segment.atom]);
    for (std::size_t k = 0; k < landers.size(); ++k) {
      const std::uint32_t round = plan.landing_round(segment, k);
      const int lander = atom.needers[landers[k]].worker;
      const std::uint32_t* needers = index.routes.needers_of(nodes[k]);
      for (std::uint32_t n = 0; n < nodes[k].count; ++n)
        index.parts[static_cast<std::size_t>(atom.needers[needers[n]].worker)].push_back({round, i, static_cast<std::int32_t>(k), 0});
      bool forwards_later = false;
      if (k != segment.origin) index.children_of(segment, k, [&](std::size_t) { forwards_later = true; });
      if (forwards_later) index.parts[static_cast<std::size_t>(lander)].push_back({round + 1, i, static_cast<std::int32_t>(k), 1});
    }
  }
  for (auto& list : index.parts) {
    std::sort(list.begin(), list.end(), [](const Index::Part& a, const Index::Part& b) { return a.key() < b.key(); });
    list.shrink_to_fit();
  }
  for (auto& list : index.regions) {
    std::stable_sort(list.begin(), list.end(), [](const Region& a, const Region& b) { return a.key() < b.key(); });
    std::size_t out = 0;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (out > 0 && list[out - 1].key() == list[i].key()) {
        list[out - 1].bytes += list[i].bytes;
        continue;
      }
      list[out++] = list[i];
    }
    list.resize(out);
    list.shrink_to_fit();
    std::int64_t at = 0;
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (i > 0 && list[i].round != list[i - 1].round) at = 0;
      list[i].start = at;
      at += list[i].bytes;
    }
  }
}

RoundScheduleBuilder::~RoundScheduleBuilder() { delete index_; }

RoundSchedule RoundScheduleBuilder::build(int rank) const {
  const Index& index = *index_;
  const Correspondence& correspondence = correspondence_;
  const TransferPlan& plan = plan_;
  if (rank < 0 || static_cast<std::size_t>(rank) >= correspondence.sides.size())
    throw Error(ErrorCode::kInvalidArgument, "round schedule: rank " + std::to_string(rank) + " is not a worker of the plan");
  const auto r_index = static_cast<std::size_t>(rank);
  RoundSchedule schedule;
  schedule.rank = rank;
  schedule.side = correspondence.sides[r_index];
  schedule.pipeline_depth = plan.pipeline_depth;
  schedule.send_slot_bytes = plan.worker_send_slot_bytes[r_index];
  schedule.receive_slot_bytes = plan.worker_receive_slot_bytes[r_index];
  schedule.rounds.resize(static_cast<std::size_t>(plan.rounds));
  for (const Region& region : index.regions[r_index])
    schedule.rounds[region.round].arrivals.push_back({region.source, region.stage, region.start, region.bytes});

  // This rank's parts, by round, then plan order, so that every region fills in the order its receiver
  // laid it out.
  const std::vector<Index::Part>& parts = index.parts[r_index];
  // Where each segment it relays landed in this rank's receive slot, for its relay part a round later.
  std::unordered_map<std::uint32_t, std::int64_t> landed;

  std::uint32_t round = UINT32_MAX;
  std::int64_t send_cursor = 0;
  // Per (peer, stage, lag), valid when stamped with the current round: where its region starts (in the
  // receiver's slot, or in this rank's), bytes this rank has received from the peer so far or written to it,
  // and its last write to it (to coalesce with).
  struct Cursor {
    std::uint32_t round = UINT32_MAX;
    std::int64_t start = 0;
    std::int64_t bytes = 0;
    std::size_t last_write = SIZE_MAX;
  };
  const std::size_t workers = correspondence.sides.size();
  std::vector<Cursor> in_cursor(workers * kStageCount * 2), out_cursor(workers * kStageCount * 2);
  const auto cursor = [&](std::vector<Cursor>& cursors, int peer, Stage stage, std::uint8_t lag, int receiver, int source) -> Cursor& {
    Cursor& c = cursors[(static_cast<std::size_t>(peer) * kStageCount + static_cast<std::size_t>(stage)) * 2 + lag];
    if (c.round != round) c = Cursor{round, index.region_start(receiver, round, stage, lag, source), 0, SIZE_MAX};
    return c;
  };
  const auto write = [&](RoundPlan& work, int peer, Stage stage, std::uint8_t lag, std::int64_t local, std::int64_t bytes) {
    Cursor& out = cursor(out_cursor, peer, stage, lag, peer, rank);
    const std::int64_t remote = out.start + out.bytes;
    out.bytes += bytes;
    if (out.last_write != SIZE_MAX) {
      Write& last = work.writes[out.last_write];
      if (last.local_offset + last.bytes == local && last.remote_offset + last.bytes == remote) {
        last.bytes += bytes;
        return;
      }
    }
    out.last_write = work.writes.size();
    work.writes.push_back({peer, stage, local, remote, bytes, lag});
  };

  for (const Index::Part& part : parts) {
    if (part.round != round) {
      round = part.round;
      send_cursor = 0;
    }
    RoundPlan& work = schedule.rounds[round];
    const Segment& segment = plan.segments[part.segment];
    const Atom& atom = correspondence.atoms[segment.atom];
    const std::int64_t bytes = plan_detail::segment_bytes(index.routes, segment);
    const auto element_bytes = static_cast<std::uint8_t>(index.routes.atoms[segment.atom].element_bytes);
    const auto landers = plan.landers_of(segment);
    const auto lander_worker = [&](std::size_t k) { return atom.needers[landers[k]].worker; };
    if (part.position < 0) {
      const std::int64_t local = send_cursor;
      send_cursor += bytes;
      work.pack.push_back({copy_at(correspondence, atom, atom.holders[segment.sender], segment.box), local, element_bytes});
      write(work, lander_worker(segment.origin), Stage::kReceive, 0, local, bytes);
      continue;
    }
    const auto k = static_cast<std::size_t>(part.position);
    if (part.relay != 0) {
      // Depth >= 1 relay: its children sit at depth >= 2 and take the segment one round after it landed here.
      const auto it = landed.find(part.segment);
      if (it == landed.end())
        throw Error(ErrorCode::kInternal, "round schedule: rank " + std::to_string(rank) + " relays a segment it never received");
      index.children_of(segment, k, [&](std::size_t child) {
        write(work, lander_worker(child), Stage::kExternalExchange, 1, it->second, bytes);
      });
      landed.erase(it);
      continue;
    }
    const int lander = lander_worker(k);
    Stage in_stage = Stage::kInternalExchange;
    int in_source = lander;
    std::uint8_t in_lag = 0;
    if (rank == lander) {
      if (k == segment.origin) {
        in_stage = Stage::kReceive;
        in_source = atom.holders[segment.sender].worker;
      } else {
        in_stage = Stage::kExternalExchange;
        in_source = lander_worker(plan.lander_parent(segment, k));
        in_lag = plan.lander_depth(segment, k) > 1 ? 1 : 0;
      }
    }
    Cursor& in = cursor(in_cursor, in_source, in_stage, in_lag, rank, in_source);
    const std::int64_t local = in.start + in.bytes;
    in.bytes += bytes;
    const auto [first, last] = std::equal_range(atom.needers.begin(), atom.needers.end(), AtomEndpoint{rank, 0},
                                                [](const AtomEndpoint& a, const AtomEndpoint& b) { return a.worker < b.worker; });
    for (auto it = first; it != last; ++it)
      work.assemble.push_back({copy_at(correspondence, atom, *it, segment.box), local, element_bytes});
    if (rank != lander) continue;
    if (k != segment.origin) {
      bool relays = false;
      index.children_of(segment, k, [&](std::size_t) { relays = true; });
      if (relays) landed.emplace(part.segment, local);
    }
    if (k == segment.origin)
      index.children_of(segment, k, [&](std::size_t child) { write(work, lander_worker(child), Stage::kExternalExchange, 0, local, bytes); });
    const plan_detail::NodeNeeders& here = index.routes.nodes_of(index.routes.atoms[segment.atom])[k];
    const std::uint32_t* needers = index.routes.needers_of(here);
    for (std::uint32_t i = 0; i < here.count; ++i) {
      const int worker = atom.needers[needers[i]].worker;
      if (worker != rank) write(work, worker, Stage::kInternalExchange, 0, local, bytes);
    }
  }
  std::vector<int> peers;
  for (RoundPlan& work : schedule.rounds) {
    // Relays first within their stage: they wait only for the round before, so they can go out first.
    std::stable_sort(work.writes.begin(), work.writes.end(), [](const Write& a, const Write& b) {
      return std::make_tuple(a.stage, -a.lag, a.peer, a.remote_offset) < std::make_tuple(b.stage, -b.lag, b.peer, b.remote_offset);
    });
    for (const Write& w : work.writes) peers.push_back(w.peer);
    for (const Arrival& a : work.arrivals) peers.push_back(a.peer);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  schedule.peers = std::move(peers);
  return schedule;
}

}  // namespace wb

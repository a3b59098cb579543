// Round schedules from a transfer plan. A receiver's buffer of one round is laid out as regions, one per
// (stage, source peer) in that order, and a region holds its segments back to back in plan order. A
// sender's buffer holds its segments in plan order, which groups them by destination. Sender and receiver
// derive the same offsets from the same order, so nothing but the plan is shared.
#include <algorithm>
#include <tuple>

#include "plan/atom_routes.hpp"
#include "weightbridge/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb {

namespace {

struct Region {
  std::uint32_t round = 0;
  Stage stage = Stage::kReceive;
  int source = 0;
  std::int64_t start = 0;
  std::int64_t bytes = 0;
  auto key() const { return std::make_tuple(round, stage, source); }
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

}  // namespace

struct RoundScheduleBuilder::Index {
  plan_detail::AtomRoutes routes;
  std::vector<std::vector<Region>> regions;          // per receiving worker, sorted by (round, stage, source)
  std::vector<std::vector<std::uint32_t>> segments;  // per worker: segments it sends or receives, in plan order

  std::int64_t region_start(int worker, std::uint32_t round, Stage stage, int source) const {
    const auto& list = regions[static_cast<std::size_t>(worker)];
    const auto key = std::make_tuple(round, stage, source);
    const auto it = std::lower_bound(list.begin(), list.end(), key, [](const Region& r, const auto& k) { return r.key() < k; });
    if (it == list.end() || it->key() != key)
      throw Error(ErrorCode::kInternal, "round schedule: no region for worker " + std::to_string(worker));
    return it->start;
  }
};

RoundScheduleBuilder::RoundScheduleBuilder(const Correspondence& correspondence, const TransferPlan& plan)
    : correspondence_(correspondence), plan_(plan), index_(new Index) {
  Index& index = *index_;
  const std::size_t workers = correspondence.sides.size();
  index.routes = plan_detail::atom_routes(correspondence, plan.topology);
  index.regions.assign(workers, {});
  index.segments.assign(workers, {});
  const auto note = [&](int worker, std::uint32_t segment) {
    auto& list = index.segments[static_cast<std::size_t>(worker)];
    if (list.empty() || list.back() != segment) list.push_back(segment);
  };
  for (std::uint32_t i = 0; i < plan.segments.size(); ++i) {
    const Segment& segment = plan.segments[i];
    const std::int64_t bytes = plan_detail::segment_bytes(index.routes, segment);
    plan_detail::for_each_hop(correspondence, index.routes, plan, segment, [&](Stage stage, int from, int to) {
      index.regions[static_cast<std::size_t>(to)].push_back({segment.round, stage, from, 0, bytes});
      note(from, i);
      note(to, i);
    });
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

  std::uint32_t round = UINT32_MAX;
  std::int64_t send_cursor = 0;
  // Per (peer, stage), valid when stamped with the current round: bytes this rank has received from the
  // peer so far, bytes it has written to it so far, and its last write to it (to coalesce with).
  struct Cursor {
    std::uint32_t round = UINT32_MAX;
    std::int64_t bytes = 0;
    std::size_t last_write = SIZE_MAX;
  };
  const std::size_t workers = correspondence.sides.size();
  std::vector<Cursor> in_cursor(workers * kStageCount), out_cursor(workers * kStageCount);
  const auto cursor = [&](std::vector<Cursor>& cursors, int peer, Stage stage) -> Cursor& {
    Cursor& c = cursors[static_cast<std::size_t>(peer) * kStageCount + static_cast<std::size_t>(stage)];
    if (c.round != round) c = Cursor{round, 0, SIZE_MAX};
    return c;
  };
  struct Hop {
    Stage stage;
    int peer;
  };
  std::vector<Hop> outgoing;
  for (std::uint32_t s : index.segments[r_index]) {
    const Segment& segment = plan.segments[s];
    if (segment.round != round) {
      round = segment.round;
      send_cursor = 0;
    }
    RoundPlan& work = schedule.rounds[round];
    const Atom& atom = correspondence.atoms[segment.atom];
    const std::int64_t bytes = plan_detail::segment_bytes(index.routes, segment);
    const auto element_bytes = static_cast<std::uint8_t>(index.routes.atoms[segment.atom].element_bytes);
    // This rank's part in the segment's hops, found without walking all of them (a segment of a
    // replicated atom has hundreds).
    bool receives = false;
    Stage in_stage = Stage::kReceive;
    int in_source = 0;
    outgoing.clear();
    const auto landers = plan.landers_of(segment);
    const int origin = atom.needers[landers[segment.origin]].worker;
    const plan_detail::AtomRoute& route = index.routes.atoms[segment.atom];
    const plan_detail::NodeNeeders* nodes = index.routes.nodes_of(route);
    if (atom.holders[segment.sender].worker == rank) {
      outgoing.push_back({Stage::kReceive, origin});
    } else if (schedule.side == Side::kRollout) {
      const int node = plan.topology.node_of_worker[r_index];
      const auto k = static_cast<std::size_t>(
          std::lower_bound(nodes, nodes + route.node_count, node,
                           [](const plan_detail::NodeNeeders& n, int v) { return n.node < v; }) - nodes);
      const int lander = atom.needers[landers[k]].worker;
      receives = true;
      if (rank == origin) {
        in_stage = Stage::kReceive;
        in_source = atom.holders[segment.sender].worker;
        for (std::size_t j = 0; j < landers.size(); ++j)
          if (j != segment.origin) outgoing.push_back({Stage::kExternalExchange, atom.needers[landers[j]].worker});
      } else if (rank == lander) {
        in_stage = Stage::kExternalExchange;
        in_source = origin;
      } else {
        in_stage = Stage::kInternalExchange;
        in_source = lander;
      }
      if (rank == lander) {
        const std::uint32_t* needers = index.routes.needers_of(nodes[k]);
        for (std::uint32_t i = 0; i < nodes[k].count; ++i) {
          const int worker = atom.needers[needers[i]].worker;
          if (worker != rank) outgoing.push_back({Stage::kInternalExchange, worker});
        }
      }
    }
    std::int64_t local = 0;
    if (atom.holders[segment.sender].worker == rank) {
      local = send_cursor;
      send_cursor += bytes;
      work.pack.push_back({copy_at(correspondence, atom, atom.holders[segment.sender], segment.box), local, element_bytes});
    } else if (receives) {
      Cursor& in = cursor(in_cursor, in_source, in_stage);
      local = index.region_start(rank, round, in_stage, in_source) + in.bytes;
      in.bytes += bytes;
      const auto [first, last] = std::equal_range(atom.needers.begin(), atom.needers.end(), AtomEndpoint{rank, 0},
                                                  [](const AtomEndpoint& a, const AtomEndpoint& b) { return a.worker < b.worker; });
      for (auto it = first; it != last; ++it)
        work.assemble.push_back({copy_at(correspondence, atom, *it, segment.box), local, element_bytes});
    }
    for (const Hop& hop : outgoing) {
      Cursor& out = cursor(out_cursor, hop.peer, hop.stage);
      const std::int64_t remote = index.region_start(hop.peer, round, hop.stage, rank) + out.bytes;
      out.bytes += bytes;
      if (out.last_write != SIZE_MAX) {
        Write& last = work.writes[out.last_write];
        if (last.local_offset + last.bytes == local && last.remote_offset + last.bytes == remote) {
          last.bytes += bytes;
          continue;
        }
      }
      out.last_write = work.writes.size();
      work.writes.push_back({hop.peer, hop.stage, local, remote, bytes});
    }
  }
  std::vector<int> peers;
  for (RoundPlan& work : schedule.rounds) {
    std::stable_sort(work.writes.begin(), work.writes.end(), [](const Write& a, const Write& b) {
      return std::tie(a.stage, a.peer, a.remote_offset) < std::tie(b.stage, b.peer, b.remote_offset);
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

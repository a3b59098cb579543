// Round schedules from a transfer plan. A receiver's buffer of one round is laid out as regions, one per
// (stage, lag, source peer) in that order, and a region holds its segments back to back in plan order. A
// sender's buffer holds its segments in plan order, which groups them by destination. Sender and receiver
// derive the same offsets from the same order, so nothing but the plan is shared.
//
// A lander at depth d > 1 of a relay tree receives a segment d - 1 rounds after the segment's round; it
// forwards it to its own children one round later still, from where it landed (a relay write, lag 1).
#include <algorithm>
#include <cstring>
#include <mutex>
#include <tuple>
#include <unordered_map>

#include "core/parallel.hpp"
#include "plan/atom_routes.hpp"
#include "plan/round_schedule.hpp"
#include "weightbridge/status.hpp"

namespace wb {

// Named, not anonymous: RoundScheduleBuilder::Index, declared in the header, holds them (GCC warns of an
// anonymous type there, -Wsubobject-linkage, where this file is compiled inside a unity source).
namespace plan_detail {

struct Region {
  std::uint32_t round = 0;
  Stage stage = Stage::kReceive;
  std::uint8_t lag = 0;
  int source = 0;
  std::int64_t start = 0;
  std::int64_t bytes = 0;
  auto key() const { return std::make_tuple(round, stage, lag, source); }
};

}  // namespace plan_detail

namespace {

// `to` = `from`, element by element where the sizes agree (the usual case when entries are refilled: a
// call of vector's assignment per axis list was a fifth of building the schedules).
void assign(Shape& to, const Shape& from) {
  if (to.size() != from.size()) {
    to = from;
    return;
  }
  for (std::size_t a = 0; a < from.size(); ++a) to[a] = from[a];
}

// Where the box of `segment` sits in the parameter of copy `copy_index` of `worker`'s source map, written
// into `result` (assigned, so that its vectors keep their memory from the schedule built before).
void copy_at(const Correspondence& correspondence, std::uint32_t tensor, int worker, std::uint32_t copy_index, const Box& box,
             SliceCopy& result) {
  const SliceCopy& copy = correspondence.maps[static_cast<std::size_t>(worker)].copies[copy_index];
  result.tensor = tensor;
  result.parameter = copy.parameter;
  assign(result.box.offset, box.offset);
  assign(result.box.extent, box.extent);
  result.offset = copy.offset;
  for (std::size_t a = 0; a < copy.strides.size(); ++a) result.offset += (box.offset[a] - copy.box.offset[a]) * copy.strides[a];
  assign(result.strides, copy.strides);
}

// Entries a list of this thread's schedule gave up (the rounds of one rank hold more entries than those of
// the next), kept with their memory for the lists that grow next.
thread_local std::vector<BufferCopy> spare_entries;

// The next entry of a list that is refilled in place: entries past `used` are the previous schedule's,
// overwritten rather than destroyed and made again (a BufferCopy holds three vectors; making and freeing
// them for every entry of every rank was most of the time building schedules took).
BufferCopy& next_entry(std::vector<BufferCopy>& list, std::size_t& used) {
  if (used == list.size()) {
    if (spare_entries.empty()) {
      list.emplace_back();
    } else {
      list.push_back(std::move(spare_entries.back()));
      spare_entries.pop_back();
    }
  }
  return list[used++];
}

// Cuts `list` to its first `used` entries, the rest kept for next_entry.
void keep_used(std::vector<BufferCopy>& list, std::size_t used) {
  while (list.size() > used) {
    spare_entries.push_back(std::move(list.back()));
    list.pop_back();
  }
}

}  // namespace

namespace plan_detail {

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

}  // namespace plan_detail

using plan_detail::Region;
using plan_detail::TreeChildren;

struct RoundScheduleBuilder::Index {
  // A worker's part in one segment, in the round it plays it, with what it needs to play it at hand (so that
  // building a schedule walks its own list instead of the plan): as its sender, as the one who receives it
  // at its node (a lander or an internal needer), or as a relay forwarding it one round after it landed.
  enum class Role : std::uint8_t { kSend, kReceive, kRelay };
  struct Part {
    std::uint32_t round = 0;
    std::uint32_t segment = 0;
    Role role = Role::kSend;
    Stage in_stage = Stage::kReceive;  // kReceive: the region it lands in
    std::uint8_t in_lag = 0;
    bool relays_later = false;         // kReceive: the worker forwards it again a round later
    std::uint8_t element_bytes = 0;
    int in_source = 0;
    std::int64_t bytes = 0;
    std::uint32_t first_target = 0;    // into Index::targets of the worker: the writes it makes
    std::uint32_t target_count = 0;
    std::uint32_t first_copy = 0;      // into Index::copies of the worker: its source map copies it packs or
    std::uint32_t copy_count = 0;      // assembles (a worker may need an atom at several places)
    auto key() const { return std::make_tuple(round, segment, role); }
  };
  struct Target {
    int peer = 0;
    Stage stage = Stage::kReceive;
    std::uint8_t lag = 0;
  };

  plan_detail::AtomRoutes routes;
  std::vector<std::vector<Region>> regions;   // per receiving worker, sorted by (round, stage, lag, source)
  std::vector<std::vector<Part>> parts;       // per worker, by round, then plan order
  std::vector<std::vector<Target>> targets;   // per worker
  std::vector<std::vector<std::uint32_t>> copies;  // per worker: indices into its source map's copies
  TreeChildren children;

  explicit Index(const std::vector<RelayTree>& trees) : children(trees) {}

  struct Lists;
  // Indexes segments [begin, end) of the plan into `lists`.
  void add_segments(const Correspondence& correspondence, const TransferPlan& plan, std::uint32_t begin, std::uint32_t end,
                    Lists& lists) const;
  // Makes room in `worker`'s own lists for its lists of every run (on the calling thread, so that the
  // index's memory comes from one malloc arena whichever thread joins the lists).
  void reserve(std::size_t worker, const std::vector<Lists>& runs);
  // Joins `worker`'s lists of every run (in run order) into its own, sorted and laid out (`rounds`: the
  // plan's), in the room reserve made: it allocates nothing that outlives it.
  void take(std::size_t worker, std::size_t rounds, std::vector<Lists>& runs);

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

// What a run of consecutive segments gives every worker: its regions, parts, targets and copies, as the
// Index holds them (first_target and first_copy into this run's lists).
struct RoundScheduleBuilder::Index::Lists {
  std::vector<std::vector<Region>> regions;
  std::vector<std::vector<Part>> parts;
  std::vector<std::vector<Target>> targets;
  std::vector<std::vector<std::uint32_t>> copies;

  explicit Lists(std::size_t workers) : regions(workers), parts(workers), targets(workers), copies(workers) {}
};

void RoundScheduleBuilder::Index::add_segments(const Correspondence& correspondence, const TransferPlan& plan, std::uint32_t begin,
                                               std::uint32_t end, Lists& lists) const {
  const auto begin_part = [&](int worker, Part part) -> Part& {
    part.first_target = static_cast<std::uint32_t>(lists.targets[static_cast<std::size_t>(worker)].size());
    part.first_copy = static_cast<std::uint32_t>(lists.copies[static_cast<std::size_t>(worker)].size());
    return lists.parts[static_cast<std::size_t>(worker)].emplace_back(part);
  };
  const auto add_copy = [&](int worker, Part& part, std::uint32_t copy) {
    lists.copies[static_cast<std::size_t>(worker)].push_back(copy);
    ++part.copy_count;
  };
  const auto add_target = [&](int worker, Part& part, int peer, Stage stage, std::uint8_t lag) {
    lists.targets[static_cast<std::size_t>(worker)].push_back({peer, stage, lag});
    ++part.target_count;
  };
  for (std::uint32_t i = begin; i < end; ++i) {
    const Segment& segment = plan.segments[i];
    const std::int64_t bytes = plan_detail::segment_bytes(routes, segment);
    const auto element_bytes = static_cast<std::uint8_t>(routes.atoms[segment.atom].element_bytes);
    // Segments of one route come one after another: their hops add to the region the last one began.
    plan_detail::for_each_hop(correspondence, routes, plan, segment, [&](const plan_detail::Hop& hop) {
      auto& list = lists.regions[static_cast<std::size_t>(hop.to)];
      const Region region{hop.round, hop.stage, hop.lag, hop.from, 0, bytes};
      if (!list.empty() && list.back().key() == region.key()) {
        list.back().bytes += bytes;
      } else {
        list.push_back(region);
      }
    });
    // Every worker's part: the sender; per node position its lander and the other needers there; relays.
    const Atom& atom = correspondence.atoms[segment.atom];
    const auto landers = plan.landers_of(segment);
    const auto lander_worker = [&](std::size_t k) { return atom.needers[landers[k]].worker; };
    const int sender = atom.holders[segment.sender].worker;
    Part& send = begin_part(sender, {segment.round, i, Role::kSend});
    send.bytes = bytes;
    send.element_bytes = element_bytes;
    add_copy(sender, send, atom.holders[segment.sender].copy);
    add_target(sender, send, lander_worker(segment.origin), Stage::kReceive, 0);
    const plan_detail::NodeNeeders* nodes = routes.nodes_of(routes.atoms[segment.atom]);
    for (std::size_t k = 0; k < landers.size(); ++k) {
      const std::uint32_t round = plan.landing_round(segment, k);
      const int lander = lander_worker(k);
      bool relays = false;
      if (k != segment.origin) children_of(segment, k, [&](std::size_t) { relays = true; });
      const std::uint32_t* needers = routes.needers_of(nodes[k]);
      for (std::uint32_t n = 0; n < nodes[k].count; ++n) {
        const std::uint32_t first = needers[n];  // the worker's first copy: its copies follow in atom.needers
        const int worker = atom.needers[first].worker;
        Part& receive = begin_part(worker, {round, i, Role::kReceive});
        receive.bytes = bytes;
        receive.element_bytes = element_bytes;
        for (std::uint32_t c = first; c < atom.needers.size() && atom.needers[c].worker == worker; ++c)
          add_copy(worker, receive, atom.needers[c].copy);
        if (worker != lander) {
          receive.in_stage = Stage::kInternalExchange;
          receive.in_source = lander;
          continue;
        }
        if (k == segment.origin) {
          receive.in_stage = Stage::kReceive;
          receive.in_source = sender;
          children_of(segment, k, [&](std::size_t child) {
            add_target(worker, receive, lander_worker(child), Stage::kExternalExchange, 0);
          });
        } else {
          receive.in_stage = Stage::kExternalExchange;
          receive.in_source = lander_worker(plan.lander_parent(segment, k));
          receive.in_lag = plan.lander_depth(segment, k) > 1 ? 1 : 0;
          receive.relays_later = relays;
        }
        for (std::uint32_t m = 0; m < nodes[k].count; ++m) {
          const int other = atom.needers[needers[m]].worker;
          if (other != worker) add_target(worker, receive, other, Stage::kInternalExchange, 0);
        }
      }
      if (relays) {
        // Depth >= 1 relay: its children sit at depth >= 2 and take the segment one round after it landed.
        Part& relay = begin_part(lander, {round + 1, i, Role::kRelay});
        relay.bytes = bytes;
        children_of(segment, k, [&](std::size_t child) {
          add_target(lander, relay, lander_worker(child), Stage::kExternalExchange, 1);
        });
      }
    }
  }
}

void RoundScheduleBuilder::Index::reserve(std::size_t worker, const std::vector<Lists>& runs) {
  std::size_t part_count = 0, target_count = 0, copy_count = 0, region_count = 0;
  for (const Lists& run : runs) {
    part_count += run.parts[worker].size();
    target_count += run.targets[worker].size();
    copy_count += run.copies[worker].size();
    region_count += run.regions[worker].size();
  }
  parts[worker].reserve(part_count);
  targets[worker].reserve(target_count);
  copies[worker].reserve(copy_count);
  regions[worker].reserve(region_count);
}

void RoundScheduleBuilder::Index::take(std::size_t worker, std::size_t rounds, std::vector<Lists>& runs) {
  auto& own_parts = parts[worker];
  auto& own_targets = targets[worker];
  auto& own_copies = copies[worker];
  auto& own_regions = regions[worker];
  std::size_t part_count = 0;
  for (const Lists& run : runs) part_count += run.parts[worker].size();
  // Parts by round, in plan order within a round (a counting sort): the order of their keys, as a worker
  // has one part of a segment in any round. Plan order is round order but for relays and the landers deeper
  // in relay trees, so this is one pass where sorting took a quarter of the index's time.
  std::vector<std::uint32_t> first_of_round(rounds + 1, 0);
  for (const Lists& run : runs)
    for (const Part& part : run.parts[worker]) {
      if (part.round + 1 >= first_of_round.size()) first_of_round.resize(part.round + 2, 0);
      ++first_of_round[part.round + 1];
    }
  for (std::size_t r = 0; r + 1 < first_of_round.size(); ++r) first_of_round[r + 1] += first_of_round[r];
  own_parts.resize(part_count);
  for (Lists& run : runs) {
    for (Part part : run.parts[worker]) {
      part.first_target += static_cast<std::uint32_t>(own_targets.size());
      part.first_copy += static_cast<std::uint32_t>(own_copies.size());
      own_parts[first_of_round[part.round]++] = part;
    }
    own_targets.insert(own_targets.end(), run.targets[worker].begin(), run.targets[worker].end());
    own_copies.insert(own_copies.end(), run.copies[worker].begin(), run.copies[worker].end());
    own_regions.insert(own_regions.end(), run.regions[worker].begin(), run.regions[worker].end());
    run.parts[worker] = {};
    run.targets[worker] = {};
    run.copies[worker] = {};
    run.regions[worker] = {};
  }
  const auto part_order = [](const Part& a, const Part& b) { return a.key() < b.key(); };
  if (!std::is_sorted(own_parts.begin(), own_parts.end(), part_order))
    throw Error(ErrorCode::kInternal, "round schedule: worker " + std::to_string(worker) + " has two parts of one segment in a round");
  // Regions: in (round, stage, lag, source) order, those of one key summed, laid out per round.
  // They come in plan order: by round first (a counting sort), then each round's few by key (regions of
  // one key are summed, so their order among themselves does not matter).
  const auto region_order = [](const Region& a, const Region& b) { return a.key() < b.key(); };
  if (!std::is_sorted(own_regions.begin(), own_regions.end(), region_order)) {
    std::vector<std::uint32_t> first(rounds + 1, 0);
    for (const Region& region : own_regions) {
      if (region.round + 1 >= first.size()) first.resize(region.round + 2, 0);
      ++first[region.round + 1];
    }
    for (std::size_t r = 0; r + 1 < first.size(); ++r) first[r + 1] += first[r];
    // Scratch kept per thread (a fresh one per worker left its pages in the joining threads' arenas).
    thread_local std::vector<Region> by_round;
    by_round.resize(own_regions.size());
    std::vector<std::uint32_t> next(first.begin(), first.end() - 1);
    for (const Region& region : own_regions) by_round[next[region.round]++] = region;
    for (std::size_t r = 0; r + 1 < first.size(); ++r) {
      const auto begin = by_round.begin() + first[r], end = by_round.begin() + first[r + 1];
      if (!std::is_sorted(begin, end, region_order)) std::sort(begin, end, region_order);
    }
    std::copy(by_round.begin(), by_round.begin() + static_cast<std::ptrdiff_t>(own_regions.size()), own_regions.begin());
  }
  std::size_t out = 0;
  for (std::size_t i = 0; i < own_regions.size(); ++i) {
    if (out > 0 && own_regions[out - 1].key() == own_regions[i].key()) {
      own_regions[out - 1].bytes += own_regions[i].bytes;
      continue;
    }
    own_regions[out++] = own_regions[i];
  }
  own_regions.resize(out);  // RoundScheduleBuilder's constructor returns the room this leaves
  std::int64_t at = 0;
  for (std::size_t i = 0; i < own_regions.size(); ++i) {
    if (i > 0 && own_regions[i].round != own_regions[i - 1].round) at = 0;
    own_regions[i].start = at;
    at += own_regions[i].bytes;
  }
}

RoundScheduleBuilder::RoundScheduleBuilder(const Correspondence& correspondence, const TransferPlan& plan)
    : correspondence_(correspondence), plan_(plan), index_(new Index(plan.relay_trees)) {
  Index& index = *index_;
  const std::size_t workers = correspondence.sides.size();
  index.routes = plan_detail::atom_routes(correspondence, plan.topology);
  index.regions.assign(workers, {});
  index.parts.assign(workers, {});
  index.targets.assign(workers, {});
  index.copies.assign(workers, {});
  // The segments in a few runs of consecutive ones, each run indexed on a core of its own, then every
  // worker's lists joined in run order (so in plan order, as one pass over the plan gives them).
  const auto segments = static_cast<std::uint32_t>(plan.segments.size());
  const auto runs = static_cast<std::uint32_t>(task_threads(segments / 4096, 0));
  std::vector<Index::Lists> lists(runs, Index::Lists(workers));
  run_tasks(runs, static_cast<int>(runs), [&](std::size_t run, int) {
    const auto begin = static_cast<std::uint32_t>(static_cast<std::uint64_t>(segments) * run / runs);
    const auto end = static_cast<std::uint32_t>(static_cast<std::uint64_t>(segments) * (run + 1) / runs);
    index.add_segments(correspondence, plan, begin, end, lists[run]);
  });
  // Joined on the cores, in room made on this thread (joined where each thread allocated, the lists took
  // 80 MiB more peak RSS, in other malloc arenas), a block of workers at a time (room made for all at once
  // took 30 MiB more: the runs' lists are freed as each worker's are joined).
  constexpr std::size_t kJoinBlock = 32;
  for (std::size_t first = 0; first < workers; first += kJoinBlock) {
    const std::size_t count = std::min(kJoinBlock, workers - first);
    for (std::size_t worker = first; worker < first + count; ++worker) index.reserve(worker, lists);
    for_each_index(count, 4, [&](std::size_t i) { index.take(first + i, static_cast<std::size_t>(plan.rounds), lists); });
    for (std::size_t worker = first; worker < first + count; ++worker) index.regions[worker].shrink_to_fit();
  }
}

RoundScheduleBuilder::~RoundScheduleBuilder() { delete index_; }

RoundSchedule RoundScheduleBuilder::build(int rank) const {
  RoundSchedule schedule;
  build(rank, schedule);
  return schedule;
}

void RoundScheduleBuilder::build(int rank, RoundSchedule& schedule) const {
  using Role = Index::Role;
  const Index& index = *index_;
  const Correspondence& correspondence = correspondence_;
  const TransferPlan& plan = plan_;
  if (rank < 0 || static_cast<std::size_t>(rank) >= correspondence.sides.size())
    throw Error(ErrorCode::kInvalidArgument, "round schedule: rank " + std::to_string(rank) + " is not a worker of the plan");
  const auto r_index = static_cast<std::size_t>(rank);
  schedule.rank = rank;
  schedule.side = correspondence.sides[r_index];
  schedule.pipeline_depth = plan.pipeline_depth;
  schedule.send_slot_bytes = plan.worker_send_slot_bytes[r_index];
  schedule.receive_slot_bytes = plan.worker_receive_slot_bytes[r_index];
  schedule.rounds.resize(static_cast<std::size_t>(plan.rounds));
  // Writes and arrivals are plain values: cleared, they keep their memory. Pack and assemble entries are
  // refilled in place (next_entry) and cut to what this schedule used at the end.
  std::vector<std::size_t> packed(schedule.rounds.size(), 0), assembled(schedule.rounds.size(), 0);
  for (RoundPlan& work : schedule.rounds) {
    work.writes.clear();
    work.arrivals.clear();
  }
  for (const Region& region : index.regions[r_index])
    schedule.rounds[region.round].arrivals.push_back({region.source, region.stage, region.start, region.bytes});

  // This rank's parts, by round, then plan order, so that every region fills in the order its receiver
  // laid it out.
  const auto& parts = index.parts[r_index];
  const auto& targets = index.targets[r_index];
  const auto& copies = index.copies[r_index];
  // Where each segment it relays landed in this rank's receive slot, for its relay part a round later.
  std::unordered_map<std::uint32_t, std::int64_t> landed;

  std::uint32_t round = UINT32_MAX;
  std::int64_t send_cursor = 0;
  // Per (peer, stage, lag), valid when stamped with the current round: where its region starts (in the
  // receiver's slot, or in this rank's), bytes this rank has received from the peer so far or written to it,
  // and its last write to it (to coalesce with).
  struct Cursor {
    std::uint32_t round = UINT32_MAX;
    std::uint64_t generation = 0;
    std::int64_t start = 0;
    std::int64_t bytes = 0;
    std::size_t last_write = SIZE_MAX;
  };
  // Kept per thread from one schedule to the next (a fresh pair per rank would clear workers x 6 cursors
  // for every rank), stamped with the rank and round they were set in.
  const std::size_t workers = correspondence.sides.size();
  thread_local std::vector<Cursor> in_cursor, out_cursor;
  thread_local std::uint64_t generation = 0;  // distinguishes schedules built on this thread
  ++generation;
  if (in_cursor.size() < workers * kStageCount * 2) {
    in_cursor.assign(workers * kStageCount * 2, Cursor{});
    out_cursor.assign(workers * kStageCount * 2, Cursor{});
  }
  const std::uint64_t schedule_generation = generation;
  const auto cursor = [&](std::vector<Cursor>& cursors, int peer, Stage stage, std::uint8_t lag, int receiver, int source) -> Cursor& {
    Cursor& c = cursors[(static_cast<std::size_t>(peer) * kStageCount + static_cast<std::size_t>(stage)) * 2 + lag];
    if (c.round != round || c.generation != schedule_generation)
      c = Cursor{round, schedule_generation, index.region_start(receiver, round, stage, lag, source), 0, SIZE_MAX};
    return c;
  };
  const auto write_all = [&](RoundPlan& work, const Index::Part& part, std::int64_t local) {
    for (std::uint32_t t = part.first_target; t < part.first_target + part.target_count; ++t) {
      const Index::Target& target = targets[t];
      Cursor& out = cursor(out_cursor, target.peer, target.stage, target.lag, target.peer, rank);
      const std::int64_t remote = out.start + out.bytes;
      out.bytes += part.bytes;
      if (out.last_write != SIZE_MAX) {
        Write& last = work.writes[out.last_write];
        if (last.local_offset + last.bytes == local && last.remote_offset + last.bytes == remote) {
          last.bytes += part.bytes;
          continue;
        }
      }
      out.last_write = work.writes.size();
      work.writes.push_back({target.peer, target.stage, local, remote, part.bytes, target.lag});
    }
  };

  for (const Index::Part& part : parts) {
    if (part.round != round) {
      round = part.round;
      send_cursor = 0;
    }
    RoundPlan& work = schedule.rounds[round];
    const Segment& segment = plan.segments[part.segment];
    const std::uint32_t tensor = correspondence.atoms[segment.atom].tensor;
    switch (part.role) {
      case Role::kSend: {
        const std::int64_t local = send_cursor;
        send_cursor += part.bytes;
        BufferCopy& pack = next_entry(work.pack, packed[round]);
        copy_at(correspondence, tensor, rank, copies[part.first_copy], segment.box, pack.copy);
        pack.buffer_offset = local;
        pack.element_bytes = part.element_bytes;
        write_all(work, part, local);
        break;
      }
      case Role::kReceive: {
        Cursor& in = cursor(in_cursor, part.in_source, part.in_stage, part.in_lag, rank, part.in_source);
        const std::int64_t local = in.start + in.bytes;
        in.bytes += part.bytes;
        for (std::uint32_t c = part.first_copy; c < part.first_copy + part.copy_count; ++c) {
          BufferCopy& assemble = next_entry(work.assemble, assembled[round]);
          copy_at(correspondence, tensor, rank, copies[c], segment.box, assemble.copy);
          assemble.buffer_offset = local;
          assemble.element_bytes = part.element_bytes;
        }
        if (part.relays_later) landed.emplace(part.segment, local);
        write_all(work, part, local);
        break;
      }
      case Role::kRelay: {
        const auto it = landed.find(part.segment);
        if (it == landed.end())
          throw Error(ErrorCode::kInternal, "round schedule: rank " + std::to_string(rank) + " relays a segment it never received");
        write_all(work, part, it->second);
        landed.erase(it);
        break;
      }
    }
  }
  std::vector<int> peers;
  for (std::size_t r = 0; r < schedule.rounds.size(); ++r) {
    RoundPlan& work = schedule.rounds[r];
    keep_used(work.pack, packed[r]);
    keep_used(work.assemble, assembled[r]);
    // Relays first within their stage: they wait only for the round before, so they can go out first.
    const auto in_order = [](const Write& a, const Write& b) {
      return std::make_tuple(a.stage, -a.lag, a.peer, a.remote_offset) < std::make_tuple(b.stage, -b.lag, b.peer, b.remote_offset);
    };
    if (!std::is_sorted(work.writes.begin(), work.writes.end(), in_order))
      std::stable_sort(work.writes.begin(), work.writes.end(), in_order);
    for (const Write& w : work.writes) peers.push_back(w.peer);
    for (const Arrival& a : work.arrivals) peers.push_back(a.peer);
  }
  std::sort(peers.begin(), peers.end());
  peers.erase(std::unique(peers.begin(), peers.end()), peers.end());
  schedule.peers = std::move(peers);
}

std::vector<std::vector<std::byte>> serialize_round_schedules(const RoundScheduleBuilder& builder, int ranks, int threads,
                                                              const std::function<void(const RoundSchedule&)>& inspect) {
  const auto count = static_cast<std::size_t>(std::max(0, ranks));
  std::vector<std::vector<std::byte>> serialized(count);
  threads = task_threads(count / 8, threads);  // a few ranks are not worth a thread
  std::vector<RoundSchedule> schedules(static_cast<std::size_t>(threads));  // per thread, refilled rank after rank
  std::mutex lock;
  run_tasks(count, threads, [&](std::size_t rank, int thread) {
    RoundSchedule& schedule = schedules[static_cast<std::size_t>(thread)];
    builder.build(static_cast<int>(rank), schedule);
    serialized[rank] = serialize_round_schedule(schedule);
    if (inspect) {
      const std::lock_guard<std::mutex> guard(lock);
      inspect(schedule);
    }
  });
  spare_entries = {};  // this thread's (the others' end with them)
  return serialized;
}

std::uint64_t round_schedules_digest(const std::vector<std::vector<std::byte>>& serialized) {
  // FNV-1a over 8-byte words, each rank's size first (so that moving bytes between ranks changes it).
  constexpr std::uint64_t kPrime = 0x100000001b3ull;
  std::uint64_t digest = 0xcbf29ce484222325ull;
  const auto mix = [&](std::uint64_t word) { digest = (digest ^ word) * kPrime; };
  for (const std::vector<std::byte>& bytes : serialized) {
    mix(bytes.size());
    std::size_t at = 0;
    for (; at + 8 <= bytes.size(); at += 8) {
      std::uint64_t word = 0;
      std::memcpy(&word, bytes.data() + at, 8);
      mix(word);
    }
    if (at < bytes.size()) {
      std::uint64_t tail = 0;
      std::memcpy(&tail, bytes.data() + at, bytes.size() - at);
      mix(tail);
    }
  }
  return digest;
}

}  // namespace wb

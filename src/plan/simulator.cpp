// The network model: a rounds-by-stages schedule of point-to-point transfers, played as a fluid model on
// the topology's links.
//
// Links. Per node an inter-node egress and ingress link (node_bandwidth each); per worker an intra-node
// egress and ingress link (intra_node_bandwidth each). A transfer between nodes loads its sender node's
// egress and its receiver node's ingress; one inside a node, its sender worker's intra egress and its
// receiver worker's intra ingress; one from a worker to itself costs nothing.
//
// Work. A task is (round, stage). On every link it uses it carries an amount of work, in seconds of the
// link's full bandwidth: bytes / bandwidth + messages × message_latency (each message occupies every link
// it crosses for the latency, so a burst of small writes costs link time the way it does on a NIC). The
// loads of one task on different links drain independently; the task is done when all of them are.
//
// Sharing. Concurrently active tasks share a link fairly (processor sharing): the k tasks with work left
// on a link each drain at 1/k of its rate. Each link keeps a virtual clock that advances at 1/k per
// second; a task's load on the link ends when the clock reaches the value it had at the task's start plus
// the load, so the loads of one link end in order of those finish marks (a heap per link), and the next
// event of a link in real time only changes when a task starts or ends on that link. A global heap of the
// links' next events (stale entries skipped by a version number) makes the whole simulation
// O(E log E) in E = Σ over tasks of the links each task uses, independent of the number of transfers.
//
// Order. Task (r, s) starts when the stages of round r it follows are done (s - 1, or those the schedule
// names), (r-1, s) is done, and round r - depth is done entirely. Relays (lag 1 transfers) add, per task,
// stages of round r - 1 (where a relay of round r received what it forwards) and of round r - depth + 1
// (where a destination of the task relays out of the slot the task writes into) that must be done first.
// Tasks without work end the moment they start.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <queue>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

struct LinkSpace {
  int nodes = 0;
  int workers = 0;
  int count() const { return 2 * nodes + 2 * workers; }
  int node_egress(int node) const { return node; }
  int node_ingress(int node) const { return nodes + node; }
  int intra_egress(int worker) const { return 2 * nodes + worker; }
  int intra_ingress(int worker) const { return 2 * nodes + workers + worker; }
  bool inter_node(int link) const { return link < 2 * nodes; }
  std::string name(int link) const {
    if (link < nodes) return "node " + std::to_string(link) + " egress";
    if (link < 2 * nodes) return "node " + std::to_string(link - nodes) + " ingress";
    if (link < 2 * nodes + workers) return "worker " + std::to_string(link - 2 * nodes) + " intra egress";
    return "worker " + std::to_string(link - 2 * nodes - workers) + " intra ingress";
  }
};

struct Load {
  int link = 0;
  double work = 0;  // seconds at the link's full bandwidth
};

struct Task {
  std::vector<Load> loads;
  std::uint8_t after_previous = 0;  // stages of round r - 1 that must be done first (relays), as bits
  std::uint8_t after_slot = 0;      // stages of round r - depth + 1 that must be done first (relays), as bits
  int left = 0;  // loads not yet drained
  enum class State : std::uint8_t { kWaiting, kActive, kDone } state = State::kWaiting;
  double start = 0;
  double finish = 0;
};

struct LinkState {
  double virtual_time = 0;  // work seconds each active load has received since the start
  double updated_at = 0;    // real time at which virtual_time was last brought up to date
  int active = 0;           // loads with work left
  std::uint64_t version = 0;
  // (finish mark, task) of the active loads, earliest first.
  std::priority_queue<std::pair<double, int>, std::vector<std::pair<double, int>>, std::greater<>> loads;
};

struct Event {
  double time = 0;
  int link = 0;
  std::uint64_t version = 0;
  bool operator>(const Event& other) const { return time > other.time; }
};

class FluidSimulation {
 public:
  FluidSimulation(std::vector<Task>& tasks, int rounds, int stages, int depth, int links, bool relays, std::vector<std::uint8_t> after)
      : tasks_(tasks), rounds_(rounds), stages_(stages), depth_(depth), relays_(relays), links_(static_cast<std::size_t>(links)),
        after_(std::move(after)), round_done_(static_cast<std::size_t>(rounds), 0) {}

  void run() {
    if (rounds_ == 0 || stages_ == 0) return;
    for (int s = 0; s < stages_; ++s) try_start(0, s);
    while (!events_.empty()) {
      const Event event = events_.top();
      events_.pop();
      LinkState& link = links_[static_cast<std::size_t>(event.link)];
      if (event.version != link.version) continue;  // superseded
      now_ = std::max(now_, event.time);
      advance(link);
      drain(event.link);
      schedule(event.link);
      start_ready();
    }
    for (std::size_t t = 0; t < tasks_.size(); ++t)
      if (tasks_[t].state != Task::State::kDone)
        throw Error(ErrorCode::kInternal, "simulate: round " + std::to_string(t / static_cast<std::size_t>(stages_)) +
                                              " stage " + std::to_string(t % static_cast<std::size_t>(stages_)) +
                                              " never finished");
  }

 private:
  Task& task(int round, int stage) { return tasks_[static_cast<std::size_t>(round * stages_ + stage)]; }
  bool done(int round, int stage) { return task(round, stage).state == Task::State::kDone; }

  bool ready(int round, int stage) {
    if (round < 0 || round >= rounds_ || stage >= stages_ || task(round, stage).state != Task::State::kWaiting) return false;
    for (int s = 0; s < stages_; ++s)
      if ((after_[static_cast<std::size_t>(stage)] >> s & 1) && !done(round, s)) return false;
    if (round > 0 && !done(round - 1, stage)) return false;
    if (round >= depth_ && round_done_[static_cast<std::size_t>(round - depth_)] < stages_) return false;
    const Task& t = task(round, stage);
    for (int s = 0; s < stages_; ++s) {
      if ((t.after_previous >> s & 1) && !done(round - 1, s)) return false;
      if ((t.after_slot >> s & 1) && !done(round - depth_ + 1, s)) return false;
    }
    return true;
  }

  void try_start(int round, int stage) {
    if (ready(round, stage)) ready_.emplace_back(round, stage);
    start_ready();
  }

  // Starts every ready task; tasks without work end at once and may make others ready.
  void start_ready() {
    while (!ready_.empty()) {
      const auto [round, stage] = ready_.back();
      ready_.pop_back();
      Task& t = task(round, stage);
      if (t.state != Task::State::kWaiting) continue;
      t.state = Task::State::kActive;
      t.start = now_;
      const int id = round * stages_ + stage;
      for (const Load& load : t.loads) {
        LinkState& link = links_[static_cast<std::size_t>(load.link)];
        advance(link);
        link.loads.emplace(link.virtual_time + load.work, id);
        ++link.active;
        schedule(load.link);
      }
      t.left = static_cast<int>(t.loads.size());
      if (t.left == 0) finish(round, stage);
    }
  }

  void finish(int round, int stage) {
    Task& t = task(round, stage);
    t.state = Task::State::kDone;
    t.finish = now_;
    ++round_done_[static_cast<std::size_t>(round)];
    for (int s = 0; s < stages_; ++s)
      if (ready(round, s)) ready_.emplace_back(round, s);
    if (ready(round + 1, stage)) ready_.emplace_back(round + 1, stage);
    for (int s = 0; s < stages_; ++s)
      if (ready(round + depth_, s)) ready_.emplace_back(round + depth_, s);
    if (relays_)  // tasks that wait for this one through a relay
      for (int r : {round + 1, round + depth_ - 1})
        for (int s = 0; s < stages_; ++s)
          if (ready(r, s)) ready_.emplace_back(r, s);
  }

  void advance(LinkState& link) const {
    if (link.active > 0) link.virtual_time += (now_ - link.updated_at) / link.active;
    link.updated_at = now_;
  }

  // Ends the loads of `link_index` whose finish mark the virtual clock has reached. A mark within
  // rounding of the clock, or one so close that time could not advance to it, counts as reached.
  void drain(int link_index) {
    LinkState& link = links_[static_cast<std::size_t>(link_index)];
    while (!link.loads.empty()) {
      const auto [mark, id] = link.loads.top();
      const double gap = mark - link.virtual_time;
      const double tolerance = 1e-12 * std::max(1.0, std::abs(mark));
      if (gap > tolerance && now_ + gap * link.active > now_) break;
      link.loads.pop();
      --link.active;
      Task& t = tasks_[static_cast<std::size_t>(id)];
      if (--t.left == 0) finish(id / stages_, id % stages_);
    }
  }

  void schedule(int link_index) {
    LinkState& link = links_[static_cast<std::size_t>(link_index)];
    ++link.version;
    if (link.loads.empty()) return;
    const double gap = std::max(0.0, link.loads.top().first - link.virtual_time);
    events_.push(Event{now_ + gap * link.active, link_index, link.version});
  }

  std::vector<Task>& tasks_;
  int rounds_;
  int stages_;
  int depth_;
  bool relays_;
  std::vector<LinkState> links_;
  std::vector<std::uint8_t> after_;  // per stage: the stages of its round it follows, as bits
  std::vector<int> round_done_;      // per round: stages done
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  std::vector<std::pair<int, int>> ready_;
  double now_ = 0;
};

// Per stage, the stages of the same round it follows, as bits: TrafficSchedule::stage_after, or the one
// before it. Throws on a stage that follows itself or one that does not exist, and on a cycle.
std::vector<std::uint8_t> stage_order(const TrafficSchedule& schedule) {
  const int stages = static_cast<int>(schedule.stage_names.size());
  std::vector<std::uint8_t> after(static_cast<std::size_t>(stages), 0);
  if (schedule.stage_after.empty()) {
    for (int s = 1; s < stages; ++s) after[static_cast<std::size_t>(s)] = static_cast<std::uint8_t>(1u << (s - 1));
    return after;
  }
  if (static_cast<int>(schedule.stage_after.size()) != stages || stages > 8)
    throw Error(ErrorCode::kInvalidArgument, "simulate: stage_after names " + std::to_string(schedule.stage_after.size()) +
                                                 " stages of " + std::to_string(stages) + " (at most 8)");
  for (int s = 0; s < stages; ++s) {
    const unsigned mask = schedule.stage_after[static_cast<std::size_t>(s)];
    if ((mask >> s & 1) || (mask >> stages) != 0)
      throw Error(ErrorCode::kInvalidArgument, "simulate: stage " + schedule.stage_names[static_cast<std::size_t>(s)] +
                                                   " follows itself or a stage that does not exist");
    after[static_cast<std::size_t>(s)] = static_cast<std::uint8_t>(mask);
  }
  // A cycle would leave its stages waiting for ever: take away stages whose predecessors are gone.
  unsigned left = (1u << stages) - 1;
  for (bool removed = true; removed && left != 0;) {
    removed = false;
    for (int s = 0; s < stages; ++s)
      if ((left >> s & 1) && (after[static_cast<std::size_t>(s)] & left) == 0) {
        left &= ~(1u << s);
        removed = true;
      }
  }
  if (left != 0) throw Error(ErrorCode::kInvalidArgument, "simulate: stage_after has a cycle");
  return after;
}

// Fills Task::after_previous and after_slot from the schedule's relay transfers; false when there are none.
// A relay forwards what came to its worker over the inter-node network, so it waits for the stages of the
// round before that brought that worker transfers from other nodes.
bool add_relay_dependencies(const TrafficSchedule& schedule, const Topology& topology, std::vector<Task>& tasks,
                            std::size_t workers) {
  const int rounds = static_cast<int>(schedule.rounds.size());
  const int stages = static_cast<int>(schedule.stage_names.size());
  const int depth = schedule.pipeline_depth;
  bool any = false;
  for (int r = 0; r < rounds; ++r)
    for (const auto& stage : schedule.rounds[static_cast<std::size_t>(r)])
      for (const Transfer& t : stage) {
        if (t.lag > 1) throw Error(ErrorCode::kInvalidArgument, "simulate: lag " + std::to_string(t.lag) + " (0 or 1)");
        if (t.lag == 1 && (r == 0 || depth < 2 || stages > 8))
          throw Error(ErrorCode::kInvalidArgument, "simulate: a relay transfer " + std::to_string(t.from) + " -> " +
                                                       std::to_string(t.to) + " in round " + std::to_string(r) +
                                                       " (relays need a round before, a pipeline depth of 2 and at most 8 stages)");
        any = any || t.lag == 1;
      }
  if (!any) return false;
  // Per round and worker, as bits: the stages in which it receives, and those in which it relays.
  std::vector<std::uint8_t> receives(static_cast<std::size_t>(rounds) * workers, 0), relays(receives.size(), 0);
  for (int r = 0; r < rounds; ++r) {
    const auto& round = schedule.rounds[static_cast<std::size_t>(r)];
    for (std::size_t s = 0; s < round.size(); ++s)
      for (const Transfer& t : round[s]) {
        if (t.from == t.to) continue;
        if (topology.node_of_worker[static_cast<std::size_t>(t.from)] != topology.node_of_worker[static_cast<std::size_t>(t.to)])
          receives[static_cast<std::size_t>(r) * workers + static_cast<std::size_t>(t.to)] |= static_cast<std::uint8_t>(1u << s);
        if (t.lag == 1) relays[static_cast<std::size_t>(r) * workers + static_cast<std::size_t>(t.from)] |= static_cast<std::uint8_t>(1u << s);
      }
  }
  for (int r = 0; r < rounds; ++r) {
    const auto& round = schedule.rounds[static_cast<std::size_t>(r)];
    const int slot_round = r - depth + 1;  // the round whose relays read the slot this round reuses
    for (std::size_t s = 0; s < round.size(); ++s) {
      Task& task = tasks[static_cast<std::size_t>(r * stages) + s];
      for (const Transfer& t : round[s]) {
        if (t.from == t.to) continue;
        if (t.lag == 1) task.after_previous |= receives[static_cast<std::size_t>(r - 1) * workers + static_cast<std::size_t>(t.from)];
        if (slot_round >= 0 && slot_round < r)
          task.after_slot |= relays[static_cast<std::size_t>(slot_round) * workers + static_cast<std::size_t>(t.to)];
      }
    }
  }
  return true;
}

}  // namespace

SimulationResult simulate(const TrafficSchedule& schedule, const Topology& topology) {
  const auto invalid = [](const std::string& what) { return Error(ErrorCode::kInvalidArgument, "simulate: " + what); };
  if (!(topology.node_bandwidth > 0) || !(topology.intra_node_bandwidth > 0))
    throw invalid("bandwidths must be positive (node " + std::to_string(topology.node_bandwidth) + ", intra-node " +
                  std::to_string(topology.intra_node_bandwidth) + " B/s)");
  if (!(topology.message_latency >= 0)) throw invalid("message latency must not be negative");
  if (schedule.pipeline_depth < 1)
    throw invalid("pipeline depth " + std::to_string(schedule.pipeline_depth) + " must be at least 1");
  for (int node : topology.node_of_worker)
    if (node < 0) throw invalid("topology places a worker on negative node " + std::to_string(node));

  const LinkSpace space{topology.num_nodes(), static_cast<int>(topology.node_of_worker.size())};
  const int link_count = space.count();
  const int rounds = static_cast<int>(schedule.rounds.size());
  const int stages = static_cast<int>(schedule.stage_names.size());
  std::vector<double> bandwidth(static_cast<std::size_t>(link_count), topology.intra_node_bandwidth);
  for (int l = 0; l < 2 * space.nodes; ++l) bandwidth[static_cast<std::size_t>(l)] = topology.node_bandwidth;

  SimulationResult result;
  result.node_ingress_bytes.assign(static_cast<std::size_t>(space.nodes), 0);
  result.node_egress_bytes.assign(static_cast<std::size_t>(space.nodes), 0);
  result.stages.resize(static_cast<std::size_t>(stages));
  for (int s = 0; s < stages; ++s) result.stages[static_cast<std::size_t>(s)].name = schedule.stage_names[static_cast<std::size_t>(s)];

  // Per task, the bytes and messages on every link it uses (dense scratch, compacted per task).
  std::vector<Task> tasks(static_cast<std::size_t>(rounds) * static_cast<std::size_t>(stages));
  std::vector<std::int64_t> link_bytes(static_cast<std::size_t>(link_count), 0);
  std::vector<std::int64_t> link_messages(static_cast<std::size_t>(link_count), 0);
  std::vector<char> link_touched(static_cast<std::size_t>(link_count), 0);
  std::vector<int> touched;
  std::vector<std::int64_t> stage_link_bytes(static_cast<std::size_t>(stages) * static_cast<std::size_t>(link_count), 0);
  const int workers = space.workers;
  for (int r = 0; r < rounds; ++r) {
    const auto& round = schedule.rounds[static_cast<std::size_t>(r)];
    if (static_cast<int>(round.size()) > stages)
      throw invalid("round " + std::to_string(r) + " has " + std::to_string(round.size()) + " stages, the schedule names " +
                    std::to_string(stages));
    for (int s = 0; s < static_cast<int>(round.size()); ++s) {
      auto touch = [&](int link, std::int64_t bytes, std::int64_t messages) {
        const auto l = static_cast<std::size_t>(link);
        if (!link_touched[l]) {
          link_touched[l] = 1;
          touched.push_back(link);
        }
        link_bytes[l] += bytes;
        link_messages[l] += messages;
      };
      for (const Transfer& transfer : round[static_cast<std::size_t>(s)]) {
        if (transfer.from < 0 || transfer.from >= workers || transfer.to < 0 || transfer.to >= workers)
          throw invalid("round " + std::to_string(r) + " stage " + schedule.stage_names[static_cast<std::size_t>(s)] +
                        ": transfer " + std::to_string(transfer.from) + " -> " + std::to_string(transfer.to) +
                        " names a worker outside the topology's " + std::to_string(workers));
        if (transfer.bytes < 0 || transfer.messages < 0)
          throw invalid("transfer " + std::to_string(transfer.from) + " -> " + std::to_string(transfer.to) +
                        " has negative bytes or messages");
        if (transfer.from == transfer.to) continue;
        const int from_node = topology.node_of_worker[static_cast<std::size_t>(transfer.from)];
        const int to_node = topology.node_of_worker[static_cast<std::size_t>(transfer.to)];
        if (from_node != to_node) {
          touch(space.node_egress(from_node), transfer.bytes, transfer.messages);
          touch(space.node_ingress(to_node), transfer.bytes, transfer.messages);
        } else {
          touch(space.intra_egress(transfer.from), transfer.bytes, transfer.messages);
          touch(space.intra_ingress(transfer.to), transfer.bytes, transfer.messages);
        }
        result.stages[static_cast<std::size_t>(s)].bytes += transfer.bytes;
      }
      Task& task = tasks[static_cast<std::size_t>(r * stages + s)];
      std::sort(touched.begin(), touched.end());
      for (int link : touched) {
        const auto l = static_cast<std::size_t>(link);
        const double work = static_cast<double>(link_bytes[l]) / bandwidth[l] +
                            static_cast<double>(link_messages[l]) * topology.message_latency;
        if (work > 0) task.loads.push_back(Load{link, work});
        stage_link_bytes[static_cast<std::size_t>(s) * static_cast<std::size_t>(link_count) + l] += link_bytes[l];
        if (space.inter_node(link)) {
          if (link < space.nodes) result.node_egress_bytes[l] += link_bytes[l];
          else result.node_ingress_bytes[l - static_cast<std::size_t>(space.nodes)] += link_bytes[l];
        }
        link_bytes[l] = 0;
        link_messages[l] = 0;
        link_touched[l] = 0;
      }
      touched.clear();
    }
  }

  const bool relays = add_relay_dependencies(schedule, topology, tasks, static_cast<std::size_t>(workers));
  FluidSimulation(tasks, rounds, stages, schedule.pipeline_depth, link_count, relays, stage_order(schedule)).run();

  for (int s = 0; s < stages; ++s) {
    SimulationResult::StageSummary& summary = result.stages[static_cast<std::size_t>(s)];
    const std::int64_t* bytes = stage_link_bytes.data() + static_cast<std::size_t>(s) * static_cast<std::size_t>(link_count);
    for (int l = 0; l < link_count; ++l)
      if (bytes[l] > summary.busiest_link_bytes) {
        summary.busiest_link_bytes = bytes[l];
        summary.busiest_link = space.name(l);
      }
    for (int r = 0; r < rounds; ++r) {
      const Task& task = tasks[static_cast<std::size_t>(r * stages + s)];
      summary.seconds += task.finish - task.start;
      result.ewtt_seconds = std::max(result.ewtt_seconds, task.finish);
    }
  }
  return result;
}

}  // namespace wb

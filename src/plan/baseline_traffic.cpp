// The paper's two baselines (§4.1), Miles' native weight-update paths, expressed as traffic so that they
// are simulated on the same network model as WeightBridge's plans.
//
// Both cut the model into buckets (rounds) of about BaselineTrafficOptions::bucket_bytes and pipeline them; every
// worker-to-worker total is split evenly over the rounds, one message per pair and round (or chunks of
// BaselineTrafficOptions::message_bytes when set).
//
// Broadcast: stage "gather" brings every needed element to the head (the first trainer worker, world rank
// 0 in Miles' layouts): each atom from one of its holders, chosen to spread the gather; stage
// "broadcast" relays the *whole* bucket along a chain head -> rollout workers of the first rollout node ->
// those of the next node -> ..., as NCCL's pipelined ring broadcast does. Every rollout node thus takes M
// over its ingress whatever its workers need, and the head's node sends M once whatever the number of
// rollouts.
//
// P2P: every engine has one trainer source that gathers what the engine needs, then writes each of the
// engine's workers exactly the bytes that worker needs; replicas inside an engine (TP-replicated
// attention, norms) are each written separately, and sources of many engines share trainer nodes' egress.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "weightbridge/simulator.hpp"
#include "weightbridge/status.hpp"

namespace wb {
namespace {

Error invalid(const std::string& what) { return Error(ErrorCode::kInvalidArgument, what); }

std::int64_t atom_bytes(const Correspondence& correspondence, const Atom& atom) {
  return atom.box.numel() * static_cast<std::int64_t>(dtype_size(correspondence.tensors[atom.tensor].dtype));
}

std::int64_t model_bytes(const Correspondence& correspondence) {
  std::int64_t total = 0;
  for (const Atom& atom : correspondence.atoms) total += atom_bytes(correspondence, atom);
  return total;
}

void check_common(const Correspondence& correspondence, const Topology& topology, const BaselineTrafficOptions& options,
                  const char* strategy) {
  const std::string who = std::string(strategy) + " baseline: ";
  if (options.bucket_bytes <= 0) throw invalid(who + "bucket bytes must be positive");
  if (options.pipeline_depth < 1) throw invalid(who + "pipeline depth must be at least 1");
  if (options.message_bytes < 0) throw invalid(who + "message bytes must not be negative");
  if (topology.node_of_worker.size() != correspondence.sides.size())
    throw invalid(who + "topology places " + std::to_string(topology.node_of_worker.size()) +
                  " workers, the correspondence has " + std::to_string(correspondence.sides.size()));
}

int round_count(std::int64_t model, const BaselineTrafficOptions& options) {
  return static_cast<int>(std::max<std::int64_t>(1, (model + options.bucket_bytes - 1) / options.bucket_bytes));
}

// Totals per (from, to) of one stage, split evenly over the rounds into the schedule.
void spread(const std::map<std::pair<int, int>, std::int64_t>& totals, int stage, std::int64_t message_bytes,
            TrafficSchedule& schedule) {
  const auto rounds = static_cast<std::int64_t>(schedule.rounds.size());
  struct Total {
    int from, to;
    std::int64_t quotient, remainder;
  };
  std::vector<Total> list;
  list.reserve(totals.size());
  for (const auto& [pair, bytes] : totals)
    if (pair.first != pair.second) list.push_back({pair.first, pair.second, bytes / rounds, bytes % rounds});
  for (std::int64_t r = 0; r < rounds; ++r) {
    std::vector<Transfer>& out = schedule.rounds[static_cast<std::size_t>(r)][static_cast<std::size_t>(stage)];
    out.reserve(list.size());
    for (const Total& total : list) {
      const std::int64_t share = total.quotient + (r < total.remainder ? 1 : 0);
      if (share == 0) continue;
      const std::int64_t messages =
          message_bytes > 0 ? std::max<std::int64_t>(1, (share + message_bytes - 1) / message_bytes) : 1;
      out.push_back(Transfer{total.from, total.to, share,
                             static_cast<std::int32_t>(std::min<std::int64_t>(messages, std::numeric_limits<std::int32_t>::max()))});
    }
  }
}

TrafficSchedule empty_schedule(const char* strategy, std::vector<std::string> stage_names, int rounds, int depth) {
  TrafficSchedule schedule;
  schedule.strategy = strategy;
  schedule.pipeline_depth = depth;
  schedule.rounds.assign(static_cast<std::size_t>(rounds), std::vector<std::vector<Transfer>>(stage_names.size()));
  schedule.stage_names = std::move(stage_names);
  return schedule;
}

// The holder an atom is gathered from for `target`: the target itself when it holds the atom (nothing
// moves), else the holder that has sent least so far.
int gather_source(const Atom& atom, int target, std::vector<std::int64_t>& sent, std::int64_t bytes) {
  int best = -1;
  for (const AtomEndpoint& holder : atom.holders) {
    if (holder.worker == target) return target;
    if (best < 0 || sent[static_cast<std::size_t>(holder.worker)] < sent[static_cast<std::size_t>(best)]) best = holder.worker;
  }
  sent[static_cast<std::size_t>(best)] += bytes;
  return best;
}

std::vector<int> trainer_workers(const Correspondence& correspondence) {
  std::vector<int> trainers;
  for (std::size_t w = 0; w < correspondence.sides.size(); ++w)
    if (correspondence.sides[w] == Side::kTrainer) trainers.push_back(static_cast<int>(w));
  return trainers;
}

}  // namespace

TrafficSchedule broadcast_baseline_traffic(const Correspondence& correspondence, const Topology& topology,
                                           const BaselineTrafficOptions& options) {
  check_common(correspondence, topology, options, "broadcast");
  const std::vector<int> trainers = trainer_workers(correspondence);
  if (trainers.empty()) throw invalid("broadcast baseline: no trainer worker to gather to");
  const int head = trainers.front();
  const std::int64_t model = model_bytes(correspondence);
  TrafficSchedule schedule = empty_schedule("broadcast", {"gather", "broadcast"}, round_count(model, options),
                                            options.pipeline_depth);

  std::vector<std::int64_t> sent(correspondence.sides.size(), 0);
  std::map<std::pair<int, int>, std::int64_t> gather;
  for (const Atom& atom : correspondence.atoms) {
    const std::int64_t bytes = atom_bytes(correspondence, atom);
    const int from = gather_source(atom, head, sent, bytes);
    if (from != head) gather[{from, head}] += bytes;
  }
  spread(gather, 0, options.message_bytes, schedule);

  // The relay chain: rollout workers by node, then rank; each hop carries the whole bucket.
  std::vector<std::pair<int, int>> chain;  // (node, worker)
  for (std::size_t w = 0; w < correspondence.sides.size(); ++w)
    if (correspondence.sides[w] == Side::kRollout) chain.emplace_back(topology.node_of_worker[w], static_cast<int>(w));
  std::sort(chain.begin(), chain.end());
  std::map<std::pair<int, int>, std::int64_t> hops;
  int previous = head;
  for (const auto& [node, worker] : chain) {
    hops[{previous, worker}] += model;
    previous = worker;
  }
  spread(hops, 1, options.message_bytes, schedule);
  return schedule;
}

TrafficSchedule p2p_baseline_traffic(const Correspondence& correspondence, const Topology& topology,
                                     const BaselineTrafficOptions& options) {
  check_common(correspondence, topology, options, "p2p");
  const std::size_t workers = correspondence.sides.size();
  if (options.engine_of_worker.size() != workers)
    throw invalid("p2p baseline: engine_of_worker has " + std::to_string(options.engine_of_worker.size()) +
                  " entries, the correspondence has " + std::to_string(workers) + " workers");
  std::vector<int> engines;
  for (std::size_t w = 0; w < workers; ++w) {
    const int engine = options.engine_of_worker[w];
    const bool rollout = correspondence.sides[w] == Side::kRollout;
    if (rollout && engine < 0)
      throw invalid("p2p baseline: rollout worker " + std::to_string(w) + " has no engine (" + std::to_string(engine) + ")");
    if (!rollout && engine != -1)
      throw invalid("p2p baseline: trainer worker " + std::to_string(w) + " is given engine " + std::to_string(engine) +
                    " (trainers take -1)");
    if (rollout) engines.push_back(engine);
  }
  std::sort(engines.begin(), engines.end());
  engines.erase(std::unique(engines.begin(), engines.end()), engines.end());

  // Sources: the k-th engine takes trainer node k mod T and, among that node's trainers, the (k / T mod n)-th.
  const std::vector<int> trainers = trainer_workers(correspondence);
  if (trainers.empty()) throw invalid("p2p baseline: no trainer worker to send from");
  std::map<int, std::vector<int>> trainers_by_node;
  for (int w : trainers) trainers_by_node[topology.node_of_worker[static_cast<std::size_t>(w)]].push_back(w);
  std::vector<const std::vector<int>*> trainer_nodes;
  for (const auto& [node, list] : trainers_by_node) trainer_nodes.push_back(&list);
  std::vector<int> source(workers, -1);  // per rollout worker, its engine's source
  for (std::size_t k = 0; k < engines.size(); ++k) {
    const std::vector<int>& on_node = *trainer_nodes[k % trainer_nodes.size()];
    const int engine_source = on_node[(k / trainer_nodes.size()) % on_node.size()];
    for (std::size_t w = 0; w < workers; ++w)
      if (correspondence.sides[w] == Side::kRollout && options.engine_of_worker[w] == engines[k]) source[w] = engine_source;
  }
  const auto source_of_worker = [&](int worker) { return source[static_cast<std::size_t>(worker)]; };

  const std::int64_t model = model_bytes(correspondence);
  TrafficSchedule schedule = empty_schedule("p2p", {"gather", "write"}, round_count(model, options), options.pipeline_depth);
  std::vector<std::int64_t> sent(workers, 0);
  std::vector<std::int64_t> written(workers, 0);  // per rollout worker, from its engine's source
  std::map<std::pair<int, int>, std::int64_t> gather;
  std::vector<int> sources;
  std::vector<std::size_t> seen_in(workers, correspondence.atoms.size());  // last atom a worker was counted for
  for (std::size_t a = 0; a < correspondence.atoms.size(); ++a) {
    const Atom& atom = correspondence.atoms[a];
    const std::int64_t bytes = atom_bytes(correspondence, atom);
    sources.clear();
    for (const AtomEndpoint& needer : atom.needers) {  // a worker needing the atom at two places gets it once
      if (seen_in[static_cast<std::size_t>(needer.worker)] == a) continue;
      seen_in[static_cast<std::size_t>(needer.worker)] = a;
      written[static_cast<std::size_t>(needer.worker)] += bytes;
      sources.push_back(source_of_worker(needer.worker));
    }
    std::sort(sources.begin(), sources.end());
    sources.erase(std::unique(sources.begin(), sources.end()), sources.end());
    for (int source : sources) {
      const int from = gather_source(atom, source, sent, bytes);
      if (from != source) gather[{from, source}] += bytes;
    }
  }
  std::map<std::pair<int, int>, std::int64_t> write;
  for (std::size_t w = 0; w < workers; ++w)
    if (written[w] > 0) write[{source_of_worker(static_cast<int>(w)), static_cast<int>(w)}] = written[w];
  spread(gather, 0, options.message_bytes, schedule);
  spread(write, 1, options.message_bytes, schedule);
  return schedule;
}

}  // namespace wb

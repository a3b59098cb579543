// wb-bench: WeightBridge next to the paper's two baselines, measured in one job on one layout.
//
//   mpirun -np N wb-bench (--model NAME [--scale tiny] | --preset NAME | --checkpoint FILE --model NAME)
//          --trainer SPEC --rollout SPEC [--gpus-per-node G] [--modes sync,async] [--methods ...]
//          [--reps 5] [--warmup 1] [--json FILE] [--csv FILE]
//
// Every method moves the same versions of the same checkpoint between the same emulated workers: the
// trainers load version v through their own load_weights, the method runs, and every rollout worker
// checks its parameters against its own load_weights of v, bit for bit. Methods run interleaved
// (A B C A B C ...) after a warm-up, so that a slow patch of a shared machine hits all of them alike.
// Rank 0 prints per method the median and spread of EWTT and AGST, the bytes per update that crossed
// between machines and within one, T_min for the link rates given (--node-gbps), and each method's ratio
// to WeightBridge; --json and --csv write the same. Exit 0 only when every update of every method verified.
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "baselines/baselines.hpp"
#include "core/checks.hpp"
#include "core/log.hpp"
#include "core/settings.hpp"
#include "emu/backend.hpp"
#include "emu/deployment_options.hpp"
#include "emu/mpi_main.hpp"
#include "emu/run_options.hpp"
#include "emu/run_setup.hpp"
#include "emu/trace_file.hpp"
#include "emu/versioned_checkpoint.hpp"
#include "emu/worker_parameters.hpp"
#include "transport/transport.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/job_clock.hpp"
#include "weightbridge/plan.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

struct Options : RunOptions {
  std::string modes = "sync";
  std::string methods = "weightbridge,broadcast,p2p";
  int reps = 5;
  int warmup = 1;
  std::int64_t bucket_mib = 512;
  std::string csv;
};

// What wb-bench's options shared with wb-replay mean here.
const RunOptionDocs kRunOptionDocs = {
    "Checkpoint file or directory; without it the weights are generated in memory.",
    "Where the emulated workers keep their parameters: host, or cuda (the GPU of index local rank modulo the visible devices). The baselines move host memory only: with cuda, --methods weightbridge.",
    "Write every rank's timeline as Chrome trace-event JSON (rank 0; open it in Perfetto): WeightBridge's per-round pack, write, credit wait, forward and assemble spans, and every method's update interval per rank."};

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');)
    if (!item.empty()) out.push_back(item);
  return out;
}

using Mode = SyncMode;

bool parse_options(int argc, char** argv, Options& o, int rank) {
  po::options_description general = run_options_description("wb-bench options", o, kRunOptionDocs);
  general.add_options()
      ("modes", po::value(&o.modes)->default_value(o.modes), "WeightBridge modes to run, comma-separated: sync, sender-staged, receiver-staged, async.")
      ("methods", po::value(&o.methods)->default_value(o.methods), "Methods, comma-separated: weightbridge, broadcast, p2p.")
      ("reps", po::value(&o.reps)->default_value(o.reps), "Measured updates per method.")
      ("warmup", po::value(&o.warmup)->default_value(o.warmup), "Unmeasured updates per method first.")
      ("bucket-mib", po::value(&o.bucket_mib)->default_value(o.bucket_mib), "Baselines: whole tensors per gather and broadcast step, MiB.")
      ("csv", po::value(&o.csv), "Write one line per method as CSV (rank 0).");
  if (!parse_run_options(argc, argv, general, o, rank == 0)) return false;
  if (o.reps < 1 || o.warmup < 0) throw Error(ErrorCode::kInvalidArgument, "--reps must be at least 1 and --warmup not negative");
  if (o.bucket_mib < 1 || o.bucket_mib > 1024) throw Error(ErrorCode::kInvalidArgument, "--bucket-mib must be in 1..1024");
  return true;
}

/// A method of the run: a WeightBridge mode, or a baseline.
struct Method {
  std::string name;  // "weightbridge-sync", "broadcast", "p2p"
  int mode = -1;     // index into the adapters, -1 for a baseline
};

/// One rank's record of one update; begin < 0 when the rank did not stall for it.
struct Sample {
  double begin = -1, end = -1;
  std::int64_t between = 0, within = 0;
  std::int64_t ok = 1;
};

std::int64_t traffic_total(const std::vector<LinkTraffic>& links, const std::vector<std::string>& machines, int rank,
                           bool between) {
  std::int64_t total = 0;
  for (const LinkTraffic& link : links)
    if ((machines[static_cast<std::size_t>(rank)] != machines[static_cast<std::size_t>(link.peer)]) == between) total += link.bytes;
  return total;
}

// Every rank's `text` on world rank 0 (empty elsewhere).
std::vector<std::string> gather_strings(const std::string& text) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  const int bytes = static_cast<int>(text.size());
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  WB_CHECK_MPI(MPI_Gather(&bytes, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  int total = 0;
  for (int r = 0; r < world; ++r) {
    displs[static_cast<std::size_t>(r)] = total;
    total += counts[static_cast<std::size_t>(r)];
  }
  std::string all(rank == 0 ? static_cast<std::size_t>(total) : 0, '\0');
  WB_CHECK_MPI(MPI_Gatherv(text.data(), bytes, MPI_CHAR, all.data(), counts.data(), displs.data(), MPI_CHAR, 0, MPI_COMM_WORLD));
  std::vector<std::string> out;
  if (rank == 0)
    for (int r = 0; r < world; ++r)
      out.push_back(all.substr(static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]), static_cast<std::size_t>(counts[static_cast<std::size_t>(r)])));
  return out;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n == 0 ? 0 : n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

int run(int argc, char** argv) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options o;
  if (!parse_options(argc, argv, o, rank)) return 0;
  std::vector<Mode> modes;
  for (const std::string& m : split_list(o.modes)) modes.push_back(parse_sync_mode(m, "--modes"));
  std::vector<Method> methods;
  for (const std::string& m : split_list(o.methods)) {
    if (m == "weightbridge")
      for (std::size_t k = 0; k < modes.size(); ++k) methods.push_back({"weightbridge-" + modes[k].name, static_cast<int>(k)});
    else if (m == "broadcast" || m == "p2p")
      methods.push_back({m, -1});
    else
      throw Error(ErrorCode::kInvalidArgument, "--methods: '" + m + "' is not weightbridge, broadcast or p2p");
  }
  if (methods.empty()) throw Error(ErrorCode::kInvalidArgument, "--methods names nothing to run");
  const ParameterPlace place = parse_parameter_place(o.device);
  if (place == ParameterPlace::kCuda && std::any_of(methods.begin(), methods.end(), [](const Method& m) { return m.mode < 0; }))
    throw Error(ErrorCode::kInvalidArgument, "--device cuda: the baselines (broadcast, p2p) move host memory only; run --methods weightbridge");
  log_effective_settings();

  RunSetup setup = make_run_setup(o);
  const Deployment& deployment = setup.deployment;
  if (world != deployment.world_size())
    throw Error(ErrorCode::kInvalidArgument, "the layouts need " + std::to_string(deployment.world_size()) + " ranks but mpirun started " +
                                                 std::to_string(world));
  check_nodes_within_machines(deployment);
  const bool trainer = deployment.is_trainer(rank);
  const int engine = trainer ? -1 : (rank - deployment.trainer.world_size()) / deployment.rollout.tp;
  std::unique_ptr<EmulatedWorker> worker = make_worker(setup.model, deployment, rank);
  const WorkerParameters params(worker->parameter_infos(), place, default_cuda_device());
  params.load(*worker, *setup.checkpoint);
  const LoadWeightsFn load = params.loader(*worker);
  MPI_Comm group = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + engine, rank, &group));
  const JobClock clock(MPI_COMM_WORLD);
  std::vector<std::string> machines(static_cast<std::size_t>(world));
  {
    constexpr int kIdBytes = 256;
    char id[kIdBytes] = {};
    std::strncpy(id, machine_id().c_str(), kIdBytes - 1);
    std::vector<char> ids(static_cast<std::size_t>(world) * kIdBytes);
    WB_CHECK_MPI(MPI_Allgather(id, kIdBytes, MPI_CHAR, ids.data(), kIdBytes, MPI_CHAR, MPI_COMM_WORLD));
    for (int r = 0; r < world; ++r) machines[static_cast<std::size_t>(r)] = &ids[static_cast<std::size_t>(r) * kIdBytes];
  }

  // WeightBridge: one adapter per mode, all connected up front (the rollouts poll until they are).
  const bool wants_weightbridge = std::any_of(methods.begin(), methods.end(), [](const Method& m) { return m.mode >= 0; });
  std::vector<std::unique_ptr<SenderAdapter>> senders;
  std::vector<std::unique_ptr<ReceiverAdapter>> receivers;
  TransferSummary summary;
  if (wants_weightbridge)
    for (const Mode& mode : modes) {
      AdapterOptions adapter;
      adapter.sender_staging = mode.sender_staging;
      adapter.receiver_staging = mode.receiver_staging;
      adapter.node = deployment.node_of(rank);
      if (!o.trace.empty()) adapter.trace = true;
      if (trainer) {
        senders.push_back(std::make_unique<SenderAdapter>(MPI_COMM_WORLD, group, params.parameters(), setup.checkpoint->tensors(),
                                                          load, adapter));
        senders.back()->connect();
        summary = senders.back()->summary();
      } else {
        receivers.push_back(std::make_unique<ReceiverAdapter>(MPI_COMM_WORLD, group, params.parameters(), load, adapter));
        for (;;) {
          const PollResult r = receivers.back()->poll_requests();
          if (r.event == PollResult::Event::kFailed) throw Error(r.status);
          if (r.event == PollResult::Event::kConnected) break;
          std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
        summary = receivers.back()->summary();
      }
    }
  const bool wants_baselines = std::any_of(methods.begin(), methods.end(), [](const Method& m) { return m.mode < 0; });
  std::unique_ptr<bench::Baselines> baselines;
  if (wants_baselines) {
    bench::BaselineOptions baseline_options;
    baseline_options.bucket_bytes = o.bucket_mib << 20;
    baselines = std::make_unique<bench::Baselines>(MPI_COMM_WORLD, trainer, setup.checkpoint->tensors(), params.parameters(),
                                                   load, clock, baseline_options);
  }
  VersionReference reference(*worker, *setup.checkpoint);

  // The interleaved schedule: warm-up rounds, then measured ones, each method once per round.
  std::uint64_t version = 0;
  std::map<std::string, std::vector<std::vector<Sample>>> measured;  // method -> per update, per rank (rank 0)
  std::string first_failure;
  nlohmann::json timeline_stalls = nlohmann::json::array();  // --trace: every method's update interval here
  for (int round = 0; round < o.warmup + o.reps; ++round) {
    for (const Method& method : methods) {
      ++version;
      // The training step: the trainers' parameters become this version.
      if (trainer) params.load(*worker, VersionedCheckpoint(*setup.checkpoint, version));
      Sample sample;
      if (method.mode >= 0) {
        const auto k = static_cast<std::size_t>(method.mode);
        std::vector<LinkTraffic> before;
        WB_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
        if (trainer) {
          before = senders[k]->stats().traffic;
          Status status = senders[k]->send_weights(version);
          if (status) status = senders[k]->wait();
          if (!status) throw Error(status);
        } else {
          before = receivers[k]->stats().traffic;
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(600);
          while (receivers[k]->installed_version() < version) {
            const PollResult r = receivers[k]->poll_requests();
            if (r.event == PollResult::Event::kFailed) throw Error(r.status);
            if (std::chrono::steady_clock::now() > deadline)
              throw Error(ErrorCode::kTimeout, "rollout rank " + std::to_string(rank) + ": version " + std::to_string(version) +
                                                   " not installed within 600 s");
          }
        }
        const AdapterStats stats = trainer ? senders[k]->stats() : receivers[k]->stats();
        for (const StallInterval& stall : stats.stalls)
          if (stall.version == version) {
            sample.begin = stall.begin_seconds;
            sample.end = stall.end_seconds;
          }
        sample.between = traffic_total(stats.traffic, machines, rank, true) - traffic_total(before, machines, rank, true);
        sample.within = traffic_total(stats.traffic, machines, rank, false) - traffic_total(before, machines, rank, false);
      } else {
        const bench::BaselineUpdate u = method.name == "broadcast" ? baselines->broadcast() : baselines->p2p();
        sample.begin = u.begin;
        sample.end = u.end;
        sample.between = u.between_machines;
        sample.within = u.within_machine;
      }
      timeline_stalls.push_back({version, sample.begin, sample.end, method.name});
      if (!trainer) {
        const std::string difference = reference.difference(params.read(), version);
        if (!difference.empty()) {
          sample.ok = 0;
          if (first_failure.empty())
            first_failure = method.name + " version " + std::to_string(version) + " on " + worker->describe() + ": " + difference;
          WB_LOG(kError) << first_failure;
        }
      }
      // Rank 0 collects every rank's sample.
      const double mine[6] = {sample.begin, sample.end, static_cast<double>(sample.between), static_cast<double>(sample.within),
                              static_cast<double>(sample.ok), 0};
      std::vector<double> all(rank == 0 ? static_cast<std::size_t>(world) * 6 : 0);
      WB_CHECK_MPI(MPI_Gather(mine, 6, MPI_DOUBLE, all.data(), 6, MPI_DOUBLE, 0, MPI_COMM_WORLD));
      if (rank == 0 && round >= o.warmup) {
        std::vector<Sample> samples;
        for (int r = 0; r < world; ++r) {
          const double* a = &all[static_cast<std::size_t>(r) * 6];
          samples.push_back({a[0], a[1], static_cast<std::int64_t>(a[2]), static_cast<std::int64_t>(a[3]), static_cast<std::int64_t>(a[4])});
        }
        for (std::size_t r = 0; r < samples.size(); ++r)
          WB_LOG(kDebug) << method.name << " version " << version << " rank " << r << ": stall " << samples[r].begin << " .. "
                         << samples[r].end << " s";
        measured[method.name].push_back(std::move(samples));
      }
    }
  }
  for (auto& sender : senders) (void)sender->shutdown();
  for (auto& receiver : receivers)
    while (!receiver->closed()) {
      const PollResult r = receiver->poll_requests();
      if (r.event == PollResult::Event::kFailed) break;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }

  if (!o.trace.empty()) {
    nlohmann::json spans = nlohmann::json::array();
    for (const auto& sender : senders)
      for (const nlohmann::json& s : timeline_json(sender->stats())) spans.push_back(s);
    for (const auto& receiver : receivers)
      for (const nlohmann::json& s : timeline_json(receiver->stats())) spans.push_back(s);
    const std::vector<std::string> reports =
        gather_strings(nlohmann::json{{"who", worker->describe()}, {"trace", spans}, {"stalls", timeline_stalls}}.dump());
    if (rank == 0) {
      std::vector<RankTimeline> timelines;
      for (int r = 0; r < world; ++r) {
        const nlohmann::json report = nlohmann::json::parse(reports[static_cast<std::size_t>(r)]);
        timelines.push_back(timeline_from_json(r, report.at("who").get<std::string>(), report));
      }
      write_chrome_trace(o.trace, timelines);
      WB_LOG(kInfo) << "trace of " << world << " ranks written to " << o.trace;
    }
  }

  // Any rank's failure fails the run.
  int ok = first_failure.empty() ? 1 : 0, all_ok = 0;
  WB_CHECK_MPI(MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD));
  if (rank != 0) return all_ok ? 0 : 1;

  // Per method: EWTT = last end - first begin; AGST = total stall / workers; bytes per update.
  nlohmann::json rows = nlohmann::json::array();
  const std::string reference_method = wants_weightbridge ? methods.front().name : "";
  double reference_ewtt = 0, reference_agst = 0;
  std::vector<std::string> csv_lines;
  std::printf("%-26s %10s %18s %10s %16s %16s %8s %8s\n", "method", "EWTT [s]", "EWTT min..max", "AGST [s]", "between hosts [B]",
              "within host [B]", "EWTT/WB", "AGST/WB");
  for (const Method& method : methods) {
    std::vector<double> ewtt, agst;
    std::int64_t between = 0, within = 0, verified = 1;
    for (const std::vector<Sample>& update : measured[method.name]) {
      double first = 1e300, last = -1e300, stall = 0;
      std::int64_t b = 0, w = 0;
      for (const Sample& s : update) {
        if (s.begin >= 0) {
          first = std::min(first, s.begin);
          last = std::max(last, s.end);
          stall += s.end - s.begin;
        }
        b += s.between;
        w += s.within;
        verified = std::min(verified, s.ok);
      }
      ewtt.push_back(last - first);
      agst.push_back(stall / world);
      between = b;
      within = w;
    }
    const double e = median(ewtt), a = median(agst);
    if (method.name == reference_method) {
      reference_ewtt = e;
      reference_agst = a;
    }
    const double e_ratio = reference_ewtt > 0 ? e / reference_ewtt : 0, a_ratio = reference_agst > 0 ? a / reference_agst : 0;
    char spread[64];
    std::snprintf(spread, sizeof spread, "%.3f..%.3f", *std::min_element(ewtt.begin(), ewtt.end()),
                  *std::max_element(ewtt.begin(), ewtt.end()));
    std::printf("%-26s %10.3f %18s %10.3f %16lld %16lld %8.2f %8.2f\n", method.name.c_str(), e, spread, a,
                static_cast<long long>(between), static_cast<long long>(within), e_ratio, a_ratio);
    rows.push_back({{"method", method.name}, {"ewtt_s", ewtt}, {"agst_s", agst}, {"ewtt_median_s", e}, {"agst_median_s", a},
                    {"ewtt_min_s", *std::min_element(ewtt.begin(), ewtt.end())}, {"ewtt_max_s", *std::max_element(ewtt.begin(), ewtt.end())},
                    {"between_machines_bytes", between}, {"within_machine_bytes", within}, {"verified", verified == 1},
                    {"ewtt_over_weightbridge", e_ratio}, {"agst_over_weightbridge", a_ratio},
                    {"ewtt_over_t_min", summary.t_min_seconds > 0 ? e / summary.t_min_seconds : 0}});
    std::ostringstream line;
    line << method.name << ',' << e << ',' << a << ',' << between << ',' << within << ',' << e_ratio << ',' << a_ratio << ','
         << summary.t_min_seconds << ',' << (verified == 1 ? 1 : 0);
    csv_lines.push_back(line.str());
  }
  std::set<std::string> hosts(machines.begin(), machines.end());
  std::printf("wb-bench: %s, %d ranks on %zu machines, M = %lld bytes, T_min %.3f s at %.3g GB/s per node, %d measured updates per "
              "method, %s\n",
              setup.model.name.c_str(), world, hosts.size(), static_cast<long long>(summary.model_bytes), summary.t_min_seconds,
              network_from_settings().node_bandwidth / 1e9, o.reps, all_ok ? "all verified" : "NOT VERIFIED");
  nlohmann::json result = {{"verified", all_ok == 1},
                           {"model", setup.model.name},
                           {"trainer", deployment.trainer.to_string()},
                           {"rollout", deployment.rollout.to_string()},
                           {"ranks", world},
                           {"machines", hosts.size()},
                           {"rollout_engines", deployment.rollout.engines},
                           {"model_bytes", summary.model_bytes},
                           {"max_node_need_bytes", summary.max_node_need_bytes},
                           {"t_min_s", summary.t_min_seconds},
                           {"simulated_ewtt_s", summary.simulated_seconds},
                           {"node_gbps", network_from_settings().node_bandwidth / 1e9},
                           {"reps", o.reps},
                           {"reference", reference_method},
                           {"methods", rows}};
  if (!first_failure.empty()) result["failure"] = first_failure;
  std::cout << result.dump() << std::endl;
  if (!o.json.empty()) {
    std::ofstream out(o.json);
    out << result.dump(2) << '\n';
    if (!out) throw Error(ErrorCode::kSystem, "cannot write " + o.json);
  }
  if (!o.csv.empty()) {
    std::ofstream out(o.csv);
    out << "method,ewtt_median_s,agst_median_s,between_machines_bytes,within_machine_bytes,ewtt_over_weightbridge,"
           "agst_over_weightbridge,t_min_s,verified\n";
    for (const std::string& line : csv_lines) out << line << '\n';
    if (!out) throw Error(ErrorCode::kSystem, "cannot write " + o.csv);
  }
  return all_ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  return run_mpi_program("wb-bench", argc, argv, [](int n, char** args, Ending&) { return run(n, args); });
}

// bench_connect: how long connect takes as the tensor count grows, through the real adapters.
//
// Every rank builds its emulated worker, as wb-replay does (trainers first, then the rollout workers of each
// engine), and connects: the trainers' SenderAdapter::connect, the rollouts' poll_requests until connected
// (probe load_weights, all-gather the source maps, plan on world rank 0, scatter the round schedules,
// staging, transports). Then the trainers shut down. Nothing is sent: this measures connect alone.
//
// Printed (rank 0, JSON on stdout, also to --json FILE): the tensor count, the parameters of the largest
// worker, connect_seconds as the adapters report it (world rank 0, from its start to the final handshake)
// and the slowest rank's wall time around its connect. Run it at two sizes to see how connect grows with
// the tensor count, e.g. 50 and 500 layers of the tiny Qwen3-30B-A3B (about 10,000 and 100,000 tensors):
//
//   mpirun --oversubscribe -np 6 bench_connect --layers 500
//   options: --preset, --model, --scale, --layers, --hidden, --experts, --expert-width, --vocab, --trainer,
//            --rollout, --gpus-per-node as wb-replay takes them; --json FILE
// Default deployment: qwen3-30b-a3b tiny, trainer tp=2,pp=2, one rollout engine of tp=2 (6 ranks).
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/checks.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/worker_parameters.hpp"
#include "emu/models/model.hpp"
#include "emu/models/presets.hpp"
#include "emu/options/deployment_options.hpp"
#include "weightbridge/adapter.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

using Clock = std::chrono::steady_clock;

struct Options {
  DeploymentOptions deployment;
  std::string json;
  po::variables_map variables;
};

// Returns false when --help was asked for.
bool parse_options(int argc, char** argv, Options& o, int rank) {
  o.deployment.scale = "tiny";
  o.deployment.gpus_per_node = 2;
  po::options_description general("bench_connect options");
  general.add_options()("help,h", "Show this help.");
  add_deployment_options(general, o.deployment);
  general.add_options()("json", po::value(&o.json), "Also write the result as JSON to this file (rank 0).");
  if (!parse_command_line(argc, argv, general, o.variables, rank == 0)) return false;
  if (o.deployment.preset.empty()) {
    if (o.deployment.model.empty()) o.deployment.model = "qwen3-30b-a3b";
    if (o.deployment.trainer.empty()) o.deployment.trainer = "tp=2,pp=2";
    if (o.deployment.rollout.empty()) o.deployment.rollout = "engines=1,tp=2";
  }
  return true;
}

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

int run(int argc, char** argv) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options o;
  if (!parse_options(argc, argv, o, rank)) return 0;
  const PresetInstance instance = resolve_deployment(o.deployment, o.variables);
  const Deployment& d = instance.deployment;
  if (world != d.world_size())
    throw Error(ErrorCode::kInvalidArgument, "the layouts need " + std::to_string(d.world_size()) + " ranks but mpirun started " +
                                                 std::to_string(world));
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  const bool trainer = d.is_trainer(rank);
  const int engine = trainer ? -1 : (rank - d.trainer.world_size()) / d.rollout.tp;
  const std::unique_ptr<EmulatedWorker> worker = make_worker(instance.model, d, rank);
  const WorkerParameters params(worker->parameter_infos(), ParameterPlace::kHost);
  MPI_Comm group = MPI_COMM_NULL;
  WB_CHECK_MPI(MPI_Comm_split(MPI_COMM_WORLD, trainer ? 0 : 1 + engine, rank, &group));

  WB_CHECK_MPI(MPI_Barrier(MPI_COMM_WORLD));
  const auto start = Clock::now();
  double wall = 0;
  TransferSummary summary;
  if (trainer) {
    SenderAdapter sender(MPI_COMM_WORLD, group, params.parameters(), tensors, params.loader(*worker));
    sender.connect();
    wall = seconds_since(start);
    summary = sender.summary();
    throw_if_error(sender.shutdown());
  } else {
    ReceiverAdapter receiver(MPI_COMM_WORLD, group, params.parameters(), params.loader(*worker));
    for (bool connected = false;;) {
      const PollResult result = receiver.poll_requests();
      if (result.event == PollResult::Event::kFailed || result.event == PollResult::Event::kAborted)
        throw Error(result.status);
      if (result.event == PollResult::Event::kConnected && !connected) {
        connected = true;
        wall = seconds_since(start);
        summary = receiver.summary();
      }
      if (result.event == PollResult::Event::kShutdown) break;
    }
  }
  WB_CHECK_MPI(MPI_Comm_free(&group));

  double wall_max = 0;
  WB_CHECK_MPI(MPI_Reduce(&wall, &wall_max, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));
  const auto mine = static_cast<long long>(worker->parameter_infos().size());
  long long parameters_max = 0;
  WB_CHECK_MPI(MPI_Reduce(&mine, &parameters_max, 1, MPI_LONG_LONG, MPI_MAX, 0, MPI_COMM_WORLD));
  if (rank == 0) {
    const nlohmann::json out = {{"model", instance.model.name},
                                {"ranks", world},
                                {"tensors", tensors.size()},
                                {"parameters_max", parameters_max},
                                {"connect_seconds", summary.connect_seconds},
                                {"connect_wall_seconds_max", wall_max},
                                {"seconds_per_100k_tensors", summary.connect_seconds * 1e5 / static_cast<double>(tensors.size())}};
    std::printf("%s\n", out.dump().c_str());
    if (!o.json.empty()) std::ofstream(o.json) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  WB_CHECK_MPI(MPI_Init(&argc, &argv));
  int code = 1;
  try {
    code = run(argc, argv);
  } catch (const std::exception& error) {
    std::fprintf(stderr, "bench_connect: %s\n", error.what());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  WB_CHECK_MPI(MPI_Finalize());
  return code;
}

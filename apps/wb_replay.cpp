// wb-replay: every MPI rank builds its emulated worker (trainers first, then rollout engines), loads
// its parameters from a checkpoint through the worker's own load_weights, and verifies them against the
// checkpoint file read directly. Rank 0 checks that the trainers together, and every rollout engine,
// hold every checkpoint element. Exit 0 only when every rank verified.
//
//   mpirun -np N wb-replay --checkpoint FILE --model NAME_OR_CONFIG [--scale tiny] --trainer SPEC --rollout SPEC
//   mpirun -np N wb-replay --preset qwen3-30b-a3b --scale tiny [--checkpoint FILE]
#include <mpi.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <iostream>
#include <nlohmann/json.hpp>

#include "emu/backend.hpp"
#include "emu/deployment_options.hpp"
#include "emu/presets.hpp"
#include "emu/synthetic.hpp"
#include "emu/verify.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/correspondence.hpp"
#include "weightbridge/probe.hpp"
#include "weightbridge/log.hpp"
#include "weightbridge/settings.hpp"

namespace po = boost::program_options;
using namespace wb;
using namespace wb::emu;

namespace {

struct Options {
  std::string checkpoint;
  DeploymentOptions deployment;
  std::uint64_t seed = 0;
  std::string json;
  po::variables_map variables;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Returns false when --help was asked for.
bool parse_options(int argc, char** argv, Options& options, int rank) {
  po::options_description general("wb-replay options");
  general.add_options()("help,h", "Show this help.")
      ("checkpoint", po::value(&options.checkpoint), "Checkpoint file: .h5/.hdf5, .safetensors, a model.safetensors.index.json or a directory. Without it a synthetic checkpoint of --model is generated in memory.");
  add_deployment_options(general, options.deployment);
  general.add_options()
      ("seed", po::value(&options.seed), "Seed of the synthetic checkpoint when no --checkpoint is given.")
      ("json", po::value(&options.json), "Write the result as JSON to this file (rank 0).");
  po::variables_map variables;
  if (!parse_command_line(argc, argv, general, variables, rank == 0)) return false;
  options.variables = std::move(variables);
  return true;
}

struct Setup {
  ModelConfig model;
  Deployment deployment;
  std::unique_ptr<CheckpointReader> checkpoint;
};

Setup make_setup(const Options& options) {
  Setup setup;
  PresetInstance instance = resolve_deployment(options.deployment, options.variables);
  setup.model = std::move(instance.model);
  setup.deployment = instance.deployment;
  const std::vector<TensorInfo> expected = model_tensors(setup.model);
  if (options.checkpoint.empty()) {
    setup.checkpoint = std::make_unique<SyntheticCheckpoint>(expected, options.seed);
  } else {
    setup.checkpoint = open_checkpoint(options.checkpoint);
    // The layouts are built from the model config: the file must hold exactly that model.
    const std::vector<TensorInfo>& actual = setup.checkpoint->tensors();
    for (const TensorInfo& info : expected) {
      const TensorInfo* found = setup.checkpoint->find(info.name);
      if (found == nullptr)
        throw Error(ErrorCode::kInvalidArgument, options.checkpoint + " has no tensor " + info.name + " that " +
                                                     setup.model.name + " needs (wrong --model or --scale?)");
      if (found->shape != info.shape || found->dtype != info.dtype)
        throw Error(ErrorCode::kInvalidArgument,
                    options.checkpoint + ": tensor " + info.name + " is " + std::string(dtype_name(found->dtype)) +
                        shape_to_string(found->shape) + " but " + setup.model.name + " has " +
                        std::string(dtype_name(info.dtype)) + shape_to_string(info.shape));
    }
    if (actual.size() != expected.size())
      throw Error(ErrorCode::kInvalidArgument, options.checkpoint + " has " + std::to_string(actual.size()) +
                                                   " tensors, " + setup.model.name + " has " +
                                                   std::to_string(expected.size()));
  }
  return setup;
}

// Flattened (tensor index, offset..., extent...) records of the boxes a worker holds, for rank 0.
std::vector<std::int64_t> encode_boxes(const std::vector<CheckpointPiece>& pieces, const CheckpointReader& checkpoint) {
  std::map<std::string_view, std::int64_t> index;
  const auto& tensors = checkpoint.tensors();
  for (std::size_t t = 0; t < tensors.size(); ++t) index[tensors[t].name] = static_cast<std::int64_t>(t);
  std::vector<std::int64_t> out;
  for (const CheckpointPiece& piece : pieces) {
    out.push_back(index.at(piece.tensor));
    out.push_back(piece.box.ndim());
    out.insert(out.end(), piece.box.offset.begin(), piece.box.offset.end());
    out.insert(out.end(), piece.box.extent.begin(), piece.box.extent.end());
  }
  return out;
}

int run(int argc, char** argv) {
  int rank = 0, world = 0;
  WB_CHECK_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  Options options;
  if (!parse_options(argc, argv, options, rank)) return 0;
  log_effective_settings();

  const auto start = std::chrono::steady_clock::now();
  Setup setup = make_setup(options);
  const Deployment& deployment = setup.deployment;
  if (world != deployment.world_size())
    throw Error(ErrorCode::kInvalidArgument,
                "the layouts need " + std::to_string(deployment.world_size()) + " ranks (" +
                    std::to_string(deployment.trainer.world_size()) + " trainer + " +
                    std::to_string(deployment.rollout.world_size()) + " rollout) but mpirun started " +
                    std::to_string(world));

  const bool trainer = deployment.is_trainer(rank);
  std::unique_ptr<EmulatedWorker> worker =
      trainer ? make_trainer_worker(setup.model, deployment.trainer, rank)
              : make_rollout_worker(setup.model, deployment.rollout, rank - deployment.trainer.world_size());
  HostParameters params(worker->parameter_infos());
  const auto load_start = std::chrono::steady_clock::now();
  worker->load_weights(*setup.checkpoint, params.parameters());
  const double load_seconds = seconds_since(load_start);
  const WorkerVerification verification = verify_worker(*worker, params.parameters(), *setup.checkpoint);
  for (const std::string& failure : verification.failures) WB_LOG(kError) << failure;
  WB_LOG(kInfo) << worker->describe() << ": " << params.total_bytes() << " parameter bytes, " << verification.pieces
                << " pieces verified in " << load_seconds << " s load";

  // Coverage: rank 0 gathers every worker's boxes. Group 0 = trainers, group 1 + e = rollout engine e.
  const std::vector<std::int64_t> boxes = encode_boxes(worker->export_weights(params.parameters()), *setup.checkpoint);
  const int count = static_cast<int>(boxes.size());
  std::vector<int> counts(static_cast<std::size_t>(world)), displs(static_cast<std::size_t>(world));
  WB_CHECK_MPI(MPI_Gather(&count, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, MPI_COMM_WORLD));
  std::vector<std::int64_t> all;
  if (rank == 0) {
    int total = 0;
    for (int r = 0; r < world; ++r) {
      displs[static_cast<std::size_t>(r)] = total;
      total += counts[static_cast<std::size_t>(r)];
    }
    all.resize(static_cast<std::size_t>(total));
  }
  WB_CHECK_MPI(MPI_Gatherv(boxes.data(), count, MPI_INT64_T, all.data(), counts.data(), displs.data(), MPI_INT64_T, 0,
                           MPI_COMM_WORLD));

  struct Totals {
    std::int64_t failed_ranks, bytes, pieces, unsourced;
  } mine{verification.ok() ? 0 : 1, static_cast<std::int64_t>(verification.bytes_compared),
         static_cast<std::int64_t>(verification.pieces), static_cast<std::int64_t>(verification.unsourced_bytes)},
      sum{};
  WB_CHECK_MPI(MPI_Reduce(&mine, &sum, 4, MPI_INT64_T, MPI_SUM, 0, MPI_COMM_WORLD));
  double max_load = 0;
  WB_CHECK_MPI(MPI_Reduce(&load_seconds, &max_load, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));

  // Correspondence extraction, as connect will do it: probe this worker's load_weights (the parameters
  // are restored afterwards), all-gather the source maps, build the correspondence on rank 0.
  ProbeReport probe;
  const SourceMap source_map = probe_source_map(
      setup.checkpoint->tensors(), params.parameters(),
      [&](const CheckpointReader& checkpoint, const ParameterSet& p) { worker->load_weights(checkpoint, p); }, {},
      &probe);
  std::vector<SourceMap> maps = allgather_source_maps(source_map, MPI_COMM_WORLD);
  const double probe_numbers[3] = {probe.seconds, static_cast<double>(probe.scratch_bytes + probe.sparse_bytes),
                                   static_cast<double>(probe.copies)};
  double probe_max[3] = {0, 0, 0};
  WB_CHECK_MPI(MPI_Reduce(probe_numbers, probe_max, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD));

  int exit_code = verification.ok() ? 0 : 1;
  if (rank == 0) {
    const auto& tensors = setup.checkpoint->tensors();
    const int groups = 1 + deployment.rollout.engines;
    std::vector<std::vector<std::vector<Box>>> group_boxes(static_cast<std::size_t>(groups),
                                                           std::vector<std::vector<Box>>(tensors.size()));
    for (int r = 0; r < world; ++r) {
      const int group = deployment.is_trainer(r) ? 0 : 1 + (r - deployment.trainer.world_size()) / deployment.rollout.tp;
      std::size_t at = static_cast<std::size_t>(displs[static_cast<std::size_t>(r)]);
      const std::size_t end = at + static_cast<std::size_t>(counts[static_cast<std::size_t>(r)]);
      while (at < end) {
        const auto tensor = static_cast<std::size_t>(all[at]);
        const auto ndim = static_cast<std::size_t>(all[at + 1]);
        Box box{Shape(all.begin() + static_cast<std::ptrdiff_t>(at + 2), all.begin() + static_cast<std::ptrdiff_t>(at + 2 + ndim)),
                Shape(all.begin() + static_cast<std::ptrdiff_t>(at + 2 + ndim), all.begin() + static_cast<std::ptrdiff_t>(at + 2 + 2 * ndim))};
        group_boxes[static_cast<std::size_t>(group)][tensor].push_back(std::move(box));
        at += 2 + 2 * ndim;
      }
    }
    std::vector<std::string> gaps;
    for (int g = 0; g < groups; ++g) {
      const std::string name = g == 0 ? "the trainers" : "rollout engine " + std::to_string(g - 1);
      for (std::string& gap : coverage_gaps(tensors, group_boxes[static_cast<std::size_t>(g)], name)) gaps.push_back(std::move(gap));
    }
    for (std::size_t i = 0; i < gaps.size() && i < 10; ++i) std::cerr << "wb-replay: " << gaps[i] << '\n';
    std::vector<Side> sides;
    std::size_t map_bytes = 0, copies = 0;
    for (int r = 0; r < world; ++r) {
      sides.push_back(deployment.is_trainer(r) ? Side::kTrainer : Side::kRollout);
      map_bytes += serialize_source_map(maps[static_cast<std::size_t>(r)]).size();
      copies += maps[static_cast<std::size_t>(r)].copies.size();
    }
    const auto correspondence_start = std::chrono::steady_clock::now();
    const Correspondence correspondence = build_correspondence(tensors, std::move(maps), sides);
    const double correspondence_seconds = seconds_since(correspondence_start);
    const bool verified = sum.failed_ranks == 0 && gaps.empty();
    exit_code = verified ? 0 : 1;
    nlohmann::json result = {
        {"verified", verified},
        {"model", setup.model.name},
        {"checkpoint", setup.checkpoint->source()},
        {"trainer", deployment.trainer.to_string()},
        {"rollout", deployment.rollout.to_string()},
        {"ranks", world},
        {"failed_ranks", sum.failed_ranks},
        {"coverage_gaps", gaps.size()},
        {"model_bytes", setup.checkpoint->total_bytes()},
        {"bytes_verified", sum.bytes},
        {"pieces", sum.pieces},
        {"padding_bytes", sum.unsourced},
        {"load_seconds_max", max_load},
        {"probe", {{"seconds_max", probe_max[0]},
                   {"extra_bytes_max", probe_max[1]},
                   {"copies_max", probe_max[2]},
                   {"copies_total", copies},
                   {"source_map_bytes_total", map_bytes},
                   {"atoms", correspondence.atoms.size()},
                   {"needed_elements", correspondence.needed_elements()},
                   {"correspondence_seconds", correspondence_seconds}}},
        {"seconds", seconds_since(start)},
    };
    std::cout << result.dump() << std::endl;
    if (!options.json.empty()) {
      std::ofstream out(options.json);
      out << result.dump(2) << '\n';
      if (!out) throw Error(ErrorCode::kSystem, "cannot write " + options.json);
    }
  }
  WB_CHECK_MPI(MPI_Bcast(&exit_code, 1, MPI_INT, 0, MPI_COMM_WORLD));
  return exit_code;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  // Failing MPI calls return to the check macros, which name the call and the rank.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int exit_code = 1;
  try {
    exit_code = run(argc, argv);
  } catch (const std::exception& error) {
    // One clear line, then take the whole job down: a rank that gave up must not leave others waiting.
    std::fprintf(stderr, "wb-replay: %s\n", error.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Finalize();
  return exit_code;
}

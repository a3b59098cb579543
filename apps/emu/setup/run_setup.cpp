#include "emu/setup/run_setup.hpp"

#include <mpi.h>

#include <cstring>
#include <map>
#include <vector>

#include "core/checks.hpp"
#include "core/log.hpp"
#include "emu/check/checkpoint_check.hpp"
#include "emu/checkpoints/fp8_checkpoint.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "transport/transport.hpp"

namespace wb::emu {
namespace {

constexpr std::string_view kVersionField = "{version}";

std::string engine_file(std::string path, std::uint64_t version) {
  if (const std::size_t at = path.find(kVersionField); at != std::string::npos)
    path.replace(at, kVersionField.size(), std::to_string(version));
  return path;
}

}  // namespace

RunSetup make_run_setup(const DeploymentOptions& options, const boost::program_options::variables_map& variables,
                        const std::string& checkpoint_path, std::uint64_t seed,
                        const std::string& engine_checkpoint_path) {
  RunSetup setup;
  PresetInstance instance = resolve_deployment(options, variables);
  setup.model = std::move(instance.model);
  setup.deployment = instance.deployment;
  if (setup.deployment.rollout.fp8()) {
    setup.engine_form = engine_form(setup.model, setup.deployment.rollout);
    setup.engine_checkpoint_path = engine_checkpoint_path;
    if (!engine_checkpoint_path.empty())
      setup.engine_checkpoint = open_engine_checkpoint(engine_file(engine_checkpoint_path, 0), *setup.engine_form);
  } else if (!engine_checkpoint_path.empty()) {
    throw Error(ErrorCode::kInvalidArgument, "--engine-checkpoint is for FP8 engines: add fp8=BLOCK to --rollout");
  }
  const std::vector<TensorInfo> expected = model_tensors(setup.model);
  if (checkpoint_path.empty()) {
    setup.checkpoint = std::make_unique<SyntheticCheckpoint>(expected, seed);
    return setup;
  }
  setup.checkpoint = open_checkpoint(checkpoint_path);
  // The layouts are built from the model config: the file must hold that model's tensors, each in the
  // model's dtype and shape; what else it holds (a multi-token-prediction layer, say) no worker loads,
  // and the restricted reader hides it from the probe, the planner and the coverage checks.
  setup.unused_tensors = check_checkpoint_holds(expected, setup.model.name, *setup.checkpoint);
  if (!setup.unused_tensors.empty() && process_rank() <= 0) {
    WB_LOG(kWarn) << "checkpoint " << setup.checkpoint->source() << " holds " << setup.unused_tensors.size()
                  << " tensor(s) that " << setup.model.name << " does not use; no worker loads them: "
                  << compact_names(setup.unused_tensors);
  }
  setup.checkpoint = restrict_checkpoint(std::move(setup.checkpoint), expected);
  return setup;
}

void check_nodes_within_machines(const Deployment& deployment) {
  int world = 0;
  WB_CHECK_MPI(MPI_Comm_size(MPI_COMM_WORLD, &world));
  constexpr int kIdBytes = 256;
  char mine[kIdBytes] = {};
  std::strncpy(mine, machine_id().c_str(), kIdBytes - 1);
  std::vector<char> all(static_cast<std::size_t>(world) * kIdBytes);
  WB_CHECK_MPI(MPI_Allgather(mine, kIdBytes, MPI_CHAR, all.data(), kIdBytes, MPI_CHAR, MPI_COMM_WORLD));
  std::map<int, int> first_rank_of_node;
  for (int r = 0; r < world; ++r) {
    const auto [it, fresh] = first_rank_of_node.emplace(deployment.node_of(r), r);
    const std::string a(&all[static_cast<std::size_t>(it->second) * kIdBytes]), b(&all[static_cast<std::size_t>(r) * kIdBytes]);
    if (!fresh && a != b)
      throw Error(ErrorCode::kInvalidArgument,
                  "ranks " + std::to_string(it->second) + " and " + std::to_string(r) + " are one node of --gpus-per-node " +
                      std::to_string(deployment.gpus_per_node) + " but run on different machines (" + a.substr(0, a.find(':')) +
                      ", " + b.substr(0, b.find(':')) + "): give --gpus-per-node the number of ranks per machine");
  }
}

EngineVersion::EngineVersion(const RunSetup& setup, std::uint64_t version, bool fp8_form)
    : version_(*setup.checkpoint, version) {
  reader_ = &version_;
  if (!setup.engine_form || !fp8_form) return;
  if (version == 0 && setup.engine_checkpoint) {
    reader_ = setup.engine_checkpoint.get();
    return;
  }
  if (setup.engine_checkpoint_path.find(kVersionField) != std::string::npos)
    form_ = open_engine_checkpoint(engine_file(setup.engine_checkpoint_path, version), *setup.engine_form);
  else
    form_ = layout::open_fp8_form(version_, *setup.engine_form);
  reader_ = form_.get();
}

std::unique_ptr<CheckpointReader> open_engine_checkpoint(const std::string& path, const layout::Fp8Form& form) {
  const layout::QuantizationConfig config = read_quantization_config(path);
  if (config != form.config)
    throw Error(ErrorCode::kInvalidArgument, config_path_beside(path) + ": its quantization_config (" +
                                                 quantization_config_json(config).dump() + ") is not the engine's (" +
                                                 quantization_config_json(form.config).dump() + ")");
  std::unique_ptr<CheckpointReader> file = open_checkpoint(path);
  (void)check_checkpoint_holds(form.tensors, "the FP8 form", *file);
  return restrict_checkpoint(std::move(file), form.tensors);
}

VersionReference::VersionReference(const EmulatedWorker& worker, const RunSetup& setup)
    : worker_(worker), setup_(setup), expected_(worker.parameter_infos()) {
  worker_.load_weights(EngineVersion(setup_, 0, worker_.loads_fp8_form()).reader(), expected_.parameters());
}

const ParameterSet& VersionReference::at(std::uint64_t version) {
  if (version != version_) {
    for (const Parameter& p : expected_.parameters()) std::memset(p.view.data, 0, p.view.nbytes());
    worker_.load_weights(EngineVersion(setup_, version, worker_.loads_fp8_form()).reader(), expected_.parameters());
    version_ = version;
  }
  return expected_.parameters();
}

std::string VersionReference::difference(const ParameterSet& params, std::uint64_t version) {
  return first_difference(params, at(version));
}

}  // namespace wb::emu

#include "emu/run_setup.hpp"

#include <mpi.h>

#include <cstring>
#include <map>
#include <vector>

#include "emu/synthetic.hpp"
#include "emu/verify.hpp"
#include "emu/versioned_checkpoint.hpp"
#include "weightbridge/checks.hpp"
#include "weightbridge/transport.hpp"

namespace wb::emu {

RunSetup make_run_setup(const DeploymentOptions& options, const boost::program_options::variables_map& variables,
                        const std::string& checkpoint_path, std::uint64_t seed) {
  RunSetup setup;
  PresetInstance instance = resolve_deployment(options, variables);
  setup.model = std::move(instance.model);
  setup.deployment = instance.deployment;
  const std::vector<TensorInfo> expected = model_tensors(setup.model);
  if (checkpoint_path.empty()) {
    setup.checkpoint = std::make_unique<SyntheticCheckpoint>(expected, seed);
    return setup;
  }
  setup.checkpoint = open_checkpoint(checkpoint_path);
  // The layouts are built from the model config: the file must hold exactly that model.
  const std::vector<TensorInfo>& actual = setup.checkpoint->tensors();
  for (const TensorInfo& info : expected) {
    const TensorInfo* found = setup.checkpoint->find(info.name);
    if (found == nullptr)
      throw Error(ErrorCode::kInvalidArgument, checkpoint_path + " has no tensor " + info.name + " that " + setup.model.name +
                                                   " needs (wrong --model or --scale?)");
    if (found->shape != info.shape || found->dtype != info.dtype)
      throw Error(ErrorCode::kInvalidArgument,
                  checkpoint_path + ": tensor " + info.name + " is " + std::string(dtype_name(found->dtype)) +
                      shape_to_string(found->shape) + " but " + setup.model.name + " has " +
                      std::string(dtype_name(info.dtype)) + shape_to_string(info.shape));
  }
  if (actual.size() != expected.size())
    throw Error(ErrorCode::kInvalidArgument, checkpoint_path + " has " + std::to_string(actual.size()) + " tensors, " +
                                                 setup.model.name + " has " + std::to_string(expected.size()));
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

VersionReference::VersionReference(const EmulatedWorker& worker, const CheckpointReader& checkpoint)
    : worker_(worker), checkpoint_(checkpoint), expected_(worker.parameter_infos()) {
  worker_.load_weights(checkpoint_, expected_.parameters());
}

const ParameterSet& VersionReference::at(std::uint64_t version) {
  if (version != version_) {
    for (const Parameter& p : expected_.parameters()) std::memset(p.view.data, 0, p.view.nbytes());
    worker_.load_weights(VersionedCheckpoint(checkpoint_, version), expected_.parameters());
    version_ = version;
  }
  return expected_.parameters();
}

std::string VersionReference::difference(const ParameterSet& params, std::uint64_t version) {
  return first_difference(params, at(version));
}

}  // namespace wb::emu

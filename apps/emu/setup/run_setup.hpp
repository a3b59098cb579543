// What wb-replay and wb-bench set up alike: the model, the deployment and the checkpoint from the command
// line, the check that every node of the deployment sits on one machine, and a rollout's reference for a
// version (its own load_weights of that version, never the transferred bytes).
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "emu/models/presets.hpp"
#include "emu/options/deployment_options.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

struct RunSetup {
  ModelConfig model;
  Deployment deployment;
  std::unique_ptr<CheckpointReader> checkpoint;  // lists exactly the model's tensors
  std::vector<std::string> unused_tensors;       // in the file, not in the model
};

/// The deployment the options name and its checkpoint: the file `checkpoint_path` (which must hold every
/// tensor of the model, with its shape and dtype; tensors the model does not use are named in one
/// warning, on world rank 0, and hidden) or, when empty, a synthetic one from `seed`.
RunSetup make_run_setup(const DeploymentOptions& options, const boost::program_options::variables_map& variables,
                        const std::string& checkpoint_path, std::uint64_t seed);

/// Collective over MPI_COMM_WORLD: refuses a node of --gpus-per-node ranks that spans two machines (the
/// planner takes a node's workers to share fast links); several nodes on one machine are fine.
void check_nodes_within_machines(const Deployment& deployment);

/// A worker's own load_weights of a version of the checkpoint, for comparing what a transfer installed.
class VersionReference {
 public:
  VersionReference(const EmulatedWorker& worker, const CheckpointReader& checkpoint);
  /// The parameters `worker` holds at `version` (loaded on first use of each version).
  const ParameterSet& at(std::uint64_t version);
  /// "" when `params` hold exactly `version`, else what differs first.
  std::string difference(const ParameterSet& params, std::uint64_t version);

 private:
  const EmulatedWorker& worker_;
  const CheckpointReader& checkpoint_;
  HostParameters expected_;
  std::uint64_t version_ = 0;
};

}  // namespace wb::emu

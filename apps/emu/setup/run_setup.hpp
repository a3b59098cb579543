// What wb-replay and wb-bench set up alike: the model, the deployment and the checkpoint from the command
// line, the check that every node of the deployment sits on one machine, and a rollout's reference for a
// version (its own load_weights of that version, never the transferred bytes).
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/backend.hpp"
#include "layout/fp8_form.hpp"
#include "emu/models/presets.hpp"
#include "emu/options/deployment_options.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

struct RunSetup {
  ModelConfig model;
  Deployment deployment;
  std::unique_ptr<CheckpointReader> checkpoint;  // lists exactly the model's tensors
  std::vector<std::string> unused_tensors;       // in the file, not in the model
  /// FP8 engines (rollout spec fp8=...): the form they load, derived from the model's tensors; and, when
  /// given (--engine-checkpoint), version 0 of that form as a file (wb-mkckpt --fp8), which they load it from.
  std::optional<layout::Fp8Form> engine_form;
  std::unique_ptr<CheckpointReader> engine_checkpoint;
  /// The path given; with "{version}" in it, the file of each version (wb-mkckpt --fp8 --version K).
  std::string engine_checkpoint_path;
  /// The tensors engine `engine` loads: the model's, or the FP8 form's (a mixed fleet has both).
  const std::vector<TensorInfo>& engine_tensors(int engine) const {
    return deployment.rollout.fp8_engine(engine) ? engine_form->tensors : checkpoint->tensors();
  }
};

/// Version `version` of the setup's checkpoint as a worker loads it: the checkpoint's (trainers, BF16
/// engines), or its FP8 form's (`fp8_form`: a worker of an FP8 engine, EmulatedWorker::loads_fp8_form): from
/// the --engine-checkpoint file of that version when it names one ("{version}" in its path; version 0 only
/// otherwise), else computed from the checkpoint's version. `setup` must outlive it.
class EngineVersion {
 public:
  EngineVersion(const RunSetup& setup, std::uint64_t version, bool fp8_form);
  const CheckpointReader& reader() const { return *reader_; }

 private:
  VersionedCheckpoint version_;
  std::unique_ptr<CheckpointReader> form_;  // computed, or opened from a file
  const CheckpointReader* reader_;
};

/// Opens the FP8 checkpoint an FP8 engine loads version 0 from: it must hold the form's tensors (dtype and
/// shape) and its config.json the form's quantization_config; throws kInvalidArgument naming what differs.
std::unique_ptr<CheckpointReader> open_engine_checkpoint(const std::string& path, const layout::Fp8Form& form);

/// The deployment the options name and its checkpoint: the file `checkpoint_path` (which must hold every
/// tensor of the model, with its shape and dtype; tensors the model does not use are named in one
/// warning, on world rank 0, and hidden) or, when empty, a synthetic one from `seed`.
RunSetup make_run_setup(const DeploymentOptions& options, const boost::program_options::variables_map& variables,
                        const std::string& checkpoint_path, std::uint64_t seed,
                        const std::string& engine_checkpoint_path = {});

/// Collective over MPI_COMM_WORLD: refuses a node of --gpus-per-node ranks that spans two machines (the
/// planner takes a node's workers to share fast links); several nodes on one machine are fine.
void check_nodes_within_machines(const Deployment& deployment);

/// A worker's own load_weights of a version of the checkpoint, for comparing what a transfer installed.
class VersionReference {
 public:
  VersionReference(const EmulatedWorker& worker, const RunSetup& setup);
  /// The parameters `worker` holds at `version` (loaded on first use of each version).
  const ParameterSet& at(std::uint64_t version);
  /// "" when `params` hold exactly `version`, else what differs first.
  std::string difference(const ParameterSet& params, std::uint64_t version);

 private:
  const EmulatedWorker& worker_;
  const RunSetup& setup_;
  HostParameters expected_;
  std::uint64_t version_ = 0;
};

}  // namespace wb::emu

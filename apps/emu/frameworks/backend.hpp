// Emulated backends: stand-ins for a Megatron-style trainer and SGLang-style rollout engines.
//
// Each worker of an emulated layout declares its own parameters (its own names, shapes, dtypes) and a
// load_weights that fills them from a checkpoint the way the real engine does. The library only ever
// calls load_weights. export_weights is the inverse, written separately (as the engine's converter back to
// Hugging Face format would be): tests gather all workers through it and must get the checkpoint back.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "emu/frameworks/layout_spec.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/tensor.hpp"

namespace wb::emu {

/// A piece of a worker's parameters that equals box `box` of checkpoint tensor `tensor`: `view` points
/// into the parameters and has the box's extent as its shape (strided or permuted as the layout is).
struct CheckpointPiece {
  std::string tensor;
  Box box;
  TensorView view;
};

enum class WorkerRole { kTrainer, kRollout };

class EmulatedWorker {
 public:
  virtual ~EmulatedWorker() = default;

  WorkerRole role() const { return role_; }
  /// Whether load_weights takes the FP8 form of the checkpoint (a worker of an FP8 engine).
  bool loads_fp8_form() const { return loads_fp8_form_; }
  /// "trainer tp 1/4 pp 0/2 cp 0/1 dp 0/2 ep 1/8" or "rollout engine 1/2 tp 3/8 ep 3/8".
  virtual std::string describe() const = 0;

  /// The parameters this worker holds, in its own naming, shapes and dtypes.
  const std::vector<TensorInfo>& parameter_infos() const { return parameters_; }

  /// Fills `params` (allocated for parameter_infos(), zeroed) from `checkpoint`, as the engine does.
  /// Elements no checkpoint element reaches (vocabulary padding) are left as they are.
  virtual void load_weights(const CheckpointReader& checkpoint, const ParameterSet& params) const = 0;

  /// The inverse of load_weights: every piece of `params` that came from the checkpoint, named in
  /// checkpoint terms. Padding is not reported.
  virtual std::vector<CheckpointPiece> export_weights(const ParameterSet& params) const = 0;

 protected:
  EmulatedWorker(WorkerRole role, const ModelConfig& model) : role_(role), model_(model) {}
  WorkerRole role_;
  bool loads_fp8_form_ = false;  // set by the constructor of an FP8 engine's worker
  ModelConfig model_;
  std::vector<TensorInfo> parameters_;  // filled by the constructor of each backend
};

/// The trainer worker at trainer rank `rank` (0 <= rank < spec.world_size()).
std::unique_ptr<EmulatedWorker> make_trainer_worker(const ModelConfig& model, const TrainerSpec& spec, int rank);
/// The rollout worker at rank `rank` among all rollout workers (engine = rank / spec.tp).
std::unique_ptr<EmulatedWorker> make_rollout_worker(const ModelConfig& model, const RolloutSpec& spec, int rank);
/// The worker at world rank `world_rank` of `deployment`: the trainers first, then the rollout workers.
std::unique_ptr<EmulatedWorker> make_worker(const ModelConfig& model, const Deployment& deployment, int world_rank);

/// Host storage for a worker's parameters: one zeroed, 64-byte aligned allocation per parameter.
class HostParameters {
 public:
  explicit HostParameters(const std::vector<TensorInfo>& infos);
  const ParameterSet& parameters() const { return set_; }
  std::size_t total_bytes() const { return set_.total_bytes(); }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::vector<std::unique_ptr<std::byte[], Free>> storage_;
  ParameterSet set_;
};

}  // namespace wb::emu

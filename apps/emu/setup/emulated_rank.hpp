// One MPI rank's part of an emulated deployment, set up as the executor's and planner's MPI tests set it
// up: the tiny variant of a shipped model with a given number of layers, the deployment that trainer and
// rollout specs name, and this rank's emulated worker (trainers first, then the rollout workers).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/layout_spec.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

struct EmulatedRank {
  ModelConfig model;
  Deployment deployment;
  std::vector<TensorInfo> tensors;         // the model's checkpoint tensors
  std::unique_ptr<EmulatedWorker> worker;  // this rank's
};

struct EmulatedLayout {
  std::string model;    // a shipped model config ("qwen3-30b-a3b")
  int layers = 2;       // of its tiny variant
  std::string trainer;  // "tp=2,ep=2"
  std::string rollout;  // "engines=2,tp=2"
  int gpus_per_node = 8;
};

/// Throws kInvalidArgument, before any worker is made, when the layout needs another number of ranks than
/// `world_size` ("run with N ranks").
EmulatedRank emulated_rank(const EmulatedLayout& layout, int rank, int world_size);

}  // namespace wb::emu

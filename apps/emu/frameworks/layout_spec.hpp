// Layout specs: the short strings that describe an emulated trainer or rollout layout, and deployments
// (a trainer, a rollout, GPUs per node) with their rank placement.
//
//   trainer  "tp=4,pp=2,ep=8,cp=1,dp=2[,etp=1][,pp_last=N]"
//            world size tp*cp*dp*pp. Megatron rank order inside a stage: tp fastest, then cp, then dp;
//            experts: ep fastest over the same ranks (expert-TP 1), expert-DP = tp*cp*dp/ep.
//            pp_last: layers of the last stage (the others split the rest evenly); default even split.
//   rollout  "engines=2,tp=8[,ep=8][,dp_attn=1][,transpose=experts]"
//            engines*tp workers; ep divides tp (expert TP = tp/ep); dp_attn splits attention into
//            dp_attn replicas of tp/dp_attn ranks (DP attention); transpose=experts stores expert weights
//            [in, out] as an inference kernel that wants them so would.
//            fp8=128x128: an FP8 engine (emu/frameworks/fp8_engine.hpp) loading the FP8 form of the checkpoint
//            in blocks of that shape; fp8_rule=plain|per-block-cast|ue8m0 (default per-block-cast).
//            bf16_engines=N (with fp8): a mixed fleet, the first N engines load the BF16 checkpoint, the
//            others its FP8 form, all of the same tp/ep, fed by the trainers in one plan.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "weightbridge/correspondence.hpp"

namespace wb::emu {

struct TrainerSpec {
  int tp = 1, pp = 1, cp = 1, dp = 1, ep = 1, etp = 1;
  int pp_last = 0;  // 0: even split

  static TrainerSpec parse(std::string_view text);  // throws wb::Error naming the bad key
  std::string to_string() const;
  int world_size() const { return tp * pp * cp * dp; }
  int ranks_per_stage() const { return tp * cp * dp; }
  /// First layer and layer count of each pipeline stage; throws when the layers do not split.
  std::vector<std::pair<std::int64_t, std::int64_t>> stage_layers(std::int64_t num_layers) const;
};

struct RolloutSpec {
  int engines = 1, tp = 1, ep = 1, dp_attn = 1;
  bool transpose_experts = false;
  std::int64_t fp8_block_rows = 0, fp8_block_cols = 0;  // 0: a BF16 engine
  std::string fp8_rule = "per-block-cast";
  int bf16_engines = 0;  // with fp8: the first bf16_engines engines are BF16 (a mixed fleet)

  /// Whether any engine loads the FP8 form.
  bool fp8() const { return fp8_block_rows > 0; }
  bool mixed() const { return bf16_engines > 0; }
  /// Whether engine `engine` (0-based) loads the FP8 form.
  bool fp8_engine(int engine) const { return fp8() && engine >= bf16_engines; }
  /// The spec of engine `engine` alone: fp8 cleared for a BF16 engine of a mixed fleet, bf16_engines 0.
  RolloutSpec of_engine(int engine) const;
  static RolloutSpec parse(std::string_view text);
  std::string to_string() const;
  int world_size() const { return engines * tp; }
};

/// Trainers first, then rollout workers engine by engine; logical nodes of gpus_per_node ranks.
struct Deployment {
  TrainerSpec trainer;
  RolloutSpec rollout;
  int gpus_per_node = 8;

  int world_size() const { return trainer.world_size() + rollout.world_size(); }
  bool is_trainer(int world_rank) const { return world_rank < trainer.world_size(); }
  int node_of(int world_rank) const { return world_rank / gpus_per_node; }
  /// The side of every world rank, as the planner takes them.
  std::vector<Side> sides() const;
  /// Whether `world_rank` is a worker of an FP8 engine (it loads the FP8 form, not the checkpoint).
  bool loads_fp8(int world_rank) const {
    return !is_trainer(world_rank) && rollout.fp8_engine((world_rank - trainer.world_size()) / rollout.tp);
  }
  /// The worker as the library names it in its messages: "trainer 1 (world rank 1)", "engine 1 worker 0
  /// (world rank 4)".
  std::string worker_name(int world_rank) const;
};

}  // namespace wb::emu

// The paper's deployments at tiny scale, and odd layouts: every worker's parameters, gathered back
// through the inverse of its layout, reproduce the checkpoint exactly; the trainers together hold every
// checkpoint element, and so does every rollout engine.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "emu/check/checkpoint_check.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/models/presets.hpp"
#include "preset_params.hpp"
#include "weightbridge/correspondence.hpp"

namespace wb::emu {
namespace {

using ::testing::HasSubstr;

// Assembles full checkpoint tensors from the pieces of a group of workers; pieces that overlap must
// agree bitwise.
class Assembly {
 public:
  explicit Assembly(const std::vector<TensorInfo>& tensors) : tensors_(tensors) {
    for (std::size_t t = 0; t < tensors.size(); ++t) {
      index_[tensors[t].name] = t;
      data_.emplace_back(tensors[t].nbytes(), std::byte{0xA5});
    }
    boxes_.resize(tensors.size());
  }

  void add(const std::vector<CheckpointPiece>& pieces, const std::string& who) {
    for (const CheckpointPiece& piece : pieces) {
      auto it = index_.find(piece.tensor);
      ASSERT_NE(it, index_.end()) << who << " exports unknown tensor " << piece.tensor;
      const TensorInfo& info = tensors_[it->second];
      ASSERT_TRUE(piece.box.fits_in(info.shape)) << who << ": " << piece.tensor << piece.box.to_string();
      ASSERT_EQ(piece.view.shape, piece.box.extent) << who << ": " << piece.tensor;
      TensorView full = TensorView::contiguous(data_[it->second].data(), info.dtype, info.shape);
      TensorView target = full.box(piece.box);
      // Where an earlier piece already wrote, the values must agree.
      std::vector<Box>& seen = boxes_[it->second];
      for (const Box& other : seen) {
        Box overlap{Shape(info.shape.size()), Shape(info.shape.size())};
        bool empty = false;
        for (std::size_t a = 0; a < info.shape.size(); ++a) {
          const std::int64_t lo = std::max(other.offset[a], piece.box.offset[a]);
          const std::int64_t hi = std::min(other.offset[a] + other.extent[a], piece.box.offset[a] + piece.box.extent[a]);
          if (hi <= lo) empty = true;
          overlap.offset[a] = lo;
          overlap.extent[a] = std::max<std::int64_t>(0, hi - lo);
        }
        if (empty) continue;
        Box local = overlap;
        for (std::size_t a = 0; a < local.offset.size(); ++a) local.offset[a] -= piece.box.offset[a];
        ASSERT_TRUE(tensors_bitwise_equal(full.box(overlap), piece.view.box(local)))
            << who << " disagrees with an earlier copy of " << piece.tensor << overlap.to_string();
      }
      copy_tensor(target, piece.view);
      seen.push_back(piece.box);
    }
  }

  void expect_equals(const CheckpointReader& checkpoint, const std::string& group) const {
    const auto gaps = coverage_gaps(tensors_, boxes_, group);
    EXPECT_TRUE(gaps.empty()) << gaps.front();
    for (std::size_t t = 0; t < tensors_.size(); ++t) {
      std::vector<std::byte> expected(tensors_[t].nbytes());
      checkpoint.read(tensors_[t].name, expected.data());
      EXPECT_EQ(std::memcmp(expected.data(), data_[t].data(), expected.size()), 0)
          << group << ": " << tensors_[t].name << " differs from the checkpoint";
    }
  }

 private:
  const std::vector<TensorInfo>& tensors_;
  std::map<std::string, std::size_t> index_;
  std::vector<std::vector<std::byte>> data_;
  std::vector<std::vector<Box>> boxes_;
};

void check_deployment(const ModelConfig& model, const Deployment& deployment) {
  const std::vector<TensorInfo> tensors = model_tensors(model);
  SyntheticCheckpoint checkpoint(tensors, 1234);
  SCOPED_TRACE(model.name + " trainer " + deployment.trainer.to_string() + " rollout " + deployment.rollout.to_string());

  Assembly trainers(tensors);
  for (int rank = 0; rank < deployment.trainer.world_size(); ++rank) {
    auto worker = make_trainer_worker(model, deployment.trainer, rank);
    HostParameters params(worker->parameter_infos());
    worker->load_weights(checkpoint, params.parameters());
    const CheckpointCheck checked = check_against_checkpoint(*worker, params.parameters(), checkpoint);
    ASSERT_TRUE(checked.ok()) << checked.failures.front();
    trainers.add(worker->export_weights(params.parameters()), worker->describe());
  }
  trainers.expect_equals(checkpoint, "the trainers");

  const RolloutSpec& rollout = deployment.rollout;
  for (int engine = 0; engine < rollout.engines; ++engine) {
    Assembly engine_assembly(tensors);
    for (int local = 0; local < rollout.tp; ++local) {
      auto worker = make_rollout_worker(model, rollout, engine * rollout.tp + local);
      HostParameters params(worker->parameter_infos());
      worker->load_weights(checkpoint, params.parameters());
      const CheckpointCheck checked = check_against_checkpoint(*worker, params.parameters(), checkpoint);
      ASSERT_TRUE(checked.ok()) << checked.failures.front();
      engine_assembly.add(worker->export_weights(params.parameters()), worker->describe());
    }
    engine_assembly.expect_equals(checkpoint, "rollout engine " + std::to_string(engine));
  }
}

class PresetAtTinyScale : public ::testing::TestWithParam<std::string> {};

TEST_P(PresetAtTinyScale, GatherThroughTheInverseReproducesTheCheckpoint) {
  const PresetInstance instance = instantiate_preset(find_preset(GetParam()), ModelScale::kTiny);
  check_deployment(instance.model, instance.deployment);
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetAtTinyScale, testing_support::preset_names(), testing_support::preset_test_name);

struct OddLayout {
  std::string model;
  std::string trainer;
  std::string rollout;
};

class OddLayoutAtTinyScale : public ::testing::TestWithParam<OddLayout> {};

TEST_P(OddLayoutAtTinyScale, GatherThroughTheInverseReproducesTheCheckpoint) {
  const OddLayout& layout = GetParam();
  ScaleOptions options;
  options.num_layers = 5;
  const ModelConfig model = scale_model(load_named_model_config(layout.model), options);
  Deployment deployment;
  deployment.trainer = TrainerSpec::parse(layout.trainer);
  deployment.rollout = RolloutSpec::parse(layout.rollout);
  check_deployment(model, deployment);
}

INSTANTIATE_TEST_SUITE_P(
    Odd, OddLayoutAtTinyScale,
    ::testing::Values(
        // Everything on one worker on both sides.
        OddLayout{"qwen3-30b-a3b", "tp=1", "engines=1,tp=1"},
        // Uneven pipeline, CP and DP replicas, experts spread over replicas.
        OddLayout{"qwen3-30b-a3b", "tp=2,pp=2,cp=2,dp=2,ep=4,pp_last=2", "engines=3,tp=2,ep=2"},
        // Expert TP on the rollout (tp 8, ep 2 → expert weights split 4 ways) and transposed experts.
        OddLayout{"qwen3-235b-a22b", "tp=4,ep=2", "engines=1,tp=8,ep=2,transpose=experts"},
        // MLA without q_lora, trainer TP over heads, rollout DP attention.
        OddLayout{"moonlight-16b-a3b", "tp=4,pp=5,ep=4", "engines=2,tp=8,ep=8,dp_attn=2"},
        // MLA with q_lora; rollout TP wider than the trainer's.
        OddLayout{"kimi-k2-instruct", "tp=2,dp=2,ep=4", "engines=1,tp=16,ep=16,dp_attn=4,transpose=experts"},
        // Dense model, KV heads replicated on the rollout side.
        OddLayout{"qwen3-32b", "tp=2,pp=5", "engines=2,tp=16"}),
    [](const auto& info) { return "layout" + std::to_string(info.index); });

TEST(Verify, FirstUncoveredBoxFindsGapsExactly) {
  const Shape shape = {8, 6};
  EXPECT_FALSE(first_uncovered_box(shape, {Box{{0, 0}, {8, 6}}}).has_value());
  // Two halves with an overlap cover it.
  EXPECT_FALSE(first_uncovered_box(shape, {Box{{0, 0}, {5, 6}}, Box{{3, 0}, {5, 6}}}).has_value());
  // Rows 0-3 and a partial row block leave [4:8, 3:6] uncovered.
  auto gap = first_uncovered_box(shape, {Box{{0, 0}, {4, 6}}, Box{{4, 0}, {4, 3}}});
  ASSERT_TRUE(gap.has_value());
  EXPECT_EQ(gap->to_string(), "[4:8, 3:6]");
  EXPECT_TRUE(first_uncovered_box(shape, {}).has_value());
  const auto gaps = coverage_gaps({TensorInfo{"w", DType::kBF16, shape}}, {{Box{{0, 0}, {7, 6}}}}, "the trainers");
  ASSERT_EQ(gaps.size(), 1u);
  EXPECT_THAT(gaps[0], HasSubstr("the trainers holds no copy of w[7:8, 0:6]"));
}

}  // namespace
}  // namespace wb::emu

// Described source maps of the emulated backends: applying a worker's described map to a checkpoint
// reproduces its load_weights bit for bit, and the maps of the paper's largest deployment are compact.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>

#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/described_map.hpp"
#include "emu/models/presets.hpp"
#include "preset_params.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

void expect_map_reproduces_load(const EmulatedWorker& worker, const std::vector<TensorInfo>& tensors,
                                const CheckpointReader& checkpoint) {
  const SourceMap map = described_source_map(worker, tensors);
  HostParameters loaded(worker.parameter_infos()), applied(worker.parameter_infos());
  worker.load_weights(checkpoint, loaded.parameters());
  apply_source_map(map, checkpoint, applied.parameters());
  for (std::size_t i = 0; i < loaded.parameters().size(); ++i) {
    const TensorView& a = loaded.parameters()[i].view;
    const TensorView& b = applied.parameters()[i].view;
    ASSERT_EQ(std::memcmp(a.data, b.data, a.nbytes()), 0)
        << worker.describe() << ": parameter " << loaded.parameters()[i].name << " differs";
  }
  // The compact form round-trips exactly.
  EXPECT_EQ(deserialize_source_map(serialize_source_map(map)).copies, map.copies) << worker.describe();
  // Normalizing twice changes nothing.
  EXPECT_EQ(normalize_source_map(map).copies, map.copies) << worker.describe();
}

class DescribedMapOfPreset : public ::testing::TestWithParam<std::string> {};

TEST_P(DescribedMapOfPreset, ApplyingItReproducesLoadWeights) {
  const PresetInstance instance = instantiate_preset(find_preset(GetParam()), ModelScale::kTiny);
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  SyntheticCheckpoint checkpoint(tensors, 99);
  const Deployment& d = instance.deployment;
  // Every trainer and the first rollout engine (engines are identical by construction).
  for (int rank = 0; rank < d.trainer.world_size(); ++rank)
    expect_map_reproduces_load(*make_trainer_worker(instance.model, d.trainer, rank), tensors, checkpoint);
  for (int rank = 0; rank < d.rollout.tp; ++rank)
    expect_map_reproduces_load(*make_rollout_worker(instance.model, d.rollout, rank), tensors, checkpoint);
}

INSTANTIATE_TEST_SUITE_P(Presets, DescribedMapOfPreset, testing_support::preset_names(), testing_support::preset_test_name);

TEST(DescribedMap, TransposedExpertsAreStridedCopies) {
  ScaleOptions options;
  const ModelConfig model = scale_model(load_named_model_config("qwen3-30b-a3b"), options);
  const RolloutSpec spec = RolloutSpec::parse("engines=1,tp=2,ep=2,transpose=experts");
  const auto tensors = model_tensors(model);
  auto worker = make_rollout_worker(model, spec, 0);
  const SourceMap map = described_source_map(*worker, tensors);
  bool saw_transposed = false;
  for (const SliceCopy& copy : map.copies)
    if (copy.strides.size() == 2 && copy.strides[0] == 1 && copy.strides[1] > 1) saw_transposed = true;
  EXPECT_TRUE(saw_transposed);
  expect_map_reproduces_load(*worker, tensors, SyntheticCheckpoint(tensors, 5));
}

// A mixed fleet (rollout bf16_engines=1): engine 0 loads the BF16 checkpoint, engines 1 and 2 its FP8 form.
// Each worker is built for its own engine's form; the deployment is described in the union of both forms
// (layout/form_union.hpp) as connect plans it: the BF16 engine's maps as in an all-BF16 deployment (the
// union begins with the checkpoint's tensors), the FP8 engines' in the union's fp8 weights and scales, the
// trainers' holding both (their parameters and their pack's shadows and scales).
TEST(DescribedMap, AMixedFleetIsDescribedInTheUnionOfBothForms) {
  ScaleOptions options;  // as the FP8 wb-replay tests' model: several 128 x 128 blocks, edge blocks
  options.num_layers = 2;
  options.hidden_size = 576;
  options.num_experts = 8;
  options.moe_intermediate_size = 128;
  options.head_dim = 64;
  const ModelConfig model = scale_model(load_named_model_config("qwen3-30b-a3b"), options);
  const auto tensors = model_tensors(model);
  Deployment mixed{TrainerSpec::parse("tp=2"), RolloutSpec::parse("engines=3,tp=2,ep=2,fp8=128x128,bf16_engines=1"), 2};
  EXPECT_EQ(mixed.rollout.to_string(), "engines=3,tp=2,ep=2,fp8=128x128,fp8_rule=per-block-cast,bf16_engines=1");
  EXPECT_FALSE(mixed.loads_fp8(0));
  EXPECT_FALSE(mixed.loads_fp8(3));  // engine 0
  EXPECT_TRUE(mixed.loads_fp8(4));   // engine 1
  EXPECT_FALSE(make_worker(model, mixed, 3)->loads_fp8_form());
  EXPECT_TRUE(make_worker(model, mixed, 4)->loads_fp8_form());
  EXPECT_EQ(mixed.rollout.of_engine(0).to_string(), "engines=3,tp=2,ep=2");
  EXPECT_EQ(mixed.rollout.of_engine(2).to_string(), "engines=3,tp=2,ep=2,fp8=128x128,fp8_rule=per-block-cast");

  const DescribedDeployment described = describe_deployment(model, mixed, tensors);
  const Deployment bf16{mixed.trainer, RolloutSpec::parse("engines=3,tp=2,ep=2"), 2};
  const DescribedDeployment plain = describe_deployment(model, bf16, tensors);
  ASSERT_GT(described.tensors.size(), tensors.size());
  for (std::size_t t = 0; t < tensors.size(); ++t) EXPECT_EQ(described.tensors[t].name, tensors[t].name);
  EXPECT_EQ(described.maps[2].copies, plain.maps[2].copies);  // the BF16 engine
  EXPECT_EQ(described.maps[3].copies, plain.maps[3].copies);
  for (std::size_t rank = 4; rank < 8; ++rank) {
    bool fp8_weight = false;
    for (const SliceCopy& copy : described.maps[rank].copies) {
      EXPECT_EQ(described.maps[rank].parameters[copy.parameter].dtype, described.tensors[copy.tensor].dtype) << rank;
      fp8_weight = fp8_weight || described.tensors[copy.tensor].dtype == DType::kF8E4M3;
    }
    EXPECT_TRUE(fp8_weight) << "rank " << rank;
  }
  EXPECT_EQ(described.maps[6].copies, described.maps[4].copies);  // engine 2 is engine 1's replica
  // A trainer holds both forms: more copies than its BF16 map, some into fp8 shadows.
  EXPECT_GT(described.maps[0].copies.size(), plain.maps[0].copies.size());

  // Bad specs: bf16_engines without fp8, or leaving no FP8 engine.
  EXPECT_THROW(RolloutSpec::parse("engines=2,tp=2,bf16_engines=1"), Error);
  EXPECT_THROW(RolloutSpec::parse("engines=2,tp=2,fp8=128x128,bf16_engines=2"), Error);
}

// Table 2 (d): 512 workers of Kimi-K2 at full size. The budget: at most 64 bytes per copy and
// 128 MiB for all source maps together.
TEST(DescribedMap, KimiK2DeploymentMapsAreCompact) {
  const auto start = std::chrono::steady_clock::now();
  const PresetInstance instance = instantiate_preset(find_preset("kimi-k2"), ModelScale::kFull);
  const std::vector<TensorInfo> tensors = model_tensors(instance.model);
  const Deployment& d = instance.deployment;
  std::size_t total_bytes = 0, total_copies = 0, max_copies = 0;
  for (int rank = 0; rank < d.world_size(); ++rank) {
    auto worker = make_worker(instance.model, d, rank);
    const SourceMap map = described_source_map(*worker, tensors);
    const std::size_t bytes = serialize_source_map(map).size();
    total_bytes += bytes;
    total_copies += map.copies.size();
    max_copies = std::max(max_copies, map.copies.size());
    ASSERT_LE(bytes, 64 * map.copies.size() + 64 * map.parameters.size() + 16) << worker->describe();
  }
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("kimi-k2 (%d workers): %zu copies (max %zu per worker), %.1f MiB serialized, %.1f bytes/copy, %.1f s\n",
              d.world_size(), total_copies, max_copies, static_cast<double>(total_bytes) / (1 << 20),
              static_cast<double>(total_bytes) / static_cast<double>(total_copies), seconds);
  EXPECT_LT(total_bytes, std::size_t{128} << 20);
}

}  // namespace
}  // namespace wb::emu

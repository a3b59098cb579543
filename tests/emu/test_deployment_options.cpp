// The shared command-line options of wb-replay, wb-plan and wb-bench: --gpus-per-node must be a
// positive count (ranks are mapped to nodes by dividing by it); a preset's FP8 engine layout.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emu/frameworks/described_map.hpp"
#include "emu/options/deployment_options.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

namespace po = boost::program_options;

/// Parses `args` as a program would (without the settings' flags) and resolves the deployment.
PresetInstance resolve(std::vector<std::string> args, DeploymentOptions options = {}) {
  po::options_description description;
  add_deployment_options(description, options);
  args.insert(args.begin(), "prog");
  std::vector<const char*> argv;
  for (const std::string& arg : args) argv.push_back(arg.c_str());
  po::variables_map variables;
  po::store(po::parse_command_line(static_cast<int>(argv.size()), argv.data(), description), variables);
  po::notify(variables);
  return resolve_deployment(options, variables);
}

const std::vector<std::string> kTiny = {"--model", "qwen3-30b-a3b", "--scale", "tiny", "--trainer", "tp=2",
                                        "--rollout", "engines=1,tp=2"};

TEST(DeploymentOptions, GpusPerNodeMustBePositive) {
  std::vector<std::string> args = kTiny;
  args.insert(args.end(), {"--gpus-per-node", "2"});
  EXPECT_EQ(resolve(args).deployment.gpus_per_node, 2);
  EXPECT_EQ(resolve(args).deployment.node_of(3), 1);

  for (const char* bad : {"--gpus-per-node=0", "--gpus-per-node=-3"}) {
    SCOPED_TRACE(bad);
    std::vector<std::string> with = kTiny;
    with.push_back(bad);
    try {
      resolve(with);
      ADD_FAILURE() << "accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.code(), ErrorCode::kInvalidArgument);
      const std::string value = std::string(bad).substr(std::string("--gpus-per-node=").size());
      EXPECT_NE(std::string(error.what()).find("--gpus-per-node must be a positive number of ranks per node, not " + value),
                std::string::npos)
          << error.what();
    }
  }
  // A preset's own count stays unless overridden, and an override is checked too.
  EXPECT_EQ(resolve({"--preset", "moonlight-16b-a3b", "--scale", "tiny"}).deployment.gpus_per_node, 8);
  EXPECT_THROW(resolve({"--preset", "moonlight-16b-a3b", "--scale", "tiny", "--gpus-per-node=0"}), Error);
}

// FP8 engines on the Kimi-K2 preset: its TP 32 engines cut the dense MLP into shards an FP8 loader refuses
// (at tiny scale 96 rows into 3 per rank, in blocks of 2 rows), so its FP8 layout, TP 16 (6 rows), is taken,
// with the block shape and rule asked for, and the line says which, why and what was refused. A block shape
// the preset's own layout tiles, or a preset without an FP8 layout, keeps the layout.
TEST(DeploymentOptions, Fp8EnginesTakeThePresetsFp8LayoutWhereItsOwnIsRefused) {
  DeploymentOptions options;
  options.preset = "kimi-k2";
  options.scale = "tiny";
  options.fp8_engines = "2x2";
  PresetInstance instance = resolve({"--preset", "kimi-k2", "--scale", "tiny", "--fp8-engines", "2x2"}, options);
  ASSERT_EQ(instance.deployment.rollout.tp, 32);
  const std::string line = choose_fp8_rollout(options, instance);
  const RolloutSpec& rollout = instance.deployment.rollout;
  EXPECT_EQ(rollout.to_string(), RolloutSpec::parse("engines=16,tp=16,ep=16,dp_attn=4,fp8=2x2").to_string());
  EXPECT_EQ(rollout.engines * rollout.tp, 256);  // the same GPUs
  for (const char* part : {"kimi-k2 with FP8 engines: rollout engines=16,tp=16,ep=16,dp_attn=4 (", "deployment guide",
                           "), not the preset's engines=8,tp=32,ep=32,dp_attn=8, which FP8 loaders refuse: ",
                           "does not tile rows [0, 3) of", "mlp.gate_proj.weight"})
    EXPECT_NE(line.find(part), std::string::npos) << part << " not in: " << line;
  // What the line says is so: the chosen layout tiles, the refused one does not.
  EXPECT_NO_THROW(describe_rollout_engine(instance.model, rollout, model_tensors(instance.model)));
  RolloutSpec refused = RolloutSpec::parse("engines=8,tp=32,ep=32,dp_attn=8,fp8=2x2");
  EXPECT_THROW(describe_rollout_engine(instance.model, refused, model_tensors(instance.model)), Error);

  options.fp8_engines = "1x1";  // every shard tiles
  instance = resolve({"--preset", "kimi-k2", "--scale", "tiny", "--fp8-engines", "1x1"}, options);
  EXPECT_EQ(choose_fp8_rollout(options, instance), "");
  EXPECT_EQ(instance.deployment.rollout.tp, 32);
  options.fp8_engines = "";  // BF16 engines
  instance = resolve({"--preset", "kimi-k2", "--scale", "tiny"}, options);
  EXPECT_EQ(choose_fp8_rollout(options, instance), "");
  EXPECT_EQ(instance.deployment.rollout.tp, 32);
  options.preset = "qwen3-30b-a3b";  // no FP8 layout of its own: planning refuses or plans the preset's
  options.fp8_engines = "2x2";
  instance = resolve({"--preset", "qwen3-30b-a3b", "--scale", "tiny", "--fp8-engines", "2x2"}, options);
  EXPECT_EQ(choose_fp8_rollout(options, instance), "");
  EXPECT_EQ(instance.deployment.rollout.tp, 8);
}

}  // namespace
}  // namespace wb::emu

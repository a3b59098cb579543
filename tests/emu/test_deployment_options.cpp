// The shared command-line options of wb-replay, wb-plan and wb-bench: --gpus-per-node must be a
// positive count (ranks are mapped to nodes by dividing by it).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "emu/options/deployment_options.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

namespace po = boost::program_options;

/// Parses `args` as a program would (without the settings' flags) and resolves the deployment.
PresetInstance resolve(std::vector<std::string> args) {
  DeploymentOptions options;
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

}  // namespace
}  // namespace wb::emu

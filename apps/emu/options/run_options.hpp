// What wb-replay and wb-bench take alike on their command line: the checkpoint (or the synthetic one's
// seed), the deployment, where the emulated workers keep their parameters, the JSON and trace files rank 0
// writes; and the four synchronization modes by name.
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "emu/options/deployment_options.hpp"
#include "emu/setup/run_setup.hpp"

namespace wb::emu {

struct RunOptions {
  std::string checkpoint;
  std::string engine_checkpoint;  // FP8 engines: version 0 of their form as a file (wb-mkckpt --fp8)
  DeploymentOptions deployment;
  std::uint64_t seed = 0;
  std::string device = "host";
  std::string json;
  std::string trace;
  boost::program_options::variables_map variables;
};

/// The help texts that are each program's own.
struct RunOptionDocs {
  const char* checkpoint;
  const char* device;
  const char* trace;
};

/// The options of a program called `caption` ("wb-replay options"): --help, --checkpoint, the deployment
/// options (add_deployment_options), --device, --seed, --json and --trace, bound to `out`; the program adds
/// its own after them.
boost::program_options::options_description run_options_description(const char* caption, RunOptions& out,
                                                                    const RunOptionDocs& docs);

/// parse_command_line into out.variables, then checks --device. False on --help (printed when `print_help`).
bool parse_run_options(int argc, char** argv, boost::program_options::options_description& options, RunOptions& out,
                       bool print_help);

/// Rank 0's output of a run: `result` as one line of JSON on stdout, and in the files --json (indented) and
/// --trace (every rank's timeline from its report, as Chrome trace-event JSON) name.
void write_run_results(const RunOptions& options, const nlohmann::json& result, const std::vector<nlohmann::json>& reports);

/// make_run_setup of what the options name.
RunSetup make_run_setup(const RunOptions& options);

/// Which sides stage (docs/architecture.md, "Synchronization modes").
struct SyncMode {
  std::string name;
  bool sender_staging = false;
  bool receiver_staging = false;
};
/// sync, sender-staged, receiver-staged or async; throws kInvalidArgument naming `flag` ("--mode").
SyncMode parse_sync_mode(const std::string& text, const std::string& flag);

}  // namespace wb::emu

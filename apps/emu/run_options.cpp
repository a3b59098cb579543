#include "emu/run_options.hpp"

#include "emu/worker_parameters.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;

namespace wb::emu {

po::options_description run_options_description(const char* caption, RunOptions& out, const RunOptionDocs& docs) {
  po::options_description options(caption);
  options.add_options()("help,h", "Show this help.")("checkpoint", po::value(&out.checkpoint), docs.checkpoint);
  add_deployment_options(options, out.deployment);
  options.add_options()
      ("device", po::value(&out.device)->default_value(out.device), docs.device)
      ("seed", po::value(&out.seed), "Seed of the synthetic checkpoint when no --checkpoint is given.")
      ("json", po::value(&out.json), "Write the result as JSON to this file (rank 0).")
      ("trace", po::value(&out.trace), docs.trace);
  return options;
}

bool parse_run_options(int argc, char** argv, po::options_description& options, RunOptions& out, bool print_help) {
  if (!parse_command_line(argc, argv, options, out.variables, print_help)) return false;
  (void)parse_parameter_place(out.device);  // refused before any rank builds a worker
  return true;
}

RunSetup make_run_setup(const RunOptions& options) {
  return make_run_setup(options.deployment, options.variables, options.checkpoint, options.seed);
}

SyncMode parse_sync_mode(const std::string& text, const std::string& flag) {
  if (text == "sync") return {text, false, false};
  if (text == "sender-staged") return {text, true, false};
  if (text == "receiver-staged") return {text, false, true};
  if (text == "async") return {text, true, true};
  throw Error(ErrorCode::kInvalidArgument, flag + ": '" + text + "' is not sync, sender-staged, receiver-staged or async");
}

}  // namespace wb::emu

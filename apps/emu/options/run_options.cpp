#include "emu/options/run_options.hpp"

#include <fstream>
#include <iostream>

#include "core/log.hpp"
#include "emu/frameworks/worker_parameters.hpp"
#include "emu/reports/trace_file.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;

namespace wb::emu {

po::options_description run_options_description(const char* caption, RunOptions& out, const RunOptionDocs& docs) {
  po::options_description options(caption);
  options.add_options()("help,h", "Show this help.")("checkpoint", po::value(&out.checkpoint), docs.checkpoint);
  options.add_options()("engine-checkpoint", po::value(&out.engine_checkpoint),
                        "FP8 engines (--rollout ...,fp8=BLOCK): the FP8 form of --checkpoint as wb-mkckpt --fp8 wrote it, "
                        "with its config.json; the engines load version 0 from it, and later versions from the form "
                        "of the trainers' versions. Without it they load the form computed from --checkpoint.");
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

void write_run_results(const RunOptions& options, const nlohmann::json& result, const std::vector<nlohmann::json>& reports) {
  std::cout << result.dump() << std::endl;
  if (!options.trace.empty()) {
    std::vector<RankTimeline> timelines;
    for (std::size_t r = 0; r < reports.size(); ++r)
      if (!reports[r].is_null())
        timelines.push_back(timeline_from_json(static_cast<int>(r), reports[r].value("who", std::string()), reports[r]));
    write_chrome_trace(options.trace, timelines);
    WB_LOG(kInfo) << "trace of " << timelines.size() << " ranks written to " << options.trace;
  }
  if (!options.json.empty()) {
    std::ofstream out(options.json);
    out << result.dump(2) << '\n';
    if (!out) throw Error(ErrorCode::kSystem, "cannot write " + options.json);
  }
}

RunSetup make_run_setup(const RunOptions& options) {
  return make_run_setup(options.deployment, options.variables, options.checkpoint, options.seed, options.engine_checkpoint);
}

SyncMode parse_sync_mode(const std::string& text, const std::string& flag) {
  if (text == "sync") return {text, false, false};
  if (text == "sender-staged") return {text, true, false};
  if (text == "receiver-staged") return {text, false, true};
  if (text == "async") return {text, true, true};
  throw Error(ErrorCode::kInvalidArgument, flag + ": '" + text + "' is not sync, sender-staged, receiver-staged or async");
}

}  // namespace wb::emu

// Command-line pieces the programs share: choosing a model and a deployment (a preset, or a model with
// trainer and rollout specs), and parsing with the library's settings (--flag and WB_* variables).
#pragma once

#include <boost/program_options.hpp>
#include <cstdint>
#include <string>

#include "emu/models/presets.hpp"

namespace wb::emu {

struct DeploymentOptions {
  std::string preset;
  std::string model;
  std::string scale = "full";
  std::int64_t layers = 0;  // tiny variant only; 0 = its default
  // Tiny variant only, 0 = its default: widen it (e.g. a model large enough to measure a network with).
  std::int64_t hidden = 0;
  std::int64_t experts = 0;
  std::int64_t expert_width = 0;
  std::int64_t vocab = 0;
  std::int64_t head_dim = 0;
  std::string trainer;
  std::string rollout;
  std::string fp8_engines;  // the rollout engines load the FP8 form in blocks of this shape (fp8= of the spec)
  int gpus_per_node = 8;
  bool engines_may_join = false;  // rollout engines=0 allowed: every engine is a job of its own that joins
};

/// Adds --preset, --model, --scale, --layers, --trainer, --rollout and --gpus-per-node, bound to `out`.
void add_deployment_options(boost::program_options::options_description& options, DeploymentOptions& out);

/// The model and deployment the options name. --preset excludes --model/--trainer/--rollout; an explicit
/// --gpus-per-node overrides the preset's. Throws wb::Error naming what is missing or contradictory.
PresetInstance resolve_deployment(const DeploymentOptions& options,
                                  const boost::program_options::variables_map& variables);

/// FP8 engines on a preset whose own engine layout their loaders refuse (a shard that does not tile the
/// blocks, as vLLM refuses it): the preset's FP8 layout (Preset::fp8_rollout) instead, the block shape and
/// rule kept. Returns the one line that says so, naming the refusal; empty when nothing changed (not a
/// preset, BF16 engines, a layout that tiles, or a preset with no FP8 layout: the refusal then comes at
/// planning). Describes one engine's workers (emu/frameworks/described_map.hpp).
std::string choose_fp8_rollout(const DeploymentOptions& options, PresetInstance& instance);

/// Adds the settings' flags to `options`, parses the command line, applies the settings given and
/// returns true; on --help prints the options (when `print_help`) and returns false.
bool parse_command_line(int argc, char** argv, boost::program_options::options_description& options,
                        boost::program_options::variables_map& variables, bool print_help = true);

}  // namespace wb::emu

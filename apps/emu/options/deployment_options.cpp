#include "emu/options/deployment_options.hpp"

#include <iostream>
#include <string>

#include "core/settings.hpp"
#include "emu/frameworks/described_map.hpp"
#include "emu/options/setting_flags.hpp"
#include "layout/fp8_form.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;

namespace wb::emu {

void add_deployment_options(po::options_description& options, DeploymentOptions& out) {
  options.add_options()
      ("preset", po::value(&out.preset), "A deployment of the paper (sets --model, --trainer, --rollout, --gpus-per-node): moonlight-16b-a3b, qwen3-30b-a3b, qwen3-235b-a22b, kimi-k2, qwen3-32b.")
      ("model", po::value(&out.model), "Model config: a shipped name (qwen3-30b-a3b, kimi-k2-instruct, ...) or a config.json path.")
      ("scale", po::value(&out.scale), "full or tiny (the scaled-down variant of the same architecture).")
      ("layers", po::value(&out.layers), "Layer count of the tiny variant (as given to wb-mkckpt).")
      ("hidden", po::value(&out.hidden), "Hidden size of the tiny variant (a multiple of 64).")
      ("experts", po::value(&out.experts), "Routed experts of the tiny variant.")
      ("expert-width", po::value(&out.expert_width), "Expert (MoE intermediate) width of the tiny variant.")
      ("vocab", po::value(&out.vocab), "Vocabulary of the tiny variant.")
      ("head-dim", po::value(&out.head_dim), "Attention head width of the tiny variant (not MLA; default 4).")
      ("trainer", po::value(&out.trainer), "Trainer layout, e.g. tp=4,pp=2,ep=8,cp=1,dp=2[,pp_last=N].")
      ("rollout", po::value(&out.rollout), "Rollout layout, e.g. engines=2,tp=8,ep=8[,dp_attn=D][,transpose=experts][,fp8=128x128[,fp8_rule=plain|per-block-cast|ue8m0][,bf16_engines=N]] (fp8: FP8 engines loading the FP8 form; bf16_engines: a mixed fleet, the first N engines BF16).")
      ("fp8-engines", po::value(&out.fp8_engines), "The rollout engines (a preset's too) load the FP8 form in blocks of this shape, e.g. 128x128: the same as fp8=128x128 in --rollout.")
      ("gpus-per-node", po::value(&out.gpus_per_node), "Workers (ranks) per node.");
}

namespace {

void widen(ScaleOptions& scale, const DeploymentOptions& options) {
  if (options.hidden > 0) scale.hidden_size = options.hidden;
  if (options.experts > 0) scale.num_experts = options.experts;
  if (options.expert_width > 0) scale.moe_intermediate_size = options.expert_width;
  if (options.vocab > 0) scale.vocab_size = options.vocab;
  if (options.head_dim > 0) scale.head_dim = options.head_dim;
}

bool widened(const DeploymentOptions& o) {
  return o.layers > 0 || o.hidden > 0 || o.experts > 0 || o.expert_width > 0 || o.vocab > 0 || o.head_dim > 0;
}

}  // namespace

PresetInstance resolve_deployment(const DeploymentOptions& options, const po::variables_map& variables) {
  const ModelScale scale = parse_model_scale(options.scale);
  if (scale != ModelScale::kTiny && widened(options))
    throw Error(ErrorCode::kInvalidArgument,
                "--layers, --hidden, --experts, --expert-width, --vocab and --head-dim size the tiny variant: add --scale tiny");
  PresetInstance instance;
  if (!options.preset.empty()) {
    if (!options.model.empty() || !options.trainer.empty() || !options.rollout.empty())
      throw Error(ErrorCode::kInvalidArgument, "--preset sets the model and layouts; drop --model/--trainer/--rollout");
    const Preset& preset = find_preset(options.preset);
    instance = instantiate_preset(preset, scale);
    if (scale == ModelScale::kTiny && widened(options)) {
      // The preset's tiny variant, widened: its layer count and expert width stay unless given (the
      // expert width keeps the preset's parallel degrees dividing it).
      ScaleOptions scale_options;
      scale_options.num_layers = options.layers > 0 ? options.layers : instance.model.num_hidden_layers;
      if (instance.model.is_moe()) scale_options.moe_intermediate_size = instance.model.moe_intermediate_size;
      widen(scale_options, options);
      instance.model = scale_model(load_named_model_config(preset.model_config), scale_options);
    }
  } else {
    if (options.model.empty() || options.trainer.empty() || options.rollout.empty())
      throw Error(ErrorCode::kInvalidArgument, "give --preset, or all of --model, --trainer and --rollout");
    instance.model = load_named_model_config(options.model);
    if (scale == ModelScale::kTiny) {
      ScaleOptions scale_options;
      if (options.layers > 0) scale_options.num_layers = options.layers;
      widen(scale_options, options);
      instance.model = scale_model(instance.model, scale_options);
    }
    instance.deployment.trainer = TrainerSpec::parse(options.trainer);
    instance.deployment.rollout = RolloutSpec::parse(options.rollout);
  }
  if (!options.fp8_engines.empty()) {
    if (instance.deployment.rollout.fp8())
      throw Error(ErrorCode::kInvalidArgument, "--fp8-engines and fp8= in --rollout both give the FP8 block shape: give one");
    layout::parse_block_shape(options.fp8_engines, instance.deployment.rollout.fp8_block_rows,
                              instance.deployment.rollout.fp8_block_cols, "--fp8-engines");
  }
  if (instance.deployment.rollout.engines == 0 && !options.engines_may_join)
    throw Error(ErrorCode::kInvalidArgument, "--rollout " + options.rollout +
                                                 ": engines=0 leaves no rollout engine (only a trainer job whose engines "
                                                 "join by address may start with none: wb-replay --join-address)");
  if (options.preset.empty() || (variables.count("gpus-per-node") && !variables["gpus-per-node"].defaulted()))
    instance.deployment.gpus_per_node = options.gpus_per_node;
  // Ranks are mapped to nodes by dividing by it: 0 would divide by zero, a negative count means nothing.
  if (instance.deployment.gpus_per_node <= 0)
    throw Error(ErrorCode::kInvalidArgument, "--gpus-per-node must be a positive number of ranks per node, not " +
                                                 std::to_string(instance.deployment.gpus_per_node));
  return instance;
}

std::string choose_fp8_rollout(const DeploymentOptions& options, PresetInstance& instance) {
  RolloutSpec& rollout = instance.deployment.rollout;
  if (options.preset.empty() || !rollout.fp8()) return "";
  const Preset& preset = find_preset(options.preset);
  if (preset.fp8_rollout.empty()) return "";
  try {
    (void)describe_rollout_engine(instance.model, rollout, model_tensors(instance.model));
    return "";
  } catch (const Error& refusal) {
    if (refusal.code() != ErrorCode::kInvalidArgument) throw;
    RolloutSpec fp8 = RolloutSpec::parse(preset.fp8_rollout);
    fp8.fp8_block_rows = rollout.fp8_block_rows;
    fp8.fp8_block_cols = rollout.fp8_block_cols;
    fp8.fp8_rule = rollout.fp8_rule;
    rollout = fp8;
    return preset.name + " with FP8 engines: rollout " + preset.fp8_rollout + " (" + preset.fp8_rollout_why +
           "), not the preset's " + preset.rollout + ", which FP8 loaders refuse: " + refusal.status().message();
  }
}

bool parse_command_line(int argc, char** argv, po::options_description& options, po::variables_map& variables,
                        bool print_help) {
  po::options_description settings("WeightBridge settings (also WB_* environment variables)");
  add_setting_options(settings);
  options.add(settings);
  po::store(po::parse_command_line(argc, argv, options), variables);
  po::notify(variables);
  if (variables.count("help")) {
    if (print_help) std::cout << options << '\n';
    return false;
  }
  apply_setting_overrides(variables);
  return true;
}

}  // namespace wb::emu

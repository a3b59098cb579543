// wb-mkckpt: writes the deterministic synthetic checkpoint of a model (full size or "tiny"), so tests,
// demos and benchmarks need no download. Prints one line of JSON describing what it wrote. With --fp8 it
// writes the FP8 form an FP8 engine loads instead (fp8 weights, f32 block scales, config.json beside it).
#include <boost/program_options.hpp>

#include <cctype>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <exception>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "emu/checkpoints/fp8_checkpoint.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/checkpoints/versioned_checkpoint.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

constexpr const char* kUsage =
    "usage: wb-mkckpt --model NAME_OR_CONFIG.json [--scale full|tiny] [--layers N] [--experts N]\n"
    "                 [--hidden N] [--vocab N] [--head-dim N] [--expert-width N] [--format hdf5|safetensors]\n"
    "                 [--max-shard-mib N] [--seed S] [--version K] [--max-bytes SIZE]\n"
    "                 [--fp8 BLOCK [--fp8-rule RULE]]\n"
    "                 (--output PATH | --list)\n"
    "\n"
    "Writes the deterministic synthetic checkpoint of a model and prints one line of JSON:\n"
    "{\"model\":..,\"tensors\":..,\"params\":..,\"bytes\":..,\"path\":..,\"seconds\":..}\n"
    "NAME is a shipped config (file stem such as qwen3-30b-a3b, or the model's name); see --help for\n"
    "where they live.\n";

[[noreturn]] void usage_error(const std::string& message) { throw wb::Error(wb::ErrorCode::kInvalidArgument, message); }

// "64GiB", "512M", "1000000": binary units, since these limits are about memory and disks.
std::uint64_t parse_size(const std::string& text, const char* option) {
  std::size_t used = 0;
  unsigned long long value = 0;
  try {
    value = std::stoull(text, &used);
  } catch (const std::exception&) {
    usage_error(std::string("--") + option + ": not a size: \"" + text + "\"");
  }
  std::string unit = text.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (unit.ends_with("ib")) unit.resize(unit.size() - 2);
  else if (unit.ends_with("b")) unit.resize(unit.size() - 1);
  const std::string units = "kmgtp";
  int shift = 0;
  if (unit.size() == 1 && units.find(unit[0]) != std::string::npos)
    shift = 10 * (static_cast<int>(units.find(unit[0])) + 1);
  else if (!unit.empty())
    usage_error(std::string("--") + option + ": unknown unit in \"" + text + "\" (use K, M, G, T, P or KiB..PiB)");
  if (shift > 0 && value > (~0ULL >> shift)) usage_error(std::string("--") + option + ": \"" + text + "\" is too large");
  return static_cast<std::uint64_t>(value) << shift;
}

std::string human_bytes(std::uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int u = 0;
  while (value >= 1024.0 && u < 5) value /= 1024.0, ++u;
  char text[32];
  std::snprintf(text, sizeof text, "%.1f %s", value, units[u]);
  return text;
}

bool ends_with_ci(const std::string& text, std::string_view suffix) {
  if (text.size() < suffix.size()) return false;
  for (std::size_t i = 0; i < suffix.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[text.size() - suffix.size() + i])) != suffix[i]) return false;
  return true;
}

wb::CheckpointFormat format_from_path(const std::string& path) {
  if (ends_with_ci(path, ".h5") || ends_with_ci(path, ".hdf5")) return wb::CheckpointFormat::kHdf5;
  if (ends_with_ci(path, ".safetensors") || ends_with_ci(path, ".json")) return wb::CheckpointFormat::kSafetensors;
  usage_error("cannot tell the format from --output " + path +
              " (name it *.h5, *.safetensors or *.safetensors.index.json, or pass --format)");
}

// Readers pick the format from the name (open_checkpoint): refuse a name under which what we write could
// not be read back, before writing anything.
void check_output_name(const std::string& path, wb::CheckpointFormat format, bool sharded) {
  const std::string what = "--output " + path + ": ";
  if (format == wb::CheckpointFormat::kHdf5) {
    if (!ends_with_ci(path, ".h5") && !ends_with_ci(path, ".hdf5"))
      usage_error(what + "an HDF5 checkpoint must be named *.h5 or *.hdf5, or readers cannot tell its format");
    return;
  }
  if (sharded && !ends_with_ci(path, ".json"))
    usage_error(what + "with --max-shard-mib the output is an index file beside its shards; name it "
                       "model.safetensors.index.json (any *.json), or drop --max-shard-mib for one file");
  if (!sharded && !ends_with_ci(path, ".safetensors"))
    usage_error(what + "a single safetensors file must be named *.safetensors (a *.json name is read as an index; "
                       "give --max-shard-mib to write one)");
}

// SIGINT, SIGTERM and SIGHUP stop the write between tensors, so that the writer removes its partial files
// (several GB for a full-size model) as it unwinds; the signal is then raised again to end the process
// as it would have. SA_RESETHAND: a second signal ends it at once.
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void on_stop_signal(int signal) { g_stop_signal = signal; }

struct Interrupted {
  int signal;
};

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  for (const int signal : {SIGINT, SIGTERM, SIGHUP}) ::sigaction(signal, &action, nullptr);
  // A file size limit (ulimit -f) would kill the process with SIGXFSZ and leave the partial file; ignored,
  // the write fails with EFBIG instead, and the writer names the file and tensor and removes it, as after
  // a full disk.
  std::signal(SIGXFSZ, SIG_IGN);
}

void stop_if_signalled() {
  if (g_stop_signal != 0) throw Interrupted{static_cast<int>(g_stop_signal)};
}

// --layers and --experts on a full-size model: the real widths, fewer layers or experts.
wb::emu::ModelConfig trim_full_model(wb::emu::ModelConfig config, std::optional<std::int64_t> layers,
                                     std::optional<std::int64_t> experts) {
  if (!layers && !experts) return config;
  if (layers) {
    if (*layers <= 0) usage_error("--layers must be positive");
    config.num_hidden_layers = *layers;
    std::erase_if(config.mlp_only_layers, [&](std::int64_t layer) { return layer >= *layers; });
  }
  if (experts) {
    if (!config.is_moe()) usage_error(config.name + " is a dense model; --experts does not apply");
    if (*experts <= 0) usage_error("--experts must be positive");
    config.num_experts = *experts;
  }
  config.name += "-trimmed";
  config.expected_total_params.reset();
  config.expected_weight_tensors.reset();
  return config;
}

// config.json of the model written: the sizes that decide its tensors (an FP8 form adds its
// quantization_config).
nlohmann::ordered_json model_config_json(const wb::emu::ModelConfig& c) {
  nlohmann::ordered_json j;
  j["name"] = c.name;
  j["model_type"] = c.model_type;
  j["torch_dtype"] = "bfloat16";
  j["hidden_size"] = c.hidden_size;
  j["num_hidden_layers"] = c.num_hidden_layers;
  j["num_attention_heads"] = c.num_attention_heads;
  j["num_key_value_heads"] = c.num_key_value_heads;
  j["head_dim"] = c.head_dim;
  j["intermediate_size"] = c.intermediate_size;
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tie_word_embeddings;
  if (c.is_moe()) {
    j["num_experts"] = c.num_experts;
    j["moe_intermediate_size"] = c.moe_intermediate_size;
  }
  return j;
}

int run(int argc, char** argv) {
  std::string model, scale = "full", format_text, output, max_bytes_text = "64GiB", fp8_block, fp8_rule = "per-block-cast";
  std::int64_t layers = 0, experts = 0, hidden = 0, vocab = 0, head_dim = 0, expert_width = 0, max_shard_mib = 0;
  std::uint64_t seed = 0, version = 0;
  po::options_description options("options");
  options.add_options()
      ("help,h", "print this help")
      ("model,m", po::value(&model), "shipped config name (qwen3-30b-a3b, Kimi-K2-Instruct, ...) or a config.json path")
      ("scale", po::value(&scale)->default_value(scale), "full: the real sizes; tiny: the small variant of the same architecture")
      ("layers", po::value(&layers), "number of decoder layers (default: the model's, or 4 when tiny)")
      ("experts", po::value(&experts), "routed experts per MoE layer (default: the model's, at most 64 when tiny)")
      ("hidden", po::value(&hidden), "tiny only: hidden size (default 64)")
      ("vocab", po::value(&vocab), "tiny only: vocabulary size (default 1000)")
      ("head-dim", po::value(&head_dim), "tiny only: attention head width (not MLA; default 4)")
      ("expert-width", po::value(&expert_width), "tiny only: expert (MoE intermediate) width (default 16)")
      ("fp8", po::value(&fp8_block), "write the FP8 form an FP8 engine of this block shape loads (128x128): e4m3 weights, "
                                     "f32 <name>_scale_inv, and config.json with its quantization_config beside --output")
      ("fp8-rule", po::value(&fp8_rule)->default_value(fp8_rule), "with --fp8: plain, per-block-cast or ue8m0")
      ("format", po::value(&format_text), "hdf5 | safetensors (default: from the --output name)")
      ("max-shard-mib", po::value(&max_shard_mib)->default_value(0), "safetensors: shards of at most N MiB and an index file (0: one file)")
      ("seed", po::value(&seed)->default_value(0), "seed of the synthetic values")
      ("version", po::value(&version)->default_value(0), "the checkpoint at this version, as wb-replay's trainers make "
                                                         "version K of it (0: the checkpoint itself)")
      ("max-bytes", po::value(&max_bytes_text)->default_value(max_bytes_text), "refuse to write a checkpoint larger than this (64GiB, 512M, ...)")
      ("output,o", po::value(&output), "checkpoint path (*.h5, *.safetensors or model.safetensors.index.json)")
      ("list", "print the tensor list (name dtype shape) instead of writing");
  po::variables_map vm;
  try {
    po::store(po::parse_command_line(argc, argv, options), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    usage_error(std::string(e.what()) + " (see --help)");
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n" << options << "\nshipped configs: " << wb::emu::model_config_directory() << "\n";
    return 0;
  }
  if (model.empty()) usage_error("--model is required (see --help)");
  const bool list = vm.count("list") > 0;
  if (!list && output.empty()) usage_error("--output is required unless --list is given");
  if (scale != "full" && scale != "tiny") usage_error("--scale must be full or tiny, not \"" + scale + "\"");
  if (max_shard_mib < 0) usage_error("--max-shard-mib must not be negative");

  auto optional_arg = [&](const char* name, std::int64_t value) -> std::optional<std::int64_t> {
    if (!vm.count(name)) return std::nullopt;
    return value;
  };
  wb::emu::ModelConfig config = wb::emu::load_named_model_config(model);
  if (scale == "tiny") {
    wb::emu::ScaleOptions scale_options;
    scale_options.num_layers = optional_arg("layers", layers);
    scale_options.num_experts = optional_arg("experts", experts);
    scale_options.hidden_size = optional_arg("hidden", hidden);
    scale_options.vocab_size = optional_arg("vocab", vocab);
    scale_options.head_dim = optional_arg("head-dim", head_dim);
    scale_options.moe_intermediate_size = optional_arg("expert-width", expert_width);
    config = wb::emu::scale_model(config, scale_options);
  } else {
    if (vm.count("hidden") || vm.count("vocab") || vm.count("head-dim") || vm.count("expert-width"))
      usage_error("--hidden, --vocab, --head-dim and --expert-width apply to --scale tiny only");
    config = trim_full_model(config, optional_arg("layers", layers), optional_arg("experts", experts));
  }
  // What a file of this model holds: the model's tensors and, where the config has them, the
  // multi-token-prediction layers (which no worker loads).
  std::vector<wb::TensorInfo> tensors = wb::emu::checkpoint_tensors(config);
  // The FP8 form: of the tensors the engines load (a multi-token-prediction layer is no part of it).
  std::optional<wb::layout::Fp8Form> form;
  if (vm.count("fp8")) {
    wb::emu::RolloutSpec engine;
    wb::layout::parse_block_shape(fp8_block, engine.fp8_block_rows, engine.fp8_block_cols, "--fp8");
    (void)wb::layout::parse_scale_rule_or_throw(fp8_rule, "--fp8-rule");
    engine.fp8_rule = fp8_rule;
    form = wb::emu::engine_form(config, engine);
    tensors = form->tensors;
  } else if (!vm["fp8-rule"].defaulted()) {
    usage_error("--fp8-rule needs --fp8 BLOCK");
  }

  std::int64_t params = 0;
  std::uint64_t bytes = 0;
  for (const wb::TensorInfo& t : tensors) {
    params += t.numel();
    bytes += t.nbytes();
  }

  if (list) {
    for (const wb::TensorInfo& t : tensors)
      std::cout << t.name << ' ' << wb::dtype_name(t.dtype) << ' ' << wb::shape_to_string(t.shape) << '\n';
    return 0;
  }

  const wb::CheckpointFormat format =
      format_text.empty() ? format_from_path(output) : wb::parse_checkpoint_format(format_text);
  if (max_shard_mib > 0 && format != wb::CheckpointFormat::kSafetensors)
    usage_error("--max-shard-mib applies to safetensors only");
  check_output_name(output, format, max_shard_mib > 0);
  const std::uint64_t max_bytes = parse_size(max_bytes_text, "max-bytes");
  if (bytes > max_bytes)
    usage_error(config.name + " would take " + human_bytes(bytes) + " (" + std::to_string(bytes) +
                " bytes), more than --max-bytes " + human_bytes(max_bytes) +
                "; use --scale tiny, fewer --layers, or raise --max-bytes");

  // Fail before writing anything when the disk cannot hold the checkpoint.
  const fs::path target = fs::absolute(output);
  std::error_code ec;
  if (!target.parent_path().empty()) fs::create_directories(target.parent_path(), ec);
  const fs::space_info space = fs::space(target.parent_path(), ec);
  if (!ec && bytes > space.available)
    usage_error("only " + human_bytes(space.available) + " free in " + target.parent_path().string() + ", and " +
                config.name + " needs " + human_bytes(bytes));

  wb::CheckpointWriterOptions writer_options;
  writer_options.max_shard_bytes = static_cast<std::size_t>(max_shard_mib) << 20;
  const auto start = std::chrono::steady_clock::now();
  install_stop_handlers();
  const wb::emu::SyntheticCheckpoint synthetic(form ? form->source_tensors : tensors, seed);
  const wb::emu::VersionedCheckpoint versioned(synthetic, version);
  if (form)
    wb::emu::write_fp8_checkpoint(output, format, *form, versioned, model_config_json(config), writer_options,
                                  stop_if_signalled);
  else if (version != 0)
    wb::emu::write_checkpoint_of(versioned, output, format, writer_options, stop_if_signalled);
  else
    wb::emu::write_synthetic_checkpoint(output, format, tensors, seed, writer_options, stop_if_signalled);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Read back what a reader finds under this name: the tensor list, from the headers.
  const std::unique_ptr<wb::CheckpointReader> written = wb::open_checkpoint(output);
  if (written->tensors() != tensors)
    throw wb::Error(wb::ErrorCode::kInternal, output + " does not read back as written: " +
                                                  std::to_string(written->tensors().size()) + " tensors listed, " +
                                                  std::to_string(tensors.size()) + " written");

  if (g_stop_signal != 0) {  // came too late to stop anything: the checkpoint is whole
    std::cerr << "wb-mkckpt: " << ::strsignal(g_stop_signal) << " after " << output << " was complete; kept it"
              << std::endl;
    std::signal(g_stop_signal, SIG_DFL);
    std::raise(g_stop_signal);
  }
  nlohmann::ordered_json line;
  line["model"] = config.name;
  line["tensors"] = tensors.size();
  line["params"] = params;
  line["bytes"] = bytes;
  line["path"] = output;
  if (version != 0) line["version"] = version;
  if (form) {
    line["fp8"] = form->config.to_string();
    line["config"] = wb::emu::config_path_beside(output);
  }
  line["seconds"] = seconds;
  std::cout << line.dump() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const Interrupted& interrupted) {
    std::cerr << "wb-mkckpt: stopped by " << ::strsignal(interrupted.signal) << "; removed the partial checkpoint"
              << std::endl;
    std::signal(interrupted.signal, SIG_DFL);
    std::raise(interrupted.signal);
    return 128 + interrupted.signal;
  } catch (const wb::Error& e) {
    std::cerr << "wb-mkckpt: " << e.what() << '\n';
  } catch (const std::exception& e) {
    std::cerr << "wb-mkckpt: " << e.what() << '\n';
  }
  return 1;
}

#include "emu/models/model.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>

#include <nlohmann/json.hpp>

#include "weightbridge/status.hpp"

#ifndef WB_MODEL_CONFIG_DIR
#error "WB_MODEL_CONFIG_DIR must be defined by the build (apps/CMakeLists.txt)"
#endif

namespace wb::emu {
namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(const std::string& origin, const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, origin + ": " + message);
}

bool has_value(const Json& j, const char* key) { return j.contains(key) && !j.at(key).is_null(); }

std::int64_t get_int(const Json& j, const char* key, const std::string& origin) {
  if (!j.contains(key)) fail(origin, std::string("key '") + key + "' missing");
  const Json& v = j.at(key);
  if (!v.is_number_integer()) fail(origin, std::string("key '") + key + "' is not an integer: " + v.dump());
  return v.get<std::int64_t>();
}

// HF config classes fill absent (or null) keys with their defaults; so do we, for the keys that have one.
std::int64_t get_int_or(const Json& j, const char* key, std::int64_t fallback, const std::string& origin) {
  return has_value(j, key) ? get_int(j, key, origin) : fallback;
}

DType parse_dtype_value(const Json& v, const std::string& key, const std::string& origin) {
  if (!v.is_string()) fail(origin, "key '" + key + "' is not a string: " + v.dump());
  std::string text = v.get<std::string>();
  if (text.rfind("torch.", 0) == 0) text = text.substr(6);
  if (text == "bfloat16") return DType::kBF16;
  if (text == "float16" || text == "half") return DType::kF16;
  if (text == "float32" || text == "float") return DType::kF32;
  if (text == "float64" || text == "double") return DType::kF64;
  if (auto parsed = parse_dtype(text)) return *parsed;
  fail(origin, "key '" + key + "' has unknown dtype \"" + text + "\"");
}

DType parse_torch_dtype(const Json& j, const std::string& origin) {
  // Newer transformers write "dtype", older ones "torch_dtype".
  const char* key = j.contains("torch_dtype") ? "torch_dtype" : (j.contains("dtype") ? "dtype" : nullptr);
  if (key == nullptr) return DType::kBF16;
  return parse_dtype_value(j.at(key), key, origin);
}

std::vector<std::pair<std::string, DType>> parse_tensor_dtypes(const Json& j, const std::string& origin) {
  std::vector<std::pair<std::string, DType>> out;
  if (!has_value(j, "tensor_dtypes")) return out;
  const Json& map = j.at("tensor_dtypes");
  if (!map.is_object()) fail(origin, "key 'tensor_dtypes' is not an object of name suffix -> dtype");
  for (const auto& [suffix, dtype] : map.items()) {
    if (suffix.empty() || suffix.front() == '.' || suffix.back() == '.')
      fail(origin, "key 'tensor_dtypes' has the name suffix \"" + suffix + "\" (empty, or starting or ending with '.')");
    out.emplace_back(suffix, parse_dtype_value(dtype, "tensor_dtypes." + suffix, origin));
  }
  return out;
}

void require_positive(const ModelConfig& c, const char* key, std::int64_t value) {
  if (value <= 0)
    fail(c.name, std::string(key) + " must be positive, got " + std::to_string(value) + " (model_type " +
                     c.model_type + ")");
}

bool has_dense_layer(const ModelConfig& c) {
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i)
    if (!c.is_moe_layer(i)) return true;
  return false;
}

// Everything model_tensors relies on, checked once so a bad config fails here and not with odd shapes.
void validate(const ModelConfig& c) {
  if (c.model_type != "qwen3" && c.model_type != "qwen3_moe" && !c.is_mla())
    fail(c.name, "unknown model_type \"" + c.model_type + "\" (known: qwen3, qwen3_moe, deepseek_v3, kimi_k2)");
  require_positive(c, "hidden_size", c.hidden_size);
  require_positive(c, "num_hidden_layers", c.num_hidden_layers);
  require_positive(c, "num_attention_heads", c.num_attention_heads);
  require_positive(c, "vocab_size", c.vocab_size);
  if (c.model_type == "qwen3" && c.num_experts != 0) fail(c.name, "model_type qwen3 is dense but num_experts is set");
  if (c.num_experts < 0) fail(c.name, "num_experts must not be negative");
  if (c.is_moe()) {
    require_positive(c, "moe_intermediate_size", c.moe_intermediate_size);
    require_positive(c, "decoder_sparse_step", c.decoder_sparse_step);
    require_positive(c, "moe_layer_freq", c.moe_layer_freq);
  }
  if (c.n_shared_experts < 0) fail(c.name, "n_shared_experts must not be negative");
  if (c.first_k_dense_replace < 0) fail(c.name, "first_k_dense_replace must not be negative");
  if (c.num_nextn_predict_layers < 0) fail(c.name, "num_nextn_predict_layers must not be negative");
  if (has_dense_layer(c)) require_positive(c, "intermediate_size", c.intermediate_size);
  if (c.is_mla()) {
    if (c.q_lora_rank) require_positive(c, "q_lora_rank", *c.q_lora_rank);
    require_positive(c, "kv_lora_rank", c.kv_lora_rank);
    require_positive(c, "qk_nope_head_dim", c.qk_nope_head_dim);
    require_positive(c, "qk_rope_head_dim", c.qk_rope_head_dim);
    require_positive(c, "v_head_dim", c.v_head_dim);
  } else {
    require_positive(c, "num_key_value_heads", c.num_key_value_heads);
    require_positive(c, "head_dim", c.head_dim);
  }
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(ErrorCode::kNotFound, "cannot open model config " + path);
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw Error(ErrorCode::kSystem, "cannot read model config " + path);
  return text.str();
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char ch) { return static_cast<char>(std::tolower(ch)); });
  return s;
}

// Appends tensors in call order, each in its own dtype.
class TensorList {
 public:
  explicit TensorList(const ModelConfig& config) : config_(config) {}
  void add(std::string name, Shape shape) {
    const DType dtype = config_.dtype_of(name);
    tensors_.push_back({std::move(name), dtype, std::move(shape)});
  }
  std::vector<TensorInfo> take() { return std::move(tensors_); }

 private:
  const ModelConfig& config_;
  std::vector<TensorInfo> tensors_;
};

void add_gated_mlp(TensorList& out, const std::string& prefix, std::int64_t hidden, std::int64_t inter) {
  out.add(prefix + "gate_proj.weight", {inter, hidden});
  out.add(prefix + "up_proj.weight", {inter, hidden});
  out.add(prefix + "down_proj.weight", {hidden, inter});
}

void add_qwen3_attention(TensorList& out, const ModelConfig& c, const std::string& p) {
  const std::int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                     kv = c.num_key_value_heads * c.head_dim;
  out.add(p + "self_attn.q_proj.weight", {q, h});
  out.add(p + "self_attn.k_proj.weight", {kv, h});
  out.add(p + "self_attn.v_proj.weight", {kv, h});
  out.add(p + "self_attn.o_proj.weight", {h, q});
  out.add(p + "self_attn.q_norm.weight", {c.head_dim});
  out.add(p + "self_attn.k_norm.weight", {c.head_dim});
}

void add_mla_attention(TensorList& out, const ModelConfig& c, const std::string& p) {
  const std::int64_t h = c.hidden_size, nh = c.num_attention_heads;
  const std::int64_t qk = c.qk_nope_head_dim + c.qk_rope_head_dim;
  if (c.q_lora_rank) {
    out.add(p + "self_attn.q_a_proj.weight", {*c.q_lora_rank, h});
    out.add(p + "self_attn.q_a_layernorm.weight", {*c.q_lora_rank});
    out.add(p + "self_attn.q_b_proj.weight", {nh * qk, *c.q_lora_rank});
  } else {
    out.add(p + "self_attn.q_proj.weight", {nh * qk, h});
  }
  out.add(p + "self_attn.kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, h});
  out.add(p + "self_attn.kv_a_layernorm.weight", {c.kv_lora_rank});
  out.add(p + "self_attn.kv_b_proj.weight", {nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank});
  out.add(p + "self_attn.o_proj.weight", {h, nh * c.v_head_dim});
}

void add_moe(TensorList& out, const ModelConfig& c, const std::string& p) {
  const std::int64_t h = c.hidden_size;
  out.add(p + "mlp.gate.weight", {c.num_experts, h});
  if (c.is_mla()) out.add(p + "mlp.gate.e_score_correction_bias", {c.num_experts});
  for (std::int64_t e = 0; e < c.num_experts; ++e)
    add_gated_mlp(out, p + "mlp.experts." + std::to_string(e) + ".", h, c.moe_intermediate_size);
  if (c.is_mla() && c.n_shared_experts > 0)
    add_gated_mlp(out, p + "mlp.shared_experts.", h, c.n_shared_experts * c.moe_intermediate_size);
}

void add_decoder_layer(TensorList& out, const ModelConfig& c, std::int64_t layer) {
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  const std::int64_t h = c.hidden_size;
  if (c.is_mla())
    add_mla_attention(out, c, p);
  else
    add_qwen3_attention(out, c, p);
  out.add(p + "input_layernorm.weight", {h});
  out.add(p + "post_attention_layernorm.weight", {h});
  if (c.is_moe_layer(layer))
    add_moe(out, c, p);
  else
    add_gated_mlp(out, p + "mlp.", h, c.intermediate_size);
}

}  // namespace

DType ModelConfig::dtype_of(std::string_view name) const {
  for (const auto& [suffix, tensor_dtype] : tensor_dtypes) {
    if (name.size() < suffix.size() || name.substr(name.size() - suffix.size()) != suffix) continue;
    if (name.size() == suffix.size() || name[name.size() - suffix.size() - 1] == '.') return tensor_dtype;
  }
  return dtype;
}

bool ModelConfig::is_moe_layer(std::int64_t layer) const {
  if (num_experts <= 0) return false;
  if (model_type == "qwen3_moe")  // transformers' Qwen3MoeDecoderLayer rule
    return std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) == mlp_only_layers.end() &&
           decoder_sparse_step > 0 && (layer + 1) % decoder_sparse_step == 0;
  if (is_mla())  // transformers' DeepseekV3DecoderLayer rule
    return layer >= first_k_dense_replace && moe_layer_freq > 0 && layer % moe_layer_freq == 0;
  return false;
}

ModelConfig parse_model_config(const std::string& json_text, const std::string& origin) {
  Json j;
  try {
    j = Json::parse(json_text);
  } catch (const Json::parse_error& e) {
    fail(origin, std::string("not valid JSON: ") + e.what());
  }
  if (!j.is_object()) fail(origin, "not a JSON object");
  if (!j.contains("model_type") || !j.at("model_type").is_string()) fail(origin, "key 'model_type' missing or not a string");

  ModelConfig c;
  c.model_type = j.at("model_type").get<std::string>();
  c.name = j.contains("name") && j.at("name").is_string() ? j.at("name").get<std::string>() : c.model_type;
  // Messages name the file and the model, so a bad key in one of many configs is easy to find.
  const std::string where = origin + " (" + c.name + ")";
  const bool qwen = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  if (!qwen && !c.is_mla())
    fail(where, "unknown model_type \"" + c.model_type + "\" (known: qwen3, qwen3_moe, deepseek_v3, kimi_k2)");

  c.dtype = parse_torch_dtype(j, where);
  c.tensor_dtypes = parse_tensor_dtypes(j, where);
  c.hidden_size = get_int(j, "hidden_size", where);
  c.num_hidden_layers = get_int(j, "num_hidden_layers", where);
  c.num_attention_heads = get_int(j, "num_attention_heads", where);
  c.num_key_value_heads = get_int_or(j, "num_key_value_heads", c.num_attention_heads, where);
  c.vocab_size = get_int(j, "vocab_size", where);
  c.intermediate_size = get_int_or(j, "intermediate_size", 0, where);
  if (j.contains("tie_word_embeddings") && !j.at("tie_word_embeddings").is_null()) {
    if (!j.at("tie_word_embeddings").is_boolean()) fail(where, "key 'tie_word_embeddings' is not a boolean");
    c.tie_word_embeddings = j.at("tie_word_embeddings").get<bool>();
  }

  if (qwen) {
    const std::int64_t heads = c.num_attention_heads > 0 ? c.num_attention_heads : 1;
    c.head_dim = get_int_or(j, "head_dim", c.hidden_size / heads, where);
    if (c.model_type == "qwen3_moe") {
      c.num_experts = get_int(j, "num_experts", where);
      c.moe_intermediate_size = get_int(j, "moe_intermediate_size", where);
      c.decoder_sparse_step = get_int_or(j, "decoder_sparse_step", 1, where);
      if (has_value(j, "mlp_only_layers")) {
        const Json& layers = j.at("mlp_only_layers");
        if (!layers.is_array()) fail(where, "key 'mlp_only_layers' is not an array");
        for (const Json& v : layers) {
          if (!v.is_number_integer()) fail(where, "key 'mlp_only_layers' holds a non-integer: " + v.dump());
          c.mlp_only_layers.push_back(v.get<std::int64_t>());
        }
      }
    }
  } else {
    // n_routed_experts null means a dense DeepSeek model.
    c.num_experts = get_int_or(j, "n_routed_experts", 0, where);
    if (c.num_experts > 0) c.moe_intermediate_size = get_int(j, "moe_intermediate_size", where);
    c.n_shared_experts = get_int_or(j, "n_shared_experts", 0, where);
    c.first_k_dense_replace = get_int_or(j, "first_k_dense_replace", 0, where);
    c.moe_layer_freq = get_int_or(j, "moe_layer_freq", 1, where);
    // Absent and null differ in transformers (absent means its default rank 1536): make the file say which.
    if (!j.contains("q_lora_rank")) fail(where, "key 'q_lora_rank' missing (null for a plain q_proj)");
    if (!j.at("q_lora_rank").is_null()) c.q_lora_rank = get_int(j, "q_lora_rank", where);
    c.kv_lora_rank = get_int(j, "kv_lora_rank", where);
    c.qk_nope_head_dim = get_int(j, "qk_nope_head_dim", where);
    c.qk_rope_head_dim = get_int(j, "qk_rope_head_dim", where);
    c.v_head_dim = get_int(j, "v_head_dim", where);
    c.num_nextn_predict_layers = get_int_or(j, "num_nextn_predict_layers", 0, where);
  }

  if (has_value(j, "expected_total_params")) c.expected_total_params = get_int(j, "expected_total_params", where);
  if (has_value(j, "expected_weight_tensors")) c.expected_weight_tensors = get_int(j, "expected_weight_tensors", where);

  try {
    validate(c);
  } catch (const Error& e) {
    fail(origin, e.status().message());
  }
  return c;
}

ModelConfig load_model_config(const std::string& path) { return parse_model_config(read_file(path), path); }

std::vector<TensorInfo> model_tensors(const ModelConfig& c) {
  validate(c);
  TensorList out(c);
  const std::int64_t h = c.hidden_size;
  out.add("model.embed_tokens.weight", {c.vocab_size, h});
  for (std::int64_t i = 0; i < c.num_hidden_layers; ++i) add_decoder_layer(out, c, i);
  out.add("model.norm.weight", {h});
  if (!c.tie_word_embeddings) out.add("lm_head.weight", {c.vocab_size, h});
  return out.take();
}

std::vector<TensorInfo> checkpoint_tensors(const ModelConfig& c) {
  std::vector<TensorInfo> tensors = model_tensors(c);
  TensorList out(c);
  const std::int64_t h = c.hidden_size;
  // DeepSeek-V3's layout of a prediction layer: its own embedding and head, two norms and the projection
  // of [embedding, hidden] (2H wide) before a full decoder layer.
  for (std::int64_t k = 0; k < c.num_nextn_predict_layers; ++k) {
    const std::int64_t layer = c.num_hidden_layers + k;
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    out.add(p + "embed_tokens.weight", {c.vocab_size, h});
    out.add(p + "enorm.weight", {h});
    out.add(p + "hnorm.weight", {h});
    out.add(p + "eh_proj.weight", {h, 2 * h});
    add_decoder_layer(out, c, layer);
    out.add(p + "shared_head.norm.weight", {h});
    out.add(p + "shared_head.head.weight", {c.vocab_size, h});
  }
  std::vector<TensorInfo> extra = out.take();
  tensors.insert(tensors.end(), std::make_move_iterator(extra.begin()), std::make_move_iterator(extra.end()));
  return tensors;
}

std::vector<std::string> check_checkpoint_holds(const std::vector<TensorInfo>& needed, const std::string& model_name,
                                                const CheckpointReader& checkpoint) {
  for (const TensorInfo& info : needed) {
    const TensorInfo* found = checkpoint.find(info.name);
    if (found == nullptr)
      throw Error(ErrorCode::kInvalidArgument, "checkpoint " + checkpoint.source() + " has no tensor " + info.name +
                                                   " that " + model_name + " needs (wrong --model or --scale?)");
    if (found->shape != info.shape || found->dtype != info.dtype)
      throw Error(ErrorCode::kInvalidArgument,
                  "checkpoint " + checkpoint.source() + ": tensor " + info.name + " is " +
                      std::string(dtype_name(found->dtype)) + shape_to_string(found->shape) + " but " + model_name +
                      " has " + std::string(dtype_name(info.dtype)) + shape_to_string(info.shape));
  }
  std::unordered_set<std::string_view> wanted;
  for (const TensorInfo& info : needed) wanted.insert(info.name);
  std::vector<std::string> extra;
  for (const TensorInfo& info : checkpoint.tensors())
    if (!wanted.contains(info.name)) extra.push_back(info.name);
  return extra;
}

namespace {
class RestrictedCheckpoint final : public CheckpointReader {
 public:
  RestrictedCheckpoint(std::unique_ptr<CheckpointReader> checkpoint, std::vector<TensorInfo> tensors)
      : checkpoint_(std::move(checkpoint)), tensors_(std::move(tensors)) {}
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void read_box(std::string_view name, const Box& box, void* destination) const override {
    if (find(name) == nullptr)
      throw Error(ErrorCode::kNotFound, "checkpoint " + source() + ": tensor " + std::string(name) + " is not one the model uses");
    checkpoint_->read_box(name, box, destination);
  }
  std::string source() const override { return checkpoint_->source(); }

 private:
  std::unique_ptr<CheckpointReader> checkpoint_;
  std::vector<TensorInfo> tensors_;
};
}  // namespace

std::unique_ptr<CheckpointReader> restrict_checkpoint(std::unique_ptr<CheckpointReader> checkpoint,
                                                      std::vector<TensorInfo> tensors) {
  return std::make_unique<RestrictedCheckpoint>(std::move(checkpoint), std::move(tensors));
}

std::string compact_names(const std::vector<std::string>& names) {
  // Key: the name with its last number cut out; the numbers seen at that place, in order of appearance.
  struct Group {
    std::string before, after;
    std::vector<std::int64_t> numbers;
  };
  std::vector<Group> groups;
  std::map<std::pair<std::string, std::string>, std::size_t> index;
  std::vector<std::string> plain;  // names with no number, listed as they are
  std::vector<std::pair<bool, std::size_t>> order;  // (is group, position) in first-appearance order
  for (const std::string& name : names) {
    // The last '.'-separated component that is a number (of at most 15 digits: it must fit).
    std::size_t begin = std::string::npos, end = 0;
    for (std::size_t stop = name.size();;) {
      const std::size_t dot = stop == 0 ? std::string::npos : name.rfind('.', stop - 1);
      const std::size_t start = dot == std::string::npos ? 0 : dot + 1;
      const std::string_view part = std::string_view(name).substr(start, stop - start);
      if (!part.empty() && part.size() <= 15 && (part.size() == 1 || part[0] != '0') &&
          std::all_of(part.begin(), part.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
        begin = start;
        end = stop;
        break;
      }
      if (dot == std::string::npos) break;
      stop = dot;
    }
    if (begin == std::string::npos) {
      order.emplace_back(false, plain.size());
      plain.push_back(name);
      continue;
    }
    const std::pair<std::string, std::string> key{name.substr(0, begin), name.substr(end)};
    auto [it, added] = index.emplace(key, groups.size());
    if (added) {
      groups.push_back({key.first, key.second, {}});
      order.emplace_back(true, it->second);
    }
    groups[it->second].numbers.push_back(std::stoll(name.substr(begin, end - begin)));
  }
  std::string out;
  for (const auto& [is_group, at] : order) {
    if (!out.empty()) out += ", ";
    if (!is_group) {
      out += plain[at];
      continue;
    }
    Group& g = groups[at];
    if (g.numbers.size() == 1) {
      out += g.before + std::to_string(g.numbers[0]) + g.after;
      continue;
    }
    std::sort(g.numbers.begin(), g.numbers.end());
    g.numbers.erase(std::unique(g.numbers.begin(), g.numbers.end()), g.numbers.end());
    std::string set;
    for (std::size_t i = 0; i < g.numbers.size();) {
      std::size_t j = i;
      while (j + 1 < g.numbers.size() && g.numbers[j + 1] == g.numbers[j] + 1) ++j;
      if (!set.empty()) set += ",";
      set += std::to_string(g.numbers[i]);
      if (j > i) set += (j == i + 1 ? "," : "..") + std::to_string(g.numbers[j]);
      i = j + 1;
    }
    out += g.before + "{" + set + "}" + g.after;
  }
  return out;
}

ModelConfig scale_model(const ModelConfig& config, const ScaleOptions& options) {
  validate(config);
  ModelConfig t = config;
  t.name = config.name + "-tiny";
  t.expected_total_params.reset();
  t.expected_weight_tensors.reset();

  // Head counts stay: the presets' parallel layouts divide them (rollout TP up to 32, trainer TP up to 8).
  const std::int64_t dense_first = config.is_moe() ? config.first_k_dense_replace : 0;
  t.num_hidden_layers = options.num_layers.value_or(std::max<std::int64_t>(4, dense_first + 1));
  if (t.num_hidden_layers <= dense_first)
    fail(t.name, "num_layers " + std::to_string(t.num_hidden_layers) + " must exceed first_k_dense_replace " +
                     std::to_string(dense_first) + " so that MoE layers remain");
  t.hidden_size = options.hidden_size.value_or(64);
  t.vocab_size = options.vocab_size.value_or(1000);  // not a multiple of 64: vocabulary padding appears
  if (config.intermediate_size > 0) t.intermediate_size = 96;
  if (!config.is_mla()) {
    t.head_dim = options.head_dim.value_or(4);
    if (t.head_dim <= 0) fail(t.name, "head_dim must be positive, got " + std::to_string(t.head_dim));
  } else if (options.head_dim) {
    fail(t.name, "MLA model: head_dim does not apply (its head dims are the MLA ranks')");
  }

  if (config.is_moe()) {
    // More than 64 experts shrink to 64 (at least 32 so EP32 still gives each rank one); fewer stay.
    t.num_experts = options.num_experts.value_or(config.num_experts > 64 ? std::clamp<std::int64_t>(config.num_experts, 32, 64)
                                                                          : config.num_experts);
    if (t.num_experts <= 0) fail(t.name, "num_experts must be positive, got " + std::to_string(t.num_experts));
    t.moe_intermediate_size = options.moe_intermediate_size.value_or(16);  // divisible by expert-TP up to 8
    if (t.moe_intermediate_size <= 0)
      fail(t.name, "moe_intermediate_size must be positive, got " + std::to_string(t.moe_intermediate_size));
    std::erase_if(t.mlp_only_layers, [&](std::int64_t layer) { return layer >= t.num_hidden_layers; });
  } else if (options.num_experts) {
    fail(t.name, "dense model: num_experts does not apply");
  }

  if (config.is_mla()) {
    if (config.q_lora_rank) t.q_lora_rank = 16;
    t.kv_lora_rank = 8;
    t.qk_nope_head_dim = 4;
    t.qk_rope_head_dim = 2;
    t.v_head_dim = 4;
  }

  bool any_moe = false;
  for (std::int64_t i = 0; i < t.num_hidden_layers && !any_moe; ++i) any_moe = t.is_moe_layer(i);
  if (config.is_moe() && !any_moe)
    fail(t.name, std::to_string(t.num_hidden_layers) + " layers leave no MoE layer; use more layers");
  validate(t);
  return t;
}

std::string model_config_directory() { return WB_MODEL_CONFIG_DIR; }

ModelConfig load_named_model_config(const std::string& name_or_path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  if (fs::is_regular_file(name_or_path, ec)) return load_model_config(name_or_path);
  const bool looks_like_path = name_or_path.find('/') != std::string::npos ||
                               (name_or_path.size() > 5 && name_or_path.ends_with(".json"));
  if (!looks_like_path) {
    // The stem, or the model's display name ("Qwen3-30B-A3B" is stored as qwen3-30b-a3b.json).
    for (const std::string& stem : {name_or_path, lower(name_or_path)}) {
      const fs::path candidate = fs::path(model_config_directory()) / (stem + ".json");
      if (fs::is_regular_file(candidate, ec)) return load_model_config(candidate.string());
    }
  }
  std::vector<std::string> known;
  for (const auto& entry : fs::directory_iterator(model_config_directory(), ec))
    if (entry.path().extension() == ".json") known.push_back(entry.path().stem().string());
  std::sort(known.begin(), known.end());
  std::string list;
  for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
  throw Error(ErrorCode::kNotFound, "model \"" + name_or_path + "\" is neither a config file nor a shipped config in " +
                                        model_config_directory() + " (known: " + list + ")");
}

}  // namespace wb::emu

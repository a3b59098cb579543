// Model architectures: the tensor lists derived from the shipped config.json files must reproduce the
// published parameter and tensor counts exactly, and the tiny variants must keep the structure.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <map>
#include <memory>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "../support/expect_error.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/checkpoint.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using wb::testing::expect_error;

const std::vector<std::string> kShippedModels = {"kimi-k2-instruct", "moonlight-16b-a3b", "qwen3-235b-a22b",
                                                 "qwen3-30b-a3b", "qwen3-32b"};

std::map<std::string, Shape> shapes_of(const std::vector<TensorInfo>& tensors) {
  std::map<std::string, Shape> shapes;
  for (const TensorInfo& t : tensors) EXPECT_TRUE(shapes.emplace(t.name, t.shape).second) << "duplicate " << t.name;
  return shapes;
}

std::int64_t total_params(const std::vector<TensorInfo>& tensors) {
  std::int64_t n = 0;
  for (const TensorInfo& t : tensors) n += t.numel();
  return n;
}

std::size_t total_bytes(const std::vector<TensorInfo>& tensors) {
  std::size_t n = 0;
  for (const TensorInfo& t : tensors) n += t.nbytes();
  return n;
}

// Names of one layer with the layer index and expert index replaced, in order and without repeats.
std::vector<std::string> layer_structure(const std::vector<TensorInfo>& tensors, std::int64_t layer) {
  const std::string prefix = "model.layers." + std::to_string(layer) + ".";
  const std::regex expert(R"(\.experts\.\d+\.)");
  std::vector<std::string> names;
  for (const TensorInfo& t : tensors) {
    if (!t.name.starts_with(prefix)) continue;
    std::string name = std::regex_replace(t.name.substr(prefix.size()), expert, ".experts.E.");
    if (std::find(names.begin(), names.end(), name) == names.end()) names.push_back(name);
  }
  return names;
}

TEST(ModelConfig, ShippedConfigsReproduceExpectedCounts) {
  for (const std::string& model : kShippedModels) {
    SCOPED_TRACE(model);
    const ModelConfig config = load_named_model_config(model);
    ASSERT_TRUE(config.expected_total_params.has_value());
    ASSERT_TRUE(config.expected_weight_tensors.has_value());
    const std::vector<TensorInfo> tensors = model_tensors(config);
    EXPECT_EQ(total_params(tensors), *config.expected_total_params);
    EXPECT_EQ(static_cast<std::int64_t>(tensors.size()), *config.expected_weight_tensors);
    EXPECT_EQ(shapes_of(tensors).size(), tensors.size());
    // bf16 throughout, but for the router's correction bias of the DeepSeek-V3 family, float32 as the
    // released files keep it: one per MoE layer.
    std::int64_t float32 = 0, moe_layers = 0;
    for (std::int64_t layer = 0; layer < config.num_hidden_layers; ++layer) moe_layers += config.is_moe_layer(layer) && config.is_mla();
    for (const TensorInfo& t : tensors) {
      const bool bias = t.name.ends_with(".mlp.gate.e_score_correction_bias");
      EXPECT_EQ(t.dtype, bias ? DType::kF32 : DType::kBF16) << t.name;
      float32 += t.dtype == DType::kF32;
    }
    EXPECT_EQ(float32, moe_layers);
    // Natural order: embedding first, final norm and head last.
    EXPECT_EQ(tensors.front().name, "model.embed_tokens.weight");
    EXPECT_EQ(tensors[tensors.size() - 2].name, "model.norm.weight");
    EXPECT_EQ(tensors.back().name, "lm_head.weight");
    EXPECT_EQ(tensors[1].name.substr(0, 15), "model.layers.0.");
  }
}

TEST(ModelConfig, ParsesFields) {
  const ModelConfig qwen = load_named_model_config("qwen3-30b-a3b");
  EXPECT_EQ(qwen.name, "Qwen3-30B-A3B");
  EXPECT_EQ(qwen.model_type, "qwen3_moe");
  EXPECT_EQ(qwen.hidden_size, 2048);
  EXPECT_EQ(qwen.num_hidden_layers, 48);
  EXPECT_EQ(qwen.num_attention_heads, 32);
  EXPECT_EQ(qwen.num_key_value_heads, 4);
  EXPECT_EQ(qwen.head_dim, 128);
  EXPECT_EQ(qwen.num_experts, 128);
  EXPECT_EQ(qwen.moe_intermediate_size, 768);
  EXPECT_TRUE(qwen.is_moe());
  EXPECT_FALSE(qwen.is_mla());

  const ModelConfig kimi = load_named_model_config("kimi-k2-instruct");
  EXPECT_EQ(kimi.model_type, "kimi_k2");
  EXPECT_TRUE(kimi.is_mla());
  EXPECT_EQ(kimi.num_experts, 384);
  EXPECT_EQ(kimi.n_shared_experts, 1);
  EXPECT_EQ(kimi.first_k_dense_replace, 1);
  ASSERT_TRUE(kimi.q_lora_rank.has_value());
  EXPECT_EQ(*kimi.q_lora_rank, 1536);
  EXPECT_FALSE(kimi.is_moe_layer(0));
  EXPECT_TRUE(kimi.is_moe_layer(1));

  const ModelConfig moonlight = load_named_model_config("moonlight-16b-a3b");
  EXPECT_FALSE(moonlight.q_lora_rank.has_value());
  EXPECT_EQ(moonlight.n_shared_experts, 2);

  const ModelConfig dense = load_named_model_config("qwen3-32b");
  EXPECT_FALSE(dense.is_moe());
  EXPECT_FALSE(dense.is_moe_layer(0));
}

TEST(ModelConfig, LoadsByNameStemOrPath) {
  EXPECT_EQ(load_named_model_config("Qwen3-30B-A3B").name, "Qwen3-30B-A3B");
  const std::string path = model_config_directory() + "/qwen3-32b.json";
  EXPECT_EQ(load_named_model_config(path).name, "Qwen3-32B");
  EXPECT_EQ(load_model_config(path).name, "Qwen3-32B");
  // The known ones are listed.
  expect_error([] { load_named_model_config("no-such-model"); }, ErrorCode::kNotFound, {"no-such-model", "qwen3-30b-a3b"});
  expect_error([] { load_model_config("/nonexistent/config.json"); }, ErrorCode::kNotFound, {"/nonexistent/config.json"});
}

TEST(ModelConfig, Qwen3MoeShapes) {
  const auto shapes = shapes_of(model_tensors(load_named_model_config("qwen3-30b-a3b")));
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (Shape{151936, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_proj.weight"), (Shape{4096, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_proj.weight"), (Shape{512, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.v_proj.weight"), (Shape{512, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.o_proj.weight"), (Shape{2048, 4096}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_norm.weight"), (Shape{128}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.k_norm.weight"), (Shape{128}));
  EXPECT_EQ(shapes.at("model.layers.0.input_layernorm.weight"), (Shape{2048}));
  EXPECT_EQ(shapes.at("model.layers.47.post_attention_layernorm.weight"), (Shape{2048}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate.weight"), (Shape{128, 2048}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.experts.0.gate_proj.weight"), (Shape{768, 2048}));
  EXPECT_EQ(shapes.at("model.layers.47.mlp.experts.127.up_proj.weight"), (Shape{768, 2048}));
  EXPECT_EQ(shapes.at("model.layers.47.mlp.experts.127.down_proj.weight"), (Shape{2048, 768}));
  EXPECT_EQ(shapes.at("lm_head.weight"), (Shape{151936, 2048}));
  EXPECT_FALSE(shapes.contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_FALSE(shapes.contains("model.layers.0.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(shapes.contains("model.layers.48.input_layernorm.weight"));
}

TEST(ModelConfig, Qwen3DenseShapes) {
  const auto shapes = shapes_of(model_tensors(load_named_model_config("qwen3-32b")));
  EXPECT_EQ(shapes.at("model.layers.63.self_attn.q_proj.weight"), (Shape{8192, 5120}));
  EXPECT_EQ(shapes.at("model.layers.63.self_attn.k_proj.weight"), (Shape{1024, 5120}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (Shape{25600, 5120}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.up_proj.weight"), (Shape{25600, 5120}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.down_proj.weight"), (Shape{5120, 25600}));
  EXPECT_FALSE(shapes.contains("model.layers.0.mlp.gate.weight"));
}

TEST(ModelConfig, DeepseekShapes) {
  const auto kimi = shapes_of(model_tensors(load_named_model_config("kimi-k2-instruct")));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.q_a_proj.weight"), (Shape{1536, 7168}));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.q_a_layernorm.weight"), (Shape{1536}));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.q_b_proj.weight"), (Shape{64 * 192, 1536}));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), (Shape{576, 7168}));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.kv_a_layernorm.weight"), (Shape{512}));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.kv_b_proj.weight"), (Shape{64 * 256, 512}));
  EXPECT_EQ(kimi.at("model.layers.0.self_attn.o_proj.weight"), (Shape{7168, 64 * 128}));
  EXPECT_EQ(kimi.at("model.layers.0.mlp.gate_proj.weight"), (Shape{18432, 7168}));
  EXPECT_FALSE(kimi.contains("model.layers.0.mlp.gate.weight"));
  EXPECT_FALSE(kimi.contains("model.layers.0.self_attn.q_proj.weight"));
  EXPECT_EQ(kimi.at("model.layers.1.mlp.gate.weight"), (Shape{384, 7168}));
  EXPECT_EQ(kimi.at("model.layers.1.mlp.gate.e_score_correction_bias"), (Shape{384}));
  EXPECT_EQ(kimi.at("model.layers.60.mlp.experts.383.down_proj.weight"), (Shape{7168, 2048}));
  EXPECT_EQ(kimi.at("model.layers.1.mlp.shared_experts.gate_proj.weight"), (Shape{2048, 7168}));
  EXPECT_FALSE(kimi.contains("model.layers.1.mlp.gate_proj.weight"));

  const auto moonlight = shapes_of(model_tensors(load_named_model_config("moonlight-16b-a3b")));
  EXPECT_EQ(moonlight.at("model.layers.3.self_attn.q_proj.weight"), (Shape{16 * 192, 2048}));
  EXPECT_FALSE(moonlight.contains("model.layers.3.self_attn.q_a_proj.weight"));
  EXPECT_EQ(moonlight.at("model.layers.3.mlp.shared_experts.up_proj.weight"), (Shape{2 * 1408, 2048}));
  EXPECT_EQ(moonlight.at("model.layers.3.mlp.shared_experts.down_proj.weight"), (Shape{2048, 2 * 1408}));
  EXPECT_EQ(moonlight.at("model.layers.0.mlp.down_proj.weight"), (Shape{2048, 11264}));
}

TEST(ModelConfig, LayerOrderIsFixed) {
  const auto tensors = model_tensors(load_named_model_config("moonlight-16b-a3b"));
  const std::vector<std::string> layer1 = layer_structure(tensors, 1);
  const std::vector<std::string> expected = {
      "self_attn.q_proj.weight", "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
      "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight", "input_layernorm.weight",
      "post_attention_layernorm.weight", "mlp.gate.weight", "mlp.gate.e_score_correction_bias",
      "mlp.experts.E.gate_proj.weight", "mlp.experts.E.up_proj.weight", "mlp.experts.E.down_proj.weight",
      "mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight",
      "mlp.shared_experts.down_proj.weight"};
  EXPECT_EQ(layer1, expected);
  // Layers appear in order, each contiguous.
  std::int64_t last_layer = -1;
  for (const TensorInfo& t : tensors) {
    if (!t.name.starts_with("model.layers.")) continue;
    const std::int64_t layer = std::stoll(t.name.substr(13));
    EXPECT_TRUE(layer == last_layer || layer == last_layer + 1) << t.name;
    last_layer = layer;
  }
}

TEST(ModelConfig, TensorDtypesBySuffix) {
  const char* text = R"({"model_type":"deepseek_v3","hidden_size":16,"num_hidden_layers":3,"num_attention_heads":2,
    "intermediate_size":24,"moe_intermediate_size":8,"n_routed_experts":4,"n_shared_experts":1,"first_k_dense_replace":1,
    "vocab_size":50,"q_lora_rank":null,"kv_lora_rank":8,"qk_nope_head_dim":4,"qk_rope_head_dim":2,"v_head_dim":4,
    "torch_dtype":"bfloat16","tensor_dtypes":{"mlp.gate.e_score_correction_bias":"float32","model.norm.weight":"torch.float16"}})";
  const ModelConfig config = parse_model_config(text, "inline");
  EXPECT_EQ(config.dtype_of("model.layers.2.mlp.gate.e_score_correction_bias"), DType::kF32);
  EXPECT_EQ(config.dtype_of("mlp.gate.e_score_correction_bias"), DType::kF32);  // the whole name
  EXPECT_EQ(config.dtype_of("model.layers.2.mlp.xgate.e_score_correction_bias"), DType::kBF16);  // not at a '.'
  EXPECT_EQ(config.dtype_of("model.norm.weight"), DType::kF16);
  EXPECT_EQ(config.dtype_of("model.layers.0.input_layernorm.weight"), DType::kBF16);
  std::size_t float32 = 0;
  for (const TensorInfo& t : model_tensors(config)) {
    if (t.name.ends_with("e_score_correction_bias")) {
      EXPECT_EQ(t.dtype, DType::kF32) << t.name;
    }
    float32 += t.dtype == DType::kF32;
  }
  EXPECT_EQ(float32, 2u);  // layers 1 and 2
  EXPECT_EQ(scale_model(config).dtype_of("model.layers.1.mlp.gate.e_score_correction_bias"), DType::kF32);

  for (const char* bad : {R"("tensor_dtypes":{"x.bias":"complex64"})", R"("tensor_dtypes":{".bias":"float32"})",
                          R"("tensor_dtypes":["float32"])", R"("tensor_dtypes":{"bias":3})"}) {
    SCOPED_TRACE(bad);
    const std::string message = expect_error([&] {
      parse_model_config(std::string(R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":1,"num_attention_heads":2,)"
                                     R"("intermediate_size":8,"vocab_size":10,)") + bad + "}", "cfg.json");
    }, ErrorCode::kInvalidArgument);
    EXPECT_NE(message.find("cfg.json"), std::string::npos) << message;
    EXPECT_NE(message.find("tensor_dtypes"), std::string::npos) << message;
  }
}

TEST(ModelConfig, CheckpointFilesHoldMultiTokenPredictionLayers) {
  ModelConfig config = scale_model(load_named_model_config("moonlight-16b-a3b"));
  EXPECT_EQ(checkpoint_tensors(config), model_tensors(config));  // none in the shipped config
  config.num_nextn_predict_layers = 1;
  const std::vector<TensorInfo> model = model_tensors(config);
  const std::vector<TensorInfo> file = checkpoint_tensors(config);
  ASSERT_GT(file.size(), model.size());
  EXPECT_TRUE(std::equal(model.begin(), model.end(), file.begin()));  // the model's first, unchanged
  const std::int64_t mtp = config.num_hidden_layers, h = config.hidden_size;
  const std::string p = "model.layers." + std::to_string(mtp) + ".";
  const auto shapes = shapes_of(file);
  EXPECT_EQ(shapes.at(p + "embed_tokens.weight"), (Shape{config.vocab_size, h}));
  EXPECT_EQ(shapes.at(p + "eh_proj.weight"), (Shape{h, 2 * h}));
  EXPECT_EQ(shapes.at(p + "enorm.weight"), (Shape{h}));
  EXPECT_EQ(shapes.at(p + "shared_head.head.weight"), (Shape{config.vocab_size, h}));
  EXPECT_EQ(shapes.at(p + "mlp.experts.0.up_proj.weight"), (Shape{config.moe_intermediate_size, h}));
  // The prediction layer is a whole decoder layer (MoE here) plus six tensors of its own.
  const std::size_t decoder_layer = layer_structure(model, 1).size() - 3 + 3 * static_cast<std::size_t>(config.num_experts);
  EXPECT_EQ(file.size() - model.size(), decoder_layer + 6);
  for (std::size_t i = model.size(); i < file.size(); ++i) EXPECT_TRUE(file[i].name.starts_with(p)) << file[i].name;
}

/// A checkpoint over a fixed tensor list (values are never read here).
class ListedCheckpoint final : public CheckpointReader {
 public:
  explicit ListedCheckpoint(std::vector<TensorInfo> tensors) : tensors_(std::move(tensors)) {}
  const std::vector<TensorInfo>& tensors() const override { return tensors_; }
  void read_box(std::string_view name, const Box&, void* destination) const override {
    *static_cast<char*>(destination) = name.front();
  }
  std::string source() const override { return "listed.safetensors"; }

 private:
  std::vector<TensorInfo> tensors_;
};

TEST(ModelConfig, CheckpointMustHoldTheModelAndMayHoldMore) {
  const std::vector<TensorInfo> model = {{"a.weight", DType::kBF16, {4, 2}}, {"a.bias", DType::kF32, {4}}};
  // More than the model, in another order: fine; the rest is listed.
  const ListedCheckpoint more({{"extra.0.w", DType::kBF16, {1}}, {"a.bias", DType::kF32, {4}},
                               {"a.weight", DType::kBF16, {4, 2}}, {"extra.1.w", DType::kBF16, {1}}});
  EXPECT_EQ(check_checkpoint_holds(model, "Tiny", more), (std::vector<std::string>{"extra.0.w", "extra.1.w"}));

  std::string message = expect_error([&] {
    check_checkpoint_holds(model, "Tiny", ListedCheckpoint({{"a.weight", DType::kBF16, {4, 2}}}));
  }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("listed.safetensors has no tensor a.bias that Tiny needs"), std::string::npos) << message;
  message = expect_error([&] {
    check_checkpoint_holds(model, "Tiny", ListedCheckpoint({{"a.weight", DType::kBF16, {4, 2}}, {"a.bias", DType::kBF16, {4}}}));
  }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("listed.safetensors: tensor a.bias is bf16[4] but Tiny has f32[4]"), std::string::npos) << message;

  // Restricted to the model, the extra tensors vanish from the list and cannot be read.
  const auto restricted = restrict_checkpoint(std::make_unique<ListedCheckpoint>(more.tensors()), model);
  EXPECT_EQ(restricted->tensors(), model);
  EXPECT_EQ(restricted->source(), "listed.safetensors");
  char value = 0;
  restricted->read_box("a.bias", Box::whole(Shape{4}), &value);
  EXPECT_EQ(value, 'a');
  message = expect_error([&] { restricted->read_box("extra.0.w", Box::whole(Shape{1}), &value); }, ErrorCode::kNotFound);
  EXPECT_NE(message.find("extra.0.w"), std::string::npos) << message;
}

TEST(ModelConfig, CompactNamesMergeRunsOfTheLastNumber) {
  std::vector<std::string> names;
  for (int e = 0; e < 4; ++e) names.push_back("model.layers.61.mlp.experts." + std::to_string(e) + ".up_proj.weight");
  names.push_back("model.layers.61.enorm.weight");
  names.push_back("model.layers.62.enorm.weight");
  names.push_back("lm_head.weight");
  for (const int e : {9, 7, 3, 8}) names.push_back("x." + std::to_string(e) + ".w");
  names.push_back("v.007.w");  // leading zeros: not merged, so nothing is lost
  EXPECT_EQ(compact_names(names),
            "model.layers.61.mlp.experts.{0..3}.up_proj.weight, model.layers.{61,62}.enorm.weight, lm_head.weight, "
            "x.{3,7..9}.w, v.007.w");
  EXPECT_EQ(compact_names({}), "");
  EXPECT_EQ(compact_names({"only.5.one"}), "only.5.one");
}

const char* kSmallQwenMoe = R"({"name":"SmallMoe","model_type":"qwen3_moe","hidden_size":32,"num_hidden_layers":6,
  "num_attention_heads":4,"num_key_value_heads":2,"intermediate_size":48,"moe_intermediate_size":8,"num_experts":4,
  "decoder_sparse_step":2,"mlp_only_layers":[3],"vocab_size":100,"tie_word_embeddings":true,"torch_dtype":"float16"})";

TEST(ModelConfig, Qwen3MoeSparseStepAndMlpOnlyLayers) {
  const ModelConfig config = parse_model_config(kSmallQwenMoe, "inline");
  EXPECT_EQ(config.dtype, DType::kF16);
  EXPECT_EQ(config.head_dim, 8);  // hidden / heads when absent
  // transformers: MoE when (i + 1) % step == 0 and i not in mlp_only_layers.
  const std::vector<bool> expected = {false, true, false, false, false, true};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(config.is_moe_layer(i), expected[i]) << "layer " << i;
  const std::vector<TensorInfo> tensors = model_tensors(config);
  const auto shapes = shapes_of(tensors);
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (Shape{48, 32}));
  EXPECT_EQ(shapes.at("model.layers.1.mlp.experts.3.down_proj.weight"), (Shape{32, 8}));
  EXPECT_TRUE(shapes.contains("model.layers.3.mlp.up_proj.weight"));
  EXPECT_FALSE(shapes.contains("lm_head.weight"));  // tied to the embedding
  EXPECT_EQ(tensors.back().name, "model.norm.weight");
  for (const TensorInfo& t : tensors) EXPECT_EQ(t.dtype, DType::kF16);
  // 2 MoE layers: 8 attention/norm + 1 gate + 12 expert tensors; 4 dense layers: 8 + 3.
  EXPECT_EQ(tensors.size(), 1u + 2 * (8 + 1 + 12) + 4 * (8 + 3) + 1);
}

TEST(ModelConfig, DeepseekMoeLayerFreqAndDenseFirst) {
  const char* text = R"({"model_type":"deepseek_v3","hidden_size":16,"num_hidden_layers":6,"num_attention_heads":2,
    "intermediate_size":24,"moe_intermediate_size":8,"n_routed_experts":4,"n_shared_experts":null,"first_k_dense_replace":2,
    "moe_layer_freq":2,"vocab_size":50,"q_lora_rank":null,"kv_lora_rank":4,"qk_nope_head_dim":2,"qk_rope_head_dim":2,
    "v_head_dim":2,"torch_dtype":"bfloat16"})";
  const ModelConfig config = parse_model_config(text, "inline");
  EXPECT_EQ(config.name, "deepseek_v3");  // no "name": the model_type
  const std::vector<bool> expected = {false, false, true, false, true, false};
  for (std::int64_t i = 0; i < 6; ++i) EXPECT_EQ(config.is_moe_layer(i), expected[i]) << "layer " << i;
  const auto shapes = shapes_of(model_tensors(config));
  EXPECT_TRUE(shapes.contains("model.layers.2.mlp.gate.e_score_correction_bias"));
  EXPECT_FALSE(shapes.contains("model.layers.2.mlp.shared_experts.gate_proj.weight"));  // no shared experts
  EXPECT_TRUE(shapes.contains("model.layers.3.mlp.gate_proj.weight"));
  EXPECT_TRUE(shapes.contains("lm_head.weight"));
}

TEST(ModelConfig, ErrorsNameTheProblem) {
  expect_error([] { parse_model_config(R"({"model_type":"llama","hidden_size":8})", "cfg.json"); },
               ErrorCode::kInvalidArgument, {"llama", "cfg.json"});
  expect_error([] { parse_model_config(R"({"model_type":"qwen3","num_hidden_layers":2})", "cfg.json"); },
               ErrorCode::kInvalidArgument, {"hidden_size", "cfg.json"});
  std::string message;

  message = expect_error([] {
    parse_model_config(R"({"model_type":"qwen3","hidden_size":"big","num_hidden_layers":2})", "cfg.json");
  }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("hidden_size"), std::string::npos) << message;

  message = expect_error([] { parse_model_config("{not json", "broken.json"); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("broken.json"), std::string::npos) << message;

  message = expect_error([] {
    parse_model_config(R"({"model_type":"qwen3","hidden_size":8,"num_hidden_layers":2,"num_attention_heads":2,
      "intermediate_size":8,"vocab_size":10,"torch_dtype":"complex64"})", "cfg.json");
  }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("complex64"), std::string::npos) << message;

  message = expect_error([] {
    parse_model_config(R"({"model_type":"deepseek_v3","hidden_size":8,"num_hidden_layers":2,"num_attention_heads":2,
      "intermediate_size":8,"vocab_size":10,"kv_lora_rank":4,"qk_nope_head_dim":2,"qk_rope_head_dim":2,"v_head_dim":2})",
                       "cfg.json");
  }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("q_lora_rank"), std::string::npos) << message;

  ModelConfig unknown = load_named_model_config("qwen3-32b");
  unknown.model_type = "mamba";
  message = expect_error([&] { model_tensors(unknown); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("mamba"), std::string::npos) << message;
}

TEST(ScaleModel, TinyKeepsStructure) {
  for (const std::string& model : kShippedModels) {
    SCOPED_TRACE(model);
    const ModelConfig full = load_named_model_config(model);
    const ModelConfig tiny = scale_model(full);
    EXPECT_EQ(tiny.name, full.name + "-tiny");
    EXPECT_EQ(tiny.model_type, full.model_type);
    EXPECT_EQ(tiny.dtype, full.dtype);
    EXPECT_FALSE(tiny.expected_total_params.has_value());
    EXPECT_FALSE(tiny.expected_weight_tensors.has_value());
    EXPECT_EQ(tiny.num_attention_heads, full.num_attention_heads);
    EXPECT_EQ(tiny.num_key_value_heads, full.num_key_value_heads);
    EXPECT_EQ(tiny.num_hidden_layers, 4);
    EXPECT_EQ(tiny.hidden_size, 64);
    EXPECT_EQ(tiny.vocab_size, 1000);
    EXPECT_NE(tiny.vocab_size % 64, 0);
    EXPECT_EQ(tiny.n_shared_experts, full.n_shared_experts);
    EXPECT_EQ(tiny.first_k_dense_replace, full.first_k_dense_replace);
    EXPECT_EQ(tiny.q_lora_rank.has_value(), full.q_lora_rank.has_value());
    EXPECT_EQ(tiny.is_moe(), full.is_moe());
    if (full.is_moe()) {
      EXPECT_EQ(tiny.num_experts, std::min<std::int64_t>(full.num_experts, 64));
      EXPECT_GE(tiny.num_experts, 32);
      EXPECT_EQ(tiny.moe_intermediate_size % 8, 0);
      EXPECT_EQ(tiny.moe_intermediate_size % 2, 0);
    }
    if (full.is_mla()) {
      EXPECT_LE(tiny.qk_nope_head_dim + tiny.qk_rope_head_dim, 8);
      EXPECT_LE(tiny.v_head_dim, 8);
    } else {
      EXPECT_LE(tiny.head_dim, 8);
    }
    // Divisible by the presets' parallel degrees: rollout TP up to 32, trainer TP up to 8.
    EXPECT_EQ(tiny.hidden_size % 32, 0);
    if (tiny.intermediate_size > 0) {
      EXPECT_EQ(tiny.intermediate_size % 32, 0);
    }

    const std::vector<TensorInfo> full_tensors = model_tensors(full);
    const std::vector<TensorInfo> tiny_tensors = model_tensors(tiny);
    EXPECT_EQ(layer_structure(tiny_tensors, 0), layer_structure(full_tensors, 0));
    EXPECT_EQ(layer_structure(tiny_tensors, tiny.num_hidden_layers - 1),
              layer_structure(full_tensors, full.num_hidden_layers - 1));
    EXPECT_EQ(tiny_tensors.front().name, full_tensors.front().name);
    EXPECT_EQ(tiny_tensors.back().name, full_tensors.back().name);
    // Small enough to hold every worker of the largest deployment in one process.
    EXPECT_LT(total_bytes(tiny_tensors), 4u << 20) << total_bytes(tiny_tensors);
  }
}

TEST(ScaleModel, TinySizes) {
  // Exact sizes, so an accidental change to the tiny variant (which tests and fixtures rely on) shows.
  const std::map<std::string, std::pair<std::int64_t, std::size_t>> expected = {
      // model: {params, tensors}
      {"kimi-k2-instruct", {871'776, 633}},
      {"moonlight-16b-a3b", {815'392, 625}},
      {"qwen3-235b-a22b", {1'070'688, 807}},
      {"qwen3-30b-a3b", {1'005'152, 807}},
      {"qwen3-32b", {349'792, 47}},
  };
  for (const auto& [model, counts] : expected) {
    SCOPED_TRACE(model);
    const std::vector<TensorInfo> tensors = model_tensors(scale_model(load_named_model_config(model)));
    EXPECT_EQ(total_params(tensors), counts.first);
    EXPECT_EQ(tensors.size(), counts.second);
  }
}

TEST(ScaleModel, KimiTinyShapes) {
  const ModelConfig tiny = scale_model(load_named_model_config("kimi-k2-instruct"));
  const auto shapes = shapes_of(model_tensors(tiny));
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (Shape{1000, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_a_proj.weight"), (Shape{16, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.q_b_proj.weight"), (Shape{64 * 6, 16}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.kv_a_proj_with_mqa.weight"), (Shape{10, 64}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.kv_b_proj.weight"), (Shape{64 * 8, 8}));
  EXPECT_EQ(shapes.at("model.layers.0.self_attn.o_proj.weight"), (Shape{64, 64 * 4}));
  EXPECT_EQ(shapes.at("model.layers.0.mlp.gate_proj.weight"), (Shape{96, 64}));
  EXPECT_EQ(shapes.at("model.layers.3.mlp.experts.63.gate_proj.weight"), (Shape{16, 64}));
  EXPECT_EQ(shapes.at("model.layers.3.mlp.shared_experts.down_proj.weight"), (Shape{64, 16}));
  EXPECT_FALSE(shapes.contains("model.layers.3.mlp.experts.64.gate_proj.weight"));
  EXPECT_FALSE(shapes.contains("model.layers.4.input_layernorm.weight"));
}

TEST(ScaleModel, OptionsOverride) {
  const ModelConfig full = load_named_model_config("qwen3-30b-a3b");
  ScaleOptions options;
  options.num_layers = 2;
  options.num_experts = 8;
  options.hidden_size = 32;
  options.vocab_size = 77;
  const ModelConfig tiny = scale_model(full, options);
  EXPECT_EQ(tiny.num_hidden_layers, 2);
  EXPECT_EQ(tiny.num_experts, 8);
  EXPECT_EQ(tiny.hidden_size, 32);
  EXPECT_EQ(tiny.vocab_size, 77);
  const auto shapes = shapes_of(model_tensors(tiny));
  EXPECT_EQ(shapes.at("model.embed_tokens.weight"), (Shape{77, 32}));
  EXPECT_TRUE(shapes.contains("model.layers.1.mlp.experts.7.up_proj.weight"));
  EXPECT_FALSE(shapes.contains("model.layers.1.mlp.experts.8.up_proj.weight"));

  ScaleOptions too_few;
  too_few.num_layers = 1;  // Kimi's first layer is dense: no MoE layer would remain
  const std::string message =
      expect_error([&] { scale_model(load_named_model_config("kimi-k2-instruct"), too_few); }, ErrorCode::kInvalidArgument);
  EXPECT_NE(message.find("first_k_dense_replace"), std::string::npos) << message;

  ScaleOptions experts;
  experts.num_experts = 4;
  EXPECT_THROW(scale_model(load_named_model_config("qwen3-32b"), experts), Error);  // dense model
}

TEST(ScaleModel, KeepsSmallExpertCounts) {
  // Moonlight has 64 experts: kept. Fewer than 32 stay as they are too (only > 64 shrinks).
  EXPECT_EQ(scale_model(load_named_model_config("moonlight-16b-a3b")).num_experts, 64);
  const ModelConfig small = parse_model_config(kSmallQwenMoe, "inline");
  const ModelConfig tiny = scale_model(small);
  EXPECT_EQ(tiny.num_experts, 4);
  EXPECT_EQ(tiny.mlp_only_layers, (std::vector<std::int64_t>{3}));
  EXPECT_TRUE(tiny.tie_word_embeddings);
  EXPECT_EQ(tiny.decoder_sparse_step, 2);
}

}  // namespace
}  // namespace wb::emu

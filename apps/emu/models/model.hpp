// Real model architectures: the tensor list of a Hugging Face checkpoint derived from its config.json.
// Model knowledge lives here, outside the library.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "weightbridge/checkpoint.hpp"

namespace wb::emu {

/// The hyper-parameters of a config.json that decide the tensor list. Families: "qwen3" (dense),
/// "qwen3_moe", "deepseek_v3" and "kimi_k2" (MLA attention, shared experts, dense first layers).
struct ModelConfig {
  std::string name;        // "Qwen3-30B-A3B" (the config's "name", else its model_type)
  std::string model_type;  // qwen3 | qwen3_moe | deepseek_v3 | kimi_k2
  DType dtype = DType::kBF16;  // torch_dtype: every tensor's, except those tensor_dtypes names

  /// Tensors kept in another dtype than torch_dtype, as real checkpoints keep them (DeepSeek-V3's
  /// router correction bias is float32): a name suffix ("mlp.gate.e_score_correction_bias") and its
  /// dtype. Config key "tensor_dtypes": {"suffix": "float32", ...}. A suffix matches a whole name or
  /// the part after a '.'.
  std::vector<std::pair<std::string, DType>> tensor_dtypes;
  /// The dtype of the checkpoint tensor (or of a parameter named like one) `name`.
  DType dtype_of(std::string_view name) const;

  std::int64_t hidden_size = 0;
  std::int64_t num_hidden_layers = 0;
  std::int64_t num_attention_heads = 0;
  std::int64_t num_key_value_heads = 0;
  std::int64_t head_dim = 0;  // qwen3*: config head_dim (default hidden/heads)
  std::int64_t intermediate_size = 0;  // dense MLP width
  std::int64_t vocab_size = 0;
  bool tie_word_embeddings = false;

  // Mixture of experts (num_experts == 0: dense model).
  std::int64_t num_experts = 0;  // num_experts (qwen3_moe) or n_routed_experts (deepseek)
  std::int64_t moe_intermediate_size = 0;
  std::int64_t n_shared_experts = 0;
  std::int64_t first_k_dense_replace = 0;  // deepseek: layers < k are dense
  std::int64_t moe_layer_freq = 1;         // deepseek
  std::int64_t decoder_sparse_step = 1;    // qwen3_moe
  std::vector<std::int64_t> mlp_only_layers;  // qwen3_moe: these layers are dense

  // Multi-head latent attention (deepseek_v3, kimi_k2).
  std::optional<std::int64_t> q_lora_rank;  // null: plain q_proj
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t qk_rope_head_dim = 0;
  std::int64_t v_head_dim = 0;
  /// Multi-token-prediction layers (deepseek_v3): their tensors sit in real checkpoint files after the
  /// last decoder layer, but the transformers model (and so every worker here) does not load them.
  std::int64_t num_nextn_predict_layers = 0;

  // What the generated tensor list must reproduce, when the config says so.
  std::optional<std::int64_t> expected_total_params;
  std::optional<std::int64_t> expected_weight_tensors;

  bool is_mla() const { return model_type == "deepseek_v3" || model_type == "kimi_k2"; }
  bool is_moe() const { return num_experts > 0; }
  /// True when layer `layer` has routed experts (false for every layer of a dense model).
  bool is_moe_layer(std::int64_t layer) const;
};

/// Parses a config.json (throws wb::Error naming the file and the missing or bad key).
ModelConfig load_model_config(const std::string& path);
ModelConfig parse_model_config(const std::string& json_text, const std::string& origin);

/// Every weight tensor of the checkpoint, Hugging Face names and shapes, in the checkpoint's natural
/// order (embedding, layers in order, final norm, head).
std::vector<TensorInfo> model_tensors(const ModelConfig& config);

/// The tensors a checkpoint file of this model holds: model_tensors, then the multi-token-prediction
/// layers (num_nextn_predict_layers), as the released DeepSeek-V3 files hold them.
std::vector<TensorInfo> checkpoint_tensors(const ModelConfig& config);

/// Checks that `checkpoint` holds every tensor in `needed` (the model's) with the same dtype and shape;
/// throws kInvalidArgument naming the file, the tensor and both dtypes and shapes otherwise. Returns
/// the names of the checkpoint's tensors that are not needed, in file order: loading ignores them.
std::vector<std::string> check_checkpoint_holds(const std::vector<TensorInfo>& needed, const std::string& model_name,
                                                const CheckpointReader& checkpoint);

/// A reader that lists only `tensors` (the model's, in the model's order) and reads them from
/// `checkpoint`, which must hold them (check_checkpoint_holds): every consumer (the probe, the planner,
/// coverage checks) then sees exactly the model, whatever else the file holds.
std::unique_ptr<CheckpointReader> restrict_checkpoint(std::unique_ptr<CheckpointReader> checkpoint,
                                                      std::vector<TensorInfo> tensors);

/// `names` joined with ", ", names that differ only in their last number merged into one entry:
/// "model.layers.3.mlp.experts.{0..255}.up_proj.weight" (runs as a..b, others listed: {1,4..6}).
std::string compact_names(const std::vector<std::string>& names);

/// Sizes for a scaled-down variant of the same architecture: the same families, naming and structure
/// (head counts, GQA ratio, MLA ranks, shared experts, dense first layers), smaller numbers. Unset
/// fields keep a size derived from "tiny".
struct ScaleOptions {
  std::optional<std::int64_t> num_layers;
  std::optional<std::int64_t> num_experts;
  std::optional<std::int64_t> hidden_size;
  std::optional<std::int64_t> vocab_size;
  /// Expert width (default 16). Shared experts (n_shared × this) are split over the rollout's whole TP,
  /// so a deployment with rollout TP 32 needs 32 here.
  std::optional<std::int64_t> moe_intermediate_size;
  /// Attention head width of a non-MLA model (default 4): FP8 engines sharding q/k/v over TP in
  /// 128-row blocks need heads of 64 or more.
  std::optional<std::int64_t> head_dim;
};

/// The "tiny" variant: small enough that a test can hold every worker of the paper's largest
/// deployment in one process, yet still divisible by the parallel degrees of the presets (attention
/// heads and KV heads as in the original; experts at most 64 and at least 32; hidden 64; head dims 8 or
/// less; vocab not a multiple of 64, so padding appears). Name gets a "-tiny" suffix.
ModelConfig scale_model(const ModelConfig& config, const ScaleOptions& options = {});

/// Directory of the model configs shipped with the project (apps/emu/models/configs), set at build time.
std::string model_config_directory();
/// Loads a shipped config by its file stem ("qwen3-30b-a3b") or a path to a config.json.
ModelConfig load_named_model_config(const std::string& name_or_path);

}  // namespace wb::emu

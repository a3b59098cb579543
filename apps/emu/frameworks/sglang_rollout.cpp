// The emulated SGLang-style rollout worker: one GPU rank of an inference engine.
//
// Parameters follow SGLang's names and fusions (qkv_proj, gate_up_proj, fused MoE w13/w2, MLA's fused
// q_a/kv_a projection and the absorbed w_kc/w_vc copies), sharded as SGLang shards them: vocabulary and
// dense MLPs over the engine's full TP, attention over the attention-TP group (DP attention replicates it),
// routed experts over EP with expert-TP inside. load_weights narrows each checkpoint tensor for this rank
// and copies it into its slot; export_weights is written separately from it on purpose (see backend.hpp),
// so the round trip in the tests checks one against the other.
//
// An FP8 engine (spec fp8=BLOCK) holds its linear weights in float8_e4m3fn with a float32
// `<parameter>_scale_inv` beside each, loaded as vLLM's and SGLang's Fp8LinearMethod / Fp8MoEMethod load
// them from an FP8 checkpoint: the same shards of the fp8 weights, and each shard's block scales in scale
// units (fp8_engine.hpp). Embeddings, the head, norms and router gates stay as they are. With MLA it
// holds kv_b_proj in fp8 with its scales, as vLLM's DeepSeek loader does: w_kc / w_vc are then not
// parameters but the engine's dequantization of kv_b_proj after each load (vLLM's W_UK / W_UV,
// SGLang's post_load_weights), arithmetic outside the transfer.
#include <algorithm>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/fp8_engine.hpp"
#include "emu/frameworks/load_util.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using i64 = std::int64_t;

std::string layer_prefix(i64 layer) { return "model.layers." + std::to_string(layer) + "."; }

std::string fraction(i64 index, i64 count) { return std::to_string(index) + "/" + std::to_string(count); }

/// Element `index` of `axis`, with that axis dropped (a per-head or per-expert slice of a stacked tensor).
TensorView select(const TensorView& view, int axis, i64 index) {
  TensorView out = view.narrow(axis, index, 1);
  out.shape.erase(out.shape.begin() + axis);
  out.strides.erase(out.strides.begin() + axis);
  return out;
}

Box make_box(Shape offset, Shape extent) {
  Box box;
  box.offset = std::move(offset);
  box.extent = std::move(extent);
  return box;
}

class SGLangRolloutWorker final : public EmulatedWorker {
 public:
  SGLangRolloutWorker(const ModelConfig& model, const RolloutSpec& spec, int rank);

  std::string describe() const override;
  void load_weights(const CheckpointReader& checkpoint, const ParameterSet& params) const override;
  std::vector<CheckpointPiece> export_weights(const ParameterSet& params) const override;

 private:
  void check_layout() const;
  void require(bool ok, const std::string& what) const;
  // Each parameter in its checkpoint tensor's dtype where the names agree (the router's correction bias).
  void declare(std::string name, Shape shape) {
    const DType dtype = model_.dtype_of(name);
    parameters_.push_back({std::move(name), dtype, std::move(shape)});
  }
  // A linear layer's weight, filled from checkpoint tensor `source` (one of those it fuses): in an FP8
  // engine, fp8 with its scales when the form quantizes `source`.
  void declare_linear(std::string name, Shape shape, const std::string& source, bool transposed = false);
  void declare_parameters();

  // A weight parameter viewed with the checkpoint's rows and columns as its last two axes, and its scales
  // viewed the same way (none for a weight kept in BF16).
  struct Linear {
    TensorView weight;
    std::optional<TensorView> scales;
  };
  Linear linear(const ParameterSet& params, const std::string& name, bool transposed = false) const;
  // load_box of a weight shard into `piece` (a view into linear.weight), and its block scales with it.
  void load_weight(const CheckpointReader& ckpt, const std::string& tensor, const Box& box, const Linear& linear,
                   const TensorView& piece) const;
  // The scale pieces of the weight pieces in `out`.
  void export_scales(std::vector<CheckpointPiece>& out, const ParameterSet& params) const;

  void load_vocab(const CheckpointReader& ckpt, const std::string& tensor, const TensorView& param) const;
  void load_attention(const CheckpointReader& ckpt, const ParameterSet& params, const std::string& p) const;
  void load_mla(const CheckpointReader& ckpt, const ParameterSet& params, const std::string& p) const;
  void load_dense_mlp(const CheckpointReader& ckpt, const ParameterSet& params, const std::string& hf,
                      const std::string& ours, i64 rows) const;
  void load_experts(const CheckpointReader& ckpt, const ParameterSet& params, const std::string& p) const;

  void export_vocab(std::vector<CheckpointPiece>& out, const std::string& tensor, const TensorView& param) const;
  void export_attention(std::vector<CheckpointPiece>& out, const ParameterSet& params, const std::string& p) const;
  void export_mla(std::vector<CheckpointPiece>& out, const ParameterSet& params, const std::string& p) const;
  void export_dense_mlp(std::vector<CheckpointPiece>& out, const ParameterSet& params, const std::string& hf,
                        const std::string& ours, i64 rows) const;
  void export_experts(std::vector<CheckpointPiece>& out, const ParameterSet& params, const std::string& p) const;

  RolloutSpec spec_;
  int rank_ = 0;
  // Where this rank sits in its engine.
  int engine_ = 0, tp_rank_ = 0;
  int attn_tp_ = 1, attn_tp_rank_ = 0;
  int moe_tp_ = 1, moe_tp_rank_ = 0, ep_rank_ = 0;
  // Derived sizes (model dims per rank).
  i64 vocab_rows_ = 0;    // Vp / tp
  i64 heads_ = 0;         // attention heads of this rank
  i64 kv_heads_ = 0;      // KV heads of this rank (1 when replicated)
  i64 kv_head_start_ = 0; // first KV head of this rank
  i64 local_experts_ = 0;
  // FP8 engines: the form's config, its quantized tensors' shapes, the parameters held in fp8 (stored
  // transposed or not).
  std::optional<layout::QuantizationConfig> quant_;
  std::map<std::string, Shape> quantized_tensors_;
  std::map<std::string, bool> fp8_parameters_;
};

SGLangRolloutWorker::SGLangRolloutWorker(const ModelConfig& model, const RolloutSpec& spec, int rank)
    : EmulatedWorker(WorkerRole::kRollout, model), spec_(spec), rank_(rank) {
  check_layout();
  if (spec_.fp8()) {
    const layout::Fp8Form form = engine_form(model_, spec_);
    quant_ = form.config;
    loads_fp8_form_ = true;
    for (std::size_t t = 0; t < form.tensors.size(); ++t)
      if (form.sources[t].role == layout::FormRole::kQuantized) quantized_tensors_[form.tensors[t].name] = form.tensors[t].shape;
  }
  declare_parameters();
}

void SGLangRolloutWorker::require(bool ok, const std::string& what) const {
  if (!ok)
    throw Error(ErrorCode::kInvalidArgument,
                "rollout spec '" + spec_.to_string() + "' for model " + model_.name + ": " + what);
}

void SGLangRolloutWorker::check_layout() const {
  require(spec_.engines >= 1 && spec_.tp >= 1 && spec_.ep >= 1 && spec_.dp_attn >= 1,
          "engines, tp, ep and dp_attn must be positive");
  require(rank_ >= 0 && rank_ < spec_.world_size(),
          "rollout rank " + std::to_string(rank_) + " outside [0, " + std::to_string(spec_.world_size()) + ")");
  require(spec_.tp % spec_.dp_attn == 0, "dp_attn " + std::to_string(spec_.dp_attn) + " does not divide tp " +
                                             std::to_string(spec_.tp));
  require(spec_.tp % spec_.ep == 0,
          "ep " + std::to_string(spec_.ep) + " does not divide tp " + std::to_string(spec_.tp));
  require(model_.vocab_size > 0 && model_.hidden_size > 0 && model_.num_hidden_layers > 0 &&
              model_.num_attention_heads > 0,
          "vocab_size, hidden_size, num_hidden_layers and num_attention_heads must be positive");
  const i64 tp = spec_.tp, attn_tp = spec_.tp / spec_.dp_attn, moe_tp = spec_.tp / spec_.ep;
  const i64 nh = model_.num_attention_heads;
  require(nh % attn_tp == 0, "num_attention_heads " + std::to_string(nh) + " is not divisible by attention TP " +
                                 std::to_string(attn_tp));
  if (!model_.is_mla()) {
    const i64 nkv = model_.num_key_value_heads;
    require(nkv > 0 && model_.head_dim > 0, "num_key_value_heads and head_dim must be positive");
    if (attn_tp <= nkv)
      require(nkv % attn_tp == 0, "num_key_value_heads " + std::to_string(nkv) +
                                      " is not divisible by attention TP " + std::to_string(attn_tp));
    else
      require(attn_tp % nkv == 0, "attention TP " + std::to_string(attn_tp) +
                                      " is not a multiple of num_key_value_heads " + std::to_string(nkv) +
                                      " (KV heads can only be replicated evenly)");
  }
  bool dense = false, moe = false;
  for (i64 layer = 0; layer < model_.num_hidden_layers; ++layer) (model_.is_moe_layer(layer) ? moe : dense) = true;
  if (dense)
    require(model_.intermediate_size % tp == 0, "intermediate_size " + std::to_string(model_.intermediate_size) +
                                                    " is not divisible by tp " + std::to_string(tp));
  if (moe) {
    const i64 experts = model_.num_experts, im = model_.moe_intermediate_size;
    require(experts % spec_.ep == 0, "num_experts " + std::to_string(experts) + " is not divisible by ep " +
                                         std::to_string(spec_.ep));
    require(im % moe_tp == 0, "moe_intermediate_size " + std::to_string(im) + " is not divisible by expert TP " +
                                  std::to_string(moe_tp) + " (tp/ep)");
    const i64 shared = model_.n_shared_experts * im;
    require(shared % tp == 0, "shared experts' intermediate size " + std::to_string(shared) +
                                  " is not divisible by tp " + std::to_string(tp));
  }
}

void SGLangRolloutWorker::declare_parameters() {
  const i64 tp = spec_.tp;
  engine_ = rank_ / spec_.tp;
  tp_rank_ = rank_ % spec_.tp;
  attn_tp_ = spec_.tp / spec_.dp_attn;
  attn_tp_rank_ = tp_rank_ % attn_tp_;
  moe_tp_ = spec_.tp / spec_.ep;
  ep_rank_ = tp_rank_ / moe_tp_;
  moe_tp_rank_ = tp_rank_ % moe_tp_;
  vocab_rows_ = (model_.vocab_size + tp - 1) / tp;  // Vp / tp, Vp the vocabulary padded to a multiple of tp
  heads_ = model_.num_attention_heads / attn_tp_;
  if (!model_.is_mla()) {
    const i64 nkv = model_.num_key_value_heads;
    // SGLang's QKVParallelLinear: more ranks than KV heads replicates each head over attn_tp/nkv ranks.
    kv_heads_ = attn_tp_ <= nkv ? nkv / attn_tp_ : 1;
    kv_head_start_ = attn_tp_ <= nkv ? attn_tp_rank_ * kv_heads_ : attn_tp_rank_ / (attn_tp_ / nkv);
  }
  local_experts_ = model_.is_moe() ? model_.num_experts / spec_.ep : 0;

  const i64 h = model_.hidden_size;
  declare("model.embed_tokens.weight", {vocab_rows_, h});
  for (i64 layer = 0; layer < model_.num_hidden_layers; ++layer) {
    const std::string p = layer_prefix(layer);
    if (model_.is_mla()) {
      const i64 nope = model_.qk_nope_head_dim, rope = model_.qk_rope_head_dim, v = model_.v_head_dim;
      const i64 kv_lora = model_.kv_lora_rank;
      const std::string a = p + "self_attn.";
      if (model_.q_lora_rank) {
        const i64 q_lora = *model_.q_lora_rank;
        declare_linear(a + "fused_qkv_a_proj_with_mqa.weight", {q_lora + kv_lora + rope, h}, a + "q_a_proj.weight");
        declare(a + "q_a_layernorm.weight", {q_lora});
        declare_linear(a + "q_b_proj.weight", {heads_ * (nope + rope), q_lora}, a + "q_b_proj.weight");
      } else {
        declare_linear(a + "q_proj.weight", {heads_ * (nope + rope), h}, a + "q_proj.weight");
        declare_linear(a + "kv_a_proj_with_mqa.weight", {kv_lora + rope, h}, a + "kv_a_proj_with_mqa.weight");
      }
      declare(a + "kv_a_layernorm.weight", {kv_lora});
      declare_linear(a + "kv_b_proj.weight", {heads_ * (nope + v), kv_lora}, a + "kv_b_proj.weight");
      declare_linear(a + "o_proj.weight", {h, heads_ * v}, a + "o_proj.weight");
      if (!fp8_parameters_.count(a + "kv_b_proj.weight")) {  // in FP8: derived after loading (see the top)
        declare(a + "w_kc", {heads_, kv_lora, nope});
        declare(a + "w_vc", {heads_, v, kv_lora});
      }
    } else {
      const i64 hd = model_.head_dim;
      declare_linear(p + "self_attn.qkv_proj.weight", {(heads_ + 2 * kv_heads_) * hd, h}, p + "self_attn.q_proj.weight");
      declare_linear(p + "self_attn.o_proj.weight", {h, heads_ * hd}, p + "self_attn.o_proj.weight");
      declare(p + "self_attn.q_norm.weight", {hd});
      declare(p + "self_attn.k_norm.weight", {hd});
    }
    declare(p + "input_layernorm.weight", {h});
    declare(p + "post_attention_layernorm.weight", {h});
    if (!model_.is_moe_layer(layer)) {
      const i64 rows = model_.intermediate_size / tp;
      declare_linear(p + "mlp.gate_up_proj.weight", {2 * rows, h}, p + "mlp.gate_proj.weight");
      declare_linear(p + "mlp.down_proj.weight", {h, rows}, p + "mlp.down_proj.weight");
      continue;
    }
    const i64 experts = model_.num_experts, rows = model_.moe_intermediate_size / moe_tp_;
    declare(p + "mlp.gate.weight", {experts, h});
    if (model_.is_mla()) declare(p + "mlp.gate.e_score_correction_bias", {experts});
    const std::string expert = p + "mlp.experts." + std::to_string(ep_rank_ * local_experts_) + ".";
    const bool t = spec_.transpose_experts;
    declare_linear(p + "mlp.experts.w13_weight", t ? Shape{local_experts_, h, 2 * rows} : Shape{local_experts_, 2 * rows, h},
                   expert + "gate_proj.weight", t);
    declare_linear(p + "mlp.experts.w2_weight", t ? Shape{local_experts_, rows, h} : Shape{local_experts_, h, rows},
                   expert + "down_proj.weight", t);
    if (model_.n_shared_experts > 0) {
      const i64 shared_rows = model_.n_shared_experts * model_.moe_intermediate_size / tp;
      declare_linear(p + "mlp.shared_experts.gate_up_proj.weight", {2 * shared_rows, h},
                     p + "mlp.shared_experts.gate_proj.weight");
      declare_linear(p + "mlp.shared_experts.down_proj.weight", {h, shared_rows}, p + "mlp.shared_experts.down_proj.weight");
    }
  }
  declare("model.norm.weight", {h});
  declare("lm_head.weight", {vocab_rows_, h});
}

void SGLangRolloutWorker::declare_linear(std::string name, Shape shape, const std::string& source, bool transposed) {
  if (!quant_ || !quantized_tensors_.count(source)) return declare(std::move(name), std::move(shape));
  const std::size_t n = shape.size();
  Shape logical = shape;
  if (transposed) std::swap(logical[n - 2], logical[n - 1]);
  Shape scales = scale_parameter_shape(logical, *quant_);
  if (transposed) std::swap(scales[n - 2], scales[n - 1]);
  fp8_parameters_[name] = transposed;
  parameters_.push_back({name, DType::kF8E4M3, std::move(shape)});
  parameters_.push_back({name + quant_->scale_suffix, DType::kF32, std::move(scales)});
}

SGLangRolloutWorker::Linear SGLangRolloutWorker::linear(const ParameterSet& params, const std::string& name,
                                                        bool transposed) const {
  Linear out{params.at(name).view, std::nullopt};
  if (fp8_parameters_.count(name)) out.scales = params.at(name + quant_->scale_suffix).view;
  if (transposed) {  // stored [..., in, out]: viewed back as [..., out, in]
    const int n = out.weight.ndim();
    out.weight = out.weight.transpose(n - 2, n - 1);
    if (out.scales) out.scales = out.scales->transpose(n - 2, n - 1);
  }
  return out;
}

void SGLangRolloutWorker::load_weight(const CheckpointReader& ckpt, const std::string& tensor, const Box& box,
                                      const Linear& linear, const TensorView& piece) const {
  load_box(ckpt, tensor, box, piece);
  if (!linear.scales) return;
  const auto shape = quantized_tensors_.find(tensor);
  if (shape == quantized_tensors_.end())
    throw Error(ErrorCode::kInvalidArgument, describe() + ": " + tensor + " is not quantized in the engine's form, "
                                                 "but it is fused into an fp8 parameter");
  const ScalePiece scales = locate_scales(describe(), tensor, shape->second, box, linear.weight, *linear.scales, piece, *quant_);
  load_box(ckpt, tensor + quant_->scale_suffix, scales.box, scales.view);
}

void SGLangRolloutWorker::export_scales(std::vector<CheckpointPiece>& out, const ParameterSet& params) const {
  if (!quant_) return;
  // Each fp8 parameter's address range, to find the parameter a weight piece points into.
  std::map<const std::byte*, std::pair<const std::byte*, std::string>> ranges;
  for (const auto& [name, transposed] : fp8_parameters_) {
    const TensorView& view = params.at(name).view;
    const auto* begin = static_cast<const std::byte*>(view.data);
    ranges.emplace(begin, std::make_pair(begin + view.nbytes(), name));
  }
  const std::size_t weights = out.size();
  for (std::size_t i = 0; i < weights; ++i) {
    const CheckpointPiece piece = out[i];
    const auto shape = quantized_tensors_.find(piece.tensor);
    if (shape == quantized_tensors_.end()) continue;
    const auto* at = static_cast<const std::byte*>(piece.view.data);
    auto range = ranges.upper_bound(at);
    if (range == ranges.begin() || at >= std::prev(range)->second.first)
      throw Error(ErrorCode::kInternal, describe() + ": the exported piece of " + piece.tensor + " is in no fp8 parameter");
    const std::string& name = std::prev(range)->second.second;
    const Linear lin = linear(params, name, fp8_parameters_.at(name));
    ScalePiece scales = locate_scales(describe(), piece.tensor, shape->second, piece.box, lin.weight, *lin.scales,
                                      piece.view, *quant_);
    out.push_back({piece.tensor + quant_->scale_suffix, std::move(scales.box), std::move(scales.view)});
  }
}

std::string SGLangRolloutWorker::describe() const {
  std::string text = "rollout rank " + std::to_string(rank_) + ": engine " + fraction(engine_, spec_.engines) +
                     " tp " + fraction(tp_rank_, spec_.tp) + " attn_tp " + fraction(attn_tp_rank_, attn_tp_) +
                     " ep " + fraction(ep_rank_, spec_.ep);
  if (moe_tp_ > 1) text += " moe_tp " + fraction(moe_tp_rank_, moe_tp_);
  return text;
}

// ---- load_weights: what SGLang's weight_loader functions do, one load_box per contiguous piece --------

void SGLangRolloutWorker::load_weights(const CheckpointReader& ckpt, const ParameterSet& params) const {
  load_vocab(ckpt, "model.embed_tokens.weight", params.at("model.embed_tokens.weight").view);
  for (i64 layer = 0; layer < model_.num_hidden_layers; ++layer) {
    const std::string p = layer_prefix(layer);
    if (model_.is_mla())
      load_mla(ckpt, params, p);
    else
      load_attention(ckpt, params, p);
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"})
      load_tensor(ckpt, p + norm, params.at(p + norm).view);
    if (!model_.is_moe_layer(layer)) {
      load_dense_mlp(ckpt, params, p + "mlp.", p + "mlp.", model_.intermediate_size / spec_.tp);
      continue;
    }
    load_tensor(ckpt, p + "mlp.gate.weight", params.at(p + "mlp.gate.weight").view);
    if (model_.is_mla())
      load_tensor(ckpt, p + "mlp.gate.e_score_correction_bias", params.at(p + "mlp.gate.e_score_correction_bias").view);
    load_experts(ckpt, params, p);
    if (model_.n_shared_experts > 0)
      load_dense_mlp(ckpt, params, p + "mlp.shared_experts.", p + "mlp.shared_experts.",
                     model_.n_shared_experts * model_.moe_intermediate_size / spec_.tp);
  }
  load_tensor(ckpt, "model.norm.weight", params.at("model.norm.weight").view);
  // Tied embeddings: the checkpoint has no lm_head; SGLang's head then reads the embedding.
  load_vocab(ckpt, model_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
             params.at("lm_head.weight").view);
}

void SGLangRolloutWorker::load_vocab(const CheckpointReader& ckpt, const std::string& tensor,
                                     const TensorView& param) const {
  // VocabParallelEmbedding: rank r holds padded rows [r*Vp/tp, (r+1)*Vp/tp); rows >= vocab stay zero.
  const Shape& shape = ckpt.info(tensor).shape;
  const i64 start = tp_rank_ * vocab_rows_;
  const i64 rows = std::clamp<i64>(shape[0] - start, 0, vocab_rows_);
  if (rows > 0) load_box(ckpt, tensor, row_box(shape, start, rows), param.narrow(0, 0, rows));
}

void SGLangRolloutWorker::load_attention(const CheckpointReader& ckpt, const ParameterSet& params,
                                         const std::string& p) const {
  const i64 hd = model_.head_dim;
  const Linear qkv = linear(params, p + "self_attn.qkv_proj.weight");
  // QKVParallelLinear's weight_loader with shard ids q, k, v: each shard is one row range of its tensor.
  const std::string q = p + "self_attn.q_proj.weight", k = p + "self_attn.k_proj.weight",
                    v = p + "self_attn.v_proj.weight";
  load_weight(ckpt, q, row_box(ckpt.info(q).shape, attn_tp_rank_ * heads_ * hd, heads_ * hd), qkv,
              qkv.weight.narrow(0, 0, heads_ * hd));
  load_weight(ckpt, k, row_box(ckpt.info(k).shape, kv_head_start_ * hd, kv_heads_ * hd), qkv,
              qkv.weight.narrow(0, heads_ * hd, kv_heads_ * hd));
  load_weight(ckpt, v, row_box(ckpt.info(v).shape, kv_head_start_ * hd, kv_heads_ * hd), qkv,
              qkv.weight.narrow(0, (heads_ + kv_heads_) * hd, kv_heads_ * hd));
  // RowParallelLinear: o_proj is split along its input (columns).
  const std::string o = p + "self_attn.o_proj.weight";
  const Linear o_proj = linear(params, o);
  load_weight(ckpt, o, column_box(ckpt.info(o).shape, attn_tp_rank_ * heads_ * hd, heads_ * hd), o_proj, o_proj.weight);
  for (const char* norm : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"})
    load_tensor(ckpt, p + norm, params.at(p + norm).view);
}

void SGLangRolloutWorker::load_mla(const CheckpointReader& ckpt, const ParameterSet& params,
                                   const std::string& p) const {
  const i64 nope = model_.qk_nope_head_dim, rope = model_.qk_rope_head_dim, v = model_.v_head_dim;
  const i64 q_rows = heads_ * (nope + rope);
  const std::string kv_a = p + "self_attn.kv_a_proj_with_mqa.weight";
  const auto whole = [&ckpt](const std::string& tensor) { return Box::whole(ckpt.info(tensor).shape); };
  if (model_.q_lora_rank) {
    // SGLang fuses q_a_proj and kv_a_proj_with_mqa into one replicated matrix (q_a rows first).
    const i64 q_lora = *model_.q_lora_rank;
    const Linear fused = linear(params, p + "self_attn.fused_qkv_a_proj_with_mqa.weight");
    const std::string q_a = p + "self_attn.q_a_proj.weight";
    load_weight(ckpt, q_a, whole(q_a), fused, fused.weight.narrow(0, 0, q_lora));
    load_weight(ckpt, kv_a, whole(kv_a), fused, fused.weight.narrow(0, q_lora, fused.weight.shape[0] - q_lora));
    load_tensor(ckpt, p + "self_attn.q_a_layernorm.weight", params.at(p + "self_attn.q_a_layernorm.weight").view);
    const std::string q_b = p + "self_attn.q_b_proj.weight";
    const Linear q_b_proj = linear(params, q_b);
    load_weight(ckpt, q_b, row_box(ckpt.info(q_b).shape, attn_tp_rank_ * q_rows, q_rows), q_b_proj, q_b_proj.weight);
  } else {
    const std::string q = p + "self_attn.q_proj.weight";
    const Linear q_proj = linear(params, q), kv_a_proj = linear(params, kv_a);
    load_weight(ckpt, q, row_box(ckpt.info(q).shape, attn_tp_rank_ * q_rows, q_rows), q_proj, q_proj.weight);
    load_weight(ckpt, kv_a, whole(kv_a), kv_a_proj, kv_a_proj.weight);
  }
  load_tensor(ckpt, p + "self_attn.kv_a_layernorm.weight", params.at(p + "self_attn.kv_a_layernorm.weight").view);
  const std::string kv_b = p + "self_attn.kv_b_proj.weight";
  const Linear kv_b_proj = linear(params, kv_b);
  load_weight(ckpt, kv_b, row_box(ckpt.info(kv_b).shape, attn_tp_rank_ * heads_ * (nope + v), heads_ * (nope + v)),
              kv_b_proj, kv_b_proj.weight);
  const std::string o = p + "self_attn.o_proj.weight";
  const Linear o_proj = linear(params, o);
  load_weight(ckpt, o, column_box(ckpt.info(o).shape, attn_tp_rank_ * heads_ * v, heads_ * v), o_proj, o_proj.weight);
  if (kv_b_proj.scales) return;  // FP8: w_kc / w_vc are the engine's dequantization of kv_b_proj (see the top)
  const TensorView& kv_b_param = kv_b_proj.weight;
  // SGLang's post_load_weights: w_kc / w_vc are copies of kv_b_proj split per head into its nope and v
  // rows; w_kc is stored transposed ([head, kv_lora, nope]) because the absorbed kernel wants it so.
  const TensorView per_head = kv_b_param.unflatten(0, heads_);  // [heads, nope + v, kv_lora]
  copy_tensor(params.at(p + "self_attn.w_kc").view.transpose(1, 2), per_head.narrow(1, 0, nope));
  copy_tensor(params.at(p + "self_attn.w_vc").view, per_head.narrow(1, nope, v));
}

void SGLangRolloutWorker::load_dense_mlp(const CheckpointReader& ckpt, const ParameterSet& params,
                                         const std::string& hf, const std::string& ours, i64 rows) const {
  // MergedColumnParallelLinear: [gate shard; up shard]; down_proj is row-parallel (columns).
  const Linear gate_up = linear(params, ours + "gate_up_proj.weight"), down_proj = linear(params, ours + "down_proj.weight");
  const std::string gate = hf + "gate_proj.weight", up = hf + "up_proj.weight", down = hf + "down_proj.weight";
  load_weight(ckpt, gate, row_box(ckpt.info(gate).shape, tp_rank_ * rows, rows), gate_up, gate_up.weight.narrow(0, 0, rows));
  load_weight(ckpt, up, row_box(ckpt.info(up).shape, tp_rank_ * rows, rows), gate_up, gate_up.weight.narrow(0, rows, rows));
  load_weight(ckpt, down, column_box(ckpt.info(down).shape, tp_rank_ * rows, rows), down_proj, down_proj.weight);
}

void SGLangRolloutWorker::load_experts(const CheckpointReader& ckpt, const ParameterSet& params,
                                       const std::string& p) const {
  // FusedMoE.weight_loader: local expert e is global expert ep_rank*E/ep + e; w13 = [gate; up] shard of
  // the expert-TP rank, w2 = down_proj's column shard. Transposed storage is viewed back as [out, in].
  const i64 rows = model_.moe_intermediate_size / moe_tp_;
  const Linear w13 = linear(params, p + "mlp.experts.w13_weight", spec_.transpose_experts);
  const Linear w2 = linear(params, p + "mlp.experts.w2_weight", spec_.transpose_experts);
  for (i64 e = 0; e < local_experts_; ++e) {
    const std::string x = p + "mlp.experts." + std::to_string(ep_rank_ * local_experts_ + e) + ".";
    const TensorView w13_e = select(w13.weight, 0, e);
    const std::string gate = x + "gate_proj.weight", up = x + "up_proj.weight", down = x + "down_proj.weight";
    load_weight(ckpt, gate, row_box(ckpt.info(gate).shape, moe_tp_rank_ * rows, rows), w13, w13_e.narrow(0, 0, rows));
    load_weight(ckpt, up, row_box(ckpt.info(up).shape, moe_tp_rank_ * rows, rows), w13, w13_e.narrow(0, rows, rows));
    load_weight(ckpt, down, column_box(ckpt.info(down).shape, moe_tp_rank_ * rows, rows), w2, select(w2.weight, 0, e));
  }
}

// ---- export_weights: SGLang → Hugging Face, written from the parameter side --------------------------

std::vector<CheckpointPiece> SGLangRolloutWorker::export_weights(const ParameterSet& params) const {
  std::vector<CheckpointPiece> out;
  export_vocab(out, "model.embed_tokens.weight", params.at("model.embed_tokens.weight").view);
  for (i64 layer = 0; layer < model_.num_hidden_layers; ++layer) {
    const std::string p = layer_prefix(layer);
    if (model_.is_mla())
      export_mla(out, params, p);
    else
      export_attention(out, params, p);
    for (const char* norm : {"input_layernorm.weight", "post_attention_layernorm.weight"}) {
      const TensorView& view = params.at(p + norm).view;
      out.push_back({p + norm, Box::whole(view.shape), view});
    }
    if (model_.is_moe_layer(layer)) {
      for (const char* replicated : {"mlp.gate.weight", "mlp.gate.e_score_correction_bias"}) {
        const Parameter* param = params.find(p + replicated);
        if (param) out.push_back({p + replicated, Box::whole(param->view.shape), param->view});
      }
      export_experts(out, params, p);
      if (model_.n_shared_experts > 0)
        export_dense_mlp(out, params, p + "mlp.shared_experts.", p + "mlp.shared_experts.",
                         model_.n_shared_experts * model_.moe_intermediate_size);
    } else {
      export_dense_mlp(out, params, p + "mlp.", p + "mlp.", model_.intermediate_size);
    }
  }
  const TensorView& norm = params.at("model.norm.weight").view;
  out.push_back({"model.norm.weight", Box::whole(norm.shape), norm});
  export_vocab(out, model_.tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight",
               params.at("lm_head.weight").view);
  export_scales(out, params);
  return out;
}

void SGLangRolloutWorker::export_vocab(std::vector<CheckpointPiece>& out, const std::string& tensor,
                                       const TensorView& param) const {
  const i64 per_rank = param.shape[0], first = tp_rank_ * per_rank;
  const i64 real = std::min(first + per_rank, model_.vocab_size) - first;  // padding rows are not exported
  if (real > 0) out.push_back({tensor, make_box({first, 0}, {real, param.shape[1]}), param.narrow(0, 0, real)});
}

void SGLangRolloutWorker::export_attention(std::vector<CheckpointPiece>& out, const ParameterSet& params,
                                           const std::string& p) const {
  const i64 hd = model_.head_dim, h = model_.hidden_size;
  const i64 nh = model_.num_attention_heads, nkv = model_.num_key_value_heads;
  const TensorView& qkv = params.at(p + "self_attn.qkv_proj.weight").view;
  // Split the fused rows back: q heads of this rank, then its KV heads (possibly one replicated head).
  const i64 q_heads = nh / attn_tp_;
  const i64 kv_count = (qkv.shape[0] / hd - q_heads) / 2;
  const i64 kv_first = nkv >= attn_tp_ ? attn_tp_rank_ * kv_count : attn_tp_rank_ * nkv / attn_tp_;
  out.push_back({p + "self_attn.q_proj.weight", make_box({attn_tp_rank_ * q_heads * hd, 0}, {q_heads * hd, h}),
                 qkv.narrow(0, 0, q_heads * hd)});
  out.push_back({p + "self_attn.k_proj.weight", make_box({kv_first * hd, 0}, {kv_count * hd, h}),
                 qkv.narrow(0, q_heads * hd, kv_count * hd)});
  out.push_back({p + "self_attn.v_proj.weight", make_box({kv_first * hd, 0}, {kv_count * hd, h}),
                 qkv.narrow(0, (q_heads + kv_count) * hd, kv_count * hd)});
  const TensorView& o = params.at(p + "self_attn.o_proj.weight").view;
  out.push_back({p + "self_attn.o_proj.weight", make_box({0, attn_tp_rank_ * o.shape[1]}, o.shape), o});
  for (const char* norm : {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}) {
    const TensorView& view = params.at(p + norm).view;
    out.push_back({p + norm, Box::whole(view.shape), view});
  }
}

void SGLangRolloutWorker::export_mla(std::vector<CheckpointPiece>& out, const ParameterSet& params,
                                     const std::string& p) const {
  const i64 nope = model_.qk_nope_head_dim, v = model_.v_head_dim, kv_lora = model_.kv_lora_rank;
  auto whole = [&](const std::string& name) {
    const TensorView& view = params.at(p + name).view;
    out.push_back({p + name, Box::whole(view.shape), view});
  };
  auto row_shard = [&](const std::string& name) {  // a head-sharded parameter: rows of this rank's heads
    const TensorView& view = params.at(p + name).view;
    out.push_back({p + name, make_box({attn_tp_rank_ * view.shape[0], 0}, view.shape), view});
  };
  if (model_.q_lora_rank) {
    const TensorView& fused = params.at(p + "self_attn.fused_qkv_a_proj_with_mqa.weight").view;
    const i64 q_lora = *model_.q_lora_rank, kv_rows = fused.shape[0] - q_lora;
    out.push_back({p + "self_attn.q_a_proj.weight", make_box({0, 0}, {q_lora, fused.shape[1]}),
                   fused.narrow(0, 0, q_lora)});
    out.push_back({p + "self_attn.kv_a_proj_with_mqa.weight", make_box({0, 0}, {kv_rows, fused.shape[1]}),
                   fused.narrow(0, q_lora, kv_rows)});
    whole("self_attn.q_a_layernorm.weight");
    row_shard("self_attn.q_b_proj.weight");
  } else {
    row_shard("self_attn.q_proj.weight");
    whole("self_attn.kv_a_proj_with_mqa.weight");
  }
  whole("self_attn.kv_a_layernorm.weight");
  row_shard("self_attn.kv_b_proj.weight");
  const TensorView& o = params.at(p + "self_attn.o_proj.weight").view;
  out.push_back({p + "self_attn.o_proj.weight", make_box({0, attn_tp_rank_ * o.shape[1]}, o.shape), o});
  if (fp8_parameters_.count(p + "self_attn.kv_b_proj.weight")) return;  // FP8: no w_kc / w_vc (see the top)
  // The absorbed copies map back onto kv_b_proj, one head at a time (their rows are not contiguous there).
  const std::string kv_b = p + "self_attn.kv_b_proj.weight";
  const TensorView& w_kc = params.at(p + "self_attn.w_kc").view;  // [heads, kv_lora, nope]
  const TensorView& w_vc = params.at(p + "self_attn.w_vc").view;  // [heads, v, kv_lora]
  for (i64 head = 0; head < w_kc.shape[0]; ++head) {
    const i64 row = (attn_tp_rank_ * w_kc.shape[0] + head) * (nope + v);
    out.push_back({kv_b, make_box({row, 0}, {nope, kv_lora}), select(w_kc, 0, head).transpose(0, 1)});
    out.push_back({kv_b, make_box({row + nope, 0}, {v, kv_lora}), select(w_vc, 0, head)});
  }
}

void SGLangRolloutWorker::export_dense_mlp(std::vector<CheckpointPiece>& out, const ParameterSet& params,
                                           const std::string& hf, const std::string& ours, i64 full) const {
  const TensorView& gate_up = params.at(ours + "gate_up_proj.weight").view;
  const TensorView& down = params.at(ours + "down_proj.weight").view;
  const i64 shard = full / spec_.tp, first = tp_rank_ * shard, h = gate_up.shape[1];
  out.push_back({hf + "gate_proj.weight", make_box({first, 0}, {shard, h}), gate_up.narrow(0, 0, shard)});
  out.push_back({hf + "up_proj.weight", make_box({first, 0}, {shard, h}), gate_up.narrow(0, shard, shard)});
  out.push_back({hf + "down_proj.weight", make_box({0, first}, {down.shape[0], shard}), down});
}

void SGLangRolloutWorker::export_experts(std::vector<CheckpointPiece>& out, const ParameterSet& params,
                                         const std::string& p) const {
  const TensorView& w13 = params.at(p + "mlp.experts.w13_weight").view;
  const TensorView& w2 = params.at(p + "mlp.experts.w2_weight").view;
  const i64 h = model_.hidden_size, shard = model_.moe_intermediate_size / moe_tp_;
  const i64 first_row = moe_tp_rank_ * shard;
  const i64 count = w13.shape[0], first_expert = ep_rank_ * count;
  for (i64 e = 0; e < count; ++e) {
    // [out, in] views of this expert's slices, whichever way the storage is laid out.
    TensorView gate_up = select(w13, 0, e), down = select(w2, 0, e);
    if (spec_.transpose_experts) {
      gate_up = gate_up.transpose(0, 1);
      down = down.transpose(0, 1);
    }
    const std::string x = p + "mlp.experts." + std::to_string(first_expert + e) + ".";
    out.push_back({x + "gate_proj.weight", make_box({first_row, 0}, {shard, h}), gate_up.narrow(0, 0, shard)});
    out.push_back({x + "up_proj.weight", make_box({first_row, 0}, {shard, h}), gate_up.narrow(0, shard, shard)});
    out.push_back({x + "down_proj.weight", make_box({0, first_row}, {h, shard}), down});
  }
}

}  // namespace

std::unique_ptr<EmulatedWorker> make_rollout_worker(const ModelConfig& model, const RolloutSpec& spec, int rank) {
  // A mixed fleet's worker loads its own engine's form.
  return std::make_unique<SGLangRolloutWorker>(model, spec.of_engine(rank / spec.tp), rank);
}

}  // namespace wb::emu

// The emulated Megatron-Core trainer: one GPU rank of a training job with tensor, pipeline, context,
// data and expert parallelism (expert-TP 1), holding its parameters under Megatron-Core names and in
// Megatron's layouts (fused QKV per query group, fused gate/up per TP shard, vocab-parallel embedding
// padded to a multiple of 128*tp, TE-fused layernorms, TEGroupedMLP experts).
//
// load_weights is the HF→Megatron loader: it walks the checkpoint tensors a parameter is built from and
// copies boxes of them into views of the parameter. export_weights is the Megatron→HF converter, written
// the other way round on purpose: it walks each parameter's rows or columns and says which checkpoint
// rows they are. Sharing one table would let a layout bug hide in both; the tests gather all workers
// through export and compare with the checkpoint.
//
// Tied embeddings: with pp=1 Megatron shares the embedding as the output layer, so no output_layer
// parameter exists; with pp>1 the last stage holds its own copy, output_layer.weight, loaded from (and
// exported as) model.embed_tokens.weight.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/load_util.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using i64 = std::int64_t;

std::string str(i64 v) { return std::to_string(v); }

// Megatron's --make-vocab-size-divisible-by default; the padded vocabulary is a multiple of this * tp.
constexpr i64 kVocabDivisor = 128;

constexpr const char* kHfEmbedding = "model.embed_tokens.weight";
constexpr const char* kHfHead = "lm_head.weight";
constexpr const char* kHfFinalNorm = "model.norm.weight";
constexpr const char* kMgEmbedding = "embedding.word_embeddings.weight";
constexpr const char* kMgOutput = "output_layer.weight";
constexpr const char* kMgFinalNorm = "decoder.final_layernorm.weight";

std::string hf_layer(i64 global_layer) { return "model.layers." + str(global_layer) + "."; }
// Megatron numbers layers locally within each pipeline stage.
std::string mg_layer(i64 local_layer) { return "decoder.layers." + str(local_layer) + "."; }

// A run of parameter rows that equals a run of checkpoint rows; tensor empty for padding.
struct RowRun {
  std::string tensor;
  i64 hf_row = 0;
  i64 rows = 0;
};

class MegatronTrainerWorker final : public EmulatedWorker {
 public:
  MegatronTrainerWorker(const ModelConfig& model, const TrainerSpec& spec, int rank);

  std::string describe() const override;
  void load_weights(const CheckpointReader& checkpoint, const ParameterSet& params) const override;
  std::vector<CheckpointPiece> export_weights(const ParameterSet& params) const override;

 private:
  [[noreturn]] void fail(ErrorCode code, const std::string& cause) const;
  void require_divides(i64 divisor, const std::string& divisor_name, i64 value, const std::string& value_name,
                       const std::string& what) const;
  void validate() const;

  bool first_stage() const { return stage_ == 0; }
  bool last_stage() const { return stage_ == spec_.pp - 1; }
  // With tied embeddings and one stage, the embedding doubles as the output layer.
  bool holds_output_layer() const { return last_stage() && !(model_.tie_word_embeddings && spec_.pp == 1); }
  const char* head_tensor() const { return model_.tie_word_embeddings ? kHfEmbedding : kHfHead; }
  bool deepseek_family() const { return model_.is_mla(); }
  // Shared experts exist in the DeepSeek family only (as in the HF model classes).
  bool has_shared_experts() const { return deepseek_family() && model_.n_shared_experts > 0; }
  i64 shared_expert_size() const { return model_.n_shared_experts * model_.moe_intermediate_size; }
  i64 experts_per_rank() const { return model_.num_experts / spec_.ep; }

  // Parameter declaration (constructor).
  void declare(std::string name, Shape shape) { declare(std::move(name), std::move(shape), model_.dtype); }
  void declare(std::string name, Shape shape, DType dtype);
  void declare_layer(i64 local);

  // HF → Megatron.
  void load_vocab_parallel(const CheckpointReader& ckpt, const std::string& hf, const TensorView& dst) const;
  void load_row_shard(const CheckpointReader& ckpt, const std::string& hf, i64 shard, const TensorView& dst) const;
  void load_column_shard(const CheckpointReader& ckpt, const std::string& hf, i64 shard,
                         const TensorView& dst) const;
  void load_gate_up(const CheckpointReader& ckpt, const std::string& hf_mlp, i64 shard, const TensorView& dst) const;
  void load_attention(const CheckpointReader& ckpt, const ParameterSet& params, i64 local, i64 global) const;
  void load_mlp(const CheckpointReader& ckpt, const ParameterSet& params, i64 local, i64 global) const;

  // Megatron → HF.
  template <typename RowMap>
  void export_rows(const TensorView& param, RowMap&& map, std::vector<CheckpointPiece>& out) const;
  void export_column_shard(const TensorView& param, const std::string& hf, i64 shard,
                           std::vector<CheckpointPiece>& out) const;
  void export_attention(const ParameterSet& params, i64 local, i64 global, std::vector<CheckpointPiece>& out) const;
  void export_mlp(const ParameterSet& params, i64 local, i64 global, std::vector<CheckpointPiece>& out) const;

  TrainerSpec spec_;
  int rank_ = 0;
  int stage_ = 0, tp_rank_ = 0, cp_rank_ = 0, dp_rank_ = 0, ep_rank_ = 0, expert_dp_rank_ = 0;
  i64 first_layer_ = 0;  // global index of this stage's first layer
  i64 stage_layers_ = 0;
  i64 padded_vocab_ = 0;
};

// ------------------------------------------------------------------------------------------------------
// Construction: rank coordinates, checks, parameter declarations.

MegatronTrainerWorker::MegatronTrainerWorker(const ModelConfig& model, const TrainerSpec& spec, int rank)
    : EmulatedWorker(WorkerRole::kTrainer, model), spec_(spec), rank_(rank) {
  validate();
  const int per_stage = spec_.ranks_per_stage();
  stage_ = rank / per_stage;
  const int s = rank % per_stage;
  tp_rank_ = s % spec_.tp;
  cp_rank_ = (s / spec_.tp) % spec_.cp;
  dp_rank_ = s / (spec_.tp * spec_.cp);
  ep_rank_ = s % spec_.ep;
  expert_dp_rank_ = s / spec_.ep;

  std::vector<std::pair<i64, i64>> stages;
  try {
    stages = spec_.stage_layers(model_.num_hidden_layers);
  } catch (const Error& e) {
    fail(e.code(),
         "pipeline split of num_hidden_layers=" + str(model_.num_hidden_layers) + ": " + e.status().message());
  }
  if (static_cast<int>(stages.size()) != spec_.pp)
    fail(ErrorCode::kInternal, "stage_layers gave " + str(static_cast<i64>(stages.size())) + " stages for pp=" +
                                   str(spec_.pp));
  first_layer_ = stages[stage_].first;
  stage_layers_ = stages[stage_].second;

  const i64 unit = kVocabDivisor * spec_.tp;
  padded_vocab_ = (model_.vocab_size + unit - 1) / unit * unit;

  if (first_stage()) declare(kMgEmbedding, {padded_vocab_ / spec_.tp, model_.hidden_size});
  for (i64 local = 0; local < stage_layers_; ++local) declare_layer(local);
  if (last_stage()) {
    declare(kMgFinalNorm, {model_.hidden_size});
    if (holds_output_layer()) declare(kMgOutput, {padded_vocab_ / spec_.tp, model_.hidden_size});
  }
}

void MegatronTrainerWorker::fail(ErrorCode code, const std::string& cause) const {
  throw Error(code, "Megatron trainer spec " + spec_.to_string() + ", rank " + std::to_string(rank_) + ", model " +
                        model_.name + ": " + cause);
}

void MegatronTrainerWorker::require_divides(i64 divisor, const std::string& divisor_name, i64 value,
                                            const std::string& value_name, const std::string& what) const {
  if (divisor <= 0 || value % divisor != 0)
    fail(ErrorCode::kInvalidArgument, divisor_name + "=" + str(divisor) + " does not divide " + value_name + "=" +
                                          str(value) + " of " + model_.name + " (" + what + ")");
}

// Every rank checks the whole model (not only its own stage), so all ranks of a job agree on the error.
void MegatronTrainerWorker::validate() const {
  const std::pair<const char*, int> degrees[] = {{"tp", spec_.tp}, {"pp", spec_.pp}, {"cp", spec_.cp},
                                                 {"dp", spec_.dp}, {"ep", spec_.ep}, {"etp", spec_.etp}};
  for (const auto& [key, value] : degrees)
    if (value < 1) fail(ErrorCode::kInvalidArgument, std::string(key) + "=" + str(value) + " must be at least 1");
  if (spec_.etp != 1)
    fail(ErrorCode::kUnsupported, "expert tensor parallelism etp=" + str(spec_.etp) + " is not supported (only etp=1)");
  if (rank_ < 0 || rank_ >= spec_.world_size())
    fail(ErrorCode::kInvalidArgument, "rank " + str(rank_) + " is outside the world of " + str(spec_.world_size()) +
                                          " ranks (tp*cp*dp*pp)");
  if (spec_.ranks_per_stage() % spec_.ep != 0)
    fail(ErrorCode::kInvalidArgument, "ep=" + str(spec_.ep) + " does not divide tp*cp*dp=" +
                                          str(spec_.ranks_per_stage()) + " (expert parallel groups)");
  if (model_.hidden_size <= 0 || model_.vocab_size <= 0 || model_.num_hidden_layers <= 0)
    fail(ErrorCode::kInvalidArgument, "hidden_size, vocab_size and num_hidden_layers must be positive");

  require_divides(spec_.tp, "tp", model_.num_attention_heads, "num_attention_heads", "attention heads");
  if (!model_.is_mla()) {
    require_divides(spec_.tp, "tp", model_.num_key_value_heads, "num_key_value_heads",
                    "query groups of self_attention.linear_qkv.weight");
    require_divides(model_.num_key_value_heads, "num_key_value_heads", model_.num_attention_heads,
                    "num_attention_heads", "query group size");
  }
  bool any_dense = false, any_moe = false;
  for (i64 layer = 0; layer < model_.num_hidden_layers; ++layer)
    (model_.is_moe_layer(layer) ? any_moe : any_dense) = true;
  if (any_dense)
    require_divides(spec_.tp, "tp", model_.intermediate_size, "intermediate_size", "dense mlp.linear_fc1/linear_fc2");
  if (any_moe) {
    require_divides(spec_.ep, "ep", model_.num_experts, "num_experts", "routed experts per expert-parallel rank");
    if (has_shared_experts())
      require_divides(spec_.tp, "tp", shared_expert_size(), "n_shared_experts*moe_intermediate_size",
                      "mlp.shared_experts");
  }
}

void MegatronTrainerWorker::declare(std::string name, Shape shape, DType dtype) {
  parameters_.push_back(TensorInfo{std::move(name), dtype, std::move(shape)});
}

void MegatronTrainerWorker::declare_layer(i64 local) {
  const i64 tp = spec_.tp, H = model_.hidden_size, nh = model_.num_attention_heads;
  const std::string p = mg_layer(local);
  const std::string attn = p + "self_attention.";
  if (model_.is_mla()) {
    const i64 qk_head = model_.qk_nope_head_dim + model_.qk_rope_head_dim;
    declare(p + "input_layernorm.weight", {H});
    if (!model_.q_lora_rank) {
      declare(attn + "linear_q_proj.weight", {nh * qk_head / tp, H});
    } else {
      const i64 q_lora = *model_.q_lora_rank;
      declare(attn + "linear_q_down_proj.weight", {q_lora, H});
      declare(attn + "linear_q_up_proj.layer_norm_weight", {q_lora});
      declare(attn + "linear_q_up_proj.weight", {nh * qk_head / tp, q_lora});
    }
    declare(attn + "linear_kv_down_proj.weight", {model_.kv_lora_rank + model_.qk_rope_head_dim, H});
    declare(attn + "linear_kv_up_proj.layer_norm_weight", {model_.kv_lora_rank});
    declare(attn + "linear_kv_up_proj.weight",
            {nh * (model_.qk_nope_head_dim + model_.v_head_dim) / tp, model_.kv_lora_rank});
    declare(attn + "linear_proj.weight", {H, nh * model_.v_head_dim / tp});
  } else {
    const i64 hd = model_.head_dim, nkv = model_.num_key_value_heads;
    declare(attn + "linear_qkv.layer_norm_weight", {H});
    declare(attn + "linear_qkv.weight", {(nh + 2 * nkv) * hd / tp, H});
    declare(attn + "q_layernorm.weight", {hd});
    declare(attn + "k_layernorm.weight", {hd});
    declare(attn + "linear_proj.weight", {H, nh * hd / tp});
  }

  const std::string mlp = p + "mlp.";
  if (!model_.is_moe_layer(first_layer_ + local)) {
    const i64 I = model_.intermediate_size;
    declare(mlp + "linear_fc1.layer_norm_weight", {H});
    declare(mlp + "linear_fc1.weight", {2 * I / tp, H});
    declare(mlp + "linear_fc2.weight", {H, I / tp});
    return;
  }
  const i64 E = model_.num_experts, Im = model_.moe_intermediate_size;
  declare(p + "pre_mlp_layernorm.weight", {H});
  declare(mlp + "router.weight", {E, H});
  // In the checkpoint's dtype (float32 in DeepSeek-V3-family files), as Megatron keeps it.
  if (deepseek_family()) declare(mlp + "router.expert_bias", {E}, model_.dtype_of("mlp.gate.e_score_correction_bias"));
  for (i64 i = 0; i < experts_per_rank(); ++i) declare(mlp + "experts.linear_fc1.weight" + str(i), {2 * Im, H});
  for (i64 i = 0; i < experts_per_rank(); ++i) declare(mlp + "experts.linear_fc2.weight" + str(i), {H, Im});
  if (has_shared_experts()) {
    declare(mlp + "shared_experts.linear_fc1.weight", {2 * shared_expert_size() / tp, H});
    declare(mlp + "shared_experts.linear_fc2.weight", {H, shared_expert_size() / tp});
  }
}

std::string MegatronTrainerWorker::describe() const {
  auto of = [](int index, int count) { return std::to_string(index) + "/" + std::to_string(count); };
  return "trainer rank " + std::to_string(rank_) + ": pp " + of(stage_, spec_.pp) + " tp " + of(tp_rank_, spec_.tp) +
         " cp " + of(cp_rank_, spec_.cp) + " dp " + of(dp_rank_, spec_.dp) + " ep " + of(ep_rank_, spec_.ep);
}

// ------------------------------------------------------------------------------------------------------
// HF → Megatron: for each parameter, copy boxes of the checkpoint tensors it is built from. One load_box
// per contiguous run, so a shard costs one read, not one per row.

void MegatronTrainerWorker::load_vocab_parallel(const CheckpointReader& ckpt, const std::string& hf,
                                                const TensorView& dst) const {
  const i64 per_rank = dst.shape[0];
  const i64 start = tp_rank_ * per_rank;
  // Rows past the real vocabulary are padding: left as they are (zero).
  const i64 real = std::clamp<i64>(model_.vocab_size - start, 0, per_rank);
  if (real > 0) load_box(ckpt, hf, row_box(ckpt.info(hf).shape, start, real), dst.narrow(0, 0, real));
}

void MegatronTrainerWorker::load_row_shard(const CheckpointReader& ckpt, const std::string& hf, i64 shard,
                                           const TensorView& dst) const {
  const i64 rows = dst.shape[0];
  load_box(ckpt, hf, row_box(ckpt.info(hf).shape, shard * rows, rows), dst);
}

void MegatronTrainerWorker::load_column_shard(const CheckpointReader& ckpt, const std::string& hf, i64 shard,
                                              const TensorView& dst) const {
  const i64 cols = dst.shape[1];
  load_box(ckpt, hf, column_box(ckpt.info(hf).shape, shard * cols, cols), dst);
}

// linear_fc1 of shard k holds [gate rows of shard k; up rows of shard k].
void MegatronTrainerWorker::load_gate_up(const CheckpointReader& ckpt, const std::string& hf_mlp, i64 shard,
                                         const TensorView& dst) const {
  const i64 half = dst.shape[0] / 2;
  load_row_shard(ckpt, hf_mlp + "gate_proj.weight", shard, dst.narrow(0, 0, half));
  load_row_shard(ckpt, hf_mlp + "up_proj.weight", shard, dst.narrow(0, half, half));
}

void MegatronTrainerWorker::load_attention(const CheckpointReader& ckpt, const ParameterSet& params, i64 local,
                                           i64 global) const {
  const std::string attn = mg_layer(local) + "self_attention.";
  const std::string hf = hf_layer(global) + "self_attn.";
  auto param = [&](const std::string& name) -> const TensorView& { return params.at(name).view; };

  if (model_.is_mla()) {
    load_tensor(ckpt, hf_layer(global) + "input_layernorm.weight", param(mg_layer(local) + "input_layernorm.weight"));
    if (!model_.q_lora_rank) {
      load_row_shard(ckpt, hf + "q_proj.weight", tp_rank_, param(attn + "linear_q_proj.weight"));
    } else {
      load_tensor(ckpt, hf + "q_a_proj.weight", param(attn + "linear_q_down_proj.weight"));
      load_tensor(ckpt, hf + "q_a_layernorm.weight", param(attn + "linear_q_up_proj.layer_norm_weight"));
      load_row_shard(ckpt, hf + "q_b_proj.weight", tp_rank_, param(attn + "linear_q_up_proj.weight"));
    }
    load_tensor(ckpt, hf + "kv_a_proj_with_mqa.weight", param(attn + "linear_kv_down_proj.weight"));
    load_tensor(ckpt, hf + "kv_a_layernorm.weight", param(attn + "linear_kv_up_proj.layer_norm_weight"));
    load_row_shard(ckpt, hf + "kv_b_proj.weight", tp_rank_, param(attn + "linear_kv_up_proj.weight"));
    load_column_shard(ckpt, hf + "o_proj.weight", tp_rank_, param(attn + "linear_proj.weight"));
    return;
  }

  load_tensor(ckpt, hf_layer(global) + "input_layernorm.weight", param(attn + "linear_qkv.layer_norm_weight"));
  // Fused QKV, Megatron's order: per query group g, its q heads, then k head g, then v head g.
  const i64 hd = model_.head_dim;
  const i64 q_per_group = model_.num_attention_heads / model_.num_key_value_heads;
  const i64 groups = model_.num_key_value_heads / spec_.tp;
  const i64 block = (q_per_group + 2) * hd;
  const TensorView& qkv = param(attn + "linear_qkv.weight");
  const Shape& q_shape = ckpt.info(hf + "q_proj.weight").shape;
  const Shape& k_shape = ckpt.info(hf + "k_proj.weight").shape;
  const Shape& v_shape = ckpt.info(hf + "v_proj.weight").shape;
  for (i64 j = 0; j < groups; ++j) {
    const i64 g = tp_rank_ * groups + j;
    const TensorView dst = qkv.narrow(0, j * block, block);
    load_box(ckpt, hf + "q_proj.weight", row_box(q_shape, g * q_per_group * hd, q_per_group * hd),
             dst.narrow(0, 0, q_per_group * hd));
    load_box(ckpt, hf + "k_proj.weight", row_box(k_shape, g * hd, hd), dst.narrow(0, q_per_group * hd, hd));
    load_box(ckpt, hf + "v_proj.weight", row_box(v_shape, g * hd, hd), dst.narrow(0, (q_per_group + 1) * hd, hd));
  }
  load_tensor(ckpt, hf + "q_norm.weight", param(attn + "q_layernorm.weight"));
  load_tensor(ckpt, hf + "k_norm.weight", param(attn + "k_layernorm.weight"));
  load_column_shard(ckpt, hf + "o_proj.weight", tp_rank_, param(attn + "linear_proj.weight"));
}

void MegatronTrainerWorker::load_mlp(const CheckpointReader& ckpt, const ParameterSet& params, i64 local,
                                     i64 global) const {
  const std::string mg = mg_layer(local);
  const std::string hf = hf_layer(global);
  auto param = [&](const std::string& name) -> const TensorView& { return params.at(name).view; };

  if (!model_.is_moe_layer(global)) {
    load_tensor(ckpt, hf + "post_attention_layernorm.weight", param(mg + "mlp.linear_fc1.layer_norm_weight"));
    load_gate_up(ckpt, hf + "mlp.", tp_rank_, param(mg + "mlp.linear_fc1.weight"));
    load_column_shard(ckpt, hf + "mlp.down_proj.weight", tp_rank_, param(mg + "mlp.linear_fc2.weight"));
    return;
  }
  load_tensor(ckpt, hf + "post_attention_layernorm.weight", param(mg + "pre_mlp_layernorm.weight"));
  load_tensor(ckpt, hf + "mlp.gate.weight", param(mg + "mlp.router.weight"));
  if (deepseek_family())
    load_tensor(ckpt, hf + "mlp.gate.e_score_correction_bias", param(mg + "mlp.router.expert_bias"));
  for (i64 i = 0; i < experts_per_rank(); ++i) {
    const std::string expert = hf + "mlp.experts." + str(ep_rank_ * experts_per_rank() + i) + ".";
    load_gate_up(ckpt, expert, 0, param(mg + "mlp.experts.linear_fc1.weight" + str(i)));
    load_tensor(ckpt, expert + "down_proj.weight", param(mg + "mlp.experts.linear_fc2.weight" + str(i)));
  }
  if (has_shared_experts()) {
    load_gate_up(ckpt, hf + "mlp.shared_experts.", tp_rank_, param(mg + "mlp.shared_experts.linear_fc1.weight"));
    load_column_shard(ckpt, hf + "mlp.shared_experts.down_proj.weight", tp_rank_,
                      param(mg + "mlp.shared_experts.linear_fc2.weight"));
  }
}

void MegatronTrainerWorker::load_weights(const CheckpointReader& checkpoint, const ParameterSet& params) const {
  if (first_stage()) load_vocab_parallel(checkpoint, kHfEmbedding, params.at(kMgEmbedding).view);
  for (i64 local = 0; local < stage_layers_; ++local) {
    load_attention(checkpoint, params, local, first_layer_ + local);
    load_mlp(checkpoint, params, local, first_layer_ + local);
  }
  if (last_stage()) {
    load_tensor(checkpoint, kHfFinalNorm, params.at(kMgFinalNorm).view);
    if (holds_output_layer()) load_vocab_parallel(checkpoint, head_tensor(), params.at(kMgOutput).view);
  }
}

// ------------------------------------------------------------------------------------------------------
// Megatron → HF: walk each parameter from its first row (or column) and name the checkpoint rows each run
// came from, as a converter that un-fuses and un-shards would.

// `map(row)` gives the run that starts at parameter row `row`; runs tile the parameter's rows.
template <typename RowMap>
void MegatronTrainerWorker::export_rows(const TensorView& param, RowMap&& map,
                                        std::vector<CheckpointPiece>& out) const {
  for (i64 row = 0; row < param.shape[0];) {
    const RowRun run = map(row);
    if (run.rows <= 0) fail(ErrorCode::kInternal, "empty export run at row " + str(row));
    if (!run.tensor.empty()) {
      const TensorView view = param.narrow(0, row, run.rows);
      Box box = Box::whole(view.shape);
      box.offset[0] = run.hf_row;
      out.push_back(CheckpointPiece{run.tensor, std::move(box), view});
    }
    row += run.rows;
  }
}

void MegatronTrainerWorker::export_column_shard(const TensorView& param, const std::string& hf, i64 shard,
                                                std::vector<CheckpointPiece>& out) const {
  Box box = Box::whole(param.shape);
  box.offset[1] = shard * param.shape[1];
  out.push_back(CheckpointPiece{hf, std::move(box), param});
}

void MegatronTrainerWorker::export_attention(const ParameterSet& params, i64 local, i64 global,
                                             std::vector<CheckpointPiece>& out) const {
  const std::string attn = mg_layer(local) + "self_attention.";
  const std::string hf = hf_layer(global) + "self_attn.";
  auto whole = [&](const std::string& name, const std::string& tensor) {
    const TensorView& v = params.at(name).view;
    out.push_back(CheckpointPiece{tensor, Box::whole(v.shape), v});
  };
  // A column-parallel parameter: tensor-parallel rank k holds the k-th block of rows.
  auto row_shard = [&](const std::string& name, const std::string& tensor) {
    const TensorView& v = params.at(name).view;
    const i64 rows = v.shape[0];
    export_rows(v, [&](i64 row) { return RowRun{tensor, tp_rank_ * rows + row, rows - row}; }, out);
  };

  if (model_.is_mla()) {
    whole(mg_layer(local) + "input_layernorm.weight", hf_layer(global) + "input_layernorm.weight");
    if (!model_.q_lora_rank) {
      row_shard(attn + "linear_q_proj.weight", hf + "q_proj.weight");
    } else {
      whole(attn + "linear_q_down_proj.weight", hf + "q_a_proj.weight");
      whole(attn + "linear_q_up_proj.layer_norm_weight", hf + "q_a_layernorm.weight");
      row_shard(attn + "linear_q_up_proj.weight", hf + "q_b_proj.weight");
    }
    whole(attn + "linear_kv_down_proj.weight", hf + "kv_a_proj_with_mqa.weight");
    whole(attn + "linear_kv_up_proj.layer_norm_weight", hf + "kv_a_layernorm.weight");
    row_shard(attn + "linear_kv_up_proj.weight", hf + "kv_b_proj.weight");
    export_column_shard(params.at(attn + "linear_proj.weight").view, hf + "o_proj.weight", tp_rank_, out);
    return;
  }

  whole(attn + "linear_qkv.layer_norm_weight", hf_layer(global) + "input_layernorm.weight");
  // Un-fuse QKV: row r of this shard lies in local query group r / block; inside the group the first
  // q_rows rows are its q heads, then one k head, then one v head.
  const i64 hd = model_.head_dim;
  const i64 q_rows = model_.num_attention_heads / model_.num_key_value_heads * hd;
  const i64 block = q_rows + 2 * hd;
  const i64 first_group = tp_rank_ * (model_.num_key_value_heads / spec_.tp);
  export_rows(
      params.at(attn + "linear_qkv.weight").view,
      [&](i64 row) {
        const i64 group = first_group + row / block;
        const i64 in_group = row % block;
        if (in_group < q_rows) return RowRun{hf + "q_proj.weight", group * q_rows + in_group, q_rows - in_group};
        if (in_group < q_rows + hd)
          return RowRun{hf + "k_proj.weight", group * hd + (in_group - q_rows), q_rows + hd - in_group};
        return RowRun{hf + "v_proj.weight", group * hd + (in_group - q_rows - hd), block - in_group};
      },
      out);
  whole(attn + "q_layernorm.weight", hf + "q_norm.weight");
  whole(attn + "k_layernorm.weight", hf + "k_norm.weight");
  export_column_shard(params.at(attn + "linear_proj.weight").view, hf + "o_proj.weight", tp_rank_, out);
}

void MegatronTrainerWorker::export_mlp(const ParameterSet& params, i64 local, i64 global,
                                       std::vector<CheckpointPiece>& out) const {
  const std::string mg = mg_layer(local) + "mlp.";
  const std::string hf = hf_layer(global);
  auto whole = [&](const std::string& name, const std::string& tensor) {
    const TensorView& v = params.at(name).view;
    out.push_back(CheckpointPiece{tensor, Box::whole(v.shape), v});
  };
  // Un-fuse gate/up: the first half of the rows is shard `shard` of gate_proj, the second of up_proj.
  auto gate_up = [&](const std::string& name, const std::string& hf_mlp, i64 shard) {
    const TensorView& v = params.at(name).view;
    const i64 half = v.shape[0] / 2;
    export_rows(
        v,
        [&](i64 row) {
          if (row < half) return RowRun{hf_mlp + "gate_proj.weight", shard * half + row, half - row};
          return RowRun{hf_mlp + "up_proj.weight", shard * half + (row - half), 2 * half - row};
        },
        out);
  };

  if (!model_.is_moe_layer(global)) {
    whole(mg + "linear_fc1.layer_norm_weight", hf + "post_attention_layernorm.weight");
    gate_up(mg + "linear_fc1.weight", hf + "mlp.", tp_rank_);
    export_column_shard(params.at(mg + "linear_fc2.weight").view, hf + "mlp.down_proj.weight", tp_rank_, out);
    return;
  }
  whole(mg_layer(local) + "pre_mlp_layernorm.weight", hf + "post_attention_layernorm.weight");
  whole(mg + "router.weight", hf + "mlp.gate.weight");
  if (deepseek_family()) whole(mg + "router.expert_bias", hf + "mlp.gate.e_score_correction_bias");
  const i64 per_rank = model_.num_experts / spec_.ep;
  for (i64 i = 0; i < per_rank; ++i) {
    const std::string expert = hf + "mlp.experts." + str(ep_rank_ * per_rank + i) + ".";
    gate_up(mg + "experts.linear_fc1.weight" + str(i), expert, 0);
    whole(mg + "experts.linear_fc2.weight" + str(i), expert + "down_proj.weight");
  }
  if (has_shared_experts()) {
    gate_up(mg + "shared_experts.linear_fc1.weight", hf + "mlp.shared_experts.", tp_rank_);
    export_column_shard(params.at(mg + "shared_experts.linear_fc2.weight").view,
                        hf + "mlp.shared_experts.down_proj.weight", tp_rank_, out);
  }
}

std::vector<CheckpointPiece> MegatronTrainerWorker::export_weights(const ParameterSet& params) const {
  std::vector<CheckpointPiece> out;
  // Vocab-parallel rows: rank k holds padded rows [k*rows, (k+1)*rows); those past vocab_size are padding.
  auto vocab_rows = [&](const TensorView& v, const std::string& tensor) {
    const i64 rows = v.shape[0];
    export_rows(
        v,
        [&](i64 row) {
          const i64 token = tp_rank_ * rows + row;
          if (token >= model_.vocab_size) return RowRun{"", 0, rows - row};
          return RowRun{tensor, token, std::min(rows, model_.vocab_size - tp_rank_ * rows) - row};
        },
        out);
  };
  if (first_stage()) vocab_rows(params.at(kMgEmbedding).view, kHfEmbedding);
  for (i64 local = 0; local < stage_layers_; ++local) {
    export_attention(params, local, first_layer_ + local, out);
    export_mlp(params, local, first_layer_ + local, out);
  }
  if (last_stage()) {
    const TensorView& norm = params.at(kMgFinalNorm).view;
    out.push_back(CheckpointPiece{kHfFinalNorm, Box::whole(norm.shape), norm});
    if (holds_output_layer()) vocab_rows(params.at(kMgOutput).view, head_tensor());
  }
  return out;
}

}  // namespace

std::unique_ptr<EmulatedWorker> make_trainer_worker(const ModelConfig& model, const TrainerSpec& spec, int rank) {
  return std::make_unique<MegatronTrainerWorker>(model, spec, rank);
}

}  // namespace wb::emu

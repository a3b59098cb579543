// The emulated Megatron trainer: every layout must give the checkpoint back when all its workers are
// gathered through export_weights; the fused layouts must be Megatron's (hand-computed rows); bad specs
// must fail with a message naming the cause.

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "../support/expect_error.hpp"
#include "emu/checkpoints/synthetic.hpp"
#include "emu/frameworks/backend.hpp"
#include "emu/frameworks/layout_spec.hpp"
#include "emu/models/model.hpp"
#include "weightbridge/status.hpp"

namespace wb::emu {
namespace {

using i64 = std::int64_t;
using wb::testing::expect_error;

constexpr std::uint64_t kSeed = 20240611;

// One checkpoint tensor rebuilt from the workers' exports.
struct Gathered {
  TensorInfo info;
  std::vector<std::byte> data;     // sentinel until a worker exports the element
  std::vector<std::uint8_t> seen;  // per element: exported by some worker
};

// The reference: every checkpoint tensor read whole, once per model.
std::map<std::string, std::vector<std::byte>> read_reference(const SyntheticCheckpoint& checkpoint) {
  std::map<std::string, std::vector<std::byte>> out;
  for (const TensorInfo& info : checkpoint.tensors()) {
    std::vector<std::byte> bytes(info.nbytes());
    checkpoint.read(info.name, bytes.data());
    out.emplace(info.name, std::move(bytes));
  }
  return out;
}

// Copies `piece` into its tensor; an element already exported by another worker must agree bitwise.
// Returns false (after one failure message) on the first problem.
bool gather_piece(const CheckpointPiece& piece, std::map<std::string, Gathered>& tensors, const std::string& who) {
  auto it = tensors.find(piece.tensor);
  if (it == tensors.end()) {
    ADD_FAILURE() << who << " exports unknown tensor " << piece.tensor;
    return false;
  }
  Gathered& g = it->second;
  if (!piece.box.fits_in(g.info.shape) || piece.view.shape != piece.box.extent || piece.view.dtype != g.info.dtype) {
    ADD_FAILURE() << who << " exports box " << piece.box.to_string() << " of " << piece.tensor << " "
                  << shape_to_string(g.info.shape) << " with a view of shape " << shape_to_string(piece.view.shape);
    return false;
  }
  // Pieces are 1-D or 2-D; a 1-D piece is one row.
  const bool two_d = piece.box.ndim() == 2;
  const i64 rows = two_d ? piece.box.extent[0] : 1;
  const i64 cols = piece.box.extent[two_d ? 1 : 0];
  const i64 row0 = two_d ? piece.box.offset[0] : 0;
  const i64 col0 = piece.box.offset[two_d ? 1 : 0];
  const i64 tensor_cols = g.info.shape[two_d ? 1 : 0];
  const i64 row_stride = two_d ? piece.view.strides[0] : 0;
  const i64 col_stride = piece.view.strides[two_d ? 1 : 0];
  const std::size_t es = dtype_size(g.info.dtype);
  const auto* base = static_cast<const std::byte*>(piece.view.data);
  for (i64 r = 0; r < rows; ++r) {
    for (i64 c = 0; c < cols; ++c) {
      const std::byte* src = base + static_cast<std::size_t>(r * row_stride + c * col_stride) * es;
      const i64 index = (row0 + r) * tensor_cols + col0 + c;
      std::byte* dst = g.data.data() + static_cast<std::size_t>(index) * es;
      if (g.seen[index]) {
        if (std::memcmp(dst, src, es) != 0) {
          ADD_FAILURE() << who << " disagrees with another worker on " << piece.tensor << " element (" << row0 + r
                        << ", " << col0 + c << ")";
          return false;
        }
      } else {
        std::memcpy(dst, src, es);
        g.seen[index] = 1;
      }
    }
  }
  return true;
}

// Builds every worker of `spec_text`, loads, exports, gathers, and compares with the checkpoint.
void check_round_trip(const ModelConfig& model, const std::string& spec_text, const SyntheticCheckpoint& checkpoint,
                      const std::map<std::string, std::vector<std::byte>>& reference) {
  SCOPED_TRACE(model.name + " " + spec_text);
  const TrainerSpec spec = TrainerSpec::parse(spec_text);
  std::map<std::string, Gathered> tensors;
  for (const TensorInfo& info : checkpoint.tensors())
    tensors.emplace(info.name, Gathered{info, std::vector<std::byte>(info.nbytes(), std::byte{0xA5}),
                                        std::vector<std::uint8_t>(static_cast<std::size_t>(info.numel()), 0)});

  // Megatron's padded vocabulary, computed here independently of the backend.
  const i64 unit = 128 * spec.tp;
  const i64 padded_vocab = (model.vocab_size + unit - 1) / unit * unit;
  const i64 vocab_rows = padded_vocab / spec.tp;

  for (int rank = 0; rank < spec.world_size(); ++rank) {
    const std::unique_ptr<EmulatedWorker> worker = make_trainer_worker(model, spec, rank);
    const std::string who = worker->describe();
    ASSERT_EQ(worker->role(), WorkerRole::kTrainer);
    HostParameters storage(worker->parameter_infos());
    worker->load_weights(checkpoint, storage.parameters());
    const std::vector<CheckpointPiece> pieces = worker->export_weights(storage.parameters());

    // Padding rows of the vocab-parallel tensors stay zero and are not exported.
    const int tp_rank = rank % spec.ranks_per_stage() % spec.tp;
    i64 padding = 0;
    for (const char* name : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
      const Parameter* p = storage.parameters().find(name);
      if (p == nullptr) continue;
      ASSERT_EQ(p->view.shape, (Shape{vocab_rows, model.hidden_size})) << who << " " << name;
      const std::size_t row_bytes = static_cast<std::size_t>(model.hidden_size) * p->view.element_size();
      for (i64 row = 0; row < vocab_rows; ++row) {
        if (tp_rank * vocab_rows + row < model.vocab_size) continue;
        ++padding;
        const auto* bytes = static_cast<const std::byte*>(p->view.data) + row * row_bytes;
        for (std::size_t b = 0; b < row_bytes; ++b)
          ASSERT_EQ(bytes[b], std::byte{0}) << who << " " << name << " padding row " << row;
      }
    }

    // Each parameter element is exported once, padding excepted.
    i64 declared = 0, exported = 0;
    for (const TensorInfo& info : worker->parameter_infos()) declared += info.numel();
    for (const CheckpointPiece& piece : pieces) exported += piece.box.numel();
    EXPECT_EQ(exported, declared - padding * model.hidden_size) << who;

    for (const CheckpointPiece& piece : pieces)
      if (!gather_piece(piece, tensors, who)) return;
  }

  for (const auto& [name, g] : tensors) {
    for (i64 i = 0; i < g.info.numel(); ++i)
      if (!g.seen[i]) {
        ADD_FAILURE() << "no worker exports element " << i << " of " << name << " " << shape_to_string(g.info.shape);
        return;
      }
    const std::vector<std::byte>& want = reference.at(name);
    if (g.data != want) {
      const std::size_t es = dtype_size(g.info.dtype);
      std::size_t i = 0;
      while (std::memcmp(g.data.data() + i * es, want.data() + i * es, es) == 0) ++i;
      ADD_FAILURE() << name << " " << shape_to_string(g.info.shape) << " differs from the checkpoint at flat element "
                    << i;
      return;
    }
  }
}

void check_layouts(const ModelConfig& model, const std::vector<std::string>& specs) {
  const SyntheticCheckpoint checkpoint(model_tensors(model), kSeed);
  const auto reference = read_reference(checkpoint);
  for (const std::string& spec : specs) check_round_trip(model, spec, checkpoint, reference);
}

ModelConfig tiny(const std::string& name, std::optional<i64> layers = std::nullopt) {
  ScaleOptions options;
  options.num_layers = layers;
  return scale_model(load_named_model_config(name), options);
}

// ---- 1. every layout gives the checkpoint back ---------------------------------------------------------

TEST(MegatronTrainer, RoundTripQwen3Dense) {
  // Qwen3-32B: 64 heads, 8 KV heads. Last row: the Table 2 trainer (TP8, PP2).
  check_layouts(tiny("qwen3-32b", 5), {"tp=1", "tp=2,pp=2,pp_last=2", "tp=2,cp=2,dp=2", "tp=4,pp=3,pp_last=1,dp=2"});
  check_layouts(tiny("qwen3-32b", 4), {"tp=8,pp=2"});
}

TEST(MegatronTrainer, RoundTripQwen3Moe30B) {
  // 32 heads, 4 KV heads, 64 experts. Last row: the Table 2 trainer (TP4, EP8, DP4).
  check_layouts(tiny("qwen3-30b-a3b", 5), {"tp=1", "tp=2,pp=2,pp_last=1", "tp=1,cp=2,dp=2,ep=4",
                                          "tp=1,dp=16,ep=8", "tp=2,cp=2,dp=2,ep=8", "tp=4,dp=4,ep=8"});
}

TEST(MegatronTrainer, RoundTripQwen3Moe235B) {
  // The Table 2 trainer: TP4, PP4, CP2, EP16, DP2, uneven last stage (64 workers).
  check_layouts(tiny("qwen3-235b-a22b", 10), {"tp=4,pp=4,cp=2,dp=2,ep=16,pp_last=4", "tp=1,pp=2"});
}

TEST(MegatronTrainer, RoundTripMoonlight) {
  // DeepSeek-V3 family without q_lora (plain q_proj), one dense first layer, shared experts.
  // Last row: the Table 2 trainer (TP2, EP8, DP4).
  check_layouts(tiny("moonlight-16b-a3b", 5), {"tp=1", "tp=2,pp=2,pp_last=2", "tp=2,cp=2,dp=2,ep=4",
                                              "tp=1,dp=8,ep=4", "tp=2,dp=4,ep=8"});
}

TEST(MegatronTrainer, RoundTripKimiK2) {
  // MLA with q_lora, 64 heads, one dense first layer. Last: the Table 2 trainer (TP8, PP8, CP4, EP32,
  // last stage 5 layers) on 12 layers, so the other seven stages hold one each (256 workers).
  check_layouts(tiny("kimi-k2-instruct", 12),
                {"tp=1", "tp=2,pp=2,pp_last=5", "tp=4,cp=2,dp=2,ep=16", "tp=8,pp=8,cp=4,ep=32,pp_last=5"});
}

TEST(MegatronTrainer, RoundTripTiedEmbeddings) {
  // No lm_head in the checkpoint: with pp=1 the embedding doubles as the output layer; with pp>1 the
  // last stage holds a copy, exported as model.embed_tokens.weight too.
  ModelConfig model = tiny("qwen3-32b", 4);
  model.tie_word_embeddings = true;
  check_layouts(model, {"tp=2", "tp=2,pp=2"});
  const auto first = make_trainer_worker(model, TrainerSpec::parse("tp=2"), 0);
  for (const TensorInfo& info : first->parameter_infos()) EXPECT_NE(info.name, "output_layer.weight");
  const auto last = make_trainer_worker(model, TrainerSpec::parse("tp=2,pp=2"), 2);
  bool has_output = false;
  for (const TensorInfo& info : last->parameter_infos()) has_output = has_output || info.name == "output_layer.weight";
  EXPECT_TRUE(has_output);
}

// ---- 2. the fused layouts are Megatron's -----------------------------------------------------------------

// A hand-sized Qwen3: 4 heads in 2 query groups of head_dim 2, hidden 4, intermediate 4, vocab 10.
ModelConfig spot_model() {
  ModelConfig m;
  m.name = "spot";
  m.model_type = "qwen3";
  m.hidden_size = 4;
  m.num_hidden_layers = 1;
  m.num_attention_heads = 4;
  m.num_key_value_heads = 2;
  m.head_dim = 2;
  m.intermediate_size = 4;
  m.vocab_size = 10;
  return m;
}

struct SourceRow {
  const char* tensor;
  i64 row;
};

// Row `i` of parameter `param` must equal row rows[i] of its checkpoint tensor.
void expect_rows(const SyntheticCheckpoint& checkpoint, const ParameterSet& params, const std::string& param,
                 const std::vector<SourceRow>& rows) {
  const TensorView& view = params.at(param).view;
  ASSERT_EQ(view.shape[0], static_cast<i64>(rows.size())) << param;
  const std::size_t row_bytes = static_cast<std::size_t>(view.shape[1]) * view.element_size();
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const std::string tensor = std::string("model.layers.0.") + rows[i].tensor;
    const TensorInfo& info = checkpoint.info(tensor);
    std::vector<std::byte> want(row_bytes);
    Box box = Box::whole(info.shape);
    box.offset[0] = rows[i].row;
    box.extent[0] = 1;
    checkpoint.read_box(tensor, box, want.data());
    EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(view.data) + i * row_bytes, want.data(), row_bytes), 0)
        << param << " row " << i << " should be " << tensor << " row " << rows[i].row;
  }
}

TEST(MegatronTrainer, FusedQkvAndGateUpLayout) {
  const ModelConfig model = spot_model();
  const SyntheticCheckpoint checkpoint(model_tensors(model), kSeed);
  const char* q = "self_attn.q_proj.weight";
  const char* k = "self_attn.k_proj.weight";
  const char* v = "self_attn.v_proj.weight";
  const char* gate = "mlp.gate_proj.weight";
  const char* up = "mlp.up_proj.weight";
  const std::string qkv = "decoder.layers.0.self_attention.linear_qkv.weight";
  const std::string fc1 = "decoder.layers.0.mlp.linear_fc1.weight";

  {  // tp=1: group 0 (q heads 0,1; k 0; v 0), then group 1 — not [all q; all k; all v].
    const auto worker = make_trainer_worker(model, TrainerSpec::parse("tp=1"), 0);
    HostParameters storage(worker->parameter_infos());
    worker->load_weights(checkpoint, storage.parameters());
    expect_rows(checkpoint, storage.parameters(), qkv,
                {{q, 0}, {q, 1}, {q, 2}, {q, 3}, {k, 0}, {k, 1}, {v, 0}, {v, 1},
                 {q, 4}, {q, 5}, {q, 6}, {q, 7}, {k, 2}, {k, 3}, {v, 2}, {v, 3}});
    expect_rows(checkpoint, storage.parameters(), fc1,
                {{gate, 0}, {gate, 1}, {gate, 2}, {gate, 3}, {up, 0}, {up, 1}, {up, 2}, {up, 3}});
  }
  {  // tp=2, rank 1: query group 1 only; gate rows 2,3 then up rows 2,3.
    const auto worker = make_trainer_worker(model, TrainerSpec::parse("tp=2"), 1);
    HostParameters storage(worker->parameter_infos());
    worker->load_weights(checkpoint, storage.parameters());
    expect_rows(checkpoint, storage.parameters(), qkv,
                {{q, 4}, {q, 5}, {q, 6}, {q, 7}, {k, 2}, {k, 3}, {v, 2}, {v, 3}});
    expect_rows(checkpoint, storage.parameters(), fc1, {{gate, 2}, {gate, 3}, {up, 2}, {up, 3}});

    // Export names the same rows, one piece per contiguous run.
    std::vector<std::string> runs;
    for (const CheckpointPiece& piece : worker->export_weights(storage.parameters()))
      if (piece.tensor.find("proj") != std::string::npos) runs.push_back(piece.tensor + piece.box.to_string());
    const std::vector<std::string> want = {
        "model.layers.0.self_attn.q_proj.weight[4:8, 0:4]", "model.layers.0.self_attn.k_proj.weight[2:4, 0:4]",
        "model.layers.0.self_attn.v_proj.weight[2:4, 0:4]", "model.layers.0.self_attn.o_proj.weight[0:4, 4:8]",
        "model.layers.0.mlp.gate_proj.weight[2:4, 0:4]",    "model.layers.0.mlp.up_proj.weight[2:4, 0:4]",
        "model.layers.0.mlp.down_proj.weight[0:4, 2:4]"};
    EXPECT_EQ(runs, want);
    // Vocabulary 10 padded to 256: rank 1's 128 rows are all padding, so it exports none.
    for (const CheckpointPiece& piece : worker->export_weights(storage.parameters()))
      EXPECT_NE(piece.tensor, "model.embed_tokens.weight");
    EXPECT_EQ(storage.parameters().at("embedding.word_embeddings.weight").view.shape, (Shape{128, 4}));
  }
}

TEST(MegatronTrainer, ExpertsFollowExpertParallelRank) {
  // Qwen3-30B tiny, 64 experts, tp=2 dp=4 ep=4: rank 6 is ep rank 2 (ranks fastest), so it holds global
  // experts 32..47 as local 0..15; fc1 is [gate; up] of the whole expert.
  const ModelConfig model = tiny("qwen3-30b-a3b", 4);
  const auto worker = make_trainer_worker(model, TrainerSpec::parse("tp=2,dp=4,ep=4"), 6);
  EXPECT_EQ(worker->describe(), "trainer rank 6: pp 0/1 tp 0/2 cp 0/1 dp 3/4 ep 2/4");
  HostParameters storage(worker->parameter_infos());
  const SyntheticCheckpoint checkpoint(model_tensors(model), kSeed);
  worker->load_weights(checkpoint, storage.parameters());
  bool found = false;
  for (const CheckpointPiece& piece : worker->export_weights(storage.parameters())) {
    if (piece.tensor == "model.layers.1.mlp.experts.32.up_proj.weight") {
      found = true;
      const TensorView& fc1 = storage.parameters().at("decoder.layers.1.mlp.experts.linear_fc1.weight0").view;
      EXPECT_EQ(piece.view.data, fc1.narrow(0, model.moe_intermediate_size, model.moe_intermediate_size).data);
    }
    EXPECT_EQ(piece.tensor.find("experts.31."), std::string::npos);
    EXPECT_EQ(piece.tensor.find("experts.48."), std::string::npos);
  }
  EXPECT_TRUE(found);
}

// ---- 3. bad specs fail, naming the cause -----------------------------------------------------------------

TEST(MegatronTrainer, BadSpecsNameTheCause) {
  const ModelConfig qwen = tiny("qwen3-30b-a3b");
  auto make = [](const ModelConfig& m, const TrainerSpec& s, int rank) {
    return [m, s, rank] { make_trainer_worker(m, s, rank); };
  };
  auto spec = [](const char* text) { return TrainerSpec::parse(text); };

  std::string msg = expect_error(make(qwen, spec("tp=8"), 0), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("tp=8 does not divide num_key_value_heads=4 of Qwen3-30B-A3B-tiny"), std::string::npos) << msg;
  EXPECT_NE(msg.find("linear_qkv"), std::string::npos) << msg;

  msg = expect_error(make(qwen, spec("dp=3,ep=3"), 0), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("ep=3 does not divide num_experts=64"), std::string::npos) << msg;

  TrainerSpec unparsed;  // built directly, so the backend's own check is reached
  unparsed.tp = 2;
  unparsed.ep = 4;
  msg = expect_error(make(qwen, unparsed, 0), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("ep=4 does not divide tp*cp*dp=2"), std::string::npos) << msg;

  msg = expect_error(make(qwen, spec("etp=2,dp=2,ep=2"), 0), ErrorCode::kUnsupported);
  EXPECT_NE(msg.find("etp=2"), std::string::npos) << msg;

  msg = expect_error(make(qwen, spec("pp=3"), 0), ErrorCode::kInvalidArgument);  // 4 layers
  EXPECT_NE(msg.find("num_hidden_layers=4"), std::string::npos) << msg;

  msg = expect_error(make(qwen, spec("tp=2,dp=2"), 4), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("rank 4 is outside the world of 4"), std::string::npos) << msg;

  ModelConfig dense = spot_model();  // intermediate_size 4, 4 heads, 2 KV heads
  dense.num_key_value_heads = 4;
  dense.intermediate_size = 6;
  msg = expect_error(make(dense, spec("tp=4"), 0), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("tp=4 does not divide intermediate_size=6 of spot"), std::string::npos) << msg;

  ModelConfig moonlight = tiny("moonlight-16b-a3b");
  moonlight.moe_intermediate_size = 6;  // 2 shared experts: 12 rows, while 16 heads and 96 pass tp=8
  msg = expect_error(make(moonlight, spec("tp=8"), 0), ErrorCode::kInvalidArgument);
  EXPECT_NE(msg.find("tp=8 does not divide n_shared_experts*moe_intermediate_size=12"), std::string::npos) << msg;
}

}  // namespace
}  // namespace wb::emu

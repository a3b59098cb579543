"""A rollout engine's Qwen3-MoE, written the way inference engines (SGLang, vLLM) write their models.

One instance is one rank of an engine with tensor parallelism `tp_size`; the MoE experts are spread over
the same ranks by expert parallelism (`ep_size` ranks, each holding whole experts when ep_size == tp_size).
Parameters are fused and sharded as those engines hold them:

  model.embed_tokens / lm_head      VocabParallelEmbedding: rows of the vocabulary padded to a multiple of 64
  self_attn.qkv_proj                QKVParallelLinear: [this rank's q heads; its kv heads; its v heads]
  self_attn.o_proj, mlp.down_proj   RowParallelLinear: a column shard
  mlp.gate_up_proj                  MergedColumnParallelLinear: [gate shard; up shard]
  mlp.experts.w13_weight / w2       FusedMoE: [E_local, 2*I, H] and [E_local, H, I], this rank's experts
  norms, mlp.gate (router)          replicated

load_weights(weights) takes (name, tensor) pairs in Hugging Face naming and routes them through a
stacked_params_mapping and an expert mapping to each parameter's weight_loader, which narrows, chunks and
copies. Nothing here knows WeightBridge.
"""

import torch
from torch import nn

VOCAB_PADDING = 64  # the engines' DEFAULT_VOCAB_PADDING_SIZE


def _round_up(value, multiple):
    return (value + multiple - 1) // multiple * multiple


def _parameter(shape, dtype, weight_loader=None):
    param = nn.Parameter(torch.zeros(shape, dtype=dtype), requires_grad=False)
    if weight_loader is not None:
        param.weight_loader = weight_loader
    return param


def default_weight_loader(param, loaded_weight):
    if param.shape != loaded_weight.shape:
        raise ValueError(f"shape mismatch: parameter {tuple(param.shape)}, checkpoint {tuple(loaded_weight.shape)}")
    param.data.copy_(loaded_weight)


class RMSNorm(nn.Module):
    def __init__(self, size, dtype):
        super().__init__()
        self.weight = _parameter((size,), dtype)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size, hidden_size, tp_rank, tp_size, dtype):
        super().__init__()
        padded = _round_up(vocab_size, VOCAB_PADDING)
        self.rows_per_rank = padded // tp_size
        self.start = tp_rank * self.rows_per_rank
        self.real_rows = max(0, min(vocab_size - self.start, self.rows_per_rank))
        self.weight = _parameter((self.rows_per_rank, hidden_size), dtype, self.weight_loader)

    def weight_loader(self, param, loaded_weight):
        shard = loaded_weight.narrow(0, self.start, self.real_rows)
        param.data[: self.real_rows].copy_(shard)
        param.data[self.real_rows:].fill_(0)  # padding rows


class ParallelLMHead(VocabParallelEmbedding):
    pass


class QKVParallelLinear(nn.Module):
    def __init__(self, hidden_size, head_dim, num_heads, num_kv_heads, tp_rank, tp_size, dtype):
        super().__init__()
        self.head_dim = head_dim
        self.heads = num_heads // tp_size
        # More ranks than KV heads: each KV head is replicated on tp_size / num_kv_heads ranks.
        if tp_size <= num_kv_heads:
            self.kv_heads = num_kv_heads // tp_size
            self.kv_head_start = tp_rank * self.kv_heads
        else:
            self.kv_heads = 1
            self.kv_head_start = tp_rank // (tp_size // num_kv_heads)
        self.q_start = tp_rank * self.heads
        rows = (self.heads + 2 * self.kv_heads) * head_dim
        self.weight = _parameter((rows, hidden_size), dtype, self.weight_loader)

    def weight_loader(self, param, loaded_weight, shard_id):
        q_rows, kv_rows = self.heads * self.head_dim, self.kv_heads * self.head_dim
        offset, size, start = {
            "q": (0, q_rows, self.q_start * self.head_dim),
            "k": (q_rows, kv_rows, self.kv_head_start * self.head_dim),
            "v": (q_rows + kv_rows, kv_rows, self.kv_head_start * self.head_dim),
        }[shard_id]
        param.data.narrow(0, offset, size).copy_(loaded_weight.narrow(0, start, size))


class MergedColumnParallelLinear(nn.Module):
    """gate_up_proj: [gate shard; up shard]."""

    def __init__(self, input_size, output_size, tp_rank, tp_size, dtype):
        super().__init__()
        self.shard = output_size // tp_size
        self.tp_rank = tp_rank
        self.weight = _parameter((2 * self.shard, input_size), dtype, self.weight_loader)

    def weight_loader(self, param, loaded_weight, shard_id):
        slot = param.data.chunk(2, dim=0)[shard_id]
        slot.copy_(loaded_weight.narrow(0, self.tp_rank * self.shard, self.shard))


class RowParallelLinear(nn.Module):
    def __init__(self, input_size, output_size, tp_rank, tp_size, dtype):
        super().__init__()
        self.shard = input_size // tp_size
        self.tp_rank = tp_rank
        self.weight = _parameter((output_size, self.shard), dtype, self.weight_loader)

    def weight_loader(self, param, loaded_weight):
        param.data.copy_(loaded_weight.narrow(1, self.tp_rank * self.shard, self.shard))


class ReplicatedLinear(nn.Module):
    def __init__(self, input_size, output_size, dtype):
        super().__init__()
        self.weight = _parameter((output_size, input_size), dtype)


class FusedMoE(nn.Module):
    """Experts stacked per rank: w13 [E_local, 2*I_local, H] = [gate; up], w2 [E_local, H, I_local]."""

    def __init__(self, num_experts, hidden_size, intermediate_size, tp_rank, tp_size, ep_size, dtype):
        super().__init__()
        self.moe_tp_size = tp_size // ep_size  # expert-TP inside each expert-parallel group
        self.ep_rank = tp_rank // self.moe_tp_size
        self.moe_tp_rank = tp_rank % self.moe_tp_size
        self.local_experts = num_experts // ep_size
        self.first_expert = self.ep_rank * self.local_experts
        self.shard = intermediate_size // self.moe_tp_size
        self.w13_weight = _parameter((self.local_experts, 2 * self.shard, hidden_size), dtype, self.weight_loader)
        self.w2_weight = _parameter((self.local_experts, hidden_size, self.shard), dtype, self.weight_loader)

    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id):
        local = expert_id - self.first_expert
        if not 0 <= local < self.local_experts:
            return  # another rank's expert
        expert = param.data[local]
        if shard_id == "w2":  # down_proj: a column shard
            expert.copy_(loaded_weight.narrow(1, self.moe_tp_rank * self.shard, self.shard))
            return
        gate, up = expert.chunk(2, dim=0)
        (gate if shard_id == "w1" else up).copy_(loaded_weight.narrow(0, self.moe_tp_rank * self.shard, self.shard))

    @staticmethod
    def make_expert_params_mapping(num_experts):
        """(param name part, checkpoint name part, expert id, shard id) for every expert projection."""
        return [("experts.w13_" if shard_id in ("w1", "w3") else "experts.w2_", f"experts.{expert}.{projection}.",
                 expert, shard_id)
                for expert in range(num_experts)
                for shard_id, projection in (("w1", "gate_proj"), ("w2", "down_proj"), ("w3", "up_proj"))]


class Qwen3MoeAttention(nn.Module):
    def __init__(self, config, tp_rank, tp_size, dtype):
        super().__init__()
        h, hd = config["hidden_size"], config["head_dim"]
        self.qkv_proj = QKVParallelLinear(h, hd, config["num_attention_heads"], config["num_key_value_heads"],
                                          tp_rank, tp_size, dtype)
        self.o_proj = RowParallelLinear(config["num_attention_heads"] * hd, h, tp_rank, tp_size, dtype)
        self.q_norm = RMSNorm(hd, dtype)
        self.k_norm = RMSNorm(hd, dtype)


class Qwen3MoeMLP(nn.Module):
    def __init__(self, hidden_size, intermediate_size, tp_rank, tp_size, dtype):
        super().__init__()
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, intermediate_size, tp_rank, tp_size, dtype)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, tp_rank, tp_size, dtype)


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, config, tp_rank, tp_size, ep_size, dtype):
        super().__init__()
        self.gate = ReplicatedLinear(config["hidden_size"], config["num_experts"], dtype)
        self.experts = FusedMoE(config["num_experts"], config["hidden_size"], config["moe_intermediate_size"],
                                tp_rank, tp_size, ep_size, dtype)


class Qwen3MoeDecoderLayer(nn.Module):
    def __init__(self, config, layer, tp_rank, tp_size, ep_size, dtype, moe):
        super().__init__()
        self.self_attn = Qwen3MoeAttention(config, tp_rank, tp_size, dtype)
        if moe:
            self.mlp = Qwen3MoeSparseMoeBlock(config, tp_rank, tp_size, ep_size, dtype)
        else:
            self.mlp = Qwen3MoeMLP(config["hidden_size"], config["intermediate_size"], tp_rank, tp_size, dtype)
        self.input_layernorm = RMSNorm(config["hidden_size"], dtype)
        self.post_attention_layernorm = RMSNorm(config["hidden_size"], dtype)


def _is_moe_layer(config, layer):
    return (layer not in config.get("mlp_only_layers", []) and config["num_experts"] > 0
            and (layer + 1) % config.get("decoder_sparse_step", 1) == 0)


class Qwen3MoeModel(nn.Module):
    def __init__(self, config, tp_rank, tp_size, ep_size, dtype):
        super().__init__()
        self.embed_tokens = VocabParallelEmbedding(config["vocab_size"], config["hidden_size"], tp_rank, tp_size, dtype)
        self.layers = nn.ModuleList(
            Qwen3MoeDecoderLayer(config, i, tp_rank, tp_size, ep_size, dtype, _is_moe_layer(config, i))
            for i in range(config["num_hidden_layers"]))
        self.norm = RMSNorm(config["hidden_size"], dtype)


class Qwen3MoeForCausalLM(nn.Module):
    def __init__(self, config, tp_rank, tp_size, ep_size=None, dtype=torch.bfloat16):
        super().__init__()
        self.config = config
        ep_size = tp_size if ep_size is None else ep_size
        self.model = Qwen3MoeModel(config, tp_rank, tp_size, ep_size, dtype)
        self.lm_head = ParallelLMHead(config["vocab_size"], config["hidden_size"], tp_rank, tp_size, dtype)

    def load_weights(self, weights):
        stacked_params_mapping = [
            # (parameter name part, checkpoint name part, shard id)
            ("qkv_proj", "q_proj", "q"),
            ("qkv_proj", "k_proj", "k"),
            ("qkv_proj", "v_proj", "v"),
            ("gate_up_proj", "gate_proj", 0),
            ("gate_up_proj", "up_proj", 1),
        ]
        expert_params_mapping = FusedMoE.make_expert_params_mapping(self.config["num_experts"])
        params = dict(self.named_parameters())
        loaded = set()
        for name, loaded_weight in weights:
            for param_part, weight_part, shard_id in stacked_params_mapping:
                if weight_part not in name or "mlp.experts." in name:
                    continue
                name = name.replace(weight_part, param_part)
                param = params[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                for param_part, weight_part, expert_id, shard_id in expert_params_mapping:
                    if weight_part not in name:
                        continue
                    name = name.replace(weight_part, param_part)
                    param = params[name]
                    param.weight_loader(param, loaded_weight, name, shard_id=shard_id, expert_id=expert_id)
                    break
                else:
                    param = params[name]
                    getattr(param, "weight_loader", default_weight_loader)(param, loaded_weight)
            loaded.add(name)
        return loaded

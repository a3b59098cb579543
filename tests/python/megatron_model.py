"""A trainer's Qwen3-MoE, held the way Megatron-Core's GPTModel (Transformer Engine layer specs) holds it.

One instance is one trainer rank with tensor parallelism `tp`, data parallelism `dp` and expert
parallelism `ep` carved out of the tp*dp ranks (expert-TP 1, rank order tp-ep-dp as in Megatron-Core:
ep_rank = rank % ep). Parameters under Megatron-Core names and layouts:

  embedding.word_embeddings / output_layer   vocabulary padded to a multiple of 128*tp, a row shard
  self_attention.linear_qkv                  per query group g of this rank: [q heads of g; k_g; v_g]
  self_attention.linear_qkv.layer_norm_weight   input_layernorm, fused into the QKV GEMM (TE)
  self_attention.linear_proj, mlp.linear_fc2    a column shard
  mlp.linear_fc1                             [gate shard; up shard] (SwiGLU), its layer_norm_weight fused
  pre_mlp_layernorm, mlp.router              MoE layers: the norm stays separate; the router replicated
  mlp.experts.linear_fc1.weight<j>           TEGroupedMLP: local expert j = global ep_rank*E/ep + j

DP replicas hold the same dense parameters; expert ranks with the same ep_rank hold the same experts.
load_weights(weights) is this trainer's HF->Megatron loader: it takes (name, tensor) pairs in Hugging Face
naming and copies each into views of its parameters. Nothing here knows WeightBridge.
"""

import re

import torch
from torch import nn

MAKE_VOCAB_SIZE_DIVISIBLE_BY = 128  # Megatron's default


def _param(shape, dtype):
    return nn.Parameter(torch.zeros(shape, dtype=dtype))


class LayerNorm(nn.Module):  # RMSNorm in Qwen3; Megatron names it by the layer's role
    def __init__(self, size, dtype):
        super().__init__()
        self.weight = _param((size,), dtype)


class TELayerNormColumnParallelLinear(nn.Module):
    def __init__(self, input_size, rows, dtype):
        super().__init__()
        self.layer_norm_weight = _param((input_size,), dtype)
        self.weight = _param((rows, input_size), dtype)


class Linear(nn.Module):
    def __init__(self, rows, columns, dtype):
        super().__init__()
        self.weight = _param((rows, columns), dtype)


class TEGroupedLinear(nn.Module):
    """One weight per local expert: weight0, weight1, ..."""

    def __init__(self, experts, rows, columns, dtype):
        super().__init__()
        for j in range(experts):
            self.register_parameter(f"weight{j}", _param((rows, columns), dtype))

    def expert(self, j):
        return getattr(self, f"weight{j}")


class TEGroupedMLP(nn.Module):
    def __init__(self, experts, hidden, ffn, dtype):
        super().__init__()
        self.linear_fc1 = TEGroupedLinear(experts, 2 * ffn, hidden, dtype)
        self.linear_fc2 = TEGroupedLinear(experts, hidden, ffn, dtype)


class SelfAttention(nn.Module):
    def __init__(self, config, tp, dtype):
        super().__init__()
        h, hd = config["hidden_size"], config["head_dim"]
        groups = config["num_key_value_heads"] // tp
        heads_per_group = config["num_attention_heads"] // config["num_key_value_heads"]
        self.linear_qkv = TELayerNormColumnParallelLinear(h, groups * (heads_per_group + 2) * hd, dtype)
        self.q_layernorm = LayerNorm(hd, dtype)
        self.k_layernorm = LayerNorm(hd, dtype)
        self.linear_proj = Linear(h, config["num_attention_heads"] * hd // tp, dtype)


class DenseMLP(nn.Module):
    def __init__(self, config, tp, dtype):
        super().__init__()
        h, ffn = config["hidden_size"], config["intermediate_size"] // tp
        self.linear_fc1 = TELayerNormColumnParallelLinear(h, 2 * ffn, dtype)
        self.linear_fc2 = Linear(h, ffn, dtype)


class MoELayer(nn.Module):
    def __init__(self, config, ep, dtype):
        super().__init__()
        self.router = Linear(config["num_experts"], config["hidden_size"], dtype)
        self.experts = TEGroupedMLP(config["num_experts"] // ep, config["hidden_size"], config["moe_intermediate_size"],
                                    dtype)


class TransformerLayer(nn.Module):
    def __init__(self, config, moe, tp, ep, dtype):
        super().__init__()
        self.self_attention = SelfAttention(config, tp, dtype)
        if moe:
            self.pre_mlp_layernorm = LayerNorm(config["hidden_size"], dtype)
            self.mlp = MoELayer(config, ep, dtype)
        else:
            self.mlp = DenseMLP(config, tp, dtype)


class TransformerBlock(nn.Module):
    def __init__(self, config, tp, ep, dtype):
        super().__init__()
        self.layers = nn.ModuleList(TransformerLayer(config, _is_moe_layer(config, i), tp, ep, dtype)
                                    for i in range(config["num_hidden_layers"]))
        self.final_layernorm = LayerNorm(config["hidden_size"], dtype)


class Embedding(nn.Module):
    def __init__(self, padded_vocab, hidden, tp, dtype):
        super().__init__()
        self.word_embeddings = Linear(padded_vocab // tp, hidden, dtype)


def _is_moe_layer(config, layer):
    return (layer not in config.get("mlp_only_layers", []) and config["num_experts"] > 0
            and (layer + 1) % config.get("decoder_sparse_step", 1) == 0)


_LAYER = re.compile(r"model\.layers\.(\d+)\.(.+)")
_EXPERT = re.compile(r"mlp\.experts\.(\d+)\.(gate|up|down)_proj\.weight")


class GPTModel(nn.Module):
    def __init__(self, config, rank, tp, dp, ep, dtype=torch.bfloat16):
        super().__init__()
        assert 0 <= rank < tp * dp and (tp * dp) % ep == 0
        self.config = config
        self.tp, self.tp_rank, self.dp_rank = tp, rank % tp, rank // tp
        self.ep, self.ep_rank = ep, rank % ep
        divisor = MAKE_VOCAB_SIZE_DIVISIBLE_BY * tp
        self.padded_vocab = (config["vocab_size"] + divisor - 1) // divisor * divisor
        self.embedding = Embedding(self.padded_vocab, config["hidden_size"], tp, dtype)
        self.decoder = TransformerBlock(config, tp, ep, dtype)
        self.output_layer = Linear(self.padded_vocab // tp, config["hidden_size"], dtype)

    # ---- the HF -> Megatron loader ------------------------------------------------------------------

    def _row_shard(self, tensor):
        """This TP rank's rows of `tensor` (split into tp equal parts)."""
        rows = tensor.shape[0] // self.tp
        return tensor.narrow(0, self.tp_rank * rows, rows)

    def _column_shard(self, tensor):
        columns = tensor.shape[1] // self.tp
        return tensor.narrow(1, self.tp_rank * columns, columns)

    def _vocab(self, param, loaded):
        rows = param.shape[0]
        start = self.tp_rank * rows
        real = max(0, min(loaded.shape[0] - start, rows))
        param[:real].copy_(loaded.narrow(0, start, real))
        param[real:].zero_()  # padding rows

    def _qkv(self, param, loaded, which):
        c = self.config
        groups, hd, h = c["num_key_value_heads"], c["head_dim"], c["hidden_size"]
        per_group = c["num_attention_heads"] // groups
        local = groups // self.tp
        first = self.tp_rank * local
        # Megatron interleaves per query group: [q heads of the group; its k head; its v head].
        qkv = param.view(local, per_group + 2, hd, h)
        if which == "q":
            qkv[:, :per_group].copy_(loaded.view(groups, per_group, hd, h)[first:first + local])
        else:
            slot = per_group if which == "k" else per_group + 1
            qkv[:, slot].copy_(loaded.view(groups, hd, h)[first:first + local])

    def _fc1(self, param, loaded, which, tp_sharded=True):
        half = param.shape[0] // 2
        part = self._row_shard(loaded) if tp_sharded else loaded
        param.narrow(0, 0 if which == "gate" else half, half).copy_(part)

    def _load_layer(self, layer, rest, loaded):
        attention, mlp = layer.self_attention, layer.mlp
        simple = {
            "input_layernorm.weight": lambda: attention.linear_qkv.layer_norm_weight,
            "self_attn.q_norm.weight": lambda: attention.q_layernorm.weight,
            "self_attn.k_norm.weight": lambda: attention.k_layernorm.weight,
            "post_attention_layernorm.weight":
                lambda: layer.pre_mlp_layernorm.weight if hasattr(layer, "pre_mlp_layernorm")
                else mlp.linear_fc1.layer_norm_weight,
            "mlp.gate.weight": lambda: mlp.router.weight,
        }
        if rest in simple:
            simple[rest]().copy_(loaded)
        elif rest in ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"):
            self._qkv(attention.linear_qkv.weight, loaded, rest[len("self_attn.")])
        elif rest == "self_attn.o_proj.weight":
            attention.linear_proj.weight.copy_(self._column_shard(loaded))
        elif rest in ("mlp.gate_proj.weight", "mlp.up_proj.weight"):
            self._fc1(mlp.linear_fc1.weight, loaded, rest[len("mlp."):-len("_proj.weight")])
        elif rest == "mlp.down_proj.weight":
            mlp.linear_fc2.weight.copy_(self._column_shard(loaded))
        elif (match := _EXPERT.fullmatch(rest)) is not None:
            local = int(match[1]) - self.ep_rank * (self.config["num_experts"] // self.ep)
            if not 0 <= local < self.config["num_experts"] // self.ep:
                return  # another expert-parallel rank's expert
            if match[2] == "down":
                mlp.experts.linear_fc2.expert(local).copy_(loaded)
            else:
                self._fc1(mlp.experts.linear_fc1.expert(local), loaded, match[2], tp_sharded=False)
        else:
            raise KeyError(f"no Megatron parameter for checkpoint tensor model.layers.*.{rest}")

    @torch.no_grad()
    def load_weights(self, weights):
        for name, loaded in weights:
            if name == "model.embed_tokens.weight":
                self._vocab(self.embedding.word_embeddings.weight, loaded)
            elif name == "lm_head.weight":
                self._vocab(self.output_layer.weight, loaded)
            elif name == "model.norm.weight":
                self.decoder.final_layernorm.weight.copy_(loaded)
            elif (match := _LAYER.fullmatch(name)) is not None:
                self._load_layer(self.decoder.layers[int(match[1])], match[2], loaded)
            else:
                raise KeyError(f"no Megatron parameter for checkpoint tensor {name}")

"""The canonical checkpoint of a Qwen3-MoE config: Hugging Face names and shapes, and versioned contents.

Every element of version `seed` is a normal (finite, non-denormal) value whose bits differ from those of
every other version below 128, so a stale element cannot pass for a new one.
"""

import json

import torch

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_INT_OF_WIDTH = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def load_config(path):
    with open(path) as f:
        return json.load(f)


def is_moe_layer(config, layer):
    # transformers' Qwen3MoeDecoderLayer rule
    return (config["num_experts"] > 0 and layer not in config.get("mlp_only_layers", [])
            and (layer + 1) % config.get("decoder_sparse_step", 1) == 0)


def tensor_list(config):
    """[(name, torch dtype, shape)] in the checkpoint's order."""
    dtype = TORCH_DTYPES[config.get("torch_dtype", "bfloat16")]
    h, hd = config["hidden_size"], config["head_dim"]
    q, kv = config["num_attention_heads"] * hd, config["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", (config["vocab_size"], h))]

    def mlp(prefix, inter):
        out.extend([(prefix + "gate_proj.weight", (inter, h)), (prefix + "up_proj.weight", (inter, h)),
                    (prefix + "down_proj.weight", (h, inter))])

    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out.extend([(p + "self_attn.q_proj.weight", (q, h)), (p + "self_attn.k_proj.weight", (kv, h)),
                    (p + "self_attn.v_proj.weight", (kv, h)), (p + "self_attn.o_proj.weight", (h, q)),
                    (p + "self_attn.q_norm.weight", (hd,)), (p + "self_attn.k_norm.weight", (hd,)),
                    (p + "input_layernorm.weight", (h,)), (p + "post_attention_layernorm.weight", (h,))])
        if is_moe_layer(config, layer):
            out.append((p + "mlp.gate.weight", (config["num_experts"], h)))
            for e in range(config["num_experts"]):
                mlp(f"{p}mlp.experts.{e}.", config["moe_intermediate_size"])
        else:
            mlp(p + "mlp.", config["intermediate_size"])
    out.append(("model.norm.weight", (h,)))
    if not config.get("tie_word_embeddings", False):
        out.append(("lm_head.weight", (config["vocab_size"], h)))
    return [(name, dtype, shape) for name, shape in out]


def _bits(numel, tensor_index, seed, dtype):
    i = torch.arange(numel, dtype=torch.int64)
    h = (i * 2654435761 + (tensor_index + 1) * 40503) % (1 << 31)
    h = h ^ (h >> 13)
    sign = (h >> 20) & 1
    if dtype in (torch.bfloat16, torch.float16):
        mantissa_bits, exponent = (7, 112 + (h >> 7) % 24) if dtype == torch.bfloat16 else (10, 8 + (h >> 7) % 16)
        width = 16
    else:
        mantissa_bits, exponent, width = 23, 112 + (h >> 7) % 24, 32
    # The mantissa moves with the seed: each element changes from one version to the next.
    mantissa = (h + seed * 37) % (1 << mantissa_bits)
    bits = (sign << (width - 1)) | (exponent << mantissa_bits) | mantissa
    bits = torch.where(bits >= (1 << (width - 1)), bits - (1 << width), bits)  # as a signed integer
    return bits.to(_INT_OF_WIDTH[width // 8])


def make_checkpoint(tensors, seed):
    """{name: tensor} of version `seed`, in checkpoint order."""
    out = {}
    for index, (name, dtype, shape) in enumerate(tensors):
        numel = 1
        for extent in shape:
            numel *= extent
        out[name] = _bits(numel, index, seed, dtype).view(dtype).reshape(shape)
    return out


def as_bits(tensor):
    """The tensor's elements as integers of the same width: equality of these is bitwise equality."""
    return tensor.contiguous().view(_INT_OF_WIDTH[tensor.element_size()])


def first_difference(live, expected):
    """None when every tensor of `expected` equals the one of `live` bit for bit, else a description."""
    for name, want in expected.items():
        have = live[name]
        if have.shape != want.shape or have.dtype != want.dtype:
            return f"{name}: {have.dtype}{list(have.shape)} where {want.dtype}{list(want.shape)} was expected"
        differs = as_bits(have) != as_bits(want)
        if bool(differs.any()):
            where = differs.nonzero()[0].tolist()
            return (f"{name}: {int(differs.sum())} of {want.numel()} elements differ, first at {where} "
                    f"({float(have[tuple(where)])} where {float(want[tuple(where)])} was expected)")
    return None

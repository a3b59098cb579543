"""The model of the example: a one-layer language model in Hugging Face naming, held two ways.

TrainerModel is one data-parallel replica of a trainer, with gate and up projections fused into one
tensor; RolloutModel is one rank of an inference engine with tensor parallelism (vocabulary rows, MLP
columns and rows sharded, norms replicated). Each has its own load_weights(weights) taking (name, tensor)
pairs, which is all WeightBridge needs from either side.
"""

import torch
from torch import nn

VOCAB, HIDDEN, INTERMEDIATE = 1000, 256, 1024


def checkpoint_tensors():
    """The canonical checkpoint's tensor list: (name, dtype, shape)."""
    return [
        ("model.embed_tokens.weight", torch.float32, (VOCAB, HIDDEN)),
        ("model.layers.0.input_layernorm.weight", torch.float32, (HIDDEN,)),
        ("model.layers.0.mlp.gate_proj.weight", torch.float32, (INTERMEDIATE, HIDDEN)),
        ("model.layers.0.mlp.up_proj.weight", torch.float32, (INTERMEDIATE, HIDDEN)),
        ("model.layers.0.mlp.down_proj.weight", torch.float32, (HIDDEN, INTERMEDIATE)),
        ("model.norm.weight", torch.float32, (HIDDEN,)),
        ("lm_head.weight", torch.float32, (VOCAB, HIDDEN)),
    ]


def initial_checkpoint():
    """Version 0, the same on every rank (a real job reads it from its Hugging Face checkpoint)."""
    generator = torch.Generator().manual_seed(0)
    return [(name, torch.randn(shape, generator=generator, dtype=dtype) * 0.02)
            for name, dtype, shape in checkpoint_tensors()]


class TrainerModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Parameter(torch.zeros(VOCAB, HIDDEN))
        self.input_norm = nn.Parameter(torch.zeros(HIDDEN))
        self.fc1 = nn.Parameter(torch.zeros(2 * INTERMEDIATE, HIDDEN))  # [gate; up]
        self.fc2 = nn.Parameter(torch.zeros(HIDDEN, INTERMEDIATE))
        self.final_norm = nn.Parameter(torch.zeros(HIDDEN))
        self.output = nn.Parameter(torch.zeros(VOCAB, HIDDEN))

    @torch.no_grad()
    def load_weights(self, weights):
        for name, tensor in weights:
            if name.endswith("gate_proj.weight"):
                self.fc1[:INTERMEDIATE].copy_(tensor)
            elif name.endswith("up_proj.weight"):
                self.fc1[INTERMEDIATE:].copy_(tensor)
            else:
                target = {"model.embed_tokens.weight": self.embedding,
                          "model.layers.0.input_layernorm.weight": self.input_norm,
                          "model.layers.0.mlp.down_proj.weight": self.fc2,
                          "model.norm.weight": self.final_norm, "lm_head.weight": self.output}[name]
                target.copy_(tensor)

    @torch.no_grad()
    def train_step(self, step):
        # Stands in for forward, backward and the optimizer: every replica takes the same step.
        generator = torch.Generator().manual_seed(step)
        for param in self.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 1e-3)

    def checksum(self):
        return sum(float(p.double().sum()) for p in self.parameters())


class RolloutModel(nn.Module):
    def __init__(self, tp_rank, tp_size):
        super().__init__()
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.rows, self.columns = VOCAB // tp_size, INTERMEDIATE // tp_size
        self.embed_tokens = nn.Parameter(torch.zeros(self.rows, HIDDEN), requires_grad=False)
        self.input_layernorm = nn.Parameter(torch.zeros(HIDDEN), requires_grad=False)
        self.gate_up_proj = nn.Parameter(torch.zeros(2 * self.columns, HIDDEN), requires_grad=False)
        self.down_proj = nn.Parameter(torch.zeros(HIDDEN, self.columns), requires_grad=False)
        self.norm = nn.Parameter(torch.zeros(HIDDEN), requires_grad=False)
        self.lm_head = nn.Parameter(torch.zeros(self.rows, HIDDEN), requires_grad=False)

    def load_weights(self, weights):
        rows = slice(self.tp_rank * self.rows, (self.tp_rank + 1) * self.rows)
        for name, tensor in weights:
            if name == "model.embed_tokens.weight":
                self.embed_tokens.data.copy_(tensor[rows])
            elif name == "lm_head.weight":
                self.lm_head.data.copy_(tensor[rows])
            elif name.endswith(("gate_proj.weight", "up_proj.weight")):
                gate, up = self.gate_up_proj.data.chunk(2)
                shard = tensor.narrow(0, self.tp_rank * self.columns, self.columns)
                (gate if "gate_proj" in name else up).copy_(shard)
            elif name.endswith("down_proj.weight"):
                self.down_proj.data.copy_(tensor.narrow(1, self.tp_rank * self.columns, self.columns))
            elif name.endswith("input_layernorm.weight"):
                self.input_layernorm.data.copy_(tensor)
            elif name == "model.norm.weight":
                self.norm.data.copy_(tensor)

    def checksum_part(self):
        """This rank's share of the model's checksum: replicated tensors count on TP rank 0 only."""
        replicated = {"input_layernorm", "norm"}
        return sum(float(p.double().sum()) for n, p in self.named_parameters()
                   if n not in replicated or self.tp_rank == 0)

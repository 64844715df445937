"""A tiny random diffusion transformer in torch (MDLM's DiT shape), and its ONNX export.

The variants, all with rotary positions and bidirectional attention over what they are given:

- ``mdlm``: no time conditioning (like MDLM's OpenWebText checkpoint), so the sampler's cache applies;
- ``mdlm-tc``: adaLN time conditioning on ``sigma``, as MDLM's DiT has it;
- ``bd3lm``: a block-diffusion model whose graph exposes ``past_key_values.*`` / ``present.*``: a chunk
  attends to every cached key and to itself, which is block-causal attention when chunks are blocks;
- a graph may also take a 4-D additive ``attention_mask`` ``[batch, 1, query, key]`` (0 where a query
  may attend, a large negative number where not): with it and no cache, block-causal attention comes
  from the mask alone (BD3LM without its cache recomputes the whole sequence under that mask).

The weights are random (seeded), the sizes tiny, so an export takes a second or two on a CPU.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

HIDDEN = 64
LAYERS = 2
HEADS = 4
COND = 32


@dataclasses.dataclass(frozen=True)
class TinyConfig:
    """The shape of one tiny model."""

    vocab_size: int
    time_conditioning: bool = False
    kv_cache: bool = False
    #: The graph takes a 4-D additive ``attention_mask``.
    mask_input: bool = False
    hidden: int = HIDDEN
    layers: int = LAYERS
    heads: int = HEADS
    seed: int = 0
    #: Token ids left as they are; every other id below 256 is pushed down (readable random text).
    readable: tuple[int, ...] = ()
    #: Push the special tokens (ids from 256) down too, so a generation never ends early (the bench's
    #: timed runs must all produce the same number of tokens).
    no_specials: bool = False

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


class _TimeEmbedding(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(COND, COND), nn.SiLU(), nn.Linear(COND, COND))
        self.register_buffer("freqs", torch.exp(-math.log(10000.0) * torch.arange(COND // 2) / (COND // 2)))

    def forward(self, sigma: torch.Tensor) -> torch.Tensor:
        args = sigma[:, None].float() * self.freqs[None]
        return self.mlp(torch.cat([torch.cos(args), torch.sin(args)], dim=-1))


class _Block(nn.Module):
    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        h = config.hidden
        self.config = config
        self.norm1 = nn.LayerNorm(h, elementwise_affine=False)
        self.norm2 = nn.LayerNorm(h, elementwise_affine=False)
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.out = nn.Linear(h, h)
        self.mlp = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(approximate="tanh"), nn.Linear(4 * h, h))
        self.ada = nn.Linear(COND, 6 * h) if config.time_conditioning else None

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        cond: torch.Tensor | None,
        past_k: torch.Tensor | None,
        past_v: torch.Tensor | None,
        bias: torch.Tensor | None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, t, h = x.shape
        if self.ada is not None and cond is not None:
            shift1, scale1, gate1, shift2, scale2, gate2 = self.ada(cond)[:, None].chunk(6, dim=-1)
        else:
            zero = x.new_zeros(1, 1, h)
            shift1 = scale1 = shift2 = scale2 = zero
            gate1 = gate2 = zero + 1
        y = self.norm1(x) * (1 + scale1) + shift1
        q, k, v = self.qkv(y).view(b, t, 3, self.config.heads, self.config.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if past_k is not None and past_v is not None:
            k = torch.cat([past_k, k], dim=2)
            v = torch.cat([past_v, v], dim=2)
        scores = q @ k.transpose(-1, -2) / math.sqrt(self.config.head_dim)
        if bias is not None:
            scores = scores + bias
        weights = torch.softmax(scores, dim=-1)
        attended = (weights @ v).transpose(1, 2).reshape(b, t, h)
        x = x + gate1 * self.out(attended)
        y = self.norm2(x) * (1 + scale2) + shift2
        return x + gate2 * self.mlp(y), k, v


class TinyDiffusionLM(nn.Module):
    """The denoiser: token ids (masks included), optionally sigma and past keys/values, to logits."""

    def __init__(self, config: TinyConfig) -> None:
        super().__init__()
        torch.manual_seed(config.seed)
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.hidden)
        self.time = _TimeEmbedding() if config.time_conditioning else None
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.layers))
        self.norm = nn.LayerNorm(config.hidden, elementwise_affine=False)
        self.head = nn.Linear(config.hidden, config.vocab_size)
        half = config.head_dim // 2
        self.register_buffer("inv_freq", 1.0 / (10000.0 ** (torch.arange(half).float() / half)))
        # Random weights give near-uniform logits; a larger head spreads them so sampling is not a coin toss.
        # Tokens outside ``readable`` are pushed down, so the random text is printable.
        with torch.no_grad():
            self.head.weight.mul_(8.0)
            if config.readable:
                unreadable = [i for i in range(min(256, config.vocab_size)) if i not in set(config.readable)]
                self.head.bias[unreadable] -= 12.0
            if config.no_specials:
                self.head.bias[256:] -= 12.0

    def forward(
        self,
        input_ids: torch.Tensor,
        sigma: torch.Tensor | None = None,
        past: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        bias: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
        """Logits for every position, and each layer's keys/values (past ones included).

        ``bias`` is added to the attention scores ``[batch, 1, query, past + query]`` (0 or very negative).
        """
        offset = past[0][0].shape[2] if past else 0
        positions = torch.arange(input_ids.shape[1], dtype=torch.float32) + offset
        angles = positions[:, None] * self.inv_freq[None]
        cos = torch.cat([angles.cos(), angles.cos()], dim=-1)[None, None]
        sin = torch.cat([angles.sin(), angles.sin()], dim=-1)[None, None]
        cond = self.time(sigma) if self.time is not None and sigma is not None else None
        x = self.embed(input_ids)
        present = []
        for i, block in enumerate(self.blocks):
            past_k, past_v = past[i] if past else (None, None)
            x, k, v = block(x, cos, sin, cond, past_k, past_v, bias)
            present.append((k, v))
        return self.head(self.norm(x)), present


class _Export(nn.Module):
    """The graph's inputs in order: ``input_ids`` [, ``sigma``] [, ``attention_mask``] [, ``past_key_values.*``]."""

    def __init__(self, model: TinyDiffusionLM) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor, *rest: torch.Tensor) -> tuple[torch.Tensor, ...]:
        config = self.model.config
        items = list(rest)
        sigma = items.pop(0) if config.time_conditioning else None
        bias = items.pop(0) if config.mask_input else None
        past = [(items[2 * i], items[2 * i + 1]) for i in range(len(items) // 2)] if config.kv_cache else None
        logits, present = self.model(input_ids, sigma, past, bias)
        if not config.kv_cache:
            return (logits,)
        return (logits, *[t for pair in present for t in pair])


def export_onnx(model: TinyDiffusionLM, path: str) -> None:
    """Export the graph kohra reads.

    Inputs ``input_ids`` [+ ``sigma``] [+ ``attention_mask``] [+ ``past_key_values.*``]; outputs
    ``logits`` [+ ``present.*``].
    """
    config = model.config
    model.eval()
    ids = torch.zeros(1, 5, dtype=torch.int64)
    past_length = 3 if config.kv_cache else 0
    dynamic: dict[str, dict[int, str]] = {
        "input_ids": {0: "batch", 1: "sequence"},
        "logits": {0: "batch", 1: "sequence"},
    }
    args: list[torch.Tensor] = [ids]
    in_names, out_names = ["input_ids"], ["logits"]
    if config.time_conditioning:
        args.append(torch.tensor([0.5]))
        in_names.append("sigma")
        dynamic["sigma"] = {0: "batch"}
    if config.mask_input:
        args.append(torch.zeros(1, 1, 5, past_length + 5))
        in_names.append("attention_mask")
        dynamic["attention_mask"] = {0: "batch", 2: "sequence", 3: "total_sequence"}
    if config.kv_cache:
        for i in range(config.layers):
            for kind in ("key", "value"):
                args.append(torch.zeros(1, config.heads, past_length, config.head_dim))
                in_names.append(f"past_key_values.{i}.{kind}")
                out_names.append(f"present.{i}.{kind}")
                dynamic[f"past_key_values.{i}.{kind}"] = {0: "batch", 2: "past_sequence"}
                dynamic[f"present.{i}.{kind}"] = {0: "batch", 2: "total_sequence"}
    with torch.no_grad():
        torch.onnx.export(
            _Export(model),
            tuple(args),
            path,
            input_names=in_names,
            output_names=out_names,
            dynamic_axes=dynamic,
            opset_version=17,
            dynamo=False,
        )

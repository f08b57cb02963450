"""A GPT decoder built from a ModelSpec, constructible as one pipeline chunk.

Module names are stable across layouts (``embed.tok``, ``layers.<global index>.attn.q``,
``head.out``) so that parameters are initialized identically whatever the plan
(see ``autoplan.runtime.init``). Features: learned or rotary positions, LayerNorm or
RMSNorm, GELU or SwiGLU MLP (or a mixture of such experts: autoplan.runtime.experts),
grouped-query attention, tied input/output embeddings.
Recomputation per layer: ``none``, ``selective`` (core attention recomputed) or ``full``
(whole layer), with non-reentrant ``torch.utils.checkpoint``. Context parallelism: each rank runs
one chunk of every sequence (:func:`set_context`, autoplan.runtime.context_parallel).

Attention and MLP read their head/width counts from the tensors, so the same code runs
unsharded and under DTensor tensor parallelism (local shards of q/k/v and fc1).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from autoplan.runtime.context_parallel import ContextShard
from autoplan.runtime.experts import ExpertShard, MoEMLP
from simulator.specs import ModelSpec


def _norm(spec: ModelSpec) -> nn.Module:
    if spec.normalization == "RMSNorm":
        return nn.RMSNorm(spec.hidden_size, eps=1e-5)
    return nn.LayerNorm(spec.hidden_size, eps=1e-5)


def _has_bias(spec: ModelSpec) -> bool:
    """GPT-style (LayerNorm) models carry linear biases; Llama-style (RMSNorm) ones do not."""
    return spec.normalization == "LayerNorm"


@functools.lru_cache(maxsize=8)
def _rope_tables(seq: int, head_dim: int, theta: float, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    ang = torch.outer(torch.arange(seq, dtype=torch.float32), inv)
    return ang.cos().to(device), ang.sin().to(device)


def apply_rope(x: torch.Tensor, theta: float, offset: int = 0) -> torch.Tensor:
    """Rotary embedding (rotate-half form, base ``theta``) of ``x`` shaped (batch, heads, seq,
    head_dim), whose first token sits at position ``offset`` (a context-parallel chunk)."""
    seq, hd = x.shape[-2], x.shape[-1]
    cos, sin = _rope_tables(offset + seq, hd, theta, x.device)
    cos, sin = cos[offset:].to(x.dtype), sin[offset:].to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def _core_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """Scores, causal softmax and weighted sum: what selective recomputation recomputes;
    ``mask``: the causal mask of a context-parallel chunk's queries over the whole sequence."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if mask is not None:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


class Attention(nn.Module):
    """Causal self-attention with separate q/k/v projections (GQA: k/v have fewer heads)."""

    def __init__(self, spec: ModelSpec, selective: bool):
        super().__init__()
        bias = _has_bias(spec)
        self.head_dim = spec.head_dim
        self.rope_theta = spec.rope_theta if spec.position_embedding_type == "rope" else None
        self.selective = selective
        self.q = nn.Linear(spec.hidden_size, spec.hidden_size, bias=bias)
        self.k = nn.Linear(spec.hidden_size, spec.kv_size, bias=bias)
        self.v = nn.Linear(spec.hidden_size, spec.kv_size, bias=bias)
        self.o = nn.Linear(spec.hidden_size, spec.hidden_size, bias=bias)
        self.context: ContextShard | None = None  # context parallelism (set_context)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q = self.q(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).view(b, s, -1, self.head_dim).transpose(1, 2)
        cp = self.context
        offset = cp.offset(s) if cp is not None else 0
        if self.rope_theta is not None:
            q, k = apply_rope(q, self.rope_theta, offset), apply_rope(k, self.rope_theta, offset)
        mask = None
        if cp is not None:  # the whole sequence's keys and values, masked by global position
            k, v, mask = cp.gather(k), cp.gather(v), cp.causal_mask(s, x.device)
        if self.selective and torch.is_grad_enabled():
            y = checkpoint(_core_attention, q, k, v, mask, use_reentrant=False)
        else:
            y = _core_attention(q, k, v, mask)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class MLP(nn.Module):
    """GELU MLP (fc1, fc2) or SwiGLU (gate, fc1 as 'up', fc2 as 'down')."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        bias = _has_bias(spec)
        self.swiglu = spec.activation == "swiglu"
        self.fc1 = nn.Linear(spec.hidden_size, spec.ffn, bias=bias)
        self.gate = nn.Linear(spec.hidden_size, spec.ffn, bias=bias) if self.swiglu else None
        self.fc2 = nn.Linear(spec.ffn, spec.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate is not None:
            return self.fc2(F.silu(self.gate(x)) * self.fc1(x))
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


class Block(nn.Module):
    """Pre-norm transformer layer; ``recompute`` is none, selective or full."""

    def __init__(self, spec: ModelSpec, recompute: str = "none"):
        super().__init__()
        self.recompute = recompute
        self.ln1 = _norm(spec)
        self.attn = Attention(spec, selective=recompute == "selective")
        self.ln2 = _norm(spec)
        self.mlp: nn.Module = MoEMLP(spec, MLP) if spec.num_experts else MLP(spec)

    def _body(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.recompute == "full" and torch.is_grad_enabled():
            return checkpoint(self._body, x, use_reentrant=False)
        return self._body(x)


class Embed(nn.Module):
    """Token embedding plus learned absolute positions (unless the model uses RoPE)."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.tok = nn.Embedding(spec.vocab_size, spec.hidden_size)
        self.pos = (
            nn.Embedding(spec.seq_length, spec.hidden_size)
            if spec.position_embedding_type == "learned_absolute"
            else None
        )
        self.context: ContextShard | None = None  # context parallelism (set_context)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.tok(tokens)
        if self.pos is not None:
            start = self.context.offset(tokens.shape[1]) if self.context is not None else 0
            x = x + self.pos(torch.arange(start, start + tokens.shape[1], device=tokens.device))
        return x


class Head(nn.Module):
    """Final norm and the output projection to the vocabulary."""

    def __init__(self, spec: ModelSpec):
        super().__init__()
        self.norm = _norm(spec)
        self.out = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(x))


class GPT(nn.Module):
    """The layers ``layer_ids`` of a GPT, with the embedding and/or head when requested.

    The whole model is ``GPT(spec, range(num_layers), True, True)``; a pipeline chunk holds
    a contiguous slice of layers, the first chunk the embedding, the last the head.
    """

    def __init__(
        self,
        spec: ModelSpec,
        layer_ids: Sequence[int],
        first: bool,
        last: bool,
        recompute: dict[int, str] | None = None,
    ):
        super().__init__()
        recompute = recompute or {}
        self.spec = spec
        self.embed = Embed(spec) if first else None
        self.layers = nn.ModuleDict({str(i): Block(spec, recompute.get(i, "none")) for i in layer_ids})
        self.head = Head(spec) if last else None
        self.tie_weights()

    @property
    def tied_locally(self) -> bool:
        """True when this chunk holds both ends of tied embeddings (one shared parameter)."""
        return self.spec.tie_embeddings and self.embed is not None and self.head is not None

    def tie_weights(self) -> None:
        """Share the output projection with the token embedding (call again after to_empty)."""
        if self.embed is not None and self.head is not None and self.spec.tie_embeddings:
            self.head.out.weight = self.embed.tok.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        if self.head is not None:
            x = self.head(x)
        return x


def set_context(model: nn.Module, shard: ContextShard) -> None:
    """Run ``model`` on one context-parallel chunk of each sequence (autoplan.runtime.context_parallel):
    its attentions gather the whole sequence's keys and values, its positions start at the chunk's."""
    for module in model.modules():
        if isinstance(module, (Attention, Embed)):
            module.context = shard


def keep_experts(model: nn.Module, shard: ExpertShard) -> None:
    """Keep only this rank's experts in every mixture-of-experts MLP of ``model``
    (autoplan.runtime.experts)."""
    for module in model.modules():
        if isinstance(module, MoEMLP):
            module.keep_shard(shard)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross entropy over every position of the microbatch, in fp32."""
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def layer_recompute(
    spec: ModelSpec, chunk_layers: Sequence[int], chunk_recompute: Sequence[tuple[int, int]]
) -> dict[int, str]:
    """Recompute mode of every layer: in each chunk the first ``full`` layers are fully
    recomputed, the next ``selective`` ones selectively, the rest not at all."""
    modes: dict[int, str] = {}
    start = 0
    for n, (full, sel) in zip(chunk_layers, chunk_recompute):
        for j in range(n):
            modes[start + j] = "full" if j < full else "selective" if j < full + sel else "none"
        start += n
    return modes

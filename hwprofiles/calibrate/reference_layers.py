"""The layers whose eager host time ``autoplan calibrate`` measures (:mod:`hwprofiles.calibrate.eager`),
and the work they give calibrate's other benchmarks.

* :class:`ReferenceLayer`: the pre-norm GPT layer (LayerNorm; q, k, v, o Linear; causal
  scaled-dot-product attention; LayerNorm; Linear, tanh-GELU, Linear; two residual adds), as
  ``autoplan.runtime`` and Megatron-LM order it;
* :class:`LlamaReferenceLayer`: the Llama layer (RMSNorm, q/k/v/o without biases and
  grouped-query attention, rotary embedding in its rotate-half form, SwiGLU);
* :data:`LayerSplit`: how the program splits a layer over a tensor-parallel mesh (given by the
  caller: ``autoplan calibrate`` passes autoplan's own, autoplan.runtime.tensor_parallel.split_layer);
* :func:`layer_training_step`: a single-threaded training step of the GPT layer at a size with
  real arithmetic, the busy ranks' work in ``calibrate.ranks`` and ``calibrate.wait``.

By default the layers are as small as :data:`HIDDEN` and :data:`HEADS` say: negligible
arithmetic, every block all host work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

#: splits a layer with the names of :class:`ReferenceLayer` over a 1-D DeviceMesh, in place
LayerSplit = Callable[[nn.Module, Any], None]

#: hidden size and attention heads of the timed layers: negligible arithmetic, every block is all host work
HIDDEN, HEADS = 16, 2


class _Attention(nn.Module):
    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (nn.Linear(h, h) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, -1, x.shape[-1] // self.heads).transpose(1, 2) for p in (self.q, self.k, self.v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class _Mlp(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def _rope(x: torch.Tensor) -> torch.Tensor:
    """Rotary embedding, rotate-half form (autoplan.runtime.model.apply_rope's ops)."""
    s, hd = x.shape[-2], x.shape[-1]
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=x.device, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(s, device=x.device, dtype=torch.float32), inv)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


class _LlamaAttention(nn.Module):
    """Grouped-query attention (half as many k/v heads), rotary positions, no biases."""

    def __init__(self, h: int, heads: int):
        super().__init__()
        self.heads, self.kv = heads, max(1, heads // 2)
        hd = h // heads
        self.q, self.o = nn.Linear(h, h, bias=False), nn.Linear(h, h, bias=False)
        self.k, self.v = nn.Linear(h, self.kv * hd, bias=False), nn.Linear(h, self.kv * hd, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        hd = h // self.heads
        q, k, v = (p(x).view(b, s, -1, hd).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k = _rope(q), _rope(k)
        rep = self.heads // self.kv
        k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


class _SwiGlu(nn.Module):
    def __init__(self, h: int):
        super().__init__()
        self.gate, self.fc1, self.fc2 = (
            nn.Linear(h, 4 * h, bias=False),
            nn.Linear(h, 4 * h, bias=False),
            nn.Linear(4 * h, h, bias=False),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.silu(self.gate(x)) * self.fc1(x))


class LlamaReferenceLayer(nn.Module):
    """The Llama layer whose host time is measured (module docstring)."""

    def __init__(self, h: int = HIDDEN, heads: int = HEADS):
        super().__init__()
        self.ln1, self.ln2 = nn.RMSNorm(h, eps=1e-5), nn.RMSNorm(h, eps=1e-5)
        self.attn, self.mlp = _LlamaAttention(h, heads), _SwiGlu(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class ReferenceLayer(nn.Module):
    """The pre-norm GPT layer whose host time is measured (module docstring)."""

    def __init__(self, h: int = HIDDEN, heads: int = HEADS):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(h), nn.LayerNorm(h)
        self.attn, self.mlp = _Attention(h, heads), _Mlp(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


TRAINING_HIDDEN, TRAINING_HEADS, TRAINING_TOKENS = 256, 4, 128


def layer_training_step() -> Callable[[], None]:
    """One single-threaded training step of the reference layer at hidden 256, 128 tokens:
    forward, backward and an AdamW step (GEMMs, elementwise ops, eager host work and the
    optimizer's memory passes, as training). The work of calibrate's busy ranks."""
    layer = ReferenceLayer(TRAINING_HIDDEN, TRAINING_HEADS)
    opt = torch.optim.AdamW(layer.parameters(), lr=1e-4)
    x = torch.randn(1, TRAINING_TOKENS, TRAINING_HIDDEN, requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()
        opt.step()

    return step

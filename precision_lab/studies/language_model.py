"""A character-level language model trained under emulated precisions (issue 34).

A small GPT (:class:`CharGPT`: token and position embeddings, pre-norm blocks of causal
``F.scaled_dot_product_attention`` or ``nn.TransformerEncoderLayer`` and a GELU MLP, a linear
head) is trained on a fixed text corpus (:func:`corpus`) once per entry of :data:`RUNS`, every
GEMM through :func:`precision_lab.torch.simulate`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

__all__ = ["CharGPT"]


class _Block(torch.nn.Module):
    """One pre-norm transformer block: causal self-attention and a GELU MLP, each residual."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = torch.nn.LayerNorm(d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, length, d = x.shape
        qkv = self.qkv(self.ln1(x)).reshape(n, length, 3, self.heads, d // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(n, length, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class CharGPT(torch.nn.Module):
    """A small GPT over characters: ``vocab`` tokens, ``layers`` blocks of width ``d`` with
    ``heads`` heads, contexts of up to ``context`` characters; ``attention``: ``"sdpa"``
    (explicit q, k, v projections and ``F.scaled_dot_product_attention``, causal) or
    ``"encoder"`` (``nn.TransformerEncoderLayer``, pre-norm, GELU, with a causal mask). The
    forward takes token ids ``(batch, length)`` and returns the logits ``(batch, length,
    vocab)``. Initialised from ``numpy.random.default_rng(seed)`` (GPT-2's
    normal init, std 0.02, the residual projections' scaled by ``1/sqrt(2 layers)``; biases
    zero, LayerNorm weights one).

    >>> m = CharGPT(vocab=10, d=16, heads=2, layers=1, context=8)
    >>> m(torch.zeros(2, 8, dtype=torch.long)).shape
    torch.Size([2, 8, 10])
    """

    def __init__(
        self,
        *,
        vocab: int,
        d: int = 128,
        heads: int = 4,
        layers: int = 2,
        context: int = 64,
        attention: str = "sdpa",
        seed: int = 0,
    ) -> None:
        super().__init__()
        if attention not in ("sdpa", "encoder"):
            raise ValueError(f"attention must be 'sdpa' or 'encoder', got {attention!r}")
        if d % heads:
            raise ValueError(f"d must be a multiple of heads, got d={d}, heads={heads}")
        rng = np.random.default_rng(seed)
        self.context = context
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(context, d)
        self.attention = attention
        blocks: list[torch.nn.Module] = []
        for _ in range(layers):
            if attention == "sdpa":
                blocks.append(_Block(d, heads))
            else:
                blocks.append(torch.nn.TransformerEncoderLayer(
                    d, heads, 4 * d, dropout=0.0, activation="gelu", batch_first=True,
                    norm_first=True))  # fmt: skip
        self.blocks = torch.nn.ModuleList(blocks)
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab)
        with torch.no_grad():
            for name, p in self.named_parameters():
                if p.dim() >= 2:
                    residual = name.endswith(("proj.weight", "fc2.weight", "linear2.weight"))
                    std = 0.02 / math.sqrt(2 * layers) if residual else 0.02
                    w = rng.standard_normal(tuple(p.shape)) * std  # (numpy: the same bits on
                    p.copy_(torch.from_numpy(w.astype(np.float32)))  # every CPU; torch.randn's
                    # vectorised Box-Muller depends on the CPU's instruction set)
                elif name.endswith("bias"):
                    p.zero_()

    def forward(self, idx: torch.Tensor) -> Any:
        length = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(length))
        if self.attention == "sdpa":
            for b in self.blocks:
                x = b(x)
        else:
            mask = torch.ones(length, length, dtype=torch.bool).triu(1)
            for b in self.blocks:
                x = b(x, src_mask=mask, is_causal=True)
        return self.head(self.ln(x))

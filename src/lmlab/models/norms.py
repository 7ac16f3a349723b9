"""Normalisation layers: :class:`LayerNorm` ``γ(x-μ)/σ+β`` and :class:`RMSNorm` ``γ x / rms(x)``
(Zhang & Sennrich 2019)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmlab.errors import LmlabError


class LayerNorm(nn.LayerNorm):
    """``γ (x - mean) / sqrt(var + eps) + β`` over the last dimension (Ba et al. 2016); ``bias=False``
    drops β."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = True):
        super().__init__(dim, eps=eps, bias=bias)


class RMSNorm(nn.Module):
    """``γ x / sqrt(mean(x²) + eps)``: no centring, no β (Zhang & Sennrich 2019; Llama, T5).

    Computed in float32 and cast back, as Llama and T5 do, so half-precision runs stay stable.
    """

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def make_norm(kind: str, dim: int, eps: float, bias: bool = True) -> nn.Module:
    """``"layernorm"`` or ``"rmsnorm"``."""
    if kind == "layernorm":
        return LayerNorm(dim, eps, bias)
    if kind == "rmsnorm":
        return RMSNorm(dim, eps)
    raise LmlabError(f"unknown norm {kind!r}", "use 'layernorm' or 'rmsnorm'")

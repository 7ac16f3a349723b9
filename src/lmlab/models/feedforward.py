"""Activations and the position-wise feed-forward layer ``act(x W1) W2`` (gated: SwiGLU, GEGLU;
Shazeer 2020)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.errors import LmlabError


def gelu_new(x: Tensor) -> Tensor:
    """GELU with the tanh approximation used by GPT-2, ALBERT and T5 v1.1 ("gelu_new")."""
    return F.gelu(x, approximate="tanh")


#: activation name -> (function, gated). Gated ones are GLU variants (Shazeer 2020).
ACTIVATIONS: dict[str, tuple[Callable[[Tensor], Tensor], bool]] = {
    "relu": (F.relu, False),
    "gelu": (F.gelu, False),
    "gelu_new": (gelu_new, False),
    "gelu_tanh": (gelu_new, False),
    "gelu_pytorch_tanh": (gelu_new, False),
    "silu": (F.silu, False),
    "swish": (F.silu, False),
    "tanh": (torch.tanh, False),
    "swiglu": (F.silu, True),
    "geglu": (F.gelu, True),
    "gated-gelu": (gelu_new, True),
    "reglu": (F.relu, True),
}


def get_activation(name: str) -> tuple[Callable[[Tensor], Tensor], bool]:
    """``(function, gated)`` for an activation name; unknown names are a one-line LmlabError."""
    if name not in ACTIVATIONS:
        raise LmlabError(f"unknown activation {name!r}", f"choose one of: {', '.join(ACTIVATIONS)}")
    return ACTIVATIONS[name]




class FeedForward(nn.Module):
    """Position-wise FFN: ``fc_out(act(fc_in(x)))``, or gated ``fc_out(act(fc_gate(x)) * fc_in(x))``.

    ``activation`` is a name from :data:`ACTIVATIONS`; ``swiglu`` (Llama), ``geglu`` and
    ``gated-gelu`` (T5 v1.1) are the gated ones. ``dropout`` (default 0) applies after the
    activation, as T5 does; the residual dropout belongs to :class:`TransformerBlock`.
    """

    def __init__(
        self, d_model: int, d_ff: int, activation: str = "gelu", bias: bool = True, dropout: float = 0.0
    ):
        super().__init__()
        self.act, gated = get_activation(activation)
        self.fc_gate = nn.Linear(d_model, d_ff, bias=bias) if gated else None
        self.fc_in = nn.Linear(d_model, d_ff, bias=bias)
        self.fc_out = nn.Linear(d_ff, d_model, bias=bias)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()

    def forward(self, x: Tensor) -> Tensor:
        if self.fc_gate is not None:
            h = self.act(self.fc_gate(x)) * self.fc_in(x)
        else:
            h = self.act(self.fc_in(x))
        return self.fc_out(self.drop(h))

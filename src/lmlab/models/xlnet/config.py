"""XLNet's config and preset (``xlnet-tiny``)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.models.config import TransformerConfig


@dataclass
class XLNetConfig(TransformerConfig):
    """XLNet: pre-norm blocks, rotary (relative) positions by default, a tied LM head."""

    family: str = "xlnet"
    prenorm: bool = True
    positions: str = "rotary"
    norm_eps: float = 1e-5
    dropout: float = 0.1
    attn_dropout: float = 0.0

    def validate(self) -> XLNetConfig:
        super().validate()
        if self.positions not in ("rotary", "learned", "sinusoidal"):
            raise LmlabError(
                f"XLNet supports rotary, learned or sinusoidal positions, not {self.positions!r}",
                "set positions='rotary' (the query stream needs to know the target position)",
            )
        return self


def xlnet_tiny() -> XLNetConfig:
    """A 2-layer, 64-wide XLNet for 2-core CPU runs (the ``xlnet-tiny`` preset)."""
    return XLNetConfig(vocab_size=8000, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_positions=1024)

"""Transformer-XL's config and preset (``transfo-xl-tiny``)."""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.models.config import TransformerConfig


@dataclass
class TransfoXLConfig(TransformerConfig):
    """Transformer-XL: ``mem_len`` tokens of memory per layer; ``max_positions`` bounds one segment."""

    family: str = "transfo-xl"
    prenorm: bool = True
    positions: str = "relative"
    norm_eps: float = 1e-5
    attn_bias: bool = False
    attn_dropout: float = 0.0
    mem_len: int = 64

    def validate(self) -> TransfoXLConfig:
        super().validate()
        if self.positions != "relative":
            raise LmlabError(
                f"Transformer-XL uses relative positions, not {self.positions!r}", "set positions='relative'"
            )
        return self


def transfo_xl_tiny() -> TransfoXLConfig:
    """A 2-layer, 64-wide Transformer-XL for 2-core CPU runs (the ``transfo-xl-tiny`` preset)."""
    return TransfoXLConfig(
        vocab_size=8000, d_model=64, n_layers=2, n_heads=4, d_ff=256, max_positions=512, mem_len=64
    )

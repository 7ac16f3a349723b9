"""The decoder family's config and presets: GPT-2 and Llama."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.models.config import PRESET_SIZES, TransformerConfig


@dataclass
class DecoderConfig(TransformerConfig):
    """Causal decoders: GPT-2 (learned positions, LayerNorm, gelu_new, tied head) and Llama
    (RMSNorm, rotary, SwiGLU, grouped-query attention, untied head)."""

    prenorm: bool = True
    activation: str = "gelu_new"
    norm_eps: float = 1e-5
    max_positions: int = 1024
    pad_token_id: int | None = None

    def validate(self) -> DecoderConfig:
        super().validate()
        if not self.prenorm:
            raise LmlabError("decoders are pre-norm in lmlab", "set prenorm=True")
        if self.positions == "relative":
            raise LmlabError("decoders support learned, sinusoidal, rotary or no positions, not 'relative'",
                             "use an encoder-decoder (t5) for relative position bias")
        return self


def _gpt2(size: str) -> DecoderConfig:
    d, n, h, f = PRESET_SIZES[size]
    return DecoderConfig(family="gpt2", vocab_size=50257, d_model=d, n_layers=n, n_heads=h, d_ff=f,
                         bos_token_id=50256, eos_token_id=50256)

def _llama(size: str) -> DecoderConfig:
    d, n, h, _ = PRESET_SIZES[size]
    # SwiGLU's three matrices: d_ff ≈ 8/3 d keeps the FFN parameter count of a 4d GELU FFN.
    return DecoderConfig(family="llama", vocab_size=32000, d_model=d, n_layers=n, n_heads=h,
                         n_kv_heads=max(1, h // 2), d_ff=int(8 * d / 3 + 63) // 64 * 64, activation="swiglu",
                         norm="rmsnorm", norm_eps=1e-6, positions="rotary", max_positions=2048,
                         attn_bias=False, mlp_bias=False, tie_embeddings=False, dropout=0.0, attn_dropout=0.0,
                         bos_token_id=1, eos_token_id=2)


#: preset name -> a fresh config (gpt2-tiny, llama-tiny ...)
PRESETS = {f"{family}-{size}": functools.partial(make, size)
           for family, make in (("gpt2", _gpt2), ("llama", _llama))
           for size in PRESET_SIZES}

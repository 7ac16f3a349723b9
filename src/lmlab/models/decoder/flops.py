"""Parameter and FLOP counts of the decoder family from its config (conventions: lmlab.models.flops),
and what the scaling planner asks of it."""

from __future__ import annotations

from typing import Any

from lmlab.models.decoder.config import DecoderConfig
from lmlab.models.flops import (
    ParameterCount,
    block_params,
    check_counted_heads,
    layer_macs_per_token,
    norm_params,
)


def count_parameters(cfg: DecoderConfig, heads: tuple[str, ...]) -> ParameterCount:
    check_counted_heads(heads, ("lm",))
    d, v = cfg.d_model, cfg.vocab_size
    emb = v * d + (cfg.max_positions * d if cfg.positions == "learned" else 0)
    body = cfg.n_layers * block_params(cfg) + norm_params(cfg, d)
    if "lm" in heads and not cfg.tie_embeddings:
        body += d * v
    return ParameterCount(emb + body, emb)


def forward_flops(cfg: DecoderConfig, seq_len: int, batch_size: int, decoder_len: int | None,
                  logit_positions: int | None, attention: bool, heads: tuple[str, ...]) -> int:
    logits = seq_len if logit_positions is None else logit_positions
    macs = seq_len * cfg.n_layers * layer_macs_per_token(cfg, seq_len, attention)
    return 2 * (macs + logits * cfg.d_model * cfg.vocab_size) * batch_size


def resize(base: DecoderConfig, changes: dict[str, Any]) -> dict[str, Any]:
    return {}


def flops_per_token(cfg: DecoderConfig, seq_len: int, attention: bool) -> float:
    from lmlab.models.flops import training_flops

    return training_flops(cfg, seq_len, attention=attention) / seq_len

"""Parameter and FLOP counts of the encoder family from its config (conventions: lmlab.models.flops),
and what the scaling planner asks of it."""

from __future__ import annotations

from typing import Any

from lmlab.models.encoder.config import EncoderConfig
from lmlab.models.flops import ParameterCount, block_params, check_counted_heads, layer_macs_per_token

#: heads the counts below know
COUNTED_HEADS = ("mlm", "nsp", "discriminator")
#: share of positions an MLM loss predicts: lmlab projects to the vocabulary only there
MLM_FRACTION = 0.15


def pretraining_heads(config: EncoderConfig) -> tuple[str, ...]:
    return ("discriminator",) if config.family == "electra" else ("mlm",)


def _projects_embeddings(cfg: EncoderConfig) -> bool:
    return cfg.embed_dim != cfg.d_model or cfg.family == "albert"


def count_parameters(cfg: EncoderConfig, heads: tuple[str, ...]) -> ParameterCount:
    check_counted_heads(heads, COUNTED_HEADS)
    e, d, v = cfg.embed_dim, cfg.d_model, cfg.vocab_size
    emb = v * e + (cfg.max_positions * e if cfg.positions == "learned" else 0) + cfg.type_vocab_size * e
    body = 2 * e if cfg.embedding_norm else 0  # the embedding LayerNorm always has a bias here
    if _projects_embeddings(cfg):
        body += e * d + d
    body += (cfg.layer_groups or cfg.n_layers) * block_params(cfg)
    if cfg.pooler or "nsp" in heads:
        body += d * d + d
    if "nsp" in heads:
        body += 2 * d + 2  # IsNext / NotNext from the pooled [CLS]
    if "mlm" in heads:
        body += d * e + e + 2 * e + v  # dense, LayerNorm, decoder bias
        body += 0 if cfg.tie_embeddings else e * v
    if "discriminator" in heads:
        body += d * d + d + d + 1
    return ParameterCount(emb + body, emb)


def forward_flops(cfg: EncoderConfig, seq_len: int, batch_size: int, decoder_len: int | None,
                  logit_positions: int | None, attention: bool, heads: tuple[str, ...]) -> int:
    """``mlm`` runs at ``logit_positions`` (default: all), ``discriminator`` at every position."""
    d, e, v = cfg.d_model, cfg.embed_dim, cfg.vocab_size
    logits = seq_len if logit_positions is None else logit_positions
    macs = seq_len * cfg.n_layers * layer_macs_per_token(cfg, seq_len, attention)
    if _projects_embeddings(cfg):
        macs += seq_len * e * d
    if "mlm" in heads:
        macs += logits * (d * e + e * v)  # transform + vocabulary projection
    if "discriminator" in heads:
        macs += seq_len * (d * d + d)
    return 2 * macs * batch_size


def resize(base: EncoderConfig, changes: dict[str, Any]) -> dict[str, Any]:
    """A sized shape embeds in d_model (no factorisation); RoBERTa's positions start after the
    padding id, so its table is that much longer than the context."""
    extra: dict[str, Any] = {"embedding_size": None} if base.embedding_size is not None else {}
    if "max_positions" in changes and base.positions_from_padding:
        extra["max_positions"] = changes["max_positions"] + base.pad_token_id + 1
    return extra


def flops_per_token(cfg: EncoderConfig, seq_len: int, attention: bool) -> float:
    """MLM encoders project to the vocabulary only at the masked share of positions."""
    from lmlab.models.flops import training_flops

    logits = max(1, round(MLM_FRACTION * seq_len))
    return training_flops(cfg, seq_len, logit_positions=logits, attention=attention) / seq_len

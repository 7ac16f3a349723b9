"""Parameter and FLOP counts of the encoder-decoder family from its config (conventions:
lmlab.models.flops), and what the scaling planner asks of it."""

from __future__ import annotations

from typing import Any

from lmlab.models.flops import (
    ParameterCount,
    attention_params,
    block_params,
    check_counted_heads,
    layer_macs_per_token,
    norm_params,
)
from lmlab.models.seq2seq.config import Seq2SeqConfig


def count_parameters(cfg: Seq2SeqConfig, heads: tuple[str, ...]) -> ParameterCount:
    """T5's shared encoder/decoder stack counted once."""
    check_counted_heads(heads, ("lm",))
    d, v = cfg.d_model, cfg.vocab_size
    stacks = 1 if cfg.share_encoder_decoder else 2
    emb = v * d
    if cfg.positions == "learned":
        emb += stacks * (cfg.max_positions + cfg.position_offset) * d
    elif cfg.positions == "relative":
        emb += stacks * cfg.relative_buckets * cfg.n_heads
    per_stack = (norm_params(cfg, d) if cfg.layernorm_embedding else 0) + (
        norm_params(cfg, d) if cfg.prenorm else 0)
    body = stacks * per_stack + cfg.n_layers * block_params(cfg)
    if cfg.share_encoder_decoder:  # the decoder owns only its cross-attention and its norm
        body += cfg.n_layers * (attention_params(cfg, cross=True) + norm_params(cfg, d))
    else:
        body += cfg.decoder_layers * block_params(cfg, cross=True)
    if not cfg.tie_embeddings:
        body += d * v
    return ParameterCount(emb + body, emb)


def forward_flops(cfg: Seq2SeqConfig, seq_len: int, batch_size: int, decoder_len: int | None,
                  logit_positions: int | None, attention: bool, heads: tuple[str, ...]) -> int:
    """The encoder reads ``seq_len`` tokens, the decoder writes ``decoder_len`` (default: as many)."""
    d, v, hd, h = cfg.d_model, cfg.vocab_size, cfg.dim_head, cfg.n_heads
    t_dec = seq_len if decoder_len is None else decoder_len
    logits = t_dec if logit_positions is None else logit_positions
    enc = seq_len * cfg.n_layers * layer_macs_per_token(cfg, seq_len, attention)
    cross_q_o = 2 * d * h * hd
    cross_k_v = 2 * d * h * hd
    dec = t_dec * cfg.decoder_layers * (
        layer_macs_per_token(cfg, t_dec, attention) + cross_q_o + (2 * seq_len * h * hd if attention else 0)
    )
    dec += seq_len * cfg.decoder_layers * cross_k_v  # cross-attention keys/values of the source
    return 2 * (enc + dec + logits * d * v) * batch_size


def resize(base: Seq2SeqConfig, changes: dict[str, Any]) -> dict[str, Any]:
    vocab = changes.get("vocab_size", base.vocab_size)
    return {"decoder_start_token_id": 0} if base.decoder_start_token_id >= vocab else {}


def flops_per_token(cfg: Seq2SeqConfig, seq_len: int, attention: bool) -> float:
    """A row of ``seq_len`` source and ``seq_len`` target tokens: both count as tokens."""
    from lmlab.models.flops import training_flops

    return training_flops(cfg, seq_len, decoder_len=seq_len, attention=attention) / (2 * seq_len)

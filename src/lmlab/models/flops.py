"""Parameter and FLOP counts of lmlab Transformers, computed from the config alone.

Used to size models before building them (scaling laws) and to turn measured tokens/s into model
FLOPs utilisation (MFU) in ``benchmarks/model_throughput.py``.

Conventions (Kaplan et al. 2020, "Scaling laws for neural language models", §2.1; Chowdhery et
al. 2022, PaLM, appendix B):

* A matmul of an ``[n, k]`` by a ``[k, m]`` matrix costs ``2·n·k·m`` FLOPs (multiply + add).
  Biases, norms, activations, softmax and embedding look-ups are not counted (a few percent).
* Forward FLOPs per token = ``2·N_matmul`` (every weight matrix the token passes through) plus
  attention: ``4·S·H·D_head`` per layer for ``S`` keys (``q·kᵀ`` and ``p·v``). Causal attention
  is counted in full, as PaLM does: the kernels compute most of the masked half anyway.
* Training = forward + backward = ``3 ×`` forward (the backward pass computes a gradient for
  both the input and the weight of every matmul).
* For a decoder with the output head at every position this gives the familiar
  ``6·N + 12·L·T·d`` FLOPs per token (:func:`approx_training_flops`).

Output projections are counted only at ``logit_positions`` positions per sequence: an MLM loss
needs the vocabulary projection only where a label is (~15% of positions), and lmlab computes
it only there; transformers computes it everywhere. Pass ``logit_positions`` to count either.

Parameter counts (:func:`count_parameters`) follow the module structure of ``lmlab.models``
(tied matrices once, T5's shared encoder/decoder once) and equal ``model.num_parameters()`` for
the families' pretraining heads; ``embedding`` counts the look-up tables (tokens, positions,
segments, T5 relative-position buckets), ``non_embedding`` the rest (Kaplan's ``N``).
"""

from __future__ import annotations

from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.models.config import DecoderConfig, EncoderConfig, Seq2SeqConfig, TransformerConfig

__all__ = [
    "ParameterCount",
    "approx_training_flops",
    "count_parameters",
    "forward_flops",
    "training_flops",
]


@dataclass(frozen=True)
class ParameterCount:
    """``total`` = ``embedding`` (look-up tables) + ``non_embedding`` (everything else)."""

    total: int
    embedding: int

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding


# ----------------------------------------------------------------------------- parameters


def _norm(cfg: TransformerConfig, dim: int, bias: bool | None = None) -> int:
    bias = cfg.norm_bias if bias is None else bias
    return dim if cfg.norm == "rmsnorm" or not bias else 2 * dim


def _attention_params(cfg: TransformerConfig, cross: bool = False, biases: bool = True) -> int:
    """q, k, v, o projections (cross-attention has no grouped key/value heads)."""
    d, hd = cfg.d_model, cfg.dim_head
    q = cfg.n_heads * hd
    kv = q if cross else cfg.kv_heads * hd
    n = d * q + 2 * d * kv + q * d
    return n + ((q + 2 * kv + d) if cfg.attn_bias and biases else 0)


def _ffn_params(cfg: TransformerConfig) -> int:
    from lmlab.models.blocks import get_activation

    gated = get_activation(cfg.activation)[1]
    n_in = 2 if gated else 1
    weights = (n_in + 1) * cfg.d_model * cfg.d_ff
    biases = (n_in * cfg.d_ff + cfg.d_model) if cfg.mlp_bias else 0
    return weights + biases


def _block_params(cfg: TransformerConfig, cross: bool = False) -> int:
    n = _attention_params(cfg) + _ffn_params(cfg) + 2 * _norm(cfg, cfg.d_model)
    if cross:
        n += _attention_params(cfg, cross=True) + _norm(cfg, cfg.d_model)
    return n


def _pretraining_heads(cfg: TransformerConfig, heads) -> tuple[str, ...]:
    if heads is not None:
        return tuple(heads)
    if isinstance(cfg, EncoderConfig):
        return ("discriminator",) if cfg.family == "electra" else ("mlm",)
    return ("lm",)


def count_parameters(config: TransformerConfig, heads: tuple[str, ...] | None = None) -> ParameterCount:
    """Parameters of the model ``build_model(config, heads=heads)`` would make, from the config.

    ``heads``: None = the family's pretraining heads (mlm; discriminator for ELECTRA; lm), ``()``
    the bare network. Supported heads: ``mlm``, ``discriminator``, ``lm``.
    """
    if not isinstance(config, TransformerConfig):
        raise LmlabError(f"cannot count parameters of a {type(config).__name__}",
                         "pass an EncoderConfig, DecoderConfig or Seq2SeqConfig")
    heads = _pretraining_heads(config, heads)
    unsupported = sorted(set(heads) - {"mlm", "discriminator", "lm"})
    if unsupported:
        raise LmlabError(f"count_parameters does not know the heads {unsupported}",
                         "count a built model with model.num_parameters() instead")
    if isinstance(config, EncoderConfig):
        return _encoder_params(config, heads)
    if isinstance(config, DecoderConfig):
        return _decoder_params(config, heads)
    if isinstance(config, Seq2SeqConfig):
        return _seq2seq_params(config)
    raise LmlabError(f"unknown config class {type(config).__name__}",
                     "pass an encoder, decoder or seq2seq config")


def _encoder_params(cfg: EncoderConfig, heads: tuple[str, ...]) -> ParameterCount:
    e, d, v = cfg.embed_dim, cfg.d_model, cfg.vocab_size
    emb = v * e + (cfg.max_positions * e if cfg.positions == "learned" else 0) + cfg.type_vocab_size * e
    body = 2 * e if cfg.embedding_norm else 0  # the embedding LayerNorm always has a bias here
    if e != d or cfg.family == "albert":
        body += e * d + d
    body += (cfg.layer_groups or cfg.n_layers) * _block_params(cfg)
    if cfg.pooler or "nsp" in heads:
        body += d * d + d
    if "mlm" in heads:
        body += d * e + e + 2 * e + v  # dense, LayerNorm, decoder bias
        body += 0 if cfg.tie_embeddings else e * v
    if "discriminator" in heads:
        body += d * d + d + d + 1
    return ParameterCount(emb + body, emb)


def _decoder_params(cfg: DecoderConfig, heads: tuple[str, ...]) -> ParameterCount:
    d, v = cfg.d_model, cfg.vocab_size
    emb = v * d + (cfg.max_positions * d if cfg.positions == "learned" else 0)
    body = cfg.n_layers * _block_params(cfg) + _norm(cfg, d)
    if "lm" in heads and not cfg.tie_embeddings:
        body += d * v
    return ParameterCount(emb + body, emb)


def _seq2seq_params(cfg: Seq2SeqConfig) -> ParameterCount:
    d, v = cfg.d_model, cfg.vocab_size
    stacks = 1 if cfg.share_encoder_decoder else 2
    emb = v * d
    if cfg.positions == "learned":
        emb += stacks * (cfg.max_positions + cfg.position_offset) * d
    elif cfg.positions == "relative":
        emb += stacks * cfg.relative_buckets * cfg.n_heads
    per_stack = (_norm(cfg, d) if cfg.layernorm_embedding else 0) + (_norm(cfg, d) if cfg.prenorm else 0)
    body = stacks * per_stack + cfg.n_layers * _block_params(cfg)
    if cfg.share_encoder_decoder:  # the decoder owns only its cross-attention and its norm
        body += cfg.n_layers * (_attention_params(cfg, cross=True) + _norm(cfg, d))
    else:
        body += cfg.decoder_layers * _block_params(cfg, cross=True)
    if not cfg.tie_embeddings:
        body += d * v
    return ParameterCount(emb + body, emb)


# ----------------------------------------------------------------------------- FLOPs


def _layer_macs_per_token(cfg: TransformerConfig, keys: int, attention: bool) -> int:
    """Multiply-accumulates of one block for one token: projections, FFN and ``keys`` attention."""
    proj = _attention_params(cfg, biases=False) + _ffn_weights(cfg)
    return proj + (2 * keys * cfg.n_heads * cfg.dim_head if attention else 0)


def _ffn_weights(cfg: TransformerConfig) -> int:
    from lmlab.models.blocks import get_activation

    return (3 if get_activation(cfg.activation)[1] else 2) * cfg.d_model * cfg.d_ff


def forward_flops(
    config: TransformerConfig,
    seq_len: int,
    batch_size: int = 1,
    decoder_len: int | None = None,
    logit_positions: int | None = None,
    attention: bool = True,
    heads: tuple[str, ...] | None = None,
) -> int:
    """Matmul FLOPs of one forward pass over ``batch_size`` sequences of ``seq_len`` tokens.

    * ``decoder_len`` (encoder-decoders): target length; the encoder reads ``seq_len`` tokens.
    * ``logit_positions``: positions per sequence that go through the output head (default: all,
      i.e. ``seq_len``, or ``decoder_len`` for encoder-decoders); 0 = the bare network.
    * ``attention=False`` leaves out the ``q·kᵀ`` and ``p·v`` products (projections only).
    * ``heads`` (encoders): None = the family's pretraining head; ``mlm`` runs at
      ``logit_positions``, ``discriminator`` at every position.
    """
    cfg = config
    if seq_len <= 0 or batch_size <= 0:
        raise LmlabError(f"seq_len and batch_size must be positive, got {seq_len} and {batch_size}",
                         "pass the sequence length and batch size of a real batch")
    d, v, hd, h = cfg.d_model, cfg.vocab_size, cfg.dim_head, cfg.n_heads
    if isinstance(cfg, Seq2SeqConfig):
        t_dec = seq_len if decoder_len is None else decoder_len
        logits = t_dec if logit_positions is None else logit_positions
        enc = seq_len * cfg.n_layers * _layer_macs_per_token(cfg, seq_len, attention)
        cross_q_o = 2 * d * h * hd
        cross_k_v = 2 * d * h * hd
        dec = t_dec * cfg.decoder_layers * (
            _layer_macs_per_token(cfg, t_dec, attention)
            + cross_q_o
            + (2 * seq_len * h * hd if attention else 0)
        )
        dec += seq_len * cfg.decoder_layers * cross_k_v  # cross-attention keys/values of the source
        macs = enc + dec + logits * d * v
    elif isinstance(cfg, EncoderConfig):
        logits = seq_len if logit_positions is None else logit_positions
        e = cfg.embed_dim
        macs = seq_len * cfg.n_layers * _layer_macs_per_token(cfg, seq_len, attention)
        if e != d or cfg.family == "albert":
            macs += seq_len * e * d
        heads = _pretraining_heads(cfg, heads)
        if "mlm" in heads:
            macs += logits * (d * e + e * v)  # transform + vocabulary projection
        if "discriminator" in heads:
            macs += seq_len * (d * d + d)
    elif isinstance(cfg, DecoderConfig):
        logits = seq_len if logit_positions is None else logit_positions
        macs = seq_len * cfg.n_layers * _layer_macs_per_token(cfg, seq_len, attention) + logits * d * v
    else:
        raise LmlabError(f"cannot count FLOPs of a {type(cfg).__name__}",
                         "pass an EncoderConfig, DecoderConfig or Seq2SeqConfig")
    return 2 * macs * batch_size


def training_flops(
    config: TransformerConfig,
    seq_len: int,
    batch_size: int = 1,
    decoder_len: int | None = None,
    logit_positions: int | None = None,
    attention: bool = True,
    heads: tuple[str, ...] | None = None,
) -> int:
    """FLOPs of one forward + backward pass: ``3 × forward_flops`` (same arguments)."""
    return 3 * forward_flops(config, seq_len, batch_size, decoder_len, logit_positions, attention, heads)


def approx_training_flops(
    n_params: float, n_tokens: float, n_layers: int = 0, context: int = 0, d_model: int = 0
) -> float:
    """The rule of thumb ``C ≈ 6·N·D + 12·L·T·d·D`` (Kaplan et al. 2020; PaLM appendix B).

    ``N`` = parameters that take part in matmuls (non-embedding, plus an untied output head),
    ``D`` = training tokens; the attention term needs ``n_layers``, ``context`` and ``d_model``
    (leave them 0 to drop it, as Chinchilla's ``C = 6ND`` does).
    """
    return 6.0 * n_params * n_tokens + 12.0 * n_layers * context * d_model * n_tokens

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
from typing import Any

from lmlab import values
from lmlab.arguments import flag_argument, number_argument, optional_number, text_list_argument
from lmlab.errors import LmlabError

__all__ = [
    "ParameterCount",
    "approx_training_flops",
    "attention_params",
    "block_params",
    "check_counted_heads",
    "ffn_params",
    "count_parameters",
    "forward_flops",
    "layer_macs_per_token",
    "norm_params",
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


def norm_params(cfg: Any, dim: int, bias: bool | None = None) -> int:
    """One LayerNorm (scale and bias) or RMSNorm (scale) over ``dim`` features."""
    bias = cfg.norm_bias if bias is None else bias
    return dim if cfg.norm == "rmsnorm" or not bias else 2 * dim


def attention_params(cfg: Any, cross: bool = False, biases: bool = True) -> int:
    """q, k, v, o projections (cross-attention has no grouped key/value heads)."""
    d, hd = cfg.d_model, cfg.dim_head
    q = cfg.n_heads * hd
    kv = q if cross else cfg.kv_heads * hd
    n = d * q + 2 * d * kv + q * d
    return n + ((q + 2 * kv + d) if cfg.attn_bias and biases else 0)


def ffn_params(cfg: Any) -> int:
    """The feed-forward weights and biases of one block (gated activations have two inputs)."""
    from lmlab.models.blocks import get_activation

    gated = get_activation(cfg.activation)[1]
    n_in = 2 if gated else 1
    weights = (n_in + 1) * cfg.d_model * cfg.d_ff
    biases = (n_in * cfg.d_ff + cfg.d_model) if cfg.mlp_bias else 0
    return weights + biases


def block_params(cfg: Any, cross: bool = False) -> int:
    """One pre- or post-norm block: attention, FFN, two norms (+ cross-attention and its norm)."""
    n = attention_params(cfg) + ffn_params(cfg) + 2 * norm_params(cfg, cfg.d_model)
    if cross:
        n += attention_params(cfg, cross=True) + norm_params(cfg, cfg.d_model)
    return n


#: a family spec's counter -> what it counts, in a message, and the way out when a family has none
COUNTED = {"count_parameters": ("parameters", "count a built model with model.num_parameters() instead"),
           "forward_flops": ("forward FLOPs", "estimate them as 2 x the built model's num_parameters() per "
                             "token")}


def _spec(config: Any, what: str):
    from lmlab.models.registry import spec_of_config

    spec = spec_of_config(config)
    counter = getattr(spec, what)
    if counter is None:
        counted, fix = COUNTED[what]
        raise LmlabError(f"lmlab does not count the {counted} of a {spec.name} model "
                         f"({type(config).__name__}) from its config", fix)
    return spec, counter


def count_parameters(config: Any, heads: tuple[str, ...] | None = None) -> ParameterCount:
    """Parameters of the model ``build_model(config, heads=heads)`` would make, from the config,
    as the config's family (:class:`lmlab.models.family.FamilySpec`) counts them.

    ``heads``: None = the family's pretraining heads (mlm; discriminator for ELECTRA; lm), ``()``
    the bare network. Counted heads: ``mlm``, ``nsp``, ``discriminator`` (encoders), ``lm``.
    """
    spec, counter = _spec(config, "count_parameters")
    return counter(config, spec.default_heads(config) if heads is None else _heads(heads, "count_parameters"))


def _heads(heads: Any, fn: str) -> tuple[str, ...]:
    """``heads`` as a tuple of head names (a bare name is refused with the list to write)."""
    return tuple(text_list_argument(heads, f"{fn}'s heads"))


# ----------------------------------------------------------------------------- FLOPs


def layer_macs_per_token(cfg: Any, keys: int, attention: bool) -> int:
    """Multiply-accumulates of one block for one token: projections, FFN and ``keys`` attention."""
    proj = attention_params(cfg, biases=False) + _ffn_weights(cfg)
    return proj + (2 * keys * cfg.n_heads * cfg.dim_head if attention else 0)


def _ffn_weights(cfg: Any) -> int:
    from lmlab.models.blocks import get_activation

    return (3 if get_activation(cfg.activation)[1] else 2) * cfg.d_model * cfg.d_ff


def forward_flops(
    config: Any,
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
    for name, value in (("seq_len", seq_len), ("batch_size", batch_size)):
        number_argument(values.Count, value, f"forward_flops' {name}")
    optional_number(values.Count, decoder_len, "forward_flops' decoder_len")
    optional_number(values.Size, logit_positions, "forward_flops' logit_positions")
    flag_argument(attention, "forward_flops' attention")
    spec, counter = _spec(config, "forward_flops")
    heads = spec.default_heads(config) if heads is None else _heads(heads, "forward_flops")
    return counter(config, seq_len, batch_size, decoder_len, logit_positions, attention, heads)


def training_flops(
    config: Any,
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
    for kind, value, name in ((values.NonNegative, n_params, "n_params"),
                              (values.NonNegative, n_tokens, "n_tokens"), (values.Size, n_layers, "n_layers"),
                              (values.Size, context, "context"), (values.Size, d_model, "d_model")):
        number_argument(kind, value, f"approx_training_flops' {name}")
    return 6.0 * n_params * n_tokens + 12.0 * n_layers * context * d_model * n_tokens


def check_counted_heads(heads: tuple[str, ...], counted: tuple[str, ...]) -> None:
    """A one-line error for heads a family's counter does not know (count a built model instead)."""
    unknown = sorted(set(heads) - set(counted))
    if unknown:
        raise LmlabError(f"count_parameters does not know the heads {unknown}",
                         "count a built model with model.num_parameters() instead")

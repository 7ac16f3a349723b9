"""What a valid file is, for every file lmlab reads back: one schema per file, in one place.

Each schema is a ``TypedDict`` whose fields use the value types of :mod:`lmlab.values` (finite
positive numbers, counts, probabilities, non-empty text), validated strictly: a string where a
number belongs, ``null`` where a value is required, a boolean where a count belongs and a list
where a table belongs are all errors, never converted. A loader reads the JSON (or the
``torch.load`` state), then calls ``values.check(SCHEMA, data, where=f"{path}", fix=...)``, which
raises one line, ``error: <file>: <key>: <what is wrong> (got <value>); <fix>``, before any work.

=======================================  =========================================================
file                                     schema
=======================================  =========================================================
checkpoint ``config.json``               :class:`CheckpointFile`, ``config`` by the model's class:
                                         :func:`checkpoint_schema` (:data:`MODEL_CONFIG_FIELDS`)
``train_state.json`` (every resume)      :class:`TrainStateFile` (fine-tuning's part:
                                         :class:`FinetuneLoopState`)
``metrics.jsonl``, one row per line      :class:`MetricsRow`
token shards ``index.json``              :class:`ShardIndexFile`
datasets ``dataset_dict.json``           :class:`DatasetDictFile`; ``state.json``: :class:`DatasetStateFile`
Hugging Face ``config.json`` (import)    :class:`HFConfigHead`, then :data:`HF_CONFIG_FIELDS` by type
=======================================  =========================================================

What needs more than one file to judge (a resume state against the model it continues, token ids
against a vocabulary) is checked beside the loader, with the same one-line form.

This module imports no other lmlab module but :mod:`lmlab.values`, so every layer may use it.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Required, get_args

from pydantic import AfterValidator, BeforeValidator, ConfigDict, Field, with_config
from typing_extensions import TypedDict

from lmlab.values import (
    Count,
    Epsilon,
    Finite,
    Flag,
    Fraction,
    NonNegative,
    Positive,
    Size,
    Text,
    Threads,
    WeightDecay,
)

#: strict: a value of the wrong JSON type is an error, never converted ("1e-5" is no number)
STRICT = ConfigDict(strict=True)
#: strict, and no key the reader does not know (lmlab's own config dicts)
CLOSED = ConfigDict(strict=True, extra="forbid")


def _tuple_as_list(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


def _tensor(value: Any) -> Any:
    import torch

    if not isinstance(value, torch.Tensor):
        raise ValueError("must be a tensor")
    return value


# ---------------------------------------------------------------------------------------------
# value types of these files (beside lmlab.values's)
Norm = Literal["layernorm", "rmsnorm"]
Positions = Literal["learned", "sinusoidal", "rotary", "relative", "none"]
#: a precision a run resolved "auto" to (train.precision)
Precision = Literal["fp32", "bf16", "fp16"]
TokenId = Size
#: AdamW's two moment decays, each in [0, 1) (a JSON list, or the tuple torch keeps in a state dict)
Betas = Annotated[list[Fraction], BeforeValidator(_tuple_as_list), Field(min_length=2, max_length=2)]
Tensor = Annotated[Any, AfterValidator(_tensor)]
#: an HF config's special token ids: one id, a list (Llama 3's eos), or none; negative ids exist
HFTokenIds = int | list[int] | None

NORMS: tuple[str, ...] = get_args(Norm)
POSITIONS: tuple[str, ...] = get_args(Positions)


# ---------------------------------------------------------------------------------------------
# model configs: the ``config`` table of a checkpoint's config.json, one schema per config class
# (every field optional, as the dataclass defaults fill in what is missing; none may be null
# unless the dataclass field may be None)
@with_config(CLOSED)
class TransformerFields(TypedDict, total=False):
    family: Text
    vocab_size: Count
    d_model: Count
    n_layers: Count
    n_heads: Count
    n_kv_heads: Count | None
    head_dim: Count | None
    d_ff: Count
    activation: Text
    norm: Norm
    norm_eps: Epsilon
    norm_bias: Flag
    prenorm: Flag
    positions: Positions
    max_positions: Count
    rope_theta: Positive
    attn_bias: Flag
    mlp_bias: Flag
    attn_scale: Positive | None
    dropout: Fraction
    attn_dropout: Fraction
    tie_embeddings: Flag
    init_std: NonNegative
    pad_token_id: TokenId | None
    bos_token_id: TokenId | None
    eos_token_id: TokenId | None
    num_labels: Count


@with_config(CLOSED)
class EncoderFields(TransformerFields, total=False):
    type_vocab_size: Size
    embedding_size: Count | None
    layer_groups: Size
    positions_from_padding: Flag
    embedding_norm: Flag
    pooler: Flag | None
    head_activation: Text | None
    classifier_dropout: Fraction | None


@with_config(CLOSED)
class DecoderFields(TransformerFields, total=False):
    pass


@with_config(CLOSED)
class Seq2SeqFields(TransformerFields, total=False):
    n_decoder_layers: Count | None
    relative_buckets: Count
    relative_max_distance: Count
    share_encoder_decoder: Flag
    decoder_start_token_id: TokenId
    scale_embedding: Flag
    layernorm_embedding: Flag
    position_offset: Size
    scale_decoder_output: Flag
    final_logits_bias: Flag


@with_config(CLOSED)
class TransfoXLFields(TransformerFields, total=False):
    mem_len: Size


CharFilter = Annotated[list[Count], Field(min_length=2, max_length=2)]  # [width, n_filters]


@with_config(CLOSED)
class RNNFields(TypedDict, total=False):
    family: Text
    vocab_size: Count
    d_model: Count
    d_hidden: Count
    n_layers: Count
    dropout: Fraction
    residual: Flag
    tie_embeddings: Flag
    max_chars: Count
    char_dim: Count
    char_filters: Annotated[list[CharFilter], Field(min_length=1)]
    n_highway: Size
    pad_token_id: TokenId | None
    bos_token_id: TokenId | None
    eos_token_id: TokenId | None


#: config class name -> the schema of its fields (a subclass not named here uses its parent's)
MODEL_CONFIG_FIELDS: dict[str, type] = {
    "TransformerConfig": TransformerFields,
    "EncoderConfig": EncoderFields,
    "DecoderConfig": DecoderFields,
    "Seq2SeqConfig": Seq2SeqFields,
    "XLNetConfig": TransformerFields,
    "TransfoXLConfig": TransfoXLFields,
    "RNNConfig": RNNFields,
}


def model_config_fields(config_class: type) -> type:
    """The schema of ``config_class``'s fields (looked up along its base classes)."""
    for cls in config_class.__mro__:
        if cls.__name__ in MODEL_CONFIG_FIELDS:
            return MODEL_CONFIG_FIELDS[cls.__name__]
    raise KeyError(f"no file schema for {config_class.__name__}")


# ---------------------------------------------------------------------------------------------
# a checkpoint's config.json
@with_config(STRICT)
class CheckpointFile(TypedDict, total=False):
    lmlab_format_version: Required[Literal[1]]
    architecture: Required[Text]
    family: Required[Text]
    heads: list[Text] | None
    config: Required[dict[str, Any]]
    tokenizer_fingerprint: Text | None
    quantization: Any


@functools.cache
def checkpoint_schema(fields: type) -> type:
    """:class:`CheckpointFile` whose ``config`` table is checked against ``fields``."""
    schema = TypedDict(f"{fields.__name__}Checkpoint",  # type: ignore[operator]
                       {**CheckpointFile.__annotations__, "config": Required[fields]}, total=False)
    return with_config(STRICT)(schema)


# ---------------------------------------------------------------------------------------------
# metrics.jsonl: one object per line, its values numbers (or null)
@with_config(STRICT)
class MetricsRow(TypedDict, total=False, extra_items=float | None):  # type: ignore[call-arg]
    step: Required[Size]
    tokens: Size


# ---------------------------------------------------------------------------------------------
# the one resume format: checkpoints/step_N/train_state.json (pretraining, fine-tuning, DPO)
@with_config(STRICT)
class ParamGroup(TypedDict, total=False):
    params: Required[list[Size]]
    lr: Required[NonNegative]
    betas: Required[Betas]
    eps: Required[Epsilon]
    weight_decay: Required[WeightDecay]
    amsgrad: Flag
    maximize: Flag
    foreach: Flag | None
    capturable: Flag
    differentiable: Flag
    fused: Flag | None
    decoupled_weight_decay: Flag


@with_config(STRICT)
class OptimizerGroups(TypedDict):
    param_groups: list[ParamGroup]


@with_config(STRICT)
class Machine(TypedDict, total=False):
    threads: Threads
    precision: Precision


@with_config(STRICT)
class BestChoice(TypedDict):
    score: float | None  # None before the first evaluation
    metrics: dict[str, float] | None
    step: Size


@with_config(STRICT)
class FinetuneLoopState(TypedDict):
    """What a fine-tuning run adds to its ``train_state.json`` (``finetune``)."""

    identity: dict[str, Any]
    order: list[list[Size]]
    run_loss: Finite
    n_loss: Size
    best: BestChoice
    history: list[MetricsRow]


@with_config(STRICT)
class AlignLoopState(TypedDict):
    """What a preference-tuning (DPO) run adds to its ``train_state.json`` (``align``)."""

    identity: dict[str, Any]
    order: list[list[Size]]
    sums: dict[str, float]
    final: dict[str, float]
    history: list[MetricsRow]


@with_config(STRICT)
class TrainStateFile(TypedDict, total=False):
    """``checkpoints/step_N/train_state.json`` (a pretraining run's folder, a fine-tuning or DPO
    run's ``.OUT.resume/``)."""

    format: Required[Literal["lmlab-train-state"]]
    version: Required[Literal[1]]
    step: Required[Size]
    tokens: Required[Size]
    data_position: Required[Size]
    epoch: NonNegative
    rows_per_step: Count
    world_size: Count
    optimizer: Required[OptimizerGroups]
    initial_val: dict[str, float] | None  # a perplexity may be inf
    elapsed_s: NonNegative
    config: dict[str, Any]
    inputs: dict[str, Any]  # pretraining: what the run reads, by content (lmlab.train.components.identity)
    machine: Machine | None
    finetune: FinetuneLoopState
    align: AlignLoopState


# ---------------------------------------------------------------------------------------------
# token shards index.json
@with_config(STRICT)
class ShardEntry(TypedDict):
    file: Text
    tokens: Count


def _shards_hold_the_split(split: dict) -> dict:
    held = sum(s["tokens"] for s in split["shards"])
    if held != split["tokens"]:
        raise ValueError(f"its shards hold {held} tokens but the split says {split['tokens']}")
    return split


@with_config(STRICT)
class SplitEntry(TypedDict):
    shards: list[ShardEntry]
    documents: Size
    tokens: Size
    bytes: Size
    doc_starts: Text


@with_config(STRICT)
class ShardTokenizer(TypedDict, total=False):
    sha256: str | None


@with_config(STRICT)
class ShardIndexFile(TypedDict, total=False):
    format: Required[Literal["lmlab-token-shards"]]
    format_version: Required[Literal[1]]
    dtype: Required[Literal["uint16", "uint32"]]
    vocab_size: Required[Count]
    tokenizer: ShardTokenizer
    splits: Required[dict[str, Annotated[SplitEntry, AfterValidator(_shards_hold_the_split)]]]


# ---------------------------------------------------------------------------------------------
# Hugging Face datasets folders (save_to_disk)
@with_config(STRICT)
class DatasetDictFile(TypedDict):
    splits: Annotated[list[Text], Field(min_length=1)]


@with_config(STRICT)
class DataFile(TypedDict):
    filename: Text


@with_config(STRICT)
class DatasetStateFile(TypedDict):
    _data_files: Annotated[list[DataFile | Text], Field(min_length=1)]


# ---------------------------------------------------------------------------------------------
# Hugging Face config.json: the keys lmlab's converters read (others are transformers' business);
# a missing required key is the converter's own one-line error ("lacks 'vocab_size'")
@with_config(STRICT)
class HFConfigHead(TypedDict, total=False):
    model_type: Required[Text]
    architectures: list[Text] | None
    id2label: dict[str, str] | None
    tie_word_embeddings: Flag
    vocab_size: Count
    bos_token_id: HFTokenIds
    eos_token_id: HFTokenIds
    pad_token_id: HFTokenIds


@with_config(STRICT)
class HFGPT2(HFConfigHead, total=False):
    n_embd: Count
    n_layer: Count
    n_head: Count
    n_inner: Count | None
    activation_function: Text
    layer_norm_epsilon: Epsilon
    n_positions: Count
    resid_pdrop: Fraction
    attn_pdrop: Fraction
    embd_pdrop: Fraction
    initializer_range: NonNegative
    scale_attn_weights: Flag
    scale_attn_by_inverse_layer_idx: Flag
    add_cross_attention: Flag


@with_config(STRICT)
class HFRope(TypedDict, total=False):
    rope_type: Text
    type: Text
    rope_theta: Positive


@with_config(STRICT)
class HFLlama(HFConfigHead, total=False):
    hidden_size: Count
    num_hidden_layers: Count
    num_attention_heads: Count
    num_key_value_heads: Count | None
    head_dim: Count | None
    intermediate_size: Count
    hidden_act: Text
    rms_norm_eps: Epsilon
    rope_theta: Positive
    rope_scaling: HFRope | None
    rope_parameters: HFRope | None
    max_position_embeddings: Count
    attention_bias: Flag
    mlp_bias: Flag
    attention_dropout: Fraction
    initializer_range: NonNegative


@with_config(STRICT)
class HFEncoder(HFConfigHead, total=False):
    hidden_size: Count
    num_hidden_layers: Count
    num_attention_heads: Count
    intermediate_size: Count
    hidden_act: Text
    layer_norm_eps: Epsilon
    max_position_embeddings: Count
    hidden_dropout_prob: Fraction
    attention_probs_dropout_prob: Fraction
    initializer_range: NonNegative
    type_vocab_size: Size
    embedding_size: Count | None
    num_hidden_groups: Count
    inner_group_num: Count
    position_embedding_type: Text
    is_decoder: Flag
    add_cross_attention: Flag
    classifier_dropout: Fraction | None
    classifier_dropout_prob: Fraction | None


@with_config(STRICT)
class HFT5(HFConfigHead, total=False):
    d_model: Count
    d_kv: Count
    d_ff: Count
    num_layers: Count
    num_decoder_layers: Count | None
    num_heads: Count
    relative_attention_num_buckets: Count
    relative_attention_max_distance: Count
    dropout_rate: Fraction
    layer_norm_epsilon: Epsilon
    feed_forward_proj: Text
    scale_decoder_outputs: Flag
    initializer_factor: NonNegative
    decoder_start_token_id: HFTokenIds


@with_config(STRICT)
class HFBart(HFConfigHead, total=False):
    d_model: Count
    encoder_layers: Count
    decoder_layers: Count
    encoder_attention_heads: Count
    decoder_attention_heads: Count
    encoder_ffn_dim: Count
    decoder_ffn_dim: Count
    activation_function: Text
    max_position_embeddings: Count
    scale_embedding: Flag
    dropout: Fraction
    attention_dropout: Fraction
    activation_dropout: Fraction
    init_std: NonNegative
    decoder_start_token_id: HFTokenIds


#: HF ``model_type`` -> the schema of its config.json
HF_CONFIG_FIELDS: dict[str, type] = {
    "gpt2": HFGPT2, "llama": HFLlama,
    "bert": HFEncoder, "roberta": HFEncoder, "albert": HFEncoder, "electra": HFEncoder,
    "t5": HFT5, "bart": HFBart,
}

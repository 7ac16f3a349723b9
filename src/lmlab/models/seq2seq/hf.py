"""Hugging Face <-> lmlab conversion for the encoder-decoders: T5 (v1.0 and v1.1) and BART.

``from_hf(hf_config, state, architectures)`` builds a :class:`~lmlab.models.seq2seq.Seq2SeqModel`
from a transformers ``config.json`` dict and its safetensors state dict; ``to_hf(model)`` returns the
``config.json`` dict and state dict that ``T5ForConditionalGeneration`` /
``BartForConditionalGeneration.from_pretrained`` load. transformers itself is never imported.

Weight names (lmlab on the left; ``S`` = encoder | decoder, ``i`` = layer)::

    T5                                               BART (prefix "model." on all but the last two)
    embed_tokens                 shared              shared
    S.relative_bias.embedding    S.block.0.layer.0.SelfAttention.relative_attention_bias   -
    S.embed_positions            -                   S.embed_positions (max_positions + 2 rows)
    S.embed_norm                 -                   S.layernorm_embedding
    S.layers.i.attn.{q,k,v,o}_proj S.block.i.layer.0.SelfAttention.{q,k,v,o}
                                                     S.layers.i.self_attn.{q,k,v,out}_proj
    S.layers.i.attn_norm         S.block.i.layer.0.layer_norm        S.layers.i.self_attn_layer_norm
    decoder.layers.i.cross_attn  decoder.block.i.layer.1.EncDecAttention  decoder.layers.i.encoder_attn
    decoder.layers.i.cross_norm  decoder.block.i.layer.1.layer_norm  decoder.layers.i.encoder_attn_layer_norm
    S.layers.i.ffn.fc_in         S.block.i.layer.F.DenseReluDense.wi (gated: wi_1)      S.layers.i.fc1
    S.layers.i.ffn.fc_gate       S.block.i.layer.F.DenseReluDense.wi_0                  -
    S.layers.i.ffn.fc_out        S.block.i.layer.F.DenseReluDense.wo                    S.layers.i.fc2
    S.layers.i.ffn_norm          S.block.i.layer.F.layer_norm        S.layers.i.final_layer_norm
    S.final_norm                 S.final_layer_norm                  -
    lm_head (untied only)        lm_head             lm_head
    final_logits_bias [V]        -                   final_logits_bias [1, V]

(F = 1 in the encoder, 2 in the decoder.) Tying: T5 v1.0 and BART tie the LM head to the
embeddings; T5 v1.1 does not and also drops the ``d_model**-0.5`` rescale of the decoder output.
Both facts are read from ``tie_word_embeddings`` / ``scale_decoder_outputs`` and from whether the
checkpoint holds its own ``lm_head.weight``.
"""

from __future__ import annotations

import re

import torch
from torch import Tensor

from lmlab.errors import LmlabError
from lmlab.models import check_fits_in_memory
from lmlab.models.seq2seq.config import Seq2SeqConfig
from lmlab.models.seq2seq.model import Seq2SeqModel

MODEL_TYPES = ("t5", "bart")

# HF keys that are copies of tied tensors or that transformers itself ignores
_IGNORED = re.compile(r"^(model\.)?(encoder|decoder)\.(embed_tokens\.weight|version)$"
                      r"|^decoder\.block\.0\.layer\.1\.EncDecAttention\.relative_attention_bias\.weight$")

# ----------------------------------------------------------------------------- configs

_T5_GATED = {"gelu": "gated-gelu", "gelu_new": "gated-gelu", "silu": "swiglu", "relu": "reglu"}
_T5_GATED_BACK = {"gated-gelu": "gated-gelu", "geglu": "gated-gelu", "swiglu": "gated-silu",
                  "reglu": "gated-relu"}
_PLAIN_ACTIVATIONS = ("relu", "gelu", "gelu_new", "silu", "tanh")


def _t5_config(c: dict, tied: bool) -> Seq2SeqConfig:
    proj = c.get("feed_forward_proj", "relu")
    gated, act = proj.startswith("gated-"), proj.split("-")[-1]
    if act not in (_T5_GATED if gated else _PLAIN_ACTIVATIONS):
        raise LmlabError(f"unsupported T5 feed_forward_proj {proj!r}",
                         "lmlab reads relu, gelu, gated-gelu and gated-silu T5 models")
    d_model, n_heads, d_kv = c.get("d_model", 512), c.get("num_heads", 8), c.get("d_kv", 64)
    n_layers = c.get("num_layers", 6)
    n_dec = c.get("num_decoder_layers") or n_layers
    pad = c.get("pad_token_id", 0)
    start = c.get("decoder_start_token_id")
    return Seq2SeqConfig(
        family="t5", vocab_size=c.get("vocab_size", 32128), d_model=d_model, n_heads=n_heads,
        head_dim=None if d_kv * n_heads == d_model else d_kv, d_ff=c.get("d_ff", 2048),
        n_layers=n_layers, n_decoder_layers=None if n_dec == n_layers else n_dec,
        activation=_T5_GATED[act] if gated else act,
        norm="rmsnorm", norm_eps=c.get("layer_norm_epsilon", 1e-6),
        prenorm=True, positions="relative", relative_buckets=c.get("relative_attention_num_buckets", 32),
        relative_max_distance=c.get("relative_attention_max_distance", 128),
        attn_bias=False, mlp_bias=False, attn_scale=1.0,
        dropout=c.get("dropout_rate", 0.1), attn_dropout=c.get("dropout_rate", 0.1),
        tie_embeddings=tied, init_std=c.get("initializer_factor", 1.0),
        # transformers >= 5 writes scale_decoder_outputs; older configs imply it by tie_word_embeddings
        scale_decoder_output=bool(c.get("scale_decoder_outputs", c.get("tie_word_embeddings", True))),
        pad_token_id=pad, eos_token_id=_first(c.get("eos_token_id", 1)),
        decoder_start_token_id=start if start is not None else (pad or 0),
    ).validate()


def _bart_config(c: dict, tied: bool) -> Seq2SeqConfig:
    for enc, dec, default in (("encoder_attention_heads", "decoder_attention_heads", 16),
                              ("encoder_ffn_dim", "decoder_ffn_dim", 4096)):
        if c.get(enc, default) != c.get(dec, default):
            raise LmlabError(f"BART config has {enc}={c.get(enc)} but {dec}={c.get(dec)}",
                             "lmlab encoder-decoders use one width for both stacks")
    n_layers, n_dec = c.get("encoder_layers", 12), c.get("decoder_layers", 12)
    return Seq2SeqConfig(
        family="bart", vocab_size=c.get("vocab_size", 50265), d_model=c.get("d_model", 1024),
        n_heads=c.get("encoder_attention_heads", 16), d_ff=c.get("encoder_ffn_dim", 4096),
        n_layers=n_layers, n_decoder_layers=None if n_dec == n_layers else n_dec,
        activation=c.get("activation_function", "gelu"), norm="layernorm", norm_eps=1e-5, prenorm=False,
        positions="learned", max_positions=c.get("max_position_embeddings", 1024), position_offset=2,
        layernorm_embedding=True, scale_embedding=bool(c.get("scale_embedding", False)),
        attn_bias=True, mlp_bias=True,
        dropout=c.get("dropout", 0.1), attn_dropout=c.get("attention_dropout", 0.0),
        tie_embeddings=tied, final_logits_bias=True, init_std=c.get("init_std", 0.02),
        pad_token_id=c.get("pad_token_id", 1), bos_token_id=c.get("bos_token_id", 0),
        eos_token_id=_first(c.get("eos_token_id", 2)),
        decoder_start_token_id=c.get("decoder_start_token_id", 2),
    ).validate()


def _first(v):
    return v[0] if isinstance(v, list) else v


def _t5_hf_config(cfg: Seq2SeqConfig) -> dict:
    proj = _T5_GATED_BACK.get(cfg.activation, cfg.activation)
    return {
        "architectures": ["T5ForConditionalGeneration"], "model_type": "t5", "is_encoder_decoder": True,
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "d_kv": cfg.dim_head, "d_ff": cfg.d_ff,
        "num_layers": cfg.n_layers, "num_decoder_layers": cfg.decoder_layers, "num_heads": cfg.n_heads,
        "relative_attention_num_buckets": cfg.relative_buckets,
        "relative_attention_max_distance": cfg.relative_max_distance, "dropout_rate": cfg.dropout,
        "layer_norm_epsilon": cfg.norm_eps, "initializer_factor": 1.0, "feed_forward_proj": proj,
        "tie_word_embeddings": cfg.tie_embeddings, "scale_decoder_outputs": cfg.scale_decoder_output,
        "pad_token_id": cfg.pad_token_id, "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.decoder_start_token_id, "use_cache": True,
    }


def _bart_hf_config(cfg: Seq2SeqConfig) -> dict:
    return {
        "architectures": ["BartForConditionalGeneration"], "model_type": "bart", "is_encoder_decoder": True,
        "vocab_size": cfg.vocab_size, "d_model": cfg.d_model, "encoder_layers": cfg.n_layers,
        "decoder_layers": cfg.decoder_layers, "encoder_attention_heads": cfg.n_heads,
        "decoder_attention_heads": cfg.n_heads, "encoder_ffn_dim": cfg.d_ff, "decoder_ffn_dim": cfg.d_ff,
        "activation_function": cfg.activation, "dropout": cfg.dropout, "attention_dropout": cfg.attn_dropout,
        "activation_dropout": 0.0, "max_position_embeddings": cfg.max_positions,
        "scale_embedding": cfg.scale_embedding, "init_std": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings, "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id,
        "decoder_start_token_id": cfg.decoder_start_token_id, "forced_eos_token_id": cfg.eos_token_id,
        "use_cache": True,
    }


_T5_NEEDS = dict(norm="rmsnorm", prenorm=True, positions="relative", attn_bias=False, mlp_bias=False,
                 attn_scale=1.0, layernorm_embedding=False, final_logits_bias=False,
                 scale_embedding=False)
_BART_NEEDS = dict(norm="layernorm", norm_eps=1e-5, norm_bias=True, prenorm=False, positions="learned",
                   position_offset=2, attn_bias=True, mlp_bias=True, attn_scale=None,
                   layernorm_embedding=True,
                   final_logits_bias=True, scale_decoder_output=False, head_dim=None)


def _check_exportable(cfg: Seq2SeqConfig) -> None:
    """transformers' T5/BART classes express only the canonical variants of each family."""
    t5 = cfg.family == "t5"
    for name, value in (_T5_NEEDS if t5 else _BART_NEEDS).items():
        have = getattr(cfg, name)
        if have != value:
            raise LmlabError(f"{cfg.family} model with {name}={have!r} has no transformers equivalent "
                             f"({'T5' if t5 else 'BART'} needs {value!r})",
                             "export a standard t5 or bart config")
    if cfg.kv_heads != cfg.n_heads:
        raise LmlabError("transformers' T5/BART have no grouped-query attention", "set n_kv_heads=None")
    allowed = (*_T5_GATED_BACK, *_PLAIN_ACTIVATIONS) if t5 else _PLAIN_ACTIVATIONS
    if cfg.activation not in allowed:
        raise LmlabError(f"transformers' {cfg.family} has no {cfg.activation!r} feed-forward",
                         f"use one of: {', '.join(allowed)}")


# ----------------------------------------------------------------------------- names


def _t5_name(key: str, gated: bool) -> str:
    """lmlab parameter name -> transformers T5 name."""
    if key == "embed_tokens.weight":
        return "shared.weight"
    if key == "lm_head.weight":
        return key
    m = re.fullmatch(r"(encoder|decoder)\.(.+)", key)
    if not m:
        raise KeyError(key)
    stack, rest = m.groups()
    if rest == "relative_bias.embedding.weight":
        return f"{stack}.block.0.layer.0.SelfAttention.relative_attention_bias.weight"
    if rest == "final_norm.weight":
        return f"{stack}.final_layer_norm.weight"
    m = re.fullmatch(r"layers\.(\d+)\.(\w+)\.(?:(\w+)\.)?weight", rest)
    if not m:
        raise KeyError(key)
    i, part, proj = m.groups()
    ff = 2 if stack == "decoder" else 1
    block = f"{stack}.block.{i}.layer"
    if part in ("attn", "cross_attn") and proj:
        module = "0.SelfAttention" if part == "attn" else "1.EncDecAttention"
        return f"{block}.{module}.{proj[0]}.weight"
    if part in ("attn_norm", "cross_norm", "ffn_norm") and not proj:
        return f"{block}.{ {'attn_norm': 0, 'cross_norm': 1, 'ffn_norm': ff}[part] }.layer_norm.weight"
    if part == "ffn" and proj:
        wi = {"fc_in": "wi_1" if gated else "wi", "fc_gate": "wi_0", "fc_out": "wo"}[proj]
        return f"{block}.{ff}.DenseReluDense.{wi}.weight"
    raise KeyError(key)


_BART_PARTS = {"attn": "self_attn", "cross_attn": "encoder_attn", "attn_norm": "self_attn_layer_norm",
               "cross_norm": "encoder_attn_layer_norm", "ffn_norm": "final_layer_norm",
               "ffn.fc_in": "fc1", "ffn.fc_out": "fc2", "embed_norm": "layernorm_embedding",
               "embed_positions": "embed_positions"}


def _bart_name(key: str, prefix: str) -> str:
    """lmlab parameter name -> transformers BART name."""
    if key == "embed_tokens.weight":
        return prefix + "shared.weight"
    if key in ("lm_head.weight", "final_logits_bias"):
        return key
    m = re.fullmatch(r"(encoder|decoder)\.(?:layers\.(\d+)\.)?(.+)\.(weight|bias)", key)
    if not m:
        raise KeyError(key)
    stack, i, part, kind = m.groups()
    if i is None:
        return f"{prefix}{stack}.{_BART_PARTS[part]}.{kind}"
    mp = re.fullmatch(r"(attn|cross_attn)\.(q|k|v|o)_proj", part)
    if mp:
        proj = "out" if mp.group(2) == "o" else mp.group(2)
        return f"{prefix}{stack}.layers.{i}.{_BART_PARTS[mp.group(1)]}.{proj}_proj.{kind}"
    return f"{prefix}{stack}.layers.{i}.{_BART_PARTS[part]}.{kind}"


def _namer(model: Seq2SeqModel, prefix: str = "model."):
    cfg = model.config
    if cfg.family == "t5":
        gated = model.encoder.layers[0].ffn.fc_gate is not None
        return lambda k: _t5_name(k, gated)
    return lambda k: _bart_name(k, prefix)


def _lmlab_keys(model: Seq2SeqModel) -> list[str]:
    """Every name in the state dict, minus the tied LM head (it is the embedding table)."""
    return [k for k in model.state_dict() if not (k == "lm_head.weight" and model.config.tie_embeddings)]


# ----------------------------------------------------------------------------- import / export


def describe(hf_config: dict) -> tuple[Seq2SeqConfig, tuple[str, ...]]:
    """The config and heads :func:`from_hf` would build, from the config alone (no weights; whether
    the head is tied to the embeddings is told by the weights, and changes no fact asked here)."""
    config = _t5_config if hf_config.get("model_type") == "t5" else _bart_config
    return config(hf_config, True), ("lm",)


def from_hf(hf_config: dict, state: dict[str, Tensor],
            architectures: list[str] | None = None) -> Seq2SeqModel:
    """Build an lmlab model holding the weights of a transformers T5 / BART checkpoint."""
    model_type = hf_config.get("model_type")
    if model_type not in MODEL_TYPES:
        raise LmlabError(f"hf_seq2seq cannot convert model_type {model_type!r}",
                         f"expected one of {MODEL_TYPES}")
    arch = (architectures or hf_config.get("architectures") or [""])[0]
    if arch and not (arch.endswith("ForConditionalGeneration") or arch in ("T5Model", "BartModel")):
        raise LmlabError(f"cannot import a {arch}",
                         "lmlab imports T5/BART ForConditionalGeneration checkpoints")
    prefix = "model." if any(k.startswith("model.") for k in state) else ""
    shared = state.get(prefix + "shared.weight")
    if shared is None:
        shared = state.get(prefix + "encoder.embed_tokens.weight")
    if shared is None:
        raise LmlabError(f"the {model_type} checkpoint has no embedding table ({prefix}shared.weight)",
                         "check the checkpoint is complete")
    head = state.get("lm_head.weight")
    tied = head is None or (head.shape == shared.shape and torch.equal(head, shared))
    cfg = _t5_config(hf_config, tied) if model_type == "t5" else _bart_config(hf_config, tied)
    check_fits_in_memory(cfg, "seq2seq")  # before the tables of a huge config are allocated
    model = Seq2SeqModel(cfg)
    name = _namer(model, prefix)
    new_state, used = {}, set()
    for key, ref in model.state_dict().items():
        if key == "lm_head.weight" and tied:
            continue
        hf_key = name(key)
        if key == "embed_tokens.weight":
            t = shared
        elif hf_key in state:
            t = state[hf_key]
        elif key == "final_logits_bias":  # transformers also allows it to be missing
            t = torch.zeros(cfg.vocab_size)
        else:
            raise LmlabError(f"the {model_type} checkpoint lacks {hf_key}",
                             "check the checkpoint is complete and config.json matches it")
        used.add(hf_key)
        t = t.reshape(ref.shape) if key == "final_logits_bias" else t
        if t.shape != ref.shape:
            raise LmlabError(f"{hf_key} has shape {tuple(t.shape)}, config.json implies {tuple(ref.shape)}",
                             "check config.json matches the weights")
        new_state[key] = t.to(ref.dtype)
    used.add(prefix + "shared.weight")
    if tied:
        used.add("lm_head.weight")
    unknown = sorted(k for k in state if k not in used and not _IGNORED.match(k))
    if unknown:
        raise LmlabError(f"the {model_type} checkpoint has {len(unknown)} weights lmlab does not know, e.g. "
                         f"{unknown[0]}", "import a T5/BART ForConditionalGeneration checkpoint")
    from lmlab.models.checkpoint import load_state

    # strict loading; the tied LM head is stored once and tied by the config
    load_state(model, new_state, f"HF {model_type}")
    return model


def to_hf(model: Seq2SeqModel) -> tuple[dict, dict[str, Tensor]]:
    """``(config.json dict, state dict)`` in transformers' T5 / BART layout.

    A model built with ``share_encoder_decoder`` exports as an ordinary T5 whose encoder and decoder
    hold equal copies of the shared weights (transformers has no sharing option); the logits agree.
    """
    cfg = model.config
    if cfg.family not in MODEL_TYPES:
        raise LmlabError(f"hf_seq2seq cannot export family {cfg.family!r}", f"expected one of {MODEL_TYPES}")
    _check_exportable(cfg)
    hf_config = _t5_hf_config(cfg) if cfg.family == "t5" else _bart_hf_config(cfg)
    name = _namer(model)
    state, seen = {}, set()
    full = model.state_dict()
    for key in _lmlab_keys(model):
        t = full[key].detach()
        if key == "final_logits_bias":
            t = t.reshape(1, -1)
        ptr = t.data_ptr()
        t = t.clone() if ptr in seen else t.contiguous()  # safetensors refuses shared storage
        seen.add(ptr)
        state[name(key)] = t
    return hf_config, state

"""GPT-2 and Llama <-> lmlab :class:`~lmlab.models.decoder.DecoderModel`.

GPT-2 stores its projections as ``Conv1D`` (weight ``[in, out]``, the transpose of
``nn.Linear``) and fuses q, k, v into one ``c_attn`` matrix; the converter transposes and
splits/concatenates. Llama's names map one to one; its gated FFN is ``gate_proj`` (activated),
``up_proj`` and ``down_proj``.

Supported HF classes: ``GPT2Model``, ``GPT2LMHeadModel``, ``GPT2ForSequenceClassification``,
``LlamaModel``, ``LlamaForCausalLM``, ``LlamaForSequenceClassification``.
"""

from __future__ import annotations

import torch

from lmlab.errors import LmlabError
from lmlab.models import check_fits_in_memory
from lmlab.models.checkpoint import load_state
from lmlab.models.decoder.config import DecoderConfig
from lmlab.models.decoder.model import DecoderModel

MODEL_TYPES = ("gpt2", "llama")

_CLASSES = {
    "gpt2": {"GPT2Model": (), "GPT2LMHeadModel": ("lm",), "GPT2ForSequenceClassification": ("cls",)},
    "llama": {"LlamaModel": (), "LlamaForCausalLM": ("lm",), "LlamaForSequenceClassification": ("cls",)},
}
_GATED = {
    "silu": "swiglu",
    "swish": "swiglu",
    "gelu": "geglu",
    "gelu_pytorch_tanh": "gated-gelu",
    "gelu_new": "gated-gelu",
    "relu": "reglu",
}


def _heads_for(family: str, architectures: list[str]) -> tuple[str, ...]:
    arch = architectures[0] if architectures else ("GPT2Model" if family == "gpt2" else "LlamaModel")
    if arch not in _CLASSES[family]:
        raise LmlabError(
            f"{arch} is not a {family} class lmlab converts", f"supported: {', '.join(_CLASSES[family])}"
        )
    return _CLASSES[family][arch]


def _hf_class(model: DecoderModel) -> str:
    for cls, heads in _CLASSES[model.config.family].items():
        if heads == model.head_names:
            return cls
    raise LmlabError(
        f"heads {list(model.head_names)} of a {model.config.family} model have no Hugging Face class",
        "export a model with heads ('lm',), ('cls',) or ()",
    )


# ----------------------------------------------------------------------------- config


def config_from_hf(c: dict, family: str) -> DecoderConfig:
    labels = c.get("id2label")
    common = dict(
        family=family,
        vocab_size=c["vocab_size"],
        bos_token_id=c.get("bos_token_id"),
        eos_token_id=c.get("eos_token_id"),
        pad_token_id=c.get("pad_token_id"),
        init_std=c.get("initializer_range", 0.02),
        num_labels=len(labels) if labels else 2,
    )
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if isinstance(common[k], list):  # several eos ids (Llama 3): keep the first
            common[k] = common[k][0] if common[k] else None
        if common[k] is not None and not 0 <= common[k] < c["vocab_size"]:
            common[k] = None
    if family == "gpt2":
        if c.get("scale_attn_by_inverse_layer_idx") or not c.get("scale_attn_weights", True):
            raise LmlabError(
                "GPT-2 variants with non-standard attention scaling are not supported",
                "use scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False",
            )
        if c.get("add_cross_attention"):
            raise LmlabError("GPT-2 with cross-attention is not supported", "use a seq2seq model (t5, bart)")
        d = c["n_embd"]
        return DecoderConfig(
            **common,
            d_model=d,
            n_layers=c["n_layer"],
            n_heads=c["n_head"],
            d_ff=c.get("n_inner") or 4 * d,
            activation=c.get("activation_function", "gelu_new"),
            norm="layernorm",
            norm_eps=c.get("layer_norm_epsilon", 1e-5),
            positions="learned",
            max_positions=c.get("n_positions", 1024),
            dropout=c.get("resid_pdrop", 0.1),
            attn_dropout=c.get("attn_pdrop", 0.1),
            tie_embeddings=c.get("tie_word_embeddings", True),
        )
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type != "default":
        raise LmlabError(
            f"Llama rope_type {rope_type!r} is not supported", "lmlab implements the default RoPE"
        )
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    act = c.get("hidden_act", "silu")
    if act not in _GATED:
        raise LmlabError(f"Llama hidden_act {act!r} is not supported", f"use one of {', '.join(_GATED)}")
    d, heads = c["hidden_size"], c["num_attention_heads"]
    head_dim = c.get("head_dim")
    return DecoderConfig(
        **common,
        d_model=d,
        n_layers=c["num_hidden_layers"],
        n_heads=heads,
        n_kv_heads=c.get("num_key_value_heads") or heads,
        head_dim=None if head_dim in (None, d // heads) else head_dim,
        d_ff=c["intermediate_size"],
        activation=_GATED[act],
        norm="rmsnorm",
        norm_eps=c.get("rms_norm_eps", 1e-6),
        positions="rotary",
        rope_theta=float(theta),
        max_positions=c.get("max_position_embeddings", 2048),
        attn_bias=c.get("attention_bias", False),
        mlp_bias=c.get("mlp_bias", False),
        dropout=0.0,
        attn_dropout=c.get("attention_dropout", 0.0),
        tie_embeddings=c.get("tie_word_embeddings", False),
    )


def config_to_hf(model: DecoderModel) -> dict:
    cfg = model.config
    labels = {
        "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)},
    }
    ids = {
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }
    arch = [_hf_class(model)]
    if cfg.family == "gpt2":
        _require(
            cfg,
            norm="layernorm",
            positions="learned",
            attn_bias=True,
            mlp_bias=True,
            norm_bias=True,
            attn_scale=None,
            n_kv_heads=(None, cfg.n_heads),
            head_dim=(None, cfg.d_model // cfg.n_heads),
        )
        if cfg.activation not in ("gelu_new", "gelu", "relu", "silu", "tanh", "gelu_pytorch_tanh"):
            raise LmlabError(f"activation {cfg.activation!r} has no GPT-2 equivalent", "use gelu_new or gelu")
        return {
            "model_type": "gpt2",
            "architectures": arch,
            "vocab_size": cfg.vocab_size,
            "n_embd": cfg.d_model,
            "n_layer": cfg.n_layers,
            "n_head": cfg.n_heads,
            "n_inner": cfg.d_ff,
            "n_positions": cfg.max_positions,
            "activation_function": cfg.activation,
            "layer_norm_epsilon": cfg.norm_eps,
            "resid_pdrop": cfg.dropout,
            "embd_pdrop": cfg.dropout,
            "attn_pdrop": cfg.attn_dropout,
            "initializer_range": cfg.init_std,
            "scale_attn_weights": True,
            "tie_word_embeddings": cfg.tie_embeddings,
            **ids,
            **labels,
        }
    _require(cfg, norm="rmsnorm", positions="rotary", attn_scale=None)
    act = {v: k for k, v in _GATED.items() if k in ("silu", "gelu", "gelu_pytorch_tanh", "relu")}.get(
        cfg.activation
    )
    if act is None:
        raise LmlabError(f"activation {cfg.activation!r} has no Llama equivalent", "use swiglu")
    return {
        "model_type": "llama",
        "architectures": arch,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.kv_heads,
        "head_dim": cfg.dim_head,
        "intermediate_size": cfg.d_ff,
        "hidden_act": act,
        "rms_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_positions,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "attention_bias": cfg.attn_bias,
        "mlp_bias": cfg.mlp_bias,
        "attention_dropout": cfg.attn_dropout,
        "initializer_range": cfg.init_std,
        "tie_word_embeddings": cfg.tie_embeddings,
        **ids,
        **labels,
    }


def _require(cfg: DecoderConfig, **expected) -> None:
    for k, want in expected.items():
        have = getattr(cfg, k)
        ok = have in want if isinstance(want, tuple) else have == want
        if not ok:
            raise LmlabError(
                f"{cfg.family} export needs {k}={want!r}, this model has {have!r}",
                "export only models whose settings the Hugging Face class can express",
            )


# ----------------------------------------------------------------------------- weights


def _gpt2_prefix(state: dict) -> str:
    return "transformer." if any(k.startswith("transformer.") for k in state) else ""


def _llama_prefix(state: dict) -> str:
    return "model." if any(k.startswith("model.") for k in state) else ""


def _llama_names(model: DecoderModel, p: str) -> dict[str, str]:
    """lmlab module -> HF module (same leaf names weight/bias)."""
    m = {
        "tok_embed": p + "embed_tokens",
        "final_norm": p + "norm",
        "heads.lm.proj": "lm_head",
        "heads.cls.score": "score",
    }
    for i in range(model.config.n_layers):
        q = f"{p}layers.{i}."
        m.update(
            {
                f"layers.{i}.attn_norm": q + "input_layernorm",
                f"layers.{i}.ffn_norm": q + "post_attention_layernorm",
                f"layers.{i}.ffn.fc_gate": q + "mlp.gate_proj",
                f"layers.{i}.ffn.fc_in": q + "mlp.up_proj",
                f"layers.{i}.ffn.fc_out": q + "mlp.down_proj",
            }
        )
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            m[f"layers.{i}.attn.{proj}"] = q + f"self_attn.{proj}"
    return m


def _gpt2_to_lmlab(model: DecoderModel, state: dict, p: str) -> tuple[dict, set]:
    out, used = {}, set()

    def take(k):
        used.add(k)
        if k not in state:
            raise LmlabError(f"Hugging Face gpt2 weights lack {k}", "the directory's weights are incomplete")
        return state[k]

    out["tok_embed.weight"] = take(p + "wte.weight")
    out["pos_embed.weight"] = take(p + "wpe.weight")
    out["final_norm.weight"], out["final_norm.bias"] = take(p + "ln_f.weight"), take(p + "ln_f.bias")
    d = model.config.d_model
    for i in range(model.config.n_layers):
        h, L = f"{p}h.{i}.", f"layers.{i}."
        for src, dst in (("ln_1", "attn_norm"), ("ln_2", "ffn_norm")):
            out[L + dst + ".weight"], out[L + dst + ".bias"] = (
                take(h + src + ".weight"),
                take(h + src + ".bias"),
            )
        w, b = take(h + "attn.c_attn.weight"), take(h + "attn.c_attn.bias")  # [d, 3d], [3d]
        for j, name in enumerate(("q_proj", "k_proj", "v_proj")):
            out[L + f"attn.{name}.weight"] = w[:, j * d : (j + 1) * d].t()
            out[L + f"attn.{name}.bias"] = b[j * d : (j + 1) * d]
        for src, dst in (
            ("attn.c_proj", "attn.o_proj"),
            ("mlp.c_fc", "ffn.fc_in"),
            ("mlp.c_proj", "ffn.fc_out"),
        ):
            out[L + dst + ".weight"] = take(h + src + ".weight").t()
            out[L + dst + ".bias"] = take(h + src + ".bias")
        used.update(
            k
            for k in state
            if k.startswith(h + "attn.")
            and k.endswith((".bias", ".masked_bias"))
            and "c_attn" not in k
            and "c_proj" not in k
        )  # old causal-mask buffers
    if "lm" in model.head_names:
        if "lm_head.weight" in state:
            used.add("lm_head.weight")
            if not model.config.tie_embeddings:
                out["heads.lm.proj.weight"] = state["lm_head.weight"]
    if "cls" in model.head_names:
        out["heads.cls.score.weight"] = take("score.weight")
    return out, used


def describe(hf_config: dict) -> tuple[DecoderConfig, tuple[str, ...]]:
    """The config and heads :func:`from_hf` would build, from the config alone (no weights)."""
    family = hf_config["model_type"]
    return config_from_hf(hf_config, family), _heads_for(family, list(hf_config.get("architectures") or []))


def from_hf(hf_config: dict, state: dict, architectures: list[str]) -> DecoderModel:
    family = hf_config["model_type"]
    cfg = config_from_hf(hf_config, family)
    heads = _heads_for(family, architectures)
    if family == "gpt2" and "lm" in heads and "lm_head.weight" in state:
        p = _gpt2_prefix(state)
        if not bool((state["lm_head.weight"] == state[p + "wte.weight"]).all()):
            cfg.tie_embeddings = False
    check_fits_in_memory(cfg.validate(), "decoder")  # before the tables of a huge config are allocated
    model = DecoderModel(cfg, heads=heads)
    if family == "gpt2":
        own, used = _gpt2_to_lmlab(model, state, _gpt2_prefix(state))
    else:
        names = _llama_names(model, _llama_prefix(state))
        own, used = {}, set()
        for name, _ in model.named_parameters():
            mod, _, leaf = name.rpartition(".")
            hf = f"{names[mod]}.{leaf}"
            if hf not in state:
                raise LmlabError(
                    f"Hugging Face llama weights lack {hf}", "the directory's weights are incomplete"
                )
            own[name] = state[hf]
            used.add(hf)
        if "lm_head.weight" in state and cfg.tie_embeddings:
            used.add("lm_head.weight")
        used.update(k for k in state if k.endswith("rotary_emb.inv_freq"))
    unexpected = sorted(set(state) - used)
    if unexpected:
        raise LmlabError(
            f"Hugging Face {family} weights have parameters lmlab does not know: {unexpected[:3]}",
            "this model class is not supported by lmlab",
        )
    load_state(model, {k: v.float() for k, v in own.items()}, f"HF {family}")
    return model


def to_hf(model: DecoderModel) -> tuple[dict, dict]:
    hf_config = config_to_hf(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    state: dict[str, torch.Tensor] = {}
    bare = not model.head_names
    if model.config.family == "gpt2":
        p = "" if bare else "transformer."
        state[p + "wte.weight"] = params["tok_embed.weight"]
        state[p + "wpe.weight"] = params["pos_embed.weight"]
        state[p + "ln_f.weight"], state[p + "ln_f.bias"] = (
            params["final_norm.weight"],
            params["final_norm.bias"],
        )
        for i in range(model.config.n_layers):
            h, L = f"{p}h.{i}.", f"layers.{i}."
            for dst, src in (("ln_1", "attn_norm"), ("ln_2", "ffn_norm")):
                state[h + dst + ".weight"], state[h + dst + ".bias"] = (
                    params[L + src + ".weight"],
                    params[L + src + ".bias"],
                )
            qkv = [params[L + f"attn.{n}.weight"] for n in ("q_proj", "k_proj", "v_proj")]
            state[h + "attn.c_attn.weight"] = torch.cat(qkv, dim=0).t()
            state[h + "attn.c_attn.bias"] = torch.cat(
                [params[L + f"attn.{n}.bias"] for n in ("q_proj", "k_proj", "v_proj")]
            )
            for dst, src in (
                ("attn.c_proj", "attn.o_proj"),
                ("mlp.c_fc", "ffn.fc_in"),
                ("mlp.c_proj", "ffn.fc_out"),
            ):
                state[h + dst + ".weight"] = params[L + src + ".weight"].t()
                state[h + dst + ".bias"] = params[L + src + ".bias"]
        if "lm" in model.head_names and not model.config.tie_embeddings:
            state["lm_head.weight"] = params["heads.lm.proj.weight"]
        if "cls" in model.head_names:
            state["score.weight"] = params["heads.cls.score.weight"]
        return hf_config, {k: v.detach().contiguous().clone() for k, v in state.items()}
    names = _llama_names(model, "" if bare else "model.")
    for name, t in model.named_parameters():
        mod, _, leaf = name.rpartition(".")
        state[f"{names[mod]}.{leaf}"] = t.detach()
    return hf_config, state

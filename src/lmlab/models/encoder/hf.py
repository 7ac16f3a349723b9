"""BERT, RoBERTa, ALBERT and ELECTRA <-> lmlab :class:`~lmlab.models.encoder.EncoderModel`.

The four are one architecture to lmlab; what differs is parameter names, a few config fields
and which heads exist. :func:`name_map` lists, for a given lmlab model, the Hugging Face name of
every lmlab parameter; import reads through it, export writes through it, so the two directions
cannot disagree.

Supported HF classes: ``<Family>Model``, ``BertForMaskedLM``/``RobertaForMaskedLM``/
``AlbertForMaskedLM``/``ElectraForMaskedLM`` (generator), ``BertForPreTraining`` (MLM + NSP),
``AlbertForPreTraining`` (MLM + sentence order, as the ``nsp`` head), ``ElectraForPreTraining``
(discriminator), ``*ForSequenceClassification``, ``*ForTokenClassification``,
``*ForQuestionAnswering``.
"""

from __future__ import annotations

from lmlab.errors import LmlabError
from lmlab.models import check_fits_in_memory
from lmlab.models.encoder.config import EncoderConfig
from lmlab.models.encoder.model import EncoderModel

MODEL_TYPES = ("bert", "roberta", "albert", "electra")

_CLASS_PREFIX = {"bert": "Bert", "roberta": "Roberta", "albert": "Albert", "electra": "Electra"}

#: HF class suffix -> lmlab heads (pooler decided separately)
_HEADS_OF_CLASS = {
    "Model": (),
    "ForMaskedLM": ("mlm",),
    "ForPreTraining": None,  # family-specific, below
    "ForSequenceClassification": ("seq_cls",),
    "ForTokenClassification": ("token_cls",),
    "ForQuestionAnswering": ("span",),
    "ForNextSentencePrediction": ("nsp",),
}


def _heads_for(family: str, architectures: list[str]) -> tuple[str, ...]:
    arch = architectures[0] if architectures else f"{_CLASS_PREFIX[family]}Model"
    suffix = arch[len(_CLASS_PREFIX[family]) :] if arch.startswith(_CLASS_PREFIX[family]) else None
    if suffix not in _HEADS_OF_CLASS:
        raise LmlabError(
            f"{arch} is not a {family} class lmlab converts",
            f"supported: {', '.join(_CLASS_PREFIX[family] + s for s in _HEADS_OF_CLASS)}",
        )
    if suffix == "ForPreTraining":
        return ("discriminator",) if family == "electra" else ("mlm", "nsp")
    return _HEADS_OF_CLASS[suffix]


def _hf_class(model: EncoderModel) -> str:
    fam, heads = model.config.family, model.head_names
    prefix = _CLASS_PREFIX[fam]
    if heads == ():
        return prefix + "Model"
    if heads == ("mlm",):
        return prefix + "ForMaskedLM"
    if heads == ("discriminator",) and fam == "electra":
        return prefix + "ForPreTraining"
    if heads == ("mlm", "nsp") and fam in ("bert", "albert"):
        return prefix + "ForPreTraining"
    if heads == ("nsp",) and fam == "bert":
        return prefix + "ForNextSentencePrediction"
    single = {
        ("seq_cls",): "ForSequenceClassification",
        ("token_cls",): "ForTokenClassification",
        ("span",): "ForQuestionAnswering",
    }
    if heads in single:
        return prefix + single[heads]
    raise LmlabError(
        f"heads {list(heads)} of a {fam} model have no Hugging Face class",
        "export a model with one of: mlm, discriminator (electra), mlm+nsp, seq_cls, token_cls, span",
    )


# ----------------------------------------------------------------------------- names


def _layer_names(family: str, prefix: str, i: int) -> dict[str, str]:
    if family == "albert":
        p = f"{prefix}encoder.albert_layer_groups.{i}.albert_layers.0."
        return {
            "attn.q_proj": p + "attention.query",
            "attn.k_proj": p + "attention.key",
            "attn.v_proj": p + "attention.value",
            "attn.o_proj": p + "attention.dense",
            "attn_norm": p + "attention.LayerNorm",
            "ffn.fc_in": p + "ffn",
            "ffn.fc_out": p + "ffn_output",
            "ffn_norm": p + "full_layer_layer_norm",
        }
    p = f"{prefix}encoder.layer.{i}."
    return {
        "attn.q_proj": p + "attention.self.query",
        "attn.k_proj": p + "attention.self.key",
        "attn.v_proj": p + "attention.self.value",
        "attn.o_proj": p + "attention.output.dense",
        "attn_norm": p + "attention.output.LayerNorm",
        "ffn.fc_in": p + "intermediate.dense",
        "ffn.fc_out": p + "output.dense",
        "ffn_norm": p + "output.LayerNorm",
    }


def _head_names(family: str, head: str, model: EncoderModel) -> dict[str, str]:
    """lmlab module path (under heads.<head>) -> HF module path, for one head."""
    if head == "mlm":
        base = {
            "bert": "cls.predictions.",
            "roberta": "lm_head.",
            "albert": "predictions.",
            "electra": "generator_predictions.",
        }[family]
        norm = {"bert": "transform.LayerNorm", "roberta": "layer_norm"}.get(family, "LayerNorm")
        dense = "transform.dense" if family == "bert" else "dense"
        bias = "generator_lm_head.bias" if family == "electra" else base + "bias"
        return {
            "dense": base + dense,
            "norm": base + norm,
            "decoder.bias": bias,
            "decoder.weight": "generator_lm_head.weight" if family == "electra" else base + "decoder.weight",
        }
    if head == "nsp":
        return {"classifier": "sop_classifier.classifier" if family == "albert" else "cls.seq_relationship"}
    if head == "discriminator":
        return {
            "dense": "discriminator_predictions.dense",
            "prediction": "discriminator_predictions.dense_prediction",
        }
    if head == "seq_cls":
        if model.heads["seq_cls"].dense is not None:
            return {"dense": "classifier.dense", "classifier": "classifier.out_proj"}
        return {"classifier": "classifier"}
    if head == "token_cls":
        return {"classifier": "classifier"}
    return {"qa": "qa_outputs"}


def name_map(model: EncoderModel, prefix: str) -> dict[str, str]:
    """lmlab parameter name -> HF parameter name for every parameter of ``model``."""
    fam = model.config.family
    modules = {
        "embeddings.word": prefix + "embeddings.word_embeddings",
        "embeddings.position": prefix + "embeddings.position_embeddings",
        "embeddings.token_type": prefix + "embeddings.token_type_embeddings",
        "embeddings.norm": prefix + "embeddings.LayerNorm",
        "embeddings.project": prefix
        + ("encoder.embedding_hidden_mapping_in" if fam == "albert" else "embeddings_project"),
        "pooler": prefix + ("pooler" if fam == "albert" else "pooler.dense"),
    }
    for i in range(len(model.layers)):
        modules.update({f"layers.{i}.{k}": v for k, v in _layer_names(fam, prefix, i).items()})
    for head in model.head_names:
        modules.update({f"heads.{head}.{k}": v for k, v in _head_names(fam, head, model).items()})
    out = {}
    for name, _ in model.named_parameters(remove_duplicate=False):
        mod, _, leaf = name.rpartition(".")
        if name in modules:  # whole-parameter entries (decoder.bias / decoder.weight)
            out[name] = modules[name]
        elif mod in modules:
            out[name] = f"{modules[mod]}.{leaf}"
        else:
            raise AssertionError(f"no Hugging Face name for {name}")  # a bug in this table, not user input
    return out


# ----------------------------------------------------------------------------- config


def config_from_hf(c: dict, family: str) -> EncoderConfig:
    """EncoderConfig equivalent to an HF BERT/RoBERTa/ALBERT/ELECTRA config.json."""
    if c.get("position_embedding_type", "absolute") != "absolute":
        raise LmlabError(
            f"position_embedding_type {c['position_embedding_type']!r} is not supported",
            "lmlab converts encoders with absolute positions",
        )
    if c.get("is_decoder") or c.get("add_cross_attention"):
        raise LmlabError(f"{family} configured as a decoder is not supported", "use a gpt2 or llama model")
    if family == "albert" and c.get("inner_group_num", 1) != 1:
        raise LmlabError(
            f"ALBERT inner_group_num {c['inner_group_num']} is not supported", "use inner_group_num=1"
        )
    hidden = c["hidden_size"]
    emb = c.get("embedding_size") if family in ("albert", "electra") else None
    n_groups = c.get("num_hidden_groups", 1) if family == "albert" else 0
    labels = c.get("id2label")
    return EncoderConfig(
        family=family,
        vocab_size=c["vocab_size"],
        d_model=hidden,
        n_layers=c["num_hidden_layers"],
        n_heads=c["num_attention_heads"],
        d_ff=c["intermediate_size"],
        activation=c.get("hidden_act", "gelu"),
        norm_eps=c.get("layer_norm_eps", 1e-12),
        max_positions=c.get("max_position_embeddings", 512),
        dropout=c.get("hidden_dropout_prob", 0.1),
        attn_dropout=c.get("attention_probs_dropout_prob", 0.1),
        init_std=c.get("initializer_range", 0.02),
        pad_token_id=c.get("pad_token_id"),
        bos_token_id=c.get("bos_token_id"),
        eos_token_id=c.get("eos_token_id"),
        tie_embeddings=c.get("tie_word_embeddings", True),
        num_labels=len(labels) if labels else 2,
        type_vocab_size=c.get("type_vocab_size", 2),
        embedding_size=None if emb == hidden else emb,
        layer_groups=n_groups,
        positions_from_padding=family == "roberta",
        head_activation="gelu" if family == "electra" else None,
        classifier_dropout=c.get("classifier_dropout", c.get("classifier_dropout_prob")),
    )


#: the settings every Hugging Face encoder class has (any other value cannot be exported)
_STANDARD = {"norm": "layernorm", "prenorm": False, "positions": "learned", "attn_bias": True,
             "mlp_bias": True, "norm_bias": True, "attn_scale": None, "embedding_norm": True}


def _check_exportable(cfg: EncoderConfig) -> None:
    """A one-line error for a setting the family's transformers class cannot express."""
    fam = cfg.family
    wrong = {k: getattr(cfg, k) for k, v in _STANDARD.items() if getattr(cfg, k) != v}
    if wrong:
        raise LmlabError(
            f"{fam} export needs the standard architecture, but this model has {wrong}",
            "export only models whose settings the Hugging Face class can express",
        )
    if cfg.n_kv_heads not in (None, cfg.n_heads) or cfg.head_dim not in (None, cfg.d_model // cfg.n_heads):
        raise LmlabError(
            f"{fam} export cannot express grouped-query attention or a custom head_dim",
            "use n_kv_heads=None and head_dim=None",
        )
    if fam in ("bert", "roberta") and cfg.embedding_size not in (None, cfg.d_model):
        raise LmlabError(
            f"{fam} has no factorized embeddings", "use family albert or electra, or embedding_size=None"
        )
    if fam != "albert" and cfg.layer_groups:
        raise LmlabError(f"{fam} has no cross-layer sharing", "use family albert, or layer_groups=0")
    if (fam == "roberta") != cfg.positions_from_padding:
        raise LmlabError(f"{fam} export needs positions_from_padding={fam == 'roberta'}", "fix the config")
    if cfg.activation not in ("gelu", "gelu_new", "relu", "silu", "tanh", "gelu_pytorch_tanh"):
        raise LmlabError(
            f"activation {cfg.activation!r} has no {fam} equivalent", "use gelu, gelu_new, relu or silu"
        )


def config_to_hf(model: EncoderModel) -> dict:
    cfg = model.config
    fam = cfg.family
    _check_exportable(cfg)
    activation = cfg.activation
    out = {
        "model_type": fam,
        "architectures": [_hf_class(model)],
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "intermediate_size": cfg.d_ff,
        "hidden_act": activation,
        "layer_norm_eps": cfg.norm_eps,
        "max_position_embeddings": cfg.max_positions,
        "type_vocab_size": cfg.type_vocab_size,
        "hidden_dropout_prob": cfg.dropout,
        "attention_probs_dropout_prob": cfg.attn_dropout,
        "initializer_range": cfg.init_std,
        "pad_token_id": cfg.pad_token_id,
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "tie_word_embeddings": cfg.tie_embeddings,
        "position_embedding_type": "absolute",
        "classifier_dropout": cfg.classifier_dropout,
        "id2label": {str(i): f"LABEL_{i}" for i in range(cfg.num_labels)},
        "label2id": {f"LABEL_{i}": i for i in range(cfg.num_labels)},
    }
    if fam in ("albert", "electra"):
        out["embedding_size"] = cfg.embed_dim
    if fam == "albert":
        out["num_hidden_groups"] = cfg.layer_groups or cfg.n_layers
        out["inner_group_num"] = 1
        out["classifier_dropout_prob"] = out.pop("classifier_dropout") or 0.1
    return out


# ----------------------------------------------------------------------------- public API

_IGNORED_SUFFIXES = ("embeddings.position_ids",)


def describe(hf_config: dict) -> tuple[EncoderConfig, tuple[str, ...]]:
    """The config and heads :func:`from_hf` would build, from the config alone (no weights)."""
    family = hf_config["model_type"]
    return config_from_hf(hf_config, family), _heads_for(family, list(hf_config.get("architectures") or []))


def from_hf(hf_config: dict, state: dict, architectures: list[str]) -> EncoderModel:
    """Build the lmlab encoder equivalent to an HF model (config dict + state dict)."""
    family = hf_config["model_type"]
    cfg = config_from_hf(hf_config, family)
    heads = _heads_for(family, architectures)
    state = {k: v for k, v in state.items() if not k.endswith(_IGNORED_SUFFIXES)}
    base = {"bert": "bert.", "roberta": "roberta.", "albert": "albert.", "electra": "electra."}[family]
    prefix = base if any(k.startswith(base) for k in state) else ""
    needs_pooler = any(k.startswith(prefix + "pooler.") for k in state)
    cfg.pooler = needs_pooler
    if "mlm" in heads and cfg.tie_embeddings:
        word = state[prefix + "embeddings.word_embeddings.weight"]
        dec = next(
            (
                state[k]
                for k in (
                    "cls.predictions.decoder.weight",
                    "lm_head.decoder.weight",
                    "predictions.decoder.weight",
                    "generator_lm_head.weight",
                )
                if k in state
            ),
            None,
        )
        if dec is not None and not bool((dec == word).all()):
            cfg.tie_embeddings = False  # a checkpoint whose head was trained apart from the embeddings
    check_fits_in_memory(cfg.validate(), "encoder")  # before the tables of a huge config are allocated
    model = EncoderModel(cfg, heads=heads)
    names = name_map(model, prefix)
    tied = {n for n in names if model.config.tie_embeddings and n == "heads.mlm.decoder.weight"}
    own, used, missing = {}, set(), []
    for name, hf in names.items():
        if name in tied:
            continue
        alt = hf.replace(".bias", ".decoder.bias") if name == "heads.mlm.decoder.bias" else None
        if hf in state:
            own[name] = state[hf]
            used.add(hf)
        elif alt and alt in state:
            own[name] = state[alt]
            used.add(alt)
        else:
            missing.append(hf)
    if name := next(
        (
            k
            for k in ("cls.predictions.decoder.bias", "lm_head.decoder.bias", "predictions.decoder.bias")
            if k in state
        ),
        None,
    ):
        used.add(name)
    for k in (
        "cls.predictions.decoder.weight",
        "lm_head.decoder.weight",
        "predictions.decoder.weight",
        "generator_lm_head.weight",
    ):
        if k in state and model.config.tie_embeddings:
            used.add(k)
    unexpected = sorted(set(state) - used)
    if missing:
        raise LmlabError(
            f"Hugging Face {family} weights lack {missing[:3]}", "the directory's weights are incomplete"
        )
    if unexpected:
        raise LmlabError(
            f"Hugging Face {family} weights have parameters lmlab does not know: {unexpected[:3]}",
            "this model class is not supported by lmlab",
        )
    from lmlab.models.checkpoint import load_state

    load_state(model, {k: v.float() if v.is_floating_point() else v for k, v in own.items()}, f"HF {family}")
    return model


def to_hf(model: EncoderModel) -> tuple[dict, dict]:
    """HF config dict and state dict for an lmlab encoder of family bert/roberta/albert/electra."""
    hf_config = config_to_hf(model)
    cls = hf_config["architectures"][0]
    prefix = (
        ""
        if cls.endswith("Model")
        else {"bert": "bert.", "roberta": "roberta.", "albert": "albert.", "electra": "electra."}[
            model.config.family
        ]
    )
    names = name_map(model, prefix)
    params = dict(model.named_parameters(remove_duplicate=False))
    state = {}
    for name, hf in names.items():
        if name == "heads.mlm.decoder.weight" and model.config.tie_embeddings:
            continue
        if name.startswith("pooler.") and not _hf_has_pooler(cls):
            continue  # e.g. BertForMaskedLM has no pooler; the MLM logits do not use it
        state[hf] = params[name].detach()
    return hf_config, state


def _hf_has_pooler(cls: str) -> bool:
    """Whether transformers' class ``cls`` builds the pooler (BertModel, BertForPreTraining, ...)."""
    if cls.startswith(("Roberta", "Electra")):
        return cls.endswith("Model")
    return cls.endswith(("Model", "ForPreTraining", "ForNextSentencePrediction", "ForSequenceClassification"))

"""Run configuration: four dataclasses that map 1:1 onto the sections of a recipe TOML file.

A recipe (``configs/gpt-tiny-clm.toml``) has four tables::

    [model]      preset = "gpt2-tiny", plus any field of that preset's config (d_model, n_layers...)
    [objective]  name = "clm", plus the objective's own parameters
    [data]       train, val, tokenizer, ...            -> DataConfig
    [train]      max_steps, batch_size, seq_len, lr... -> TrainConfig

:func:`load_config` reads a file (or a dict), applies ``--set section.key=value`` overrides, checks
every key (an unknown one is a one-line error naming the closest valid key, found with
``difflib``) and coerces every value to its field's type, so ``--set train.lr=3e-4`` and
``lr = 3e-4`` in the file give the same float. :func:`to_toml` writes the resolved config back
(``RUN_DIR/config.toml``), which loads again to the same :class:`RunConfig`.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError
from lmlab.fileio import check_encoding

SECTIONS = ("model", "objective", "data", "train")
SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DISTRIBUTED = ("auto", "ddp", "fsdp")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
ATTENTION = ("auto", "sdpa", "flex")


@dataclass
class ModelConfig:
    """``[model]``: a preset name plus overrides of any of its config fields."""

    preset: str = "gpt2-tiny"
    overrides: dict[str, Any] = field(default_factory=dict)


@dataclass
class ObjectiveConfig:
    """``[objective]``: the registry name plus the objective's keyword parameters."""

    name: str = "clm"
    params: dict[str, Any] = field(default_factory=dict)


@dataclass
class DataConfig:
    """``[data]``: where the tokens come from.

    ``train``/``val``: token-shard directories (written by ``lmlab data prepare``) or raw text
    files, JSON Lines (``.jsonl``, ``.jsonl.gz``, ``.jsonl.zst``) or Parquet files (one document
    per record: its ``text_field``, default ``text``), directories of such files, or glob
    patterns; text is tokenised once into ``RUN_DIR/data/`` with ``tokenizer``. ``$LMLAB_DATA``
    in a path expands to that environment variable (default ``../shared/data``); relative paths
    are relative to the working directory.
    ``tokenizer``: a tokenizer directory, or a table ``{algo, vocab_size, input, ...}`` to train
    one (``input`` defaults to the train files; other keys are the algorithm's options).
    ``val_fraction``: when ``val`` is empty, send this fraction of the train documents to val.
    ``max_tokens``: train on the first ``max_tokens`` tokens only (0: all), e.g. a small corpus
    seen for many epochs (static vs dynamic masking); the tokenizer and shards stay those of the
    whole data, so runs with different limits share one cache entry.
    ``cache_dir``: when set (or when ``$LMLAB_CACHE_DIR`` is), the trained tokenizer and the token
    shards go to ``cache_dir/<hash of this [data] table>/`` instead of ``RUN_DIR/data/``, so runs
    over the same data (a grid, the recipe tests) tokenise it once; stale entries are rebuilt.
    """

    train: list[str] = field(default_factory=list)
    val: list[str] = field(default_factory=list)
    tokenizer: str | dict[str, Any] = ""
    val_fraction: float = 0.0
    max_tokens: int = 0
    doc_separator: str = "blank-line"
    encoding: str = "utf-8"
    append_eos: bool = False
    text_field: str = "text"
    workers: int = 1
    cache_dir: str = ""


@dataclass
class TrainConfig:
    """``[train]``: optimisation, evaluation, checkpoints and the machine.

    Batch: ``batch_size`` rows of ``seq_len`` tokens per forward pass and process; one optimizer
    step sees ``batch_size * grad_accum * world_size`` rows (the global batch).
    Schedule: linear warmup over ``warmup_steps`` to ``lr``, then ``cosine``/``linear`` decay to
    ``min_lr`` at ``decay_steps`` (0 = ``max_steps``), ``min_lr`` after; ``constant`` keeps ``lr``.
    Keep ``decay_steps`` fixed to extend a run (``max_steps``) without changing its past.
    Speed: ``compile`` runs the model through ``torch.compile`` (``compile_backend``: inductor,
    the default; aot_eager or eager to debug); ``activation_checkpointing`` recomputes each
    block's activations in the backward pass (less memory, ~1/3 more compute); ``peak_tflops``
    is the device's peak for the MFU column (0 = looked up for known GPUs; none on CPUs);
    ``attention`` picks how packed documents are masked: ``flex`` (block-sparse FlexAttention),
    ``sdpa`` (a dense mask), ``auto`` (flex on CUDA, sdpa on CPUs); ``prefetch`` reads the next
    step's windows on a background thread while this step computes (same numbers either way;
    :mod:`lmlab.train.prefetch`). ``loggers``: where the
    metrics rows also go (``["tensorboard"]``; :mod:`lmlab.train.loggers`).
    """

    max_steps: int = 1000
    batch_size: int = 16
    seq_len: int = 128
    lr: float = 1e-3
    min_lr: float = 1e-4
    warmup_steps: int = 100
    decay_steps: int = 0
    schedule: str = "cosine"
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_accum: int = 1
    clip: float = 1.0
    eval_every: int = 100
    eval_batches: int = 20
    eval_at_start: bool = True
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    log_every: int = 1
    seed: int = 0
    threads: int = 0
    precision: str = "auto"
    device: str = "auto"
    distributed: str = "auto"
    progress: str = "auto"
    compile: bool = False
    compile_backend: str = "inductor"
    activation_checkpointing: bool = False
    peak_tflops: float = 0.0
    attention: str = "auto"
    prefetch: bool = True
    loggers: list[str] = field(default_factory=list)


@dataclass
class RunConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    objective: ObjectiveConfig = field(default_factory=ObjectiveConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The TOML-shaped dict (overrides and params flattened into their tables)."""
        return {
            "model": {"preset": self.model.preset, **self.model.overrides},
            "objective": {"name": self.objective.name, **self.objective.params},
            "data": {k: v for k, v in dataclasses.asdict(self.data).items()},
            "train": dataclasses.asdict(self.train),
        }


# --------------------------------------------------------------------------- loading
def load_config(
    source: str | os.PathLike | dict | RunConfig, overrides: list[str] | dict[str, Any] | None = None
) -> RunConfig:
    """Read a recipe (TOML path, TOML-shaped dict or RunConfig), apply overrides, check it."""
    if isinstance(source, RunConfig):
        raw = source.to_dict()
    elif isinstance(source, dict):
        raw = {k: dict(v) if isinstance(v, dict) else v for k, v in source.items()}
    else:
        raw = read_toml(source)
    for key, value in override_items(overrides):
        _apply_override(raw, key, value)
    return _build(raw)


def read_toml(path: str | os.PathLike) -> dict[str, Any]:
    p = Path(path)
    if not p.is_file():
        raise LmlabError(f"config file {p} does not exist", "pass a recipe such as configs/gpt-tiny-clm.toml")
    try:
        with open(p, "rb") as f:
            return tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise LmlabError(f"config file {p} is not valid TOML ({e})", "fix the line it names") from None
    except UnicodeDecodeError as e:
        bad = e.object[e.start:e.start + 1]
        raise LmlabError(f"config file {p} is not UTF-8 (byte {bad!r} at offset {e.start})",
                         "save it as UTF-8 (TOML files always are)") from None


def override_items(overrides) -> list[tuple[str, Any]]:
    if not overrides:
        return []
    if isinstance(overrides, dict):
        return list(overrides.items())
    items = []
    for item in overrides:
        if "=" not in item:
            raise LmlabError(
                f"override {item!r} is not of the form section.key=value",
                "write e.g. --set train.max_steps=100",
            )
        key, value = item.split("=", 1)
        items.append((key.strip(), parse_value(value.strip())))
    return items


def parse_value(text: str) -> Any:
    """A command-line value: a TOML literal (``3e-4``, ``true``, ``[1, 2]``, ``"x"``), else the raw text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _apply_override(raw: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    if len(parts) < 2 or not all(parts):
        raise LmlabError(
            f"override key {key!r} needs a section",
            f"write e.g. train.{key}=... (sections: {', '.join(SECTIONS)})",
        )
    section = parts[0]
    if section not in SECTIONS:
        raise LmlabError(f"unknown config section {section!r} in {key!r}", _suggest(section, SECTIONS))
    node = raw.setdefault(section, {})
    for p in parts[1:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def _suggest(name: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    valid = ", ".join(prefix + c for c in choices)
    return f"did you mean {prefix}{close[0]}? (valid: {valid})" if close else f"valid: {valid}"


def _build(raw: dict[str, Any]) -> RunConfig:
    unknown = [s for s in raw if s not in SECTIONS]
    if unknown:
        raise LmlabError(f"unknown config section [{unknown[0]}]", _suggest(unknown[0], SECTIONS))
    for s in SECTIONS:
        if not isinstance(raw.get(s, {}), dict):
            raise LmlabError(f"config section {s!r} must be a table", f"write [{s}] with key = value lines")
    model = _build_model(dict(raw.get("model", {})))
    objective = _build_objective(dict(raw.get("objective", {})))
    data = _build_dataclass(DataConfig, dict(raw.get("data", {})), "data")
    train = _build_dataclass(TrainConfig, dict(raw.get("train", {})), "train")
    cfg = RunConfig(model, objective, data, train)
    validate(cfg)
    return cfg


def _build_dataclass(cls, values: dict[str, Any], section: str):
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise LmlabError(f"unknown config key {section}.{key}", _suggest(key, names, f"{section}."))
        kwargs[key] = coerce(value, hints[key], f"{section}.{key}")
    return cls(**kwargs)


def _build_model(values: dict[str, Any]) -> ModelConfig:
    from lmlab.models import PRESETS

    preset = values.pop("preset", ModelConfig.preset)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise LmlabError(f"unknown model preset {preset!r}", _suggest(str(preset), list(PRESETS), ""))
    base = PRESETS[preset]()
    hints = typing.get_type_hints(type(base))
    names = [f.name for f in dataclasses.fields(base)]
    overrides = {}
    for key, value in values.items():
        if key not in hints:
            raise LmlabError(
                f"unknown config key model.{key} for preset {preset}",
                _suggest(key, ["preset", *names], "model."),
            )
        overrides[key] = coerce(value, hints[key], f"model.{key}")
    return ModelConfig(preset, overrides)


def _build_objective(values: dict[str, Any]) -> ObjectiveConfig:
    from lmlab.objectives import get_objective

    name = values.pop("name", ObjectiveConfig.name)
    if not isinstance(name, str):
        raise LmlabError(f"objective.name must be a string, got {name!r}", 'write e.g. name = "clm"')
    cls = get_objective(name)
    hints = _objective_parameters(cls)
    for key in values:
        if key not in hints:
            fix = _suggest(key, ["name", *hints], "objective.") if hints else "it takes no parameters"
            raise LmlabError(f"unknown config key objective.{key} for objective {name!r}", fix)
    values = {k: coerce(v, hints[k], f"objective.{k}") for k, v in values.items()}
    return ObjectiveConfig(name, values)


def _objective_parameters(cls) -> dict[str, Any]:
    """Name -> type hint of every option an objective accepts, including those its ``__init__``
    passes on through ``**kwargs`` to a parent objective (NSP and UniLM take MLM's options)."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        hints = typing.get_type_hints(init)
        params = inspect.signature(init).parameters
        for n, p in params.items():
            if n not in ("self", "tokenizer") and p.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
            ):
                found.setdefault(n, hints.get(n, Any))
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return found


# --------------------------------------------------------------------------- types
def coerce(value: Any, hint, key: str) -> Any:
    """Convert ``value`` to the type ``hint`` of config field ``key``, or a one-line error."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key)
            except LmlabError as e:
                errors.append(e)
        raise errors[0]
    if hint is Any:
        return value
    if origin is list:
        (inner,) = typing.get_args(hint) or (Any,)
        if isinstance(value, str):
            value = (
                [v.strip() for v in value.split(",") if v.strip()]
                if inner is not str or "," in value
                else [value]
            )
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise LmlabError(f"{key} must be a list, got {value!r}", f"write e.g. {key}=[...]")
        return [
            coerce(v if inner is str else parse_value(v) if isinstance(v, str) else v, inner, key)
            for v in value
        ]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise LmlabError(f"{key} must be a table, got {value!r}", f"write {key} as a TOML table")
        return dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise LmlabError(f"{key} must be true or false, got {value!r}", f"write {key}=true or {key}=false")
    if hint is int:
        if isinstance(value, str):
            value = parse_value(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise LmlabError(f"{key} must be an integer, got {value!r}", f"write e.g. {key}=100")
        return value
    if hint is float:
        if isinstance(value, str):
            value = parse_value(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise LmlabError(f"{key} must be a number, got {value!r}", f"write e.g. {key}=0.001")
        return float(value)
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise LmlabError(f"{key} must be a string, got {value!r}", f'write {key}="..."')
    return value


def _check_batch_fits(cfg: RunConfig) -> None:
    """Refuse, before any data is read, a micro-batch whose activations cannot fit in this
    machine's memory (a coarse estimate: logits and their gradient, plus ~20 floats per token per
    layer and width unit), with the way out: a smaller batch_size and a larger grad_accum."""
    from lmlab.models import CONFIG_ARCHITECTURE, check_fits_in_memory, get_preset, physical_memory_bytes

    try:
        base = get_preset(cfg.model.preset)
    except LmlabError:
        return  # an unknown preset is reported later, with its own message
    known = {f.name for f in dataclasses.fields(base)}
    sized = {k: v for k, v in cfg.model.overrides.items() if k in known}
    tok = cfg.data.tokenizer
    if isinstance(tok, dict) and tok.get("vocab_size") and "vocab_size" not in sized:
        sized["vocab_size"] = tok["vocab_size"]
    try:
        model_cfg = dataclasses.replace(base, **sized)
    except (TypeError, ValueError, LmlabError):
        return  # a bad model setting is reported later, with its own message
    check_fits_in_memory(model_cfg, CONFIG_ARCHITECTURE.get(type(model_cfg), ""))  # weights first
    width, layers = getattr(model_cfg, "d_model", 0), getattr(model_cfg, "n_layers", 0)
    vocab = getattr(model_cfg, "vocab_size", 0)
    if not all(isinstance(x, int) for x in (width, layers, vocab)):
        return
    tokens = cfg.train.batch_size * cfg.train.seq_len
    need = tokens * 4 * (2 * vocab + 20 * width * layers)
    total = physical_memory_bytes()
    if total is not None and need > total:
        raise LmlabError(f"a micro-batch of {cfg.train.batch_size:,} x {cfg.train.seq_len} tokens needs "
                         f"about {need / 2**30:,.0f} GiB for activations, more than this machine's "
                         f"{total / 2**30:,.0f} GiB",
                         "lower train.batch_size and raise train.grad_accum (same global batch)")


def _cuda_for(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def validate(cfg: RunConfig) -> None:
    """Range checks that need no data or model (those come later, before training starts)."""
    t = cfg.train
    for name in (
        "max_steps",
        "batch_size",
        "seq_len",
        "grad_accum",
        "eval_every",
        "checkpoint_every",
        "log_every",
    ):
        if getattr(t, name) < 1:
            raise LmlabError(
                f"train.{name} must be at least 1, got {getattr(t, name)}",
                f"set train.{name} to a positive integer",
            )
    if t.seq_len < 2:
        raise LmlabError(f"train.seq_len {t.seq_len} is too short", "use at least 2 tokens")
    for name in ("warmup_steps", "decay_steps", "eval_batches", "keep_checkpoints", "threads"):
        if getattr(t, name) < 0:
            raise LmlabError(f"train.{name} must be >= 0, got {getattr(t, name)}", f"set train.{name} >= 0")
    if t.lr <= 0 or t.min_lr < 0 or t.min_lr > t.lr:
        raise LmlabError(
            f"need 0 <= train.min_lr <= train.lr and lr > 0, got lr={t.lr}, min_lr={t.min_lr}",
            "e.g. lr=1e-3, min_lr=1e-4",
        )
    if t.schedule not in SCHEDULES:
        raise LmlabError(f"unknown train.schedule {t.schedule!r}", _suggest(t.schedule, SCHEDULES))
    if t.precision not in PRECISIONS:
        raise LmlabError(f"unknown train.precision {t.precision!r}", _suggest(t.precision, PRECISIONS))
    if t.distributed not in DISTRIBUTED:
        raise LmlabError(f"unknown train.distributed {t.distributed!r}", _suggest(t.distributed, DISTRIBUTED))
    if t.progress not in ("auto", "on", "off"):
        raise LmlabError(
            f"train.progress must be auto, on or off, got {t.progress!r}", "set train.progress=off"
        )
    from lmlab.train.loggers import check_loggers

    check_loggers(t.loggers, "train.loggers")
    if t.attention not in ATTENTION:
        raise LmlabError(f"unknown train.attention {t.attention!r}", _suggest(t.attention, ATTENTION))
    if t.attention == "flex" and not _cuda_for(t.device):
        raise LmlabError("train.attention=flex trains on CUDA only (FlexAttention has no backward pass "
                         "on CPUs)", "use train.attention=auto or sdpa on this machine")
    if t.compile_backend not in COMPILE_BACKENDS:
        raise LmlabError(f"unknown train.compile_backend {t.compile_backend!r}",
                         _suggest(t.compile_backend, COMPILE_BACKENDS))
    if not (isinstance(t.peak_tflops, (int, float)) and t.peak_tflops >= 0):
        raise LmlabError(f"train.peak_tflops must be >= 0, got {t.peak_tflops!r}",
                         "e.g. train.peak_tflops=989 for an H100's bf16 peak (0 = look it up)")
    if len(t.betas) != 2 or not all(0 <= b < 1 for b in t.betas):
        raise LmlabError(
            f"train.betas must be two numbers in [0, 1), got {t.betas}", "e.g. betas=[0.9, 0.95]"
        )
    if t.weight_decay < 0 or t.clip < 0:
        raise LmlabError("train.weight_decay and train.clip must be >= 0", "use 0 to turn them off")
    if not (isinstance(t.eps, (int, float)) and 0 < t.eps < 1):
        raise LmlabError(f"train.eps must be a small positive number, got {t.eps!r}", "e.g. train.eps=1e-8")
    _check_batch_fits(cfg)
    if not re.fullmatch(r"auto|cpu|cuda(:\d+)?|mps", t.device):
        raise LmlabError(f"unknown train.device {t.device!r}", "use auto, cpu, cuda, cuda:N or mps")
    d = cfg.data
    if not d.train:
        raise LmlabError("data.train is empty", "set data.train to token shards or text files")
    if not isinstance(d.max_tokens, int) or isinstance(d.max_tokens, bool) or d.max_tokens < 0:
        raise LmlabError(f"data.max_tokens must be a whole number >= 0, got {d.max_tokens!r}",
                         "e.g. data.max_tokens=500000 (0 reads all the training tokens)")
    if not 0.0 <= d.val_fraction < 1.0:
        raise LmlabError(f"data.val_fraction must be in [0, 1), got {d.val_fraction}", "e.g. 0.01")
    if d.workers < 1:
        raise LmlabError(f"data.workers must be at least 1, got {d.workers}", "set data.workers=1")
    check_encoding(d.encoding)  # before any tokenising


# --------------------------------------------------------------------------- writing
def to_toml(cfg: RunConfig | dict) -> str:
    """Serialise a config as TOML (tables ``[model]``, ``[objective]``, ``[data]``, ``[train]``)."""
    data = cfg.to_dict() if isinstance(cfg, RunConfig) else cfg
    lines: list[str] = []

    def emit(table: dict, path: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if path:
            lines.append(f"[{path}]")
        for k, v in scalars.items():
            if v is None:
                continue
            lines.append(f"{_key(k)} = {_toml_value(v)}")
        lines.append("")
        for k, v in tables.items():
            emit(v, f"{path}.{_key(k)}" if path else _key(k))

    emit(data, "")
    return "\n".join(lines).strip() + "\n"


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else _toml_value(k)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_toml_value(x)}" for k, x in v.items() if x is not None) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")

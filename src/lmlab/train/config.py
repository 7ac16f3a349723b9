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

from lmlab import values
from lmlab.data.options import DOC_SEPARATORS
from lmlab.errors import LmlabError
from lmlab.values import (
    Count,
    Device,
    Encoding,
    Epsilon,
    Fraction,
    GradClip,
    LearningRate,
    MinLearningRate,
    PathText,
    Seed,
    Size,
    Text,
    Tflops,
    Threads,
    WeightDecay,
    Workers,
    choice,
)

SECTIONS = ("model", "objective", "data", "train")
SCHEDULES = ("cosine", "linear", "constant")
PRECISIONS = ("auto", "fp32", "bf16", "fp16")
DISTRIBUTED = ("auto", "ddp", "fsdp")
COMPILE_BACKENDS = ("inductor", "aot_eager", "eager")
ATTENTION = ("auto", "sdpa", "flex")
PROGRESS = ("auto", "on", "off")
# the enumerated keys, as value types (lmlab.values)
Schedule = choice(*SCHEDULES)
Precision = choice(*PRECISIONS)
Distributed = choice(*DISTRIBUTED)
CompileBackend = choice(*COMPILE_BACKENDS)
Attention = choice(*ATTENTION)
Progress = choice(*PROGRESS)
DocSeparator = choice(*DOC_SEPARATORS)


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

    train: list[PathText] = field(default_factory=list)
    val: list[PathText] = field(default_factory=list)
    tokenizer: str | dict[str, Any] = ""
    val_fraction: Fraction = 0.0
    max_tokens: Size = 0
    doc_separator: DocSeparator = "blank-line"
    encoding: Encoding = "utf-8"
    append_eos: bool = False
    text_field: Text = "text"
    workers: Workers = 1
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

    max_steps: Count = 1000
    batch_size: Count = 16  # a batch too large for the memory: _check_batch_fits
    seq_len: Count = 128
    lr: LearningRate = 1e-3
    min_lr: MinLearningRate = 1e-4
    warmup_steps: Size = 100
    decay_steps: Size = 0
    schedule: Schedule = "cosine"
    weight_decay: WeightDecay = 0.1
    betas: list[Fraction] = field(default_factory=lambda: [0.9, 0.95])
    eps: Epsilon = 1e-8
    grad_accum: Count = 1
    clip: GradClip = 1.0
    eval_every: Count = 100
    eval_batches: Size = 20
    eval_at_start: bool = True
    checkpoint_every: Count = 500
    keep_checkpoints: Size = 3
    log_every: Count = 1
    seed: Seed = 0
    threads: Threads = 0
    precision: Precision = "auto"
    device: Device = "auto"
    distributed: Distributed = "auto"
    progress: Progress = "auto"
    compile: bool = False
    compile_backend: CompileBackend = "inductor"
    activation_checkpointing: bool = False
    peak_tflops: Tflops = 0.0
    attention: Attention = "auto"
    prefetch: bool = True
    loggers: list[Text] = field(default_factory=list)


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
    """Read a recipe (TOML path, TOML-shaped dict or RunConfig), apply overrides, check it.

    Every value is checked against its field's type (:mod:`lmlab.values`) before anything else
    happens; an error names the file and key, or the ``--set`` that gave the value."""
    if isinstance(source, RunConfig):
        raw = source.to_dict()
    elif isinstance(source, dict):
        raw = {k: dict(v) if isinstance(v, dict) else v for k, v in source.items()}
    else:
        raw = read_toml(source)
    items = override_items(overrides)
    origin = Origin("" if isinstance(source, (dict, RunConfig)) else str(source),
                    frozenset(k for k, _ in items))
    for key, value in items:
        _apply_override(raw, key, value, origin)
    return _build(raw, origin)


@dataclass(frozen=True)
class Origin:
    """Where a recipe's values came from, to name it in errors: its file ("" for a dict) and the
    keys that ``--set`` gave."""

    file: str = ""
    set_keys: frozenset[str] = frozenset()

    def of(self, key: str) -> str:
        """Where ``key``'s value was written: ``--set train.lr``, ``FILE: train.lr`` or ``train.lr``."""
        if key in self.set_keys or any(k.startswith(f"{key}.") for k in self.set_keys):
            return f"--set {key}"
        return f"{self.file}: {key}" if self.file else key

    def section(self, name: str) -> str:
        return f"{self.file}: [{name}]" if self.file else f"[{name}]"


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


def _apply_override(raw: dict, key: str, value: Any, origin: Origin = Origin()) -> None:
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
    if not isinstance(node, dict):
        raise LmlabError(f"{origin.section(section)} must be a table, got {node!r}, so --set {key} has "
                         "nowhere to go", f"write [{section}] with key = value lines")
    for p in parts[1:-1]:
        if not isinstance(node.get(p), dict):
            node[p] = {}
        node = node[p]
    node[parts[-1]] = value


def _suggest(name: str, choices, prefix: str = "") -> str:
    close = difflib.get_close_matches(name, list(choices), n=1, cutoff=0.5)
    valid = ", ".join(prefix + c for c in choices)
    return f"did you mean {prefix}{close[0]}? (valid: {valid})" if close else f"valid: {valid}"


def _build(raw: dict[str, Any], origin: Origin = Origin()) -> RunConfig:
    unknown = [s for s in raw if s not in SECTIONS]
    if unknown:
        raise LmlabError(f"unknown config section {origin.section(unknown[0])}",
                         _suggest(unknown[0], SECTIONS))
    for s in SECTIONS:
        if not isinstance(raw.get(s, {}), dict):
            raise LmlabError(f"{origin.section(s)} must be a table, got {raw[s]!r}",
                             f"write [{s}] with key = value lines")
    model = _build_model(dict(raw.get("model", {})), origin)
    objective = _build_objective(dict(raw.get("objective", {})), origin)
    data = _build_dataclass(DataConfig, dict(raw.get("data", {})), "data", origin)
    train = _build_dataclass(TrainConfig, dict(raw.get("train", {})), "train", origin)
    cfg = RunConfig(model, objective, data, train)
    validate(cfg)
    return cfg


def _build_dataclass(cls, table: dict[str, Any], section: str, origin: Origin = Origin()):
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in table.items():
        if key not in hints:
            raise LmlabError(f"unknown config key {origin.of(f'{section}.{key}')}",
                             _suggest(key, names, f"{section}."))
        kwargs[key] = coerce(value, hints[key], f"{section}.{key}", origin.of(f"{section}.{key}"))
    return cls(**kwargs)


def _build_model(table: dict[str, Any], origin: Origin = Origin()) -> ModelConfig:
    from lmlab.models import PRESETS

    preset = table.pop("preset", ModelConfig.preset)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise LmlabError(f"unknown model preset {preset!r} ({origin.of('model.preset')})",
                         _suggest(str(preset), list(PRESETS), ""))
    base = PRESETS[preset]()
    hints = typing.get_type_hints(type(base), include_extras=True)
    names = [f.name for f in dataclasses.fields(base)]
    overrides = {}
    for key, value in table.items():
        if key not in hints:
            raise LmlabError(
                f"unknown config key {origin.of(f'model.{key}')} for preset {preset}",
                _suggest(key, ["preset", *names], "model."),
            )
        overrides[key] = coerce(value, hints[key], f"model.{key}", origin.of(f"model.{key}"))
    return ModelConfig(preset, overrides)


def _build_objective(table: dict[str, Any], origin: Origin = Origin()) -> ObjectiveConfig:
    from lmlab.objectives import get_objective

    name = table.pop("name", ObjectiveConfig.name)
    if not isinstance(name, str):
        raise LmlabError(f"{origin.of('objective.name')} must be a string, got {name!r}",
                         'write e.g. name = "clm"')
    cls = get_objective(name)
    hints = _objective_parameters(cls)
    for key in table:
        if key not in hints:
            fix = _suggest(key, ["name", *hints], "objective.") if hints else "it takes no parameters"
            raise LmlabError(f"unknown config key {origin.of(f'objective.{key}')} for objective {name!r}",
                             fix)
    params = {k: coerce(v, hints[k], f"objective.{k}", origin.of(f"objective.{k}")) for k, v in table.items()}
    return ObjectiveConfig(name, params)


def _objective_parameters(cls) -> dict[str, Any]:
    """Name -> type hint of every option an objective accepts, including those its ``__init__``
    passes on through ``**kwargs`` to a parent objective (NSP and UniLM take MLM's options)."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        hints = typing.get_type_hints(init, include_extras=True)
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
def coerce(value: Any, hint, key: str, where: str | None = None) -> Any:
    """Convert ``value`` to the type ``hint`` of config field ``key`` and check its range (an
    ``Annotated`` type of :mod:`lmlab.values`), or a one-line error naming ``where`` (the file and
    key, or the ``--set``; default: ``key``)."""
    where = where or key
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:  # a value type of lmlab.values: it says the range and the message
        base = typing.get_args(hint)[0]
        if base in (int, float):
            value = parse_value(value) if isinstance(value, str) else value
        else:
            value = coerce(value, base, key, where)
        return values.check(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(hint)
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in (a for a in args if a is not type(None)):
            try:
                return coerce(value, arg, key, where)
            except LmlabError as e:
                errors.append(e)
        raise errors[0]
    if hint is Any:
        return value
    if origin is list:
        (inner,) = typing.get_args(hint) or (Any,)
        text = _base_type(inner) is str
        if isinstance(value, str):
            split = not text or "," in value
            value = [v.strip() for v in value.split(",") if v.strip()] if split else [value]
        if isinstance(value, tuple):
            value = list(value)
        if not isinstance(value, list):
            raise LmlabError(f"{where} must be a list, got {value!r}", f"write e.g. {key}=[...]")
        return [coerce(v if text else parse_value(v) if isinstance(v, str) else v, inner, key, where)
                for v in value]
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise LmlabError(f"{where} must be a table, got {value!r}", f"write {key} as a TOML table")
        return dict(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1")
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        raise LmlabError(f"{where} must be true or false, got {value!r}", f"write {key}=true or {key}=false")
    if hint is int:
        if isinstance(value, str):
            value = parse_value(value)
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, bool) or not isinstance(value, int):
            raise LmlabError(f"{where} must be an integer, got {value!r}", f"write e.g. {key}=100")
        return value
    if hint is float:
        if isinstance(value, str):
            value = parse_value(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise LmlabError(f"{where} must be a number, got {value!r}", f"write e.g. {key}=0.001")
        if not math.isfinite(value):
            raise LmlabError(f"{where} must be a finite number, got {value!r}", f"write e.g. {key}=0.001")
        return float(value)
    if hint is str:
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise LmlabError(f"{where} must be a string, got {value!r}", f'write {key}="..."')
    return value


def _base_type(hint):
    """``str`` for ``Annotated[str, ...]``; any other hint as it is."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def _check_batch_fits(cfg: RunConfig) -> None:
    """Refuse, before any data is read, a model or micro-batch that cannot fit in this machine's
    memory (:mod:`lmlab.budget`): the weights, the tokens the objective adds to the vocabulary
    (T5's sentinels), and the activations of one micro-batch (a coarse estimate: logits and their
    gradient, plus ~20 floats per token per layer and width unit), each with its way out."""
    from lmlab import budget
    from lmlab.models import CONFIG_ARCHITECTURE, check_fits_in_memory, get_preset

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
    width, layers = getattr(model_cfg, "d_model", 0), getattr(model_cfg, "n_layers", 0)
    _check_added_tokens(cfg, width if isinstance(width, int) else 0)
    check_fits_in_memory(model_cfg, CONFIG_ARCHITECTURE.get(type(model_cfg), ""))  # weights first
    vocab = getattr(model_cfg, "vocab_size", 0)
    if not all(isinstance(x, int) for x in (width, layers, vocab)):
        return
    tokens = cfg.train.batch_size * cfg.train.seq_len
    what = f"the activations of a micro-batch of {cfg.train.batch_size:,} x {cfg.train.seq_len} tokens"
    budget.require_fits(budget.activation_bytes(tokens, vocab, width, layers), what,
                        "lower train.batch_size and raise train.grad_accum (same global batch)")


def _check_added_tokens(cfg: RunConfig, width: int) -> None:
    """Tokens the objective adds to the tokenizer (T5's ``num_sentinels``): each is a tokenizer entry
    and a row of the model's embedding and output tables."""
    from lmlab import budget
    from lmlab.objectives import get_objective

    try:
        added = get_objective(cfg.objective.name).added_tokens(cfg.objective.params)
    except (LmlabError, TypeError, ValueError):
        return  # a bad objective setting is reported when the objective is built
    if added > 0:
        budget.require_fits(added * (budget.TOKEN_TABLE_BYTES + 2 * budget.FLOAT32 * width),
                            f"objective {cfg.objective.name!r} adding {added:,} tokens to the vocabulary",
                            "lower the objective's num_sentinels (T5 uses 100)")


def _cuda_for(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def validate(cfg: RunConfig) -> None:
    """What no single value says (each value's own range was checked as it was read, by its type):
    relations between keys, the machine, and what needs no data or model (those come later,
    before training starts)."""
    t = cfg.train
    if t.seq_len < 2:
        raise LmlabError(f"train.seq_len {t.seq_len} is too short", "use at least 2 tokens")
    if t.min_lr > t.lr:
        raise LmlabError(
            f"need 0 <= train.min_lr <= train.lr and lr > 0, got lr={t.lr}, min_lr={t.min_lr}",
            "e.g. lr=1e-3, min_lr=1e-4",
        )
    from lmlab.train.loggers import check_loggers

    check_loggers(t.loggers, "train.loggers")
    if t.attention == "flex" and not _cuda_for(t.device):
        raise LmlabError("train.attention=flex trains on CUDA only (FlexAttention has no backward pass "
                         "on CPUs)", "use train.attention=auto or sdpa on this machine")
    if len(t.betas) != 2:
        raise LmlabError(
            f"train.betas must be two numbers in [0, 1), got {t.betas}", "e.g. betas=[0.9, 0.95]"
        )
    _check_batch_fits(cfg)
    if not cfg.data.train:
        raise LmlabError("data.train is empty", "set data.train to token shards or text files")


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

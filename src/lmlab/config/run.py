"""A pretraining run's config: the sections ``[model]``, ``[objective]``, ``[data]``, ``[train]`` of a
recipe TOML file, read with ``--set section.key=value`` overrides and checked once.

:func:`load_config` reads a file (or a dict), applies the overrides, checks every key (an unknown
one is a one-line error naming the closest valid key) and converts every value to its field's type;
:func:`to_toml` writes the resolved config back (``RUN_DIR/config.toml``), which loads again to the
same :class:`RunConfig`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab.config import toml
from lmlab.config.data import DataConfig, build_data_section
from lmlab.config.fields import build_section
from lmlab.config.model import ModelConfig, build_model_section
from lmlab.config.objective import ObjectiveConfig, build_objective_section
from lmlab.config.overrides import NOWHERE, Origin, apply_override, override_items, suggest
from lmlab.config.train import TrainConfig, check_train_rules
from lmlab.errors import LmlabError

SECTIONS = ("model", "objective", "data", "train")


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
            "data": dataclasses.asdict(self.data),
            "train": dataclasses.asdict(self.train),
        }


def load_config(
    source: str | os.PathLike | dict | RunConfig, overrides: list[str] | dict[str, Any] | None = None
) -> RunConfig:
    """Read a recipe (TOML path, TOML-shaped dict or RunConfig), apply overrides, check it.

    Every value is checked against its field's type (:mod:`lmlab.values`) before anything else
    happens; an error names the file and line of the key, or the ``--set`` that gave the value."""
    if isinstance(source, RunConfig):
        raw = source.to_dict()
    elif isinstance(source, dict):
        raw = {k: dict(v) if isinstance(v, dict) else v for k, v in source.items()}
    else:
        from lmlab.arguments import path_argument

        raw = toml.read_toml(path_argument(source, "the config (a recipe path, a dict or a RunConfig)"))
    items = override_items(overrides)
    origin = Origin("" if isinstance(source, (dict, RunConfig)) else str(source),
                    frozenset(k for k, _ in items))
    for key, value in items:
        apply_override(raw, key, value, SECTIONS, origin)
    return build_run_config(raw, origin)


def build_run_config(raw: dict[str, Any], origin: Origin = NOWHERE) -> RunConfig:
    unknown = [s for s in raw if s not in SECTIONS]
    if unknown:
        raise LmlabError(f"unknown config section {origin.section(unknown[0])}",
                         suggest(unknown[0], SECTIONS))
    for s in SECTIONS:
        if not isinstance(raw.get(s, {}), dict):
            raise LmlabError(f"{origin.section(s)} must be a table, got {raw[s]!r}",
                             f"write [{s}] with key = value lines")
    model = build_model_section(dict(raw.get("model", {})), origin)
    objective = build_objective_section(dict(raw.get("objective", {})), origin)
    data = build_data_section(dict(raw.get("data", {})), origin)
    train = build_section(TrainConfig, dict(raw.get("train", {})), "train", origin)
    check_train_rules(train, raw.get("train", {}), origin)
    cfg = RunConfig(model, objective, data, train)
    validate(cfg, origin)
    return cfg


def to_toml(cfg: RunConfig | dict) -> str:
    """Serialise a config as TOML (tables ``[model]``, ``[objective]``, ``[data]``, ``[train]``)."""
    return toml.to_toml(cfg.to_dict() if isinstance(cfg, RunConfig) else cfg)


def _cuda_for(device: str) -> bool:
    import torch

    return device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())


def validate(cfg: RunConfig, origin: Origin = NOWHERE) -> None:
    """What no single value says (each value's own range was checked as it was read, by its type):
    relations between keys, the machine, and what needs no data or model (those come later,
    before training starts). Each error names its setting where it was written (``origin``:
    ``--set train.betas``, ``recipe.toml:12: train.betas``)."""
    from lmlab.config.fits import check_batch_fits
    from lmlab.config.loggers import check_loggers

    t = cfg.train
    if t.seq_len < 2:
        raise LmlabError(f"{origin.of('train.seq_len')} {t.seq_len} is too short", "use at least 2 tokens")
    if t.min_lr > t.lr:
        raise LmlabError(f"{origin.of('train.min_lr')} {t.min_lr:g} is more than {origin.of('train.lr')} "
                         f"{t.lr:g} (the schedule decays from lr down to min_lr)",
                         f"lower train.min_lr to at most {t.lr:g} (e.g. a tenth of it), or raise train.lr")
    check_loggers(t.loggers, origin.of("train.loggers"))
    if t.attention == "flex" and not _cuda_for(t.device):
        raise LmlabError(f"{origin.of('train.attention')}=flex trains on CUDA only (FlexAttention has no "
                         "backward pass on CPUs)", "use train.attention=auto or sdpa on this machine")
    if len(t.betas) != 2:
        raise LmlabError(f"{origin.of('train.betas')} must be two numbers in [0, 1), got {t.betas}",
                         "e.g. betas=[0.9, 0.95]")
    check_schedule(t)
    check_windows(cfg, origin)
    check_positions(cfg, origin)
    check_objective_train(cfg, origin)
    check_objective_tokens(cfg)
    check_model_vocab(cfg, origin)
    check_batch_fits(cfg, origin)
    if not cfg.data.train:
        raise LmlabError(f"{origin.of('data.train')} is empty",
                         "set data.train to token shards or text files")


def check_schedule(t: TrainConfig, prefix: str = "train.") -> None:
    """A learning-rate schedule whose settings contradict each other is refused
    (:func:`lmlab.train.optim.lr_at`): a decay that ends (``decay_steps``) before the warmup does.
    A warmup longer than the run is not a contradiction (``--set train.max_steps=2`` on a recipe
    that warms up for 50 steps runs the first steps of that schedule): :func:`schedule_note` says
    so where the run starts. ``prefix`` names the keys (``pretrain.train.`` in a grid)."""
    if t.decay_steps and t.warmup_steps > t.decay_steps:
        raise LmlabError(f"{prefix}warmup_steps {t.warmup_steps} is longer than {prefix}decay_steps "
                         f"{t.decay_steps}: the decay would end before the warmup does",
                         f"set {prefix}warmup_steps <= {t.decay_steps} or "
                         f"{prefix}decay_steps >= {t.warmup_steps}")


def schedule_note(t: TrainConfig, prefix: str = "train.") -> str | None:
    """One line for the run's log when its warmup is longer than the run, so the learning rate
    never reaches ``lr`` (a short smoke run of a longer recipe, or a slip), else None."""
    if t.warmup_steps <= t.max_steps:
        return None
    peak = t.max_steps / t.warmup_steps
    return (f"note: {prefix}warmup_steps {t.warmup_steps} is longer than the run ({prefix}max_steps "
            f"{t.max_steps}): the learning rate reaches {peak:.0%} of {prefix}lr; set "
            f"{prefix}warmup_steps <= {t.max_steps} for the whole schedule")


def check_windows(cfg: RunConfig, origin: Origin = NOWHERE) -> None:
    """``data.max_tokens`` that cannot hold one training window of ``train.seq_len`` tokens
    (:func:`lmlab.data.packing.fewer_than_a_window`, the rule the trainer's windows apply to the
    tokens themselves)."""
    from lmlab.data.packing import fewer_than_a_window

    d, t = cfg.data, cfg.train
    if d.max_tokens and fewer_than_a_window(d.max_tokens, t.seq_len):
        raise LmlabError(f"{origin.of('data.max_tokens')} {d.max_tokens:,} is fewer than one training "
                         f"window of train.seq_len={t.seq_len} tokens",
                         f"set data.max_tokens >= {t.seq_len} (0: all the tokens) or lower train.seq_len")


def check_positions(cfg: RunConfig, origin: Origin = NOWHERE) -> None:
    """A ``train.seq_len`` longer than the model's positions (``model.max_positions``, else the
    preset's), named where it was written (the builder checks it again,
    :func:`lmlab.train.builder.check_run`)."""
    from lmlab.models import get_preset

    try:
        preset = get_preset(cfg.model.preset)
    except LmlabError:
        return  # an unknown preset is reported with its own message
    max_pos = cfg.model.overrides.get("max_positions", getattr(preset, "max_positions", None))
    if isinstance(max_pos, int) and cfg.train.seq_len > max_pos:
        raise LmlabError(f"{origin.of('train.seq_len')} {cfg.train.seq_len} is longer than the model's "
                         f"{max_pos} positions",
                         f"set train.seq_len <= {max_pos} (or raise model.max_positions)")


def check_objective_train(cfg: RunConfig, origin: Origin = NOWHERE) -> None:
    """What the objective needs of ``[train]`` (:meth:`~lmlab.objectives.base.Objective.check_train`:
    NSP's two rows per batch), the setting named where it was written (the error's ``setting``)."""
    from lmlab.objectives import get_objective

    cls = get_objective(cfg.objective.name)
    try:
        cls.check_train(cls.with_defaults(cfg.objective.params), cfg.train)
    except LmlabError as e:
        key = f"train.{e.setting}"
        if e.setting is None or not e.problem.startswith(key + " ") or origin.of(key) == key:
            raise
        raise origin.naming(e, key) from None


def check_objective_tokens(cfg: RunConfig) -> None:
    """A ``[data] tokenizer`` table whose special tokens (its ``special_tokens``, else the trainer's
    defaults) lack one the objective needs (:meth:`~lmlab.objectives.base.Objective.needed_roles`:
    MLM's [MASK], NSP's [CLS] and [SEP]...): known before the tokenizer is trained, so refused here
    rather than after the text is tokenised (the objective checks a trained or loaded tokenizer
    again when it is made)."""
    from lmlab.objectives import get_objective
    from lmlab.objectives.masking import ROLE_TOKENS
    from lmlab.tokenizers.special_tokens import DEFAULT_SPECIAL_TOKENS, ROLE_OF_TOKEN

    tok = cfg.data.tokenizer
    if not isinstance(tok, dict) or tok.get("special_tokens") is None:
        return  # a tokenizer directory is checked when it is read; the defaults have every role
    specials = list(tok["special_tokens"])
    have = {ROLE_OF_TOKEN.get(t) for t in specials}
    cls = get_objective(cfg.objective.name)
    for role in cls.needed_roles(cls.with_defaults(cfg.objective.params)):
        if role not in have:
            token = ROLE_TOKENS.get(role, role)
            named = [t for t in DEFAULT_SPECIAL_TOKENS if ROLE_OF_TOKEN.get(t) == role][:1] or [token]
            raise LmlabError(f"the {cfg.objective.name} objective needs a {token} token but "
                             f"data.tokenizer.special_tokens {specials} has none",
                             f"add {named[0]!r} to data.tokenizer.special_tokens (or leave special_tokens "
                             "out: the defaults include it)")


def check_model_vocab(cfg: RunConfig, origin: Origin = NOWHERE) -> None:
    """``model.vocab_size`` smaller than the vocabulary a ``[data] tokenizer`` table asks for plus
    the tokens the objective adds (T5's sentinels): known before the tokenizer is trained (the
    trainer checks the trained one again, :func:`lmlab.train.builder.model_config`)."""
    from lmlab.objectives import get_objective

    size, tok = cfg.model.overrides.get("vocab_size"), cfg.data.tokenizer
    if not isinstance(size, int) or not isinstance(tok, dict) or not isinstance(tok.get("vocab_size"), int):
        return
    added = get_objective(cfg.objective.name).added_tokens(cfg.objective.params)
    need = tok["vocab_size"] + added
    if size < need:
        extra = f" plus the {added} objective {cfg.objective.name!r} adds" if added else ""
        raise LmlabError(f"{origin.of('model.vocab_size')} {size} is smaller than the {tok['vocab_size']} "
                         f"tokens data.tokenizer asks for{extra}",
                         f"set model.vocab_size >= {need} or leave it out")

"""The one builder of a pretraining run's model and objective, shared by the trainer and the lab.

:func:`check_run` makes the cheap checks (the objective trains the preset's architecture, the
sequence fits the model's positions) before any data is read; :func:`build_run` turns a checked
:class:`~lmlab.config.RunConfig` and the run's tokenizer into the objective, the model config (the
vocabulary sized by one rule, :func:`run_vocab_size`) and the model. On ``torch.device("meta")``
the model holds no numbers, so a grid plans its runs (parameters, FLOPs per step) with exactly the
model the trainer will build, without a byte of weights.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmlab.config import RunConfig
from lmlab.errors import LmlabError, a_or_an


@dataclass
class BuiltRun:
    """A run's model and objective as the trainer uses them."""

    model: nn.Module
    objective: nn.Module | None  # None: planned without a tokenizer, or a model without pretraining
    objective_cls: type | None
    model_config: Any
    architecture: str

    @property
    def vocab_size(self) -> int:
        return self.model_config.vocab_size

    @property
    def parameters(self) -> int:
        """The model's parameters, as the trainer reports them (a tied matrix counts once)."""
        return self.model.num_parameters()

    def step_flops(self, seq_len: int, rows: int, params: dict[str, Any]) -> float:
        """Training FLOPs of one optimizer step of ``rows`` rows, as the objective counts them."""
        if self.objective_cls is None:
            return 0.0
        return self.objective_cls.step_flops(self.model_config, seq_len, rows, params)


def check_run(cfg: RunConfig, *, with_objective: bool = True) -> tuple[type | None, str]:
    """``(objective class, architecture)`` of ``cfg``, or a one-line error when the model settings are
    impossible (``model.n_heads`` not dividing ``d_model``, a dropout of 1.5...), the objective cannot
    train the preset or ``train.seq_len`` is longer than the model's positions: before any data is
    tokenised for the run."""
    from lmlab.config.fits import planned_vocab_size
    from lmlab.models import CONFIG_ARCHITECTURE, PRESETS, get_preset
    from lmlab.objectives import get_objective

    base = PRESETS[cfg.model.preset]()
    # the preset with the run's settings, checked as the model will be, with the vocabulary the run
    # will have (planned_vocab_size); where only the tokenizer will tell, the preset's stands in, and
    # the special ids wait for the tokenizer (model_config): the preset's size is not the run's
    vocab = planned_vocab_size(cfg)
    settings = {"vocab_size": base.vocab_size if vocab is None else vocab, **cfg.model.overrides}
    if vocab is None:
        ids = [settings.get(k) for k in ("pad_token_id", "bos_token_id", "eos_token_id")]
        settings["vocab_size"] = max([settings["vocab_size"], *(i + 1 for i in ids if isinstance(i, int))])
    get_preset(cfg.model.preset, **settings)
    arch = CONFIG_ARCHITECTURE.get(type(base), "?")
    objective_cls = get_objective(cfg.objective.name) if with_objective else None
    if objective_cls is not None and objective_cls.architectures and arch not in objective_cls.architectures:
        raise LmlabError(
            f"objective {cfg.objective.name!r} trains {'/'.join(objective_cls.architectures)} "
            f"models, but preset {cfg.model.preset} is {a_or_an(arch)}",
            f"pick a {objective_cls.architectures[0]} preset or another objective",
        )
    max_pos = cfg.model.overrides.get("max_positions", getattr(base, "max_positions", None))
    # (a model built without an objective, the start of a run without pretraining, reads no windows)
    if with_objective and max_pos is not None and cfg.train.seq_len > max_pos:
        raise LmlabError(f"train.seq_len {cfg.train.seq_len} is longer than the model's {max_pos} positions",
                         f"set train.seq_len <= {max_pos} (or model.max_positions)")
    return objective_cls, arch


def run_vocab_size(tokenizer_vocab: int, data_vocab: int = 0) -> int:
    """The vocabulary of a run's model: every id of the tokenizer (after the objective added its
    tokens, T5's sentinels) and of the token shards, which a different tokenizer may have written."""
    return max(tokenizer_vocab, data_vocab)


def build_run(cfg: RunConfig, tokenizer=None, device: str | torch.device = "cpu", *, data_vocab_size: int = 0,
              tokenizer_vocab: int = 0, with_objective: bool = True) -> BuiltRun:
    """The objective (made with ``tokenizer``, to which it may add tokens), the model config and the
    model of run ``cfg``, built on ``device`` (``"meta"``: sizes only). ``data_vocab_size``: the
    vocabulary of the token shards. Without a tokenizer (a grid planning a run whose tokenizer is
    not trained yet) ``tokenizer_vocab`` is the size it will have, the objective's added tokens
    counted by :meth:`~lmlab.objectives.base.Objective.added_tokens`, and no objective is made.
    ``with_objective=False``: the bare model a run without pretraining starts from (no heads)."""
    objective_cls, arch = check_run(cfg, with_objective=with_objective)
    objective = None
    if tokenizer is not None:
        if objective_cls is not None:
            objective = objective_cls(tokenizer, **cfg.objective.params)
        tokenizer_vocab = tokenizer.vocab_size
    elif objective_cls is not None:
        tokenizer_vocab += objective_cls.added_tokens(cfg.objective.params)
    config = model_config(cfg.model.preset, cfg.model.overrides, tokenizer,
                          run_vocab_size(tokenizer_vocab, data_vocab_size))
    from lmlab.models import build_model

    device = torch.device(device)
    if device.type != "meta":
        torch.manual_seed(cfg.train.seed)
    heads = (objective_cls.heads or None) if objective_cls is not None else None
    with device:
        model = build_model(config, heads=heads)
        if tokenizer is not None:
            model.tokenizer = tokenizer
        if objective is not None:
            objective.setup(model)  # objective-owned parts sized from the model (ELECTRA, SBO)
    return BuiltRun(model, objective, objective_cls, config, arch)


def model_config(preset: str, overrides: dict[str, Any], tok, vocab_size: int):
    """The config of a run's model: ``preset`` + ``overrides``, sized to ``vocab_size`` (the
    tokenizer's, objective-added tokens included) with the tokenizer's pad/bos/eos ids (``tok``
    None: the preset's own)."""
    from lmlab.models import get_preset

    overrides = dict(overrides)
    overrides.setdefault("vocab_size", vocab_size)
    if overrides["vocab_size"] < vocab_size:
        raise LmlabError(
            f"model.vocab_size {overrides['vocab_size']} is smaller than the tokenizer's {vocab_size} tokens",
            f"set model.vocab_size >= {vocab_size} or leave it out",
        )
    fields = {f.name for f in dataclasses.fields(type(get_preset(preset)))}
    for role in ("pad", "bos", "eos"):
        key = f"{role}_token_id"
        if tok is not None and key in fields and key not in overrides and tok.role_id(role) is not None:
            overrides[key] = tok.role_id(role)
    return get_preset(preset, **overrides)

"""The records of a planned grid: its budget, arms, tasks and contrasts, and the runs planned from
them (what :func:`lmlab.lab.grid.load_grid` returns and :mod:`lmlab.lab.runner` trains)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: the objective name of an arm that is not pretrained (fine-tuned from random initialisation)
NONE = "none"
#: the kind of folder ``lmlab compare`` fills (:func:`lmlab.ownership.claim_dir`; its entries:
#: :data:`lmlab.lab.runner.GRID_ENTRIES`)
GRID_KIND = "comparison"


@dataclass(frozen=True)
class Budget:
    """Per-run pretraining budget: ``kind`` is ``"tokens"`` or ``"flops"``."""

    kind: str
    amount: float

    def __str__(self) -> str:
        value = f"{self.amount:,.0f}" if self.kind == "tokens" else f"{self.amount:.3g}"
        return f"{{{self.kind} = {value}}}"


@dataclass
class Arm:
    name: str
    preset: str
    objective: str  # a key of lmlab.objectives.OBJECTIVES, or "none"
    params: dict[str, Any] = field(default_factory=dict)
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)
    architecture: str = ""
    budget: Budget | None = None  # this arm's own budget (None: the grid's)

    @property
    def pretrained(self) -> bool:
        return self.objective != NONE


@dataclass
class TaskSpec:
    name: str  # column label, e.g. "sst2"
    task: str  # lmlab task name
    train: str  # expanded paths
    dev: str
    settings: dict[str, Any]  # FinetuneConfig fields (seed added per run)
    given: tuple[str, ...] = ()  # the settings the grid wrote (the rest are the grid's defaults)
    names: Any = None  # how its settings are named in a message (lmlab.config.rules.SettingNames)

    def config(self):
        """The settings as the checked fine-tuning section (:class:`lmlab.config.FinetuneConfig`),
        their rules held (named ``finetune.KEY`` or ``tasks[i].finetune.KEY``, as written)."""
        from lmlab.config.finetune import FinetuneConfig

        return FinetuneConfig.from_dict(self.settings, where="finetune.", names=self.names, given=self.given)


@dataclass
class PretrainRun:
    """One pretraining run (or, for ``objective = "none"``, one randomly initialised model)."""

    arm: Arm
    size: str
    seed: int
    config: dict[str, Any]  # TOML-shaped pretrain config (train.max_steps from the budget)
    steps: int
    tokens: int  # planned training tokens
    flops_per_step: float
    parameters: int
    key: str
    vocab_size: int = 0  # the model's vocabulary, as the trainer will build it
    model_config: Any = field(default=None, repr=False, compare=False)  # the model the trainer builds

    @property
    def label(self) -> str:
        return f"{self.arm.name}/{self.size}/seed {self.seed}"

    @property
    def dirname(self) -> str:
        return f"{self.arm.name}-{self.size}-s{self.seed}-{self.key}"

    @property
    def flops(self) -> float:
        return self.flops_per_step * self.steps


@dataclass
class FinetuneRun:
    pretrain: PretrainRun
    task: TaskSpec
    seed: int
    settings: dict[str, Any]  # FinetuneConfig fields, seed included
    key: str

    @property
    def label(self) -> str:
        return f"{self.pretrain.arm.name}/{self.pretrain.size} -> {self.task.name} seed {self.seed}"

    @property
    def dirname(self) -> str:
        return f"{self.task.name}-{self.pretrain.arm.name}-{self.pretrain.size}-s{self.seed}-{self.key}"


@dataclass(frozen=True)
class Contrast:
    """A claim the grid tests: arm ``better`` scores higher downstream than arm ``than`` (``kind =
    "at-least"``: not lower), compared seed by seed (see :func:`lmlab.lab.report.contrast_rows`)."""

    name: str
    better: str
    than: str
    kind: str = "better"


@dataclass
class Grid:
    name: str
    seeds: list[int]
    budget: Budget
    share_pretraining: bool
    arms: list[Arm]
    sizes: dict[str, dict[str, Any]]
    tasks: list[TaskSpec]
    pretrain_runs: list[PretrainRun]
    finetune_runs: list[FinetuneRun]
    cache_dir: str  # data.cache_dir given in the grid ("" = decided by the runner)
    source: str = ""
    contrasts: list[Contrast] = field(default_factory=list)

    def finetunes_of(self, run: PretrainRun) -> list[FinetuneRun]:
        return [f for f in self.finetune_runs if f.pretrain is run]

    def budget_text(self) -> str:
        """``{tokens = N} per pretraining run``, plus the arms that have their own budget."""
        own = [f"{a.name}: {a.budget}" for a in self.arms if a.budget is not None]
        return f"{self.budget} per pretraining run" + (f" ({'; '.join(own)})" if own else "")

"""A comparison grid: parse ``grid.toml``, check every run before anything trains, plan the runs.

A grid is the cross product ``arms x sizes x seeds``. An *arm* pairs a model preset with a
pretraining objective (or ``"none"``: the same model fine-tuned from random initialisation); a
*size* is a set of model overrides (``d_model``, ``n_layers``...); every pretraining run gets the
same corpus and tokenizer (``[pretrain.data]``), the same training settings (``[pretrain.train]``)
and the same budget, in tokens or in FLOPs. Every pretrained model is then fine-tuned on the same
``[[tasks]]`` with the same seed. This is the T5 paper's way of comparing objectives (Raffel et al.
2020, §3.3: one model size, one pretraining budget, one fine-tuning recipe, many objectives).

Budgets (per pretraining run):

* ``{tokens = N}``: ``max_steps = floor(N / tokens_per_step)`` with ``tokens_per_step =
  batch_size * grad_accum * seq_len`` (the trainer's count of training tokens);
* ``{flops = C}``: ``max_steps = floor(C / flops_per_step)``, where ``flops_per_step`` is the
  model's training FLOPs for one global batch from :mod:`lmlab.models.flops` (forward + backward =
  3 x forward, attention included), counted the way each objective runs the model: causal LMs
  project every position to the vocabulary, masked LMs only the masked ~15%, ELECTRA adds its
  generator (``generator_size`` of the width, MLM head at the masked positions) to a
  discriminator that reads every position, T5 encodes the corrupted input and decodes the
  sentinel targets (lengths from ``noise_density`` and ``mean_span_length``), BART encodes and
  decodes the whole row. So an objective that does more work per token gets fewer tokens.

Everything a run's result depends on goes into its key (a hash of the resolved settings), which
names its directory: a finished run is found again and never retrained; change a setting and
only the runs it touches are new.
"""

from __future__ import annotations

import copy
import difflib
import hashlib
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmlab import values
from lmlab.errors import LmlabError
from lmlab.fileio import check_name
from lmlab.values import Flops, Seed, Seeds

__all__ = [
    "MIN_STEPS",
    "NONE",
    "Arm",
    "Budget",
    "Contrast",
    "FinetuneRun",
    "Grid",
    "PretrainRun",
    "TaskSpec",
    "flops_per_step",
    "load_grid",
    "run_key",
    "steps_for_budget",
    "valid_objectives",
]

#: the objective name of an arm that is not pretrained (fine-tuned from random initialisation)
NONE = "none"
#: a budget that buys fewer optimizer steps than this is refused
MIN_STEPS = 10
#: a budget in tokens or FLOPs: finite and positive
BudgetAmount = Flops

GRID_KEYS = (
    "name",
    "description",
    "seeds",
    "budget",
    "share_pretraining",
    "pretrain",
    "sizes",
    "arms",
    "finetune",
    "tasks",
    "contrasts",
)
PRETRAIN_KEYS = ("data", "train", "model")
ARM_KEYS = ("name", "preset", "objective", "params", "model", "train", "budget")
CONTRAST_KEYS = ("name", "better", "than", "kind")
#: a contrast's claim: "better" (strictly higher downstream score) or "at-least" (not lower)
CONTRAST_KINDS = ("better", "at-least")
TASK_KEYS = ("name", "task", "train", "dev", "max_train_examples", "max_eval_examples", "finetune")
#: train.* keys that change neither the arithmetic nor the result of a run (left out of its key)
MACHINE_TRAIN_KEYS = (
    "threads",
    "progress",
    "device",
    "distributed",
    "checkpoint_every",
    "keep_checkpoints",
    "log_every",
    "loggers",
)
#: fine-tuning settings that change nothing but speed or display (left out of the key)
MACHINE_FINETUNE_KEYS = ("threads", "progress", "device", "log_every", "eval_batch_size", "loggers")


# --------------------------------------------------------------------------- records


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


# --------------------------------------------------------------------------- helpers


def _suggest(name: str, choices) -> str:
    choices = list(choices)
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.5)
    valid = ", ".join(choices)
    return f"did you mean {close[0]}? (valid: {valid})" if close else f"valid: {valid}"


def _check_keys(table: dict, allowed, where: str) -> None:
    for key in table:
        if key not in allowed:
            raise LmlabError(f"unknown key {key!r} in {where}", _suggest(key, allowed))


def _table(value, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LmlabError(f"{where} must be a table, got {value!r}", f"write [{where}] with key = value lines")
    return dict(value)


def run_key(obj: Any) -> str:
    """12 hex digits of the SHA-256 of ``obj`` as canonical JSON (sorted keys)."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


def valid_objectives(architecture: str) -> list[str]:
    """Objective names that train ``architecture`` (``none`` included)."""
    from lmlab.objectives import OBJECTIVES, get_objective

    names = [n for n in OBJECTIVES if architecture in (get_objective(n).architectures or (architecture,))]
    return [NONE, *names]


def _architecture(preset: str) -> str:
    from lmlab.models import CONFIG_ARCHITECTURE, PRESETS

    if preset not in PRESETS:
        raise LmlabError(f"unknown model preset {preset!r}", _suggest(preset, PRESETS))
    return CONFIG_ARCHITECTURE.get(type(PRESETS[preset]()), "?")


# --------------------------------------------------------------------------- FLOPs and budgets


def flops_per_step(model_config, objective: str, params: dict[str, Any], seq_len: int, rows: int) -> float:
    """Training FLOPs of one optimizer step of ``rows`` rows of ``seq_len`` tokens, as the
    objective counts them (:meth:`lmlab.objectives.base.Objective.step_flops`)."""
    from lmlab.objectives import get_objective

    return get_objective(objective).step_flops(model_config, seq_len, rows, params)


def steps_for_budget(budget: Budget, tokens_per_step: int, step_flops: float) -> int:
    """Optimizer steps a run can take within ``budget`` (rounded down)."""
    if budget.kind == "tokens":
        return int(budget.amount // tokens_per_step)
    return int(budget.amount // step_flops) if step_flops > 0 else 0


def _check_not_endless(steps: int, budget: Budget, arm: Arm, tokens_per_step: int, step_flops: float) -> None:
    """Refuse a budget that buys more than :data:`lmlab.budget.MAX_STEPS` optimizer steps: a run
    that would never end (``budget.flops = 1e300``), refused before anything is planned."""
    from lmlab.budget import MAX_STEPS

    if steps <= MAX_STEPS:
        return
    where = f"arms.{arm.name}.budget" if arm.budget else "budget"
    per_step = tokens_per_step if budget.kind == "tokens" else step_flops
    raise LmlabError(f"budget {budget} buys {steps:.3g} optimizer steps for arm {arm.name!r}, more than "
                     f"the {MAX_STEPS:,} a run may take", f"lower {where}.{budget.kind} to at most "
                     f"{MAX_STEPS * per_step:.3g}")


def _parse_budget(value) -> Budget:
    fix = "write budget = {tokens = 1000000} or budget = {flops = 1e13}"
    if not isinstance(value, dict) or len(value) != 1:
        raise LmlabError(f"budget must be a table with one key, tokens or flops; got {value!r}", fix)
    ((kind, amount),) = value.items()
    if kind not in ("tokens", "flops"):
        raise LmlabError(f"unknown budget kind {kind!r}", f"{_suggest(kind, ['tokens', 'flops'])}; {fix}")
    return Budget(kind, values.check(BudgetAmount, amount, f"budget.{kind}", fix))


# --------------------------------------------------------------------------- loading


def load_grid(source: str | os.PathLike | dict[str, Any], overrides: list[str] | None = None) -> Grid:
    """Read and check a grid (a TOML path or a TOML-shaped dict) and plan its runs.

    ``overrides``: ``["budget.tokens=20480", "pretrain.train.lr=1e-3"]`` (dotted keys into the
    grid's tables; values are TOML literals), applied before the checks.

    Nothing is trained or tokenised here: every error a grid can have (unknown keys, objectives,
    presets, tasks or settings, an objective that cannot train the preset, a task the architecture
    cannot do, missing files, a budget too small) is raised now as a one-line :class:`LmlabError`.
    """
    if isinstance(source, dict):
        raw, where = copy.deepcopy(source), "grid"
    else:
        path = Path(source)
        if not path.is_file():
            raise LmlabError(
                f"grid file {path} does not exist", "pass a grid such as configs/grids/objectives-tiny.toml"
            )
        try:
            with open(path, "rb") as f:
                raw = tomllib.load(f)
        except tomllib.TOMLDecodeError as e:
            raise LmlabError(f"grid file {path} is not valid TOML ({e})", "fix the line it names") from None
        except UnicodeDecodeError as e:
            bad = e.object[e.start:e.start + 1]
            raise LmlabError(f"grid file {path} is not UTF-8 (byte {bad!r} at offset {e.start})",
                             "save it as UTF-8 (TOML files always are)") from None
        where = str(path)
    if not isinstance(raw, dict):
        raise LmlabError(f"{where} must be a TOML table of grid keys, got {raw!r}", "see configs/grids/")
    try:
        return _plan(raw, where, overrides)
    except LmlabError as e:  # every value of the grid is named with the file it came from
        if where == "grid":
            raise
        raise LmlabError(f"{where}: {e.problem}", e.fix) from None


def _grid_name(raw: dict[str, Any], where: str) -> str:
    """The grid's ``name`` (default: the file's stem), which names its output folder: a file name."""
    name = raw.get("name")
    if name is None:
        return check_name(Path(where).stem if where != "grid" else "grid", "grid name (the file's stem)")
    if not isinstance(name, str):
        raise LmlabError(f"the grid's name must be text, got {name!r}", 'write e.g. name = "objectives"')
    return check_name(name, "grid name")


def _seeds(raw: dict[str, Any]) -> list[int]:
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    seeds = values.check(Seeds, seeds, "seeds", "write e.g. seeds = [0, 1, 2]")
    if len(set(seeds)) != len(seeds):
        raise LmlabError(f"seeds must be distinct, got {seeds!r}", "write e.g. seeds = [0, 1, 2]")
    return seeds


def _plan(raw: dict[str, Any], where: str, overrides: list[str] | None) -> Grid:
    """The checked grid of ``raw`` (read from ``where``) with its runs planned."""
    for item in overrides or []:
        _apply_override(raw, item)
    _check_keys(raw, GRID_KEYS, "the grid")

    name = _grid_name(raw, where)
    seeds = _seeds(raw)
    if "budget" not in raw:
        raise LmlabError(
            "the grid has no budget", "add budget = {tokens = 1000000} or budget = {flops = 1e13}"
        )
    budget = _parse_budget(raw["budget"])
    share = raw.get("share_pretraining", False)
    if not isinstance(share, bool):
        raise LmlabError(
            f"share_pretraining must be true or false, got {share!r}", "write share_pretraining = true"
        )

    pre = _table(raw.get("pretrain"), "pretrain")
    _check_keys(pre, PRETRAIN_KEYS, "[pretrain]")
    data = _table(pre.get("data"), "pretrain.data")
    if not data.get("train"):
        raise LmlabError(
            "[pretrain.data] has no train", "set pretrain.data.train to the corpus (text files or shards)"
        )
    shared_train = _table(pre.get("train"), "pretrain.train")
    shared_model = _table(pre.get("model"), "pretrain.model")
    if "max_steps" in shared_train:
        raise LmlabError("pretrain.train.max_steps is set by the budget", "remove it and set budget instead")

    sizes_raw = raw.get("sizes") or {"base": {}}
    if not isinstance(sizes_raw, dict):
        raise LmlabError(
            "sizes must be a table of name = {model overrides}",
            "write e.g. sizes = { d64 = { d_model = 64 } }",
        )
    sizes = {check_name(str(k), "size name"): _table(v, f"sizes.{k}") for k, v in sizes_raw.items()}

    arms = _parse_arms(raw.get("arms"))
    for arm in arms:  # a run takes its seed from the grid's seeds; one written here must still be a seed
        if "seed" in {**shared_train, **arm.train}:
            values.check(Seed, {**shared_train, **arm.train}["seed"], f"arm {arm.name!r}: train.seed",
                         "remove it: every run takes its seed from the grid's seeds")
    tasks = _parse_tasks(raw.get("tasks"), _table(raw.get("finetune"), "finetune"))

    from lmlab.train.config import load_config

    pretrain_runs: list[PretrainRun] = []
    finetune_runs: list[FinetuneRun] = []
    data_key = {k: v for k, v in data.items() if k not in ("cache_dir", "workers")}
    for arm in arms:
        for task in tasks:
            _check_task(task, arm)
        for size, size_model in sizes.items():
            pre_seeds = seeds[:1] if share else seeds
            planned: dict[int, PretrainRun] = {}
            for seed in pre_seeds:
                train = {**shared_train, **arm.train, "seed": seed}
                model = {**shared_model, **size_model, **arm.model}
                probe_objective = arm.objective if arm.pretrained else _probe_objective(arm)
                cfg_dict = {
                    "model": {"preset": arm.preset, **model},
                    "objective": {"name": probe_objective, **arm.params},
                    "data": dict(data),
                    "train": {**train, "max_steps": 1},
                }
                try:
                    cfg = load_config(cfg_dict)
                except LmlabError as e:
                    raise LmlabError(f"arm {arm.name!r}, size {size!r}: {e}") from None
                model_config = _model_config(cfg, arm)
                max_pos = getattr(model_config, "max_positions", None)
                if max_pos is not None and cfg.train.seq_len > max_pos:
                    raise LmlabError(
                        f"arm {arm.name!r}: train.seq_len {cfg.train.seq_len} is longer than the "
                        f"model's {max_pos} positions",
                        f"set pretrain.train.seq_len <= {max_pos} (or model.max_positions)",
                    )
                parameters = _count_parameters(model_config, arm)
                resolved = cfg.to_dict()
                if arm.pretrained:
                    run_budget = arm.budget or budget
                    t = cfg.train
                    rows = t.batch_size * t.grad_accum
                    tokens_per_step = rows * t.seq_len
                    step_flops = (
                        flops_per_step(model_config, arm.objective, arm.params, t.seq_len, rows)
                        if run_budget.kind == "flops"
                        else _try_flops(model_config, arm, t.seq_len, rows)
                    )
                    steps = steps_for_budget(run_budget, tokens_per_step, step_flops)
                    _check_not_endless(steps, run_budget, arm, tokens_per_step, step_flops)
                    if steps < MIN_STEPS:
                        need = MIN_STEPS * (tokens_per_step if run_budget.kind == "tokens" else step_flops)
                        where = f"arms.{arm.name}.budget" if arm.budget else "budget"
                        raise LmlabError(
                            f"budget {run_budget} buys only {steps} step(s) of {rows} x {t.seq_len} "
                            f"tokens for arm {arm.name!r} ({step_flops:.3g} FLOPs per step); "
                            f"at least {MIN_STEPS} are needed",
                            f"raise {where}.{run_budget.kind} to at least {need:.3g}",
                        )
                    resolved["train"] = _run_train_defaults(resolved["train"], train, steps)
                    tokens = steps * tokens_per_step
                else:
                    steps, tokens, step_flops = 0, 0, 0.0
                    resolved["objective"] = {"name": NONE}
                    resolved["train"] = {"seed": seed}
                keyed = copy.deepcopy(resolved)
                keyed["data"] = data_key
                if arm.pretrained:
                    for k in MACHINE_TRAIN_KEYS:
                        keyed["train"].pop(k, None)
                keyed["lab"] = {"kind": "pretrain" if arm.pretrained else "init"}
                run = PretrainRun(
                    arm, size, seed, resolved, steps, tokens, step_flops, parameters, run_key(keyed)
                )
                planned[seed] = run
                pretrain_runs.append(run)
            for seed in seeds:
                run = planned[pre_seeds[0]] if share else planned[seed]
                for task in tasks:
                    settings = {**task.settings, "seed": seed}
                    keyed = {
                        "pretrain": run.key,
                        "task": task.task,
                        "train": task.train,
                        "dev": task.dev,
                        "settings": {k: v for k, v in settings.items() if k not in MACHINE_FINETUNE_KEYS},
                    }
                    finetune_runs.append(FinetuneRun(run, task, seed, settings, run_key(keyed)))
    labels = [r.dirname for r in pretrain_runs]
    if len(set(labels)) != len(labels):
        raise LmlabError(
            "two arms resolve to the same run", "give each [[arms]] entry its own name and settings"
        )
    return Grid(
        name,
        list(seeds),
        budget,
        share,
        arms,
        sizes,
        tasks,
        pretrain_runs,
        finetune_runs,
        str(data.get("cache_dir", "")),
        where,
        _parse_contrasts(raw.get("contrasts"), arms),
    )


def _parse_contrasts(value, arms: list[Arm]) -> list[Contrast]:
    """``[[contrasts]]`` tables: ``better`` and ``than`` must name two different arms."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise LmlabError(
            "contrasts must be a list of [[contrasts]] tables",
            'write [[contrasts]] with better = "arm-a" and than = "arm-b"',
        )
    names = [a.name for a in arms]
    out: list[Contrast] = []
    for i, entry in enumerate(value):
        entry = _table(entry, f"contrasts[{i}]")
        _check_keys(entry, CONTRAST_KEYS, f"contrasts[{i}]")
        for side in ("better", "than"):
            if entry.get(side) not in names:
                raise LmlabError(
                    f"contrasts[{i}]: {side} = {entry.get(side)!r} is not an arm of the grid",
                    _suggest(str(entry.get(side)), names),
                )
        if entry["better"] == entry["than"]:
            raise LmlabError(f"contrasts[{i}] compares arm {entry['better']!r} with itself", "name two arms")
        kind = entry.get("kind", "better")
        if kind not in CONTRAST_KINDS:
            raise LmlabError(
                f"contrasts[{i}]: unknown kind {kind!r}", f"choose one of: {', '.join(CONTRAST_KINDS)}"
            )
        name = str(entry.get("name") or f"{entry['better']} vs {entry['than']}")
        out.append(Contrast(name, entry["better"], entry["than"], kind))
    return out


def _apply_override(raw: dict[str, Any], item: str) -> None:
    from lmlab.train.config import parse_value

    key, sep, value = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise LmlabError(
            f"override {item!r} is not of the form key=value", "write e.g. --set budget.tokens=20480"
        )
    node = raw
    for part in parts[:-1]:
        if not isinstance(node.setdefault(part, {}), dict):
            raise LmlabError(
                f"override {item!r}: {part} is not a table", "only tables can be overridden (not [[arms]])"
            )
        node = node[part]
    if parts[:-1] == ["budget"] and parts[-1] in ("tokens", "flops"):
        node.clear()  # a budget has one kind
    node[parts[-1]] = parse_value(value.strip())


def _parse_arms(value) -> list[Arm]:
    if not isinstance(value, list) or not value:
        raise LmlabError(
            "the grid has no [[arms]]", 'add [[arms]] tables with preset = "bert-tiny" and objective = "mlm"'
        )
    from lmlab.objectives import OBJECTIVES

    arms: list[Arm] = []
    for i, entry in enumerate(value):
        entry = _table(entry, f"arms[{i}]")
        _check_keys(entry, ARM_KEYS, f"arms[{i}]")
        preset, objective = entry.get("preset"), entry.get("objective")
        if not isinstance(preset, str) or not isinstance(objective, str):
            raise LmlabError(
                f"arms[{i}] needs preset and objective (strings)",
                'write preset = "bert-tiny" and objective = "mlm" (or "none": no pretraining)',
            )
        arch = _architecture(preset)
        name = check_name(str(entry.get("name") or f"{preset}-{objective}"), "arm name")
        valid = valid_objectives(arch)
        if objective != NONE and objective not in OBJECTIVES:
            close = difflib.get_close_matches(objective, [NONE, *OBJECTIVES], n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise LmlabError(
                f"arm {name!r}: unknown objective {objective!r}",
                f"{hint}choose one of: {', '.join([NONE, *OBJECTIVES])}",
            )
        if objective not in valid:
            raise LmlabError(
                f"arm {name!r}: objective {objective!r} cannot train preset {preset}, "
                f"{'an' if arch[0] in 'aeiou' else 'a'} {arch}",
                f"valid objectives for {preset}: {', '.join(valid)}",
            )
        params = _table(entry.get("params"), f"arms[{i}].params")
        if objective == NONE and params:
            raise LmlabError(f"arm {name!r}: objective 'none' takes no params", "remove its params table")
        if any(a.name == name for a in arms):
            raise LmlabError(f"two arms are named {name!r}", "give each [[arms]] entry its own name")
        arm_budget = None
        if "budget" in entry:
            if objective == NONE:
                raise LmlabError(f"arm {name!r}: objective 'none' is not pretrained and takes no budget",
                                 "remove its budget")
            try:
                arm_budget = _parse_budget(entry["budget"])
            except LmlabError as e:
                raise LmlabError(f"arm {name!r}: {e}") from None
        arms.append(
            Arm(
                name,
                preset,
                objective,
                params,
                _table(entry.get("model"), f"arms[{i}].model"),
                _table(entry.get("train"), f"arms[{i}].train"),
                arch,
                arm_budget,
            )
        )
    return arms


def _parse_tasks(value, shared: dict[str, Any]) -> list[TaskSpec]:
    from lmlab.fileio import check_input_file
    from lmlab.finetune import FinetuneConfig
    from lmlab.tasks import TASKS
    from lmlab.train.data import expand

    if value is None:
        return []
    if not isinstance(value, list):
        raise LmlabError(
            "tasks must be a list of [[tasks]] tables",
            'write [[tasks]] with task = "sst2", train = ..., dev = ...',
        )
    tasks: list[TaskSpec] = []
    for i, entry in enumerate(value):
        entry = _table(entry, f"tasks[{i}]")
        _check_keys(entry, TASK_KEYS, f"tasks[{i}]")
        task = entry.get("task")
        if task not in TASKS:
            raise LmlabError(f"tasks[{i}]: unknown task {task!r}", f"choose one of: {', '.join(TASKS)}")
        name = check_name(str(entry.get("name") or task), "task name")
        paths = {}
        for part in ("train", "dev"):
            if not isinstance(entry.get(part), str):
                raise LmlabError(f"task {name!r} has no {part} file", f'set {part} = "path/to/{part}.tsv"')
            paths[part] = str(check_input_file(expand(entry[part])).resolve())
        # the epoch and the --lr auto rate are chosen on a slice of train; dev only scores (docs/lab.md)
        settings = {
            "select_on": "train-slice",
            **shared,
            **_table(entry.get("finetune"), f"tasks[{i}].finetune"),
        }
        for cap in ("max_train_examples", "max_eval_examples"):
            if entry.get(cap):
                settings[cap] = entry[cap]
        settings["progress"] = False
        try:
            FinetuneConfig.from_dict({**settings, "seed": 0}, where="finetune.")
        except (LmlabError, TypeError) as e:
            raise LmlabError(f"task {name!r}: {e}") from None
        if any(t.name == name for t in tasks):
            raise LmlabError(f"two tasks are named {name!r}", "give each [[tasks]] entry its own name")
        tasks.append(TaskSpec(name, task, paths["train"], paths["dev"], settings))
    return tasks


def _check_task(task: TaskSpec, arm: Arm) -> None:
    """The task must be posable for the arm's architecture (e.g. no conll with a decoder)."""
    from lmlab.finetune import FinetuneConfig
    from lmlab.tasks import make_task

    if arm.architecture not in ("encoder", "decoder", "seq2seq"):
        raise LmlabError(
            f"arm {arm.name!r}: a {arm.architecture} model cannot be fine-tuned on {task.name}",
            "use encoder, decoder or encoder-decoder presets, or drop [[tasks]]",
        )
    try:
        options = FinetuneConfig.from_dict(task.settings, where="finetune.").task_options()
        make_task(task.task, arm.architecture, **options)
    except LmlabError as e:
        raise LmlabError(f"arm {arm.name!r}, task {task.name!r}: {e}") from None


def _probe_objective(arm: Arm) -> str:
    """An objective that trains the arm's architecture: only used to check a 'none' arm's config."""
    options = valid_objectives(arm.architecture)[1:]
    if not options:
        raise LmlabError(f"arm {arm.name!r}: no objective trains a {arm.architecture}", "pick another preset")
    return options[0]


def _vocab_hint(data) -> int:
    """The vocabulary the run's tokenizer will have, read without training or tokenising anything."""
    from lmlab.data.shards import INDEX_FILE
    from lmlab.train.data import expand, resolve

    first = resolve(data.train[:1], "data.train")[0]
    if first.is_dir() and (first / INDEX_FILE).is_file():
        from lmlab.fileio import read_json

        return int(read_json(first / INDEX_FILE, "shards index")["vocab_size"])
    tok = data.tokenizer
    if isinstance(tok, dict):
        size = tok.get("vocab_size")
        if not isinstance(size, int) or size < 1:
            raise LmlabError(
                "pretrain.data.tokenizer needs vocab_size",
                'write tokenizer = {algo = "bytelevel", vocab_size = 4096}',
            )
        return size
    if not tok:
        raise LmlabError(
            "data.train is text but no data.tokenizer is given",
            "set pretrain.data.tokenizer to a tokenizer directory or a table {algo, vocab_size}",
        )
    from lmlab.tokenizers import load_tokenizer

    path = Path(expand(tok))
    if not path.exists():
        raise LmlabError(
            f"pretrain.data.tokenizer {path} does not exist", "train one with `lmlab tokenizer train`"
        )
    return load_tokenizer(path).vocab_size


def _model_config(cfg, arm: Arm):
    """The model config the trainer will build (vocabulary from the tokenizer, + T5 sentinels)."""
    from lmlab.models import get_preset

    overrides = dict(cfg.model.overrides)
    if "vocab_size" not in overrides:
        vocab = _vocab_hint(cfg.data)
        if arm.pretrained:
            from lmlab.objectives import get_objective

            vocab += get_objective(arm.objective).added_tokens(arm.params)
        overrides["vocab_size"] = vocab
    return get_preset(arm.preset, **overrides)


def _count_parameters(model_config, arm: Arm) -> int:
    from lmlab.models.flops import count_parameters
    from lmlab.objectives import get_objective

    heads = get_objective(arm.objective).heads if arm.pretrained else None
    try:
        return count_parameters(
            model_config, heads=tuple(h for h in heads if h != "nsp") if heads else None
        ).total
    except LmlabError:
        from lmlab.models import build_model

        return build_model(model_config, heads=heads or None).num_parameters()


def _try_flops(model_config, arm: Arm, seq_len: int, rows: int) -> float:
    """FLOPs per step for the report; 0 where lmlab.models.flops cannot count the model."""
    try:
        return flops_per_step(model_config, arm.objective, arm.params, seq_len, rows)
    except LmlabError:
        return 0.0


def _run_train_defaults(resolved: dict[str, Any], given: dict[str, Any], steps: int) -> dict[str, Any]:
    """``train`` of one run: ``max_steps`` from the budget; schedule, evaluation and checkpoints scaled
    to it unless the grid sets them (a 40-step run must not warm up for the recipe default's 100)."""
    out = dict(resolved, max_steps=steps)
    defaults = {
        "warmup_steps": max(1, steps // 10),
        "eval_every": max(1, steps // 10),
        "checkpoint_every": max(1, steps // 4),
        "keep_checkpoints": 1,
        "progress": "off",
    }
    for key, value in defaults.items():
        if key not in given:
            out[key] = value
    return out

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

Each run is planned by building it as the trainer will: the same checked config
(:func:`lmlab.config.load_config`), the same builder (:func:`lmlab.train.builder.build_run`) on the
meta device, so its vocabulary, parameters and FLOPs per step are the trainer's own numbers.

Everything a run's result depends on goes into its key (a hash of the resolved settings), which
names its directory: a finished run is found again and never retrained; change a setting and
only the runs it touches are new.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.config.overrides import NOWHERE, Origin
from lmlab.config.toml import read_toml
from lmlab.errors import LmlabError
from lmlab.fileio import check_name
from lmlab.lab.grid_records import (
    GRID_KIND,
    NONE,
    Arm,
    Budget,
    Contrast,
    FinetuneRun,
    Grid,
    PretrainRun,
    TaskSpec,
)
from lmlab.lab.grid_tables import (
    GRID_KEYS,
    PRETRAIN_KEYS,
    apply_override,
    as_table,
    check_keys,
    check_task,
    check_task_data,
    grid_name,
    grid_seeds,
    parse_arms,
    parse_budget,
    parse_contrasts,
    parse_tasks,
    probe_objective,
    valid_objectives,
)

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
    "check_machine",
    "flops_per_step",
    "load_grid",
    "run_key",
    "steps_for_budget",
    "valid_objectives",
]

#: a budget that buys fewer optimizer steps than this is refused
MIN_STEPS = 10
#: train.* keys that change neither the arithmetic nor the result of a run (left out of its key)
MACHINE_TRAIN_KEYS = ("threads", "progress", "device", "distributed", "checkpoint_every", "keep_checkpoints",
                      "log_every", "loggers")
#: fine-tuning settings that change nothing but speed or display (left out of the key)
MACHINE_FINETUNE_KEYS = ("threads", "progress", "device", "log_every", "eval_batch_size", "loggers")


def run_key(obj: Any) -> str:
    """12 hex digits of the SHA-256 of ``obj`` as canonical JSON (sorted keys)."""
    text = json.dumps(obj, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


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


def _check_steps(steps: int, budget: Budget, arm: Arm, rows: int, seq_len: int, step_flops: float) -> None:
    """Refuse a budget that buys fewer than :data:`MIN_STEPS` optimizer steps, or more than
    :data:`lmlab.budget.MAX_STEPS` (a run that would never end, ``budget.flops = 1e300``)."""
    from lmlab.budget import MAX_STEPS

    where = f"arms.{arm.name}.budget" if arm.budget else "budget"
    per_step = rows * seq_len if budget.kind == "tokens" else step_flops
    if steps > MAX_STEPS:
        raise LmlabError(f"budget {budget} buys {steps:.3g} optimizer steps for arm {arm.name!r}, more than "
                         f"the {MAX_STEPS:,} a run may take", f"lower {where}.{budget.kind} to at most "
                         f"{MAX_STEPS * per_step:.3g}")
    if steps < MIN_STEPS:
        raise LmlabError(f"budget {budget} buys only {steps} step(s) of {rows} x {seq_len} tokens for arm "
                         f"{arm.name!r} ({step_flops:.3g} FLOPs per step); at least {MIN_STEPS} are needed",
                         f"raise {where}.{budget.kind} to at least {MIN_STEPS * per_step:.3g}")


# --------------------------------------------------------------------------- loading


def load_grid(source: str | os.PathLike | dict[str, Any], overrides: list[str] | None = None,
              out: str | os.PathLike | Callable[[str], str | os.PathLike] | None = None) -> Grid:
    """Read and check a grid (a TOML path or a TOML-shaped dict) and plan its runs.

    ``overrides``: ``["budget.tokens=20480", "pretrain.train.lr=1e-3"]`` (dotted keys into the
    grid's tables; values are TOML literals), applied before the checks. ``out``: the folder the grid
    will run in (``lmlab compare --out``), when known, or a function of the grid's name (a default
    folder named after it): a comparison already there is the grid's own, so a
    ``pretrain.data.cache_dir`` inside its ``cache`` (the default cache, named) is not another
    command's output (:func:`lmlab.ownership.check_not_inside_output`).

    Nothing is trained or tokenised here: every error a grid can have (unknown keys, objectives,
    presets, tasks or settings, an objective that cannot train the preset, a task the architecture
    cannot do, missing files, a budget too small) is raised now as a one-line :class:`LmlabError`.
    """
    from lmlab.arguments import path_argument, text_list_argument

    if overrides is not None:
        overrides = text_list_argument(overrides, "load_grid's overrides")
    if isinstance(source, dict):
        raw, where = copy.deepcopy(source), "grid"
    else:
        source = path_argument(source, "load_grid's source (a grid path or dict)")
        raw, where = read_toml(source, "grid file", "configs/grids/objectives-tiny.toml"), str(Path(source))
    if not isinstance(raw, dict):
        raise LmlabError(f"{where} must be a TOML table of grid keys, got {raw!r}", "see configs/grids/")
    set_keys: list[str] = []
    try:
        with contextlib.ExitStack() as held:  # the grid's folder is its own once its name is known
            def own(name: str) -> None:
                held.enter_context(_own_comparison(out(name) if callable(out) else out))

            return _plan(raw, where, overrides, set_keys, own)
    except LmlabError as e:  # every value of the grid is named with the file it came from,
        # but a value that --set gave is named as that --set (lmlab.config.overrides.Origin.of)
        if where == "grid" or any(f"--set {k}" in e.problem for k in set_keys):
            raise
        raise LmlabError(f"{where}: {e.problem}", e.fix) from None


def _own_comparison(out: str | os.PathLike | None):
    """While the grid is planned, the comparison folder ``out`` that ``lmlab compare`` will fill
    again (one it made before) is this command's (:func:`lmlab.ownership.filling`); a new folder, or
    one that is not a comparison (which :func:`lmlab.lab.run_grid` refuses), is not."""
    from contextlib import nullcontext

    from lmlab.arguments import path_argument
    from lmlab.ownership import filling, read_manifest

    if out is None:
        return nullcontext()
    folder = Path(path_argument(out, "load_grid's out")).resolve()
    manifest = read_manifest(folder) if folder.is_dir() else None
    if manifest and manifest.get("state") == "claimed" and manifest.get("kind") == GRID_KIND:
        return filling(folder)
    return nullcontext()


@dataclass
class _Pretraining:
    """What every pretraining run of a grid shares: ``[pretrain]``'s tables, the budget, the
    vocabulary its tokenizer will have (read without training anything)."""

    data: dict[str, Any]
    train: dict[str, Any]
    model: dict[str, Any]
    budget: Budget
    tokenizer: Any = None  # the tokenizer when it exists already (a directory, the shards' copy)
    plan: Any = None  # the checked [data] (lmlab.train.data.check_data)
    data_vocab: int = 0  # the token shards' vocabulary (0: text, tokenised by the run)
    tokenizer_vocab: int = 0  # the vocabulary a tokenizer table asks for (used when tokenizer is None)
    origin: Origin = NOWHERE  # the keys --set gave (named as that --set, read as command-line text)

    def read_vocabulary(self) -> None:
        """Look at the data and tokenizer (once the grid's tables are checked): nothing is trained."""
        from lmlab.config.data import build_data_section

        data = build_data_section(dict(self.data), self.origin, "pretrain.data")  # the recipe's own check
        # a --set value is command-line text ("0.1"): the table holds it typed, as the run will
        self.data = {k: getattr(data, k) if isinstance(v, str) and self.origin.from_command_line(
            f"pretrain.data.{k}") else v for k, v in self.data.items()}
        self.plan = _data_plan(data)
        self.tokenizer, self.data_vocab, self.tokenizer_vocab = _vocabulary(data, self.plan)

    @property
    def data_key(self) -> dict[str, Any]:
        return {k: v for k, v in self.data.items() if k not in ("cache_dir", "workers")}


def _plan(raw: dict[str, Any], where: str, overrides: list[str] | None, set_keys: list[str],
          own: Callable[[str], None]) -> Grid:
    """The checked grid of ``raw`` (read from ``where``) with its runs planned; the keys that
    ``overrides`` set are added to ``set_keys``; ``own(name)`` once the grid's name is known."""
    for item in overrides or []:
        set_keys.append(apply_override(raw, item))
    origin = Origin(set_keys=frozenset(set_keys))  # a --set value is command-line text, named as such
    check_keys(raw, GRID_KEYS, "the grid")
    name, seeds = grid_name(raw, where), grid_seeds(raw, origin)
    own(name)
    if "budget" not in raw:
        raise LmlabError("the grid has no budget",
                         "add budget = {tokens = 1000000} or budget = {flops = 1e13}")
    budget = parse_budget(raw["budget"], origin)
    share = raw.get("share_pretraining", False)
    if not isinstance(share, bool):
        raise LmlabError(f"share_pretraining must be true or false, got {share!r}",
                         "write share_pretraining = true")
    shared = _pretraining(as_table(raw.get("pretrain"), "pretrain"), budget, origin)
    sizes = _sizes(raw.get("sizes") or {"base": {}})
    arms = parse_arms(raw.get("arms"))
    for i, arm in enumerate(arms):
        _refuse_grid_owned(arm.train, f"arms[{i}].train", ("max_steps", "seed"))
        if not arm.pretrained and arm.train:
            raise LmlabError(f"arms[{i}].train: arm {arm.name!r} (objective 'none') is not pretrained, so "
                             f"its train settings {sorted(arm.train)} would be ignored",
                             "remove its train table")
    finetune = _finetune_section(raw.get("finetune"), origin)
    tasks = parse_tasks(raw.get("tasks"), finetune, origin)
    for i, task in enumerate(raw.get("tasks") or []):
        if isinstance(task, dict) and isinstance(task.get("finetune"), dict):
            _refuse_grid_owned(task["finetune"], f"tasks[{i}].finetune", FINETUNE_GRID_KEYS)
    shared.read_vocabulary()
    pretrain_runs: list[PretrainRun] = []
    finetune_runs: list[FinetuneRun] = []
    for arm in arms:
        for task in tasks:
            check_task(task, arm)
    for task in tasks:  # the files themselves, read once each, before any arm pretrains
        check_task_data(task, arms[0])
    for index, arm in enumerate(arms):
        for size, size_model in sizes.items():
            planned = [_plan_pretrain(index, arm, size, size_model, seed, shared) for seed in
                       (seeds[:1] if share else seeds)]
            pretrain_runs += planned
            for i, seed in enumerate(seeds):
                finetune_runs += [_plan_finetune(planned[0 if share else i], task, seed) for task in tasks]
    labels = [r.dirname for r in pretrain_runs]
    if len(set(labels)) != len(labels):
        raise LmlabError("two arms resolve to the same run",
                         "give each [[arms]] entry its own name and settings")
    return Grid(name, list(seeds), budget, share, arms, sizes, tasks, pretrain_runs, finetune_runs,
                str(shared.data.get("cache_dir", "")), where, parse_contrasts(raw.get("contrasts"), arms))


def check_machine(grid: Grid) -> None:
    """The devices the grid's runs ask for (``pretrain.train.device``, ``arms[i].train.device``,
    ``finetune.device``, ``tasks[i].finetune.device``) must be on this machine: one line naming the
    key, before any run starts (``lmlab compare --dry-run`` too). A machine check, so not part of
    :func:`load_grid`: a grid trained on a GPU is still read on a CPU to report it."""
    from lmlab.runtime import check_device

    for run in grid.pretrain_runs:
        if run.arm.pretrained:
            arm = next(i for i, a in enumerate(grid.arms) if a is run.arm)
            name = f"arms[{arm}].train.device" if "device" in run.arm.train else "pretrain.train.device"
            check_device(run.config["train"].get("device", "auto"), name)
    for task in grid.tasks:
        check_device(task.settings.get("device", "auto"), task.names.of("device") if task.names else "device")


def _sizes(value) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise LmlabError("sizes must be a table of name = {model overrides}",
                         "write e.g. sizes = { d64 = { d_model = 64 } }")
    return {check_name(str(k), "size name"): as_table(v, f"sizes.{k}") for k, v in value.items()}


def _pretraining(pre: dict[str, Any], budget: Budget, origin: Origin = NOWHERE) -> _Pretraining:
    check_keys(pre, PRETRAIN_KEYS, "[pretrain]")
    data = as_table(pre.get("data"), "pretrain.data")
    if not data.get("train"):
        raise LmlabError("[pretrain.data] has no train",
                         "set pretrain.data.train to the corpus (text files or shards)")
    train = as_table(pre.get("train"), "pretrain.train")
    _refuse_grid_owned(train, "pretrain.train", ("max_steps", "seed"))
    return _Pretraining(data, train, as_table(pre.get("model"), "pretrain.model"), budget, origin=origin)


#: keys of a run's settings that the grid itself sets (a value written in a table would be ignored)
_GRID_OWNED = {"max_steps": ("the budget", "remove it and set budget instead"),
               "seed": ("the grid's seeds", "remove it: every run takes its seed from seeds = [...]"),
               "progress": ("lmlab compare (its --progress flag)", "remove it")}
#: the [finetune] keys the grid sets for every fine-tuning run
FINETUNE_GRID_KEYS = ("seed", "progress")


def _refuse_grid_owned(table: dict[str, Any], where: str, keys) -> None:
    """A key of ``table`` (``where``: ``pretrain.train``...) that the grid sets itself is refused:
    its value would be ignored."""
    for key in keys:
        if key in table:
            owner, fix = _GRID_OWNED[key]
            raise LmlabError(f"{where}.{key} is set by {owner}, so this value would be ignored", fix)


def _finetune_section(value, origin: Origin = NOWHERE) -> dict[str, Any]:
    """``[finetune]``, checked as the typed fine-tuning section (:class:`lmlab.config.FinetuneConfig`)
    whether or not the grid has ``[[tasks]]``: a grid's every table is checked, used or not. A value
    that ``--set`` gave is command-line text (``"true"``, ``5``), read as ``lmlab finetune --set``
    reads it; the table returned holds it typed."""
    from lmlab.finetune import FinetuneConfig

    table = as_table(value, "finetune")
    _refuse_grid_owned(table, "finetune", FINETUNE_GRID_KEYS)
    # each value's type here; the rules between settings per task (a task's table may give the partner)
    cfg = FinetuneConfig.from_dict(table, where="finetune.", given=(), origin=origin)
    return {k: _typed(getattr(cfg, k)) if isinstance(v, str) and origin.from_command_line(f"finetune.{k}")
            else v for k, v in table.items()}


def _typed(value):
    """A ``--set`` text's typed value as a TOML table holds it (a list, not a tuple)."""
    return list(value) if isinstance(value, tuple) else value


def _data_plan(data):
    """``[data]`` checked as the trainer checks it (:func:`lmlab.train.data.check_data`)."""
    from lmlab.train.data import check_data

    return check_data(data, "pretrain.")


def _vocabulary(data, plan) -> tuple[Any, int, int]:
    """``(tokenizer or None, shards' vocabulary, a tokenizer table's vocab_size)`` of ``[data]``,
    read without training or tokenising anything: what the trainer's tokenizer and shards will be."""
    from lmlab.data.shards import INDEX_FILE, TOKENIZER_DIR
    from lmlab.tokenizers import load_tokenizer
    from lmlab.train.data import expand

    if plan.train_is_shards:
        from lmlab.fileio import read_json

        first = plan.train[0]
        vocab = int(read_json(first / INDEX_FILE, "shards index")["vocab_size"])
        own = first / TOKENIZER_DIR
        return (load_tokenizer(own) if own.is_dir() else None), vocab, vocab
    tok = data.tokenizer
    if isinstance(tok, dict):  # checked as a recipe's table is (lmlab.config.data.check_tokenizer_table)
        size = tok.get("vocab_size")
        if size is None:  # bpe's num_merges: the vocabulary is known only once trained
            raise LmlabError("pretrain.data.tokenizer has no vocab_size, which the grid needs to size its "
                             "models before the tokenizer is trained",
                             'write e.g. tokenizer = {algo = "bpe", vocab_size = 4096}')
        return None, 0, size
    return load_tokenizer(Path(expand(tok))), 0, 0


def _plan_pretrain(index: int, arm: Arm, size: str, size_model: dict[str, Any], seed: int,
                   shared: _Pretraining) -> PretrainRun:
    """One pretraining run (or an untrained model's) of ``arms[index]``, its numbers from the model
    the trainer builds."""
    from lmlab.config.run import build_run_config
    from lmlab.train.builder import build_run
    from lmlab.train.data import check_train_share

    train = {**shared.train, **arm.train, "seed": seed}
    objective = arm.objective if arm.pretrained else probe_objective(arm)  # 'none': checks the rest
    cfg_dict = {"model": {"preset": arm.preset, **shared.model, **size_model, **arm.model},
                "objective": {"name": objective, **arm.params},
                "data": dict(shared.data), "train": {**train, "max_steps": PLANNING_STEPS}}
    try:
        cfg = build_run_config(cfg_dict, _run_origin(index, arm, size, size_model, shared))
        tok = copy.deepcopy(shared.tokenizer)  # the objective may add tokens to it (T5's sentinels)
        built = build_run(cfg, tok, "meta", data_vocab_size=shared.data_vocab,
                          tokenizer_vocab=shared.tokenizer_vocab, with_objective=arm.pretrained)
        if arm.pretrained and not shared.plan.train_is_shards:  # the trainer's check_data(seq_len=...)
            check_train_share(cfg.data, shared.plan.train, cfg.train.seq_len, "pretrain.")
    except LmlabError as e:
        raise _in_grid(e, arm, size) from None
    resolved = cfg.to_dict()
    steps, tokens, step_flops = 0, 0, 0.0
    if arm.pretrained:
        t, budget = cfg.train, arm.budget or shared.budget
        rows = t.batch_size * t.grad_accum
        step_flops = _step_flops(built, arm, t.seq_len, rows, required=budget.kind == "flops")
        steps = steps_for_budget(budget, rows * t.seq_len, step_flops)
        _check_steps(steps, budget, arm, rows, t.seq_len, step_flops)
        resolved["train"] = _run_train_defaults(resolved["train"], train, steps)
        from lmlab.config.run import check_schedule, schedule_note

        try:  # the recipe's check, on the steps the budget bought; here, where the budget sets the
            # steps, a warmup longer than them is a slip, not a short run of a longer schedule
            keys = ("max_steps", "warmup_steps", "decay_steps")
            planned = dataclasses.replace(cfg.train, **{k: resolved["train"][k] for k in keys})
            prefix = f"arms.{arm.name}.train." if "warmup_steps" in arm.train else "pretrain.train."
            check_schedule(planned, prefix)
            if not planned.decay_steps and schedule_note(planned, prefix) is not None:
                raise LmlabError(f"{prefix}warmup_steps {planned.warmup_steps} is longer than the "
                                 f"{planned.max_steps} steps the budget buys: the learning rate would "
                                 "never reach its peak",
                                 f"set {prefix}warmup_steps <= {planned.max_steps}, or leave it out "
                                 "(a tenth of the steps)")
        except LmlabError as e:
            raise _in_grid(e, arm, size) from None
        tokens = steps * rows * t.seq_len
    else:
        resolved["objective"], resolved["train"] = {"name": NONE}, {"seed": seed}
    keyed = {**copy.deepcopy(resolved), "data": shared.data_key,
             "lab": {"kind": "pretrain" if arm.pretrained else "init"}}
    if arm.pretrained:
        keyed["train"] = {k: v for k, v in keyed["train"].items() if k not in MACHINE_TRAIN_KEYS}
    return PretrainRun(arm, size, seed, resolved, steps, tokens, step_flops, built.parameters, run_key(keyed),
                       built.vocab_size, built.model_config)


#: the max_steps a run is checked with before its budget is turned into steps (then checked again)
PLANNING_STEPS = 2**40


def _run_origin(index: int, arm: Arm, size: str, size_model: dict[str, Any], shared: _Pretraining) -> Origin:
    """Where each setting of a planned run was written in the grid (a recipe's ``train.lr`` is
    ``pretrain.train.lr`` or ``arms[0].train.lr``...), with the keys ``--set`` gave: so an error
    names the key the user wrote, and a ``--set`` text is read as ``lmlab pretrain --set`` reads it."""
    arm_key = f"arms[{index}]"
    written = {"data": "pretrain.data", "model.preset": f"{arm_key}.preset",
               "objective.name": f"{arm_key}.objective", "train.seed": "seeds"}
    for section, tables in (("model", ((shared.model, "pretrain.model"), (size_model, f"sizes.{size}"),
                                       (arm.model, f"{arm_key}.model"))),
                            ("objective", ((arm.params, f"{arm_key}.params"),)),
                            ("train", ((shared.train, "pretrain.train"), (arm.train, f"{arm_key}.train")))):
        for table, prefix in tables:  # a later table wins, as in the run's settings
            written.update({f"{section}.{k}": f"{prefix}.{k}" for k in table})
    return dataclasses.replace(shared.origin, written=tuple(written.items()))


def _in_grid(e: LmlabError, arm: Arm, size: str) -> LmlabError:
    """A recipe's error about one planned run, named with its arm and size."""
    return LmlabError(f"arm {arm.name!r}, size {size!r}: {e.problem}", e.fix)


def _step_flops(built, arm: Arm, seq_len: int, rows: int, required: bool) -> float:
    """FLOPs per step as the objective counts them; 0 where it cannot count the model and the
    budget is in tokens (the report leaves the column empty), an error where the budget is in FLOPs."""
    try:
        return built.step_flops(seq_len, rows, arm.params)
    except LmlabError:
        if required:
            raise
        return 0.0


def _plan_finetune(run: PretrainRun, task: TaskSpec, seed: int) -> FinetuneRun:
    """One fine-tuning run of ``run``'s model; a ``max_length`` beyond that model's positions is
    refused now, by the fine-tuning's own check (:func:`lmlab.models.config.max_length_for`)."""
    max_length = task.settings.get("max_length")
    if max_length is not None and run.model_config is not None:
        from lmlab.models.config import max_length_for

        try:
            max_length_for(run.model_config, max_length, max_length, flag=task.names.of("max_length"))
        except LmlabError as e:
            raise LmlabError(f"arm {run.arm.name!r}, size {run.size!r}: {e.problem}", e.fix) from None
    settings = {**task.settings, "seed": seed}
    keyed = {"pretrain": run.key, "task": task.task, "train": task.train, "dev": task.dev,
             "settings": {k: v for k, v in settings.items() if k not in MACHINE_FINETUNE_KEYS}}
    return FinetuneRun(run, task, seed, settings, run_key(keyed))


def _run_train_defaults(resolved: dict[str, Any], given: dict[str, Any], steps: int) -> dict[str, Any]:
    """``train`` of one run: ``max_steps`` from the budget; schedule, evaluation and checkpoints scaled
    to it unless the grid sets them (a 40-step run must not warm up for the recipe default's 100)."""
    out = dict(resolved, max_steps=steps)
    defaults = {"warmup_steps": max(1, steps // 10), "eval_every": max(1, steps // 10),
                "checkpoint_every": max(1, steps // 4), "keep_checkpoints": 1, "progress": "off"}
    for key, value in defaults.items():
        if key not in given:
            out[key] = value
    return out

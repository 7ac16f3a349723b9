"""The tables of a grid file, each checked as it is read: the budget, the seeds, ``[[arms]]``,
``[[tasks]]`` (their ``finetune`` settings are the ``[finetune]`` section, :mod:`lmlab.config`),
``[[contrasts]]`` and ``--set`` overrides. Every problem is one line naming the table and the fix."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

from lmlab import values
from lmlab.config.overrides import NOWHERE, Origin, example, split_override
from lmlab.config.overrides import suggest as _suggest
from lmlab.config.rules import SettingNames
from lmlab.config.toml import parse_value
from lmlab.errors import LmlabError, a_or_an
from lmlab.fileio import check_name
from lmlab.lab.grid_records import NONE, Arm, Budget, Contrast, TaskSpec
from lmlab.values import Flops, Seeds

#: a budget in tokens or FLOPs: finite and positive; tokens are counted, so a whole number
BudgetAmount = Flops
TokenBudget = values.whole(1, 10**15, hint="a whole number of tokens greater than 0, e.g. 1000000")
GRID_KEYS = ("name", "description", "seeds", "budget", "share_pretraining", "pretrain", "sizes", "arms",
             "finetune", "tasks", "contrasts")
PRETRAIN_KEYS = ("data", "train", "model")
ARM_KEYS = ("name", "preset", "objective", "params", "model", "train", "budget")
CONTRAST_KEYS = ("name", "better", "than", "kind")
#: a contrast's claim: "better" (strictly higher downstream score) or "at-least" (not lower)
CONTRAST_KINDS = ("better", "at-least")
TASK_KEYS = ("name", "task", "train", "dev", "max_train_examples", "max_eval_examples", "finetune")


def check_keys(table: dict, allowed, where: str) -> None:
    for key in table:
        if key not in allowed:
            raise LmlabError(f"unknown key {key!r} in {where}", _suggest(key, allowed))


def as_table(value, where: str) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise LmlabError(f"{where} must be a table, got {value!r}", f"write [{where}] with key = value lines")
    return dict(value)


def valid_objectives(architecture: str) -> list[str]:
    """Objective names that train ``architecture`` (``none`` included)."""
    from lmlab.objectives import OBJECTIVES, get_objective

    names = [n for n in OBJECTIVES if architecture in (get_objective(n).architectures or (architecture,))]
    return [NONE, *names]


def architecture(preset: str) -> str:
    from lmlab.models import CONFIG_ARCHITECTURE, PRESETS

    if preset not in PRESETS:
        raise LmlabError(f"unknown model preset {preset!r}", _suggest(preset, PRESETS))
    return CONFIG_ARCHITECTURE.get(type(PRESETS[preset]()), "?")


def parse_budget(value, origin: Origin = NOWHERE) -> Budget:
    fix = "write budget = {tokens = 1000000} or budget = {flops = 1e13}"
    if not isinstance(value, dict) or len(value) != 1:
        raise LmlabError(f"budget must be a table with one key, tokens or flops; got {value!r}", fix)
    ((kind, amount),) = value.items()
    if kind not in ("tokens", "flops"):
        raise LmlabError(f"unknown budget kind {kind!r}", f"{_suggest(kind, ['tokens', 'flops'])}; {fix}")
    kind_type = TokenBudget if kind == "tokens" else BudgetAmount
    return Budget(kind, values.check(kind_type, amount, origin.of(f"budget.{kind}"), fix))


def grid_name(raw: dict[str, Any], where: str) -> str:
    """The grid's ``name`` (default: the file's stem), which names its output folder: a file name."""
    name = raw.get("name")
    if name is None:
        return check_name(Path(where).stem if where != "grid" else "grid", "grid name (the file's stem)")
    if not isinstance(name, str):
        raise LmlabError(f"the grid's name must be text, got {name!r}", 'write e.g. name = "objectives"')
    return check_name(name, "grid name")


def grid_seeds(raw: dict[str, Any], origin: Origin = NOWHERE) -> list[int]:
    seeds = raw.get("seeds", [0])
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        seeds = [seeds]
    # each once (the type says); named as written (a --set is named as that --set)
    return values.check(Seeds, seeds, origin.of("seeds"), "write e.g. seeds = [0, 1, 2]")


def entries(value, what: str, keys, example: str) -> list[tuple[int, dict[str, Any]]]:
    """``(index, table)`` of each ``[[what]]`` entry of ``value`` (None: none), its keys checked."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise LmlabError(f"{what} must be a list of [[{what}]] tables", f"write [[{what}]] with {example}")
    out = []
    for i, entry in enumerate(value):
        entry = as_table(entry, f"{what}[{i}]")
        check_keys(entry, keys, f"{what}[{i}]")
        out.append((i, entry))
    return out


def parse_contrasts(value, arms: list[Arm]) -> list[Contrast]:
    """``[[contrasts]]`` tables: ``better`` and ``than`` must name two different arms."""
    names = [a.name for a in arms]
    out: list[Contrast] = []
    for i, entry in entries(value, "contrasts", CONTRAST_KEYS, 'better = "arm-a" and than = "arm-b"'):
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


#: grid keys that are tables: ``--set`` one of their keys (or a whole inline table)
GRID_TABLES = ("budget", "pretrain", "sizes", "finetune")


def apply_override(raw: dict[str, Any], item: str) -> str:
    """A ``--set KEY=VALUE`` on the grid's tables; the text is read by the one ``--set`` reader
    (:func:`lmlab.config.overrides.split_override`). Returns the key it set (``finetune.lr``), for
    the grid's :class:`~lmlab.config.overrides.Origin`."""
    key, text = split_override(item, "budget.tokens=20480")
    value = parse_value(text)
    parts = key.split(".")
    if len(parts) == 1 and parts[0] in GRID_TABLES and not isinstance(value, dict):
        raise LmlabError(f"{parts[0]} is a section", f"set one of its keys, e.g. {example(parts[0])}")
    node = raw
    for part in parts[:-1]:
        if not isinstance(node.setdefault(part, {}), dict):
            raise LmlabError(
                f"override {item!r}: {part} is not a table", "only tables can be overridden (not [[arms]])"
            )
        node = node[part]
    if parts[:-1] == ["budget"] and parts[-1] in ("tokens", "flops"):
        node.clear()  # a budget has one kind
    node[parts[-1]] = value
    return key


def parse_arms(value) -> list[Arm]:
    if not isinstance(value, list) or not value:
        raise LmlabError(
            "the grid has no [[arms]]", 'add [[arms]] tables with preset = "bert-tiny" and objective = "mlm"'
        )
    from lmlab.objectives import OBJECTIVES

    arms: list[Arm] = []
    for i, entry in entries(value, "arms", ARM_KEYS, 'preset = "bert-tiny" and objective = "mlm"'):
        preset, objective = entry.get("preset"), entry.get("objective")
        if not isinstance(preset, str) or not isinstance(objective, str):
            raise LmlabError(
                f"arms[{i}] needs preset and objective (strings)",
                'write preset = "bert-tiny" and objective = "mlm" (or "none": no pretraining)',
            )
        arch = architecture(preset)
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
                f"{a_or_an(arch)}",
                f"valid objectives for {preset}: {', '.join(valid)}",
            )
        params = as_table(entry.get("params"), f"arms[{i}].params")
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
                arm_budget = parse_budget(entry["budget"])
            except LmlabError as e:
                raise LmlabError(f"arm {name!r}: {e}") from None
        arms.append(
            Arm(
                name,
                preset,
                objective,
                params,
                as_table(entry.get("model"), f"arms[{i}].model"),
                as_table(entry.get("train"), f"arms[{i}].train"),
                arch,
                arm_budget,
            )
        )
    return arms


def parse_tasks(value, shared: dict[str, Any], origin: Origin = NOWHERE) -> list[TaskSpec]:
    """``[[tasks]]``: each task's fine-tuning settings (``[finetune]``, then its own ``finetune``
    table) checked as the fine-tuning section checks them, rules included
    (:meth:`lmlab.config.FinetuneConfig.validate`, :meth:`~lmlab.config.FinetuneConfig.check_task`),
    every message naming the key the grid wrote (``--set finetune.KEY`` for a ``[finetune]`` key
    that ``origin``'s ``--set`` gave)."""
    from lmlab.tasks import TASKS
    from lmlab.train.data import expand_input_file

    tasks: list[TaskSpec] = []
    for i, entry in entries(value, "tasks", TASK_KEYS, 'task = "sst2", train = ..., dev = ...'):
        task = entry.get("task")
        if task is None:
            named = f" (name = {entry['name']!r} names the task's results, not which task it is)" \
                if "name" in entry else ""
            raise LmlabError(f"tasks[{i}] has no task key{named}",
                             f'add task = "sst2" (one of: {", ".join(TASKS)})')
        if task not in TASKS:
            raise LmlabError(f"tasks[{i}]: unknown task {task!r}", f"choose one of: {', '.join(TASKS)}")
        name = check_name(str(entry.get("name") or task), "task name")
        paths = {}
        for part in ("train", "dev"):
            if not isinstance(entry.get(part), str):
                raise LmlabError(f"task {name!r} has no {part} file", f'set {part} = "path/to/{part}.tsv"')
            paths[part] = str(expand_input_file(entry[part]).resolve())
        # the epoch and the --lr auto rate are chosen on a slice of train; dev only scores (docs/lab.md)
        own = as_table(entry.get("finetune"), f"tasks[{i}].finetune")
        settings = {"select_on": "train-slice", **shared, **own}
        caps = [cap for cap in ("max_train_examples", "max_eval_examples") if cap in entry]
        for cap in caps:  # a whole number of at least 1 (like --max-train-examples); leave it out for all
            settings[cap] = values.check(values.Count, entry[cap], f"tasks[{i}].{cap}",
                                         f"write a whole number of at least 1, or remove {cap} to use "
                                         "every example")
        settings["progress"] = False
        # a setting is named where the grid wrote it: [finetune], the task's own table, the task's cap
        from_set = {k: origin.of(f"finetune.{k}") for k in shared
                    if origin.from_command_line(f"finetune.{k}") or origin.set_above(f"finetune.{k}")}
        names = SettingNames("key", "finetune.", written={**from_set,
                                                          **{k: f"tasks[{i}].finetune.{k}" for k in own},
                                                          **{k: f"tasks[{i}].{k}" for k in caps}},
                             names={"task": f"tasks[{i}].task"})
        spec = TaskSpec(name, task, paths["train"], paths["dev"], settings, (*shared, *own, *caps), names)
        try:
            cfg = spec.config()
        except (LmlabError, TypeError) as e:
            raise LmlabError(f"task {name!r}: {e}") from None
        cfg.check_task(task, spec.given, names)  # doc_stride with sst2...: before any arm pretrains
        cfg.check_files([spec.train, spec.dev], names)  # a CSV delimiter for a .tsv file
        if any(t.name == name for t in tasks):
            raise LmlabError(f"two tasks are named {name!r}", "give each [[tasks]] entry its own name")
        tasks.append(spec)
    return tasks


def check_task(task: TaskSpec, arm: Arm) -> None:
    """The task must be posable for the arm's architecture (e.g. no conll with a decoder), and its
    settings given read by it (``ARCHITECTURE_RULES``: no ``prefix`` for a GPT arm)."""
    from lmlab.tasks import make_task

    if arm.architecture not in ("encoder", "decoder", "seq2seq"):
        raise LmlabError(
            f"arm {arm.name!r}: a {arm.architecture} model cannot be fine-tuned on {task.name}",
            "use encoder, decoder or encoder-decoder presets, or drop [[tasks]]",
        )
    try:
        cfg = task.config()
        cfg.check_architecture(arm.architecture, task.task, task.given, task.names)  # lm_weight, no decoder
        make_task(task.task, arm.architecture, **cfg.task_options())
    except LmlabError as e:
        raise LmlabError(f"arm {arm.name!r}, task {task.name!r}: {e}") from None


def check_task_data(task: TaskSpec, arm: Arm) -> None:
    """Read the task's train and dev files as its fine-tunings will (labels fitted on train, dev's
    labels among them, the bad-line policy, a ``select_metric`` among the task's metrics), once,
    while the grid is planned: a file or setting that would stop the first fine-tuning is refused
    before any arm pretrains."""
    from lmlab.tasks import make_task
    from lmlab.tasks.readers import BadLines, limit

    cfg = task.config()
    try:
        posed = make_task(task.task, arm.architecture, **cfg.task_options())
        bad = BadLines(cfg.on_bad_line, lambda msg: None, cfg.max_bad_fraction)
        posed.fit(limit(posed.read(task.train, bad), cfg.max_train_examples))
        dev = limit(posed.read(task.dev, bad), cfg.max_eval_examples)
        posed.check(dev, "dev")
        cfg.check_select_metric(posed.metric_names(dev), posed.name, task.names)  # as a fine-tuning would
    except LmlabError as e:
        raise LmlabError(f"task {task.name!r}: {e.problem}", e.fix) from None


def probe_objective(arm: Arm) -> str:
    """An objective that trains the arm's architecture: only used to check a 'none' arm's config."""
    options = valid_objectives(arm.architecture)[1:]
    if not options:
        raise LmlabError(f"arm {arm.name!r}: no objective trains a {arm.architecture}", "pick another preset")
    return options[0]

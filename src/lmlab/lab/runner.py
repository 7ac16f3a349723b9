"""Run a grid: pretrain what is missing, fine-tune what is missing, collect the results.

Layout of ``OUT`` (the ``--out`` directory)::

    OUT/plan.json                      the resolved grid: every run, its key, steps, tokens, FLOPs
    OUT/pretrain/<arm>-<size>-s<seed>-<key>/   an ``lmlab pretrain`` run directory
                                       (``objective = "none"``: ``model/``, the random initialisation)
    OUT/finetune/<task>-<arm>-<size>-s<seed>-<key>/   an ``lmlab finetune`` output directory
    OUT/logs/<run directory name>.log  everything the trainer / fine-tuner said
    OUT/cache/                         the shared tokenizer and token shards (unless
                                       ``pretrain.data.cache_dir`` or ``$LMLAB_CACHE_DIR`` is set)
    OUT/results.{md,csv,json}, OUT/runs.csv, OUT/loss_vs_compute.png, OUT/downstream.png

Caching: a run's directory name ends with its key (:func:`lmlab.lab.grid.run_key` of everything
its result depends on). A pretraining run is done when its ``summary.json`` reports all its
steps; a fine-tuning run when its ``eval.json`` exists (``lmlab finetune`` writes its output
directory atomically at the end). A pretraining run that was interrupted has checkpoints but no
final summary: it continues with the trainer's exact resume (``pretrain(..., resume=True)``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.arguments import path_argument
from lmlab.errors import LmlabError
from lmlab.fileio import append_line, write_json
from lmlab.finetune import finetune
from lmlab.lab.baselines import DIAGNOSTICS
from lmlab.lab.grid import FinetuneRun, Grid, PretrainRun, check_machine
from lmlab.lab.grid_records import GRID_KIND
from lmlab.lab.layout import checkpoint_of, finetune_dir, finetune_done, pretrain_dir, pretrain_done
from lmlab.lab.report import REPORT_FILES, aggregate, collect_records, flag_lines, write_report
from lmlab.ownership import check_overwrite, claim_dir, claimed_dir
from lmlab.stopping import Stopped
from lmlab.train import pretrain

__all__ = ["GridRun", "finetune_done", "pretrain_done", "run_grid"]


@dataclass
class GridRun:
    """What :func:`run_grid` did: runs trained now, runs found cached, and the result records."""

    trained: list[str]
    cached: list[str]
    records: list[dict[str, Any]]
    out: Path
    report: dict[str, Path]


# --------------------------------------------------------------------------- running


class _Display:
    """tqdm over all runs (pretraining + fine-tuning) and one line per run saying where it is."""

    def __init__(self, total: int, done: int, show: bool, log: Callable[[str], None]):
        from tqdm import tqdm

        self._log = log
        self.bar = tqdm(
            total=total,
            initial=done,
            desc="compare",
            unit="run",
            disable=not show,
            dynamic_ncols=True,
            file=sys.stderr,
        )

    def line(self, msg: str) -> None:
        if not self.bar.disable:
            self.bar.write(msg, file=sys.stderr)
        else:
            self._log(msg)

    def status(self, msg: str) -> None:
        if not self.bar.disable:
            self.bar.set_postfix_str(msg[:70], refresh=True)

    def advance(self) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def _run_log(path: Path, display: _Display, prefix: str) -> Callable[[str], None]:
    """A log callback for the trainer / fine-tuner: into the run's log file and the bar's postfix."""
    def log(msg: str) -> None:
        append_line(path, msg)
        display.status(f"{prefix}: {msg.strip().splitlines()[-1] if msg.strip() else ''}")

    return log


#: what ``lmlab compare`` writes in its folder (lmlab.ownership.claim_dir); nothing else there is touched
GRID_ENTRIES = ("plan.json", "pretrain", "finetune", "logs", "cache", *REPORT_FILES)


def check_out(out: Path, report_only: bool = False) -> Path:
    """Every check :func:`run_grid` makes on its folder ``out`` before its plan line and any work,
    in one place, so that ``--dry-run`` (which makes them too) passes exactly the plans the real run
    carries out: the claim of the folder will succeed (lmlab.ownership.claim_dir: not a file, not a
    user's folder, not another kind of output, not inside another output, writable, each file of an
    earlier comparison it writes again as lmlab left it), and no file the command writes there
    (the report, and for a run the plan) stands where something lmlab cannot prove it wrote is
    (lmlab.ownership.check_overwrite: a user's folder at ``OUT/results.md``, an edited file).
    ``report_only``: the report from runs already there, so ``out`` must hold some. Nothing is
    written. Returns ``out`` resolved."""
    if report_only and not out.is_dir():
        raise LmlabError(f"{out} holds no runs of this grid", "run the grid first (without --report-only)")
    resolved = claim_dir(out, GRID_KIND, GRID_ENTRIES, create=False)
    for name in REPORT_FILES if report_only else ("plan.json", *REPORT_FILES):
        check_overwrite(resolved / name)
    return resolved


def _cache_dir(grid: Grid, out: Path) -> str:
    if grid.cache_dir:
        return grid.cache_dir
    if os.environ.get("LMLAB_CACHE_DIR"):
        return os.environ["LMLAB_CACHE_DIR"]
    return str((out / "cache").resolve())


def _pretrain_config(run: PretrainRun, cache: str) -> dict[str, Any]:
    cfg = {section: dict(table) for section, table in run.config.items()}
    cfg["data"]["cache_dir"] = cache
    return cfg


def _run_pretrain(out: Path, run: PretrainRun, cache: str, log: Callable[[str], None]) -> dict[str, Any]:
    d = pretrain_dir(out, run)
    if not run.arm.pretrained:
        return _init_model(d, run, cache, log)
    resume = (d / "checkpoints").is_dir() or (d / "config.toml").is_file()
    return pretrain(_pretrain_config(run, cache), d, resume=resume, log=log)


def _init_model(d: Path, run: PretrainRun, cache: str, log: Callable[[str], None]) -> dict[str, Any]:
    """``objective = "none"``: the model the pretraining arms start from (same preset, overrides,
    tokenizer and seed), saved untrained, so fine-tuning it measures training from scratch."""

    from lmlab.config import ModelConfig, RunConfig, TrainConfig
    from lmlab.config.data import build_data_section
    from lmlab.train.builder import build_run
    from lmlab.train.data import prepare_run_data

    cfg = _pretrain_config(run, cache)  # the resolved tables: cfg["data"] has every DataConfig field
    data = prepare_run_data(build_data_section(dict(cfg["data"])), d, log)
    overrides = {k: v for k, v in cfg["model"].items() if k != "preset"}
    model_only = RunConfig(model=ModelConfig(run.arm.preset, overrides), train=TrainConfig(seed=run.seed))
    # the trainer's builder, without an objective: the bare model the pretraining arms start from
    model = build_run(model_only, data.tokenizer, data_vocab_size=data.train.vocab_size,
                      with_objective=False).model
    model.save(d / "model")
    summary = {
        "run_dir": str(d),
        "steps": 0,
        "tokens": 0,
        "val_loss": None,
        "parameters": model.num_parameters(),
        "checkpoint": str(d / "model"),
    }
    write_json(d / "summary.json", summary)
    log(f"initialised {run.arm.preset} ({summary['parameters']:,} parameters) without pretraining")
    return summary


def _run_finetune(out: Path, run: FinetuneRun, log: Callable[[str], None]):
    """The fine-tuning run's result: ``.metrics``, and ``.baseline`` / ``.at_baseline`` (the task's
    trivial answer's dev metrics, and whether the run is no better)."""
    return finetune(
        str(checkpoint_of(out, run.pretrain)),
        run.task.task,
        run.task.train,
        run.task.dev,
        finetune_dir(out, run),
        log=log,
        **({"_names": run.task.names} if run.task.names is not None else {}),  # a note names finetune.KEY
        **run.settings,
    )


def finetune_line(metrics: dict[str, float], baseline: dict[str, float] | None, at_baseline: bool) -> str:
    """``accuracy 0.5092 (baseline 0.5092); at the baseline: it learned nothing usable``: a fine-tuning
    run's scores, each beside its task's baseline, and what is wrong when something is (at the
    baseline; answers outside the label set)."""
    parts = []
    for name, value in metrics.items():
        base = (baseline or {}).get(name)
        parts.append(f"{name} {value:.4f}" + (f" (baseline {base:.4f})" if base is not None and name
                                              not in DIAGNOSTICS else ""))
    text = ", ".join(parts)
    if metrics.get("outside_labels"):
        text += f"; {metrics['outside_labels']:.0%} of the answers are outside the label set"
    if at_baseline:
        text += "; at the baseline: it learned nothing usable"
    return text


def run_grid(
    grid: Grid,
    out: str | os.PathLike,
    *,
    dry_run: bool = False,
    report_only: bool = False,
    progress: bool | None = None,
    log: Callable[[str], None] | None = None,
) -> GridRun:
    """Train what is missing in ``grid`` under ``out``, then write the report.

    ``dry_run``: only print the plan (and which runs are cached). ``report_only``: train nothing,
    write the report from the runs finished so far (a grid still running elsewhere, or one left
    unfinished on purpose; its tables count the seeds each row really has). ``progress``: the tqdm bar
    over runs (default: when stderr is a terminal). ``log`` receives the one-line-per-run messages
    (default: stderr).
    """
    if not isinstance(grid, Grid):
        raise LmlabError(f"run_grid's grid must be a Grid, got {type(grid).__name__} {grid!r}",
                         "pass load_grid(PATH)")
    out = path_argument(out, "run_grid's out")
    if not report_only:  # the runs are about to run (or be planned to): their devices must be here
        check_machine(grid)
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    runs: list[PretrainRun | FinetuneRun] = []
    for p in grid.pretrain_runs:
        runs.append(p)
        runs.extend(grid.finetunes_of(p))
    done = {id(r): (pretrain_done(out, r) if isinstance(r, PretrainRun) else finetune_done(out, r))
            for r in runs}
    n_done = sum(done.values())
    counts = count_text(len(grid.pretrain_runs), len(runs) - len(grid.pretrain_runs), len(grid.tasks))
    plan = (f"grid {grid.name}: {counts}, budget {grid.budget_text()}; {n_done} cached, "
            f"{len(runs) - n_done} to train -> {out}")
    cached = [r.label for r in runs if done[id(r)]]
    # the checks of the real run on its folder, before the plan line: a dry run passes only the plans
    # the real run carries out, and a refused run says nothing but its one line
    check_out(out, report_only)
    if dry_run:
        say(plan)
        for line in plan_lines(grid, out, done):
            say(line)
        return GridRun([], cached, [], out, {})
    if report_only:
        with claimed_dir(out, GRID_KIND, GRID_ENTRIES):  # the report overwrites only a comparison's own files
            say(plan)
            records = collect_records(grid, out)
            paths = write_report(records, grid, out)
        say(f"report from {n_done} finished run(s); wrote {', '.join(str(p) for p in paths.values())}")
        return GridRun([], cached, records, out, paths)
    # new, empty or an earlier comparison's: never a user's folder (given back if nothing is written)
    with claimed_dir(out, GRID_KIND, GRID_ENTRIES):
        say(plan)
        write_json(out / "plan.json", plan_json(grid))
        show = sys.stderr.isatty() if progress is None else progress
        display = _Display(len(runs), n_done, show, say)
        trained = _train_missing(runs, done, out, _cache_dir(grid, out), display, say)
        records = collect_records(grid, out)
        paths = write_report(records, grid, out)
    say(f"wrote {', '.join(str(p) for p in paths.values())}")
    for line in flag_lines(aggregate(records)):
        say(f"flag: {line}")
    return GridRun(trained, cached, records, out, paths)


def _train_missing(runs: list, done: dict[int, bool], out: Path, cache: str, display: _Display,
                   say: Callable[[str], None]) -> list[str]:
    """Train every run not done yet, in order; the labels of those trained."""
    trained: list[str] = []
    current = None
    try:
        for i, run in enumerate(runs, 1):
            tag = f"[{i}/{len(runs)}] {run.label}"
            if done[id(run)]:
                display.line(f"{tag}: cached")
                continue
            current = run
            try:
                _train_one(run, tag, out, cache, display)
            except LmlabError as e:
                raise LmlabError(f"run {run.label}: {e}") from None
            trained.append(run.label)
            current = None
            display.advance()
    except KeyboardInterrupt as e:
        display.close()
        where = f" ({current.label} continues from its last checkpoint)" if isinstance(current, PretrainRun) \
            else ""
        fix = f"run the same command again to resume; finished runs are kept{where}"
        if isinstance(e, Stopped):  # a signal: the command's one line says it (lmlab.stopping)
            raise e.with_fix(fix) from None
        say(f"interrupted: {fix}")
        raise
    finally:
        display.close()
    return trained


def _train_one(run: PretrainRun | FinetuneRun, tag: str, out: Path, cache: str, display: _Display) -> None:
    """Pretrain (or initialise) or fine-tune one run, saying what it does and what it reached."""
    t0 = time.perf_counter()
    logf = _run_log(out / "logs" / f"{run.dirname}.log", display,
                    run.arm.name if isinstance(run, PretrainRun) else run.task.name)
    if isinstance(run, FinetuneRun):
        display.line(f"{tag}: fine-tuning on {run.task.name}")
        result = _run_finetune(out, run, logf)
        shown = finetune_line(result.metrics, getattr(result, "baseline", None),
                              bool(getattr(result, "at_baseline", False)))
        display.line(f"{tag}: done in {time.perf_counter() - t0:.0f} s, {shown}")
        return
    if not run.arm.pretrained:
        display.line(f"{tag}: initialising the model (no pretraining)")
    else:
        partial = (pretrain_dir(out, run) / "checkpoints").is_dir()
        display.line(f"{tag}: {'resuming' if partial else 'pretraining'} {run.arm.objective}, "
                     f"{run.steps} steps, {run.tokens:,} tokens, {run.flops:.3g} FLOPs")
    summary = _run_pretrain(out, run, cache, logf)
    val = summary.get("val_loss")
    reached = f", val loss {val:.4f}" if val is not None else ""
    display.line(f"{tag}: done in {time.perf_counter() - t0:.0f} s{reached}")


# --------------------------------------------------------------------------- the plan


def _plural(n: int, word: str) -> str:
    return f"{n:,} {word}{'' if n == 1 else 's'}"


def count_text(pretraining: int, finetuning: int, tasks: int) -> str:
    """``8 pretraining runs + 16 fine-tuning runs (2 tasks) = 24 runs``: what adds up to what."""
    return (f"{_plural(pretraining, 'pretraining run')} + {_plural(finetuning, 'fine-tuning run')} "
            f"({_plural(tasks, 'task')}) = {_plural(pretraining + finetuning, 'run')}")


def plan_lines(grid: Grid, out: Path, done: dict[int, bool] | None = None) -> list[str]:
    """The dry-run table: one line per pretraining run, then the fine-tuning runs."""
    done = done or {}
    lines = [f"  {'pretraining run':32} {'params':>10} {'steps':>7} {'tokens':>12} {'FLOPs':>10}  status"]
    for r in grid.pretrain_runs:
        state = "cached" if done.get(id(r)) else "to train"
        steps = r.steps if r.arm.pretrained else "-"
        lines.append(
            f"  {r.label:32} {r.parameters:>10,} {steps:>7} {r.tokens:>12,} {r.flops:>10.3g}  {state}"
        )
    for f in grid.finetune_runs:
        state = "cached" if done.get(id(f)) else "to train"
        lines.append(f"  fine-tune {f.label}: {state}")
    return lines


def plan_json(grid: Grid) -> dict[str, Any]:
    return {
        "name": grid.name,
        "source": grid.source,
        "seeds": grid.seeds,
        "budget": {grid.budget.kind: grid.budget.amount},
        "share_pretraining": grid.share_pretraining,
        "pretrain": [
            {
                "label": r.label,
                "dir": f"pretrain/{r.dirname}",
                "arm": r.arm.name,
                "size": r.size,
                "seed": r.seed,
                "objective": r.arm.objective,
                "preset": r.arm.preset,
                "budget": {(r.arm.budget or grid.budget).kind: (r.arm.budget or grid.budget).amount},
                "steps": r.steps,
                "tokens": r.tokens,
                "flops_per_step": r.flops_per_step,
                "parameters": r.parameters,
                "vocab_size": r.vocab_size,
                "config": r.config,
            }
            for r in grid.pretrain_runs
        ],
        "finetune": [
            {
                "label": f.label,
                "dir": f"finetune/{f.dirname}",
                "pretrain": f"pretrain/{f.pretrain.dirname}",
                "task": f.task.name,
                "seed": f.seed,
                "settings": f.settings,
            }
            for f in grid.finetune_runs
        ],
    }

"""The report's input: the records of a grid's finished runs, read from their directories, and
how each task chose and scored its fine-tuning step (see :mod:`lmlab.lab.report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lmlab.fileio import read_json


def _curve(run_dir: Path, flops_per_step: float, initial: float | None) -> list[list[float]]:
    from lmlab.train.metrics import read_metrics

    points = [[0.0, initial]] if initial is not None else []
    for row in read_metrics(run_dir / "metrics.jsonl"):
        if row.get("val_loss") is not None:
            points.append([float(row["step"]) * flops_per_step, float(row["val_loss"])])
    return points


def collect_records(grid, out: str | Path) -> list[dict[str, Any]]:
    """Read every finished run of ``grid`` under ``out`` into records (see the module docstring)."""
    from lmlab.lab.layout import finetune_dir, finetune_done, pretrain_dir, pretrain_done

    out = Path(out)
    records: list[dict[str, Any]] = []
    by_run: dict[int, list] = {}
    for f in grid.finetune_runs:
        by_run.setdefault(id(f.pretrain), []).append(f)
    for p in grid.pretrain_runs:
        if not pretrain_done(out, p):
            continue
        d = pretrain_dir(out, p)
        summary = read_json(d / "summary.json", "run summary")
        base = {
            "arm": p.arm.name,
            "size": p.size,
            "objective": p.arm.objective,
            "preset": p.arm.preset,
            "parameters": summary.get("parameters") or p.parameters,
            "steps": summary.get("steps", 0),
            "tokens": summary.get("tokens", 0),
            "flops": p.flops_per_step * summary.get("steps", 0),
            "val_loss": summary.get("val_loss"),
            "curve": _curve(d, p.flops_per_step, summary.get("initial_val_loss")) if p.arm.pretrained else [],
        }
        fins = by_run.get(id(p), [])
        seeds = sorted({f.seed for f in fins}) or [p.seed]
        for seed in seeds:
            tasks, baselines, select, rates = {}, {}, {}, {}
            for f in (f for f in fins if f.seed == seed):
                if finetune_done(out, f):
                    tasks[f.task.name] = read_json(finetune_dir(out, f) / "eval.json", "fine-tuning result")
                    summary = _finetune_summary(finetune_dir(out, f))
                    if summary.get("baseline"):
                        baselines[f.task.name] = summary["baseline"]
                    if summary.get("select_metric"):
                        select[f.task.name] = summary["select_metric"]
                    if isinstance(summary.get("lr_sweep"), dict) and "chosen" in summary["lr_sweep"]:
                        rates[f.task.name] = summary["lr_sweep"]["chosen"]  # lr = "auto": the rate kept
            records.append({**base, "seed": seed, "tasks": tasks, "baselines": baselines, "select": select,
                            "rates": rates})
    return records


def _finetune_summary(run_dir: Path) -> dict[str, Any]:
    """A fine-tuning run's ``finetune.json`` (its task's baseline, the selected metric, the rate an
    ``lr = "auto"`` sweep kept), or {}."""
    from lmlab.errors import LmlabError
    from lmlab.finetune.loop import SUMMARY_FILE

    path = run_dir / SUMMARY_FILE
    try:
        summary = read_json(path, "fine-tuning summary") if path.is_file() else {}
    except LmlabError:
        return {}
    return summary if isinstance(summary, dict) else {}


def selection_of(grid) -> dict[str, dict[str, Any]]:
    """task name -> which data chose its fine-tuning step (and --lr auto rate), which scored it."""
    out = {}
    for task in getattr(grid, "tasks", None) or []:
        on = task.settings.get("select_on", "dev")
        share = task.settings.get("select_fraction", 0.1) if on == "train-slice" else None
        out[task.name] = {"chosen_on": on, "fraction": share, "scored_on": "dev"}
    return out


def selection_markdown(selection: dict[str, dict[str, Any]]) -> str:
    """One sentence per way of choosing: the data that chose, the data that scored."""
    lines = []
    sliced = [n for n, s in selection.items() if s["chosen_on"] == "train-slice"]
    if sliced:
        shares = " / ".join(sorted({f"{100 * selection[n]['fraction']:g}%" for n in sliced}))
        lines.append(
            f"Chosen on a slice of train, scored on dev ({', '.join(sliced)}): each run's step (and an "
            f'`lr = "auto"` rate) was chosen on {shares} of the task\'s training file, held out and never '
            "trained on; the numbers are the chosen model's score on the dev file, which chose nothing."
        )
    on_dev = [n for n, s in selection.items() if s["chosen_on"] == "dev"]
    if on_dev:
        lines.append(
            f"Chosen and scored on dev ({', '.join(on_dev)}): each run's step was chosen on the dev file "
            "that scores it, so each number is a maximum over the steps (optimistic); "
            '`select_on = "train-slice"` keeps dev out of the choice.'
        )
    return "\n\n".join(lines)

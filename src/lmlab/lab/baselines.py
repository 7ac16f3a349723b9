"""Each task's trivial baseline beside every arm, and the arms that failed (issue 27).

A fine-tuning run records its task's *baseline*, the score of the trivial answer with no model (the
majority class of the training labels, or a constant for regression; ``finetune.json``), and its
metrics (``eval.json``; a text-to-text model's share of answers outside the label set is the
metric ``outside_labels``). From those, for each (arm, size) row of the report:

* **at the baseline**: the task's selected metric is no better than the baseline (within
  :data:`MARGIN`) in a seed: the model learned nothing usable there;
* **at zero**: the selected metric is 0 in every seed while the baseline is above 0; the reason is
  given when it is known: the share of answers outside the label set (T5 writing no label word).

Everything here works on the report's records (:mod:`lmlab.lab.report`); nothing is trained.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from lmlab.tasks.baseline import MARGIN  # a score within this of the baseline is at it (one rule)

#: diagnostic metrics: shown as reasons, not as score columns
DIAGNOSTICS = ("outside_labels",)


def _finite(value) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def task_baselines(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """``{"sst2 accuracy": {"value": 0.509, "answer": "majority class '1'"}}``: the mean over the
    runs that recorded it (every arm of a task sees the same data, so the runs agree)."""
    values: dict[str, list[float]] = {}
    answers: dict[str, str] = {}
    for r in records:
        for task, base in (r.get("baselines") or {}).items():
            for metric, value in (base.get("dev") or {}).items():
                v = _finite(value)
                if v is None or metric in DIAGNOSTICS:
                    continue
                values.setdefault(f"{task} {metric}", []).append(v)
                answers.setdefault(f"{task} {metric}", str(base.get("answer") or "trivial answer"))
    return {name: {"value": statistics.fmean(vs), "answer": answers[name]} for name, vs in values.items()}


def selected_metric(records: list[dict[str, Any]], task: str) -> str | None:
    """The metric fine-tuning selected on for ``task`` (recorded), else the task's first metric."""
    for r in records:
        chosen = (r.get("select") or {}).get(task)
        if chosen:
            return chosen
    for r in records:
        metrics = [m for m in (r.get("tasks") or {}).get(task, {}) if m not in DIAGNOSTICS]
        if metrics:
            return metrics[0]
    return None


def arm_flags(runs: list[dict[str, Any]], baselines: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The flags of one (arm, size) row from its runs (one per seed): ``{"task", "metric", "kind"
    ("baseline" or "zero"), "text"}``, one per flagged task, in task order."""
    tasks = list(dict.fromkeys(t for r in runs for t in (r.get("tasks") or {})))
    flags = []
    for task in tasks:
        metric = selected_metric(runs, task)
        if metric is None:
            continue
        name = f"{task} {metric}"
        scores = [_finite((r.get("tasks") or {}).get(task, {}).get(metric)) for r in runs]
        scores = [s for s in scores if s is not None]
        if not scores:
            continue
        base = baselines.get(name)
        flag = _zero_flag(runs, task, name, scores, base) or _baseline_flag(name, scores, base)
        if flag:
            flags.append({"task": task, "metric": metric, **flag})
    return flags


def _zero_flag(runs, task: str, name: str, scores: list[float], base) -> dict[str, str] | None:
    if any(s != 0.0 for s in scores) or (base is not None and base["value"] <= 0.0):
        return None
    shares = [_finite((r.get("tasks") or {}).get(task, {}).get("outside_labels")) for r in runs]
    shares = [s for s in shares if s is not None]
    below = f" (baseline {base['value']:.4f}, {base['answer']})" if base else ""
    if shares and statistics.fmean(shares) > 0:
        reason = f"{statistics.fmean(shares):.0%} of its answers are outside the label set"
    else:
        reason = "every answer is wrong"
    return {"kind": "zero", "text": f"{name} is 0{below}: {reason}"}


def _baseline_flag(name: str, scores: list[float], base) -> dict[str, str] | None:
    if base is None:
        return None
    at = sum(s <= base["value"] + MARGIN for s in scores)
    if not at:
        return None
    seeds = "every seed" if at == len(scores) else f"{at}/{len(scores)} seeds"
    return {"kind": "baseline",
            "text": f"{name} {statistics.fmean(scores):.4f} is at the baseline ({base['answer']}: "
                    f"{base['value']:.4f}) in {seeds}: it learned nothing usable there"}


def short_flags(flags: list[dict[str, Any]]) -> str:
    """The table cell: ``at baseline: sst2; 0: rte`` ('' when nothing is flagged)."""
    parts = []
    for kind, label in (("zero", "0"), ("baseline", "at baseline")):
        tasks = [f["task"] for f in flags if f["kind"] == kind]
        if tasks:
            parts.append(f"{label}: {', '.join(tasks)}")
    return "; ".join(parts)

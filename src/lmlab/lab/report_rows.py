"""The report's rows: the records of one (arm, size) over seeds, every number as mean ± sample
standard deviation (see :mod:`lmlab.lab.report`)."""

from __future__ import annotations

import math
import statistics
from typing import Any

from lmlab.lab.baselines import DIAGNOSTICS, arm_flags, task_baselines


def mean_std(values: list[float]) -> tuple[float, float, int]:
    """(mean, sample standard deviation, n) of the finite values; std is nan for fewer than 2."""
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if not vals:
        return math.nan, math.nan, 0
    return statistics.fmean(vals), (statistics.stdev(vals) if len(vals) > 1 else math.nan), len(vals)


def metric_columns(records: list[dict[str, Any]], diagnostics: bool = False) -> list[tuple[str, str]]:
    """(task, metric) pairs in the order they first appear; the diagnostic ones (the share of
    answers outside the label set) only with ``diagnostics``."""
    cols: list[tuple[str, str]] = []
    for r in records:
        for task, metrics in (r.get("tasks") or {}).items():
            for m in metrics:
                if (task, m) not in cols and (diagnostics or m not in DIAGNOSTICS):
                    cols.append((task, m))
    return cols


def aggregate(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (arm, size), in order of first appearance, numbers over seeds."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault((r["arm"], r["size"]), []).append(r)
    sizes = {r["size"] for r in records}
    cols = metric_columns(records)
    baselines = task_baselines(records)
    rows = []
    for (arm, size), rs in groups.items():
        first = rs[0]
        row = {
            "run": arm if len(sizes) == 1 else f"{arm}/{size}",
            "arm": arm,
            "size": size,
            "objective": first.get("objective", ""),
            "preset": first.get("preset", ""),
            "seeds": len(rs),
            "parameters": first.get("parameters"),
            "flops": statistics.fmean(float(r.get("flops") or 0.0) for r in rs),
            "tokens": _whole(statistics.fmean(float(r.get("tokens") or 0) for r in rs)),
            "val_loss": mean_std([r.get("val_loss") for r in rs]),
            "metrics": {
                f"{t} {m}": mean_std([(r.get("tasks") or {}).get(t, {}).get(m) for r in rs]) for t, m in cols
            },
            "baselines": {f"{t} {m}": baselines.get(f"{t} {m}") for t, m in cols},
            "flags": arm_flags(rs, baselines),
        }
        rows.append(row)
    return rows


def _whole(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


def baselines_of(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Task metric -> its baseline (value and answer), as the rows carry them."""
    return {m: b for m, b in (rows[0].get("baselines") or {}).items() if b} if rows else {}

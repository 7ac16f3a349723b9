"""The report's plots: validation loss against compute, and the downstream scores (see
:mod:`lmlab.lab.report`)."""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from lmlab.fileio import atomic_write_bytes
from lmlab.lab.report_rows import baselines_of


def _save(fig, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    atomic_write_bytes(path, buf.getvalue())


def plot_loss_vs_compute(records: list[dict[str, Any]], path: str | Path, title: str = "") -> bool:
    """Validation loss against pretraining FLOPs (log axis; the step-0 loss is left out), one panel
    per objective (their losses differ in kind), one line per run and seed, one colour per (arm,
    size). False when no run has a curve."""
    curves = [r for r in records if r.get("curve")]
    if not curves:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    objectives = list(dict.fromkeys(r["objective"] for r in curves))
    fig, axes = plt.subplots(1, len(objectives), figsize=(4.2 * len(objectives), 3.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    runs = list(dict.fromkeys((r["arm"], r["size"]) for r in curves))
    several_sizes = len({s for _, s in runs}) > 1
    drawn: set[tuple] = set()
    labelled: set[tuple] = set()
    for ax, obj in zip(axes[0], objectives):
        for r in (r for r in curves if r["objective"] == obj):
            run = (r["arm"], r["size"])
            key = (*run, tuple(map(tuple, r["curve"])))
            if key in drawn:  # shared pretraining: the same curve for every fine-tuning seed
                continue
            drawn.add(key)
            label = None if run in labelled else (f"{run[0]}/{run[1]}" if several_sizes else run[0])
            labelled.add(run)
            points = [c for c in r["curve"] if c[0] > 0]  # step 0 has no place on a log axis
            ax.plot(
                [c[0] for c in points],
                [c[1] for c in points],
                color=colors[runs.index(run) % len(colors)],
                lw=1.2,
                alpha=0.85,
                label=label,
            )
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())  # minor labels overlap
        ax.set_xlabel("pretraining FLOPs")
        ax.set_ylabel("validation loss")
        ax.set_title(obj)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    _save(fig, Path(path))
    plt.close(fig)
    return True


def plot_downstream(
    rows: list[dict[str, Any]], records: list[dict[str, Any]], path: str | Path, title: str = ""
) -> bool:
    """Downstream score per run (mean bar, spread as error bar, each seed a dot), one panel per
    task metric. False when there is no downstream metric."""
    metric_names = list(rows[0]["metrics"]) if rows else []
    if not metric_names:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(
        1,
        len(metric_names),
        figsize=(max(3.6, 1.1 * len(rows) + 1.5) * len(metric_names), 3.6),
        squeeze=False,
    )
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    objectives = list(dict.fromkeys(r["objective"] for r in rows))
    baselines = baselines_of(rows)
    for ax, name in zip(axes[0], metric_names):
        task, metric = name.split(" ", 1)
        base = baselines.get(name)
        if base is not None:
            ax.axhline(base["value"], color="black", linestyle="--", lw=1,
                       label=f"baseline: {base['answer']}")
        for i, r in enumerate(rows):
            mean, std, n = r["metrics"][name]
            color = colors[objectives.index(r["objective"]) % len(colors)]
            flag = next((f for f in r.get("flags") or [] if f"{f['task']} {f['metric']}" == name), None)
            ax.bar(
                i,
                mean if n else 0.0,
                color=color,
                alpha=0.7,
                yerr=std if math.isfinite(std) else None,
                capsize=4,
                hatch="//" if flag else None,
                edgecolor="black" if flag else None,
            )
            if flag:
                ax.annotate("0" if flag["kind"] == "zero" else "at baseline", (i, mean if n else 0.0),
                            textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7, color="red")
            dots = [
                (rec.get("tasks") or {}).get(task, {}).get(metric)
                for rec in records
                if rec["arm"] == r["arm"] and rec["size"] == r["size"]
            ]
            dots = [d for d in dots if d is not None]
            ax.scatter([i] * len(dots), dots, color="black", s=10, zorder=3)
        ax.set_xticks(range(len(rows)), [f"{r['run']}\n({r['objective']})" for r in rows], fontsize=8)
        ax.set_ylabel(metric)
        ax.set_title(task)
        lows = [v for r in rows for v in [r["metrics"][name][0]] if math.isfinite(v)]
        lows += [base["value"]] if base is not None else []
        if lows:
            ax.set_ylim(max(0.0, min(lows) - 0.1), min(1.0, max(lows) + 0.08) if max(lows) <= 1 else None)
        if base is not None:
            ax.legend(fontsize=7, loc="lower right")
        ax.grid(axis="y", alpha=0.3)
    if title:
        fig.suptitle(title)
    _save(fig, Path(path))
    plt.close(fig)
    return True

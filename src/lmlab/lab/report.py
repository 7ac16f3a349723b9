"""The grid's answer: a table (Markdown and CSV) and two plots, in the spirit of the T5 paper's
objective tables (Raffel et al. 2020, Tables 4-7: one row per pretraining choice, one column per
downstream task, the baseline's spread over seeds alongside).

Input: *records*, one per (arm, size, seed), each a dict::

    {"arm": "bert-mlm", "size": "base", "seed": 0, "objective": "mlm", "preset": "bert-tiny",
     "parameters": 378944, "steps": 500, "tokens": 1024000, "flops": 2.1e12,
     "val_loss": 5.81, "curve": [[flops, val_loss], ...], "tasks": {"sst2": {"accuracy": 0.77}},
     "baselines": {"sst2": {"answer": "majority class '1'", "dev": {"accuracy": 0.509}}},
     "select": {"sst2": "accuracy"}}

:func:`aggregate` groups them by (arm, size) and gives every number as mean ± sample standard
deviation over the seeds (``n - 1`` in the denominator; a single seed shows no spread). Each task's
baseline (the trivial answer's score, :mod:`lmlab.lab.baselines`) is shown beside every arm, and an
arm at the baseline or at zero is flagged with the reason, in the table, the CSV and the plot.
Validation losses of different objectives are *not* comparable (an MLM loss is measured on 15%
of the tokens, a causal LM loss on all of them, ELECTRA's is a weighted sum of two losses); they
compare sizes and budgets within one objective. The downstream columns compare objectives.

The records are read in :mod:`lmlab.lab.report_records`, the rows built in
:mod:`lmlab.lab.report_rows`, the plots drawn in :mod:`lmlab.lab.report_plots`; this module writes
the tables, the claims and the files (and still exports those modules' public names).
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from pathlib import Path
from typing import Any

from lmlab.fileio import atomic_write_text, write_json
from lmlab.lab.baselines import short_flags
from lmlab.lab.report_plots import plot_downstream, plot_loss_vs_compute
from lmlab.lab.report_records import (  # noqa: F401 (re-exported: the report's input lives there)
    collect_records,
    selection_markdown,
    selection_of,
)
from lmlab.lab.report_rows import (  # noqa: F401 (re-exported: the report's rows live there)
    aggregate,
    baselines_of,
    mean_std,
    metric_columns,
)

__all__ = [
    "aggregate",
    "baseline_lines",
    "collect_records",
    "contrast_markdown",
    "contrast_rows",
    "csv_text",
    "flag_lines",
    "markdown_table",
    "mean_std",
    "metric_columns",
    "plot_downstream",
    "plot_loss_vs_compute",
    "write_report",
]


# --------------------------------------------------------------------------- contrasts


def contrast_rows(records: list[dict[str, Any]], contrasts) -> list[dict[str, Any]]:
    """Each contrast (``better``, ``than``, ``kind``) on every task metric, seed by seed.

    For every size and task metric that both arms have: the two means ± spreads, the paired
    difference ``better - than`` over the seeds both arms finished (mean ± sample std), how many
    of those seeds agree with the claim (``better``: a higher score; ``at-least``: not lower), the
    FLOPs ratio of their pretraining, and a verdict that says how consistent the answer is:
    ``yes (every seed)``, ``yes on average (k/n seeds)``, ``no on average (k/n seeds)`` or
    ``no (every seed)``. Lower-is-better metrics do not occur among lmlab's task metrics.
    """
    by_key: dict[tuple[str, str], dict[int, dict[str, Any]]] = {}
    for r in records:
        by_key.setdefault((r["arm"], r["size"]), {})[r["seed"]] = r
    sizes = list(dict.fromkeys(r["size"] for r in records))
    cols = metric_columns(records)
    rows = []
    for c in contrasts:
        for size in sizes:
            a, b = by_key.get((c.better, size), {}), by_key.get((c.than, size), {})
            seeds = sorted(set(a) & set(b))
            for task, metric in cols:

                def score(run, task=task, metric=metric):
                    value = (run.get("tasks") or {}).get(task, {}).get(metric)
                    return None if value is None or not math.isfinite(float(value)) else float(value)

                pairs = [(score(a[s]), score(b[s])) for s in seeds]
                pairs = [(x, y) for x, y in pairs if x is not None and y is not None]
                if not pairs:
                    continue
                diffs = [x - y for x, y in pairs]
                agree = sum(d >= 0 if c.kind == "at-least" else d > 0 for d in diffs)
                mean_diff = statistics.fmean(diffs)
                holds = mean_diff >= 0 if c.kind == "at-least" else mean_diff > 0
                n = len(diffs)
                if holds:
                    verdict = "yes (every seed)" if agree == n else f"yes on average ({agree}/{n} seeds)"
                else:
                    verdict = "no (every seed)" if agree == 0 else f"no on average ({agree}/{n} seeds)"
                flops_a = statistics.fmean(float(a[s].get("flops") or 0.0) for s in seeds)
                flops_b = statistics.fmean(float(b[s].get("flops") or 0.0) for s in seeds)
                rows.append(
                    {
                        "contrast": c.name,
                        "better": c.better,
                        "than": c.than,
                        "kind": c.kind,
                        "size": size,
                        "metric": f"{task} {metric}",
                        "better_score": mean_std([x for x, _ in pairs]),
                        "than_score": mean_std([y for _, y in pairs]),
                        "difference": mean_std(diffs),
                        "agree": agree,
                        "seeds": n,
                        "flops_ratio": flops_a / flops_b if flops_b else math.nan,
                        "verdict": verdict,
                    }
                )
    return rows


def contrast_markdown(rows: list[dict[str, Any]]) -> str:
    """The contrasts as a Markdown table (one row per contrast, size and task metric)."""
    sizes = {r["size"] for r in rows}
    head = ["claim", "A", "B", "metric", "A", "B", "A - B (paired)", "FLOPs A/B", "answer"]
    lines = ["| " + " | ".join(head) + " |", "|---|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        rel = ">=" if r["kind"] == "at-least" else ">"
        ratio = r["flops_ratio"]
        cells = [
            f"{r['contrast']} (A {rel} B)",
            r["better"] + (f"/{r['size']}" if len(sizes) > 1 else ""),
            r["than"] + (f"/{r['size']}" if len(sizes) > 1 else ""),
            r["metric"],
            _pm(r["better_score"]),
            _pm(r["than_score"]),
            _pm(r["difference"]),
            f"{ratio:.2f}" if math.isfinite(ratio) else "–",
            r["verdict"],
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- formatting


def _si(x: float | None) -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "–"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g}{unit}"
    return f"{x:.3g}" if isinstance(x, float) and not float(x).is_integer() else f"{int(x)}"


def _flops(x: float) -> str:
    return "0" if not x else f"{x:.3g}"


def _pm(stat: tuple[float, float, int], digits: int = 4) -> str:
    mean, std, n = stat
    if n == 0:
        return "–"
    return f"{mean:.{digits}f}" if not math.isfinite(std) else f"{mean:.{digits}f} ± {std:.{digits}f}"


def _score_cell(stat: tuple[float, float, int], base: dict[str, Any] | None) -> str:
    """``0.6751 ± 0.0037 (+0.1659)``: the score and, when the task has a baseline, the difference."""
    text = _pm(stat)
    if base is None or stat[2] == 0:
        return text
    return f"{text} ({stat[0] - base['value']:+.4f})"


def markdown_table(rows: list[dict[str, Any]]) -> str:
    """The table: run, objective, params, FLOPs, tokens, val loss, one column per task metric (with
    the difference to the task's baseline), seeds, and the flags. When baselines are known, the
    first row is the baseline itself (the trivial answer, no model)."""
    metric_names = list(rows[0]["metrics"]) if rows else []
    baselines = baselines_of(rows)
    flagged = any(r.get("flags") for r in rows)
    head = ["run", "objective", "params", "FLOPs", "tokens", "val loss", *metric_names, "seeds"]
    head += ["flags"] if flagged else []
    align = ["---"] * 2 + ["---:"] * (len(metric_names) + 5) + (["---"] if flagged else [])
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    if baselines:
        cells = ["baseline (no model)", "–", "–", "–", "–", "–",
                 *(f"{baselines[m]['value']:.4f}" if m in baselines else "–" for m in metric_names), "–"]
        lines.append("| " + " | ".join(cells + ([""] if flagged else [])) + " |")
    for r in rows:
        cells = [
            r["run"],
            r["objective"],
            _si(r["parameters"]),
            _flops(r["flops"]),
            _si(r["tokens"]),
            _pm(r["val_loss"]),
            *(_score_cell(r["metrics"][m], baselines.get(m)) for m in metric_names),
            str(r["seeds"]),
        ]
        cells += [short_flags(r.get("flags") or [])] if flagged else []
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def baseline_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per task metric with a baseline: what the trivial answer is and scores."""
    return [f"{name}: {b['value']:.4f} ({b['answer']}, no model)" for name, b in baselines_of(rows).items()]


def flag_lines(rows: list[dict[str, Any]]) -> list[str]:
    """One line per flagged (arm, task): ``bert-mlm: sst2 accuracy 0.5092 is at the baseline ...``."""
    return [f"{r['run']}: {f['text']}" for r in rows for f in r.get("flags") or []]


def csv_text(rows: list[dict[str, Any]]) -> str:
    """The same table as CSV, one number per cell: ``*_mean``, ``*_std`` (empty when undefined), ``*_n``."""
    metric_names = list(rows[0]["metrics"]) if rows else []
    head = [
        "run",
        "arm",
        "size",
        "objective",
        "preset",
        "seeds",
        "params",
        "flops",
        "tokens",
        "val_loss_mean",
        "val_loss_std",
    ]
    baselines = baselines_of(rows)
    for m in metric_names:
        key = m.replace(" ", "_")
        head += [f"{key}_mean", f"{key}_std", f"{key}_n"] + ([f"{key}_baseline"] if m in baselines else [])
    head.append("flags")
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)

    def num(x):
        return (
            ""
            if x is None or (isinstance(x, float) and not math.isfinite(x))
            else repr(x)
            if isinstance(x, float)
            else x
        )

    for r in rows:
        line = [
            r["run"],
            r["arm"],
            r["size"],
            r["objective"],
            r["preset"],
            r["seeds"],
            r["parameters"],
            num(r["flops"]),
            num(r["tokens"]),
            num(r["val_loss"][0]),
            num(r["val_loss"][1]),
        ]
        for m in metric_names:
            mean, std, n = r["metrics"][m]
            line += [num(mean), num(std), n] + ([num(baselines[m]["value"])] if m in baselines else [])
        line.append("; ".join(f["text"] for f in r.get("flags") or []))
        w.writerow(line)
    return buf.getvalue()


def runs_csv_text(records: list[dict[str, Any]]) -> str:
    """One line per (arm, size, seed): the raw numbers behind the table (diagnostics included) and,
    for a task fine-tuned with ``lr = "auto"``, the rate each run kept (``TASK_lr``)."""
    cols = metric_columns(records, diagnostics=True)
    rated = sorted({t for r in records for t in (r.get("rates") or {})})
    head = [
        "arm",
        "size",
        "seed",
        "objective",
        "preset",
        "params",
        "steps",
        "tokens",
        "flops",
        "val_loss",
        *[f"{t}_{m}" for t, m in cols],
        *[f"{t}_lr" for t in rated],
    ]
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(head)
    for r in records:
        vals = [(r.get("tasks") or {}).get(t, {}).get(m, "") for t, m in cols]
        w.writerow(
            [
                r["arm"],
                r["size"],
                r["seed"],
                r.get("objective", ""),
                r.get("preset", ""),
                r.get("parameters", ""),
                r.get("steps", ""),
                r.get("tokens", ""),
                r.get("flops", ""),
                "" if r.get("val_loss") is None else r["val_loss"],
                *vals,
                *[(r.get("rates") or {}).get(t, "") for t in rated],
            ]
        )
    return buf.getvalue()


def _finite(obj):
    """nan -> None, tuples -> lists: strict JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


#: the files :func:`write_report` writes into a comparison's folder (the plots only when they have points)
REPORT_FILES = ("results.md", "results.csv", "runs.csv", "results.json", "loss_vs_compute.png",
                "downstream.png")


def write_report(records: list[dict[str, Any]], grid, out: str | Path) -> dict[str, Path]:
    """Write :data:`REPORT_FILES` into ``out``: ``results.md``, ``results.csv``, ``runs.csv``,
    ``results.json`` and the plots."""
    out = Path(out)
    name = getattr(grid, "name", "grid")
    rows = aggregate(records)
    paths = {}
    budget = getattr(grid, "budget", None)
    seeds = getattr(grid, "seeds", [])
    md = [f"# {name}", ""]
    if budget is not None:
        md.append(
            "Budget "
            + (grid.budget_text() if hasattr(grid, "budget_text") else f"{budget} per pretraining run")
            + f"; seeds {seeds}"
            + (
                "; one pretraining run per arm, fine-tuned with every seed"
                if getattr(grid, "share_pretraining", False)
                else ""
            )
            + ". Numbers are mean ± sample standard deviation over seeds."
        )
        md.append("")
    selection = selection_of(grid)
    if selection:
        md += [selection_markdown(selection), ""]
    md.append(markdown_table(rows) if rows else "(no finished runs yet)\n")
    if baseline_lines(rows):
        md += ["Baselines (the trivial answer of each task, no model; the numbers in brackets are "
               "each arm's difference to it):", "", *(f"- {line}" for line in baseline_lines(rows)), ""]
    if flag_lines(rows):
        md += ["## Flags", "", *(f"- {line}" for line in flag_lines(rows)), ""]
    contrasts = contrast_rows(records, getattr(grid, "contrasts", []) or [])
    if contrasts:
        md += [
            "## Claims",
            "",
            "Each claim compares arm A with arm B seed by seed (the same seed pretrains and fine-tunes "
            "both); A - B is the mean ± sample std of the per-seed differences. FLOPs A/B: their "
            "pretraining compute.",
            "",
            contrast_markdown(contrasts),
        ]
    paths["markdown"] = out / "results.md"
    atomic_write_text(paths["markdown"], "\n".join(md))
    paths["csv"] = out / "results.csv"
    atomic_write_text(paths["csv"], csv_text(rows))
    paths["runs_csv"] = out / "runs.csv"
    atomic_write_text(paths["runs_csv"], runs_csv_text(records))
    paths["json"] = out / "results.json"
    summary = {"name": name, "rows": rows, "records": records, "contrasts": contrasts, "selection": selection}
    write_json(paths["json"], _finite(summary))
    if plot_loss_vs_compute(records, out / "loss_vs_compute.png", name):
        paths["loss_plot"] = out / "loss_vs_compute.png"
    if plot_downstream(rows, records, out / "downstream.png", name):
        paths["downstream_plot"] = out / "downstream.png"
    return paths

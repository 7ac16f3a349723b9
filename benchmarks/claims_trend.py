"""Claims as a trend: paired gaps between arms at 1x, 2x, 4x, 8x... compute, and where they would close.

Reads the output folders of ``lmlab compare`` (their ``runs.csv``: one line per arm x size x seed)
of grids whose arms are named ``NAME-xK``: arm ``NAME`` at ``K`` times the base compute
(``configs/grids/claims-trend-electra.toml``, ``claims-trend-t5.toml``). A gap ``A:B`` is, per
multiple ``K`` and seed, the score of ``A-xK`` minus that of ``B-xK`` (or of ``B`` itself when the
grid has one ``B`` for every multiple, e.g. a model that is not pretrained): paired by seed, so the
seed's share of the noise cancels. Gaps come from ``--gap`` or, by default, from the grid's
``[[contrasts]]`` (recorded in ``results.json``), their ``-xK`` suffixes taken off.

For each gap it reports the mean ± sample std over seeds at each multiple, and fits the per-seed
gaps against ``log2(K)`` by least squares: ``gap = a + b * log2(K)``, with the standard errors of
``a`` and ``b`` from the residuals. If the trend holds, the gap crosses zero at ``K* = 2 ** (-a / b)``
(its 68% range from the delta method); a slope within two standard errors of zero is reported as no
trend, and a gap moving away from zero as one that does not close.

Writes ``trend.md`` (the table and the fits), ``trend.json`` and ``trend.png`` (one panel per
folder: each gap against compute, with its fit) into ``--out``.

    python benchmarks/claims_trend.py runs/claims/trend-electra runs/claims/trend-t5 \
        --out docs/results/claims-trend
    python benchmarks/claims_trend.py runs/claims/trend-electra --gap electra-40:mlm-40 --metric sst2_accuracy
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import math
import re
import statistics
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # a checkout without lmlab installed
    sys.path.insert(0, str(ROOT / "src"))

from lmlab.errors import LmlabError  # noqa: E402

KIND = "claims trend"
ENTRIES = ("trend.md", "trend.json", "trend.png")
MULTIPLE = re.compile(r"(?P<series>.+)-x(?P<k>\d+(?:\.\d+)?)")
#: a crossing further out than this multiple is not drawn (it is still reported)
DRAW_LIMIT = 1024


@dataclass
class Point:
    """One gap at one compute multiple: the per-seed differences and what they are of."""

    multiple: float
    better_arm: str
    than_arm: str
    flops: float  # mean pretraining FLOPs of the better arm
    better: list[float]
    than: list[float]
    diffs: list[float]
    seeds: list[int]

    @property
    def mean(self) -> float:
        return statistics.fmean(self.diffs)

    @property
    def std(self) -> float:
        return statistics.stdev(self.diffs) if len(self.diffs) > 1 else math.nan


@dataclass
class Fit:
    """``gap = a + b * log2(K)``, least squares over the per-seed gaps."""

    a: float
    b: float
    se_a: float
    se_b: float
    cov_ab: float
    n: int
    crossing: float | None = None  # K* where the fitted gap is zero
    crossing_range: tuple[float, float] | None = None
    reading: str = ""


@dataclass
class Trend:
    folder: str
    grid: str
    better: str
    than: str
    metric: str
    points: list[Point] = field(default_factory=list)
    fit: Fit | None = None

    @property
    def name(self) -> str:
        return f"{self.better} - {self.than}"


# --------------------------------------------------------------------------- reading


def read_runs(folder: Path) -> list[dict[str, str]]:
    path = folder / "runs.csv"
    if not path.is_file():
        raise LmlabError(f"{folder} has no runs.csv",
                         "pass the --out folder of a finished `lmlab compare` run")
    with open(path, encoding="utf-8", newline="") as f:
        return list(csv.DictReader(f))


def split_arm(arm: str) -> tuple[str, float | None]:
    """``mlm-40-x2`` -> ``("mlm-40", 2.0)``; an arm without a multiple -> ``(arm, None)``."""
    m = MULTIPLE.fullmatch(arm)
    return (m["series"], float(m["k"])) if m else (arm, None)


def recorded_gaps(folder: Path) -> list[tuple[str, str]]:
    """The grid's contrasts (``results.json``) whose better arm has a multiple, as series pairs."""
    path = folder / "results.json"
    if not path.is_file():
        return []
    rows = json.loads(path.read_text(encoding="utf-8")).get("contrasts") or []
    gaps = []
    for r in rows:
        better, k = split_arm(r["better"])
        if k is not None:
            gaps.append((better, split_arm(r["than"])[0]))
    return list(dict.fromkeys(gaps))


def parse_gap(text: str) -> tuple[str, str]:
    better, sep, than = text.partition(":")
    if not sep or not better or not than:
        raise LmlabError(f"--gap {text!r} is not of the form A:B", "write e.g. --gap electra-40:mlm-40")
    return better, than


def default_metric(rows: list[dict[str, str]]) -> str:
    fixed = {"arm", "size", "seed", "objective", "preset", "params", "steps", "tokens", "flops", "val_loss"}
    metrics = [c for c in rows[0] if c not in fixed] if rows else []
    if not metrics:
        raise LmlabError("runs.csv has no task metric column", "fine-tune the grid's arms on a task first")
    return next((m for m in metrics if m.endswith("_accuracy")), metrics[0])


def scores(rows: list[dict[str, str]], metric: str) -> dict[str, dict[int, tuple[float, float]]]:
    """arm -> seed -> (metric, pretraining FLOPs); runs without the metric are left out."""
    out: dict[str, dict[int, tuple[float, float]]] = {}
    for r in rows:
        if metric not in r:
            raise LmlabError(f"runs.csv has no column {metric!r}", f"choose one of: {', '.join(r)}")
        value = r[metric]
        if value in ("", None) or not math.isfinite(float(value)):
            continue
        out.setdefault(r["arm"], {})[int(r["seed"])] = (float(value), float(r.get("flops") or 0.0))
    return out


# --------------------------------------------------------------------------- the gaps and the fit


def gap_points(by_arm, better: str, than: str) -> list[Point]:
    multiples = sorted(k for arm in by_arm for s, k in [split_arm(arm)] if s == better and k is not None)
    points = []
    for k in multiples:
        a_arm = f"{better}-x{k:g}"
        b_arm = f"{than}-x{k:g}" if f"{than}-x{k:g}" in by_arm else than
        a, b = by_arm.get(a_arm, {}), by_arm.get(b_arm, {})
        seeds = sorted(set(a) & set(b))
        if not seeds:
            continue
        diffs = [a[s][0] - b[s][0] for s in seeds]
        points.append(Point(k, a_arm, b_arm, statistics.fmean(a[s][1] for s in seeds),
                            [a[s][0] for s in seeds], [b[s][0] for s in seeds], diffs, seeds))
    return points


def fit_trend(points: list[Point]) -> Fit | None:
    """Least squares of the per-seed gaps against log2(K); None below 3 points or 2 multiples."""
    xs = [math.log2(p.multiple) for p in points for _ in p.diffs]
    ys = [d for p in points for d in p.diffs]
    n = len(xs)
    if n < 3 or len(set(xs)) < 2:
        return None
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    a = my - b * mx
    s2 = sum((y - a - b * x) ** 2 for x, y in zip(xs, ys, strict=True)) / (n - 2)
    fit = Fit(a, b, math.sqrt(s2 * (1 / n + mx**2 / sxx)), math.sqrt(s2 / sxx), -mx * s2 / sxx, n)
    fit.crossing, fit.crossing_range, fit.reading = crossing(fit)
    return fit


def told_from_zero(value: float, se: float) -> bool:
    """The one rule for a fitted number: it differs from zero when it is two standard errors away."""
    return value != 0 and abs(value) >= 2 * se


def level(f: Fit) -> str:
    """Where the fitted gap stands at 1x: ahead or behind (told from zero) or not."""
    at = f"at 1x ({f.a:+.4f} ± {f.se_a:.4f})"
    if not told_from_zero(f.a, f.se_a):
        return f"within noise of zero {at}"
    return f"{'ahead' if f.a > 0 else 'behind'} {at}"


def crossing(f: Fit) -> tuple[float | None, tuple[float, float] | None, str]:
    """Where the fitted gap closes (the multiple where it is zero and its 68% range by the delta
    method; None when it does not close or the slope is not told from zero), and what it means."""
    slope = f"{f.b:+.4f} ± {f.se_b:.4f} per doubling"
    x0 = -f.a / f.b if f.b else -math.inf
    if not told_from_zero(f.b, f.se_b):
        line = f" (the fitted line crosses at {2.0**x0:.3g}x)" if x0 > 0 else ""
        return None, None, (f"{level(f)}; no trend distinguishable from zero ({slope}): no crossing "
                            f"predicted{line}")
    if x0 <= 0:
        side = "ahead" if f.b > 0 else "behind"
        return None, None, f"{side} from 1x on and moving away from zero ({slope}): does not close"
    var = (f.se_a**2 + x0**2 * f.se_b**2 + 2 * x0 * f.cov_ab) / f.b**2
    se = math.sqrt(max(var, 0.0))
    k, span = 2.0**x0, (2.0 ** (x0 - se), 2.0 ** (x0 + se))
    side = "behind" if f.a < 0 else "ahead"
    where = f"{k:.3g}x (68%: {span[0]:.3g}x-{span[1]:.3g}x)"
    return k, span, f"{side} at 1x, moving towards zero ({slope}): crosses at {where}"


def trends_of(folder: Path, gaps: list[tuple[str, str]], metric: str | None) -> list[Trend]:
    rows = read_runs(folder)
    metric = metric or default_metric(rows)
    by_arm = scores(rows, metric)
    series = {split_arm(a)[0] for a in by_arm}
    gaps = gaps or recorded_gaps(folder)
    if not gaps:
        raise LmlabError(f"{folder}: no gap to follow (no --gap, no NAME-xK contrasts in results.json)",
                         "pass --gap A:B with A a series of arms named A-x1, A-x2, ...")
    grid = folder.name
    if (folder / "results.json").is_file():
        grid = json.loads((folder / "results.json").read_text(encoding="utf-8")).get("name") or grid
    out = []
    for better, than in gaps:
        for side in (better, than):
            if side not in series:
                raise LmlabError(f"{folder}: no arm {side!r} or {side}-xK in runs.csv",
                                 f"choose among: {', '.join(sorted(series))}")
        trend = Trend(str(folder), grid, better, than, metric, gap_points(by_arm, better, than))
        trend.fit = fit_trend(trend.points)
        out.append(trend)
    return out


# --------------------------------------------------------------------------- writing


def mean_std(values: list[float]) -> str:
    if len(values) < 2:
        return f"{statistics.fmean(values):.4f}"
    return f"{statistics.fmean(values):.4f} ± {statistics.stdev(values):.4f}"


def markdown(trends: list[Trend]) -> str:
    lines = ["| grid | gap | compute | pretraining FLOPs (A) | A | B | A - B (paired) | seeds | A ahead |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for t in trends:
        for p in t.points:
            ahead = sum(d > 0 for d in p.diffs)
            lines.append(f"| {t.grid} | {t.name} | {p.multiple:g}x | {p.flops:.3g} | {mean_std(p.better)} | "
                         f"{mean_std(p.than)} | **{mean_std(p.diffs)}** | {len(p.diffs)} | "
                         f"{ahead}/{len(p.diffs)} |")
    lines += ["", "| grid | gap | fit at 1x | per doubling of compute | gap closes at | reading |",
              "|---|---|---:|---:|---:|---|"]
    for t in trends:
        f = t.fit
        if f is None:
            lines.append(f"| {t.grid} | {t.name} | – | – | – | too few points to fit (3 per-seed gaps over "
                         "2 multiples at least) |")
            continue
        closes = f"{f.crossing:.3g}x" if f.crossing is not None else "–"
        lines.append(f"| {t.grid} | {t.name} | {f.a:+.4f} ± {f.se_a:.4f} | {f.b:+.4f} ± {f.se_b:.4f} | "
                     f"{closes} | {f.reading} |")
    metric = ", ".join(sorted({t.metric for t in trends}))
    lines += ["", f"Metric: {metric}. A - B: mean ± sample std of the per-seed differences (the same seed "
              "pretrains and fine-tunes both arms). Fit: least squares of every per-seed gap against "
              "log2(compute multiple), ± one standard error; \"closes at\": the multiple of today's compute "
              "where the fitted gap is zero, if the trend holds."]
    return "\n".join(lines) + "\n"


def plot(trends: list[Trend]) -> bytes:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grids = list(dict.fromkeys(t.grid for t in trends))
    measured = [p.multiple for t in trends for p in t.points] or [1.0]
    left = min(measured)
    fig, axes = plt.subplots(1, len(grids), figsize=(6.5 * len(grids), 4.5), squeeze=False)
    for ax, grid in zip(axes[0], grids, strict=True):
        right = max(measured)  # every panel spans every multiple measured, so panels line up
        for i, t in enumerate(x for x in trends if x.grid == grid):
            ks = [p.multiple for p in t.points]
            stds = [0.0 if math.isnan(p.std) else p.std for p in t.points]
            shift = 2 ** ((i - 1) * 0.04)  # side by side, not on top of each other
            bars = ax.errorbar([k * shift for k in ks], [p.mean for p in t.points], yerr=stds, marker="o",
                               capsize=3, linestyle="none", label=t.name)
            if t.fit is not None and ks:
                end = max(ks)
                if t.fit.crossing is not None and max(ks) < t.fit.crossing <= DRAW_LIMIT:
                    end = t.fit.crossing * 1.2
                right = max(right, end)
                xs = [min(ks) * (end / min(ks)) ** (j / 50) for j in range(51)]
                ax.plot(xs, [t.fit.a + t.fit.b * math.log2(x) for x in xs], linestyle="--",
                        color=bars[0].get_color(), linewidth=1)
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlim(left / 1.3, right * 1.3)
        ax.set_xticks([2.0**j for j in range(math.floor(math.log2(left)), math.ceil(math.log2(right)) + 1)])
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
        ax.set_xlabel("pretraining compute (multiple of today's per-arm compute)")
        ax.set_ylabel(f"paired gap in {trends[0].metric}")
        ax.set_title(grid)
        ax.legend(fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def as_json(trends: list[Trend]) -> list[dict[str, Any]]:
    out = []
    for t in trends:
        d = asdict(t)
        d["points"] = [{**asdict(p), "mean": p.mean, "std": None if math.isnan(p.std) else p.std}
                       for p in t.points]
        out.append(d)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folders", nargs="+", help="output folders of `lmlab compare` (with runs.csv)")
    ap.add_argument("--gap", action="append", default=[], metavar="A:B",
                    help="a gap to follow (repeatable; default: the grid's contrasts)")
    ap.add_argument("--metric", default=None, help="a runs.csv column (default: the first *_accuracy)")
    ap.add_argument("--out", required=True, help="folder for trend.md, trend.json and trend.png")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from lmlab.fileio import atomic_write_bytes, atomic_write_text, write_json
    from lmlab.ownership import claim_dir

    args = parse_args(argv)
    try:
        gaps = [parse_gap(g) for g in args.gap]
        trends = [t for folder in args.folders for t in trends_of(Path(folder), gaps, args.metric)]
        if not any(t.points for t in trends):
            raise LmlabError("no gap has a seed that both of its arms finished", "let the grids finish first")
        out = claim_dir(args.out, KIND, ENTRIES)
    except LmlabError as e:
        print(f"error: {e.problem}; {e.fix}", file=sys.stderr)
        return 2
    text = markdown(trends)
    atomic_write_text(out / "trend.md", text)
    write_json(out / "trend.json", {"trends": as_json(trends)})
    atomic_write_bytes(out / "trend.png", plot(trends))
    print(text + f"\nwritten: {out / 'trend.md'}, {out / 'trend.json'}, {out / 'trend.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

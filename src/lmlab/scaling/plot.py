"""Plotting a fitted scaling law against its runs (matplotlib, Agg backend, log axes).

Left: loss against the law's variable (N for the ``n`` and ``chinchilla`` forms, with one curve per
token count D for the latter; D for ``d``; C for ``c``). Right: loss against training compute
``C = 6·N·D``, with the law along the runs (``n``: at their shared D; ``d``: at their shared N),
or for the Chinchilla form the compute-optimal frontier ``L(N_opt(C), D_opt(C))``. Held-out runs
are drawn as open markers, so the extrapolation is visible.
"""

from __future__ import annotations

import io
import os

import numpy as np

from lmlab.fileio import atomic_write_bytes
from lmlab.scaling.fit import FitResult, distinct_values
from lmlab.scaling.runs import RunPoint

__all__ = ["plot_fit"]

MAX_CURVES = 6


def _grid(values, pad: float = 1.5, n: int = 100) -> np.ndarray:
    v = np.asarray(values, dtype=float)
    return np.geomspace(v.min() / pad, v.max() * pad, n)


def plot_fit(result: FitResult, path: str | os.PathLike, title: str = "") -> None:
    """Draw ``result`` (its runs, held-out runs and fitted law) into a PNG at ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter

    law = result.law
    fitted: list[RunPoint] = result.runs
    held = [RunPoint(h["run"], h["N"], h["D"], h["loss"]) for h in result.held_out]

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=100)
    _draw_law_variable(left, result, fitted, held)
    _draw_compute(right, result, fitted, held)
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter("%.2f"))
        ax.set_ylabel("validation loss (nats/token)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=8)
    p = law.params
    exps = ", ".join(f"{k} = {p[k]:.3f}" for k in ("alpha", "beta", "gamma") if k in p)
    fig.suptitle(title or f"{law.formula}: E = {p['E']:.3f}, {exps}", fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    atomic_write_bytes(path, buf.getvalue())


def _medians(runs: list[RunPoint]) -> tuple[np.ndarray, np.ndarray, float, float]:
    """The runs' parameter and token counts, and the median of each."""
    ns = np.array([r.n_params for r in runs])
    ds = np.array([r.n_tokens for r in runs])
    return ns, ds, float(np.median(ns)), float(np.median(ds))


def _scatter_runs(ax, fitted: list[RunPoint], held: list[RunPoint], xs) -> None:
    """The fitted runs as dots, the held-out ones as open markers, at ``xs(runs)``."""
    ax.scatter(xs(fitted), [r.loss for r in fitted], color="C0", zorder=3, label="runs (fitted)")
    if held:
        ax.scatter(
            xs(held),
            [r.loss for r in held],
            facecolors="none",
            edgecolors="C3",
            s=60,
            zorder=3,
            label="held out",
        )


def _draw_law_variable(ax, result: FitResult, fitted: list[RunPoint], held: list[RunPoint]) -> None:
    """Left panel: loss against the law's own variable (N, D or C), with the law."""
    law, form = result.law, result.law.form
    every = fitted + held
    _, ds, n_med, d_med = _medians(every)
    if form == "d":
        xs, label = (lambda rs: [r.n_tokens for r in rs]), "tokens D"
    elif form == "c":
        xs, label = (lambda rs: [r.flops for r in rs]), "training compute C = 6ND (FLOPs)"
    else:
        xs, label = (lambda rs: [r.n_params for r in rs]), f"parameters N ({result.count})"
    _scatter_runs(ax, fitted, held, xs)
    grid = _grid(xs(every))
    if form == "chinchilla":
        reps = distinct_values(ds)
        if len(reps) > MAX_CURVES:
            reps = [reps[i] for i in np.linspace(0, len(reps) - 1, MAX_CURVES).round().astype(int)]
        for i, d in enumerate(reps):
            ax.plot(grid, law.predict(grid, d), color=f"C{i + 1}", linewidth=1, label=f"fit, D = {d:.3g}")
    elif form == "n":
        ax.plot(grid, law.predict(grid, d_med), color="C1", label=f"fit: {law.formula}")
    elif form == "d":
        ax.plot(grid, law.predict(n_med, grid), color="C1", label=f"fit: {law.formula}")
    else:
        ax.plot(grid, law.predict(grid / 6.0, 1.0), color="C1", label=f"fit: {law.formula}")
    ax.set_xlabel(label)


def _draw_compute(ax, result: FitResult, fitted: list[RunPoint], held: list[RunPoint]) -> None:
    """Right panel: loss against training compute, with the law along the runs or its frontier."""
    law, form = result.law, result.law.form
    every = fitted + held
    ns, ds, n_med, d_med = _medians(every)
    _scatter_runs(ax, fitted, held, lambda rs: [r.flops for r in rs])
    cgrid = _grid([r.flops for r in every])
    if form == "chinchilla":
        n_opt, d_opt = law.compute_optimal(cgrid)
        ax.plot(cgrid, law.predict(n_opt, d_opt), color="C1", label="fit: compute-optimal frontier")
    elif form == "c":
        ax.plot(cgrid, law.predict(cgrid / 6.0, 1.0), color="C1", label=f"fit: {law.formula}")
    elif form == "n" and len(distinct_values(ds)) == 1:
        ax.plot(
            cgrid, law.predict(cgrid / (6.0 * d_med), d_med), color="C1", label=f"fit at D = {d_med:.3g}"
        )
    elif form == "d" and len(distinct_values(ns)) == 1:
        ax.plot(
            cgrid, law.predict(n_med, cgrid / (6.0 * n_med)), color="C1", label=f"fit at N = {n_med:.3g}"
        )
    ax.set_xlabel("training compute C = 6ND (FLOPs)")

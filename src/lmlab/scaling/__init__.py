"""Scaling: compute-optimal sizing and scaling-law fits (SPEC §6).

>>> from lmlab.scaling import compute_optimal, plan
>>> n, d = compute_optimal(1.2e17)            # C = 6·N·D with D = 20·N
>>> round(n / 1e6, 1), round(d / 1e6)
(31.6, 632)
>>> plan(1.2e17, arch="gpt2").config.n_layers  # doctest: +SKIP

``fit_runs(read_runs(["runs/a", "runs/b", ...])[0])`` fits ``L(N, D) = E + A/N^alpha + B/D^beta``
(or a one-variable form) to training runs; ``plot_fit`` draws it. Parameter and FLOP counts per
model live in :mod:`lmlab.models.flops`.
"""

from lmlab.scaling.fit import FORMS, FitResult, ScalingLaw, choose_form, fit_law, fit_runs
from lmlab.scaling.plan import ARCHS, Plan, compute_optimal, model_shape, plan
from lmlab.scaling.plot import plot_fit
from lmlab.scaling.runs import RunPoint, read_run, read_runs

__all__ = [
    "ARCHS",
    "FORMS",
    "FitResult",
    "Plan",
    "RunPoint",
    "ScalingLaw",
    "choose_form",
    "compute_optimal",
    "fit_law",
    "fit_runs",
    "model_shape",
    "plan",
    "plot_fit",
    "read_run",
    "read_runs",
]

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

from lmlab.lazy import lazy_exports
from lmlab.scaling.forms import FORMS

# ``plan`` (the function) is also a submodule's name: bound here, before any other import of that
# submodule could set the package's attribute to the module, as a lazy name would let it
from lmlab.scaling.plan import ARCHS, Plan, compute_optimal, model_shape, plan
from lmlab.scaling.runs import RunPoint, read_run, read_runs

# imported on first use (numpy): the command-line parser reads the names above without it
__getattr__, __dir__ = lazy_exports(__name__, {
    "fit": ("FitResult", "ScalingLaw", "choose_form", "fit_law", "fit_runs"),
    "plot": ("plot_fit",),
})

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

"""Fitting a scaling law to a series of runs.

The law (Hoffmann et al. 2022, "Training compute-optimal large language models", §3.3, the
Chinchilla form) for a model of ``N`` parameters trained on ``D`` tokens::

    L(N, D) = E + A / N^alpha + B / D^beta

``E`` is the irreducible loss, the two power laws the shortfall of a finite model and of finite
data. With few runs, the one-variable forms (Kaplan et al. 2020, eqs. 1.1-1.3, with an offset):

    n:  L(N) = E + A / N^alpha      runs that share D (model sizes at equal tokens)
    d:  L(D) = E + B / D^beta       one model size at several token counts
    c:  L(C) = E + A / C^gamma      C = 6·N·D, runs that differ in both

The fit follows Chinchilla: parameters in log space (``a = log A``, ``b = log B``, ``e = log E``)
so that ``log L̂ = logsumexp(a - alpha·log N, b - beta·log D, e)``, and the residuals
``log L̂ - log L`` minimised under a Huber loss (``delta = 1e-3``: robust to an odd run) from a
grid of starting points, keeping the best (the problem is not convex). Here the minimiser is
``scipy.optimize.least_squares`` with bounds (``E`` at most the lowest observed loss, exponents
in ``[0.001, 3]``). Each start puts ``E`` at a fraction of the lowest loss and sets ``A`` (and
``B``) so that the law passes through the median run, so every start is of the right scale.

Uncertainty: a bootstrap over runs (refit on runs drawn with replacement), reported as the
standard deviation and the 2.5-97.5 percentiles of each parameter. Held-out check: fit without
the runs of one size and compare the prediction for them with their loss.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np

from lmlab.arguments import describe
from lmlab.errors import LmlabError
from lmlab.scaling.forms import FORMS
from lmlab.scaling.runs import RunPoint
from lmlab.setting_names import KEYWORDS, SettingNames

__all__ = [
    "FORMS",
    "FitResult",
    "ScalingLaw",
    "choose_form",
    "distinct_values",
    "fit_law",
    "fit_runs",
    "holdout",
]

EXPONENT_BOUNDS = (1e-3, 3.0)
#: the most bootstrap refits a fit takes: 1,000 take ~2 s on a CPU core, so 100,000 are minutes and
#: a billion would run for months (beyond ~10,000 the 95% bands do not move)
MAX_BOOTSTRAP = 100_000
#: a bootstrap expected to take longer than this (seconds) reports its estimate and its progress
BOOTSTRAP_REPORT_S = 10.0


@dataclass(frozen=True)
class ScalingLaw:
    """A fitted law: ``form`` (a key of :data:`FORMS`) and its parameters by name."""

    form: str
    params: dict[str, float]

    @property
    def formula(self) -> str:
        return FORMS[self.form][1]

    def predict(self, n_params, n_tokens) -> np.ndarray:
        """Loss the law predicts for ``n_params`` parameters trained on ``n_tokens`` tokens."""
        n, d = np.asarray(n_params, dtype=float), np.asarray(n_tokens, dtype=float)
        p = self.params
        if self.form == "chinchilla":
            return p["E"] + p["A"] / n ** p["alpha"] + p["B"] / d ** p["beta"]
        if self.form == "n":
            return p["E"] + p["A"] / n ** p["alpha"] + 0 * d
        if self.form == "d":
            return p["E"] + p["B"] / d ** p["beta"] + 0 * n
        return p["E"] + p["A"] / (6.0 * n * d) ** p["gamma"]

    def compute_optimal(self, flops) -> tuple[np.ndarray, np.ndarray] | None:
        """Chinchilla form only: ``(N_opt, D_opt)`` minimising ``L`` subject to ``6·N·D = flops``.

        Setting dL/dN = 0 along ``D = C/(6N)`` gives ``N_opt = G·(C/6)^(beta/(alpha+beta))``,
        ``D_opt = G^-1·(C/6)^(alpha/(alpha+beta))`` with ``G = (alpha·A / (beta·B))^(1/(alpha+beta))``
        (Hoffmann et al. 2022, eq. 4).
        """
        if self.form != "chinchilla":
            return None
        p = self.params
        s = p["alpha"] + p["beta"]
        g = (p["alpha"] * p["A"] / (p["beta"] * p["B"])) ** (1.0 / s)
        c6 = np.asarray(flops, dtype=float) / 6.0
        return g * c6 ** (p["beta"] / s), c6 ** (p["alpha"] / s) / g


@dataclass
class FitResult:
    """A fit to runs, with bootstrap spreads and (optionally) a held-out prediction."""

    law: ScalingLaw
    runs: list[RunPoint]
    count: str = "total"
    cost: float = 0.0
    rmse_log: float = 0.0  # root mean square of log L̂ - log L over the runs
    bootstrap: dict[str, dict[str, float]] = field(default_factory=dict)  # name -> std, lo, hi
    held_out: list[dict] = field(default_factory=list)  # runs left out of the fit, with predictions
    at_bounds: list[str] = field(default_factory=list)  # parameters the runs did not pin down

    def to_dict(self) -> dict:
        out = {
            "form": self.law.form,
            "law": self.law.formula,
            "params": self.law.params,
            "parameter_count": self.count,
            "rmse_log_loss": self.rmse_log,
            "bootstrap": self.bootstrap,
            "runs": [_run_dict(r, self.law) for r in self.runs],
            "held_out": self.held_out,
            "at_bounds": self.at_bounds,
        }
        if self.law.form == "chinchilla":
            p = self.law.params
            s = p["alpha"] + p["beta"]
            out["compute_optimal"] = {"N_opt_exponent": p["beta"] / s, "D_opt_exponent": p["alpha"] / s}
        if self.held_out:
            errors = [abs(h["relative_error"]) for h in self.held_out]
            out["held_out_max_relative_error"] = max(errors)
        return out


def _run_dict(r: RunPoint, law: ScalingLaw) -> dict:
    pred = float(law.predict(r.n_params, r.n_tokens))
    return {
        "run": r.name,
        "N": r.n_params,
        "D": r.n_tokens,
        "C": r.flops,
        "loss": r.loss,
        "predicted": pred,
        "relative_error": (pred - r.loss) / r.loss,
    }


# ----------------------------------------------------------------------------- choosing the form


def _spread(values) -> float:
    v = np.asarray(values, dtype=float)
    return float(v.max() / v.min())


def distinct_values(values, rel: float = 0.02) -> list[float]:
    """The values, with any within ``rel`` of a smaller one merged into it (sizes / token counts)."""
    out: list[float] = []
    for v in sorted(values):
        if not out or v > out[-1] * (1 + rel):
            out.append(v)
    return out


def _distinct(values, rel: float = 0.02) -> int:
    return len(distinct_values(values, rel))


def choose_form(runs: list[RunPoint]) -> str:
    """``n`` when the runs share D (within 10%), ``d`` when they share N, ``chinchilla`` when both
    vary over at least 3 values each with a run per parameter and more, else ``c``."""
    ns, ds = [r.n_params for r in runs], [r.n_tokens for r in runs]
    if _spread(ds) <= 1.1:
        return "n"
    if _spread(ns) <= 1.1:
        return "d"
    if _distinct(ns) >= 3 and _distinct(ds) >= 3 and len(runs) > 5:
        return "chinchilla"
    return "c"


def _check_enough(runs: list[RunPoint], form: str) -> None:
    names, formula = FORMS[form]
    if len(runs) < len(names):
        raise LmlabError(
            f"{len(runs)} run(s) cannot determine the {len(names)} parameters of {formula}",
            "add runs, or fit a form with fewer parameters (--form n, d or c)"
            if form == "chinchilla"
            else f"train at least {len(names)} runs (more to judge the fit)",
        )
    variables = {
        "n": [("N", [r.n_params for r in runs])],
        "d": [("D", [r.n_tokens for r in runs])],
        "c": [("C", [r.flops for r in runs])],
        "chinchilla": [("N", [r.n_params for r in runs]), ("D", [r.n_tokens for r in runs])],
    }[form]
    for var, values in variables:
        if _distinct(values) < 3:
            raise LmlabError(
                f"{formula} needs runs at 3 or more different values of {var}, got {_distinct(values)}",
                "add runs at other sizes / token counts, or pick another --form",
            )


# ----------------------------------------------------------------------------- the fit


def _columns(runs: list[RunPoint], form: str) -> list[np.ndarray]:
    """log of the variable(s) each power-law term reads."""
    n = np.log([r.n_params for r in runs])
    d = np.log([r.n_tokens for r in runs])
    return {"chinchilla": [n, d], "n": [n], "d": [d], "c": [np.log(6.0) + n + d]}[form]


def _terms(theta: np.ndarray, cols: list[np.ndarray]) -> np.ndarray:
    """Rows e, a_1 - k_1 x_1, a_2 - k_2 x_2, ... for theta = (e, a_1, k_1, a_2, k_2, ...)."""
    terms = [np.full_like(cols[0], theta[0])]
    terms += [theta[1 + 2 * i] - theta[2 + 2 * i] * x for i, x in enumerate(cols)]
    return np.stack(terms)


def _log_predict(theta: np.ndarray, cols: list[np.ndarray]) -> np.ndarray:
    """log L̂ = logsumexp of :func:`_terms`."""
    return np.logaddexp.reduce(_terms(theta, cols), axis=0)


def _jacobian(theta: np.ndarray, cols: list[np.ndarray]) -> np.ndarray:
    """d log L̂ / d theta: the softmax weight w of each term, times -x for an exponent."""
    t = _terms(theta, cols)
    w = np.exp(t - np.logaddexp.reduce(t, axis=0))
    jac = [w[0]]
    for i, x in enumerate(cols):
        jac += [w[1 + i], -w[1 + i] * x]
    return np.stack(jac, axis=1)


def _bounds(cols: list[np.ndarray], log_loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    lo, hi = [float(log_loss.min()) - 25.0], [float(log_loss.min())]
    for x in cols:
        lo += [-50.0, EXPONENT_BOUNDS[0]]
        hi += [float(log_loss.max()) + 5.0 + EXPONENT_BOUNDS[1] * float(np.abs(x).max()), EXPONENT_BOUNDS[1]]
    return np.array(lo), np.array(hi)


def _starts(cols: list[np.ndarray], loss: np.ndarray) -> list[np.ndarray]:
    """Starting points: E at fractions of the lowest loss, exponents on a grid, each term's scale set
    so the law passes through the median run (the excess over E shared equally between terms)."""
    exps = (0.1, 0.3, 0.6, 1.0) if len(cols) == 2 else (0.05, 0.15, 0.3, 0.6, 1.0, 1.6)
    fracs = (0.0, 0.5, 0.9) if len(cols) == 2 else (0.0, 0.3, 0.6, 0.9, 0.98)
    lmin, lmed = float(loss.min()), float(np.median(loss))
    meds = [float(np.median(x)) for x in cols]
    out = []
    for frac in fracs:
        e = max(frac * lmin, 1e-6 * lmin)
        excess = max(lmed - e, 1e-3 * lmed) / len(cols)
        for ks in itertools.product(exps, repeat=len(cols)):
            theta = [math.log(e)]
            for k, m in zip(ks, meds):
                theta += [math.log(excess) + k * m, k]
            out.append(np.array(theta))
    return out


def _solve(cols, log_loss, starts, delta: float, refine: int = 3):
    """Least squares from every start (fast to converge), then the Huber loss from the ``refine``
    best of them (Huber's near-L1 tail converges slowly, so it starts close to the optimum)."""
    from scipy.optimize import least_squares

    lo, hi = _bounds(cols, log_loss)

    def run(x0, loss: str, max_nfev: int):
        return least_squares(
            lambda t: _log_predict(t, cols) - log_loss,
            np.clip(x0, lo + 1e-9, hi - 1e-9),
            jac=lambda t: _jacobian(t, cols),
            bounds=(lo, hi),
            method="trf",
            loss=loss,
            f_scale=delta if loss == "huber" else 1.0,
            x_scale="jac",
            max_nfev=max_nfev,
        )

    first = sorted((run(x0, "linear", 200) for x0 in starts), key=lambda r: r.cost)
    if delta <= 0:
        return first[0]
    return min((run(r.x, "huber", 1000) for r in first[:refine]), key=lambda r: r.cost)


def _at_bounds(runs: list[RunPoint], form: str, theta: np.ndarray) -> list[str]:
    """Names of the parameters that ended on a bound of the search, and E if it went to ~0 (below
    0.1% of the lowest loss: the runs fit a pure power law as well)."""
    log_loss = np.log([r.loss for r in runs])
    lo, hi = _bounds(_columns(runs, form), log_loss)
    hit = np.isclose(theta, lo, rtol=0, atol=1e-4) | np.isclose(theta, hi, rtol=0, atol=1e-4)
    hit[0] |= theta[0] < log_loss.min() + math.log(1e-3)
    return [name for name, h in zip(FORMS[form][0], hit) if h]


def _law_from_theta(form: str, theta: np.ndarray) -> ScalingLaw:
    names = FORMS[form][0]
    values = [math.exp(theta[0])]
    for i in range(1, len(theta), 2):
        values += [math.exp(theta[i]), float(theta[i + 1])]
    return ScalingLaw(form, {k: float(v) for k, v in zip(names, values)})


def _require_scipy() -> None:
    try:
        import scipy.optimize  # noqa: F401
    except ImportError:
        raise LmlabError("fitting a scaling law needs scipy", "pip install scipy") from None


def fit_law(
    runs: list[RunPoint], form: str = "auto", huber_delta: float = 1e-3
) -> tuple[ScalingLaw, float, np.ndarray]:
    """Fit ``form`` (or the one :func:`choose_form` picks) to ``runs``; return the law, the final
    robust cost and the parameter vector in log space."""
    _require_scipy()
    if not runs:
        raise LmlabError("no runs to fit", "pass the run directories of lmlab pretrain")
    form = choose_form(runs) if form == "auto" else form
    if form not in FORMS:
        raise LmlabError(f"unknown scaling-law form {form!r}", f"choose one of: auto, {', '.join(FORMS)}")
    _check_enough(runs, form)
    cols = _columns(runs, form)
    log_loss = np.log([r.loss for r in runs])
    res = _solve(cols, log_loss, _starts(cols, np.exp(log_loss)), huber_delta)
    return _law_from_theta(form, res.x), float(res.cost), res.x


def check_bootstrap(samples, what: str = "--bootstrap") -> None:
    """The bootstrap count's rule, for the CLI's ``--bootstrap`` and :func:`fit_runs` alike (``what``
    names it): a whole number (:data:`lmlab.values.Size`) from 0 (off) to :data:`MAX_BOOTSTRAP`,
    checked before any run is read or refit."""
    from lmlab import values
    from lmlab.arguments import number_argument

    samples = number_argument(values.Size, int(samples) if isinstance(samples, np.integer) else samples, what)
    if samples > MAX_BOOTSTRAP:
        raise LmlabError(f"bootstrap {samples:,} refits is more than the {MAX_BOOTSTRAP:,} lmlab runs "
                         "(1,000 take about 2 s; the 95% bands settle long before)",
                         f"pass --bootstrap {MAX_BOOTSTRAP} or fewer, e.g. --bootstrap 1000")


def _bootstrap(runs, form, theta, huber_delta, samples: int, seed: int,
               log=None) -> dict[str, dict[str, float]]:
    """Refit on ``samples`` resamples of the runs (with replacement), each started from the full fit
    and from the grid's middle start; resamples with too few distinct runs are skipped. ``log``
    hears, for a bootstrap that will take over :data:`BOOTSTRAP_REPORT_S`, the estimate once the
    first refits are timed and then every tenth of the way."""
    import time

    from lmlab.train.estimate import duration

    rng = np.random.default_rng(seed)
    names = FORMS[form][0]
    fits = []
    start, report, next_share = time.perf_counter(), False, 0.1
    for i in range(samples):
        if log is not None and i == 20:  # the first refits timed
            per = (time.perf_counter() - start) / i
            if per * samples > BOOTSTRAP_REPORT_S:
                report = True
                log(f"bootstrap: {samples:,} refits, about {duration(per * samples)} "
                    f"({per * 1000:.1f} ms each; --bootstrap sets the count)")
        if report and i >= next_share * samples:
            elapsed = time.perf_counter() - start
            log(f"bootstrap: {i:,}/{samples:,} refits, {duration(elapsed / i * (samples - i))} left")
            next_share = math.floor(i / samples * 10 + 1) / 10
        pick = [runs[i] for i in rng.integers(0, len(runs), len(runs))]
        try:
            _check_enough(list({id(r): r for r in pick}.values()), form)
        except LmlabError:
            continue
        cols = _columns(pick, form)
        log_loss = np.log([r.loss for r in pick])
        grid = _starts(cols, np.exp(log_loss))
        res = _solve(cols, log_loss, [theta, grid[len(grid) // 2]], huber_delta, refine=1)
        law = _law_from_theta(form, res.x)
        fits.append([law.params[k] for k in names])
    if len(fits) < 10:
        return {}
    arr = np.array(fits)
    return {
        k: {
            "std": float(arr[:, i].std(ddof=1)),
            "lo": float(np.percentile(arr[:, i], 2.5)),
            "hi": float(np.percentile(arr[:, i], 97.5)),
            "samples": len(fits),
        }
        for i, k in enumerate(names)
    }


def holdout(runs: list[RunPoint], which: str,
            names: SettingNames = KEYWORDS) -> tuple[list[RunPoint], list[RunPoint]]:
    """Split ``runs`` into (fit, held out): ``which`` is ``largest`` / ``smallest`` (every run of
    the largest / smallest N) or the name of a run (every run of that run's N)."""
    sizes = sorted({r.n_params for r in runs})
    if which == "largest":
        size = sizes[-1]
    elif which == "smallest":
        size = sizes[0]
    else:
        named = [r for r in runs if r.name.rstrip("/") == which.rstrip("/")]
        if not named:
            raise LmlabError(
                f"{names.setting('hold_out', [which])} is none of the runs",
                "pass largest, smallest or one of the run directories given",
            )
        size = named[0].n_params
    out = [r for r in runs if r.n_params == size]
    return [r for r in runs if r.n_params != size], out


def fit_runs(
    runs: list[RunPoint],
    form: str = "auto",
    count: str = "total",
    huber_delta: float = 1e-3,
    bootstrap: int = 100,
    seed: int = 0,
    hold_out: str | None = None,
    log=None,
    names: SettingNames = KEYWORDS,
) -> FitResult:
    """Fit a law to ``runs`` (minus the held-out size, if any), with bootstrap spreads and the
    held-out runs' predicted loss and relative error ``(predicted - actual) / actual``.
    ``bootstrap``: refits, 0 to :data:`MAX_BOOTSTRAP` (:func:`check_bootstrap`); ``log`` hears the
    estimate and progress of a long bootstrap; ``names``: how the caller names its settings in errors
    (:class:`lmlab.setting_names.SettingNames`: ``hold_out``, or ``--holdout`` for ``lmlab scale fit``)."""
    if not isinstance(runs, (list, tuple)) or not all(isinstance(r, RunPoint) for r in runs):
        listed = isinstance(runs, (list, tuple))
        bad = [r for r in runs if not isinstance(r, RunPoint)][0] if listed else runs
        raise LmlabError(f"fit_runs' runs must be a list of RunPoint, got {describe(bad)}",
                         "pass e.g. [RunPoint('a', 1e6, 2e7, 3.2), ...], or read_runs([run dirs])[0]")
    check_bootstrap(bootstrap, "fit_runs' bootstrap")
    held: list[RunPoint] = []
    if hold_out:
        runs, held = holdout(runs, hold_out, names)
        if form == "auto" and runs:
            form = choose_form(runs + held)  # the form of the whole series, fitted without the held-out
    try:
        law, cost, theta = fit_law(runs, form, huber_delta)
    except LmlabError as e:
        if not held:
            raise
        raise LmlabError(f"without the held-out runs, {e.problem}", e.fix) from None
    pred = np.log(law.predict([r.n_params for r in runs], [r.n_tokens for r in runs]))
    rmse = float(np.sqrt(np.mean((pred - np.log([r.loss for r in runs])) ** 2)))
    boot = _bootstrap(runs, law.form, theta, huber_delta, bootstrap, seed, log) if bootstrap > 0 else {}
    held_rows = [_run_dict(r, law) for r in held]
    return FitResult(law, runs, count, cost, rmse, boot, held_rows, _at_bounds(runs, law.form, theta))

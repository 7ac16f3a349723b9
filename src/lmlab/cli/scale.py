"""`lmlab scale plan` and `lmlab scale fit`: compute-optimal sizing and scaling-law fits (docs/scaling.md)."""

from __future__ import annotations

import math
import sys

from lmlab.cli.common import add_command, add_group
from lmlab.values import (
    Flops,
    HuberDelta,
    Ratio,
    VocabSize,
    count_flag,
    flag,
    path_flag,
    seed_flag,
    size_flag,
    text_flag,
)

PLAN_DESCRIPTION = """\
Compute-optimal model size N and training tokens D for a FLOPs budget C, by C = 6·N·D with
D = 20·N (Hoffmann et al. 2022, Chinchilla), so N = sqrt(C / 120). Then a concrete shape of the
--arch family (its aspect ratio d_model/n_layers, 64-dimensional heads, its d_ff ratio) whose
parameter count is closest to N, with its exact training FLOPs on D tokens: matmuls, the attention
products that 6·N·D leaves out (~12·L·T·d per token) and the tokens that spend exactly C."""

PLAN_EXAMPLES = """\
  lmlab scale plan --flops 1.2e17
  lmlab scale plan --flops 1e18 --arch llama --vocab-size 8000 --seq-len 512
  lmlab scale plan --flops 3e15 --arch bert --tokens-per-param 40 --json"""

FIT_DESCRIPTION = """\
Fit a scaling law to a series of runs of `lmlab pretrain` (each RUN_DIR's final validation loss,
parameter count N and training tokens D): L(N, D) = E + A/N^alpha + B/D^beta (Chinchilla) when
both N and D vary enough, else L(N) = E + A/N^alpha (runs at equal tokens), L(D) or L(C) with
C = 6·N·D. Least squares in log space under a Huber loss (Chinchilla's fit) from a grid of starts,
with bootstrap spreads of the parameters. --holdout leaves one size out of the fit and reports
how well the law predicts it. Writes OUT/fit.json and OUT/fit.png (loss vs N and vs compute)."""

FIT_EXAMPLES = """\
  lmlab scale fit runs/gpt-d32 runs/gpt-d64 runs/gpt-d128 runs/gpt-d256 --out fit/
  lmlab scale fit runs/ --holdout largest          # every run directory inside runs/
  lmlab scale fit runs/* --form chinchilla --params total --bootstrap 200"""


def register(sub) -> None:
    _, ssub = add_group(
        sub,
        "scale",
        "compute-optimal sizing and scaling-law fits",
        "Scaling laws. Run `lmlab scale COMMAND --help` for details.",
    )
    _register_plan(ssub)
    _register_fit(ssub)


def _register_plan(ssub) -> None:
    """`lmlab scale plan`: compute-optimal model size and tokens for a FLOPs budget."""
    from lmlab.scaling.plan import ARCHS

    p = add_command(
        ssub,
        "plan",
        "compute-optimal model size and tokens for a FLOPs budget",
        PLAN_DESCRIPTION,
        PLAN_EXAMPLES,
    )
    p.add_argument(
        "--flops", type=flag(Flops), required=True, metavar="C", help="training budget in FLOPs, e.g. 1e18"
    )
    p.add_argument("--arch", choices=ARCHS, default="gpt2", help="model family of the concrete shape")
    p.add_argument(
        "--tokens-per-param",
        type=flag(Ratio),
        default=20.0,
        metavar="R",
        help="training tokens per parameter (Chinchilla: ~20)",
    )
    p.add_argument(
        "--vocab-size",
        type=flag(VocabSize),
        default=None,
        metavar="V",
        help="vocabulary of the shape (default: the family's -base preset's)",
    )
    p.add_argument(
        "--seq-len",
        type=count_flag,
        default=None,
        metavar="T",
        help="training context (default: the family's -base preset's positions)",
    )
    p.add_argument(
        "--aspect-ratio",
        type=flag(Ratio),
        default=None,
        metavar="R",
        help="d_model / n_layers of the shape (default: the family's -base preset's, 64)",
    )
    p.add_argument(
        "--count",
        choices=("total", "non-embedding"),
        default="total",
        help="which parameters N counts: all (Chinchilla) or non-embedding (Kaplan)",
    )
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run_plan)


def _register_fit(ssub) -> None:
    """`lmlab scale fit`: a scaling law fitted to a series of runs."""
    from lmlab.scaling.forms import FORMS
    from lmlab.scaling.runs import COUNTS

    f = add_command(ssub, "fit", "fit a scaling law to a series of runs", FIT_DESCRIPTION, FIT_EXAMPLES)
    f.add_argument(
        "runs",
        nargs="*",
        type=path_flag,
        metavar="RUN_DIR",
        help="run directories of lmlab pretrain (a directory of run directories stands for all)",
    )
    f.add_argument("--out", type=path_flag, default="scaling-fit", metavar="DIR",
                   help="where fit.json and fit.png go")
    f.add_argument(
        "--form",
        choices=("auto", *FORMS),
        default="auto",
        help="the law: chinchilla L(N,D), n L(N), d L(D), c L(C); auto picks from the runs",
    )
    f.add_argument(
        "--params",
        choices=COUNTS,
        default="auto",
        help="N counts non-embedding (Kaplan) or total parameters; auto: non-embedding when "
        "every run has a checkpoint config",
    )
    f.add_argument(
        "--holdout",
        type=text_flag,
        default=None,
        metavar="WHICH",
        help="leave out of the fit every run of one size and predict it: largest, smallest or a RUN_DIR",
    )
    f.add_argument(
        "--bootstrap", type=size_flag, default=100, metavar="B", help="bootstrap refits for spreads (0 = off)"
    )
    f.add_argument(
        "--huber-delta",
        type=flag(HuberDelta),
        default=1e-3,
        metavar="DELTA",
        help="Huber loss threshold on log-loss residuals (Chinchilla: 1e-3; 0 = plain least squares)",
    )
    f.add_argument("--seed", type=seed_flag, default=0, help="seed of the bootstrap resampling")
    f.set_defaults(func=run_fit)


# ----------------------------------------------------------------------------- formatting


def human(x: float) -> str:
    """3 significant figures with a K / M / B / T suffix: 31622777 -> '31.6M'."""
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%"


# ----------------------------------------------------------------------------- plan


def run_plan(args) -> int:
    import json

    from lmlab.scaling.plan import plan

    p = plan(
        args.flops,
        arch=args.arch,
        tokens_per_param=args.tokens_per_param,
        vocab_size=args.vocab_size,
        seq_len=args.seq_len,
        aspect_ratio=args.aspect_ratio,
        count=args.count,
    )
    if args.json:
        print(json.dumps(p.to_dict(), indent=2))
        return 0
    c, r = p.config, p.tokens_per_param
    rows = [
        ("budget C", f"{p.flops:.3g} FLOPs"),
        ("compute-optimal N", f"{human(p.n_params)} parameters ({p.n_params:,.0f} = sqrt(C / (6 x {r:g})))"),
        ("compute-optimal D", f"{human(p.n_tokens)} tokens ({p.n_tokens:,.0f} = {r:g} x N)"),
        ("", ""),
        (
            f"shape ({p.arch})",
            f"d_model {c.d_model}, n_layers {c.n_layers}, n_heads {c.n_heads}"
            + (f" ({c.kv_heads} key/value)" if c.kv_heads != c.n_heads else "")
            + f", d_ff {c.d_ff}, vocabulary {c.vocab_size:,}, context {p.seq_len:,}",
        ),
        (
            "parameters",
            f"{human(p.total_params)} total = {human(p.embedding_params)} embedding + "
            f"{human(p.total_params - p.embedding_params)} non-embedding ({p.total_params:,})",
        ),
        (f"vs N ({p.count})", f"{_pct(p.shape_params / p.n_params - 1)}"),
        ("", ""),
        ("training FLOPs on D", ""),
        ("  6·N·D", f"{6 * p.n_params * p.n_tokens:.3g}  (= C)"),
        ("  matmuls, exact", f"{p.matmul_flops:.3g}"),
        ("  attention products", f"{p.attention_flops:.3g}  ({100 * p.attention_flops / p.flops:.1f}% of C)"),
        ("  total, exact", f"{p.exact_flops:.3g}  ({p.exact_flops / p.flops:.2f} x C)"),
        ("  6·N'·D + 12·L·T·d·D", f"{p.approx_flops:.3g}  (N' = matmul parameters)"),
        ("tokens for exactly C", f"{human(p.tokens_for_budget)} with this shape"),
    ]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}".rstrip())
    if p.count == "total" and p.embedding_params > p.n_params:
        print(
            f"note: the embeddings alone ({human(p.embedding_params)}) exceed N; pass a smaller "
            f"--vocab-size or --count non-embedding"
        )
    elif abs(math.log(p.shape_params / p.n_params)) > math.log(1.25):
        print("note: no shape of this family is within 25% of N; try another --aspect-ratio")
    return 0


# ----------------------------------------------------------------------------- fit


#: what `lmlab scale fit` writes in its --out folder (lmlab.ownership.claim_dir)
FIT_KIND = "scaling fit"
FIT_ENTRIES = ("fit.json", "fit.png")


def run_fit(args) -> int:
    from lmlab.fileio import write_json
    from lmlab.ownership import claim_dir, claimed_dir
    from lmlab.scaling.fit import check_bootstrap, fit_runs
    from lmlab.scaling.plot import plot_fit
    from lmlab.scaling.runs import read_runs
    from lmlab.setting_names import SettingNames

    check_bootstrap(args.bootstrap)  # before the runs are read
    # OUT holds fit.json and fit.png: new, empty or an earlier fit's folder, never a user's or a run's
    claim_dir(args.out, FIT_KIND, FIT_ENTRIES, create=False)  # checked now, made when there is a fit
    runs, count = read_runs(args.runs, args.params)
    result = fit_runs(
        runs,
        form=args.form,
        count=count,
        huber_delta=args.huber_delta,
        bootstrap=args.bootstrap,
        seed=args.seed,
        hold_out=args.holdout,
        log=lambda line: print(line, file=sys.stderr, flush=True),
        names=SettingNames("flag", flags={"hold_out": "--holdout"}),
    )
    law = result.law
    data = result.to_dict()

    print(f"runs (N = {count} parameters, C = 6·N·D):")
    table = [("run", "N", "D", "C", "loss", "fit")]
    for row in data["runs"] + data["held_out"]:
        held = " (held out)" if row in data["held_out"] else ""
        table.append(
            (
                row["run"] + held,
                human(row["N"]),
                human(row["D"]),
                f"{row['C']:.3g}",
                f"{row['loss']:.4f}",
                f"{row['predicted']:.4f}",
            )
        )
    widths = [max(len(t[i]) for t in table) for i in range(6)]
    for t in table:
        print(
            "  " + "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(t, widths)))
        )

    print(f"fit: {law.formula}  (form {law.form}, {len(result.runs)} runs)")
    for k, v in law.params.items():
        b = result.bootstrap.get(k)
        spread = f"  (bootstrap 95%: {b['lo']:.4g} .. {b['hi']:.4g})" if b else ""
        print(f"  {k:<6} = {v:.4g}{spread}")
    print(f"  rms error of log loss: {result.rmse_log:.4f} ({100 * result.rmse_log:.2f}%)")
    for k in result.at_bounds:
        print(
            f"  note: {k} ended on a bound of the search: these runs do not pin it down"
            + (" (E -> 0: a pure power law fits as well)" if k == "E" else "")
        )
    if "compute_optimal" in data:
        co = data["compute_optimal"]
        print(
            f"  compute-optimal: N_opt ∝ C^{co['N_opt_exponent']:.3f}, D_opt ∝ C^{co['D_opt_exponent']:.3f}"
        )
    if result.held_out:
        for h in result.held_out:
            ok = "within 5%" if abs(h["relative_error"]) <= 0.05 else "NOT within 5%"
            print(
                f"held out {h['run']} (N = {human(h['N'])}): predicted {h['predicted']:.4f}, "
                f"actual {h['loss']:.4f}, error {_pct(h['relative_error'])} ({ok})"
            )
        data["held_out_within_5_percent"] = data["held_out_max_relative_error"] <= 0.05
    with claimed_dir(args.out, FIT_KIND, FIT_ENTRIES) as out:
        write_json(out / "fit.json", data)
        plot_fit(result, out / "fit.png")
    print(f"wrote {out / 'fit.json'} and {out / 'fit.png'}")
    return 0

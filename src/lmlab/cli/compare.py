"""`lmlab compare`: a grid of pretraining runs under one budget, fine-tuned and tabulated (docs/lab.md)."""

from __future__ import annotations

import json
from pathlib import Path

from lmlab.cli.common import add_command
from lmlab.values import path_flag

DESCRIPTION = """\
Compare architectures, objectives and sizes on equal compute. The grid file names arms (a model
preset with a pretraining objective, or objective "none" for a model trained from scratch on the
tasks), sizes, seeds, one budget per pretraining run in tokens or FLOPs, one corpus and tokenizer,
and the downstream tasks. Every run is pretrained with the same settings, fine-tuned on every task,
and the results are written as OUT/results.md, results.csv, runs.csv, results.json,
loss_vs_compute.png and downstream.png. Runs are cached by their settings: re-running the command
trains only what is missing, and an interrupted run resumes from its last checkpoint. The whole grid
is checked before anything trains."""

EXAMPLES = """\
  lmlab compare --config configs/grids/objectives-tiny.toml --dry-run
  lmlab compare --config configs/grids/objectives-tiny.toml --out runs/compare/objectives
  lmlab compare --config configs/grids/sst2-pretraining.toml --out runs/compare/sst2
  lmlab compare --config configs/grids/objectives-tiny.toml --set budget.tokens=40960 seeds=[0]
  lmlab compare --config configs/grids/objectives-tiny.toml --logger tensorboard --logger wandb"""


def register(sub) -> None:
    p = add_command(
        sub, "compare", "compare objectives/architectures under one budget", DESCRIPTION, EXAMPLES
    )
    p.add_argument("--config", type=path_flag, required=True, help="grid TOML file (see configs/grids/)")
    p.add_argument("--out", type=path_flag, help="output directory (default: runs/compare/<grid name>)")
    p.add_argument("--dry-run", action="store_true", help="check the grid and print the plan; train nothing")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="train nothing: write the report (results.md, CSV, plots) from the runs finished so far",
    )
    p.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=[],
        metavar="KEY=VALUE",
        dest="overrides",
        help="override grid keys, e.g. budget.tokens=40960 pretrain.train.lr=1e-3",
    )
    p.add_argument(
        "--logger",
        action="append",
        default=[],
        dest="loggers",
        choices=("tensorboard", "wandb"),
        metavar="NAME",
        help="also log every pretraining and fine-tuning run to NAME (tensorboard, wandb), in the run's "
        "directory; repeatable (the same as --set pretrain.train.loggers=[...] finetune.loggers=[...])",
    )
    p.add_argument(
        "--progress",
        choices=("auto", "on", "off"),
        default="auto",
        help="the progress bar over runs (auto: when stderr is a terminal)",
    )
    p.set_defaults(func=run)


def default_out(name: str) -> Path:
    """``--out``'s default: ``runs/compare/<grid name>``."""
    return Path("runs") / "compare" / name


def run(args) -> int:
    from lmlab.lab import load_grid, run_grid

    overrides = list(args.overrides)
    if args.loggers:
        names = json.dumps(args.loggers)
        overrides += [f"pretrain.train.loggers={names}", f"finetune.loggers={names}"]
    # the folder the grid runs in (a cache inside its own cache is its own): --out, or one named
    # after the grid (its name as --set leaves it)
    grid = load_grid(args.config, overrides, out=args.out or default_out)
    out = Path(args.out) if args.out else default_out(grid.name)
    progress = None if args.progress == "auto" else args.progress == "on"
    result = run_grid(grid, out, dry_run=args.dry_run, report_only=args.report_only, progress=progress)
    if not args.dry_run and "markdown" in result.report:
        print(result.report["markdown"].read_text(encoding="utf-8"), end="")
    return 0

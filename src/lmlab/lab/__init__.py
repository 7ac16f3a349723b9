"""The lab: fair comparisons of architectures and objectives under one compute budget.

>>> from lmlab.lab import load_grid, run_grid
>>> grid = load_grid("configs/grids/objectives-tiny.toml")     # checks everything, trains nothing
>>> result = run_grid(grid, "runs/compare/objectives-tiny")     # doctest: +SKIP
>>> print((result.out / "results.md").read_text())               # doctest: +SKIP

``grid`` parses and validates a grid and plans its runs (budget -> steps via
:mod:`lmlab.models.flops`, run keys); ``runner`` trains what is missing (``lmlab.train.pretrain``,
then ``lmlab.finetune.finetune``) with caching and resume; ``report`` turns finished runs into a
table (Markdown, CSV) and plots. ``lmlab compare`` is the command line.
"""

from lmlab.lab.grid import MIN_STEPS, NONE, Budget, Grid, flops_per_step, load_grid, steps_for_budget
from lmlab.lab.report import aggregate, markdown_table, write_report
from lmlab.lab.runner import GridRun, run_grid

__all__ = [
    "MIN_STEPS",
    "NONE",
    "Budget",
    "Grid",
    "GridRun",
    "aggregate",
    "flops_per_step",
    "load_grid",
    "markdown_table",
    "run_grid",
    "steps_for_budget",
    "write_report",
]

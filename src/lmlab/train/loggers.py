"""Where a run's numbers go besides ``metrics.jsonl``: ``train.loggers`` (pretraining, and the
lab's runs) and ``loggers`` (fine-tuning).

* ``tensorboard``: every metrics row as TensorBoard scalars, one tag per number (``loss``,
  ``lr``, ``grad_norm``, ``tokens_per_s``, ``mfu``, ``val_loss``, the objective's signals...; the
  step is the optimizer step), in ``RUN_DIR/tensorboard/`` (``tensorboard --logdir RUN_DIR``).
  A resumed run drops the events logged after its checkpoint, as it drops those rows of
  ``metrics.jsonl``. Needs the ``logs`` extra (``pip install 'lmlab[logs]'``).

A logger is any object with ``log(row, step)`` and ``close()``; :data:`LOGGERS` maps a name to
the class that makes it from a directory (and, on resume, the step to continue after).
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError

DIRECTORY = "tensorboard"


class TensorBoardLogger:
    def __init__(self, directory: str | Path, resume_after: int | None = None):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events from a killed run's steps beyond the checkpoint are discarded
        purge = None if resume_after is None else resume_after + 1
        self.writer = SummaryWriter(str(directory), purge_step=purge)

    def log(self, row: dict[str, Any], step: int) -> None:
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool):
                if math.isfinite(value):
                    self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


#: name -> (class, the module it needs, the extra that installs it)
LOGGERS = {"tensorboard": (TensorBoardLogger, "tensorboard", "logs")}


def check_loggers(names: Sequence[str], where: str) -> None:
    """One-line errors, before any work, for an unknown logger or one whose package is missing."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise LmlabError(f"{where} must be a list of logger names, got {names!r}",
                         'write e.g. loggers = ["tensorboard"]')
    for name in names:
        if name not in LOGGERS:
            raise LmlabError(f"unknown logger {name!r} in {where}", f"use some of: {', '.join(LOGGERS)}")
        _, module, extra = LOGGERS[name]
        if importlib.util.find_spec(module) is None:
            raise LmlabError(f"logger {name!r} needs the {module} package", f"pip install 'lmlab[{extra}]'")


def open_loggers(names: Sequence[str], directory: str | Path, resume_after: int | None = None) -> list:
    """The loggers ``names``, writing under ``directory`` (each in its own sub-directory)."""
    check_loggers(names, "loggers")
    return [LOGGERS[name][0](Path(directory) / DIRECTORY, resume_after) for name in names]

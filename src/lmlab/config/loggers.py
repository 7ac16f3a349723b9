"""The metrics loggers a run may name (``train.loggers``, ``finetune.loggers``), checked with the
rest of its config: an unknown name, or one whose package is missing, is one line before any work."""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from lmlab.errors import LmlabError

#: logger name -> (the module it needs, the extra that installs it); the loggers are lmlab.train.loggers
LOGGER_PACKAGES = {"tensorboard": ("tensorboard", "logs"), "wandb": ("wandb", "logs")}


def check_loggers(names: Sequence[str], where: str) -> None:
    """One-line errors, before any work, for an unknown logger or one whose package is missing."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise LmlabError(f"{where} must be a list of logger names, got {names!r}",
                         'write e.g. loggers = ["tensorboard"]')
    for name in names:
        if name not in LOGGER_PACKAGES:
            raise LmlabError(f"unknown logger {name!r} in {where}",
                             f"use some of: {', '.join(LOGGER_PACKAGES)}")
        module, extra = LOGGER_PACKAGES[name]
        if importlib.util.find_spec(module) is None:
            raise LmlabError(f"logger {name!r} needs the {module} package", f"pip install 'lmlab[{extra}]'")

"""Where a run's numbers go besides ``metrics.jsonl``: ``train.loggers`` (pretraining, and the
lab's runs) and ``loggers`` (fine-tuning).

* ``tensorboard``: every metrics row as TensorBoard scalars, one tag per number (``loss``,
  ``lr``, ``grad_norm``, ``tokens_per_s``, ``mfu``, ``val_loss``, the objective's signals...; the
  step is the optimizer step), in ``RUN_DIR/tensorboard/`` (``tensorboard --logdir RUN_DIR``).
  A resumed run drops the events logged after its checkpoint, as it drops those rows of
  ``metrics.jsonl``. Needs the ``logs`` extra (``pip install 'lmlab[logs]'``).
* ``wandb``: the same scalars as a Weights & Biases run (its ``_step`` is the optimizer step), in
  ``RUN_DIR/wandb/``. Offline unless ``WANDB_MODE`` says otherwise (``wandb sync RUN_DIR/wandb/
  offline-run-*`` uploads it later). The run id is kept in ``RUN_DIR/wandb/lmlab-run.json``: a
  resumed run continues the same W&B run, and when the killed process may have logged steps past
  the checkpoint, it rewinds the run there (``resume_from="ID?_step=N"``) so no step is counted
  twice. Needs the ``logs`` extra too.

A logger is any object with ``log(row, step)`` and ``close()``; :data:`LOGGERS` maps a name to
the class that makes it from the run's directory (and, on resume, the step to continue after).
Each writes into its own sub-directory of the run, ``DIRECTORY``.
"""

from __future__ import annotations

import math
import os
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmlab import ownership
from lmlab.config.loggers import LOGGER_PACKAGES, check_loggers  # noqa: F401 (offered here too)
from lmlab.errors import LmlabError
from lmlab.fileio import read_json, write_json


def scalars(row: dict[str, Any]) -> dict[str, float]:
    """The finite numbers of a metrics row, less its ``step``."""
    return {key: value for key, value in row.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value)}


class TensorBoardLogger:
    DIRECTORY = "tensorboard"

    def __init__(self, run_dir: str | Path, resume_after: int | None = None, name: str | None = None,
                 config: dict[str, Any] | None = None):
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: events from a killed run's steps beyond the checkpoint are discarded
        purge = None if resume_after is None else resume_after + 1
        self.folder = Path(run_dir) / self.DIRECTORY
        self.writer = SummaryWriter(str(self.folder), purge_step=purge)

    def log(self, row: dict[str, Any], step: int) -> None:
        for key, value in scalars(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()
        ownership.record_tree(self.folder)  # its files are lmlab's, as they are now


class WandbLogger:
    DIRECTORY = "wandb"  # wandb's own name for the folder it makes in ``dir``
    STATE = "lmlab-run.json"  # {"id": the W&B run id, "logged_to": the last step handed to wandb}

    def __init__(self, run_dir: str | Path, resume_after: int | None = None, name: str | None = None,
                 config: dict[str, Any] | None = None):
        import wandb

        run_dir = Path(run_dir)
        folder = run_dir / self.DIRECTORY
        folder.mkdir(parents=True, exist_ok=True)  # inside the run (or its live folder), never above it
        self.folder = folder
        self.state_path = folder / self.STATE
        state = read_json(self.state_path, "W&B run state") if self.state_path.is_file() else None
        how: dict[str, Any] = {}
        if state is not None and resume_after is not None:
            if state["logged_to"] > resume_after:  # the killed process got past its checkpoint
                how["resume_from"] = f"{state['id']}?_step={resume_after}"
            else:
                how.update(id=state["id"], resume="allow")
        else:  # a new run (a fresh start in a directory also starts a new W&B run)
            state = {"id": uuid.uuid4().hex[:12], "logged_to": -1}
            how["id"] = state["id"]
        self.state = state
        write_json(self.state_path, state)
        mode = None if os.environ.get("WANDB_MODE") else "offline"  # the user's WANDB_MODE wins
        try:
            self.run = wandb.init(dir=str(run_dir), project=os.environ.get("WANDB_PROJECT") or "lmlab",
                                  name=name or run_dir.name, config=config, mode=mode, reinit="create_new",
                                  settings=wandb.Settings(console="off", silent=True), **how)
        except Exception as e:  # wandb's own errors (login, network...) are the user's to fix
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise LmlabError(f"wandb could not start a run: {first}",
                             "set WANDB_MODE=offline (the default), or run `wandb login`") from None

    def log(self, row: dict[str, Any], step: int) -> None:
        if step > self.state["logged_to"]:  # recorded before wandb sees it: a kill in between is safe
            self.state["logged_to"] = step
            write_json(self.state_path, self.state)
        self.run.log(scalars(row), step=step)

    def close(self) -> None:
        if self.run is None:
            return
        import wandb

        self.run.finish()
        self.run = None
        # finish() can return before wandb's service process has written the run to disk; when no
        # other W&B run of this process is active, shutting the service down waits for it, so the
        # files are complete when lmlab returns (and fine-tuning moves them into its output)
        if getattr(wandb.setup(), "most_recent_active_run", "unknown") is None:
            wandb.teardown()
        ownership.record_tree(self.folder)  # its files are lmlab's, as they are now


#: name -> (class, the module it needs, the extra that installs it)
LOGGERS = {name: (cls, *LOGGER_PACKAGES[name]) for name, cls in
           (("tensorboard", TensorBoardLogger), ("wandb", WandbLogger))}


def logger_dirs(names: Sequence[str]) -> list[str]:
    """The sub-directories of the run that the loggers ``names`` write."""
    return [LOGGERS[name][0].DIRECTORY for name in names]


def open_loggers(names: Sequence[str], directory: str | Path, resume_after: int | None = None,
                 name: str | None = None, config: dict[str, Any] | None = None) -> list:
    """The loggers ``names``, writing under ``directory`` (each in its own sub-directory);
    ``name``: the run's name where a logger shows one (default: the directory's name); ``config``:
    the run's settings, where a logger records them (W&B's run config)."""
    check_loggers(names, "loggers")
    opened: list = []
    try:
        for logger in names:
            opened.append(LOGGERS[logger][0](directory, resume_after, name, config))
    except BaseException:
        for logger in opened:
            logger.close()
        raise
    return opened

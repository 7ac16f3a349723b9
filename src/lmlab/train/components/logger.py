"""Where a run's numbers go: ``metrics.jsonl``, the external loggers, and the people watching.

:class:`RunLogger` is one object per run that every loop writes through: :meth:`record` appends a
row to the run's history, its ``metrics.jsonl`` (:class:`lmlab.train.metrics.MetricsLog`) and the
loggers of ``train.loggers`` / ``--logger`` (:mod:`lmlab.train.loggers`); :meth:`update` moves the
progress display (:class:`lmlab.progress.Progress`) and the time estimate
(:class:`lmlab.train.estimate.Estimate`); :meth:`write` prints a message without breaking the bar.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from lmlab.progress import Progress
from lmlab.train.estimate import Estimate
from lmlab.train.metrics import MetricsLog


class RunLogger:
    """``metrics``: the run's metrics log (None: rows stay in :attr:`history`); ``say``: where
    messages go when there is no progress bar; ``loggers``: TensorBoard, W&B..."""

    def __init__(self, metrics: MetricsLog | None, say: Callable[[str], None], *, loggers: Sequence = (),
                 history: list[dict[str, Any]] | None = None):
        self.metrics, self.say, self.loggers = metrics, say, list(loggers)
        self.history: list[dict[str, Any]] = history if history is not None else []
        self.progress: Progress | None = None
        self.estimate: Estimate | None = None

    def show_progress(self, total: int, initial: int = 0, *, desc: str, show: str = "auto",
                      estimate: dict[str, Any] | None = None) -> None:
        """Start the progress display (and, given ``estimate``'s options, the time estimate)."""
        self.progress = Progress(total, initial, desc=desc, show=show, log=self.say)
        if estimate is not None:
            self.estimate = Estimate(total, initial, say=self.say, **estimate)

    def record(self, row: dict[str, Any], step: int | None = None) -> None:
        """One row: into the history, ``metrics.jsonl`` and every logger (at ``step``, default the row's)."""
        self.history.append(row)
        if self.metrics is not None:
            self.metrics.append(row)
        for logger in self.loggers:
            logger.log(row, row["step"] if step is None else step)

    def update(self, step: int, parts: Sequence[str] = (), **postfix: str) -> None:
        """Step ``step`` is done: the progress display moves, the estimate counts it."""
        if self.progress is not None:
            self.progress.update(step, parts, **postfix)
        if self.estimate is not None:
            self.estimate.update(step)

    def paused(self) -> None:
        """Time since the last step was not a step's (an evaluation ran)."""
        if self.estimate is not None:
            self.estimate.pause()

    def write(self, msg: str) -> None:
        if self.progress is not None:
            self.progress.write(msg)
        else:
            self.say(msg)

    def close_progress(self) -> None:
        if self.progress is not None:
            self.progress.close()

    def close(self) -> None:
        """Close the progress display and every logger (their files complete)."""
        self.close_progress()
        for logger in self.loggers:
            logger.close()
        self.loggers = []

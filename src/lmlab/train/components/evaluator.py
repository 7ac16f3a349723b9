"""When a run evaluates, and how: the run's own evaluation hook behind one schedule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Evaluator:
    """``run(step)`` evaluates the model after step ``step`` and returns its numbers. It is due
    every ``every`` steps (0: never on a schedule), at the last step (``at_end``), and whenever
    ``also(step)`` says so (fine-tuning: at the end of every epoch)."""

    def __init__(self, run: Callable[[int], dict[str, Any]], every: int = 0, *, at_end: bool = True,
                 also: Callable[[int], bool] | None = None):
        self.run, self.every, self.at_end, self.also = run, every, at_end, also

    def due(self, step: int, final: bool) -> bool:
        return ((self.at_end and final) or bool(self.every and step % self.every == 0)
                or bool(self.also and self.also(step)))

    def __call__(self, step: int) -> dict[str, Any]:
        return self.run(step)

"""The one fit loop: step after step through :meth:`lmlab.train.engine.Engine.step`, with the
run's components deciding when to evaluate, log, save and stop.

>>> loop = FitLoop(engine, total, micro_batches=..., after_step=..., report=...)   # doctest: +SKIP
>>> loop.run(start_step)                                                            # doctest: +SKIP

What differs between pretraining, fine-tuning, DPO and distillation is handed in:

* ``micro_batches(step)``: the functions the engine runs for the step's micro-batches;
* ``after_step(step, done, seconds)``: the bookkeeping after the update (data position, tokens,
  running means) and the step's training row;
* ``evaluator`` (:class:`~lmlab.train.components.evaluator.Evaluator`): when to evaluate, and how;
* ``report(step, row, evaluation, final)``: the row (and the evaluation) to the logger and the
  progress display;
* ``checkpointer`` with ``save(step)``: when and how the run saves its resume state;
* ``stop``: a function saying whether a stop was asked for (SIGINT/SIGTERM, noted by
  :class:`lmlab.stopping.StopRequests`): after the step in flight the state is saved and the loop
  raises :class:`lmlab.stopping.Stopped` (the command's one line); ``on_stop(signal, step)`` may
  return the fix it says (default: continue with the same command and --resume).

Each step is the same sequence, in the same order, for every loop: update, bookkeeping, evaluation
if due, report, save if due, stop if asked.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Sequence
from typing import Any

from lmlab.stopping import RESUME, Stopped
from lmlab.train.components.evaluator import Evaluator
from lmlab.train.engine import Engine, MicroBatch, StepResult


class FitLoop:
    def __init__(self, engine: Engine, total: int, *,
                 micro_batches: Callable[[int], Sequence[MicroBatch]],
                 after_step: Callable[[int, StepResult, float], dict[str, Any]],
                 report: Callable[[int, dict[str, Any], dict[str, Any] | None, bool], None],
                 evaluator: Evaluator | None = None, checkpointer=None,
                 save: Callable[[int], None] | None = None,
                 stop: Callable[[], str | None] | None = None,
                 on_stop: Callable[[str, int], str | None] | None = None,
                 step_context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext):
        self.engine, self.total = engine, total
        self.micro_batches, self.after_step, self.report = micro_batches, after_step, report
        self.evaluator, self.checkpointer, self.save = evaluator, checkpointer, save
        self.stop, self.on_stop, self.step_context = stop, on_stop, step_context

    def take_step(self, step: int) -> dict[str, Any]:
        """One optimizer step (the ``step``-th, 0-based) and its bookkeeping: the training row."""
        t0 = time.perf_counter()
        with self.step_context():
            done = self.engine.step(step, self.micro_batches(step))
        return self.after_step(step + 1, done, time.perf_counter() - t0)

    def run(self, step: int) -> int:
        """Train from ``step`` (steps already taken) to ``total``; returns the steps taken in all."""
        while step < self.total:
            row = self.take_step(step)
            step += 1
            final = step == self.total
            evaluated = self.evaluator is not None and self.evaluator.due(step, final)
            self.report(step, row, self.evaluator(step) if evaluated else None, final)
            saved = self.checkpointer is not None and self.checkpointer.due(step, evaluated, final)
            if saved:
                self.save(step)
            requested = self.stop() if self.stop is not None and not final else None
            if requested:
                if not saved and self.save is not None:
                    self.save(step)
                fix = self.on_stop(requested, step) if self.on_stop is not None else None
                raise Stopped(requested, fix or RESUME)
        return step

"""How a long loop shows its progress, for every loop in lmlab (pretraining, fine-tuning,
distillation): a tqdm bar when stderr is a terminal, otherwise - a log file, a batch job, a
notebook's captured output - one line every ~5% of the steps with the figures the loop chose and
the time left, so a log read later still says how the run went.

>>> progress = Progress(1000, desc="pretrain", show="auto", log=print)      # doctest: +SKIP
>>> progress.update(step, ["loss 3.1416", "12,345 tokens/s"], loss="3.142")  # doctest: +SKIP
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence

LINES_PER_RUN = 20


class Progress:
    """Progress over ``total`` steps, starting at ``initial`` (a resumed run).

    ``bar``: options of the tqdm bar (``unit_scale=True`` for bytes, ``leave=False``).
    ``show``: ``"on"`` (a bar), ``"off"`` (nothing), ``"auto"`` (a bar on a terminal, lines
    otherwise); ``log`` writes the lines (and :meth:`write` messages when there is no bar).
    """

    def __init__(self, total: int, initial: int = 0, *, desc: str, show: str = "auto",
                 log: Callable[[str], None], unit: str = "step", **bar):
        from tqdm import tqdm

        self.total, self.first, self.log, self.unit = total, initial, log, unit
        self.bar_on = show == "on" or (show == "auto" and sys.stderr.isatty())
        self.lines_on = show != "off" and not self.bar_on
        self.lines_done = self._mark(initial)  # the ~5% marks passed (a line each)
        self.t0 = time.perf_counter()
        self.bar = tqdm(total=total, initial=initial, desc=desc, unit=unit, disable=not self.bar_on,
                        file=sys.stderr, **{"dynamic_ncols": True, "leave": True, **bar})

    def _mark(self, step: int) -> int:
        """How many of the :data:`LINES_PER_RUN` marks ``step`` has passed (at most one line each,
        however few the steps: 37 steps give 19 lines, not 36)."""
        return step * LINES_PER_RUN // max(1, self.total)

    def seconds_left(self, step: int) -> float:
        done = step - self.first
        return (self.total - step) * (time.perf_counter() - self.t0) / max(1, done)

    def update(self, step: int, parts: Sequence[str] = (), **postfix: str) -> None:
        """Step ``step`` is done: the bar moves (``postfix`` beside it); at each ~5% mark passed,
        short of the end, a line ``step N/TOTAL: <parts>, about S s left`` (``unit`` in place of
        "step"). ``step`` may jump (bytes of text): a mark passed between two updates counts."""
        self.bar.set_postfix(postfix, refresh=False)
        self.bar.update(step - self.bar.n)
        mark = self._mark(step)
        if self.lines_on and mark > self.lines_done and step < self.total:
            self.lines_done = mark
            shown = ", ".join([*parts, f"about {self.seconds_left(step):.0f} s left"])
            self.log(f"{self.unit} {step}/{self.total}: {shown}")

    def write(self, msg: str) -> None:
        """A message that does not break the bar."""
        if self.bar_on:
            self.bar.write(msg, file=sys.stderr)
        else:
            self.log(msg)

    def close(self) -> None:
        self.bar.close()

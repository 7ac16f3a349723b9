"""How long a run will take, said once its first steps are timed, and durations people read.

A loop makes an :class:`Estimate` beside its :class:`~lmlab.progress.Progress` and calls
:meth:`Estimate.update` after every step. The first step is not timed (allocations, lazy set-up);
the next few are, and then one line says what the rest will cost::

    estimate: ~3 h 10 min for 6,315 steps at 1.8 s/step (plus 3 evaluations of 872 examples)

followed, when that is longer than :data:`LONG_S`, by the caller's hint on how to shorten it.
Time the loop spends on something else (a dev evaluation) is left out with :meth:`Estimate.pause`.

>>> duration(11_400)
'3 h 10 min'
>>> per_step(2.91)
'2.9 s/step'
"""

from __future__ import annotations

import time
from collections.abc import Callable

#: steps timed (after the untimed first one) before the estimate is said
TIMED_STEPS = 3
#: ...or fewer, once the timed ones took this long: a slow run hears its estimate early
PATIENCE_S = 20.0
#: an estimate over this many seconds comes with the caller's hint on how to shorten the run
LONG_S = 30 * 60


def duration(seconds: float) -> str:
    """``seconds`` as people say it: ``'4.2 s'``, ``'38 s'``, ``'2 min 5 s'``, ``'25 min'``,
    ``'3 h 10 min'``."""
    seconds = max(0.0, float(seconds))
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 600:
        minutes, rest = divmod(round(seconds), 60)
        return f"{minutes} min {rest} s" if rest else f"{minutes} min"
    if seconds < 3600 - 30:
        return f"{round(seconds / 60)} min"
    hours, minutes = divmod(round(seconds / 60), 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


def per_step(seconds: float, unit: str = "step") -> str:
    """The time of one step: ``'45 ms/step'``, ``'0.31 s/step'``, ``'2.9 s/step'``, ``'140 s/step'``."""
    if seconds < 0.1:
        return f"{seconds * 1000:.0f} ms/{unit}"
    if seconds < 1:
        return f"{seconds:.2f} s/{unit}"
    if seconds < 100:
        return f"{seconds:.1f} s/{unit}"
    return f"{seconds:.0f} s/{unit}"


class Estimate:
    """Says once, after the first steps of a run of ``total`` steps (``done`` of them already, when
    resumed), how long the rest will take.

    ``say``: where the line goes; ``note``: words after it (what the estimate leaves out);
    ``hint``: given the seconds per step, a line naming the options that shorten the run, said when
    the estimate is over ``long_s``. ``clock``: the time source (tests pass their own).
    """

    def __init__(self, total: int, done: int = 0, *, say: Callable[[str], None], note: str = "",
                 hint: Callable[[float], str] | None = None, timed_steps: int = TIMED_STEPS,
                 patience_s: float = PATIENCE_S, long_s: float = LONG_S,
                 clock: Callable[[], float] = time.perf_counter):
        self.total, self.first, self.say, self.note, self.hint = total, done, say, note, hint
        self.timed_steps, self.patience_s, self.long_s, self.clock = timed_steps, patience_s, long_s, clock
        self.timed, self.spent, self.said = 0, 0.0, False
        self.last = clock()

    @property
    def seconds_per_step(self) -> float | None:
        """The mean time of the timed steps (None before any)."""
        return self.spent / self.timed if self.timed else None

    def pause(self) -> None:
        """The time since the last step is not a step's (an evaluation ran): leave it out."""
        self.last = self.clock()

    def update(self, step: int) -> None:
        """Step ``step`` is done."""
        now = self.clock()
        if step - self.first > 1:  # the run's first step sets things up: not timed
            self.spent += now - self.last
            self.timed += 1
        self.last = now
        enough = self.timed >= self.timed_steps or (self.timed and self.spent >= self.patience_s)
        if enough and not self.said and step < self.total:
            self.said = True
            self.say_estimate(self.total - self.first)

    def say_estimate(self, steps: int) -> None:
        rate = self.seconds_per_step
        seconds = steps * rate
        more = "" if self.first == 0 else " more"
        self.say(f"estimate: ~{duration(seconds)} for {steps:,}{more} steps at {per_step(rate)}{self.note}")
        if seconds > self.long_s and self.hint is not None:
            self.say(self.hint(rate))

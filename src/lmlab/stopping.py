"""How a command stops on SIGTERM (what SLURM and Kubernetes send before they kill a job) or SIGINT
(Ctrl-C): the one home of stopping, for every command.

Every stop ends in one exception, :class:`Stopped` (a ``KeyboardInterrupt``, so that a Python
caller that catches Ctrl-C catches it too). It unwinds the command like any error, so every ``with``
block and ``finally`` runs: temporaries are removed, locks released, a claimed folder the command
wrote nothing into is given back. It carries the signal and the fix; the command line prints it as
its one line, ``error: stopped by SIGTERM; <fix>``, and exits with 128 + the signal number.

Two ways of stopping raise it:

* :func:`unwind_on_signals` (the command line, around every command): the signal raises
  :class:`Stopped` at once, wherever the command is;
* :class:`StopRequests` (the training loops, while they train): the first signal is only noted;
  the loop (:class:`lmlab.train.components.FitLoop`) finishes the step in flight, saves the run's
  state and raises :class:`Stopped` with the fix "continue with the same command and --resume".
  A second signal stops at once.

Outside the main thread (where Python cannot install handlers) nothing changes.
"""

from __future__ import annotations

import contextlib
import signal
import threading

#: the fix after a command that cannot continue where it stopped
START_AGAIN = ("run the same command again (what this command was writing was removed, nothing else "
               "was touched)")
#: the fix after a run that saved its state before it stopped
RESUME = "continue with the same command and --resume"
SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _signum(how: int | str) -> int:
    if isinstance(how, int):
        return how
    with contextlib.suppress(KeyError):
        return int(signal.Signals[how])
    return int(signal.SIGTERM)  # a stop asked for elsewhere (another process of a torchrun job)


class Stopped(KeyboardInterrupt):
    """A command stopped by a signal (``how``: its number or name, or a phrase such as "a signal to
    another process"), with the ``fix`` to say: ``stopped by SIGTERM; <fix>``."""

    def __init__(self, how: int | str, fix: str = START_AGAIN):
        self.signum = _signum(how)
        self.how = signal.Signals(how).name if isinstance(how, int) else how
        self.fix = fix
        super().__init__(self.message)

    @property
    def message(self) -> str:
        return f"stopped by {self.how}; {self.fix}"

    @property
    def exit_code(self) -> int:
        return 128 + self.signum

    def with_fix(self, fix: str) -> Stopped:
        """The same stop, with another fix (a caller that knows better how to go on)."""
        return Stopped(self.how, fix)


def as_stopped(e: KeyboardInterrupt) -> Stopped:
    """``e`` as a :class:`Stopped` (a bare ``KeyboardInterrupt`` is a Ctrl-C: SIGINT)."""
    return e if isinstance(e, Stopped) else Stopped(signal.SIGINT)


def _stop_now(signum, frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def unwind_on_signals():
    """For the block, SIGTERM and SIGINT raise :class:`Stopped` at once (then the handlers that
    were there before are put back)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in SIGNALS:
            with contextlib.suppress(ValueError, OSError):
                previous[s] = signal.signal(s, _stop_now)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


class StopRequests:
    """Context manager: ``with StopRequests() as stop: ... if stop.requested: ...``. The first
    SIGTERM or SIGINT is noted (``requested``: its name) for the loop to act on after its step; a
    second one raises :class:`Stopped` at once, with ``fix``."""

    def __init__(self, fix: str = RESUME) -> None:
        self.requested: str | None = None
        self.fix = fix
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:  # a second signal: stop now
            raise Stopped(signum, self.fix)
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for s in SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

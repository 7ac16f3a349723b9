"""Stopping a run cleanly on SIGINT (Ctrl-C) and SIGTERM (what SLURM and Kubernetes send before
they kill a job): the first signal is noted, the step in flight finishes, a checkpoint is written
and the run ends with ``KeyboardInterrupt``; ``--resume`` then loses no step. A second signal
interrupts at once. Outside the main thread (where Python cannot install handlers) nothing changes.
"""

from __future__ import annotations

import signal
import threading


class StopRequests:
    """Context manager: ``with StopRequests() as stop: ... if stop.requested: ...``."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.requested: str | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:  # a second signal: stop now
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name

    def __enter__(self) -> StopRequests:
        if threading.current_thread() is threading.main_thread():
            for s in self.SIGNALS:
                self._previous[s] = signal.signal(s, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        self._previous.clear()

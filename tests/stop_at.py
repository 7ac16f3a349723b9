"""A stand-in for a loop's SIGINT/SIGTERM handler, shared by the resume tests of fine-tuning and
preference tuning: a stop is 'requested' once step ``at`` is done; with ``crash``, step ``at``
raises KeyboardInterrupt instead (a kill: only the saved state is left)."""

from __future__ import annotations

from lmlab.train.engine import Engine


class StopAt:
    """Patches ``Engine.step`` and ``loop.StopRequests`` (``loop``: the module whose run loop
    listens, e.g. ``lmlab.finetune.loop``) with ``monkeypatch``."""

    def __init__(self, monkeypatch, loop, at: int, crash: bool = False):
        self.requested = None
        original = Engine.step
        guard = self

        def step(engine, i, *a, **k):
            if crash and i + 1 == at:
                raise KeyboardInterrupt
            out = original(engine, i, *a, **k)
            if i + 1 == at:
                guard.requested = "SIGTERM"
            return out

        monkeypatch.setattr(Engine, "step", step)
        monkeypatch.setattr(loop, "StopRequests", lambda: self)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

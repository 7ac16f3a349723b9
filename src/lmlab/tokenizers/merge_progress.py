"""The progress of the merge learners: the one progress policy of lmlab's long loops
(:class:`lmlab.progress.Progress`: a bar on a terminal, a line every ~5% otherwise)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def merge_progress(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """``tick()``, which advances the "merges" progress when ``enabled`` (a bar on a terminal, a
    line every ~5% of the merges otherwise, on stderr) and does nothing otherwise; the bar is
    closed when the block ends, by an error too."""
    if not enabled:
        yield lambda: None
        return
    from lmlab.progress import Progress

    progress = Progress(total, desc="merges", show="auto", unit="merge",
                        log=lambda msg: print(msg, file=sys.stderr, flush=True))
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        progress.update(done)

    try:
        yield tick
    finally:
        progress.close()

"""The progress bar of the merge learners."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager


@contextmanager
def merge_progress(total: int, enabled: bool) -> Iterator[Callable[[], None]]:
    """``tick()``, which advances a "merges" progress bar (tqdm) when ``enabled`` and does nothing
    otherwise; the bar is closed when the block ends, by an error too."""
    if not enabled:
        yield lambda: None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc="merges", unit="merge")
    try:
        yield lambda: bar.update(1)
    finally:
        bar.close()

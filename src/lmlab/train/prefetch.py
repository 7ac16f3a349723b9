"""Reading the next step's data while this step computes.

The trainer's batches are windows of memory-mapped token shards: reading one means page faults,
a copy and packing (document ids, positions) on the CPU, and for the objectives that prepare
their inputs on the host (``Objective.prepare_on_host``: masking, span corruption, noising) that
preparation too. :class:`Prefetcher` runs this work on one background thread, a step ahead, so a
GPU never waits for it: the trainer asks for the next step's micro-batches
(:meth:`Prefetcher.ahead`, keyed by data position and seed) before it runs this step, and takes
each one (:meth:`Prefetcher.take`) when its micro-batch starts. On CUDA the batch is read into
pinned memory, and the copy to the GPU does not block the host either.

What a micro-batch holds depends only on its position and its seed, so prefetching changes when
the data is read and prepared, never what: a run's numbers are the same with ``train.prefetch``
on or off (tested).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any


class Prefetcher:
    """``load(key)`` on a background thread, for the keys asked for ahead of time."""

    def __init__(self, load: Callable[[Hashable], Any]):
        self.load = load
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmlab-prefetch")
        self.pending: dict[Hashable, Future] = {}

    def ahead(self, keys: list[Hashable]) -> None:
        """Start loading these keys' items (those not already on their way)."""
        for k in keys:
            if k not in self.pending:
                self.pending[k] = self.pool.submit(self.load, k)

    def take(self, key: Hashable) -> Any:
        """The item of ``key``: the one loaded ahead, or loaded now if nobody asked for it."""
        future = self.pending.pop(key, None)
        return future.result() if future is not None else self.load(key)

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()
        self.pool.shutdown(wait=True)

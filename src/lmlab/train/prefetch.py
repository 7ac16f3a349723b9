"""Reading the next step's data while this step computes.

The trainer's batches are windows of memory-mapped token shards: reading one means page faults,
a copy and packing (document ids, positions) on the CPU. :class:`Prefetcher` runs those reads on
one background thread, a step ahead, so a GPU never waits for them: the trainer asks for the next
step's windows (:meth:`Prefetcher.ahead`) before it runs this step, and takes each batch
(:meth:`Prefetcher.take`) when its micro-batch starts. On CUDA the batch is read into pinned
memory, and the copy to the GPU does not block the host either.

Which windows a step reads depends only on its position, so prefetching changes when the data is
read, never what: a run's numbers are the same with ``train.prefetch`` on or off (tested).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from lmlab.data.batch import TokenBatch


class Prefetcher:
    """``read(position) -> TokenBatch`` on a background thread; ``pin`` for CUDA hosts."""

    def __init__(self, read: Callable[[int], TokenBatch], pin: bool = False):
        self.read, self.pin = read, pin
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmlab-prefetch")
        self.pending: dict[int, Future] = {}

    def _load(self, position: int) -> TokenBatch:
        batch = self.read(position)
        batch.single_document = batch.is_single_document()  # decided here, off the step's path
        return batch.pin_memory() if self.pin else batch

    def ahead(self, positions: list[int]) -> None:
        """Start reading these positions' batches (those not already on their way)."""
        for p in positions:
            if p not in self.pending:
                self.pending[p] = self.pool.submit(self._load, p)

    def take(self, position: int) -> TokenBatch:
        """The batch at ``position``: the one read ahead, or read now if nobody asked for it."""
        future = self.pending.pop(position, None)
        return future.result() if future is not None else self._load(position)

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()
        self.pool.shutdown(wait=True)

"""Sequence packing: token shards -> fixed-length windows of whole-or-partial documents, no padding.

The train split is one token stream (``TokenShards``). Packing cuts it into contiguous windows of
``seq_len`` tokens, so documents sit back to back and no position is wasted on padding (as in
GPT-2/nanoGPT). Unlike plain concatenation, every window also carries where its documents start:

* ``doc_ids``: 0 for the first (possibly partial) document of the row, 1 for the next...; the
  objective turns ``doc_ids[:, :, None] == doc_ids[:, None, :]`` into a block-diagonal attention
  mask, so no token ever attends to another document (Krell et al. 2021, "Efficient sequence
  packing without cross-contamination"; Llama 3 trains the same way);
* ``position_ids``: position inside the document, restarting at 0 at each document start (the
  first segment of a window starts at 0 as well, so positions never exceed ``seq_len - 1``).

Order: each epoch visits every window once in a random order drawn from ``(seed, epoch)``; epochs
after the first shift the window grid by a random offset so cut points move. The whole sampling
state is one integer, the number of windows consumed (``position``): a resumed run seeks straight
to it instead of replaying batches.
"""

from __future__ import annotations

import threading

import numpy as np
import torch

from lmlab.budget import MAX_EPOCHS
from lmlab.data.batch import TokenBatch
from lmlab.data.shards import TokenShards
from lmlab.errors import LmlabError


def pack(ids: np.ndarray, doc_positions: np.ndarray) -> TokenBatch:
    """Build a :class:`TokenBatch` from ``[B, T]`` ids and their positions inside their documents.

    ``doc_positions == 0`` marks document starts (as returned by ``TokenShards.window``).

    >>> b = pack(np.array([[7, 8, 9, 4, 5]]), np.array([[3, 4, 0, 1, 0]]))
    >>> b.doc_ids.tolist(), b.position_ids.tolist()
    ([[0, 0, 1, 1, 2]], [[0, 1, 0, 1, 0]])
    """
    ids = np.asarray(ids, dtype=np.int64)
    starts = np.asarray(doc_positions) == 0
    starts[:, 0] = True
    doc_ids = np.cumsum(starts, axis=1) - 1
    idx = np.broadcast_to(np.arange(ids.shape[1]), ids.shape)
    seg_start = np.maximum.accumulate(np.where(starts, idx, 0), axis=1)
    return TokenBatch(
        torch.from_numpy(ids),
        torch.from_numpy(doc_ids.astype(np.int64)),
        torch.from_numpy((idx - seg_start).astype(np.int64)),
    )


def fewer_than_a_window(tokens: int, seq_len: int) -> bool:
    """Whether ``tokens`` tokens hold no window of ``seq_len``: the one rule, applied to the tokens
    read (:class:`PackedWindows`) and, before any is made, to ``data.max_tokens``."""
    return tokens < seq_len


class PackedWindows:
    """Windows of ``seq_len`` tokens from one split, in a seeded, resumable order."""

    def __init__(self, shards: TokenShards, seq_len: int, seed: int = 0, max_tokens: int = 0):
        """``max_tokens``: read only the split's first ``max_tokens`` tokens (0: all of them)."""
        self.num_tokens = min(shards.num_tokens, max_tokens) if max_tokens else shards.num_tokens
        if fewer_than_a_window(self.num_tokens, seq_len):
            raise LmlabError(
                f"split {shards.split!r} of {shards.directory} has {self.num_tokens} tokens"
                f"{' to read' if max_tokens else ''}, fewer than one window of seq_len={seq_len}",
                "use more text (or a larger data.max_tokens) or a smaller train.seq_len",
            )
        self.shards = shards
        self.seq_len = seq_len
        self.seed = seed
        self._epoch: int | None = None
        self._offset_cur = 0
        self._order = np.empty(0, dtype=np.int64)
        self._lock = threading.Lock()
        self._lengths: dict[int, int] = {}

    def _offset(self, epoch: int) -> int:
        """Where epoch ``epoch``'s windows start (0, then a seeded shift so windows differ by epoch)."""
        if epoch == 0:
            return 0
        offset = int(np.random.default_rng([self.seed, epoch]).integers(self.seq_len))
        return 0 if self.num_tokens - offset < self.seq_len else offset

    def _length(self, epoch: int) -> int:
        """Windows in epoch ``epoch`` (cached: walking epochs never re-draws their permutations)."""
        if epoch not in self._lengths:
            self._lengths[epoch] = (self.num_tokens - self._offset(epoch)) // self.seq_len
        return self._lengths[epoch]

    def _layout(self, epoch: int) -> tuple[int, np.ndarray]:
        with self._lock:  # a prefetching thread and the trainer may both ask
            return self._layout_unlocked(epoch)

    def _layout_unlocked(self, epoch: int) -> tuple[int, np.ndarray]:
        if epoch != self._epoch:
            rng = np.random.default_rng([self.seed, epoch])
            if epoch > 0:
                rng.integers(self.seq_len)  # the draw _offset makes; the permutation follows it
            self._epoch, self._offset_cur = epoch, self._offset(epoch)
            self._order = rng.permutation(self._length(epoch))
        return self._offset_cur, self._order

    @property
    def windows_per_epoch(self) -> int:
        return window_count(self.num_tokens, self.seq_len)

    def check_position(self, position: int, where: str) -> None:
        """Refuse a data position (read from ``where``, a resume state) that stands for more than
        :data:`lmlab.budget.MAX_EPOCHS` passes over the data: finding its window walks every epoch."""
        epochs = position // max(1, self.windows_per_epoch)
        if epochs > MAX_EPOCHS:
            raise LmlabError(f"{where}: data position {position:,} is {epochs:,} passes over the training "
                             f"data ({self.windows_per_epoch:,} windows), more than the {MAX_EPOCHS:,} a run "
                             "may make",
                             "resume from an earlier checkpoint (delete this one) or start a new run")

    def start_of(self, position: int) -> int:
        """Token offset of the window at sampling ``position`` (0, 1, 2, ... across epochs)."""
        self.check_position(position, "the training data")
        epoch, i = 0, position
        while i >= self._length(epoch):  # epochs can differ by one window (offset)
            i -= self._length(epoch)
            epoch += 1
        offset, order = self._layout(epoch)
        return offset + int(order[i]) * self.seq_len

    def epoch_of(self, position: int) -> float:
        return position / max(1, self.windows_per_epoch)

    def batch(self, position: int, rows: int) -> TokenBatch:
        """``rows`` consecutive windows starting at sampling ``position``."""
        return self.read([self.start_of(position + r) for r in range(rows)])

    def read(self, starts: list[int]) -> TokenBatch:
        return read_windows(self.shards, starts, self.seq_len)


def window_count(num_tokens: int, seq_len: int, max_tokens: int | None = None) -> int:
    """The training windows of ``seq_len`` tokens in ``num_tokens`` (the first ``max_tokens`` of
    them, when given): what one epoch of :class:`PackedWindows` visits."""
    if max_tokens:
        num_tokens = min(num_tokens, max_tokens)
    return num_tokens // seq_len


def read_windows(shards: TokenShards, starts: list[int], seq_len: int) -> TokenBatch:
    """The packed windows ``[s, s + seq_len)`` for each start ``s``, as one batch."""
    ids, pos = zip(*(shards.window(s, seq_len) for s in starts))
    batch = pack(np.stack(ids), np.stack(pos))
    batch.offsets = torch.as_tensor(starts, dtype=torch.int64)[:, None] + torch.arange(seq_len)
    return batch


def eval_starts(shards: TokenShards, seq_len: int, windows: int) -> list[int]:
    """Start offsets of ``windows`` non-overlapping windows spread evenly over the split (0 = all)."""
    n = shards.num_tokens // seq_len
    if n == 0:
        raise LmlabError(
            f"validation split of {shards.directory} has {shards.num_tokens} tokens, fewer than "
            f"seq_len={seq_len}",
            "use more validation text or a smaller train.seq_len",
        )
    if windows <= 0 or windows >= n:
        return [i * seq_len for i in range(n)]
    picks = np.unique(np.linspace(0, n - 1, windows).round().astype(np.int64))
    return [int(i) * seq_len for i in picks]

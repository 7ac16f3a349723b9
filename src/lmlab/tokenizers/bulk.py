"""``Tokenizer.encode_many``'s parallel path: many texts encoded on several processes.

The texts are cut into chunks of ``chunk_size`` texts. What makes it fast:

* **fork** (Linux, when the caller runs no other Python thread): the workers are copies of the
  caller, made in milliseconds; they already hold the tokenizer, its warm caches, its compiled
  patterns and the texts, so nothing is pickled on the way in. Every process - the caller's own
  included, so ``workers=2`` starts one extra process, not two - takes the next chunk number
  from a shared counter until none is left, so a slow stretch of text never leaves a core idle.
* elsewhere (or with other threads running) the workers are *spawned*: each receives the
  tokenizer once (pickled without its caches) and then chunks in order from a pool.
* a worker returns a chunk's ids as two flat ``array('i')`` buffers (all ids, and the number of
  ids of each text), which pickle as raw bytes, instead of one Python list per text.

The result equals ``[tok.encode(t) for t in texts]``, in input order.
"""

from __future__ import annotations

import sys
import threading
from array import array
from collections.abc import Sequence
from itertools import accumulate, chain
from multiprocessing import get_context
from typing import Any

#: The work of a forked pool, set by the caller just before the fork: (tokenizer, texts, chunk
#: bounds, shared next-chunk counter). Spawned workers hold (tokenizer, None, None, None).
_JOB: tuple[Any, Sequence[str] | None, list[tuple[int, int]] | None, Any] | None = None

Packed = tuple[array, array]


def _pack(ids: list[list[int]]) -> Packed:
    """One chunk's ids as flat buffers: (number of ids of each text, all ids)."""
    return array("i", map(len, ids)), array("i", chain.from_iterable(ids))


def _unpack(packed: Packed) -> list[list[int]]:
    lengths, flat = packed
    ids = flat.tolist()
    ends = list(accumulate(lengths))
    return [ids[end - n:end] for n, end in zip(lengths, ends)]


def _drain(pack: bool = True) -> list[tuple[int, Any]]:
    """Encode chunks until none is left: ``[(chunk number, ids), ...]`` (packed in a worker)."""
    tok, texts, bounds, counter = _JOB
    done = []
    while True:
        with counter.get_lock():
            n = counter.value
            counter.value += 1
        if n >= len(bounds):
            return done
        a, b = bounds[n]
        ids = [tok.encode(t) for t in texts[a:b]]
        done.append((n, _pack(ids) if pack else ids))


def _set_tokenizer(tok) -> None:
    global _JOB
    _JOB = (tok, None, None, None)


def _encode_chunk(texts: list[str]) -> Packed:
    return _pack([_JOB[0].encode(t) for t in texts])


def can_fork() -> bool:
    """Fork is used on Linux while the caller runs a single Python thread (forking a process
    with other threads risks copying a lock that one of them holds)."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def encode_parallel(tok, texts: Sequence[str], workers: int, chunk_size: int) -> list[list[int]]:
    """``[tok.encode(t) for t in texts]`` on ``workers`` processes (the caller's included)."""
    bounds = [(a, min(a + chunk_size, len(texts))) for a in range(0, len(texts), chunk_size)]
    if can_fork():
        chunks = _forked(tok, texts, bounds, workers)
    else:
        chunks = _spawned(tok, texts, bounds, workers)
    return [ids for chunk in chunks for ids in chunk]


def _forked(tok, texts: Sequence[str], bounds: list[tuple[int, int]], workers: int) -> list[list[list[int]]]:
    global _JOB
    ctx = get_context("fork")
    _JOB = (tok, texts, bounds, ctx.Value("q", 0))
    chunks: list[Any] = [None] * len(bounds)
    try:
        with ctx.Pool(workers - 1) as pool:
            pending = [pool.apply_async(_drain) for _ in range(workers - 1)]
            for n, ids in _drain(pack=False):
                chunks[n] = ids
            for result in pending:
                for n, packed in result.get():
                    chunks[n] = _unpack(packed)
    finally:
        _JOB = None
    return chunks


def _spawned(tok, texts: Sequence[str], bounds: list[tuple[int, int]], workers: int) -> list[list[list[int]]]:
    ctx = get_context("spawn")
    with ctx.Pool(workers, initializer=_set_tokenizer, initargs=(tok,)) as pool:
        return [_unpack(packed) for packed in pool.imap(_encode_chunk, (texts[a:b] for a, b in bounds))]

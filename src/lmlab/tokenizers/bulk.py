"""``Tokenizer.encode_many``'s parallel path: many texts encoded on several processes.

The texts are cut into chunks of ``chunk_size`` texts. What makes it fast:

* **fork** (Linux, when the caller runs no other Python thread): the workers are copies of the
  caller, made in milliseconds; they already hold the tokenizer, its warm caches, its compiled
  patterns and the texts, so nothing is pickled on the way in. The caller works too, so
  ``workers=2`` starts one extra process, not two.
* **contiguous shares, then stealing** (:class:`Schedule`): process ``k`` encodes the ``k``-th
  contiguous stretch of chunks in order, and when its own stretch is done takes chunks from
  the end of the stretch with the most left. Neighbouring texts share words, so each process
  meets fewer words that another one has already segmented (every process has its own cache:
  a word met by two processes is segmented twice), and no core idles while work is left.
* a worker returns a chunk's ids as two flat ``array('i')`` buffers (all ids, and the number of
  ids of each text), which pickle as raw bytes, through a queue whose feeder thread writes them
  while the worker goes on encoding. The caller turns them back into lists between its own
  chunks, so that work is shared out by the schedule instead of trailing at the end.
* the cyclic garbage collector is paused for the call (it would otherwise repeatedly scan every
  cached word and every list of ids made so far, about a tenth of the time; it has nothing to
  free here) and restored afterwards.
* elsewhere (or with other threads running) the workers are *spawned*: each receives the
  tokenizer once (pickled without its caches) and then chunks in order from a pool. A spawned
  worker runs the caller's main module again, so a script that calls ``encode_many`` from its
  top level without a ``__main__`` guard gets no spawned workers: the texts are encoded in the
  caller, after a note on stderr (:mod:`lmlab.processes`), and nothing hangs.

The result equals ``[tok.encode(t) for t in texts]``, in input order.
"""

from __future__ import annotations

import gc
import queue
from array import array
from collections.abc import Iterator, Sequence
from itertools import accumulate, chain
from multiprocessing import get_context
from typing import Any

from lmlab.processes import fork_is_safe, ordered_results, start_method, worker_pool
from lmlab.tokenizers.gc_pause import gc_paused

#: The work of a forked pool, set by the caller just before the fork: (tokenizer, texts, chunk
#: bounds, schedule). Spawned workers hold (tokenizer, None, None, None).
_JOB: tuple[Any, Sequence[str] | None, list[tuple[int, int]] | None, Any] | None = None

Packed = tuple[array, array]

#: Seconds the caller waits for a worker's next message before checking that it is still alive.
_POLL_S = 1.0


def _pack(ids: list[list[int]]) -> Packed:
    """One chunk's ids as flat buffers: (number of ids of each text, all ids)."""
    return array("i", map(len, ids)), array("i", chain.from_iterable(ids))


def _unpack(packed: Packed) -> list[list[int]]:
    lengths, flat = packed
    ids = flat.tolist()
    ends = list(accumulate(lengths))
    return [ids[end - n:end] for n, end in zip(lengths, ends)]


class Schedule:
    """Which chunk each of ``workers`` processes encodes next (shared memory, one lock).

    Chunks ``0..n-1`` are cut into ``workers`` contiguous stretches; process ``k`` takes its own
    stretch front to back, then steals from the back of whichever stretch has most left.
    """

    def __init__(self, ctx, n_chunks: int, workers: int):
        cuts = [n_chunks * k // workers for k in range(workers + 1)]
        # [next_0, end_0, next_1, end_1, ...]: stretch k is next_k .. end_k - 1
        self._state = ctx.Array("q", [x for k in range(workers) for x in (cuts[k], cuts[k + 1])])

    def chunks(self, k: int) -> Iterator[int]:
        """The chunk numbers process ``k`` encodes, in order, until none is left."""
        state = self._state
        while True:
            with state.get_lock():
                if state[2 * k] < state[2 * k + 1]:
                    n = state[2 * k]
                    state[2 * k] += 1
                else:
                    left = [state[2 * r + 1] - state[2 * r] for r in range(len(state) // 2)]
                    r = max(range(len(left)), key=left.__getitem__)
                    if left[r] <= 0:
                        return
                    state[2 * r + 1] -= 1
                    n = state[2 * r + 1]
            yield n


def _encode_chunk_of_job(n: int) -> list[list[int]]:
    tok, texts, bounds, _ = _JOB
    a, b = bounds[n]
    return [tok.encode(t) for t in texts[a:b]]


def _forked_worker(k: int, results) -> None:
    """A forked worker: encode process ``k``'s chunks, put ``(n, packed ids)`` for each, then
    ``(None, None)``; an exception is put as ``(None, exception)``."""
    try:
        for n in _JOB[3].chunks(k):
            results.put((n, _pack(_encode_chunk_of_job(n))))
        results.put((None, None))
    except BaseException as e:  # noqa: BLE001 - every failure goes back to the caller
        results.put((None, _picklable(e)))
    finally:
        results.close()
        results.join_thread()  # everything written before the process exits


def _picklable(e: BaseException) -> BaseException:
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
        return e
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")


def _set_tokenizer(tok) -> None:
    """A spawned worker's start: it holds the tokenizer and, like a forked one, runs without the
    cyclic garbage collector (the pool's processes only encode)."""
    global _JOB
    _JOB = (tok, None, None, None)
    gc.disable()


def _encode_chunk(texts: list[str]) -> Packed:
    return _pack([_JOB[0].encode(t) for t in texts])


def can_fork() -> bool:
    """Fork is used on Linux while the caller runs a single Python thread (forking a process
    with other threads risks copying a lock that one of them holds)."""
    return fork_is_safe()


def encode_parallel(tok, texts: Sequence[str], workers: int, chunk_size: int) -> list[list[int]]:
    """``[tok.encode(t) for t in texts]`` on ``workers`` processes (the caller's included)."""
    bounds = [(a, min(a + chunk_size, len(texts))) for a in range(0, len(texts), chunk_size)]
    method = "fork" if can_fork() else start_method("encode_many", workers)
    with gc_paused():
        if method is None:
            return [tok.encode(t) for t in texts]
        if method == "fork":
            chunks = _forked(tok, texts, bounds, workers)
        else:
            chunks = _spawned(tok, texts, bounds, workers)
        return [ids for chunk in chunks for ids in chunk]


def _forked(tok, texts: Sequence[str], bounds: list[tuple[int, int]], workers: int) -> list[list[list[int]]]:
    global _JOB
    ctx = get_context("fork")
    schedule = Schedule(ctx, len(bounds), workers)
    _JOB = (tok, texts, bounds, schedule)
    results = ctx.Queue()
    procs = [ctx.Process(target=_forked_worker, args=(k, results), daemon=True) for k in range(1, workers)]
    chunks: list[Any] = [None] * len(bounds)
    try:
        for p in procs:
            p.start()
        running = len(procs)
        for n in schedule.chunks(0):
            chunks[n] = _encode_chunk_of_job(n)
            running -= _collect(results, chunks, procs, block=False)
        while running:
            running -= _collect(results, chunks, procs, block=True)
        for p in procs:
            p.join()
    finally:
        _JOB = None
        for p in procs:
            if p.is_alive():
                p.terminate()
                p.join()
        results.close()
    return chunks


def _collect(results, chunks: list, procs: list, block: bool) -> int:
    """Unpack the workers' results that have arrived (with ``block``, wait for at least one);
    return how many workers reported that they finished."""
    finished = 0
    while True:
        try:
            n, payload = results.get(timeout=_POLL_S) if block else results.get_nowait()
        except queue.Empty:
            if not block:
                return finished
            dead = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"an encode_many worker process died (exit code {dead[0]})") from None
            continue
        if n is None:
            if payload is not None:
                raise payload
            finished += 1
        else:
            chunks[n] = _unpack(payload)
        block = False


def _spawned(tok, texts: Sequence[str], bounds: list[tuple[int, int]], workers: int) -> list[list[list[int]]]:
    with worker_pool("spawn", workers, "encode_many", _set_tokenizer, (tok,)) as pool:
        chunks = (texts[a:b] for a, b in bounds)
        return [_unpack(packed) for packed in ordered_results(pool, _encode_chunk, chunks, 2 * workers)]

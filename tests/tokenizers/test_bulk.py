"""encode_many's parallel path (tokenizers/bulk.py): forked and spawned workers give encode's ids."""

from __future__ import annotations

import pytest

from lmlab.errors import LmlabError
from lmlab.tokenizers import bulk, train_tokenizer


@pytest.fixture(scope="module", params=["unigram", "wordpiece"])
def tok(request, shakespeare):
    return train_tokenizer(request.param, [shakespeare[:60_000]], vocab_size=400)


@pytest.fixture(scope="module")
def lines(shakespeare, wikitext_valid_lines):
    # specials written in the text, empty and blank lines, and characters never seen in training
    extra = ["", "   ", "[CLS] to be [SEP] or not [MASK]", "caf\u00e9 \u2603 \u65e5\u672c", "x" * 300]
    return [ln for ln in shakespeare[200_000:230_000].splitlines()] + wikitext_valid_lines[:200] + extra


def test_forked_workers_and_the_caller_give_encodes_ids(tok, lines, monkeypatch):
    monkeypatch.setattr(bulk, "can_fork", lambda: True)
    expected = [tok.encode(line) for line in lines]
    tok._ids_cache.clear()
    # 7 texts a chunk: many chunks, shared between the caller and two forked workers
    assert tok.encode_many(lines, workers=3, chunk_size=7) == expected
    assert bulk._JOB is None  # the job is not left behind in the caller


def test_spawned_workers_give_encodes_ids(tok, lines, monkeypatch):
    monkeypatch.setattr(bulk, "can_fork", lambda: False)
    some = lines[:400] + lines[-5:]
    assert tok.encode_many(some, workers=2, chunk_size=150) == [tok.encode(line) for line in some]


def test_packed_ids_round_trip():
    ids = [[5, 1, 2], [], [7], [], [2**31 - 1, 0]]
    lengths, flat = bulk._pack(ids)
    assert lengths.itemsize == flat.itemsize == 4 and list(lengths) == [3, 0, 1, 0, 2]
    assert bulk._unpack((lengths, flat)) == ids
    assert bulk._unpack(bulk._pack([])) == []


def test_one_chunk_stays_in_process_and_chunk_size_is_checked(tok, lines, monkeypatch):
    def no_pool(*args):
        raise AssertionError("a single chunk must not start workers")

    monkeypatch.setattr(bulk, "encode_parallel", no_pool)
    assert tok.encode_many(lines[:10], workers=2) == [tok.encode(line) for line in lines[:10]]
    assert tok.encode_many(iter(lines[:3]), workers=2) == [tok.encode(line) for line in lines[:3]]
    for bad in (0, -1, 2.5, True):
        with pytest.raises(LmlabError, match="encode_many.s chunk_size must be"):
            tok.encode_many(lines, workers=2, chunk_size=bad)
    with pytest.raises(LmlabError, match="encode_many.s workers must be a whole number"):
        tok.encode_many(lines, workers="2")


def test_spawned_workers_receive_the_tokenizer_without_its_caches(tok, lines):
    import pickle

    for line in lines[:300]:
        tok.tokenize(line)  # fills the offsets caches
        tok.encode(line)  # fills the ids cache
    caches = {k: v for k, v in vars(tok).items() if k.endswith("_cache") and isinstance(v, dict)}
    assert caches and all(len(v) > 50 for v in caches.values()), caches.keys()
    copy = pickle.loads(pickle.dumps(tok))
    assert all(getattr(copy, k) == {} for k in caches)
    assert all(len(v) > 50 for v in caches.values())  # the original keeps them
    assert [copy.encode(line) for line in lines] == [tok.encode(line) for line in lines]


def _encode_many_in_a_worker(tok, lines):
    return tok.encode_many(lines, workers=2, chunk_size=5)


def test_inside_a_pool_worker_encode_many_stays_in_process(tok, lines):
    from multiprocessing import get_context

    with get_context("fork").Pool(1) as pool:  # daemonic: may not start processes of its own
        got = pool.apply(_encode_many_in_a_worker, (tok, lines[:40]))
    assert got == [tok.encode(line) for line in lines[:40]]


def test_schedule_gives_each_process_its_stretch_then_steals_from_the_largest():
    from multiprocessing import get_context

    schedule = bulk.Schedule(get_context("fork"), 10, 3)  # stretches 0-2, 3-5, 6-9
    first = schedule.chunks(0)
    assert [next(first) for _ in range(3)] == [0, 1, 2]
    assert next(first) == 9  # own stretch done: the back of the largest (6-9)
    second = schedule.chunks(1)
    assert next(second) == 3
    taken = [0, 1, 2, 9, 3, *first, *second, *schedule.chunks(2)]
    assert sorted(taken) == list(range(10))  # every chunk exactly once
    assert list(schedule.chunks(2)) == []


def _failing_in_workers(tok, monkeypatch, failure):
    """Make ``tok.encode`` call ``failure()`` in a forked worker, and take its time in the caller
    (so that the worker surely gets chunks of its own)."""
    import os
    import time

    caller, encode = os.getpid(), tok.encode

    def encode_or_fail(text, *args):
        if os.getpid() != caller:
            failure()
        time.sleep(0.002)
        return encode(text, *args)

    monkeypatch.setattr(bulk, "can_fork", lambda: True)
    monkeypatch.setattr(tok, "encode", encode_or_fail)


def test_a_workers_error_reaches_the_caller(tok, lines, monkeypatch):
    def fail():
        raise LmlabError("token '\u2603' is not in the vocabulary", "train with [UNK]")

    _failing_in_workers(tok, monkeypatch, fail)
    with pytest.raises(LmlabError, match="is not in the vocabulary"):
        tok.encode_many(lines[:200], workers=2, chunk_size=20)
    assert bulk._JOB is None


def test_a_dead_worker_is_an_error_not_a_hang(tok, lines, monkeypatch):
    import os

    monkeypatch.setattr(bulk, "_POLL_S", 0.05)
    _failing_in_workers(tok, monkeypatch, lambda: os._exit(3))
    with pytest.raises(RuntimeError, match=r"worker process died \(exit code 3\)"):
        tok.encode_many(lines[:200], workers=2, chunk_size=20)


def test_the_garbage_collector_is_restored(tok, lines, monkeypatch):
    import gc

    monkeypatch.setattr(bulk, "can_fork", lambda: True)
    seen = []
    encode = tok.encode
    monkeypatch.setattr(tok, "encode", lambda text: seen.append(gc.isenabled()) or encode(text))
    assert gc.isenabled()
    expected = [encode(t) for t in lines[:100]]
    for chunk_size in (10, 1000):  # workers, and in-process (one chunk)
        assert tok.encode_many(lines[:100], workers=2, chunk_size=chunk_size) == expected
        assert gc.isenabled()
    assert seen and not any(seen)  # paused in the caller while it encoded
    gc.disable()
    try:
        tok.encode_many(lines[:100], workers=2, chunk_size=10)
        assert not gc.isenabled()
    finally:
        gc.enable()

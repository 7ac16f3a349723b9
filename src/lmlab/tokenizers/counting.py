"""Streaming chunk counting: the first pass of every learner.

Learners never hold the corpus: they count how often each distinct pre-tokenized chunk (a
word, or a GPT-2 pre-token) occurs, streaming the texts once. Memory is therefore bounded by the
number of *distinct* chunks (plus their symbol sequences), not by corpus size; counts are Python
ints, which never overflow (the equivalent of 64-bit or wider counters).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from itertools import chain, islice

from lmlab.errors import LmlabError
from lmlab.processes import ordered_results, start_method, worker_pool

Splitter = Callable[[str], list[str]]


def _count_batch(args: tuple[Splitter, list[str]]) -> Counter:
    split, batch = args
    return Counter(chain.from_iterable(map(split, batch)))


def _batches(texts: Iterable[str], size: int) -> Iterator[list[str]]:
    it = iter(texts)
    while batch := list(islice(it, size)):
        yield batch


def count_chunks(
    texts: Iterable[str], split: Splitter, workers: int = 1, batch_size: int = 2000
) -> dict[str, int]:
    """Count the chunks ``split(text)`` yields over all ``texts``, in first-seen order.

    ``split`` must be a module-level function when ``workers > 1`` (it is sent to worker
    processes, ``batch_size`` texts at a time; see :mod:`lmlab.processes` for when the count
    stays in this process). The result's insertion order is the order in
    which chunks first occur in the corpus, which learners use to break ties deterministically.
    Raises a one-line error when the corpus holds no chunk at all.
    """
    method = start_method("counting the training corpus", workers) if workers > 1 else None
    if method is not None:
        total: Counter = Counter()
        with worker_pool(method, workers, "counting the training corpus") as pool:
            work = ((split, b) for b in _batches(texts, batch_size))
            for c in ordered_results(pool, _count_batch, work, 2 * workers):
                total.update(c)
    else:  # one count over the whole stream: merging a counter per batch cost a Python step per chunk
        total = Counter(chain.from_iterable(map(split, texts)))
    if not total:
        raise LmlabError(
            "the training corpus is empty (no words found)", "pass files or texts that contain text"
        )
    return dict(total)


def refine_counts(counts: dict[str, int], split: Splitter) -> dict[str, int]:
    """Counts of the sub-chunks ``split(chunk)`` of each distinct chunk, weighted by its count.

    For a learner that counts cheap coarse chunks first and splits only the distinct ones. In
    first-seen order: the first occurrence of a sub-chunk lies in the first occurrence of some
    chunk, so taking chunks in first-seen order and their sub-chunks left to right keeps the
    order of splitting the whole stream.
    """
    out: dict[str, int] = {}
    get = out.get
    for chunk, n in counts.items():
        for sub in split(chunk):
            out[sub] = get(sub, 0) + n
    return out

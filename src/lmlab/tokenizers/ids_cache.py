"""The bounded word -> ids cache behind every tokenizer's fast ``encode``.

A ``dict`` whose missing keys compute themselves: ``cache[word]`` returns the stored ids of
``word``, or calls ``compute(word)``, stores and returns the result (emptying the cache first
when it already holds ``limit`` words). Because a hit is a plain dict lookup, a whole text's ids
can be gathered without a Python-level loop::

    list(chain.from_iterable(map(cache.__getitem__, words)))

The cache pickles (and copies) as an empty cache with the same ``compute`` and ``limit``: a
spawned worker receives the tokenizer, not the hundreds of thousands of words it has seen.
"""

from __future__ import annotations

from collections.abc import Callable

#: Most words an :class:`IdsCache` keeps by default; it is emptied when full.
IDS_CACHE_LIMIT = 1 << 18


class IdsCache(dict):
    """``word -> ids``, filled on demand by ``compute(word)``, emptied when it holds ``limit`` words."""

    __slots__ = ("compute", "limit")

    def __init__(self, compute: Callable[[str], list[int]], limit: int = IDS_CACHE_LIMIT):
        super().__init__()
        self.compute = compute
        self.limit = limit

    def __missing__(self, word: str) -> list[int]:
        ids = tuple(self.compute(word))
        if len(self) >= self.limit:
            self.clear()
        self[word] = ids
        return ids

    def __reduce__(self):
        return type(self), (self.compute, self.limit)

    def __repr__(self) -> str:
        return f"IdsCache({len(self)} words, limit={self.limit})"

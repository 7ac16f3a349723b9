"""The merge learner for BPE over single-character symbols (character BPE, byte-level BPE).

The same merges as :func:`lmlab.tokenizers.merge_trainer.learn_merges` with the frequency score
(the most frequent adjacent pair; ties go to the pair that occurs first in the corpus, i.e. the
smallest (word index, position in initial symbols)), learned faster by letting Python's string
methods do the per-word work in C. It needs every *initial* symbol to be one character, which
holds for character BPE (the characters of a word and the end-of-word ``_``) and byte-level BPE
(one printable character per byte).

Representation:

* every symbol is one character: the initial symbols are themselves, a merged symbol gets an
  unused code point (``text`` maps it back to its string). A word is then the string of its
  symbols, so ``word.find(ab)`` tells whether it holds the pair ``ab`` and ``word.replace(ab, x)``
  merges every occurrence left to right, as BPE does (``a a a`` -> ``aa a``). Each word is wrapped
  in an ``edge`` character that is no symbol, so its neighbours need no bounds checks;
* a pair is the int ``ord(a) << 21 | ord(b)``; its record is ``[count, words, entry, exact]``:
  the weighted count, the words holding it (or that held it once: a merge skips those in C),
  its live heap entry and whether the entry's first occurrence is exact;
* a heap entry is one int, ``-count << 106 | first << 42 | pair`` with ``first = word << 32 |
  position``, so that the smallest entry is the best pair and comparing two entries is one int
  comparison. Entries go stale (lazy invalidation): one whose count fell is re-queued when it
  reaches the top; one superseded by a newer entry of its pair is dropped.

A merge visits only the words of the merged pair's list. For each word with one occurrence the
left and right neighbours are collected in one pass; the count changes are then applied once per
neighbour symbol, with the summed word counts: ``(prev, a)`` loses and ``(prev, new)`` gains, and
likewise on the right. Words holding the pair more than once (``abab``, ``aaaa``) are recounted
around their occurrences.

Pairs seen fewer than ``floor`` times (8 at first) are not followed at all: most pairs are rare
and are never merged, so neither are they counted, queued nor updated. A pair's count can only
grow when it is new (it contains the newest symbol) and then all its occurrences are in view,
so the counts of followed pairs stay exact. When the best followed pair is rarer than ``floor``
(or none is left), the index is completed from the words (:mod:`lmlab.tokenizers.pair_index`)
with a lower floor (8 -> 2 -> 1), and learning goes on with the very same merges.

Two merges can build the same string (``a+bc`` and ``ab+c``); the second one reuses the symbol,
after completing the index (pairs with that symbol may not be followed).
"""

from __future__ import annotations

from heapq import heapify, heappop, heappush, heapreplace

from lmlab.errors import LmlabError
from lmlab.tokenizers.gc_pause import gc_paused
from lmlab.tokenizers.pair_index import CODE_BITS, POSITION_BITS, index_pairs, pair_text
from lmlab.tokenizers.string_words import (
    StringMergeLearner,
    first_occurrence,
    merge_words,
    neighbour_groups,
    pair_changes,
    unused_characters,
)

_KEY = 2 * CODE_BITS  # bits of a pair key
_PAIR = (1 << _KEY) - 1
_FIRST = (1 << (2 * POSITION_BITS)) - 1
_LEVEL = 2 * POSITION_BITS + _KEY  # heap entry: -count << _LEVEL | first << _KEY | pair
_BELOW = (1 << _LEVEL) - 1


def learn_char_merges(word_counts: dict[str, int], num_merges: int, *, end: str = "", min_count: int = 1,
                      progress: bool = False, max_new_symbols: int | None = None) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` frequency merges from ``word_counts``; return them in the order learned.

    ``word_counts`` maps each distinct word, *one character per initial symbol*, to how often it
    occurs, in the order the words first occur (ties go to the pair seen first); ``end`` (at most
    one character: character BPE's end-of-word ``_``) follows every word. Learning stops
    early when no pair occurs ``min_count`` times, or once ``max_new_symbols`` distinct new
    symbols exist. The result equals ``learn_merges({(*w, *end): n ...}, num_merges, ...)``.
    """
    if len(end) > 1:
        raise LmlabError(f"the end-of-word symbol must be one character, got {end!r}", "pass e.g. end='_'")
    if num_merges < 0:
        raise LmlabError(f"number of merges must be >= 0, got {num_merges}", "pass a non-negative number")
    with gc_paused():  # many small containers and no cycles: collections would only rescan them
        learner = _CharMergeLearner(word_counts, end, min_count)
        merges = learner.run(num_merges, progress, max_new_symbols)
        del learner  # freed while the collector is paused
    return merges


class _CharMergeLearner(StringMergeLearner):
    """State of one learning run (see the module docstring)."""

    first_floor = 8  # pairs seen fewer times are not followed until the best pair is that rare

    def __init__(self, word_counts: dict[str, int], end: str = "", min_count: int = 1):
        self.min_count = max(1, min_count)  # no pair seen fewer times is merged
        words = list(word_counts)
        self.counts: list[int] = list(word_counts.values())
        alphabet = set("".join(words)) | set(end)
        self.text: dict[str, str] = {c: c for c in alphabet}  # symbol char -> its string
        self.code: dict[str, str] = dict(self.text)  # string -> symbol char
        self.unit: dict[str, int] = dict.fromkeys(alphabet, 1)
        self.unused = unused_characters(alphabet)
        self.edge = s = next(self.unused)
        self.words = [s + word + end + s for word in words]
        self.pairs: dict[int, list] = {}
        self.heap: list[int] = []
        self._index(self.first_floor)

    def _index(self, floor: int) -> None:
        """Follow every pair seen ``floor`` or more times (counted afresh from the words)."""
        pairs = self.pairs
        added = []
        for key, c, ws, first in index_pairs(self.words, self.counts, self.edge, self.unit, floor):
            if key not in pairs:  # (a followed pair's count, words and bound are already right)
                entry = -c << _LEVEL | first << _KEY | key
                pairs[key] = [c, ws, entry, True]
                added.append(entry)
        self.heap += added
        heapify(self.heap)
        self.floor = floor

    def _pop_best(self) -> int | None:
        """Remove and return the best pair, or None when no pair occurs ``min_count`` times.

        The top entry wins once its count is current, no unfollowed pair can match it, and its
        first occurrence is exact whenever another entry has the same count (the tie-break)."""
        heap, pairs, min_count = self.heap, self.pairs, self.min_count
        while True:
            if not heap:
                if self.floor <= min_count:
                    return None
                self._index(self.floor // 4 or 1)
                heap, pairs = self.heap, self.pairs
                continue
            entry = heap[0]
            key = entry & _PAIR
            rec = pairs.get(key)
            if rec is None or rec[2] != entry:  # the pair is gone, or has a newer entry
                heappop(heap)
                continue
            c = rec[0]
            level = entry >> _LEVEL
            if level != -c:
                if -level < min_count and self.floor <= min_count:
                    return None
                rec[2] = entry & _BELOW | -c << _LEVEL
                heapreplace(heap, rec[2])
                continue
            if c < self.floor and self.floor > min_count:  # rarer pairs were not followed: follow them now
                self._index(self.floor // 4 or 1)
                heap, pairs = self.heap, self.pairs
                continue
            if c < min_count:
                return None
            if not rec[3]:
                n = len(heap)
                if (n > 1 and heap[1] >> _LEVEL == level) or (n > 2 and heap[2] >> _LEVEL == level):
                    # the exact first occurrence; the stale words before it leave the record
                    first, rec[1] = first_occurrence(self.words, rec[1], pair_text(key), self.unit)
                    rec[3] = True
                    if first != (entry >> _KEY) & _FIRST:
                        rec[2] = level << _LEVEL | first << _KEY | key
                        heapreplace(heap, rec[2])
                        continue
            heappop(heap)
            return key

    def _merge(self, key: int, new: str, fresh: bool) -> None:
        """Replace pair ``key`` by symbol ``new`` in every word holding it and update the pair records.

        ``fresh``: ``new`` is a new symbol, so no pair with it exists yet."""
        ab = pair_text(key)
        words, pairs = self.words, self.pairs
        left, right, multi, _ = merge_words(words, pairs.pop(key)[1], ab, new, self.edge)
        for w, word, nw in multi:
            self._merge_multi(w, word, nw, ab)
        fresh = fresh and not multi
        floor = self.floor
        heap = self.heap
        unit = self.unit.__getitem__
        for lost, gained, n, w0, ws in neighbour_groups(left, right, self.counts, key, new):
            rec = pairs.get(lost)
            if rec is not None:  # (None: a pair not followed, or the merged pair itself: a a a)
                rec[3] = False
                rec[0] -= n
                if not rec[0]:
                    del pairs[lost]
            rec = None if fresh else pairs.get(gained)
            if rec is None:
                if n >= floor:  # a new pair: its first occurrence is the first in its first word
                    word = words[w0]
                    first = w0 << POSITION_BITS | sum(map(unit, word[1:word.find(pair_text(gained))]))
                    entry = -n << _LEVEL | first << _KEY | gained
                    pairs[gained] = [n, ws, entry, True]
                    heappush(heap, entry)
            else:
                self._gain(gained, rec, n, ws)

    def _gain(self, key: int, rec: list, n: int, ws: list[int]) -> None:
        """A followed pair gained ``n`` occurrences in the words ``ws``: a new entry (count up)."""
        rec[0] += n
        rec[1].extend(ws)
        rec[3] = False
        first = min((rec[2] >> _KEY) & _FIRST, min(ws) << POSITION_BITS)
        rec[2] = -rec[0] << _LEVEL | first << _KEY | key
        heappush(self.heap, rec[2])

    def _merge_multi(self, w: int, word: str, nw: str, ab: str) -> None:
        """Count changes of a word that held the merged pair ``ab`` more than once (now ``nw``)."""
        n = self.counts[w]
        pairs = self.pairs
        diff = pair_changes(word, nw, ab)
        for p, k in diff.items():
            if k <= 0:
                continue
            rec = pairs.get(p)
            if rec is None:
                entry = -k * n << _LEVEL | w << (POSITION_BITS + _KEY) | p
                pairs[p] = [k * n, [w], entry, False]
                heappush(self.heap, entry)
            else:
                self._gain(p, rec, k * n, [w])
        for p, k in diff.items():
            if k >= 0:
                continue
            rec = pairs.get(p)
            if rec is not None:
                rec[3] = False
                rec[0] += k * n
                if not rec[0]:
                    del pairs[p]

    def _new_symbol(self, key: int) -> tuple[str, str, str, bool]:
        """The pair's two strings, the merged symbol's character and whether it is new."""
        ca, cb = pair_text(key)
        a, b = self.text[ca], self.text[cb]
        s = a + b
        new = self.code.get(s)
        if new is None:
            new = self.code[s] = next(self.unused)
            self.text[new] = s
            self.unit[new] = len(s)
            return a, b, new, True
        if self.floor > 1:  # pairs with the old symbol may be unfollowed
            self._index(1)
        return a, b, new, False

"""WordPiece's merge learner for the likelihood gain, with certified lazy re-scoring.

The gain of merging the ``c`` occurrences of a pair ``(a, b)`` is the exact change of the corpus
log-likelihood under a unigram model of the symbols (see :mod:`lmlab.tokenizers.merge_trainer`)::

    gain = f(c) + [f(N) - f(N - c)] - D_a(c) - D_b(c),   D_s(c) = f(n_s) - f(n_s - c),  f(x) = x log x

A merge lowers ``n_a`` and ``n_b``, which *raises* the gain of every pair containing ``a`` or
``b``: re-scoring all of them after every merge (what ``learn_merges(score="gain")`` does, bar
its parking of rare pairs) costs far more than the merges themselves. This learner re-scores a
pair only when the counts of its symbols have fallen far enough to matter.

Every live pair has one valid heap entry whose value, its *cap*, is an upper bound on its gain,
and a *certificate*: two thresholds ``w_a``, ``w_b`` such that the cap holds as long as
``n_a >= w_a`` and ``n_b >= w_b``. The certificate rests on three facts:

* ``D_s(c)`` grows with ``n_s``, so the gain only rises as ``n_a`` or ``n_b`` falls; ``D_s(c)``
  is the integral of ``log x + 1`` over ``[n_s - c, n_s]`` and ``log`` is concave, so ``D_s(c) >=
  c ((log(n_s - c) + log n_s) / 2 + 1)`` (the trapezoid), and a threshold for a rise of at most
  ``h`` has a closed form;
* the gain grows with ``N``, and ``N`` only falls;
* as a function of ``c`` the gain is convex with value 0 at ``c = 0``, so a pair that loses
  occurrences (a neighbouring merge took them) gains at most ``max(0, gain)``: caps are never
  negative. A pair that *gains* occurrences (it contains the new symbol) is re-scored at once.

A cap is the exact gain plus a slack (a share of the distance to the last merge's gain), split
between the two symbols. No pair seen ``c`` times can ever gain more than ``f(N) - f(N - c) -
f(c)`` (``D_s(c) >= f(c)``), so a cap at that bound needs no thresholds at all: most rare pairs
live there. After a merge only the pairs whose thresholds the new counts crossed are re-scored
(a heap of thresholds per symbol finds them). An entry that reaches the top of the heap is
re-scored (exactly, if it is close to the last merge's gain); an exact entry at the top is the
best pair, and ties are broken as in ``merge_trainer`` (higher count, then first occurrence). The
merges are therefore the same as the reference learner's, which the tests check on a real corpus.

If even the best pair's gain is negative (only weakly associated symbols left, e.g. a small
corpus of random two-letter strings), caps of 0 bound nothing, and the learner re-scores every
pair before each remaining merge instead (slow, but such corpora are tiny).

The words are kept as BPE's string learner keeps them (:mod:`lmlab.tokenizers.char_merge_learner`):
every symbol (``low``, ``##s``...) is one character, a word is the string of its symbols between
two ``edge`` characters, so ``word.find(ab)`` rejects a word that no longer holds the pair and
``word.replace(ab, x)`` merges its occurrences left to right, both in C. A pair ``(a, b)`` is the
int ``ord(a) << 21 | ord(b)``; its record is ``[count, words, first, cap, w_a, w_b]``: the weighted
count (exact), the words that hold it or once did, a lower bound on its first occurrence
``word << 32 | position`` (in initial symbols), the value of its valid heap entry (``None``: none)
and its thresholds (0: none), so that one dictionary look-up finds everything about a pair.
"""

from __future__ import annotations

import operator
from collections import defaultdict
from collections.abc import Callable
from heapq import heapify, heappop, heappush, heapreplace
from itertools import chain
from math import inf, log

from lmlab.errors import LmlabError
from lmlab.tokenizers.gain_certificate import SAFETY as _SAFETY
from lmlab.tokenizers.gain_certificate import count_threshold, symbol_counts
from lmlab.tokenizers.gc_pause import gc_paused
from lmlab.tokenizers.merge_trainer import _xlogx
from lmlab.tokenizers.pair_index import CODE_BITS, POSITION_BITS, SYMBOL_MASK, index_pairs, pair_text
from lmlab.tokenizers.string_words import (
    StringMergeLearner,
    first_occurrence,
    merge_words,
    neighbour_groups,
    pair_changes,
    unused_characters,
)

_KEY = 2 * CODE_BITS  # a threshold entry packs -(w << _KEY | pair) in one int
_PAIR = (1 << _KEY) - 1
_EDGE = "\0"  # wraps every word; no symbol's character
# a pair's record (see the module docstring)
_COUNT, _WORDS, _FIRST, _CAP, _WA, _WB = range(6)
_PARKED = -1.0  # the cap of a parked pair (caps are never negative): it has no heap entry


def learn_gain_merges(word_counts: dict[tuple[str, ...], int], num_merges: int, *,
                      join: Callable[[str, str], str] = operator.add,
                      min_count: int = 1, progress: bool = False,
                      max_new_symbols: int | None = None) -> list[tuple[str, str]]:
    """The merges of ``learn_merges(word_counts, num_merges, score="gain", ...)``, learned faster."""
    if num_merges < 0:
        raise LmlabError(f"number of merges must be >= 0, got {num_merges}", "pass a non-negative number")
    with gc_paused():  # millions of short-lived tuples and no cycles: collections would only rescan them
        learner = _GainLearner(word_counts, join, min_count)
        merges = learner.run(num_merges, progress, max_new_symbols)
        del learner
    return merges


class _GainLearner(StringMergeLearner):
    """Words as strings, pair records, a heap of gain caps (``gheap``) and per-symbol threshold
    heaps (``watch``, indexed by code point)."""

    slack_share = 0.2  # a new cap: the exact gain plus this share of the distance to the last merge's gain
    exact_near = 0.9  # entries popped within this fraction of the last merge's gain become exact
    heap_slack = 4096  # stale cap entries tolerated beyond twice the live pairs
    watch_slack = 4096  # stale threshold entries tolerated beyond three per live pair
    park_share = 0.5  # rare pairs are parked while their bound is under this share of the best gain

    def __init__(self, word_counts: dict[tuple[str, ...], int], join: Callable[[str, str], str],
                 min_count: int):
        self.join = join
        self.min_count = max(1, min_count)  # no pair seen fewer times is merged
        self.codes = unused_characters({_EDGE})  # one character per symbol, the lowest free first
        self.code: dict[str, str] = dict(zip(dict.fromkeys(chain.from_iterable(word_counts)), self.codes))
        self.text: dict[str, str] = {c: s for s, c in self.code.items()}  # symbol character -> its string
        self.unit: dict[str, int] = dict.fromkeys(self.text, 1)  # initial symbols a symbol spans
        to_code = self.code.__getitem__
        self.words = [_EDGE + "".join(map(to_code, w)) + _EDGE for w in word_counts]
        self.counts: list[int] = list(word_counts.values())
        size = max(map(ord, self.text), default=0) + 1
        self.count: list[int] = symbol_counts(self.words, self.counts, size, _EDGE)  # n_s by code point
        self.total = sum(self.count)  # N
        self.f_total = _xlogx(self.total)
        self.flog = [_xlogx(n) for n in self.count]  # n_s log n_s
        self.watch: list[list[int]] = [[] for _ in range(size)]
        self.watch_entries = 0
        self.best = inf  # gain of the last merge: sets the slack of new caps
        self.exhaustive = False  # every pair re-scored before each merge (negative gains only)
        self.gheap: list[tuple] = []
        self.pairs: dict[int, list] = {}
        self.gained: list[int] = []  # pairs that gained occurrences in the merge under way
        # pairs (a, b), a != b, seen at most ``level`` times are parked: no heap entry, no thresholds
        # (see _unpark); ``parked`` holds them by their count when parked
        self.level = 0
        self.park_bound = -inf  # _upper(level) when it was set: no parked pair gains more
        self.parked: defaultdict[int, list[int]] = defaultdict(list)
        if not self.text:
            return
        pairs = self.pairs
        scored = []
        for key, c, ws, first in index_pairs(self.words, self.counts, _EDGE, self.unit, 1):
            pairs[key] = [c, ws, first, None, 0, 0]
            if c >= self.min_count:
                scored.append((key, c, self._evaluate(key, c)))
        level = 0
        if scored:  # park the pairs that cannot win while a share of the best gain is beyond their reach
            level = self._level_for(max(e[0] for _, _, e in scored), max(c for _, c, _ in scored))
            self._park_at(level)
        parked = self.parked
        for key, c, (g, upper, da, db) in scored:
            rec = pairs[key]
            if c <= level and upper < inf:
                rec[_CAP] = _PARKED
                parked[c].append(key)
            else:
                self._schedule(key, rec, c, g, 0.0, True, upper, da, db)

    # ------------------------------------------------------------------ scores and certificates
    _threshold = staticmethod(count_threshold)

    def _evaluate(self, key: int, c: int) -> tuple[float, float, float, float]:
        """``(gain, upper, D_a, D_b)``: the exact gain, the most a pair seen ``c`` times can ever gain
        (``inf`` for ``(a, a)``) and the two ``D`` terms (0 for ``(a, a)``, whose certificate is
        ``n_a`` itself: any occurrence it loses also lowers ``n_a``). The gain is the very same float
        as the reference learner's ``_score`` (same operations in the same order), so ties stay ties.
        """
        a, b = key >> CODE_BITS, key & SYMBOL_MASK
        flog, count, rest = self.flog, self.count, self.total - c
        clogc = c * log(c)
        frest = self.f_total - rest * log(rest)
        if a == b:
            left = count[a] - 2 * c
            parts = (left * log(left) if left > 0 else 0.0) - flog[a]
            # no count-only bound: overlapping runs (a a a) count twice in c, so 2c may exceed n_a
            return clogc + frest + parts, inf, 0.0, 0.0
        left, right = count[a] - c, count[b] - c
        da = flog[a] - ((left * log(left)) if left else 0.0)
        db = flog[b] - ((right * log(right)) if right else 0.0)
        # f convex: D_s(c) >= f(c) whatever n_s >= c, so the gain is at most f(N) - f(N - c) - f(c), which
        # grows with c and falls with N (a pair that loses occurrences stays under it); the margin
        # covers rounding (the gain, summed differently, may round above it when n_a = n_b = c)
        upper = (frest - clogc) + _SAFETY * (frest + clogc + 1.0)
        return clogc + frest + (-da + -db), upper, da, db

    def _schedule(self, key: int, rec: list, c: int, g: float, slack: float, force: bool, upper: float,
                  da: float, db: float, replace_top: bool = False) -> None:
        """Give ``key`` (record ``rec``, ``c`` occurrences, exact gain ``g``) a cap of ``g + slack`` (at
        least 0) and its certificate. Unless ``force``, a valid entry with a higher cap is kept instead
        of pushing a new one (its count is still an upper bound: only new pairs gain occurrences).
        A cap of at least ``upper``, the most a pair seen ``c`` times can ever gain, needs no
        thresholds. ``da``, ``db``: the pair's ``D_a(c)``, ``D_b(c)`` now (see :meth:`_evaluate`).
        ``replace_top``: the new entry replaces the top of the heap (the pair's own, with ``force``)."""
        cap = g + slack
        old = None if force else rec[_CAP]
        if old is not None and old >= cap:
            cap = old
        else:
            if cap < 0.0:
                cap = 0.0
            rec[_CAP] = cap
            (heapreplace if replace_top else heappush)(self.gheap, (-cap, -c, rec[_FIRST], key))
        if cap >= upper:
            rec[_WA] = rec[_WB] = 0
            return
        a, b = key >> CODE_BITS, key & SYMBOL_MASK
        count = self.count
        if a == b or cap == g:
            wa, wb = count[a], count[b]
        else:
            rise, threshold = (cap - g) / 2, self._threshold
            wa = threshold(count[a], da, c, rise)
            wb = threshold(count[b], db, c, rise)
        if rec[_WA] != wa:
            rec[_WA] = wa
            heappush(self.watch[a], -(wa << _KEY | key))
            self.watch_entries += 1
        if rec[_WB] != wb:
            rec[_WB] = wb
            if a != b:
                heappush(self.watch[b], -(wb << _KEY | key))
                self.watch_entries += 1

    def _recheck(self, key: int, rec: list, force: bool = False) -> None:
        """Re-score ``key`` with a fresh slack (or retire it: below ``min_count`` it never wins; or park
        it: seen at most ``level`` times, it cannot win yet)."""
        c = rec[_COUNT]
        if c < self.min_count:
            rec[_CAP] = None
            rec[_WA] = rec[_WB] = 0
            return
        if c <= self.level and key >> CODE_BITS != key & SYMBOL_MASK:
            rec[_CAP] = _PARKED
            rec[_WA] = rec[_WB] = 0
            self.parked[c].append(key)
            return
        g, upper, da, db = self._evaluate(key, c)
        self._schedule(key, rec, c, g, self._slack(g, upper), force, upper, da, db)

    def _slack(self, g: float, upper: float) -> float:
        """A share of the distance to the last merge's gain, but never above ``upper``."""
        if not g < self.best < inf:
            return 0.0
        return min((self.best - g) * self.slack_share, upper - g)

    def _upper(self, c: int) -> float:
        """Upper bound on the gain of any pair (a, b), a != b, seen at most ``c`` times, now and later
        (``N`` only falls): ``f(N) - f(N - c) - f(c)``, which grows with ``c`` up to ``N / 2`` only,
        so it is taken at ``min(c, N / 2)`` (see ``merge_trainer._MergeLearner._upper``); the
        margin covers rounding."""
        m = min(c, self.total / 2)
        u = self.f_total - _xlogx(self.total - m) - _xlogx(m)
        return u + _SAFETY * (abs(u) + 1.0)

    def _level_for(self, g: float, most: int) -> int:
        """The highest level up to ``most`` whose bound is under ``park_share * g`` (0: none)."""
        target = self.park_share * g
        if most <= 0 or self._upper(1) >= target:
            return 0
        lo, hi = 1, most  # _upper(lo) < target; find the last such count (_upper grows with it)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._upper(mid) < target:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _park_at(self, level: int) -> None:
        self.level = level
        self.park_bound = self._upper(level) if level else -inf

    def _unpark(self, g: float) -> None:
        """The best entry's gain ``g`` does not beat the parked pairs' bound: lower the level until
        the bound is under ``g / 2`` and re-score the pairs above it (some are parked again, lower:
        their counts fell since)."""
        level = self._level_for(g, self.level - 1)
        self._park_at(level)
        parked, pairs, recheck = self.parked, self.pairs, self._recheck
        for c in [c for c in parked if c > level]:
            for key in parked.pop(c):
                rec = pairs.get(key)
                if rec is not None and rec[_CAP] == _PARKED:
                    rec[_CAP] = None
                    recheck(key, rec, True)

    # ------------------------------------------------------------------ choosing a pair
    def _pop_best(self) -> int | None:
        """Remove and return the best pair, or None when no pair occurs ``min_count`` times."""
        heap, pairs, min_count = self.gheap, self.pairs, self.min_count
        while heap or self.level:
            if not heap:  # only parked pairs are left
                self._unpark(-inf)
                continue
            top = heap[0]
            key = top[-1]
            rec = pairs.get(key)
            if rec is None or rec[_CAP] != -top[0]:
                heappop(heap)  # stale: the pair has a newer entry, or is gone
                continue
            c = rec[_COUNT]
            g, upper, da, db = self._evaluate(key, c)
            if g != -top[0] or c != -top[1]:
                if g < 0.0 and top[0] == 0.0 and not self.exhaustive:
                    self._rescore_all()  # the best cap is 0 but the gain is negative: no cap holds
                    continue
                n = len(heap)  # the entry under the top is the better of its two children
                if n > 1 and g > -min(heap[1][0], heap[2][0] if n > 2 else inf) and c >= min_count \
                        and not self.exhaustive and g > self.park_bound:
                    heappop(heap)  # above every other cap: the best pair, no tie possible
                    self.best = g
                    return key
                slack = self._slack(g, upper) if g < self.exact_near * self.best else 0.0
                # the new entry takes the top's place (one sift instead of a pop and a push)
                self._schedule(key, rec, c, g, slack if g + slack < -top[0] else 0.0, True, upper, da, db,
                               True)
                continue
            prefix = top[:2]
            n = len(heap)
            if (n > 1 and heap[1][:2] == prefix) or (n > 2 and heap[2][:2] == prefix):
                # the exact first occurrence; the stale words before it leave the record
                true_first, rec[_WORDS] = first_occurrence(self.words, rec[_WORDS], pair_text(key), self.unit)
                if true_first != top[2]:
                    rec[_FIRST] = true_first
                    heapreplace(heap, (*prefix, true_first, key))
                    continue
            if g <= self.park_bound:
                if g <= self._upper(self.level):  # (the bound falls with N: take it now)
                    self._unpark(g)
                    continue
                self.park_bound = self._upper(self.level)
            heappop(heap)
            if c < min_count:  # fell below the minimum since it was scheduled: it never wins again
                rec[_CAP] = None
                rec[_WA] = rec[_WB] = 0
                continue
            self.best = g
            return key
        return None

    def _rescore_all(self) -> None:
        """Exact entries for every pair (no certificates: the next merge does this again)."""
        self.exhaustive = True
        self._park_at(0)
        self.parked.clear()
        heap = self.gheap
        heap.clear()  # in place: _pop_best holds the list
        self.watch = [[] for _ in self.watch]
        self.watch_entries = 0
        for key, rec in self.pairs.items():
            rec[_CAP] = None
            rec[_WA] = rec[_WB] = 0
            c = rec[_COUNT]
            if c >= self.min_count:
                g = rec[_CAP] = self._evaluate(key, c)[0]
                heap.append((-g, -c, rec[_FIRST], key))
        heapify(heap)

    # ------------------------------------------------------------------ one merge
    def _merge(self, key: int, new: str, fresh: bool) -> None:
        """Replace pair ``key`` by symbol ``new`` in every word holding it, update the pair records
        and symbol counts, and re-score the pairs that gained occurrences or crossed a threshold.

        Each occurrence ``prev a b nxt`` turns ``(prev, a)`` into ``(prev, new)`` and ``(b, nxt)`` into
        ``(new, nxt)``; the words are grouped by neighbour and the counts change once per neighbour,
        with the summed word counts. ``fresh``: ``new`` is a new symbol, so no pair with it exists yet.
        """
        a, b = key >> CODE_BITS, key & SYMBOL_MASK
        ab = pair_text(key)
        counts, pairs = self.counts, self.pairs
        rec = pairs.pop(key)
        left, right, multi, starts = merge_words(self.words, rec[_WORDS], ab, new, _EDGE)
        if a != b:
            merged = rec[_COUNT]
        else:  # runs a a a count twice in the pair count but merge once: count the words merged once
            merged = sum(counts[w] for ws in chain(left.values(), (starts,)) for w in ws) + sum(
                counts[w] * (len(word) - len(nw)) for w, word, nw in multi)
        gained = self.gained
        for w, word, nw in multi:
            self._merge_multi(w, word, nw, ab)
        fresh = fresh and not multi
        for lost, gain, n, w0, ws in neighbour_groups(left, right, counts, key, new):
            r = pairs.get(lost)
            if r is not None:  # (None: the merged pair itself, in a run a a a)
                r[_COUNT] -= n
                if not r[_COUNT]:
                    del pairs[lost]
            r = None if fresh else pairs.get(gain)
            if r is None:  # a new pair: its first occurrence is at least at the start of its first word
                pairs[gain] = [n, ws, w0 << POSITION_BITS, None, 0, 0]
            else:
                r[_COUNT] += n
                r[_WORDS].extend(ws)
                r[_FIRST] = min(r[_FIRST], w0 << POSITION_BITS)
            gained.append(gain)
        n_new = ord(new)
        count = self.count
        count[a] -= merged
        count[b] -= merged
        count[n_new] += merged
        self.total -= merged
        self.f_total = _xlogx(self.total)
        flog = self.flog
        flog[a], flog[b], flog[n_new] = _xlogx(count[a]), _xlogx(count[b]), _xlogx(count[n_new])
        self.gained = []
        if self.exhaustive:
            self._rescore_all()
            return
        recheck = self._recheck
        for k in (gained if fresh else dict.fromkeys(gained)):  # their old caps are void
            r = pairs.get(k)
            if r is not None:
                recheck(k, r, True)
        popped = 0
        for sym in {a, b}:
            n, h = count[sym], self.watch[sym]
            limit = -((n + 1) << _KEY)  # entries up to it have w > n
            while h and h[0] <= limit:
                e = -heappop(h)
                popped += 1
                k = e & _PAIR
                r = pairs.get(k)
                if r is not None and r[_WA if k >> CODE_BITS == sym else _WB] == e >> _KEY:
                    recheck(k, r)
        self.watch_entries -= popped
        self._compact()

    def _merge_multi(self, w: int, word: str, nw: str, ab: str) -> None:
        """Count changes of a word that held the merged pair ``ab`` more than once (now ``nw``)."""
        n = self.counts[w]
        pairs, gained = self.pairs, self.gained
        for p, k in pair_changes(word, nw, ab).items():
            r = pairs.get(p)
            if k > 0:
                if r is None:
                    pairs[p] = [k * n, [w], w << POSITION_BITS, None, 0, 0]
                else:
                    r[_COUNT] += k * n
                    r[_WORDS].append(w)
                    r[_FIRST] = min(r[_FIRST], w << POSITION_BITS)
                gained.append(p)
            elif k < 0 and r is not None:  # (None: the merged pair itself)
                r[_COUNT] += k * n
                if not r[_COUNT]:
                    del pairs[p]

    def _compact(self) -> None:
        """Drop stale entries of both heaps once they outnumber the live ones."""
        pairs = self.pairs
        if len(self.gheap) > 2 * len(pairs) + self.heap_slack:
            live = [e for e in self.gheap if (r := pairs.get(e[-1])) is not None and r[_CAP] == -e[0]]
            self.gheap[:] = live  # in place, like _rescore_all
            heapify(self.gheap)
        if self.watch_entries > 3 * len(pairs) + self.watch_slack:
            watch = self.watch = [[] for _ in self.watch]
            for k, r in pairs.items():
                a, b = k >> CODE_BITS, k & SYMBOL_MASK
                if r[_WA]:
                    watch[a].append(-(r[_WA] << _KEY | k))
                if r[_WB] and a != b:
                    watch[b].append(-(r[_WB] << _KEY | k))
            for h in watch:
                heapify(h)
            self.watch_entries = sum(map(len, watch))

    def _new_symbol(self, key: int) -> tuple[str, str, str, bool]:
        """The pair's two strings, the merged symbol's character and whether it is new."""
        ca, cb = pair_text(key)
        a, b = self.text[ca], self.text[cb]
        s = self.join(a, b)
        new = self.code.get(s)
        if new is not None:
            return a, b, new, False
        new = self.code[s] = next(self.codes)
        self.text[new] = s
        self.unit[new] = self.unit[ca] + self.unit[cb]
        self._grow(ord(new) + 1)
        return a, b, new, True

    def _grow(self, size: int) -> None:
        """Room for symbols up to code point ``size - 1`` in the per-symbol lists."""
        while len(self.count) < size:
            self.count.append(0)
            self.flog.append(0.0)
            self.watch.append([])

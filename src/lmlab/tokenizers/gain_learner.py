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
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from heapq import heapify, heappop, heappush, heapreplace
from math import exp, inf, log, sqrt

from lmlab.errors import LmlabError
from lmlab.tokenizers.gc_pause import gc_paused
from lmlab.tokenizers.merge_trainer import _LOW, _SHIFT, _MergeLearner, _xlogx

_WATCH = 2 * _SHIFT  # a threshold entry packs (w, pair) in one int
_PAIR = (1 << _WATCH) - 1
_SAFETY = 1e-9  # relative margin that keeps certificates valid under floating-point rounding
_FREE = (0, 0)  # the thresholds of a pair whose cap holds whatever the counts: none


def learn_gain_merges(word_counts: dict[tuple[str, ...], int], num_merges: int, *,
                      join: Callable[[str, str], str] = operator.add,
                      min_count: int = 1, progress: bool = False,
                      max_new_symbols: int | None = None) -> list[tuple[str, str]]:
    """The merges of ``learn_merges(word_counts, num_merges, score="gain", ...)``, learned faster."""
    if num_merges < 0:
        raise LmlabError(f"number of merges must be >= 0, got {num_merges}", "pass a non-negative number")
    with gc_paused():  # millions of short-lived tuples and no cycles: collections would only rescan them
        learner = _GainLearner(word_counts, join, max(1, min_count))
        merges = learner.run(num_merges, max(1, min_count), progress, max_new_symbols)
        del learner
    return merges


class _GainLearner(_MergeLearner):
    """The shared learner's word index and merge loop (run as for ``"frequency"``), with its own
    heap of gain caps (``gheap``) and per-symbol threshold heaps (``watch``)."""

    slack_share = 0.2  # a new cap: the exact gain plus this share of the distance to the last merge's gain
    exact_near = 0.9  # entries popped within this fraction of the last merge's gain become exact
    watch_slack = 4096  # stale threshold entries tolerated beyond three per live pair

    def __init__(self, word_counts: dict[tuple[str, ...], int], join: Callable[[str, str], str],
                 min_count: int):
        super().__init__(word_counts, "frequency", join, count_symbols=True)
        self.heap = []
        self.gained = []  # the shared merge loop appends the pairs that gained occurrences here
        self.min_count = min_count
        self.cap: dict[int, float] = {}  # pair -> the value of its valid entry in gheap
        self.watched: dict[int, tuple[int, int]] = {}  # pair -> (w_a, w_b) of its certificate
        # symbol -> heap of -(w << 64 | pair): the pairs to re-check once its count falls below w
        self.watch: list[list[int]] = [[] for _ in self.symbols]
        self.watch_entries = 0
        self.best = inf  # gain of the last merge: sets the slack of new caps
        self.exhaustive = False  # every pair re-scored before each merge (negative gains only)
        self.gheap: list[tuple] = []
        for key, c in self.pair_count.items():
            if c >= min_count:
                g, upper, da, db = self._evaluate(key, c)
                self._schedule(key, c, g, 0.0, True, upper, da, db)

    # ------------------------------------------------------------------ scores and certificates
    def _evaluate(self, key: int, c: int) -> tuple[float, float, float, float]:
        """``(gain, upper, D_a, D_b)``: the exact gain, the most a pair seen ``c`` times can ever gain
        (``inf`` for ``(a, a)``) and the two ``D`` terms (0 for ``(a, a)``, whose certificate is
        ``n_a`` itself: any occurrence it loses also lowers ``n_a``). The gain is the very same float
        as the reference learner's ``_score`` (same operations in the same order), so ties stay ties.
        """
        a, b = key >> _SHIFT, key & _LOW
        flog, count, rest = self.flog, self.sym_count, self.total - c
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

    @staticmethod
    def _threshold(n: int, d: float, c: int, rise: float) -> int:
        """Smallest count of a symbol (now ``n``, with ``D(c) = d``) down to which the gain of a pair
        seen ``c`` times rises by at most ``rise`` through ``D`` (``n`` when no fall is certified)."""
        rise -= _SAFETY * (abs(d) + 1.0)
        if rise <= 0.0:
            return n
        target = d - rise
        if target <= c * log(c):  # D(c) >= f(c) for every count >= c
            return c
        # D(c) at count m is the integral of log x + 1 over [m - c, m]; log is concave, so the integral is
        # at least the trapezoid c ((log(m - c) + log m) / 2 + 1), which reaches the target once
        # m (m - c) >= y = exp(2 (target / c - 1)), i.e. from m = (c + sqrt(c^2 + 4 y)) / 2 on. (The
        # mean-value bound c (log(m - c) + 1) is far looser when m - c is small next to c: on the
        # benchmark corpus the trapezoid saves 5% of the re-scorings, as many as the exact threshold.)
        x = 2.0 * (target / c - 1.0)
        if x > 700.0:
            return n
        m = (c + sqrt(c * c + 4.0 * exp(x) * (1.0 + _SAFETY))) * (0.5 + _SAFETY)
        return min(n, int(m) + 1)

    def _schedule(self, key: int, c: int, g: float, slack: float, force: bool, upper: float, da: float,
                  db: float, replace_top: bool = False) -> None:
        """Give ``key`` (``c`` occurrences, exact gain ``g``) a cap of ``g + slack`` (at least 0) and
        its certificate. Unless ``force``, a valid entry with a higher cap is kept instead of
        pushing a new one (its count is still an upper bound: only new pairs gain occurrences).
        A cap of at least ``upper``, the most a pair seen ``c`` times can ever gain, needs no
        thresholds. ``da``, ``db``: the pair's ``D_a(c)``, ``D_b(c)`` now (see :meth:`_evaluate`).
        ``replace_top``: the new entry replaces the top of the heap (the pair's own, with ``force``)."""
        cap = g + slack
        old = None if force else self.cap.get(key)
        if old is not None and old >= cap:
            cap = old
        else:
            if cap < 0.0:
                cap = 0.0
            self.cap[key] = cap
            (heapreplace if replace_top else heappush)(self.gheap, (-cap, -c, *self.bound[key], key))
        watched = self.watched
        if cap >= upper:
            watched[key] = _FREE
            return
        a, b = key >> _SHIFT, key & _LOW
        count = self.sym_count
        if a == b or cap == g:
            wa, wb = count[a], count[b]
        else:
            rise, threshold = (cap - g) / 2, self._threshold
            wa = threshold(count[a], da, c, rise)
            wb = threshold(count[b], db, c, rise)
        prev = watched.get(key, _FREE)
        watched[key] = (wa, wb)
        if prev[0] != wa:
            heappush(self.watch[a], -(wa << _WATCH | key))
            self.watch_entries += 1
        if prev[1] != wb and a != b:
            heappush(self.watch[b], -(wb << _WATCH | key))
            self.watch_entries += 1

    def _recheck(self, key: int, force: bool = False) -> None:
        """Re-score ``key`` with a fresh slack (or retire it: below ``min_count`` it never wins)."""
        c = self.pair_count[key]
        if c < self.min_count:
            self.cap.pop(key, None)
            self.watched.pop(key, None)
            return
        g, upper, da, db = self._evaluate(key, c)
        best = self.best
        slack = min((best - g) * self.slack_share, upper - g) if g < best < inf else 0.0  # as _slack
        self._schedule(key, c, g, slack, force, upper, da, db)

    def _slack(self, g: float, upper: float) -> float:
        """A share of the distance to the last merge's gain, but never above ``upper``."""
        if not g < self.best < inf:
            return 0.0
        return min((self.best - g) * self.slack_share, upper - g)

    # ------------------------------------------------------------------ choosing a pair
    def _pop_best(self, min_count: int) -> int | None:
        heap, cap, pair_count = self.gheap, self.cap, self.pair_count
        while heap:
            top = heap[0]
            key = top[-1]
            if cap.get(key) != -top[0]:
                heappop(heap)  # stale: the pair has a newer entry, or is gone
                continue
            c = pair_count[key]
            g, upper, da, db = self._evaluate(key, c)
            if g != -top[0] or c != -top[1]:
                if g < 0.0 and top[0] == 0.0 and not self.exhaustive:
                    self._rescore_all()  # the best cap is 0 but the gain is negative: no cap holds
                    continue
                n = len(heap)  # the entry under the top is the better of its two children
                if n > 1 and g > -min(heap[1][0], heap[2][0] if n > 2 else inf) and c >= min_count \
                        and not self.exhaustive:
                    heappop(heap)
                    del cap[key]  # above every other cap: the best pair, no tie possible
                    self.best = g
                    return key
                slack = self._slack(g, upper) if g < self.exact_near * self.best else 0.0
                # the new entry takes the top's place (one sift instead of a pop and a push)
                self._schedule(key, c, g, slack if g + slack < -top[0] else 0.0, True, upper, da, db, True)
                continue
            prefix = top[:2]
            n = len(heap)
            if (n > 1 and heap[1][:2] == prefix) or (n > 2 and heap[2][:2] == prefix):
                true_first = self._first_occurrence(key)
                if true_first != top[2:4]:
                    self.bound[key] = true_first
                    heapreplace(heap, (*prefix, *true_first, key))
                    continue
            heappop(heap)
            if c < min_count:  # fell below the minimum since it was scheduled: it never wins again
                del cap[key]
                self.watched.pop(key, None)
                continue
            self.best = g
            return key
        return None

    def _rescore_all(self) -> None:
        """Exact entries for every pair (no certificates: the next merge does this again)."""
        self.exhaustive = True
        self.gheap.clear()  # in place: _pop_best holds the list
        self.cap.clear()
        self.watched.clear()
        self.watch = [[] for _ in self.symbols]
        for key, c in self.pair_count.items():
            if c >= self.min_count:
                g = self.cap[key] = self._evaluate(key, c)[0]
                self.gheap.append((-g, -c, *self.bound[key], key))
        heapify(self.gheap)

    # ------------------------------------------------------------------ one merge
    def _merge(self, key: int, new: int) -> None:
        a, b = key >> _SHIFT, key & _LOW
        merged = self.pair_count[key] if a != b else self._self_merges(key)
        super()._merge(key, new)  # words, pair counts, where, bounds; new pairs land in self.heap
        count = self.sym_count
        count[a] -= merged
        count[b] -= merged
        count[new] += merged
        self.total -= merged
        self.f_total = _xlogx(self.total)
        for sym in (a, b, new):
            self.flog[sym] = _xlogx(count[sym])
        gained, self.gained = self.gained, []
        if self.exhaustive:
            self._rescore_all()
            return
        for k in gained:  # pairs that gained occurrences: their old caps are void
            self._recheck(k, force=True)
        watched, recheck, popped = self.watched, self._recheck, 0
        for sym in {a, b}:
            n, h = count[sym], self.watch[sym]
            limit = -((n + 1) << _WATCH)  # entries up to it have w > n
            while h and h[0] <= limit:
                e = -heappop(h)
                popped += 1
                k = e & _PAIR
                t = watched.get(k)
                if t is not None and t[k >> _SHIFT != sym] == e >> _WATCH:
                    recheck(k)
        self.watch_entries -= popped
        self._compact()

    def _self_merges(self, key: int) -> int:
        """Occurrences of ``(a, a)`` a merge replaces: runs ``a a a`` count twice in the pair count
        but merge once (left to right, as the merge loop does)."""
        a = key >> _SHIFT
        merged = 0
        for w in self.where[key]:
            word, i, m = self.words[w], 0, 0
            while i < len(word) - 1:
                if word[i] == a and word[i + 1] == a:
                    m += 1
                    i += 2
                else:
                    i += 1
            merged += m * self.counts[w]
        return merged

    def _compact(self) -> None:
        """Drop stale entries of both heaps once they outnumber the live ones."""
        cap = self.cap
        if len(self.gheap) > 2 * len(cap) + self.heap_slack:
            self.gheap = [e for e in self.gheap if cap.get(e[-1]) == -e[0]]
            heapify(self.gheap)
        if self.watch_entries > 3 * len(self.watched) + self.watch_slack:
            self.watch = [[] for _ in self.symbols]
            for k, (wa, wb) in self.watched.items():
                a, b = k >> _SHIFT, k & _LOW
                self.watch[a].append(-(wa << _WATCH | k))
                if a != b:
                    self.watch[b].append(-(wb << _WATCH | k))
            for h in self.watch:
                heapify(h)
            self.watch_entries = sum(map(len, self.watch))

    def _drop(self, key: int) -> None:
        # the shared learner's pops written out (a call fewer for each of the ~60k dropped pairs)
        self.pair_count.pop(key, None)
        self.where.pop(key, None)
        self.bound.pop(key, None)
        self.cap.pop(key, None)
        self.watched.pop(key, None)

    def _new_symbol(self, key: int) -> tuple[int, bool]:
        out = super()._new_symbol(key)
        while len(self.watch) < len(self.symbols):
            self.watch.append([])
        return out

"""The general merge learner over symbol tuples: the reference for BPE's and WordPiece's learners.

Character and byte-level BPE learn with :mod:`lmlab.tokenizers.char_merge_learner`, which gives
the same merges as ``learn_merges(score="frequency")`` when every initial symbol is one character,
and WordPiece with :mod:`lmlab.tokenizers.gain_learner`, the same merges as
``learn_merges(score="gain")``; both are faster, and the tests compare them with this learner.
WordPiece's textbook ``"ratio"`` score learns with this one.

Byte-pair encoding as a token learner (Sennrich et al. 2016, "Neural Machine Translation of Rare
Words with Subword Units"; the lecture's BYTE-PAIR ENCODING(C, k)): start from the symbols of
every word, then k times find the best pair of adjacent symbols, add the merged symbol to the
vocabulary and replace the pair everywhere in the corpus.

The corpus is given as ``word_counts``: each distinct pre-tokenized chunk's symbol sequence and
how often it occurs, in the order the chunks first occur. Memory is therefore proportional to
the number of distinct chunks, never to corpus size, and the work of one merge is proportional
to the number of distinct words that contain the merged pair:

* ``pair_count``  pair -> weighted number of occurrences, kept exact by every merge;
* ``where``       pair -> the words that contain (or once contained) it, so a merge visits only
                  the words it changes;
* a heap of candidates with *lazy invalidation*: an entry's count may be stale (too high) after
  the pair lost occurrences; when a stale entry reaches the top it is re-queued with the true
  count instead of searching the heap on every change.

Scores:

* ``"frequency"`` (BPE): the pair with the highest count; ties go to the pair that occurs first
  in the corpus, i.e. the smallest (first word index, character position).
* ``"gain"`` (WordPiece's default; Schuster & Nakajima 2012: pick the merge that most increases
  the likelihood of the training data): the exact change of the corpus log-likelihood under a
  unigram model, ``L = sum_s n_s log(n_s / N)``, when the ``c`` occurrences of ``(a, b)`` become
  one new symbol: ``f(c) + f(n_a - c) - f(n_a) + f(n_b - c) - f(n_b) + f(N) - f(N - c)`` with
  ``f(x) = x log x``. For ``c`` small next to the counts it is about ``c * (log(c N / (n_a n_b)) - 1)``:
  the pointwise mutual information of the pair weighted by how often it occurs;
* ``"ratio"`` (the textbook WordPiece score): ``count(ab) / (count(a) * count(b))``, the same
  mutual information without the weight, so pairs of rare symbols come first.

Both likelihood scores break ties by pair count, then corpus order. They depend on the symbols'
own counts, so when a merge lowers ``n_a`` and ``n_b`` every live pair containing ``a`` or ``b``
is pushed again with its higher score; ``N`` only falls, which lowers every gain, so older
entries stay upper bounds and are re-scored when they reach the top. For the gain, rare pairs
are spared that re-push while a bound proves they cannot win (``_unpark``). Stale entries are
dropped (keeping each pair's best) once they outnumber the live pairs two to one, so memory
follows the live pairs.

Corpus order is kept cheaply: a heap entry carries a *lower bound* on the pair's first position
(positions only move later as occurrences disappear). Only when the top entry is tied with
another is its true first position computed, and re-queued if the bound was stale.
"""

from __future__ import annotations

import heapq
import operator
from collections.abc import Callable
from itertools import chain, repeat
from math import inf, log

from lmlab.errors import LmlabError
from lmlab.tokenizers.gc_pause import gc_paused
from lmlab.tokenizers.merge_progress import merge_progress
from lmlab.tokenizers.merge_rewrite import rewrite_words

_SHIFT = 32
_LOW = (1 << _SHIFT) - 1
SCORES = ("frequency", "gain", "ratio")


def learn_merges(word_counts: dict[tuple[str, ...], int], num_merges: int, *, score: str = "frequency",
                 join: Callable[[str, str], str] = operator.add, min_count: int = 1, progress: bool = False,
                 max_new_symbols: int | None = None) -> list[tuple[str, str]]:
    """Learn up to ``num_merges`` merges from ``word_counts``; return them in the order learned.

    ``join(a, b)`` builds the merged symbol (WordPiece passes one that drops the ``##`` of ``b``).
    Learning stops early when no pair occurs ``min_count`` times, or once ``max_new_symbols``
    distinct new symbols exist (two merges can yield the same string, e.g. ``a+bc`` and ``ab+c``).
    """
    if score not in SCORES:
        raise LmlabError(f"unknown merge score {score!r}", f"use one of {', '.join(SCORES)}")
    if num_merges < 0:
        raise LmlabError(f"number of merges must be >= 0, got {num_merges}", "pass a non-negative number")
    with gc_paused():
        learner = _MergeLearner(word_counts, score, join)
        merges = learner.run(num_merges, max(1, min_count), progress, max_new_symbols)
        del learner  # freed while the collector is paused, or re-enabling it may scan it all once more
    return merges


class _MergeLearner:
    """State of one learning run; symbols are ints, a pair (a, b) is the int ``a << 32 | b``."""

    heap_slack = 4096  # stale heap entries tolerated beyond twice the live pairs

    def __init__(self, word_counts: dict[tuple[str, ...], int], score: str, join: Callable[[str, str], str]):
        self.likelihood = score != "frequency"  # the score depends on the symbols' own counts
        self.gain = score == "gain"
        self.join = join
        # symbol ids in first-seen order; words as lists of ids (C-level maps, no per-symbol Python step)
        self.symbols: list[str] = list(dict.fromkeys(chain.from_iterable(word_counts)))
        self.sym_id: dict[str, int] = {s: i for i, s in enumerate(self.symbols)}
        self.units: list[int] = [1] * len(self.symbols)  # initial symbols each symbol spans (for positions)
        to_id = self.sym_id.__getitem__
        self.words: list[list[int]] = [list(map(to_id, word)) for word in word_counts]
        self.counts: list[int] = list(word_counts.values())
        self.sym_count: list[int] = [0] * len(self.symbols)  # kept for the likelihood scores only
        if self.likelihood:
            for ids, n in zip(self.words, self.counts):
                for i in ids:
                    self.sym_count[i] += n
        pair_count: dict[int, int] = {}
        where_list: dict[int, list[int]] = {}  # appends are cheaper than set adds; made sets below
        first: dict[int, tuple[int, int]] = {}
        for w, (keys, n) in enumerate(zip(map(_pairs_of, self.words), self.counts)):
            for key in keys:
                ws = where_list.get(key)
                if ws is None:
                    where_list[key] = [w]
                    pair_count[key] = n
                    first[key] = (w, keys.index(key))
                else:
                    ws.append(w)
                    pair_count[key] += n
        where = {key: set(ws) for key, ws in where_list.items()}
        del where_list
        self.pair_count = pair_count
        self.total = sum(self.sym_count)  # N: symbols in the corpus, for the likelihood gain
        self.f_total = _xlogx(self.total)
        self.flog = [_xlogx(n) for n in self.sym_count]  # n_s log n_s per symbol
        self.where = where
        self.bound = first  # pair -> lower bound on its first (word, position)
        self.by_symbol: dict[int, set[int]] = {}
        if self.likelihood:
            for key in pair_count:
                self.by_symbol.setdefault(key >> _SHIFT, set()).add(key)
                self.by_symbol.setdefault(key & _LOW, set()).add(key)
        self.heap = [self._entry(key) for key in pair_count]
        heapq.heapify(self.heap)
        # Likelihood scores: pair -> the score of its best entry in the heap. A pair whose new score
        # is no higher needs no new entry (the old one is still an upper bound).
        self.top: dict[int, float] = {e[-1]: -e[0] for e in self.heap} if self.likelihood else {}
        # Gain only: pairs seen at most ``parked`` times are not re-pushed when their symbols' counts
        # fall (see _unpark); None until the first pop sets it (all entries are exact until then).
        self.parked: int | None = None if self.gain else 0

    # ------------------------------------------------------------------ heap entries
    def _entry(self, key: int) -> tuple:
        """Heap entry: smaller is better. (-count, word, pos, key) or (-score, -count, word, pos, key)."""
        c = self.pair_count[key]
        w, pos = self.bound[key]
        if self.likelihood:
            return (-self._score(key, c), -c, w, pos, key)
        return (-c, w, pos, key)

    def _score(self, key: int, c: int) -> float:
        a, b = key >> _SHIFT, key & _LOW
        if not self.gain:
            return c / (self.sym_count[a] * self.sym_count[b])
        # The exact change of the corpus log-likelihood under a unigram model, L = sum over symbols
        # of n_s log(n_s / N) = sum n_s log n_s - N log N, when c occurrences of (a, b) become one
        # new symbol ab: n_a and n_b fall by c, N falls by c. (Summed so that (a, b) and (b, a) with
        # the same counts get the very same float.)
        flog, count, rest = self.flog, self.sym_count, self.total - c
        if a == b:  # overlapping runs (a a a) count twice in c, so n_a - 2c may go below 0
            left = count[a] - 2 * c
            parts = (left * log(left) if left > 0 else 0.0) - flog[a]
        else:  # x log x written out (no calls): this runs for every pair a merge re-scores
            left, right = count[a] - c, count[b] - c
            parts = (((left * log(left)) if left else 0.0) - flog[a]) + (
                ((right * log(right)) if right else 0.0) - flog[b])
        return c * log(c) + (self.f_total - rest * log(rest)) + parts

    def _first_occurrence(self, key: int) -> tuple[int, int]:
        """True first (word index, position in initial symbols) of a pair; prunes stale words."""
        a, b = key >> _SHIFT, key & _LOW
        ws = self.where[key]
        units = self.units
        for w in sorted(ws):
            word = self.words[w]
            pos = 0
            for i in range(len(word) - 1):
                if word[i] == a and word[i + 1] == b:
                    return w, pos
                pos += units[word[i]]
            ws.discard(w)
        raise AssertionError("pair with a positive count occurs nowhere")  # pragma: no cover

    def _pop_best(self, min_count: int) -> int | None:
        """Remove and return the best pair, or None when no pair reaches ``min_count``."""
        heap, pair_count = self.heap, self.pair_count
        lk = self.likelihood
        while heap:
            top = heap[0]
            key = top[-1]
            c = pair_count.get(key, 0)
            if c == 0:
                heapq.heappop(heap)
                continue
            if lk:
                s = self._score(key, c)
                if -top[0] != s or -top[1] != c:
                    # the first position of the entry may be out of date: use the pair's own bound
                    heapq.heapreplace(heap, (-s, -c, *self.bound[key], key))
                    self.top[key] = s
                    continue
                if self.parked != 0 and s <= self._unpark(s):
                    continue
                prefix = top[:2]
            else:
                if -top[0] != c:
                    if -top[0] < min_count:
                        return None
                    heapq.heapreplace(heap, (-c, top[1], top[2], key))
                    continue
                prefix = top[:1]
            if c < min_count and not lk:
                return None
            n = len(heap)
            tied = (n > 1 and heap[1][:len(prefix)] == prefix) or (n > 2 and heap[2][:len(prefix)] == prefix)
            if tied:
                true_first = self._first_occurrence(key)
                if true_first != top[-3:-1]:
                    self.bound[key] = true_first
                    heapq.heapreplace(heap, (*prefix, *true_first, key))
                    continue
            heapq.heappop(heap)
            if c < min_count:  # likelihood: the best-scoring pair may still be too rare; skip it
                self.top.pop(key, None)
                continue
            return key
        return None

    def _upper(self, c: int) -> float:
        """Upper bound on the gain of any pair (a, b), a != b, seen at most c times, now and later.

        ``f`` is convex, so ``f(n_a) - f(n_a - c) >= f(c)`` for every ``n_a >= c``; hence the gain is
        at most ``u(c) = f(N) - f(N - c) - f(c)``, which shrinks as ``N`` falls and grows with ``c``
        up to ``c = N / 2`` only (then falls again): so the bound for counts up to ``c`` is
        ``u(min(c, N / 2))``. (Only tiny corpora have a pair seen more than N / 2 times, e.g. runs
        a a a, whose overlapping pairs may even outnumber the symbols.)
        """
        return self.f_total - _xlogx(self.total - min(c, self.total / 2)) - _xlogx(min(c, self.total / 2))

    def _unpark(self, best: float) -> float:
        """Make sure no parked pair can beat ``best``; return the bound that now holds for them.

        A merge lowers the counts of its two symbols, raising the gain of every pair that contains
        one of them; re-scoring them all is most of the learner's work, and most of them are rare
        pairs far from winning. So pairs seen at most ``parked`` times are left with their stale
        (possibly too low) entries and leave ``by_symbol`` when next visited: their true gain is at
        most ``_upper(parked)``. While the best
        entry beats that bound, it is the true best; when it does not, ``parked`` is halved until
        the bound is under half the best gain, and the pairs above the new level are re-scored.
        """
        level = self.parked
        fresh = level is None  # before the first merge every entry is exact: nothing to re-score
        if fresh:
            level = max(self.pair_count.values(), default=0)
        bound = self._upper(level)
        if best > bound and not fresh:
            return bound
        new = level
        while new and self._upper(new) >= best / 2:
            new //= 2
        if not fresh:
            heap, score, first, by_symbol, top = self.heap, self._score, self.bound, self.by_symbol, self.top
            for k, c in self.pair_count.items():
                if new < c <= level:
                    s = score(k, c)
                    if s > top.get(k, -inf):
                        heapq.heappush(heap, (-s, -c, *first[k], k))
                        top[k] = s
                    by_symbol[k >> _SHIFT].add(k)  # re-scored again when a or b is merged
                    by_symbol[k & _LOW].add(k)
        self.parked = new
        return float("inf")  # re-examine the heap top

    # ------------------------------------------------------------------ one merge
    def _merge(self, key: int, new: int) -> None:
        """Replace pair ``key`` by symbol ``new`` in every word containing it, updating the index.

        Each occurrence ``prev a b nxt`` turns ``(prev, a)`` into ``(prev, new)`` and ``(b, nxt)`` into
        ``(new, nxt)``. The words are grouped by neighbour (``prev`` or ``nxt``: an occurrence costs
        one list append) and the counts change once per neighbour, with the summed word counts.
        """
        a, b = key >> _SHIFT, key & _LOW
        left, right, merged = rewrite_words(self.words, self.counts, self.where.pop(key), a, b, new)
        change, touched = self._neighbour_changes(a, b, new, left, right)
        self._apply_changes(change)
        if a != b:
            merged = self.pair_count[key]
        self._drop(key)
        if self.likelihood:
            self._count_merged_symbols(a, b, new, merged)
        self._push_touched(touched)
        if self.likelihood:
            self._rescore_pairs_of(a, b)

    def _neighbour_changes(self, a: int, b: int, new: int, left: dict[int, list[int]],
                           right: dict[int, list[int]]) -> tuple[dict[int, int], dict[int, int]]:
        """Count changes per pair, and the pairs that gained occurrences -> the first word they
        gained one in; the gaining pairs' words join ``where``."""
        where = self.where
        change: dict[int, int] = {}
        touched: dict[int, int] = {}
        weight = self.counts.__getitem__
        b_hi, new_hi = b << _SHIFT, new << _SHIFT
        get = change.get
        for side, nbrs in ((0, left), (1, right)):
            for nbr, ws in nbrs.items():
                if side:  # (b, nxt) -> (new, nxt)
                    lost, gained = b_hi | nbr, new_hi | nbr
                else:  # (prev, a) -> (prev, new)
                    hi = nbr << _SHIFT
                    lost, gained = hi | a, hi | new
                n = sum(map(weight, ws))
                change[lost] = get(lost, 0) - n
                first = min(ws)
                change[gained] = get(gained, 0) + n
                s = where.get(gained)
                if s is None:
                    where[gained] = set(ws)
                else:
                    s.update(ws)
                if touched.get(gained, first) >= first:
                    touched[gained] = first
        return change, touched

    def _apply_changes(self, change: dict[int, int]) -> None:
        """Add each pair's count change; forget the pairs left with none."""
        pair_count, drop = self.pair_count, self._drop
        for k, d in change.items():
            c = pair_count.get(k, 0) + d
            if c:
                pair_count[k] = c
            else:
                drop(k)

    def _count_merged_symbols(self, a: int, b: int, new: int, merged: int) -> None:
        """The symbols' counts (and ``N``) after ``merged`` occurrences of ``a b`` became ``new``."""
        self.sym_count[a] -= merged
        self.sym_count[b] -= merged
        self.sym_count[new] += merged
        self.total -= merged
        if self.gain:
            self.f_total = _xlogx(self.total)
            for sym in (a, b, new):
                self.flog[sym] = _xlogx(self.sym_count[sym])

    def _push_touched(self, touched: dict[int, int]) -> None:
        """Push a fresh entry for every live pair that gained occurrences (first in word ``w``)."""
        pair_count = self.pair_count
        bound, heap, push = self.bound, self.heap, heapq.heappush
        for k, w in touched.items():
            c = pair_count.get(k)
            if c is None:
                continue
            old = bound.get(k)
            # A pair made with the new symbol is new (bound: its first word, position 0), unless the
            # merged string already existed as a symbol; then compute its true first position.
            if old is None:
                old = bound[k] = (w, 0)
            else:
                old = bound[k] = min(old, self._first_occurrence(k))
            if not self.likelihood:
                push(heap, (-c, *old, k))
                continue
            self.by_symbol.setdefault(k >> _SHIFT, set()).add(k)
            self.by_symbol.setdefault(k & _LOW, set()).add(k)
            entry = self._entry(k)
            push(heap, entry)
            if self.top.get(k, -inf) < -entry[0]:
                self.top[k] = -entry[0]

    def _rescore_pairs_of(self, a: int, b: int) -> None:
        """count(a) and count(b) fell, so every pair containing a or b now scores higher: push it
        again (unless parked or gone, which leave ``by_symbol``)."""
        pair_count = self.pair_count
        score, heap, bound, push, top = self._score, self.heap, self.bound, heapq.heappush, self.top
        for sym in {a, b}:
            live = self.by_symbol.get(sym)
            if not live:
                continue
            dead = []
            parked = self.parked or 0
            for k in live:
                c = pair_count.get(k)
                if c and (c > parked or k >> _SHIFT == k & _LOW):
                    s = score(k, c)
                    if s > top.get(k, -inf):  # else its best entry still bounds it from above
                        w, pos = bound[k]
                        push(heap, (-s, -c, w, pos, k))
                        top[k] = s
                else:  # gone, or parked: its gain is below _upper(parked) (_unpark puts it back)
                    dead.append(k)
            live.difference_update(dead)

    def _compact(self) -> None:
        """Drop stale heap entries once they outnumber the live pairs two to one.

        A pair gets a new entry whenever its score rises above its best one (``top``), and scores
        only fall otherwise, so the entry scored ``top[pair]`` is an upper bound on its score:
        keeping that one is enough (it is re-scored when it reaches the top), and nothing needs
        re-scoring here. (Parked pairs are bounded by ``_upper`` instead.)
        """
        if len(self.heap) <= 2 * len(self.pair_count) + self.heap_slack:
            return
        top = self.top
        self.heap = [e for e in self.heap if top.get(e[-1]) == -e[0]]
        heapq.heapify(self.heap)

    def _drop(self, key: int) -> None:
        """Forget a pair that no longer occurs, so memory follows the live pairs only."""
        self.pair_count.pop(key, None)
        self.where.pop(key, None)
        self.bound.pop(key, None)
        self.top.pop(key, None)

    def _new_symbol(self, key: int) -> tuple[int, bool]:
        a, b = key >> _SHIFT, key & _LOW
        s = self.join(self.symbols[a], self.symbols[b])
        i = self.sym_id.get(s)
        if i is not None:
            return i, False
        i = self.sym_id[s] = len(self.symbols)
        self.symbols.append(s)
        self.units.append(self.units[a] + self.units[b])
        self.sym_count.append(0)
        self.flog.append(0.0)
        return i, True

    def run(self, num_merges: int, min_count: int, progress: bool, max_new_symbols: int | None):
        merges: list[tuple[str, str]] = []
        created = 0
        with merge_progress(num_merges, progress) as tick:
            while len(merges) < num_merges and (max_new_symbols is None or created < max_new_symbols):
                key = self._pop_best(min_count)
                if key is None:
                    break
                new, fresh = self._new_symbol(key)
                created += fresh
                merges.append((self.symbols[key >> _SHIFT], self.symbols[key & _LOW]))
                self._merge(key, new)
                if self.likelihood:
                    self._compact()
                tick()
        return merges


def _pairs_of(ids: list[int]) -> list[int]:
    """The pair keys of the adjacent symbols of ``ids``, left to right (C-level maps, no Python step)."""
    return list(map(operator.or_, map(operator.lshift, ids, repeat(_SHIFT)), ids[1:]))


def _xlogx(x: int) -> float:
    return x * log(x) if x > 0 else 0.0

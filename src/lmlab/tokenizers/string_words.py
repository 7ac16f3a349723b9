"""Words as strings of one character per symbol: the shared steps of the string merge learners.

BPE's learner (:mod:`lmlab.tokenizers.char_merge_learner`) and WordPiece's
(:mod:`lmlab.tokenizers.gain_learner`) keep every symbol as one character, a word as the string
of its symbols between two ``edge`` characters (no symbol's), and a pair ``(a, b)`` as the int
``ord(a) << 21 | ord(b)`` (its layout lives in :mod:`lmlab.tokenizers.pair_index`: ``CODE_BITS``,
``SYMBOL_MASK``, ``pair_text``). Then ``word.find(ab)`` tells
whether a word still holds a pair and ``word.replace(ab, new)`` merges its occurrences left to
right (``a a a`` -> ``aa a``), both in C. The learners differ in what they keep per pair and how
they choose it; their loop, the rewriting of the words, the pair count changes it causes and the
search for a tied pair's first occurrence are the same, and live here.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from itertools import repeat
from operator import lshift, or_

from lmlab.errors import LmlabError
from lmlab.tokenizers.merge_trainer import merge_progress
from lmlab.tokenizers.pair_index import CODE_BITS, POSITION_BITS, SYMBOL_MASK


def unused_characters(taken: set[str]) -> Iterator[str]:
    """Code points for new symbols: the lowest first (words stay in the narrowest string kind)."""
    for cp in range(0x110000):
        if not 0xD800 <= cp < 0xE000 and chr(cp) not in taken:  # (no lone surrogates)
            yield chr(cp)
    raise LmlabError("more than a million distinct symbols", "ask for a smaller vocabulary")


def pair_keys(symbols: str) -> Iterator[int]:
    """The keys of the adjacent pairs of ``symbols``, left to right."""
    codes = list(map(ord, symbols))
    return map(or_, map(lshift, codes, repeat(CODE_BITS)), codes[1:])


def first_occurrence(words: list[str], holders: list[int], ab: str,
                     unit: dict[str, int]) -> tuple[int, list[int]]:
    """The first occurrence of the pair ``ab`` in the words ``holders`` (some may no longer hold it),
    as ``word << POSITION_BITS | position``, the position counted in initial symbols (``unit[c]``
    per symbol ``c``); and the holders from that word on, ascending, each once."""
    ws = sorted(set(holders))
    for k, w in enumerate(ws):
        i = words[w].find(ab)
        if i >= 0:
            return w << POSITION_BITS | sum(map(unit.__getitem__, words[w][1:i])), ws[k:]
    raise AssertionError("pair with a positive count occurs nowhere")  # pragma: no cover


def merge_words(words: list[str], holders: Iterable[int], ab: str, new: str, edge: str
                ) -> tuple[defaultdict[str, list[int]], defaultdict[str, list[int]], list[tuple], list[int]]:
    """Replace the pair ``ab`` by the symbol ``new`` in the words ``holders`` (those that no longer
    hold it, or are listed twice, are skipped); every word is wrapped in the ``edge`` character.

    Returns ``(left, right, multi, starts)``. For the words that held the pair once, ``left`` and
    ``right`` group their indices by the symbol before the pair and after it; a word whose pair
    touched its start or end is left out of that side's groups (no pair spans the edge): ``starts``
    lists the words dropped from ``left`` (the pair opened the word), those dropped from ``right``
    are not kept. ``multi`` has ``(w, old word, new word)`` for each word that held the pair more
    than once (see :func:`pair_changes`).
    """
    left: defaultdict[str, list[int]] = defaultdict(list)
    right: defaultdict[str, list[int]] = defaultdict(list)
    multi = []
    for w in holders:
        word = words[w]
        i = word.find(ab)
        if i < 0:
            continue
        nw = word.replace(ab, new)
        words[w] = nw
        if len(word) - len(nw) == 1:
            left[word[i - 1]].append(w)
            right[word[i + 2]].append(w)
        else:
            multi.append((w, word, nw))
    starts = left.pop(edge, [])
    right.pop(edge, None)
    return left, right, multi, starts


def neighbour_groups(left: dict[str, list[int]], right: dict[str, list[int]], counts: list[int], key: int,
                     new: str) -> list[tuple[int, int, int, int, list[int]]]:
    """For each group of :func:`merge_words` (which holds no edge group), ``(lost, gained, n, w0,
    ws)``: the pair that lost occurrences (``(prev, a)`` or ``(b, nxt)``), the one that gained them
    (``(prev, new)`` or ``(new, nxt)``), how many (``n``, the group's summed word counts), its
    first word and its words."""
    a, b = key >> CODE_BITS, key & SYMBOL_MASK
    weight = counts.__getitem__
    n_new = ord(new)
    out = []
    add = out.append
    for side, nbrs in ((0, left), (1, right)):
        for nbr, ws in nbrs.items():
            if len(ws) == 1:  # most groups, late in learning: one word
                w0 = ws[0]
                n = counts[w0]
            else:
                w0 = min(ws)
                n = sum(map(weight, ws))
            code = ord(nbr)
            if side:  # (b, nxt) -> (new, nxt)
                add((b << CODE_BITS | code, n_new << CODE_BITS | code, n, w0, ws))
            else:  # (prev, a) -> (prev, new)
                add((code << CODE_BITS | a, code << CODE_BITS | n_new, n, w0, ws))
    return out


def pair_changes(word: str, nw: str, ab: str) -> dict[int, int]:
    """Pair key -> change of its number of occurrences, for a word that held the pair ``ab`` more
    than once (``word``, now ``nw``). Only the pairs from the first occurrence's left neighbour to
    the last one's right neighbour change; the edges are left out (no pair is counted there)."""
    lo, hi = max(1, word.find(ab) - 1), min(len(word) - 1, word.rfind(ab) + 3)
    diff: dict[int, int] = {}
    for p in pair_keys(word[lo:hi]):
        diff[p] = diff.get(p, 0) - 1
    for p in pair_keys(nw[lo:hi - (len(word) - len(nw))]):
        diff[p] = diff.get(p, 0) + 1
    return diff


def run_merges(pop_best: Callable[[], int | None], new_symbol: Callable[[int], tuple[str, str, str, bool]],
               merge: Callable[[int, str, bool], None], num_merges: int, progress: bool,
               max_new_symbols: int | None) -> list[tuple[str, str]]:
    """A learner's loop: ``pop_best()`` gives the best pair's key (None: no pair left, or none as
    frequent as the learner's ``min_count``),
    ``new_symbol(key)`` its two strings, the merged symbol's character and whether that symbol is
    new, and ``merge(key, new, fresh)`` makes the merge. Up to ``num_merges`` merges, or until
    ``max_new_symbols`` distinct new symbols exist; returns them as string pairs, in order."""
    merges: list[tuple[str, str]] = []
    created = 0
    with merge_progress(num_merges, progress) as tick:
        while len(merges) < num_merges and (max_new_symbols is None or created < max_new_symbols):
            key = pop_best()
            if key is None:
                break
            a, b, new, fresh = new_symbol(key)
            created += fresh
            merges.append((a, b))
            merge(key, new, fresh)
            tick()
    return merges


class StringMergeLearner:
    """Base of the string learners: :meth:`run` is :func:`run_merges` over the subclass's own
    ``_pop_best()``, ``_new_symbol(key)`` and ``_merge(key, new, fresh)``."""

    def run(self, num_merges: int, progress: bool, max_new_symbols: int | None) -> list[tuple[str, str]]:
        return run_merges(self._pop_best, self._new_symbol, self._merge, num_merges, progress,
                          max_new_symbols)

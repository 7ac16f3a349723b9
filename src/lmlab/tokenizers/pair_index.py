"""Count every adjacent pair of symbols in a list of words at once (NumPy), for a merge learner.

The words are strings with one character per symbol, each wrapped in an ``edge`` character that
is no symbol (``edge + symbols + edge``), so a pair never spans two words. The result gives, for
each pair seen at least ``floor`` times (weighted by the word counts):

* its key ``ord(a) << 21 | ord(b)`` (a code point fits in 21 bits);
* its weighted count;
* the words holding it, ascending, a word listed once per occurrence;
* its first occurrence in the corpus as ``word << 32 | position``, the position counted in
  initial symbols (``units[c]`` initial symbols per symbol ``c``).

One stable sort of the pair codes groups the occurrences, so the work is a few passes over the
corpus in C instead of a dictionary operation per pair occurrence in Python.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

#: Bits of one code point in a pair key: the key of ``(a, b)`` is ``ord(a) << CODE_BITS | ord(b)``.
CODE_BITS = 21
#: The second symbol's bits of a pair key: ``ord(b) == key & SYMBOL_MASK``.
SYMBOL_MASK = (1 << CODE_BITS) - 1
#: Bits of the position in a first occurrence ``word << POSITION_BITS | position``.
POSITION_BITS = 32


def pair_text(key: int) -> str:
    """The two symbol characters of the pair ``key``, as one string (what a word holding it contains)."""
    return chr(key >> CODE_BITS) + chr(key & SYMBOL_MASK)


def index_pairs(words: list[str], counts: list[int], edge: str, units: dict[str, int],
                floor: int) -> Iterator[tuple[int, int, list[int], int]]:
    """``(key, count, words, first)`` for each pair seen ``floor`` or more times."""
    if not words:
        return
    codes = np.frombuffer("".join(words).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
    alphabet = np.unique(np.frombuffer("".join(units).encode("utf-32-le", "surrogatepass"),
                                       dtype=np.uint32))
    # dense symbol numbers 1..A (0: the edge), so that a pair code fits in 16 bits when A is small
    dense = np.zeros(max(int(alphabet[-1]), ord(edge)) + 1, dtype=np.int32)
    dense[alphabet] = np.arange(1, len(alphabet) + 1, dtype=np.int32)
    sym = dense[codes]
    size = len(alphabet) + 1
    inside = np.flatnonzero((sym[:-1] != 0) & (sym[1:] != 0))  # pair start positions
    if not len(inside):
        return
    left, right = sym[inside], sym[inside + 1]
    if size * size <= 1 << 16:  # NumPy sorts 16-bit integers by radix: a stable linear-time sort
        pair = (left * size + right).astype(np.uint16)
    else:
        pair = left.astype(np.int64) * size + right
    order = np.argsort(pair, kind="stable")
    lengths = np.fromiter(map(len, words), dtype=np.int64, count=len(words))
    word_of = np.repeat(np.arange(len(words), dtype=np.int32), lengths)
    at = inside[order]  # occurrences grouped by pair, each group in corpus order
    owner = word_of[at]
    sorted_pairs = pair[order]
    starts = np.flatnonzero(np.r_[True, sorted_pairs[1:] != sorted_pairs[:-1]])
    totals = np.add.reduceat(np.asarray(counts, dtype=np.int64)[owner], starts)
    ends = np.r_[starts[1:], len(at)]
    kept = totals >= floor  # the rarer pairs are dropped before any per-pair Python work
    starts, ends, totals = starts[kept], ends[kept], totals[kept]
    first_at = at[starts]
    first_word = word_of[first_at]
    offset = first_at - (np.cumsum(lengths) - lengths)[first_word]  # its index in the word (edge: 0)
    unit = units.__getitem__
    first = [w << POSITION_BITS | sum(map(unit, words[w][1:i]))
             for w, i in zip(first_word.tolist(), offset.tolist())]
    group = sorted_pairs[starts].astype(np.int64)
    keys = alphabet[group // size - 1].astype(np.int64) << CODE_BITS | alphabet[group % size - 1]
    holders = owner.tolist()
    yield from zip(keys.tolist(), totals.tolist(),
                   (holders[lo:hi] for lo, hi in zip(starts.tolist(), ends.tolist())), first)

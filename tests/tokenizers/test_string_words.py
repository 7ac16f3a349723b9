"""The string learners' shared steps, against a recount of the words' pairs."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from lmlab.errors import LmlabError
from lmlab.tokenizers.pair_index import CODE_BITS, POSITION_BITS, SYMBOL_MASK, pair_text
from lmlab.tokenizers.string_words import (
    first_occurrence,
    merge_words,
    neighbour_groups,
    pair_changes,
    pair_keys,
    unused_characters,
)

EDGE = "\0"


def key(a: str, b: str) -> int:
    return ord(a) << CODE_BITS | ord(b)


def pair_counts(words: list[str], counts: list[int]) -> Counter:
    """Weighted occurrences of every pair, the edges left out, counted afresh."""
    total: Counter = Counter()
    for word, n in zip(words, counts):
        for x, y in zip(word[1:-2], word[2:-1]):
            total[key(x, y)] += n
    return total


def test_merge_words_groups_single_occurrences_by_neighbour_and_drops_the_edges():
    words = [EDGE + w + EDGE for w in ["xab", "abab", "cy", "aby", "xaby", "ab"]]
    left, right, multi, starts = merge_words(words, [0, 1, 2, 3, 4, 0, 5], "ab", "N", EDGE)
    assert words == [EDGE + w + EDGE for w in ["xN", "NN", "cy", "Ny", "xNy", "N"]]
    assert dict(left) == {"x": [0, 4]}  # word 0 is listed twice: merged once
    assert dict(right) == {"y": [3, 4]}  # no group at the edge: no pair spans it
    assert starts == [3, 5]  # the words the pair opened, left out of ``left``
    assert multi == [(1, EDGE + "abab" + EDGE, EDGE + "NN" + EDGE)]


def test_neighbour_groups_sum_the_word_counts():
    left = {"x": [4, 0], "c": [2]}
    right = {"y": [3]}
    counts = [5, 1, 7, 2, 3]
    got = neighbour_groups(left, right, counts, key("a", "b"), "N")
    assert got == [(key("x", "a"), key("x", "N"), 8, 0, [4, 0]), (key("c", "a"), key("c", "N"), 7, 2, [2]),
                   (key("b", "y"), key("N", "y"), 2, 3, [3])]


def test_first_occurrence_counts_initial_symbols_and_drops_stale_words():
    words = [EDGE + w + EDGE for w in ["xab", "Nab", "ab", "cab"]]
    unit = {"x": 1, "a": 1, "b": 1, "c": 1, "N": 3}  # N spans three initial symbols
    # the holders in word order, each once
    assert first_occurrence(words, [3, 1, 0, 0], "ab", unit) == (0 << POSITION_BITS | 1, [0, 1, 3])
    words[0] = EDGE + "xN" + EDGE  # merged since: a stale holder, dropped from the list
    assert first_occurrence(words, [3, 1, 0], "ab", unit) == (1 << POSITION_BITS | 3, [1, 3])


@pytest.mark.parametrize("seed", range(5))
def test_a_merge_changes_pair_counts_as_a_recount_does(seed):
    """merge_words + neighbour_groups + pair_changes give the exact change of every pair's count,
    runs ``a a a`` and words holding the pair several times included."""
    rng = random.Random(seed)
    words = [EDGE + "".join(rng.choice("aab") for _ in range(rng.randint(1, 9))) + EDGE for _ in range(60)]
    counts = [rng.randint(1, 4) for _ in words]
    for ab in ("aa", "ab", "ba"):
        before = pair_counts(words, counts)
        left, right, multi, _ = merge_words(words, range(len(words)), ab, "N", EDGE)
        expected = pair_counts(words, counts) - before
        expected.subtract(before - pair_counts(words, counts))
        change: Counter = Counter()
        for w, word, nw in multi:
            for p, k in pair_changes(word, nw, ab).items():
                change[p] += k * counts[w]
        for lost, gained, n, _, _ in neighbour_groups(left, right, counts, key(*ab), "N"):
            change[lost] -= n
            change[gained] += n
        change[key(*ab)] = -before[key(*ab)]  # the merged pair is gone (its record is dropped whole)
        assert +change == +expected and -change == -expected
        words = [w.replace("N", "c") for w in words]  # the next merge makes a new N


def test_pair_keys_pair_text_and_unused_characters():
    assert list(pair_keys("abc")) == [key("a", "b"), key("b", "c")]
    wide = key("\U0010fffd", "\0")  # the highest code point a symbol may take, and the lowest
    assert [pair_text(k) for k in (key("a", "b"), wide)] == ["ab", "\U0010fffd\0"]
    assert wide & SYMBOL_MASK == 0 and key("\0", "\U0010fffd") & SYMBOL_MASK == 0x10FFFD
    free = unused_characters({"\0", "\x01", "\x03"})
    assert [next(free), next(free)] == ["\x02", "\x04"]
    codes = unused_characters(set())
    for _ in range(0xD800):
        next(codes)
    assert next(codes) == "\ue000"  # no lone surrogates
    with pytest.raises(LmlabError, match="distinct symbols"):
        for _ in range(0x110000):
            next(codes)

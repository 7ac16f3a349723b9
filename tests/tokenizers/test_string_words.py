"""The string learners' shared steps, against a recount of the words' pairs."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from lmlab.errors import LmlabError
from lmlab.tokenizers.pair_index import CODE_BITS
from lmlab.tokenizers.string_words import (
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


def test_merge_words_groups_single_occurrences_by_neighbour():
    words = [EDGE + w + EDGE for w in ["xab", "abab", "cy", "aby", "xaby"]]
    left, right, multi = merge_words(words, [0, 1, 2, 3, 4, 0], "ab", "N")
    assert words == [EDGE + w + EDGE for w in ["xN", "NN", "cy", "Ny", "xNy"]]
    assert dict(left) == {"x": [0, 4], EDGE: [3]}  # word 0 is listed twice: merged once
    assert dict(right) == {EDGE: [0], "y": [3, 4]}
    assert multi == [(1, EDGE + "abab" + EDGE, EDGE + "NN" + EDGE)]


def test_neighbour_groups_sum_the_word_counts():
    left = {"x": [4, 0], "c": [2]}
    right = {"y": [3]}
    counts = [5, 1, 7, 2, 3]
    got = neighbour_groups(left, right, counts, key("a", "b"), "N")
    assert got == [(key("x", "a"), key("x", "N"), 8, 0, [4, 0]), (key("c", "a"), key("c", "N"), 7, 2, [2]),
                   (key("b", "y"), key("N", "y"), 2, 3, [3])]


@pytest.mark.parametrize("seed", range(5))
def test_a_merge_changes_pair_counts_as_a_recount_does(seed):
    """merge_words + neighbour_groups + pair_changes give the exact change of every pair's count,
    runs ``a a a`` and words holding the pair several times included."""
    rng = random.Random(seed)
    words = [EDGE + "".join(rng.choice("aab") for _ in range(rng.randint(1, 9))) + EDGE for _ in range(60)]
    counts = [rng.randint(1, 4) for _ in words]
    for ab in ("aa", "ab", "ba"):
        before = pair_counts(words, counts)
        left, right, multi = merge_words(words, range(len(words)), ab, "N")
        expected = pair_counts(words, counts) - before
        expected.subtract(before - pair_counts(words, counts))
        change: Counter = Counter()
        for w, word, nw in multi:
            for p, k in pair_changes(word, nw, ab).items():
                change[p] += k * counts[w]
        left.pop(EDGE, None)
        right.pop(EDGE, None)
        for lost, gained, n, _, _ in neighbour_groups(left, right, counts, key(*ab), "N"):
            change[lost] -= n
            change[gained] += n
        change[key(*ab)] = -before[key(*ab)]  # the merged pair is gone (its record is dropped whole)
        assert +change == +expected and -change == -expected
        words = [w.replace("N", "c") for w in words]  # the next merge makes a new N


def test_pair_keys_and_unused_characters():
    assert list(pair_keys("abc")) == [key("a", "b"), key("b", "c")]
    free = unused_characters({"\0", "\x01", "\x03"})
    assert [next(free), next(free)] == ["\x02", "\x04"]
    codes = unused_characters(set())
    for _ in range(0xD800):
        next(codes)
    assert next(codes) == "\ue000"  # no lone surrogates
    with pytest.raises(LmlabError, match="distinct symbols"):
        for _ in range(0x110000):
            next(codes)

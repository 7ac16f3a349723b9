"""The string merge learner (character and byte-level BPE) gives the reference learners' merges.

References: ``naive_merges`` (the lecture's algorithm, recounting every pair before each merge)
and ``learn_merges`` (the general learner over symbol tuples, itself checked against it)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from lmlab.errors import LmlabError
from lmlab.tokenizers.char_merge_learner import _CharMergeLearner, learn_char_merges
from lmlab.tokenizers.counting import count_chunks, refine_counts
from lmlab.tokenizers.merge_trainer import learn_merges
from lmlab.tokenizers.pretokenize import gpt2_pieces, gpt2_split, to_byte_symbols, whitespace_split
from tests.tokenizers.test_merge_trainer import GOLDEN, LECTURE, naive_merges


def as_tuples(word_counts: dict[str, int]) -> dict[tuple[str, ...], int]:
    return {tuple(w): n for w, n in word_counts.items()}


def char_words(lines: list[str]) -> dict[str, int]:
    """The corpus character BPE learns from: whitespace words with the end-of-word ``_``."""
    return {w + "_": n for w, n in count_chunks(lines, whitespace_split).items()}


def test_lecture_golden_merges():
    wc = {w + "_": n for w, n in Counter(LECTURE.split()).items()}
    assert learn_char_merges(wc, 8) == GOLDEN
    assert learn_char_merges(wc, 100) == naive_merges(as_tuples(wc), 100)
    # the end-of-word symbol given apart: the same corpus
    assert learn_char_merges(dict(Counter(LECTURE.split())), 100, end="_") == learn_char_merges(wc, 100)


def test_real_text_matches_the_lecture_learner(shakespeare):
    # 250 merges on 8k characters run down to pairs seen once or twice, past the counts below
    # which the learner does not follow pairs until it must (8, then 2)
    wc = char_words(shakespeare[:8000].splitlines())
    merges = learn_char_merges(wc, 250)
    assert len(merges) == 250 and merges == naive_merges(as_tuples(wc), 250)


def test_real_text_matches_the_tuple_learner(shakespeare, wikitext_valid_lines):
    wc = char_words(shakespeare[:200_000].splitlines())
    assert learn_char_merges(wc, 3000) == learn_merges(as_tuples(wc), 3000)
    # byte-level chunks (GPT-2 pre-tokens, one character per byte), with a min_count above 8
    counts = refine_counts(count_chunks(wikitext_valid_lines[:800], gpt2_pieces), gpt2_split)
    chunks = {to_byte_symbols(c): n for c, n in counts.items()}
    got = learn_char_merges(chunks, 2000, min_count=10)
    assert got == learn_merges(as_tuples(chunks), 2000, min_count=10)


@pytest.mark.parametrize("min_count", [1, 2, 3])
def test_runs_of_one_symbol(min_count):
    """``a a a a`` merges left to right (``aa aa``); ``a a a`` keeps one ``a`` (``aa a``)."""
    wc = {"aaaa": 3, "aaa": 2, "aaaaaaa": 1, "baaab": 4, "ab": 3, "aa_a": 2}
    got = learn_char_merges(wc, 20, min_count=min_count)
    assert got == naive_merges(as_tuples(wc), 20, min_count=min_count)


@pytest.mark.parametrize("seed", [*range(10), 386, 399])
def test_ties_and_min_count_on_zipf_corpora(seed):
    """Tiny alphabets (many ties on equal counts) and Zipf-like counts that start above the
    learner's floor for unfollowed pairs (8) and end below it, with min_count on both sides
    (seeds 386 and 399: a min_count below the floor once stopped learning too early)."""
    rng = random.Random(seed)
    alphabet = rng.choice(["ab", "aab", "abc", "aabbcde", "abcdefgh"])
    types = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 9)))
             for _ in range(rng.randint(1, 60))]
    words = rng.choices(types, weights=[1 / (r + 1) for r in range(len(types))], k=rng.randint(1, 600))
    wc = {w + "_": n for w, n in Counter(words).items()}
    num, min_count = rng.randint(0, 120), rng.randint(1, 12)
    got = learn_char_merges(wc, num, min_count=min_count)
    assert got == naive_merges(as_tuples(wc), num, min_count=min_count)


def test_unicode_symbols():
    """Characters of every string width (latin-1, BMP, astral), combining marks, and the code
    points the learner gives new symbols (the lowest unused ones: NUL, U+0001, U+0100...)."""
    wc = {"\x00\x01\x00\x01_": 3, "ĀāĀā_": 2, "日本日本語_": 4, "😀😀x😀_": 3, "e\u0301e\u0301_": 5,
          "\x01Ā😀_": 2, "ab\x00_": 6, "_\x00_": 1}
    assert learn_char_merges(wc, 40) == naive_merges(as_tuples(wc), 40)


def test_alphabet_of_more_than_255_symbols():
    """Pair codes no longer fit in 16 bits: the index sorts 64-bit codes instead."""
    rng = random.Random(5)
    chars = [chr(0x4E00 + i) for i in range(400)]
    words = ["".join(rng.choices(chars[:40] if i % 2 else chars, k=rng.randint(1, 6))) for i in range(3000)]
    wc = {w + "_": n for w, n in Counter(words).items()}
    assert len(set("".join(wc))) > 300
    assert learn_char_merges(wc, 300) == learn_merges(as_tuples(wc), 300)


def test_symbols_that_coincide_reuse_one_symbol():
    """Two merges that build the same string (``a+bc`` and ``ab+c``) share one symbol, so
    ``max_new_symbols`` counts distinct strings. Char BPE starts from single characters, so the
    learner is put in the state after an earlier merge built ``bc`` (the symbol ``Z``), as in
    ``test_merge_trainer.test_max_new_symbols_counts_distinct_strings``."""
    tuples = {("a", "b", "y"): 5, ("a", "b", "c"): 2, ("b", "c"): 4, ("a", "bc"): 3}
    expected = [("a", "b"), ("ab", "y"), ("b", "c"), ("a", "bc"), ("ab", "c")]
    assert learn_merges(tuples, 10) == expected

    def learner() -> _CharMergeLearner:
        state = _CharMergeLearner({"aby": 5, "abc": 2, "bc": 4, "aZ": 3})
        del state.code["Z"]
        state.text["Z"], state.code["bc"], state.unit["Z"] = "bc", "Z", 2
        return state

    assert learner().run(10, False, None) == expected
    assert learner().run(10, False, 2) == expected[:2]
    assert learner().run(10, False, 3) == expected[:4]  # ab, aby, (bc exists), abc, (abc again)


def test_bad_and_empty_input():
    with pytest.raises(LmlabError, match=">= 0"):
        learn_char_merges({"ab": 1}, -1)
    with pytest.raises(LmlabError, match="one character"):
        learn_char_merges({"ab": 1}, 3, end="</w>")
    assert learn_char_merges({}, 5) == []
    assert learn_char_merges({"a": 3, "b": 2}, 5) == []  # no pairs at all
    assert learn_char_merges({"ab": 3}, 0) == []


def test_progress_bar_does_not_change_the_result():
    wc = {w + "_": n for w, n in Counter(LECTURE.split()).items()}
    assert learn_char_merges(wc, 8, progress=True) == GOLDEN

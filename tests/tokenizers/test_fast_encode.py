"""The fast ``encode`` path (``Tokenizer._cached_ids`` + ``IdsCache``): the same ids as the generic
path and as Hugging Face on the texts where a shortcut could go wrong."""

from __future__ import annotations

import copy
import pickle
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer

from lmlab.tokenizers import train_tokenizer
from lmlab.tokenizers.bpe import bpe_segment
from lmlab.tokenizers.ids_cache import IdsCache
from lmlab.tokenizers.pretokenize import gpt2_ascii_regex, gpt2_split
from tests.tokenizers.cache_checks import check_cached_encode

ALGOS = ["bpe", "bytelevel", "wordpiece", "unigram"]

#: Texts that take the slow path or would be cut wrongly by a fast split: special tokens written
#: in the text (and characters that only start one), U+001C..U+001F (``str.split`` cuts there,
#: Unicode White_Space does not), a literal ``▁`` (starts a unigram word), non-ASCII (the
#: byte-level ASCII pattern), unknown characters, empty and blank texts, other whitespace.
TRICKY = [
    "", " ", "   \t\n", "to be", "  to   be  ",
    "[CLS] to be [SEP] or not [MASK]", "[CLS][SEP]", "a [b] <c> <s>x</s> [UNK]y [PAD", "<< [[ >>",
    "to\x1cbe or\x1d not\x1e \x1f", "\x1c", "a \x1f b",
    "to\u2581be \u2581or\u2581\u2581not \u2581", "\u2581",
    "caf\u00e9 na\u00efve \u2603 \u65e5\u672c\u8a9e \U0001f916", "\u00e9", "a\u00a0b\u2003c\u3000d \x85e",
    "I'll say it's 2024!  Done", "they're 1,000.50 -- \"quoted\"", "\x00\x07\x7f", "x" * 300,
    "tab\there\r\nnew line", " lead", "trail ",
]


@pytest.fixture(scope="module", params=ALGOS)
def tok(request, shakespeare):
    return train_tokenizer(request.param, [shakespeare[:60_000]], vocab_size=400)


@pytest.fixture(scope="module")
def tok_hf(tok, tmp_path_factory):
    d = tok.save(tmp_path_factory.mktemp(tok.algo) / "tok")
    return HFTokenizer.from_file(str(d / "tokenizer.json"))


def generic(tok, text: str) -> list[int]:
    return [tok.id_of(t) for t in tok.tokenize(text)]


def test_tricky_texts_give_the_generic_ids_cold_and_warm(tok):
    expected = [generic(tok, t) for t in TRICKY]
    tok._ids_cache.clear()
    assert [tok.encode(t) for t in TRICKY] == expected
    assert [tok.encode(t) for t in TRICKY] == expected  # from the cache
    assert tok.encode_many(TRICKY * 3, workers=2, chunk_size=7) == expected * 3


def test_cache_eviction_keeps_the_ids(tok, wikitext_valid_lines):
    check_cached_encode(tok, wikitext_valid_lines[:150] + TRICKY)


def test_tricky_texts_give_hugging_faces_ids(tok, tok_hf):
    for text in TRICKY:
        assert tok.encode(text) == tok_hf.encode(text, add_special_tokens=False).ids, repr(text)


def test_the_fast_split_is_refused_where_it_would_cut_differently(tok):
    """Each of these texts holds a character of the algorithm's ``_fast_split_unsafe`` class or
    one that starts a special token: the cheap search must send it down the exact path."""
    unsafe = {"bpe": ["a\x1cb"], "unigram": ["a\x1fb", "a\u2581b"], "bytelevel": ["na\u00efve"],
              "wordpiece": []}[tok.algo]
    for text in unsafe + ["x[CLS]y", "<s>"]:
        assert tok._slow_path_char(text) is not None, repr(text)
        assert tok.encode(text) == generic(tok, text)
    assert tok._slow_path_char("plain ascii, no specials.") is None


def test_a_text_that_is_no_string_is_a_one_line_error(tok):
    from lmlab.errors import LmlabError

    for bad in (None, b"to be", 5):
        with pytest.raises(LmlabError, match="encode takes a string, got"):
            tok.encode(bad)


def test_a_returned_list_is_the_callers_own(tok):
    ids = tok.encode("to be or not to be")
    ids.append(-1)
    assert tok.encode("to be or not to be") == ids[:-1]


def test_ids_cache_computes_a_missing_word_once_and_empties_when_full():
    calls = []

    def compute(word):
        calls.append(word)
        return [len(word), 7]

    cache = IdsCache(compute, limit=3)
    assert cache["ab"] == (2, 7) and cache["ab"] == (2, 7) and calls == ["ab"]
    cache["c"], cache["de"]
    assert len(cache) == 3
    assert cache["fgh"] == (3, 7) and dict(cache) == {"fgh": (3, 7)}  # full: emptied, then stored
    assert calls == ["ab", "c", "de", "fgh"]


def _length_ids(word: str) -> list[int]:
    return [len(word)]


def test_ids_cache_pickles_and_copies_empty_with_its_limit():
    cache = IdsCache(_length_ids, limit=5)
    assert cache["a"] == (1,) and cache["bc"] == (2,)
    for other in (pickle.loads(pickle.dumps(cache)), copy.deepcopy(cache)):
        assert type(other) is IdsCache and other == {} and other.limit == 5
        assert other["xyz"] == (3,) and len(other) == 1


def test_a_pickled_tokenizer_encodes_with_an_empty_working_cache(tok):
    tok.encode("to be or not to be")
    assert len(tok._ids_cache) > 0
    copied = pickle.loads(pickle.dumps(tok))
    assert len(copied._ids_cache) == 0 and isinstance(copied._ids_cache, IdsCache)
    assert [copied.encode(t) for t in TRICKY] == [tok.encode(t) for t in TRICKY]
    assert len(copied._ids_cache) > 0


def _merge_all_occurrences(symbols, ranks):
    """The lecture's segmenter, written plainly: merge every occurrence of the lowest-ranked pair."""
    parts = list(symbols)
    while True:
        pairs = [p for p in zip(parts, parts[1:]) if p in ranks]
        if not pairs:
            return parts
        a, b = min(pairs, key=ranks.__getitem__)
        out, i = [], 0
        while i < len(parts):
            if i + 1 < len(parts) and parts[i] == a and parts[i + 1] == b:
                out.append(a + b)
                i += 2
            else:
                out.append(parts[i])
                i += 1
        parts = out


def test_bpe_segment_equals_merging_all_occurrences(shakespeare):
    tok = train_tokenizer("bpe", [shakespeare[:60_000]], vocab_size=600)
    words = list(dict.fromkeys(shakespeare[100_000:140_000].split()))
    rng = random.Random(0)
    words += ["".join(rng.choice("aeelnorst") for _ in range(rng.randint(1, 14))) for _ in range(300)]
    for w in words:
        symbols = [*w, "_"]
        assert bpe_segment(symbols, tok.ranks) == _merge_all_occurrences(symbols, tok.ranks), w
    # repeated and overlapping pairs: left to right, never overlapping
    ranks = {("a", "a"): 0, ("aa", "aa"): 1, ("aa", "a"): 2}
    for n in range(1, 9):
        assert bpe_segment(["a"] * n, ranks) == _merge_all_occurrences(["a"] * n, ranks)
    assert bpe_segment(["a"] * 5, ranks) == ["aaaa", "a"]


ASCII_TEXT = st.text(st.characters(min_codepoint=0, max_codepoint=127), max_size=80)


@settings(max_examples=400, deadline=None)
@given(ASCII_TEXT)
def test_ascii_gpt2_pattern_splits_ascii_text_like_gpt2(text):
    assert gpt2_ascii_regex().findall(text) == gpt2_split(text)


def test_ascii_gpt2_pattern_on_every_ascii_character_in_context():
    for c in map(chr, range(128)):
        for text in (c, f"a{c}b", f" {c}{c} ", f"'{c}s 1{c}2", f"x  {c}\n"):
            assert gpt2_ascii_regex().findall(text) == gpt2_split(text), repr(text)


def test_piece_trie_holds_every_piece_and_prefix_and_nothing_else():
    from lmlab.tokenizers.unigram import _LEAF, piece_trie

    scores = {"\u2581t": -1.0, "\u2581to": -2.0, "\u2581tob": -5.0, "o": -3.0, "b": -4.0, "x": -6.0}
    trie = piece_trie(scores)

    def walk(s):
        children, entry = trie, None
        for ch in s:
            entry = children.get(ch)
            if entry is None:
                return "absent"
            children = entry[1]
        return entry[0]

    assert {p: walk(p) for p in scores} == scores
    assert walk("\u2581") is None  # only starts pieces
    assert walk("\u2581tobe") == walk("ob") == walk("y") == "absent"
    assert trie["x"][1] is _LEAF and _LEAF == {}

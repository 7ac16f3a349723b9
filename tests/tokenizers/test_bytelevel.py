"""Byte-level BPE: exact round trip of any string, GPT-2 pre-tokenization, HF interop both ways."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import pre_tokenizers

from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer, train_tokenizer
from lmlab.tokenizers.bytelevel import ByteLevelBPETokenizer
from lmlab.tokenizers.counting import count_chunks, refine_counts
from lmlab.tokenizers.pretokenize import (
    BYTE_ENCODER,
    WORD_RE,
    from_byte_symbols,
    gpt2_pieces,
    gpt2_split,
    to_byte_symbols,
    whitespace_split,
)
from tests.tokenizers.cache_checks import check_cached_encode

# the strings of /work/shared/acceptance/tokenizers-golden
GOLDEN_STRINGS = ["héllo wörld ✓ 日本語 🤖\t\x00\x7f  spaces  \n\r", "", " ", "a" * 500, "\u200b\ufeff"]
# every code point except surrogates (not encodable as UTF-8, so not valid text to tokenize)
ANY_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=60)


@pytest.fixture(scope="module")
def bl(shakespeare) -> ByteLevelBPETokenizer:
    return train_tokenizer("bytelevel", [shakespeare[:200_000]], vocab_size=1000)


@pytest.fixture(scope="module")
def bl_hf(bl, tmp_path_factory) -> HFTokenizer:
    d = bl.save(tmp_path_factory.mktemp("bl") / "tok")
    return HFTokenizer.from_file(str(d / "tokenizer.json"))


def test_byte_table_is_gpt2s():
    assert len(set(BYTE_ENCODER)) == 256
    assert BYTE_ENCODER[ord(" ")] == "Ġ" and BYTE_ENCODER[ord("\n")] == "Ċ" and BYTE_ENCODER[ord("a")] == "a"
    assert set(BYTE_ENCODER) == set(pre_tokenizers.ByteLevel.alphabet())
    assert all(not c.isspace() and c.isprintable() for c in BYTE_ENCODER)
    assert from_byte_symbols(to_byte_symbols("日本 🤖\x00")) == "日本 🤖\x00".encode()


@settings(max_examples=300, deadline=None)
@given(ANY_TEXT)
def test_pretokenizer_matches_hf_bytelevel_regex(text):
    ref = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True).pre_tokenize_str(text)
    assert [to_byte_symbols(c) for c in gpt2_split(text)] == [p for p, _ in ref]
    assert "".join(gpt2_split(text)) == text


def test_pretokenizer_matches_hf_on_every_code_point():
    """Each code point next to a letter, a digit, a symbol and a space is cut as tokenizers cuts it,
    whatever Unicode tables the installed ``regex`` has (regex 2026.11 calls U+3D000 a letter)."""
    pre = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    points = [chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    probe = "a{0}\x01" "1{0}!" " {0}{0}\t{0}x"
    # tokenizers cuts many short texts faster than a few long ones; each text repeats the last probe
    # of the one before, so every two neighbouring probes are still cut together once
    for i in range(0, len(points), 1 << 12):
        text = "".join(probe.format(c) for c in points[max(0, i - 1):i + (1 << 12)])
        ref = [text[a:b] for _, (a, b) in pre.pre_tokenize_str(text)]
        assert gpt2_split(text) == ref


# whitespace of every kind (U+0020, tab, newline, NBSP, ideographic space, U+001C which is no
# whitespace for GPT-2), letters, digits, apostrophes and symbols: the places the pieces may cut
PIECE_TEXT = st.lists(st.sampled_from([" ", "  ", "\n", "\t", "\xa0", "\u3000", "\x1c", "a", "s", "t", "é",
                                       "1", "'", "!", "🤖"]), max_size=30).map("".join)


@settings(max_examples=400, deadline=None)
@given(st.one_of(PIECE_TEXT, ANY_TEXT))
def test_pieces_split_like_the_whole_text(text):
    """The learner counts cheap pieces and splits each distinct one: the same chunks, in order."""
    pieces = gpt2_pieces(text)
    assert "".join(pieces) == text
    assert [c for p in pieces for c in gpt2_split(p)] == gpt2_split(text)


def test_piece_counts_equal_chunk_counts_in_first_seen_order(wikitext_valid_lines):
    lines = wikitext_valid_lines[:2000] + ["  lead", "trail  ", "\ttab\t\n x", "\xa0nbsp  'll"]
    direct = count_chunks(lines, gpt2_split)
    via_pieces = refine_counts(count_chunks(lines, gpt2_pieces), gpt2_split)
    assert list(via_pieces.items()) == list(direct.items())


@settings(max_examples=300, deadline=None)
@given(st.one_of(PIECE_TEXT, ANY_TEXT))
def test_whitespace_split_is_unicode_white_space(text):
    """``str.split`` also cuts at U+001C..U+001F; the learner's word splitter must not."""
    assert whitespace_split(text) == WORD_RE.findall(text)


def test_gpt2_pretokenization_rules():
    assert gpt2_split("I'll say it's 2024!  Done") == [
        "I", "'ll", " say", " it", "'s", " 2024", "!", " ", " Done"]


@settings(max_examples=200, deadline=None)
@given(ANY_TEXT)
def test_round_trip_of_any_text(bl, text):
    ids = bl.encode(text)
    assert bl.decode(ids) == text
    assert bl.unk_id not in ids or "[UNK]" in text  # only a literally written [UNK] gives one


@pytest.mark.parametrize("text", GOLDEN_STRINGS)
def test_round_trip_golden_strings(bl, text):
    assert bl.decode(bl.encode(text)) == text


def test_vocabulary_and_size(bl):
    assert bl.vocab_size == 1000
    assert bl.vocab[:7] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]
    assert bl.vocab[7:7 + 256] == BYTE_ENCODER
    assert bl.vocab[7 + 256:] == ["".join(m) for m in bl.merges]
    assert bl.tokenize(" the")[0] == "Ġthe"  # a common word is one token


def test_vocab_size_too_small_names_the_minimum():
    with pytest.raises(LmlabError, match="vocab_size >= 263"):
        train_tokenizer("bytelevel", ["some text"], vocab_size=262)
    with pytest.raises(LmlabError, match="empty"):
        train_tokenizer("bytelevel", [], vocab_size=300)
    assert train_tokenizer("bytelevel", ["ab ab ab"], vocab_size=263).merges == []


def test_offsets_in_characters_of_the_original_text(bl, bl_hf):
    text = "Héllo 日本語 🤖!"
    spans = bl.tokenize_with_offsets(text)
    for tok, s, e in spans:
        assert from_byte_symbols(tok).decode("utf-8", "replace").strip("\ufffd") in text[s:e]
    assert [(s, e) for _, s, e in spans] == bl_hf.encode(text, add_special_tokens=False).offsets


def test_fast_encode_equals_the_generic_path(bl, wikitext_valid_lines):
    for line in wikitext_valid_lines[:100] + ["<s>hello</s> [MASK]!"]:
        assert bl.encode(line) == [bl.id_of(t) for t in bl.tokenize(line)]
    check_cached_encode(bl, wikitext_valid_lines[:300] + ["", "  \t ", "Zß 日本 🤖 é\u3000y", "<s>hi</s>"])


def test_tokenizer_json_gives_identical_ids_and_offsets_in_hf(bl, bl_hf, wikitext_valid_lines, shakespeare):
    lines = wikitext_valid_lines[:400] + shakespeare[200_000:240_000].splitlines() + GOLDEN_STRINGS
    for line in lines:
        hf = bl_hf.encode(line, add_special_tokens=False)
        assert bl.encode(line) == hf.ids, line
        assert [(s, e) for _, s, e in bl.tokenize_with_offsets(line)] == hf.offsets, line
    ids = bl.encode(GOLDEN_STRINGS[0])
    assert bl_hf.decode(ids) == GOLDEN_STRINGS[0]


@settings(max_examples=100, deadline=None)
@given(ANY_TEXT)
def test_hf_agrees_on_arbitrary_text(bl, bl_hf, text):
    assert bl.encode(text) == bl_hf.encode(text, add_special_tokens=False).ids


def test_save_load_round_trip(bl, tmp_path, wikitext_valid_lines):
    again = load_tokenizer(bl.save(tmp_path / "tok"))
    assert isinstance(again, ByteLevelBPETokenizer)
    assert again.vocab == bl.vocab and again.merges == bl.merges and again.roles == bl.roles
    assert all(again.encode(x) == bl.encode(x) for x in wikitext_valid_lines[:50])


@pytest.mark.parametrize("merges_as_strings", [False, True])
def test_loads_a_tokenizer_trained_by_hf(tmp_path, shakespeare, wikitext_valid_lines, merges_as_strings):
    import json

    from tokenizers import ByteLevelBPETokenizer as HFByteLevel

    hf = HFByteLevel()
    hf.train_from_iterator([shakespeare[:150_000]], vocab_size=700, special_tokens=["<|endoftext|>"],
                           show_progress=False)
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    if merges_as_strings:  # the layout older `tokenizers` versions write
        data = json.loads(path.read_text())
        data["model"]["merges"] = [" ".join(m) for m in data["model"]["merges"]]
        path.write_text(json.dumps(data))
    ours = load_tokenizer(path)
    assert isinstance(ours, ByteLevelBPETokenizer)
    assert ours.vocab_size == hf.get_vocab_size() and ours.eos_id == 0
    for line in wikitext_valid_lines[:300] + ["end<|endoftext|>start 🤖"]:
        assert ours.encode(line) == hf.encode(line).ids, line

"""Character BPE with end-of-word `_`: the lecture's golden case, vocabulary rules, HF export."""

from __future__ import annotations

import json

import pytest
from tokenizers import Tokenizer as HFTokenizer

from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer, train_tokenizer
from lmlab.tokenizers.bpe import CharBPETokenizer
from tests.tokenizers.cache_checks import check_cached_encode

LECTURE = "low low low low lowest lowest newer newer newer newer newer newer wider wider wider new new"
GOLDEN = [("e", "r"), ("er", "_"), ("n", "e"), ("ne", "w"), ("l", "o"), ("lo", "w"), ("new", "er_"),
          ("low", "_")]


@pytest.fixture(scope="module")
def lecture_tok() -> CharBPETokenizer:
    return train_tokenizer("bpe", [LECTURE], num_merges=8)


@pytest.fixture(scope="module")
def shakespeare_bpe(shakespeare) -> CharBPETokenizer:
    return train_tokenizer("bpe", shakespeare[:300_000].splitlines(keepends=True), vocab_size=1200)


@pytest.fixture(scope="module")
def shakespeare_bpe_hf(shakespeare_bpe, tmp_path_factory) -> HFTokenizer:
    d = shakespeare_bpe.save(tmp_path_factory.mktemp("bpe") / "tok")
    return HFTokenizer.from_file(str(d / "tokenizer.json"))


def test_lecture_golden_case(lecture_tok):
    assert lecture_tok.merges == GOLDEN
    assert lecture_tok.tokenize("newer") == ["newer_"]
    assert lecture_tok.tokenize("lower") == ["low", "er_"]


def test_segmenter_applies_merges_in_learned_order(lecture_tok):
    # rank order, not longest match: "newest" has no merge for "es", so "new" + "e s t _"
    assert lecture_tok.tokenize("newest") == ["new", "e", "s", "t", "_"]
    assert lecture_tok.tokenize("  low\tlower\n") == ["low_", "low", "er_"]
    assert lecture_tok.tokenize("") == []


def test_vocabulary_is_specials_alphabet_merges(lecture_tok):
    alphabet = sorted(set(LECTURE.replace(" ", "")) | {"_"})
    assert lecture_tok.vocab == lecture_tok.special_tokens + alphabet + ["".join(m) for m in GOLDEN]
    assert lecture_tok.special_tokens == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]


def test_vocab_size_fills_exactly(shakespeare_bpe):
    assert shakespeare_bpe.vocab_size == 1200
    tok = train_tokenizer("bpe", [LECTURE], vocab_size=7 + 11 + 5)
    assert tok.merges == GOLDEN[:5]


def test_vocab_size_too_small_names_the_minimum():
    with pytest.raises(LmlabError, match=r"vocab_size >= 18"):  # 7 specials + 10 letters + "_"
        train_tokenizer("bpe", [LECTURE], vocab_size=17)


def test_needs_a_size_and_a_corpus():
    with pytest.raises(LmlabError, match="vocab_size or num_merges"):
        train_tokenizer("bpe", [LECTURE])
    with pytest.raises(LmlabError, match="empty"):
        train_tokenizer("bpe", ["", "  \n"], num_merges=3)
    with pytest.raises(LmlabError, match="num_merges"):
        train_tokenizer("bpe", [LECTURE], num_merges=-2)


def test_texts_may_be_any_iterable_of_lines(lecture_tok):
    lines = (w + "\n" for w in LECTURE.split())  # a generator, one word per line
    assert train_tokenizer("bpe", lines, num_merges=8).merges == GOLDEN


def test_unknown_characters_become_unk(lecture_tok):
    assert lecture_tok.tokenize("lowé") == ["low", "[UNK]", "_"]
    assert lecture_tok.encode("é")[0] == lecture_tok.unk_id
    no_unk = train_tokenizer("bpe", [LECTURE], num_merges=2, special_tokens=[])
    with pytest.raises(LmlabError, match="not in the vocabulary"):
        no_unk.encode("é")


def test_decode_turns_end_of_word_into_spaces(lecture_tok):
    ids = lecture_tok.encode("lower newer  wider")
    assert lecture_tok.decode(ids) == "lower newer wider"
    assert lecture_tok.convert_ids_to_tokens(ids) == ["low", "er_", "newer_", "w", "i", "d", "er_"]


def test_offsets_cover_the_word_characters(lecture_tok):
    assert lecture_tok.tokenize_with_offsets("lower newest") == [
        ("low", 0, 3), ("er_", 3, 5), ("new", 6, 9), ("e", 9, 10), ("s", 10, 11), ("t", 11, 12),
        ("_", 11, 12)]


def test_tokenizer_json_gives_identical_ids_in_hf(shakespeare_bpe, shakespeare_bpe_hf, wikitext_valid_lines,
                                                  shakespeare):
    lines = wikitext_valid_lines[:400] + shakespeare[300_000:340_000].splitlines()
    lines.append("tabs\tand  doubled  spaces, ünïcödé ✓ and a_literal_underscore\x1c\u3000end")
    n_unk = 0
    for line in lines:
        ours = shakespeare_bpe.encode(line)
        hf = shakespeare_bpe_hf.encode(line, add_special_tokens=False)
        assert ours == hf.ids, line
        assert [(s, e) for _, s, e in shakespeare_bpe.tokenize_with_offsets(line)] == hf.offsets, line
        n_unk += ours.count(shakespeare_bpe.unk_id)
    assert n_unk > 0  # WikiText has characters Shakespeare lacks: the unk path was exercised
    assert shakespeare_bpe_hf.decode(shakespeare_bpe.encode("to be or not")) == "to be or not"


def test_save_and_load_round_trip(shakespeare_bpe, tmp_path, wikitext_valid_lines):
    d = shakespeare_bpe.save(tmp_path / "tok")
    again = load_tokenizer(d)
    assert isinstance(again, CharBPETokenizer)
    assert again.merges == shakespeare_bpe.merges and again.vocab == shakespeare_bpe.vocab
    assert again.roles == shakespeare_bpe.roles
    for line in wikitext_valid_lines[:50]:
        assert again.encode(line) == shakespeare_bpe.encode(line)
    # the tokenizer.json alone (no tokenizer_config.json) is recognised as character BPE too
    alone = tmp_path / "alone.json"
    alone.write_text((d / "tokenizer.json").read_text())
    assert load_tokenizer(alone).merges == shakespeare_bpe.merges


def test_loading_an_unsupported_bpe_layout_is_a_clear_error(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    hf = Tokenizer(models.BPE(unk_token="[UNK]", end_of_word_suffix="</w>"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    hf.train_from_iterator([LECTURE], trainers.BpeTrainer(vocab_size=40, special_tokens=["[UNK]"],
                                                          end_of_word_suffix="</w>", show_progress=False))
    path = tmp_path / "tokenizer.json"
    hf.save(str(path))
    assert json.loads(path.read_text())["model"]["type"] == "BPE"
    with pytest.raises(LmlabError, match="end_of_word_suffix"):
        load_tokenizer(path)


def test_cached_encode_equals_the_generic_path_and_the_cache_is_bounded(shakespeare_bpe, shakespeare,
                                                                       wikitext_valid_lines):
    lines = (wikitext_valid_lines[:300] + shakespeare[300_000:320_000].splitlines()
             + ["", "  \t ", "a_b __ x_", "Zß 日本 🤖 é\u3000y\x1cz", "[CLS] low[SEP]er [MASK]"])
    check_cached_encode(shakespeare_bpe, lines)


def test_a_pickled_tokenizer_leaves_its_ids_cache_behind(shakespeare_bpe, wikitext_valid_lines):
    """encode_many's workers receive the tokenizer pickled: not the words it has cached."""
    import pickle

    lines = wikitext_valid_lines[:400]
    shakespeare_bpe._ids_cache.clear()
    cold = len(pickle.dumps(shakespeare_bpe))
    expected = [shakespeare_bpe.encode(line) for line in lines]
    assert len(shakespeare_bpe._ids_cache) > 1000
    copy = pickle.loads(pickle.dumps(shakespeare_bpe))
    assert len(pickle.dumps(shakespeare_bpe)) == cold and copy._ids_cache == {}
    assert [copy.encode(line) for line in lines] == expected
    assert len(shakespeare_bpe._ids_cache) > 1000  # the original keeps its cache

"""Unigram LM tokenizer: segmenter, sampler, EM learner, tokenizer.json export.

References: Hugging Face ``tokenizers`` (same ids from our tokenizer.json), ``sentencepiece``
(compression within 2% on the same corpus and vocabulary size), brute-force enumeration of all
segmentations (Viterbi, forward-backward and sampling are exact).
"""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer, train_tokenizer
from lmlab.tokenizers.metaspace import SPACE, normalize, split_words
from lmlab.tokenizers.unigram import UnigramTokenizer
from lmlab.tokenizers.unigram_trainer import (
    Lattices,
    _distinct_substrings,
    _seed,
    digamma,
    script_runs,
    substring_spans,
)
from tests.tokenizers.cache_checks import check_cached_encode

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "<s>", "</s>"]


@pytest.fixture(scope="module")
def shakes_tok(shakespeare) -> UnigramTokenizer:
    return train_tokenizer("unigram", [shakespeare], vocab_size=2000)


def toy(pieces: dict[str, float], specials=("[UNK]",)) -> UnigramTokenizer:
    specials = list(specials)
    return UnigramTokenizer(specials + list(pieces), [0.0] * len(specials) + list(pieces.values()), specials)


def all_segmentations(word: str, vocab: set[str]):
    if not word:
        yield []
        return
    for j in range(1, len(word) + 1):
        if word[:j] in vocab:
            for rest in all_segmentations(word[j:], vocab):
                yield [word[:j]] + rest


TOY = {SPACE: -3.0, "a": -1.5, "b": -1.7, "c": -2.5, SPACE + "a": -2.0, "ab": -2.2, "bc": -2.9,
       "abc": -3.9, SPACE + "ab": -3.1, "ca": -2.6}


# --------------------------------------------------------------------------- pre-tokenization
def test_whitespace_normalisation_and_words():
    assert normalize("  Hello \t world\n") == f"{SPACE}Hello{SPACE}world"
    assert normalize(" \n ") == ""
    assert [w for w, _, _ in split_words("Hello  world")] == [f"{SPACE}Hello", f"{SPACE}world"]
    # a literal ▁ starts a word, as in Hugging Face's Metaspace pre-tokenizer
    assert [w for w, _, _ in split_words(f"a {SPACE}b")] == [f"{SPACE}a", SPACE, f"{SPACE}b"]


def test_script_runs_keep_letters_apart_from_punctuation():
    assert script_runs(f"{SPACE}don't") == [f"{SPACE}don", "'", "t"]
    assert script_runs(f"{SPACE}(1990),") == [f"{SPACE}(1990),"]
    assert script_runs(f"{SPACE}naïve") == [f"{SPACE}naïve"]
    assert script_runs(f"{SPACE}abcδεζ") == [f"{SPACE}abc", "δεζ"]


# --------------------------------------------------------------------------- segmenter
@settings(max_examples=150, deadline=None)
@given(st.text(alphabet="abc", min_size=1, max_size=9))
def test_viterbi_is_the_most_probable_segmentation(body):
    tok = toy(TOY)
    word = SPACE + body
    best = max(sum(TOY[p] for p in seg) for seg in all_segmentations(word, set(TOY)))
    got = [t for t, _, _ in tok._viterbi(word)]
    assert "".join(got) == word
    assert math.isclose(sum(TOY[p] for p in got), best, abs_tol=1e-12)


def test_ties_and_unknown_characters_match_hugging_face():
    from tokenizers import Tokenizer

    # "ab" == "a" + "b" exactly: both tokenizers must pick the same one; x, y are unknown.
    tok = toy({SPACE: -1.0, "a": -1.0, "b": -1.0, "ab": -2.0, SPACE + "a": -2.0, "ba": -2.0})
    hf = Tokenizer.from_str(__import__("json").dumps(tok.to_hf_json()))
    for text in ["ab", "aba bab", "xyab", "axyb ba", "abxx yyy", "bababab  a\tb"]:
        assert tok.encode(text) == hf.encode(text, add_special_tokens=False).ids, text
    assert tok.tokenize("axyb") == [f"{SPACE}a", "xy", "b"]  # one [UNK] for a run of unknowns
    assert tok.encode("axyb") == [tok.token_to_id[f"{SPACE}a"], tok.unk_id, tok.token_to_id["b"]]


def test_offsets_point_at_the_characters_of_each_piece(shakes_tok, wikitext_valid_lines):
    for line in wikitext_valid_lines[:200]:
        for tok, s, e in shakes_tok.tokenize_with_offsets(line):
            assert line[s:e] == tok.lstrip(SPACE)


# --------------------------------------------------------------------------- sampling
def test_sampling_follows_p_to_the_alpha():
    tok = toy(TOY)
    word, alpha = f"{SPACE}abca", 0.5
    segs = list(all_segmentations(word, set(TOY)))
    weights = [math.exp(alpha * sum(TOY[p] for p in s)) for s in segs]
    z = sum(weights)
    rng = random.Random(0)
    n = 4000
    got = Counter(tuple(tok.sample("abca", alpha=alpha, rng=rng)) for _ in range(n))
    assert set(got) <= {tuple(s) for s in segs}
    for seg, w in zip(segs, weights):
        p = w / z
        assert abs(got[tuple(seg)] / n - p) < 4 * math.sqrt(p * (1 - p) / n) + 1e-3, (seg, got[tuple(seg)], p)


def test_sampled_encoding_is_reproducible_and_decodes_back(shakes_tok):
    text = "To be, or not to be, that is the question"
    a = shakes_tok.encode(text, sample=True, alpha=0.1, seed=3)
    assert a == shakes_tok.encode(text, sample=True, alpha=0.1, seed=3)
    draws = {tuple(shakes_tok.encode(text, sample=True, alpha=0.1, seed=s)) for s in range(20)}
    assert len(draws) > 1  # subword regularization really varies the segmentation
    assert all(shakes_tok.decode(list(d)) == text for d in draws)
    # a large alpha concentrates the distribution on the Viterbi segmentation
    assert shakes_tok.encode(text, sample=True, alpha=50.0, seed=1) == shakes_tok.encode(text)
    with pytest.raises(LmlabError, match="alpha"):
        shakes_tok.encode(text, sample=True, alpha=0)


# --------------------------------------------------------------------------- learner internals
def test_digamma_matches_the_derivative_of_lgamma():
    x = np.array([0.5, 0.9, 1.0, 2.5, 7.0, 123.4, 1e5])
    h = 1e-5
    numeric = [(math.lgamma(v + h) - math.lgamma(v - h)) / (2 * h) for v in x]
    assert np.allclose(digamma(x), numeric, rtol=1e-6, atol=1e-6)
    assert math.isclose(digamma(np.array([1.0]))[0], -0.5772156649015329, rel_tol=1e-12)


def test_forward_backward_and_viterbi_match_brute_force():
    pieces = list(TOY)
    pid = {p: n for n, p in enumerate(pieces)}
    logp = np.array([TOY[p] for p in pieces])
    words = [f"{SPACE}abca", f"{SPACE}ab", "bcab", "c"]
    counts = np.array([3.0, 1.0, 2.0, 5.0])
    lengths = np.array([len(w) for w in words])
    k, i, j = substring_spans(lengths, 4)
    ids = np.array([pid.get(words[a][b:c], -1) for a, b, c in zip(k, i, j)])
    keep = ids >= 0
    lat = Lattices(lengths, counts, k[keep], i[keep], j[keep], ids[keep])
    expected, loglik = lat.expected_counts(logp[lat.piece], len(pieces))
    want, want_ll = np.zeros(len(pieces)), 0.0
    for w, c in zip(words, counts):
        segs = list(all_segmentations(w, set(pieces)))
        probs = np.array([math.exp(sum(TOY[p] for p in s)) for s in segs])
        want_ll += c * math.log(probs.sum())
        for s, pr in zip(segs, probs / probs.sum()):
            for p in s:
                want[pid[p]] += c * pr
    assert np.allclose(expected, want)
    assert math.isclose(loglik, want_ll)
    score, rows_k, rows_e = lat.viterbi(logp[lat.piece])
    tok = toy(TOY)
    for n, w in enumerate(words):
        got = sorted(pieces[p] for p in lat.piece[rows_e[rows_k == n]])
        assert got == sorted(t for t, _, _ in tok._viterbi(w))


def test_distinct_substrings_number_equal_substrings_alike():
    chunks = [f"{SPACE}abab", "ba", f"{SPACE}ab", "\u00e9\u00e9a"]
    text, lengths = "".join(chunks), np.array([len(c) for c in chunks])
    starts = np.cumsum(lengths) - lengths
    by_length = _distinct_substrings(text, lengths, 3)
    assert len(by_length) == 3
    for length, (pos, sub) in enumerate(by_length, 1):
        want = [p for s, n in zip(starts, lengths) for p in range(s, s + n - length + 1)]
        assert pos.tolist() == want  # every start inside one chunk, none across a chunk boundary
        strings = [text[p:p + length] for p in want]
        assert len(set(strings)) == len(set(sub.tolist())) == int(sub.max()) + 1
        assert all((a == b) == (x == y) for (a, x), (b, y) in itertools.product(zip(strings, sub), repeat=2))


def test_seed_ranks_substrings_by_count_times_length_and_builds_compact_lattices():
    chunks = [f"{SPACE}abab", "ba", f"{SPACE}ab", "bab"]
    weights = np.array([2.0, 3.0, 1.0, 1.0])
    pieces, logp, is_char, lat = _seed(chunks, weights, 4, 1000, set(), target=2)
    counts: Counter = Counter()
    for c, w in zip(chunks, weights):
        for a in range(len(c)):
            for b in range(a + 1, min(len(c), a + 4) + 1):
                counts[c[a:b]] += w
    chars = [p for p in pieces if len(p) == 1]
    assert set(chars) == {SPACE, "a", "b"} and pieces[:3] == chars
    assert [counts[p] for p in chars] == sorted((counts[p] for p in chars), reverse=True)
    multi = pieces[3:]
    want = sorted((p for p in counts if len(p) > 1 and counts[p] >= 2), key=lambda p: -counts[p] * len(p))
    assert sorted(multi) == sorted(want)
    assert [counts[p] * len(p) for p in multi] == sorted((counts[p] * len(p) for p in multi), reverse=True)
    assert np.allclose(np.exp(logp), [counts[p] * len(p) for p in pieces] / np.sum(
        [counts[p] * len(p) for p in pieces]))
    assert is_char.tolist() == [len(p) == 1 for p in pieces]
    # the lattice holds exactly the seed pieces' occurrences, in 4-byte integers
    got = sorted((int(k), int(i), int(j)) for k, i, j in zip(lat.k, lat.i, lat.j))
    want_edges = sorted((n, a, b) for n, c in enumerate(chunks) for a in range(len(c))
                        for b in range(a + 1, min(len(c), a + 4) + 1) if c[a:b] in pieces)
    assert got == want_edges
    assert all(pieces[p] == chunks[k][i:j] for k, i, j, p in zip(lat.k, lat.i, lat.j, lat.piece))
    arrays = (lat.k, lat.i, lat.j, lat.piece, lat.src, lat.dst, lat.bperm)
    assert {a.dtype for a in arrays} == {np.dtype(np.int32)}


# --------------------------------------------------------------------------- the trained tokenizer
def test_trained_vocabulary_has_the_size_specials_and_every_character(shakes_tok, shakespeare):
    assert shakes_tok.vocab_size == 2000
    assert shakes_tok.vocab[:7] == SPECIALS
    assert set(normalize(shakespeare).replace(SPACE, "")) <= set(shakes_tok.vocab)
    assert SPACE in shakes_tok.token_to_id
    assert all(len(p) <= 16 for p in shakes_tok.vocab)
    # pieces are ranked by log-probability, and probabilities are proper (sum <= 1)
    scores = shakes_tok.scores[7:]
    assert scores == sorted(scores, reverse=True)
    assert sum(math.exp(s) for s in scores) <= 1.0 + 1e-9


def test_round_trip_on_raw_text_with_spaces(shakes_tok, shakespeare, wikitext_valid_lines):
    text = "Hello world, this is raw text with spaces."
    assert shakes_tok.decode(shakes_tok.encode(text)) == text
    known = set(shakes_tok.vocab)
    lines = [ln for ln in shakespeare.splitlines() if ln.strip()][:300]
    wiki = [" ".join(ln.split()) for ln in wikitext_valid_lines[:1000]]
    wiki = [ln for ln in wiki if set(ln.replace(" ", "")) <= known]
    assert len(wiki) > 20
    lines = [ln.strip() for ln in lines + wiki if set(ln.replace(" ", "")) <= known]
    for ln in lines:
        if "  " not in ln:
            assert shakes_tok.decode(shakes_tok.encode(ln)) == ln
    # the documented lossy step: whitespace runs become one space, ends are stripped
    assert shakes_tok.decode(shakes_tok.encode("  to  be\tor\n\nnot ")) == "to be or not"
    # unseen characters become [UNK]
    assert shakes_tok.decode(shakes_tok.encode("caf\u00e9 \u2603"), skip_special_tokens=True) == "caf "
    assert shakes_tok.decode(shakes_tok.encode_plus("to be").ids) == "[CLS] to be[SEP]"  # as HF decodes it


def test_round_trip_on_wikitext_lines(wikitext_valid_lines):
    tok = train_tokenizer("unigram", wikitext_valid_lines[:1500], vocab_size=1500)
    held_out = [" ".join(ln.split()) for ln in wikitext_valid_lines[1500:2000]]
    known = set(tok.vocab)
    lines = [ln for ln in held_out if set(ln.replace(" ", "")) <= known]
    assert len(lines) > 300
    for ln in lines:
        assert tok.decode(tok.encode(ln)) == ln


def test_special_tokens_and_templates(shakes_tok):
    enc = shakes_tok.encode_plus("Romeo", "Juliet")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    ids = shakes_tok.encode("[CLS] to be [SEP]")
    assert ids[0] == shakes_tok.cls_id and ids[-1] == shakes_tok.sep_id


def test_compression_within_2_percent_of_sentencepiece(shakes_tok, shakespeare, wikitext_valid_lines,
                                                       tmp_path):
    """The acceptance check: same corpus (tinyshakespeare), same vocab size (2000), coverage 1.0."""
    import sentencepiece as spm

    corpus = tmp_path / "c.txt"
    corpus.write_text(shakespeare, encoding="utf-8")
    spm.SentencePieceTrainer.train(input=str(corpus), model_prefix=str(tmp_path / "sp"), vocab_size=2000,
                                   model_type="unigram", character_coverage=1.0, minloglevel=2)
    sp = spm.SentencePieceProcessor(model_file=str(tmp_path / "sp.model"))
    text = "\n".join(wikitext_valid_lines[:1500])
    ratio = len(shakes_tok.encode(text)) / len(sp.encode(text))
    assert ratio <= 1.02, ratio


def test_tokenizer_json_gives_identical_ids_in_hugging_face(shakes_tok, wikitext_valid_lines, tmp_path):
    from tokenizers import Tokenizer

    shakes_tok.save(tmp_path / "tok")
    hf = Tokenizer.from_file(str(tmp_path / "tok" / "tokenizer.json"))
    back = load_tokenizer(tmp_path / "tok")
    assert isinstance(back, UnigramTokenizer) and back.vocab == shakes_tok.vocab
    odd = ["a  b\tc\n", f"x {SPACE} y{SPACE}z", "caf\u00e9 \u2603\u2603 x\u2603y", "", "  ",
           "\u3000a\u00a0b\x1fc"]
    lines = wikitext_valid_lines[:600] + odd
    for ln in lines:
        ids = shakes_tok.encode(ln)
        assert hf.encode(ln, add_special_tokens=False).ids == ids, ln
        assert back.encode(ln) == ids
    assert hf.encode("to be", "or not").ids == shakes_tok.encode_plus("to be", "or not").ids
    for ln in lines[:100] + ["[CLS] to be [SEP] or", "caf\u00e9 \u2603"]:
        for skip in (False, True):
            ids = shakes_tok.encode_plus(ln).ids
            ours = shakes_tok.decode(ids, skip_special_tokens=skip)
            assert ours == hf.decode(ids, skip_special_tokens=skip)


# --------------------------------------------------------------------------- errors and small corpora
def test_bad_input_gives_one_line_errors():
    corpus = ["low lower newest widest", "low lowest newer"]
    with pytest.raises(LmlabError, match=r"at least 18 .*vocab_size >= 18"):
        train_tokenizer("unigram", corpus, vocab_size=15)
    with pytest.raises(LmlabError, match="vocabulary size"):
        train_tokenizer("unigram", corpus)
    with pytest.raises(LmlabError, match="empty"):
        train_tokenizer("unigram", ["   ", "\n"], vocab_size=100)


def test_small_corpus_and_no_specials():
    corpus = ["low lower newest widest", "low lowest newer"] * 3
    tok = train_tokenizer("unigram", corpus, vocab_size=30, special_tokens=["<unk>"])
    assert tok.vocab_size == 30 and tok.unk_id == 0
    assert tok.decode(tok.encode("lowest newer")) == "lowest newer"
    assert any(len(p) > 2 for p in tok.vocab[1:])  # it learnt multi-character pieces
    bare = train_tokenizer("unigram", corpus, vocab_size=20, special_tokens=[])
    assert bare.decode(bare.encode("low")) == "low"
    with pytest.raises(LmlabError, match="no unknown token"):
        bare.encode("xyz")


def test_training_is_deterministic_and_streams_lines():
    lines = [f"line {i} has words like lower and lowest and newer\n" for i in range(50)]
    a = train_tokenizer("unigram", iter(lines), vocab_size=60)
    b = train_tokenizer("unigram", lines, vocab_size=60)
    assert a.vocab == b.vocab and a.scores == b.scores


def test_segmentations_of_all_pieces_are_consistent(shakes_tok):
    # every learnt piece that is its own best segmentation is reachable as a single token
    singles = sum(1 for p in shakes_tok.vocab[7:] if p.startswith(SPACE) and len(p) > 1
                  and shakes_tok.tokenize(p.replace(SPACE, "")) == [p])
    assert singles > 300
    assert list(itertools.islice((p for p in shakes_tok.vocab if SPACE in p[1:]), 1)) == []


def test_cached_encode_equals_the_generic_path_and_the_cache_is_bounded(shakes_tok, shakespeare,
                                                                       wikitext_valid_lines):
    edge = ["", " \t\n ", "a ▁b", "▁▁x", "a▁", "  ▁a  ", "a \u3000 b\x85c", "x\x1cy", "日本 🤖 ∫",
            "<s>to be</s> [MASK]or", "[CLS]", " [SEP] a"]
    lines = wikitext_valid_lines[:300] + shakespeare[100_000:120_000].splitlines() + edge
    check_cached_encode(shakes_tok, lines)

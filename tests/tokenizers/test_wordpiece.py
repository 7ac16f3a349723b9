"""WordPiece (BERT): segmenter, basic tokenizer, vocab.txt loading, learner, tokenizer.json.

References: Hugging Face ``transformers.BertTokenizerFast`` on the real all-MiniLM-L6-v2 (BERT
uncased) vocabulary, ``tokenizers.Tokenizer`` for exported files, on real WikiText-2 text.
"""

from __future__ import annotations

import json
import unicodedata

import pytest

from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer, train_tokenizer
from lmlab.tokenizers.bert_normalize import BertNormalizer
from lmlab.tokenizers.wordpiece import WordPieceTokenizer

transformers = pytest.importorskip("transformers")
hf_tokenizers = pytest.importorskip("tokenizers")

TRICKY = [
    "Héllo Wörld! Ça va? naïve café résumé Ångström",
    "İstanbul ΟΔΟΣ Straße ﬁne Ⅻ ½ x²",
    "中文字符测试：北京大学。日本語のテキスト，한국어 텍스트",
    "emoji 😀👍🏽 family 👨‍👩‍👧 flags 🇩🇰 🥲 ❤️",
    "tab\there\nnew\r\nline\x00nul\x07bell\x0bvt\x0cff\x85nel\u200bzw\u200dzwj\ufeffbom\ufffdrep",
    "mixed--punct...!?;:'\"()[]{}<>@#$%^&*_+=|\\/~`",
    "don't won't y'all rock'n'roll U.S.A. e.g. 3.14 1,000,000 $5.00 50% #hashtag @user",
    "  leading and trailing spaces  ",
    "\u00a0nbsp\u2003emsp\u3000ideographic\u2028ls\u2029ps",
    "a" * 99 + " " + "b" * 100 + " " + "c" * 101 + " " + "x" * 250,
    "combining: e\u0301 a\u0308 n\u0303 standalone \u0301 mark",
    "special tokens [CLS] inline [SEP][MASK]x[PAD] and [cls] lower [UNK]",
    "",
    "   ",
    "Ⓐⓑⓒ ＦＵＬＬＷＩＤＴＨ ｋａｔａｋａｎａ ｶﾀｶﾅ",
    "math ∑∫√∞ ≠ ≤ ≥ ± × ÷ arrows → ⇒ ← box ─│┌",
]


def _bert_reference(vocab_path, **kw):
    """transformers' BERT tokenizer on a vocab.txt (v4 takes ``vocab_file=``; v5 ignores it: ``vocab=``)."""
    n = sum(1 for _ in open(vocab_path, encoding="utf-8"))
    ref = transformers.BertTokenizerFast(vocab_file=str(vocab_path), **kw)
    if len(ref) != n:
        ref = transformers.BertTokenizerFast(vocab=str(vocab_path), **kw)
    assert len(ref) == n, "the reference tokenizer did not load the vocabulary"
    return ref


@pytest.fixture(scope="module")
def vocab_path(minilm_dir):
    return minilm_dir / "vocab.txt"


@pytest.fixture(scope="module")
def bert(vocab_path):
    return load_tokenizer(vocab_path)


@pytest.fixture(scope="module")
def ref(vocab_path):
    return _bert_reference(vocab_path, do_lower_case=True)


@pytest.fixture(scope="module")
def wiki_all_lines(data_dir):
    """Every line of WikiText-2 valid (3,760, some only spaces)."""
    path = data_dir / "pretrain" / "wikitext-2" / "wiki.valid.tokens"
    return path.read_text(encoding="utf-8").splitlines()


@pytest.fixture(scope="module")
def trained(shakespeare):
    return {lower: train_tokenizer("wordpiece", [shakespeare], vocab_size=2000, lowercase=lower)
            for lower in (True, False)}


# ---------------------------------------------------------------------- segmenter
def _toy(words, **kw):
    return WordPieceTokenizer(["[UNK]", *words], ["[UNK]"], **kw)


def test_greedy_longest_match_first_bert_example():
    tok = _toy(["un", "una", "##aff", "##ffa", "##able", "##b", "##l", "##e"])
    # longest match first, never revisited: "una" beats "un", so "un ##aff ##able" is not found
    assert tok.tokenize("unaffable") == ["una", "##ffa", "##b", "##l", "##e"]
    tok = _toy(["un", "##aff", "##able"])
    assert tok.tokenize("unaffable") == ["un", "##aff", "##able"]
    assert tok.tokenize_with_offsets("x unaffable") == [("[UNK]", 0, 1), ("un", 2, 4), ("##aff", 4, 7),
                                                        ("##able", 7, 11)]


def test_unsegmentable_word_is_one_unk():
    tok = _toy(["un", "##aff", "##able"])
    # the first pieces would match, but the tail cannot: the whole word is [UNK], not un ##aff [UNK]
    assert tok.tokenize("unaffablez un") == ["[UNK]", "un"]
    assert tok.tokenize_with_offsets("unaffablez")[0] == ("[UNK]", 0, 10)


def test_long_words_are_unk():
    tok = _toy(["a", "##a"])
    assert tok.tokenize("a" * 100) == ["a"] + ["##a"] * 99
    assert tok.tokenize("a" * 101) == ["[UNK]"]
    short = _toy(["a", "##a"], max_input_chars_per_word=5)
    assert short.tokenize("aaaaaa aaaaa") == ["[UNK]", "a", *["##a"] * 4]


def test_basic_tokenizer_options_and_offsets():
    text = "Héllo, WÖRLD!中文"
    words = BertNormalizer().words_with_offsets(text)
    assert words == [("hello", 0, 5), (",", 5, 6), ("world", 7, 12), ("!", 12, 13),
                     ("中", 13, 14), ("文", 14, 15)]
    assert BertNormalizer(lowercase=False).words(text) == ["Héllo", ",", "WÖRLD", "!", "中", "文"]
    assert BertNormalizer(lowercase=True, strip_accents=False).words(text)[0] == "héllo"
    assert BertNormalizer(lowercase=False, strip_accents=True).words(text)[0] == "Hello"
    assert BertNormalizer(tokenize_chinese_chars=False).words("a中文b") == ["a中文b"]
    # control characters vanish (joining their neighbours), whitespace separates
    assert BertNormalizer().words("a\x00b\u200bc d\x0be\tf") == ["abc", "de", "f"]
    assert BertNormalizer(clean_text=False).words("a\x0bb") == ["a", "b"]
    # lower-casing is per character: a final capital sigma becomes σ, not ς
    assert BertNormalizer(strip_accents=False).words("ΟΔΟΣ") == ["οδοσ"]


def _sample_codepoints():
    """All of the BMP, a stride through the astral planes, and every code point of the HF tables."""
    from lmlab.tokenizers import bert_normalize as bn

    cps = set(range(0x10000)) | set(range(0x10000, 0x110000, 31)) | set(range(0x2B800, 0x2B940))
    for table in (bn._HF_NOT_CONTROL, bn._HF_NOT_PUNCT, bn._HF_EXTRA_PUNCT, bn._HF_NOT_NONSPACING,
                  bn._HF_EXTRA_NONSPACING, bn._HF_NO_DECOMPOSITION, bn._HF_LOWER):
        cps |= {ord(c) for c in table}
    return [chr(c) for c in sorted(cps) if not 0xD800 <= c <= 0xDFFF]


@pytest.mark.parametrize("lowercase,strip_accents,cjk,clean",
                         [(True, None, True, True), (False, None, True, False), (False, True, False, True)])
def test_basic_tokenizer_matches_hf_on_every_codepoint_class(lowercase, strip_accents, cjk, clean):
    """Words and offsets equal Hugging Face's BertNormalizer + BertPreTokenizer, code point by code point."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    text = " ".join("a" + c + "b" for c in _sample_codepoints())
    hf = Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(clean_text=clean, handle_chinese_chars=cjk,
                                               strip_accents=strip_accents, lowercase=lowercase)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf_words = [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(text))]
    hf_offsets = hf.encode(text).offsets
    mine = BertNormalizer(lowercase, strip_accents, cjk, clean).words_with_offsets(text)
    assert [w for w, _, _ in mine] == hf_words
    assert [(s, e) for _, s, e in mine] == hf_offsets


# ---------------------------------------------------------------------- real BERT vocabulary
def test_vocab_txt_matches_bert_on_all_of_wikitext_valid(bert, ref, wiki_all_lines):
    assert bert.vocab_size == 30522 and bert.lowercase
    assert bert.special_tokens == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert (bert.cls_id, bert.sep_id, bert.unk_id, bert.pad_id, bert.mask_id) == (101, 102, 100, 0, 103)
    expected = ref(wiki_all_lines, add_special_tokens=False)["input_ids"]
    got = [bert.encode(line) for line in wiki_all_lines]
    bad = [i for i, (a, b) in enumerate(zip(got, expected)) if a != b]
    assert len(wiki_all_lines) == 3760 and sum(map(len, got)) > 240_000
    assert not bad, f"{len(bad)} lines differ, first: {wiki_all_lines[bad[0]]!r}"


def test_offsets_and_tokens_match_bert_on_wikitext_sample(bert, ref, wikitext_valid_lines):
    lines = wikitext_valid_lines[::8]
    expected = ref(lines, add_special_tokens=False, return_offsets_mapping=True)
    for i, line in enumerate(lines):
        enc = bert.encode_plus(line, add_special_tokens=False)
        assert enc.ids == expected["input_ids"][i]
        assert enc.offsets == [tuple(o) for o in expected["offset_mapping"][i]], line
        assert enc.tokens == ref.convert_ids_to_tokens(expected["input_ids"][i])


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_strings_match_bert(bert, ref, text):
    e = ref(text, add_special_tokens=False, return_offsets_mapping=True)
    enc = bert.encode_plus(text, add_special_tokens=False)
    assert bert.encode(text) == enc.ids == e["input_ids"]
    assert enc.offsets == [tuple(o) for o in e["offset_mapping"]]
    e = ref(text)
    enc = bert.encode_plus(text)
    assert enc.ids == e["input_ids"] == bert.encode(text, add_special_tokens=True)
    assert enc.type_ids == e["token_type_ids"]


def test_pairs_batches_and_decode_match_bert(bert, ref, wikitext_valid_lines):
    firsts, seconds = TRICKY[:8] + wikitext_valid_lines[:8], TRICKY[8:] + wikitext_valid_lines[8:16]
    for max_length in (None, 47, 48):
        trunc = max_length is not None
        e = ref(firsts, seconds, padding="longest", truncation=trunc and "longest_first",
                max_length=max_length)
        b = bert.encode_batch(firsts, seconds, padding="longest", truncation=trunc, max_length=max_length)
        assert b["input_ids"] == e["input_ids"]
        assert b["token_type_ids"] == e["token_type_ids"]
        assert b["attention_mask"] == e["attention_mask"]
    # the decoder of the tokenizers library (transformers 4 adds its own clean-up on top by default)
    kw = {"clean_up_tokenization_spaces": False}
    for ids in b["input_ids"]:
        assert bert.decode(ids) == ref.decode(ids, **kw)
        assert bert.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True, **kw)
    for line in wikitext_valid_lines[:300]:
        ids = bert.encode(line)
        assert bert.decode(ids) == ref.decode(ids, **kw)


def test_vocab_txt_honours_tokenizer_config(vocab_path, tmp_path, wikitext_valid_lines):
    (tmp_path / "vocab.txt").write_bytes(vocab_path.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    cased = load_tokenizer(tmp_path)  # a directory with only vocab.txt + config
    ref = _bert_reference(vocab_path, do_lower_case=False)
    lines = wikitext_valid_lines[:200] + TRICKY
    assert [cased.encode(t) for t in lines] == ref(lines, add_special_tokens=False)["input_ids"]
    assert cased.encode("Paris") != load_tokenizer(vocab_path).encode("Paris")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "strip_accents": False,
                                                                "tokenize_chinese_chars": False}))
    tok = load_tokenizer(tmp_path / "vocab.txt")
    ref = _bert_reference(vocab_path, do_lower_case=True, strip_accents=False, tokenize_chinese_chars=False)
    assert [tok.encode(t) for t in TRICKY] == ref(TRICKY, add_special_tokens=False)["input_ids"]


def test_loads_hugging_face_tokenizer_json(ref, bert, minilm_dir, tmp_path, wikitext_valid_lines):
    (tmp_path / "tokenizer.json").write_text(ref.backend_tokenizer.to_str(), encoding="utf-8")
    lines = wikitext_valid_lines[:300] + TRICKY
    for tok in (load_tokenizer(tmp_path / "tokenizer.json"), load_tokenizer(minilm_dir)):
        assert isinstance(tok, WordPieceTokenizer) and tok.vocab == bert.vocab
        assert [tok.encode(t) for t in lines] == [bert.encode(t) for t in lines]
        assert tok.encode_plus("a", "b").ids == ref("a", "b")["input_ids"]


# ---------------------------------------------------------------------- learner
def test_ratio_score_prefers_rare_pairs_gain_prefers_frequent_ones():
    # (t, ##h) is the most frequent pair (40), but t is frequent on its own, so its ratio score
    # 40 / (140 * 40) is below that of (q, ##u): 2 / (2 * 2). The likelihood gain of merging
    # (t, ##h) is the larger one (see test_merge_trainer.test_gain_is_the_log_likelihood_change).
    corpus = ["th " * 40 + "qu qu", "t " * 100]
    base = [*train_tokenizer("wordpiece", corpus, vocab_size=100).special_tokens, "q", "t", "##h", "##u"]
    ratio = train_tokenizer("wordpiece", corpus, vocab_size=len(base) + 1, score="ratio")
    assert ratio.vocab == base + ["qu"]
    assert ratio.tokenize("qu th") == ["qu", "t", "##h"]
    gain = train_tokenizer("wordpiece", corpus, vocab_size=len(base) + 1)
    assert gain.vocab == base + ["th"]
    assert gain.tokenize("qu th") == ["q", "##u", "th"]
    assert train_tokenizer("wordpiece", corpus, vocab_size=len(base) + 2).vocab[-2:] == ["th", "qu"]
    with pytest.raises(LmlabError, match=r"score must be one of gain, ratio \(got 'pmi'\)"):
        train_tokenizer("wordpiece", corpus, vocab_size=100, score="pmi")


def test_learner_compresses_held_out_english_like_hugging_face(data_dir):
    """Trained on 1,000 lines of WikiText-2 valid, scored on WikiText-2 test (no line trained on):
    characters per token within 5% of Hugging Face's WordPieceTrainer on the same lines and
    vocabulary size; the textbook ratio score, the learner's old default, falls far short."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    root = data_dir / "pretrain" / "wikitext-2"
    train = [t for t in (root / "wiki.valid.tokens").read_text(encoding="utf-8").splitlines() if t.strip()]
    held = [t for t in (root / "wiki.test.tokens").read_text(encoding="utf-8").splitlines() if t.strip()]
    train = train[:1000]
    seen = set(train)
    held = [t for t in held if t not in seen][:800]  # headings like " = = Notes = = " recur
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    hf = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    hf.normalizer = normalizers.BertNormalizer(lowercase=False)
    hf.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    hf.train_from_iterator(train, trainers.WordPieceTrainer(vocab_size=1000, special_tokens=specials,
                                                             show_progress=False))
    chars = sum(map(len, held))
    hf_cpt = chars / sum(len(e.ids) for e in hf.encode_batch(held, add_special_tokens=False))
    gain = train_tokenizer("wordpiece", train, vocab_size=1000, special_tokens=specials)
    ratio = train_tokenizer("wordpiece", train, vocab_size=1000, special_tokens=specials, score="ratio")
    gain_cpt, ratio_cpt = (chars / sum(len(tok.encode(t)) for t in held) for tok in (gain, ratio))
    assert gain.vocab_size == ratio.vocab_size == hf.get_vocab_size() == 1000
    assert gain_cpt >= 0.95 * hf_cpt, (gain_cpt, hf_cpt)
    assert ratio_cpt < 0.75 * hf_cpt, (ratio_cpt, hf_cpt)
    frequent = ["the", "and", "of", "in", "was", "The"]
    assert all(gain.tokenize(w) == [w] for w in frequent)
    assert not all(ratio.tokenize(w) == [w] for w in frequent)


def test_learner_vocabulary_layout_and_errors(shakespeare):
    text = shakespeare[:20000]
    tok = train_tokenizer("wordpiece", [text], vocab_size=300, special_tokens=["[PAD]", "[CLS]", "[SEP]"])
    assert tok.special_tokens == ["[PAD]", "[CLS]", "[SEP]", "[UNK]"]  # [UNK] added: WordPiece needs it
    words = BertNormalizer(lowercase=False).words(text)
    alphabet = {w[0] for w in words} | {"##" + c for w in words for c in w[1:]}
    assert set(tok.vocab[4:4 + len(alphabet)]) == alphabet and tok.vocab_size == 300
    merged = tok.vocab[4 + len(alphabet):]
    assert all(len(t.removeprefix("##")) >= 2 for t in merged)
    assert tok.decode(tok.encode("Good morrow, cousin!")) == "Good morrow, cousin!"
    need = 4 + len(alphabet)
    with pytest.raises(LmlabError, match=f"vocab_size >= {need}"):
        train_tokenizer("wordpiece", [text], vocab_size=need - 1, special_tokens=["[PAD]", "[CLS]", "[SEP]"])
    with pytest.raises(LmlabError, match="vocab_size"):
        train_tokenizer("wordpiece", [text])
    with pytest.raises(LmlabError, match="empty"):
        train_tokenizer("wordpiece", ["  \n "], vocab_size=100)
    with pytest.raises(LmlabError, match="empty"):  # chunks, but cleaning leaves no word
        train_tokenizer("wordpiece", ["\x00\x07 \ufffd"], vocab_size=100)


@pytest.mark.parametrize("lowercase", [True, False])
def test_trained_tokenizer_json_loads_in_hf_with_same_ids(trained, lowercase, tmp_path, wiki_all_lines):
    tok = trained[lowercase]
    assert tok.vocab_size == 2000 and tok.lowercase == lowercase
    out = tok.save(tmp_path / "wp")
    hf = hf_tokenizers.Tokenizer.from_file(str(out / "tokenizer.json"))
    lines = wiki_all_lines[:1000] + TRICKY
    ours = [tok.encode(t) for t in lines]
    assert ours == [e.ids for e in hf.encode_batch(lines, add_special_tokens=False)]
    hf_offsets = [e.offsets for e in hf.encode_batch(lines[:200])]
    assert [tok.encode_plus(t).offsets for t in lines[:200]] == hf_offsets
    assert tok.encode_plus("to be", "or not").ids == hf.encode("to be", "or not").ids
    some = ours[:200]
    assert [tok.decode(i) for i in some] == [hf.decode(i, skip_special_tokens=False) for i in some]
    assert [tok.decode(i, skip_special_tokens=True) for i in some] == [hf.decode(i) for i in some]
    for path in (out, out / "vocab.txt"):
        back = load_tokenizer(path)
        assert back.vocab == tok.vocab and back.special_tokens == tok.special_tokens
        assert [back.encode(t) for t in lines] == ours
    assert (out / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1] == tok.vocab
    hf_wrapped = transformers.PreTrainedTokenizerFast(tokenizer_file=str(out / "tokenizer.json"))
    assert hf_wrapped(lines[:50], add_special_tokens=False)["input_ids"] == ours[:50]


def test_lowercase_trained_tokenizer_has_no_capitals(trained, shakespeare):
    assert not any(unicodedata.category(c) == "Lu" for t in trained[True].vocab for c in t
                   if t not in trained[True].special_tokens)
    assert trained[False].tokenize("KING")[0].startswith("K")
    assert trained[True].tokenize("KING")[0].startswith("k")


# ---------------------------------------------------------------------- bad input
def test_bad_files_raise_lmlab_errors(tmp_path, minilm_dir):
    with pytest.raises(LmlabError, match="does not exist"):
        load_tokenizer(tmp_path / "missing" / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("")
    with pytest.raises(LmlabError, match="empty"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("[UNK]\na\nb\na\n")
    with pytest.raises(LmlabError, match="twice.*lines 2 and 4"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_bytes(b"[UNK]\n\xff\xfe\n")
    with pytest.raises(LmlabError, match="UTF-8"):
        load_tokenizer(tmp_path / "vocab.txt")
    data = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    data["normalizer"] = {"type": "NFKC"}
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(LmlabError, match="normalizer 'NFKC' is not supported"):
        load_tokenizer(tmp_path / "tokenizer.json")


def test_no_unknown_token_gives_clear_error():
    tok = WordPieceTokenizer(["a", "##b"], [])
    assert tok.encode("ab") == [0, 1]
    with pytest.raises(LmlabError, match="no unknown token"):
        tok.encode("zz")


@pytest.mark.parametrize("lowercase", [True, False])
def test_ascii_fast_path_gives_the_words_and_ids_of_the_generic_path(lowercase, trained,
                                                                      wikitext_valid_lines):
    norm = BertNormalizer(lowercase=lowercase)
    printable = "".join(map(chr, range(33, 127)))
    chunks = [printable, printable[::-1], "Don't-stop!!", "a", "..."] + [
        c for line in wikitext_valid_lines[:200] for c in line.split() if c.isascii()]
    for chunk in chunks:
        assert norm.ascii_words(chunk) == [w for w, _ in norm.split_chunk(chunk)], chunk
    assert norm.ascii_words("café") is None and norm.ascii_words("a\x7fb") is None
    tok = trained[lowercase]
    lines = wikitext_valid_lines[:200] + [printable, "Héllo, WÖRLD!中文 x\x7fy", "[CLS] Don't [MASK]."]
    generic = [[tok.id_of(t) for t in tok.tokenize(line)] for line in lines]
    assert [tok.encode(line) for line in lines] == generic


@pytest.mark.parametrize("lowercase", [True, False])
def test_learner_word_counts_equal_the_generic_split(lowercase, wikitext_valid_lines):
    """The learner counts printable-ASCII chunks through the fast path: same words, same counts and
    the same first-seen order (ties between merges depend on it) as splitting every chunk. Lines
    of printable ASCII are cut by ``str.split``, others (tabs, U+001C..U+001F, which ``str.split``
    takes for spaces but BERT drops, NBSP) by the pattern; chunks of ASCII letters and digits are
    words as they are (lower-cased when asked)."""
    from collections import Counter

    from lmlab.tokenizers.wordpiece import _count_words

    norm = BertNormalizer(lowercase=lowercase)
    lines = wikitext_valid_lines[:300] + ["Héllo, WÖRLD!中文 x\x7fy", "naïve café-au-lait", "DON'T stop",
                                          "Tab\tbed  two  Spaces ABC123 abc123", "x\x1cy z\x1fw", "a\xa0b c",
                                          "  Lead and trail  ", "ÉCOLE école Ecole"]
    expected: Counter = Counter()
    for line in lines:
        for chunk in norm.chunk_pattern.findall(line):
            expected.update(w for w, _ in norm.split_chunk(chunk))
    counts = _count_words(lines, norm, 1)
    assert counts == dict(expected) and list(counts) == list(expected)

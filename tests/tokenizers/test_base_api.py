"""The common Tokenizer API (base.py), checked against Hugging Face `tokenizers` on the exported file.

Character BPE and byte-level BPE are the vehicles; everything tested here lives in the base
class: templates with segment ids, special tokens written in text, batch padding/truncation,
attention masks, offsets, save/load, id validation.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer as HFTokenizer

from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer, sentinel_tokens, train_tokenizer


@pytest.fixture(scope="module", params=["bytelevel", "bpe"])
def tok(request, shakespeare):
    return train_tokenizer(request.param, [shakespeare[:150_000]], vocab_size=600)


@pytest.fixture(scope="module")
def hf(tok, tmp_path_factory) -> HFTokenizer:
    d = tok.save(tmp_path_factory.mktemp("tok") / "t")
    return HFTokenizer.from_file(str(d / "tokenizer.json"))


PAIRS = [("Who is there?", "Nay, answer me: stand, and unfold yourself."),
         ("Long live the king!", "Bernardo?"),
         ("[CLS] already here", "and a [MASK] inside")]


def test_single_and_pair_templates_match_hf(tok, hf):
    for a, b in PAIRS:
        ours = tok.encode_plus(a, b)
        ref = hf.encode(a, b)
        assert ours.ids == ref.ids
        assert ours.type_ids == ref.type_ids
        if "[" not in a + b:
            assert ours.special_tokens_mask == ref.special_tokens_mask
        else:  # unlike HF, specials written in the text are marked too (so MLM never masks them)
            assert [t for t, m in zip(ours.tokens, ours.special_tokens_mask) if m] == \
                [t for t in ours.tokens if t in tok.special_tokens]
        assert ours.offsets == ref.offsets
        assert ours.tokens == ref.tokens
        single = tok.encode_plus(a)
        assert single.ids == hf.encode(a).ids == tok.encode(a, add_special_tokens=True)
    enc = tok.encode_plus("a", "b")
    assert enc.tokens[0] == "[CLS]" and enc.tokens.count("[SEP]") == 2
    n_a, n_b = len(tok.tokenize("a")), len(tok.tokenize("b"))
    assert enc.type_ids == [0] * (n_a + 2) + [1] * (n_b + 1)


def test_special_tokens_written_in_text(tok):
    ids = tok.encode("hello[SEP]world <s>")
    assert tok.sep_id in ids and tok.bos_id in ids
    assert tok.decode(ids, skip_special_tokens=True).replace(" ", "") == "helloworld"
    enc = tok.encode_plus("x [MASK] y", add_special_tokens=False)
    i = enc.tokens.index("[MASK]")
    assert enc.special_tokens_mask[i] == 1 and enc.offsets[i] == (2, 8)


def test_batch_padding_truncation_and_masks_match_hf(tok, hf):
    texts = [a for a, _ in PAIRS] + ["O"]
    pairs = [b for _, b in PAIRS] + ["me"]
    batch = tok.encode_batch(texts, pairs)
    width = max(len(x) for x in batch["input_ids"])
    hf.enable_padding(pad_id=tok.pad_id, pad_token="[PAD]")
    try:
        ref = hf.encode_batch(list(zip(texts, pairs)))
    finally:
        hf.no_padding()
    assert batch["input_ids"] == [r.ids for r in ref]
    assert batch["attention_mask"] == [r.attention_mask for r in ref]
    assert batch["token_type_ids"] == [r.type_ids for r in ref]
    assert all(len(x) == width for x in batch["attention_mask"])
    short = batch["attention_mask"][-1]
    assert short == [1] * sum(short) + [0] * (width - sum(short))

    batch = tok.encode_batch(texts, pairs, truncation=True, max_length=12, padding="max_length")
    assert all(len(x) == 12 for x in batch["input_ids"])
    for ids, types in zip(batch["input_ids"], batch["token_type_ids"]):
        assert ids.count(tok.sep_id) == 2 and ids[0] == tok.cls_id  # specials survive truncation
        assert 1 in types


def test_longest_first_truncation_matches_hf(tok, hf):
    cases = [("a " * 20, "b b"), ("b b", "a " * 20), ("a " * 9, "b " * 9), ("one", None), ("a " * 30, None)]
    hf.enable_truncation(max_length=10, strategy="longest_first")
    try:
        for a, b in cases:
            enc = tok.encode_plus(a, b, truncation=True, max_length=10)
            ref = hf.encode(a, b)
            assert len(enc) <= 10
            assert enc.ids == ref.ids and enc.type_ids == ref.type_ids and enc.offsets == ref.offsets
    finally:
        hf.no_truncation()
    enc = tok.encode_plus("a " * 20, "b b", truncation=True, max_length=12)
    assert enc.type_ids.count(1) == len(tok.tokenize("b b")) + 1  # short pair kept whole, plus [SEP]


def test_tensors(tok):
    batch = tok(["one", "two three four"], return_tensors="pt")
    assert batch["input_ids"].dtype == torch.long
    assert batch["input_ids"].shape == batch["attention_mask"].shape
    assert int(batch["attention_mask"][0].sum()) < batch["input_ids"].shape[1]
    arr = tok.encode_batch(["one"], return_tensors="np")["input_ids"]
    assert isinstance(arr, np.ndarray) and arr.dtype == np.int64


def test_bad_batch_arguments(tok):
    with pytest.raises(LmlabError, match="list of texts"):
        tok.encode_batch("one string")
    with pytest.raises(LmlabError, match="max_length"):
        tok.encode_batch(["a"], padding="max_length")
    with pytest.raises(LmlabError, match="no room"):
        tok.encode_plus("a", "b", truncation=True, max_length=2)
    with pytest.raises(LmlabError, match="pairs"):
        tok.encode_batch(["a", "b"], ["c"])
    no_pad = train_tokenizer(tok.algo, ["tiny corpus"], vocab_size=300, special_tokens=["<s>", "</s>"])
    with pytest.raises(LmlabError, match="PAD"):
        no_pad.encode_batch(["tiny", "corpus corpus"])
    assert no_pad.encode_plus("tiny", "corpus").tokens[0] == "<s>"  # bos/eos template without cls/sep


def test_decode_rejects_out_of_range_ids(tok):
    for bad in ([tok.vocab_size], [-1]):
        with pytest.raises(LmlabError, match="out of range"):
            tok.decode(bad)
    for bad in ([3.5], [True], "abc"):  # not an id at all: not "out of range"
        with pytest.raises(LmlabError, match="^decode takes token ids"):
            tok.decode(bad)


def test_offsets_point_into_the_text(tok):
    text = "  KING RICHARD III:\tNow is the winter"
    for _, s, e in tok.tokenize_with_offsets(text):
        assert 0 <= s < e <= len(text)
        assert not text[s:e].isspace() or tok.algo == "bytelevel"


def test_added_special_tokens_survive_save_and_load(tok, tmp_path):
    size = 300 if tok.algo == "bytelevel" else 30
    t = train_tokenizer(tok.algo, ["to be or not to be"] * 3, vocab_size=size)
    ids = t.add_special_tokens(sentinel_tokens(2) + ["<summarize>"])
    assert ids == list(range(t.vocab_size - 3, t.vocab_size))
    d = t.save(tmp_path / "tok")
    again = load_tokenizer(d)
    assert again.vocab == t.vocab and again.special_tokens == t.special_tokens and again.roles == t.roles
    text = "<summarize> to be <extra_id_0> not <extra_id_1>"
    assert again.encode(text) == t.encode(text)
    hf_again = HFTokenizer.from_file(str(d / "tokenizer.json"))
    assert again.encode_plus(text, "or").ids == hf_again.encode(text, "or").ids
    assert again.decode(again.encode(text)).replace(" ", "") == text.replace(" ", "")


def test_encode_many_on_two_processes_equals_encode(shakespeare):
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", [shakespeare[:100_000]], vocab_size=400)
    lines = [line for line in shakespeare.splitlines() if line.strip()][:3000]
    assert tok.encode_many(lines, workers=2, chunk_size=500) == [tok.encode(line) for line in lines]
    # ten lines fit in one chunk, so encode_many stays in-process
    assert tok.encode_many(lines[:10], workers=2) == [tok.encode(line) for line in lines[:10]]


@pytest.mark.parametrize("algo", ["bpe", "bytelevel", "wordpiece", "unigram"])
def test_roles_and_specials_survive_save_and_load(algo, shakespeare, tmp_path):
    from lmlab.tokenizers import load_tokenizer, sentinel_tokens, train_tokenizer

    tok = train_tokenizer(algo, [shakespeare[:20_000]], vocab_size=300)
    tok.add_special_tokens(sentinel_tokens(3))
    tok.save(tmp_path / "t")
    for path in (tmp_path / "t", tmp_path / "t" / "tokenizer.json"):
        back = load_tokenizer(path)
        assert back.roles == tok.roles and back.special_tokens == tok.special_tokens
        assert back.encode("<extra_id_1> To be [MASK]") == tok.encode("<extra_id_1> To be [MASK]")


@pytest.mark.parametrize("algo", ["bpe", "bytelevel", "unigram", "wordpiece"])
def test_roles_in_transformers_dict_form_are_read(algo, shakespeare, tmp_path):
    """transformers may write roles as {"content": "[CLS]", ...}; every loader reads that form."""
    import json

    from lmlab.tokenizers import load_tokenizer, train_tokenizer

    train_tokenizer(algo, [shakespeare[:20_000]], vocab_size=300).save(tmp_path / "t")
    cfg_path = tmp_path / "t" / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    # roles that are not the conventional [CLS]/[SEP]: only the config can say so
    cfg["cls_token"] = {"content": "<s>", "lstrip": False}
    cfg["sep_token"] = {"content": "</s>", "lstrip": False}
    cfg_path.write_text(json.dumps(cfg))
    tok = load_tokenizer(tmp_path / "t")
    assert tok.roles["cls"] == "<s>" and tok.roles["sep"] == "</s>"
    assert tok.encode_plus("To be").tokens[0] == "<s>"

"""BART noise functions, each alone, then the objective on packed real text and a training run."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.bart import (
    BartDenoising,
    document_rotation,
    infill_spans,
    sentence_end_table,
    sentence_permutation,
    text_infilling,
    token_deletion,
    token_masking,
)

M = 4  # [MASK] id of the default special tokens


def gen(seed=0):
    return torch.Generator().manual_seed(seed)


def test_registered():
    assert get_objective("bart") is BartDenoising


def test_token_masking():
    tokens = torch.arange(10, 20010)
    protected = tokens % 100 == 0
    out = token_masking(tokens, 0.3, M, protected, gen())
    assert out.shape == tokens.shape
    hit = out == M
    assert abs(hit.float().mean().item() - 0.3 * 0.99) < 4 * math.sqrt(0.21 / 20000)
    assert not bool(hit[protected].any())
    assert torch.equal(out[~hit], tokens[~hit])


def test_token_deletion():
    tokens = torch.arange(10, 20010)
    protected = tokens % 100 == 0
    out = token_deletion(tokens, 0.2, protected, gen())
    kept = set(out.tolist())
    assert abs(1 - len(out) / 20000 - 0.2 * 0.99) < 0.02
    assert all(int(t) in kept for t in tokens[protected])
    assert out.tolist() == sorted(out.tolist())  # order of survivors kept


def test_infill_spans_one_mask_per_span_and_insertions():
    a = torch.tensor([10, 11, 12, 13, 14, 15])  # A B C D E F
    assert infill_spans(a, [(1, 2), (4, 0)], M).tolist() == [10, M, 13, M, 14, 15]
    assert infill_spans(a, [(0, 6)], M).tolist() == [M]  # a whole document -> one mask
    assert infill_spans(a, [(1, 2), (3, 1)], M).tolist() == [10, M, 14, 15]  # touching spans merge
    assert infill_spans(a, [(6, 0)], M).tolist() == [10, 11, 12, 13, 14, 15, M]  # insert at the end


def test_text_infilling_statistics():
    tokens = torch.arange(10, 10010)
    g = gen(1)
    out = text_infilling(tokens, 0.3, 3.0, M, torch.zeros_like(tokens, dtype=torch.bool), g)
    kept = [t for t in out.tolist() if t != M]
    assert kept == sorted(kept)  # unmasked tokens keep their order
    assert 0.25 < 1 - len(kept) / 10000 <= 0.3  # about 30% removed (overlapping spans merge)
    n_masks = out.tolist().count(M)
    # spans of mean ~3 tokens: roughly 3000 / 3 masks, far fewer than masked tokens
    assert 500 < n_masks < 1300
    # never two masks in a row (touching spans merge) except via 0-length insertions next to a span
    # protected tokens are never swallowed
    prot = tokens % 7 == 0
    out = text_infilling(tokens, 0.3, 3.0, M, prot, gen(2))
    assert set(tokens[prot].tolist()) <= set(out.tolist())


def test_sentence_permutation_and_table(tok):
    ids = tok.encode("I came. You saw! We left? They stayed.")
    ends = sentence_end_table(tok)[torch.tensor(ids)]
    assert int(ends.sum()) == 4
    tokens = torch.tensor(ids)
    sentences = Counter()
    for s in range(20):
        out = sentence_permutation(tokens, ends, gen(s))
        assert sorted(out.tolist()) == sorted(ids)
        text = tok.decode(out.tolist())
        pieces = text.replace(".", ".|").replace("!", "!|").replace("?", "?|").split("|")
        assert {p.strip() for p in pieces if p.strip()} == {"I came.", "You saw!", "We left?", "They stayed."}
        sentences[text.split(".")[0]] += 1
    assert len(sentences) > 1  # the order changes


def test_document_rotation():
    tokens = torch.arange(10, 30)
    starts = set()
    for s in range(30):
        out = document_rotation(tokens, gen(s))
        k = int(out[0]) - 10
        assert torch.equal(out, torch.roll(tokens, -k))
        starts.add(k)
    assert len(starts) > 10


def test_objective_reconstructs_original_and_keeps_documents(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=6, seq_len=128, start=40)
    obj = BartDenoising(tok, noise=["document_rotation"])
    inputs = obj.prepare(batch, gen(0))
    assert torch.equal(inputs["labels"], batch.input_ids)  # the decoder reconstructs the original
    assert inputs["input_ids"].shape == (6, 128)
    for b in range(6):
        # rotation stays inside each document: each segment is a rotation of itself
        docs = batch.doc_ids[b]
        for d in docs.unique().tolist():
            seg = batch.input_ids[b][docs == d]
            got = inputs["input_ids"][b][docs == d]
            assert any(torch.equal(got, torch.roll(seg, -k)) for k in range(len(seg)))


def test_default_noise_is_infilling_plus_permutation(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=6, seq_len=128, start=40)
    obj = BartDenoising(tok)
    assert obj.noise == ["sentence_permutation", "text_infilling"]
    inputs = obj.prepare(batch, gen(0))
    lengths = inputs["attention_mask"].sum(1)
    assert bool((lengths < 128 * 0.85).all()) and bool((lengths > 128 * 0.6).all())
    assert int((inputs["input_ids"] == tok.mask_id).sum()) > 6 * 5
    assert bool((inputs["input_ids"][inputs["attention_mask"] == 0] == tok.pad_id).all())


def test_special_tokens_survive_every_noise(tok):
    row = [tok.cls_id] + list(range(20, 60)) + [tok.sep_id]
    ids = torch.tensor([row] * 10)
    batch = TokenBatch(ids, torch.zeros_like(ids), torch.arange(len(row)).expand(10, -1))
    obj = BartDenoising(tok, noise=["token_masking", "token_deletion", "text_infilling"], mask_ratio=0.5,
                        delete_ratio=0.5)
    out = obj.prepare(batch, gen(3))["input_ids"]
    for r in out.tolist():
        assert r.count(tok.cls_id) == 1 and r.count(tok.sep_id) == 1


def test_bad_options(tok):
    with pytest.raises(LmlabError, match="noise"):
        BartDenoising(tok, noise=["shuffle_words"])
    with pytest.raises(LmlabError):
        BartDenoising(tok, mask_ratio=2)


def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    torch.manual_seed(0)
    model = build_model(get_preset("bart-tiny", vocab_size=tok.vocab_size, pad_token_id=tok.pad_id,
                                   bos_token_id=tok.bos_id, eos_token_id=tok.eos_id,
                                   decoder_start_token_id=tok.eos_id))
    obj = BartDenoising(tok)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.3, (before, after)

"""Next-sentence prediction: pair layout, segment ids, label balance, real vs random B, training."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.nsp import IS_NEXT, NextSentencePrediction


def find(hay: torch.Tensor, needle: torch.Tensor) -> list[tuple[int, int]]:
    """(row, start) of every occurrence of ``needle`` in the rows of ``hay``."""
    out = []
    n = len(needle)
    for r in range(hay.shape[0]):
        for s in range(hay.shape[1] - n + 1):
            if torch.equal(hay[r, s:s + n], needle):
                out.append((r, s))
    return out


def test_registered():
    assert get_objective("nsp") is NextSentencePrediction
    assert NextSentencePrediction.heads == ("mlm", "nsp")


def test_pair_layout_segments_and_sources(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=16, seq_len=64, start=100)
    obj = NextSentencePrediction(tok, mlm=False)
    inputs = obj.prepare(batch, torch.Generator().manual_seed(0))
    ids, types, labels = inputs["input_ids"], inputs["token_type_ids"], inputs["nsp_labels"]
    assert ids.shape == types.shape == (16, 64) and labels.shape == (16,)
    assert "labels" not in inputs  # mlm=False: NSP only
    for b in range(16):
        sep = (ids[b] == tok.sep_id).nonzero().flatten().tolist()
        assert ids[b, 0] == tok.cls_id and len(sep) == 2 and sep[1] == 63
        k = sep[0] - 1  # length of A
        # segment ids: 0 for [CLS] A [SEP], 1 for B [SEP]
        assert types[b].tolist() == [0] * (k + 2) + [1] * (63 - k - 1)
        # A is the start of the row; B is its real continuation exactly when labelled IsNext
        assert torch.equal(ids[b, 1:k + 1], batch.input_ids[b, :k])
        seg_b = ids[b, k + 2:63]
        if labels[b] == IS_NEXT:
            assert torch.equal(seg_b, batch.input_ids[b, k:61])
        else:
            others = [r for r, _ in find(batch.input_ids, seg_b)]
            assert others and b not in others
        # A ends at a paragraph boundary when one lies in the middle half of the row
        middle = (batch.doc_ids[b, 15:46] != batch.doc_ids[b, 14:45]).any()
        if middle:
            assert batch.doc_ids[b, k] != batch.doc_ids[b, k - 1]


def test_label_balance(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=2000, seq_len=16)
    nsp_only = NextSentencePrediction(tok, mlm=False)
    labels = nsp_only.prepare(batch, torch.Generator().manual_seed(1))["nsp_labels"]
    frac = labels.float().mean().item()
    assert abs(frac - 0.5) < 4 * math.sqrt(0.25 / 2000)
    skewed_obj = NextSentencePrediction(tok, next_prob=0.8, mlm=False)
    skewed = skewed_obj.prepare(batch, torch.Generator())["nsp_labels"]
    assert abs(skewed.float().mean().item() - 0.2) < 4 * math.sqrt(0.16 / 2000)


def test_mlm_never_masks_cls_or_sep(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=200, seq_len=64)
    inputs = NextSentencePrediction(tok).prepare(batch, torch.Generator().manual_seed(2))
    ids, labels = inputs["input_ids"], inputs["labels"]
    assert (ids[:, 0] == tok.cls_id).all() and (ids[:, -1] == tok.sep_id).all()
    assert int(((ids == tok.sep_id).sum(1) == 2).sum()) == 200
    assert (labels[:, 0] == -100).all() and (labels[:, -1] == -100).all()
    sel = labels != -100
    assert abs(sel.float().mean().item() * 64 / 61 - 0.15) < 0.01


def test_needs_two_rows(tok):
    one = TokenBatch(torch.arange(10, 42)[None], torch.zeros(1, 32, dtype=torch.long), torch.arange(32)[None])
    with pytest.raises(LmlabError, match="batch_size"):
        NextSentencePrediction(tok).prepare(one, torch.Generator())


def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size, max_positions=128),
                        heads=NextSentencePrediction.heads)
    obj = NextSentencePrediction(tok)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.3, (before, after)

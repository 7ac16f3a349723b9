"""UniLM: the three masks on a hand-checked example, proportions, segment ids, training."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.unilm import (
    SEQ2SEQ,
    UniLM,
    bidirectional_mask,
    left_to_right_mask,
    right_to_left_mask,
    seq2seq_mask,
)


def example() -> TokenBatch:
    # two documents: s1 s2 t1 t2 | x y
    ids = torch.arange(10, 16)[None]
    return TokenBatch(ids, torch.tensor([[0, 0, 0, 0, 1, 1]]), torch.tensor([[0, 1, 2, 3, 0, 1]]))


def test_registered():
    assert get_objective("unilm") is UniLM


def test_the_three_masks():
    batch = example()
    assert bidirectional_mask(batch)[0].int().tolist() == [[1, 1, 1, 1, 0, 0]] * 4 + [[0, 0, 0, 0, 1, 1]] * 2
    assert left_to_right_mask(batch)[0].int().tolist() == [[1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0],
                                                           [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                                                           [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]]
    assert right_to_left_mask(batch)[0].int().tolist() == [[1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 0, 0],
                                                           [0, 0, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0],
                                                           [0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1]]
    source = torch.tensor([[2, 2, 2, 2, 1, 1]])  # first document: source s1 s2; second: x
    assert seq2seq_mask(batch, source)[0].int().tolist() == [[1, 1, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0],
                                                             [1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 0, 0],
                                                             [0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 1, 1]]


def test_rows_use_the_unilm_proportions_and_their_own_masks(tok):
    rows, t = 1200, 12
    ids = torch.randint(10, 900, (rows, t), generator=torch.Generator().manual_seed(0))
    batch = TokenBatch(ids, torch.zeros_like(ids), torch.arange(t).expand(rows, t).clone())
    obj = UniLM(tok)
    inputs = obj.prepare(batch, torch.Generator().manual_seed(1))
    modes, pattern, types = inputs["modes"], inputs["attention_pattern"], inputs["token_type_ids"]
    counts = torch.bincount(modes, minlength=4).float() / rows
    for c, p in zip(counts.tolist(), [1 / 3, 1 / 6, 1 / 6, 1 / 3]):
        assert abs(c - p) < 4 * math.sqrt(p * (1 - p) / rows)
    full = torch.ones(t, t, dtype=torch.bool)
    for b in range(0, rows, 37):
        m = int(modes[b])
        if m == 0:
            assert torch.equal(pattern[b], full)
        elif m == 1:
            assert torch.equal(pattern[b], full.tril())
        elif m == 2:
            assert torch.equal(pattern[b], full.triu())
        else:
            s = int((types[b] == 0).sum())  # source length from the segment ids
            assert 1 <= s <= t - 1 and types[b, s:].eq(1).all()
            expected = full.tril()
            expected[:, :s] = True
            expected[:s, s:] = False
            assert torch.equal(pattern[b], expected)
        if m != SEQ2SEQ:
            assert bool((types[b] == 0).all())
    # masked-LM labels in every mode
    assert abs((inputs["labels"] != -100).float().mean().item() - 0.15) < 0.01


def test_only_bidirectional_is_plain_mlm(tok):
    batch = example()
    inputs = UniLM(tok, unidirectional=0, seq2seq=0).prepare(batch, torch.Generator())
    assert torch.equal(inputs["attention_pattern"], bidirectional_mask(batch))
    with pytest.raises(LmlabError):
        UniLM(tok, bidirectional=0, unidirectional=0, seq2seq=0)


def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size, max_positions=128))
    obj = UniLM(tok)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.3, (before, after)

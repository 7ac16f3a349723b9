"""SpanBERT: 15% budget in whole-word spans, geometric lengths, span-level 80/10/10, SBO."""

from __future__ import annotations

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import get_objective
from lmlab.objectives.masking import word_boundary_tables, word_ids
from lmlab.objectives.spans import SpanBERT, span_boundaries


def runs(mask_row: list[bool]) -> list[tuple[int, int]]:
    out, start = [], None
    for i, m in enumerate(mask_row + [False]):
        if m and start is None:
            start = i
        if not m and start is not None:
            out.append((start, i))
            start = None
    return out


@pytest.fixture(scope="module")
def sampled(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=64, seq_len=256, start=300)
    obj = SpanBERT(tok)
    spans = obj.sample_spans(batch.input_ids, batch.doc_ids, torch.Generator().manual_seed(0))
    return obj, batch, spans


def test_registered():
    assert get_objective("spanbert") is SpanBERT


def test_budget_whole_words_and_documents(tok, sampled):
    obj, batch, spans = sampled
    selected = spans >= 0
    rate = selected.float().mean().item()
    assert abs(rate - 0.15) < 0.01, rate  # masked budget ~15%
    per_row = selected.float().mean(1)
    assert per_row.min() > 0.12 and per_row.max() < 0.22
    words = word_ids(batch.input_ids, batch.doc_ids, *word_boundary_tables(tok))
    n_words_per_span = []
    for b in range(64):
        for s in spans[b].unique().tolist():
            if s < 0:
                continue
            pos = (spans[b] == s).nonzero().flatten()
            lo, hi = int(pos.min()), int(pos.max()) + 1
            assert len(pos) == hi - lo  # contiguous
            assert batch.doc_ids[b, lo] == batch.doc_ids[b, hi - 1]  # inside one document
            # whole words: the tokens just outside belong to other words
            assert lo == 0 or words[b, lo - 1] != words[b, lo]
            assert hi == 256 or words[b, hi] != words[b, hi - 1]
            n_words_per_span.append(len(words[b, lo:hi].unique()))
    n = torch.tensor(n_words_per_span, dtype=torch.float)
    assert n.max() <= 10 and n.min() >= 1
    # Geo(0.2) clipped at 10 has mean 3.57 words; the budget cuts some spans short
    assert 2.5 < n.mean().item() < 4.0, n.mean()


def test_span_level_replacement(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=64, seq_len=256, start=300)
    inputs = SpanBERT(tok, sbo=False).prepare(batch, torch.Generator().manual_seed(3))
    x, labels = inputs["input_ids"], inputs["labels"]
    masked_spans = kept_spans = other = 0
    for b in range(64):
        for lo, hi in runs((labels[b] != -100).tolist()):
            m = x[b, lo:hi] == tok.mask_id
            # adjacent spans may touch, so a run may hold two spans; each span is all-or-nothing
            if bool(m.all()):
                masked_spans += 1
            elif torch.equal(x[b, lo:hi], batch.input_ids[b, lo:hi]):
                kept_spans += 1
            else:
                other += 1
    total = masked_spans + kept_spans + other
    assert 0.72 < masked_spans / total < 0.88
    assert kept_spans / total < 0.2
    assert "sbo_left" not in inputs


def test_span_boundaries_example():
    # row: positions 0..9, one span at 2..4 and one at 8..9 (end of row), doc change at 6
    spans = torch.tensor([[-1, -1, 0, 0, 0, -1, -1, -1, 1, 1]])
    docs = torch.tensor([[0, 0, 0, 0, 0, 0, 1, 1, 1, 1]])
    out = span_boundaries(spans, docs)
    assert out["sbo_left"][0].tolist() == [0, 0, 1, 1, 1, 0, 0, 0, 7, 7]
    assert out["sbo_right"][0].tolist() == [0, 0, 5, 5, 5, 0, 0, 0, 9, 9]  # row end: own edge
    assert out["sbo_position"][0].tolist() == [0, 0, 0, 1, 2, 0, 0, 0, 0, 1]
    # a span starting a document does not look into the previous one
    out = span_boundaries(torch.tensor([[-1, -1, 0, 0, -1]]), torch.tensor([[0, 0, 1, 1, 1]]))
    assert out["sbo_left"][0, 2:4].tolist() == [2, 2]


def test_sbo_needs_setup_and_adds_a_loss(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=4, seq_len=64)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size, max_positions=64))
    obj = SpanBERT(tok)
    inputs = obj.prepare(batch, torch.Generator().manual_seed(0))
    with pytest.raises(LmlabError, match="setup"):
        obj.loss(model, inputs)
    obj.setup(model)
    assert sum(p.numel() for p in obj.parameters()) > 0  # the SBO head is the objective's
    loss, metrics = obj.loss(model, inputs)
    assert loss.item() == pytest.approx(float(metrics["mlm_loss"] + metrics["sbo_loss"]), rel=1e-5)
    loss.backward()
    assert obj.sbo.fc1.weight.grad is not None and obj.sbo.fc1.weight.grad.abs().sum() > 0


def test_bad_options(tok):
    with pytest.raises(LmlabError):
        SpanBERT(tok, geometric_p=0)
    with pytest.raises(LmlabError):
        SpanBERT(tok, max_span_words=0)


def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size, max_positions=128))
    obj = SpanBERT(tok)
    obj.setup(model)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.5, (before, after)

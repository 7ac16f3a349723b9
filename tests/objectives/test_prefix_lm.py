"""Prefix LM: the mask (vs models.blocks.prefix_lm_mask), per-document splits, labels, training."""

from __future__ import annotations

import torch

from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import prefix_lm_mask
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.prefix_lm import PrefixLM, sample_prefix_lengths
from tests.objectives.conftest import model_mask


def prefix_pattern(batch: TokenBatch, prefix_len: torch.Tensor) -> torch.Tensor:
    """The prefix-LM pattern written out: same document and (causal or key in its document's
    prefix), ``[B, T, T]``; the reference the model-built mask is held to."""
    t = batch.input_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool).tril()
    in_prefix = batch.position_ids < prefix_len  # [B, T] per key
    return batch.same_document() & (causal[None] | in_prefix[:, None, :])

def one_doc_batch(rows: int, t: int) -> TokenBatch:
    ids = torch.arange(10, 10 + rows * t).view(rows, t) % 900 + 10
    return TokenBatch(ids, torch.zeros_like(ids), torch.arange(t).expand(rows, t).clone())


def test_registered():
    assert get_objective("prefix_lm") is PrefixLM
    assert PrefixLM.architectures == ("decoder",)


def test_worked_example_mask():
    batch = one_doc_batch(1, 5)
    pattern = prefix_pattern(batch, torch.full((1, 5), 2))
    assert pattern[0].int().tolist() == [[1, 1, 0, 0, 0],
                                         [1, 1, 0, 0, 0],
                                         [1, 1, 1, 0, 0],
                                         [1, 1, 1, 1, 0],
                                         [1, 1, 1, 1, 1]]


def test_matches_blocks_prefix_lm_mask_for_single_documents(tok):
    batch = one_doc_batch(16, 24)
    inputs = PrefixLM(tok).prepare(batch, torch.Generator().manual_seed(0))
    pattern, labels = model_mask(inputs, causal=True), inputs["labels"]
    assert pattern.shape == (16, 24, 24) and pattern.dtype == torch.bool
    prefix = (labels == -100).sum(1)  # labels are -100 exactly on the prefix
    assert bool((prefix >= 1).all()) and bool((prefix <= 23).all())
    assert len(prefix.unique()) > 5  # a random split per row
    assert torch.equal(pattern, prefix_lm_mask(24, prefix)[:, 0])
    for b in range(16):
        p = int(prefix[b])
        assert labels[b, :p].eq(-100).all() and torch.equal(labels[b, p:], batch.input_ids[b, p:])


def test_packed_documents_get_their_own_prefix_and_never_mix(tok):
    ids = torch.arange(10, 22)[None]
    docs = torch.tensor([[0, 0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2]])
    pos = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 3, 4, 0, 1, 2]])
    batch = TokenBatch(ids, docs, pos)
    g = torch.Generator().manual_seed(3)
    prefix = sample_prefix_lengths(batch, g)
    for d, n in ((0, 4), (1, 5), (2, 3)):
        p = prefix[0][docs[0] == d]
        assert len(p.unique()) == 1 and 1 <= int(p[0]) <= n - 1
    pattern = prefix_pattern(batch, prefix)[0]
    inputs = PrefixLM(tok).prepare(batch, torch.Generator().manual_seed(3))
    assert torch.equal(model_mask(inputs, causal=True)[0], pattern)  # the decoder builds the same mask
    same = docs[0][:, None] == docs[0][None, :]
    assert not bool((pattern & ~same).any())  # nothing crosses a document
    # a document's first token is never a target (it would be predicted from the previous document)
    labels = PrefixLM(tok).prepare(batch, torch.Generator().manual_seed(3))["labels"]
    assert bool((labels[pos == 0] == -100).all())


def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, max_positions=128))
    obj = PrefixLM(tok)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.5, (before, after)

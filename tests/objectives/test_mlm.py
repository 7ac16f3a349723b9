"""Masked LM: statistical tests of the masking on 100k real tokens, static vs dynamic, whole words,
and a short training run that lowers validation loss on WikiText-2."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.base import encoder_hidden, masked_lm
from lmlab.objectives.masking import word_boundary_tables, word_ids
from lmlab.objectives.mlm import MaskedLM
from tests.objectives.conftest import model_mask

SIGMAS = 4


def within(observed: float, p: float, n: int) -> bool:
    """|observed - p| within SIGMAS binomial standard deviations."""
    return abs(observed - p) <= SIGMAS * math.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def big_batch(tok, book_paragraphs) -> TokenBatch:
    """~100k real tokens, each paragraph wrapped in [CLS] ... [SEP] so special tokens are present."""
    stream = []
    for p in book_paragraphs:
        stream += tok.encode(p, add_special_tokens=True)
        if len(stream) >= 100_000:
            break
    ids = torch.tensor(stream[:100_000]).view(100, 1000)
    return TokenBatch(ids, torch.zeros_like(ids), torch.arange(1000).expand(100, -1).clone())


def test_registered():
    assert get_objective("mlm") is MaskedLM


def test_proportions_on_100k_tokens(tok, big_batch):
    obj = MaskedLM(tok)
    ids = big_batch.input_ids
    inputs = obj.prepare(big_batch, torch.Generator().manual_seed(0))
    x, labels = inputs["input_ids"], inputs["labels"]
    special = torch.isin(ids, torch.tensor(sorted(tok.special_ids)))
    selected = labels != -100
    n_cand, n_sel = int((~special).sum()), int(selected.sum())
    assert int(special.sum()) > 1000
    # 15% of the non-special tokens, never a special token, labels = the original ids
    assert within(n_sel / n_cand, 0.15, n_cand)
    assert not bool((selected & special).any())
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(x[~selected], ids[~selected])  # nothing else changes
    # of the selected: 80% [MASK], 10% random, 10% unchanged (a random draw may hit the original)
    masked = (x == tok.mask_id) & selected
    changed = (x != ids) & selected & ~masked
    unchanged = (x == ids) & selected
    pool = tok.vocab_size - len(tok.special_ids)
    assert within(int(masked.sum()) / n_sel, 0.8, n_sel)
    assert within(int(changed.sum()) / n_sel, 0.1 * (1 - 1 / pool), n_sel)
    assert within(int(unchanged.sum()) / n_sel, 0.1 * (1 + 1 / pool), n_sel)
    # random replacements are real tokens, never special ones
    assert not bool(torch.isin(x[changed], torch.tensor(sorted(tok.special_ids))).any())
    # and they are spread over the vocabulary, not one token
    assert len(set(x[changed].tolist())) > 300


def test_static_mask_is_stable_across_epochs_dynamic_is_not(tok, big_batch):
    rows = TokenBatch(big_batch.input_ids[:20], big_batch.doc_ids[:20], big_batch.position_ids[:20])
    static = MaskedLM(tok, masking="static", seed=7)
    epoch1 = static.prepare(rows, torch.Generator().manual_seed(1))
    epoch2 = static.prepare(rows, torch.Generator().manual_seed(2))
    assert torch.equal(epoch1["input_ids"], epoch2["input_ids"])
    assert torch.equal(epoch1["labels"], epoch2["labels"])
    # the mask belongs to the example, not to its place in the batch
    perm = torch.randperm(20, generator=torch.Generator().manual_seed(0))
    shuffled = TokenBatch(rows.input_ids[perm], rows.doc_ids[perm], rows.position_ids[perm])
    assert torch.equal(static.prepare(shuffled, torch.Generator())["labels"], epoch1["labels"][perm])
    # another seed gives another (fixed) mask
    other = MaskedLM(tok, masking="static", seed=8).prepare(rows, torch.Generator())
    assert not torch.equal(other["labels"], epoch1["labels"])
    # dynamic: a new mask each time; overlap of two masks ~ 0.15 (independent), not 1
    dynamic = MaskedLM(tok, masking="dynamic")
    a = dynamic.prepare(rows, torch.Generator().manual_seed(1))["labels"] != -100
    b = dynamic.prepare(rows, torch.Generator().manual_seed(2))["labels"] != -100
    overlap = int((a & b).sum()) / int(a.sum())
    assert overlap < 0.25
    # static masking still has the right rate
    sel = epoch1["labels"] != -100
    cand = ~torch.isin(rows.input_ids, torch.tensor(sorted(tok.special_ids)))
    assert within(int(sel.sum()) / int(cand.sum()), 0.15, int(cand.sum()))


@pytest.mark.parametrize("algo", ["bytelevel", "wordpiece", "unigram"])
def test_whole_word_masking(tokenizers, book_paragraphs, packer, algo):
    tok = tokenizers[algo]
    batch = packer(tok, book_paragraphs, rows=40, seq_len=500, start=200)
    inputs = MaskedLM(tok, whole_word=True).prepare(batch, torch.Generator().manual_seed(0))
    selected = inputs["labels"] != -100
    words = word_ids(batch.input_ids, batch.doc_ids, *word_boundary_tables(tok))
    # every word is entirely selected or not at all
    n_words = int(words.max()) + 1
    for b in range(0, 40, 7):
        per_word_sel = torch.zeros(n_words).index_add_(0, words[b], selected[b].float())
        per_word_len = torch.zeros(n_words).index_add_(0, words[b], torch.ones(500))
        used = per_word_len > 0
        assert bool(((per_word_sel[used] == 0) | (per_word_sel[used] == per_word_len[used])).all())
    rate = int(selected.sum()) / selected.numel()
    assert abs(rate - 0.15) < 0.01, rate  # 20k tokens, words of ~1.5 tokens
    assert int((selected.sum(1) > 0).sum()) == 40
    # multi-token words are masked as a whole: some selected runs are longer than one token
    assert int((selected[:, 1:] & selected[:, :-1] & (words[:, 1:] == words[:, :-1])).sum()) > 50


def test_packed_documents_do_not_see_each_other(tok, book_paragraphs, packer):
    batch = packer(tok, book_paragraphs, rows=4, seq_len=256)
    inputs = MaskedLM(tok).prepare(batch, torch.Generator().manual_seed(0))
    pattern = model_mask(inputs, causal=False)  # what the encoder builds from inputs["doc_ids"]
    assert pattern.shape == (4, 256, 256)
    assert torch.equal(pattern, batch.doc_ids[:, :, None] == batch.doc_ids[:, None, :])
    assert torch.equal(inputs["position_ids"], batch.position_ids)
    # one document per row: no pattern needed (the fast path)
    single = TokenBatch(batch.input_ids, torch.zeros_like(batch.doc_ids), batch.position_ids)
    assert "doc_ids" not in MaskedLM(tok).prepare(single, torch.Generator())


@pytest.mark.parametrize("bad", [{"mask_prob": 0}, {"mask_prob": 1.5}, {"masking": "sometimes"},
                                 {"mask_token_prob": 0.95, "random_token_prob": 0.1}])
def test_bad_options(tok, bad):
    with pytest.raises(LmlabError):
        MaskedLM(tok, **bad)


def test_needs_a_mask_token(book_paragraphs):
    from lmlab.tokenizers import train_tokenizer

    plain = train_tokenizer("bytelevel", book_paragraphs[:50], vocab_size=300,
                            special_tokens=["<|endoftext|>"])
    with pytest.raises(LmlabError, match=r"\[MASK\]"):
        MaskedLM(plain)


@pytest.mark.parametrize("options", [{}, {"whole_word": True, "masking": "static"}])
def test_trains_and_lowers_validation_loss(tok, book_paragraphs, wiki_paragraphs, packer, trainer, options):
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size, max_positions=128))
    obj = MaskedLM(tok, **options)
    train = [packer(tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.3, (before, after)


def test_label_positions_gather_exactly_what_the_mask_selects(tok, book_paragraphs, packer):
    """The head given the host-made ``label_positions`` (gathered rows) computes what it computes
    from the labels alone (rows selected by mask on the device): same logits, loss, gradients."""
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size, max_positions=128))
    inputs = MaskedLM(tok).prepare(packer(tok, book_paragraphs, rows=4, seq_len=64),
                                   torch.Generator().manual_seed(3))
    positions = inputs["label_positions"]
    flat = inputs["labels"].reshape(-1)
    assert positions.tolist() == [i for i, y in enumerate(flat.tolist()) if y != -100]
    outputs, grads = [], []
    for given in (inputs, {k: v for k, v in inputs.items() if k != "label_positions"}):
        model.zero_grad()
        torch.manual_seed(1)  # the same dropout
        logits, loss = masked_lm(model, encoder_hidden(model, given), given)  # the MLM objective's way
        loss.backward()
        outputs.append((logits, loss))
        grads.append(model.heads["mlm"].dense.weight.grad.clone())
    assert outputs[0][0].shape == (len(positions), model.config.vocab_size)
    assert torch.equal(outputs[0][0], outputs[1][0])
    assert torch.equal(outputs[0][1], outputs[1][1])
    assert torch.equal(grads[0], grads[1])

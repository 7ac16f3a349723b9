"""T5 span corruption: the SPEC golden case, T5's span statistics, variants, packing, training."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.t5 import SpanCorruption, corrupt_spans, drop_spans, random_spans, split_point


@pytest.fixture()
def t5tok(tok):
    return copy.deepcopy(tok)  # the objective adds sentinels: keep the shared tokenizer as it is


def test_registered():
    assert get_objective("t5") is SpanCorruption


def test_golden_case():
    words = "Thank you for inviting me to your party last week .".split()
    inputs, targets = corrupt_spans(words, [(2, 4), (8, 9)], ["<X>", "<Y>", "<Z>"])
    assert inputs == "Thank you <X> me to your party <Y> week .".split()
    assert targets == "<X> for inviting <Y> last <Z>".split()
    # the "drop corrupted tokens" variant of the same example (Raffel et al. Table 3)
    assert drop_spans(words, [(2, 4), (8, 9)]) == ("Thank you me to your party week .".split(),
                                                   "for inviting last".split())


@pytest.mark.parametrize("spans", [[(2, 1)], [(0, 3), (2, 5)], [(8, 12)]])
def test_corrupt_spans_rejects_bad_spans(spans):
    with pytest.raises(LmlabError):
        corrupt_spans(list("abcdefghij"), spans, ["<X>", "<Y>", "<Z>"])


def test_corrupt_spans_needs_enough_sentinels():
    with pytest.raises(LmlabError, match="sentinel"):
        corrupt_spans(list("abcdefghij"), [(1, 2), (4, 5)], ["<X>", "<Y>"])


def test_random_spans_follow_t5():
    g = torch.Generator().manual_seed(0)
    lengths, counts = [], []
    for length in (20, 57, 100, 512):
        for _ in range(50):
            spans = random_spans(length, 0.15, 3.0, g)
            noise = sum(e - s for s, e in spans)
            assert noise == round(length * 0.15)
            assert len(spans) == max(1, round(noise / 3))
            assert spans[0][0] > 0  # T5 starts with a non-noise segment
            assert all(s < e for s, e in spans)
            assert all(a[1] < b[0] for a, b in zip(spans, spans[1:]))  # separated by kept tokens
            assert spans[-1][1] <= length
            lengths += [e - s for s, e in spans]
            counts.append(len(spans))
    assert abs(sum(lengths) / len(lengths) - 3.0) < 0.3
    assert random_spans(1, 0.15, 3.0, g) == []
    assert random_spans(2, 0.15, 3.0, g) == [(1, 2)]


def test_prepare_spans_on_packed_rows(t5tok, book_paragraphs, packer):
    batch = packer(t5tok, book_paragraphs, rows=8, seq_len=128, start=10)
    obj = SpanCorruption(t5tok)
    assert "<extra_id_0>" in t5tok.token_to_id and t5tok.token_to_id["<extra_id_99>"] == t5tok.vocab_size - 1
    assert t5tok.token_to_id["<extra_id_0>"] in t5tok.special_ids
    inputs = obj.prepare(batch, torch.Generator().manual_seed(0))
    sentinels = set(obj.sentinel_ids)
    for b in range(8):
        n_in = int(inputs["attention_mask"][b].sum())
        src = inputs["input_ids"][b, :n_in].tolist()
        tgt = [t for t in inputs["labels"][b].tolist() if t != -100]
        assert src[-1] == t5tok.eos_id and tgt[-1] == t5tok.eos_id
        assert all(t == t5tok.pad_id for t in inputs["input_ids"][b, n_in:].tolist())
        # rebuild the original row from inputs + targets
        pieces, current = {}, None
        for t in tgt[:-1]:
            if t in sentinels:
                current = t
                pieces[current] = []
            else:
                pieces[current].append(t)
        rebuilt = []
        for t in src[:-1]:
            rebuilt += pieces[t] if t in sentinels else [t]
        assert rebuilt == batch.input_ids[b].tolist()
        # noise density ~15% of the row, spans never cross a document boundary
        noise = sum(len(p) for p in pieces.values())
        assert 0.08 < noise / 128 < 0.2
        used = [t for t in src if t in sentinels]
        assert used == obj.sentinel_ids[:len(used)]
    spans = obj.document_spans(batch.input_ids, batch.doc_ids, torch.Generator().manual_seed(0))
    for b, row in enumerate(spans):
        for s, e in row:
            assert batch.doc_ids[b, s] == batch.doc_ids[b, e - 1]


def test_special_tokens_are_never_corrupted(t5tok):
    ids = torch.tensor([[t5tok.cls_id] + list(range(10, 40)) + [t5tok.sep_id] + list(range(40, 60))] * 20)
    batch = TokenBatch(ids, torch.zeros_like(ids), torch.arange(52).expand(20, -1))
    obj = SpanCorruption(t5tok, noise_density=0.5)
    for row in obj.document_spans(ids, batch.doc_ids, torch.Generator().manual_seed(0)):
        covered = {i for s, e in row for i in range(s, e)}
        assert 0 not in covered and 31 not in covered
        assert len(covered) > 15


def test_variants(t5tok, book_paragraphs, packer):
    batch = packer(t5tok, book_paragraphs, rows=4, seq_len=64)
    drop = SpanCorruption(t5tok, variant="drop").prepare(batch, torch.Generator().manual_seed(0))
    n_src = drop["attention_mask"].sum(1)
    n_tgt = (drop["labels"] != -100).sum(1)
    assert torch.equal(n_src + n_tgt, torch.full((4,), 64 + 2))  # every token once, + 2 eos
    bert = SpanCorruption(t5tok, variant="bert").prepare(batch, torch.Generator().manual_seed(0))
    assert torch.equal(bert["labels"][:, :64], batch.input_ids)  # target = the original text
    changed = bert["input_ids"][:, :64] != batch.input_ids
    assert 0.05 < changed.float().mean() < 0.25
    assert int((bert["input_ids"] == t5tok.mask_id).sum()) > 0
    with pytest.raises(LmlabError, match="variant"):
        SpanCorruption(t5tok, variant="shuffle")


def test_prefix_lm_variant_cuts_each_row_once(t5tok, book_paragraphs, packer):
    batch = packer(t5tok, book_paragraphs, rows=16, seq_len=64)
    out = SpanCorruption(t5tok, variant="prefix_lm").prepare(batch, torch.Generator().manual_seed(0))
    n_src = out["attention_mask"].sum(1)
    n_tgt = (out["labels"] != -100).sum(1)
    assert torch.equal(n_src + n_tgt, torch.full((16,), 64 + 2))  # every token once, + 2 eos
    assert int(n_src.min()) >= 2 and int(n_tgt.min()) >= 2  # both parts non-empty
    assert len(set(n_src.tolist())) > 4  # the cut point varies from row to row
    for i in range(16):
        k = int(n_src[i]) - 1
        assert torch.equal(out["input_ids"][i, :k], batch.input_ids[i, :k])  # prefix kept in order
        assert torch.equal(out["labels"][i, :64 - k], batch.input_ids[i, k:])  # the rest is the target
        assert int(out["labels"][i, 64 - k]) == t5tok.eos_id
    assert [split_point(n, torch.Generator().manual_seed(1)) for n in (0, 1, 2)] == [1, 1, 1]
    cuts = [split_point(10, g) for g in [torch.Generator().manual_seed(0)] for _ in range(400)]
    assert set(cuts) == set(range(1, 10))


def test_trains_and_lowers_validation_loss(t5tok, book_paragraphs, wiki_paragraphs, packer, trainer):
    obj = SpanCorruption(t5tok)  # adds the sentinels before the model is sized
    torch.manual_seed(0)
    model = build_model(get_preset("t5-tiny", vocab_size=t5tok.vocab_size, pad_token_id=t5tok.pad_id,
                                   eos_token_id=t5tok.eos_id, decoder_start_token_id=t5tok.pad_id))
    train = [packer(t5tok, book_paragraphs, 8, 128, start=i * 20) for i in range(10)]
    val = [packer(t5tok, wiki_paragraphs, 16, 128, start=i * 30) for i in range(2)]
    before, after = trainer(obj, model, train, val, steps=30)
    assert after < before - 0.5, (before, after)

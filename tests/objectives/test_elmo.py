"""ELMo bi-LM objective: both directions' targets stay inside documents; it trains on real text."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.elmo import bilm_losses
from lmlab.tokenizers import train_tokenizer


@pytest.fixture(scope="module")
def real(data_dir):
    pre = data_dir / "pretrain"
    books = [
        (pre / "gutenberg" / "pg14263_katrine.txt").read_text(encoding="utf-8")[:120_000],
        (pre / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:120_000],
    ]
    tok = train_tokenizer("bytelevel", books, vocab_size=512)
    val = (pre / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")[:30_000]
    return tok, [torch.tensor(tok.encode(b)) for b in books], torch.tensor(tok.encode(val))


def windows(stream, b, t, g):
    starts = torch.randint(0, len(stream) - t, (b,), generator=g)
    ids = torch.stack([stream[s : s + t] for s in starts.tolist()])
    return TokenBatch(ids, torch.zeros_like(ids), torch.arange(t).expand(b, t).clone())


def test_bilm_losses_never_cross_documents():
    g = torch.Generator().manual_seed(0)
    fwd_logits, bwd_logits = torch.randn(2, 1, 6, 10, generator=g)
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    docs = torch.tensor([[0, 0, 0, 1, 1, 1]])
    fwd, bwd = bilm_losses(fwd_logits, bwd_logits, ids, docs)
    lp_f, lp_b = fwd_logits.log_softmax(-1)[0], bwd_logits.log_softmax(-1)[0]
    # forward: 0->1, 1->2, 3->4, 4->5 (not 2->3: token 3 starts a new document)
    want_f = -sum(lp_f[k, ids[0, k + 1]] for k in (0, 1, 3, 4)) / 4
    # backward: 1->0, 2->1, 4->3, 5->4 (not 3->2)
    want_b = -sum(lp_b[k, ids[0, k - 1]] for k in (1, 2, 4, 5)) / 4
    torch.testing.assert_close(fwd, want_f)
    torch.testing.assert_close(bwd, want_b)


def test_elmo_trains_on_real_text(real):
    tok, streams, val = real
    torch.manual_seed(0)
    model = build_model(get_preset("elmo-tiny", vocab_size=tok.vocab_size, dropout=0.0))
    obj = get_objective("elmo")(tok)
    assert not model.char_table.any()
    g, gv = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    val_batches = [windows(val, 8, 64, gv) for _ in range(2)]

    def val_losses():
        model.eval()
        with torch.no_grad():
            ms = [obj.loss(model, obj.prepare(b, g))[1] for b in val_batches]
        model.train()
        return [sum(m[k] for m in ms) / len(ms) for k in ("forward_loss", "backward_loss")]

    before = val_losses()
    assert model.char_table.any()  # filled from the tokenizer on first use
    assert all(abs(x - math.log(tok.vocab_size)) < 0.3 for x in before)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for step in range(40):
        loss, m = obj.loss(model, obj.prepare(windows(streams[step % 2], 16, 32, g), g))
        torch.testing.assert_close(loss.detach(), (m["forward_loss"] + m["backward_loss"]) / 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = val_losses()
    assert after[0] < before[0] - 0.5 and after[1] < before[1] - 0.5, (before, after)
    # the backward LM really reads right-to-left: its prediction of token k-1 from position k does
    # not depend on tokens before k-1 (a forward-reading model would fail this)
    model.eval()
    ids = val_batches[0].input_ids[:1]
    other = ids.clone()
    other[0, :10] = (other[0, :10] + 1) % tok.vocab_size
    with torch.no_grad():
        a = model(input_ids=ids).extra["backward_logits"]
        b = model(input_ids=other).extra["backward_logits"]
    torch.testing.assert_close(a[0, 10:], b[0, 10:])
    assert (a[0, :10] - b[0, :10]).abs().max() > 1e-4
    ce = F.cross_entropy(a[0, 1:], ids[0, :-1])
    assert ce < before[1]


def test_elmo_objective_rejects_other_models(real):
    tok = real[0]
    obj = get_objective("elmo")(tok)
    batch = obj.prepare(windows(real[1][0], 2, 8, torch.Generator()), torch.Generator())
    with pytest.raises(LmlabError, match="ELMo"):
        obj.loss(build_model(get_preset("lstm-tiny", vocab_size=tok.vocab_size)), batch)
    with pytest.raises(LmlabError, match="no parameters"):
        get_objective("elmo")(tok, window=3)
    small = build_model(get_preset("elmo-tiny", vocab_size=100))
    with pytest.raises(LmlabError, match="vocab_size"):
        obj.loss(small, {"input_ids": torch.zeros(1, 4, dtype=torch.long), "doc_ids": torch.zeros(1, 4)})

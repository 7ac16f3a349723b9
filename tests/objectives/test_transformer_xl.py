"""Transformer-XL: memory is used, carries no gradient, positions stay consistent across segments,
causal inside a segment, and memory lowers loss on real text after a short training."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lmlab.errors import LmlabError
from lmlab.losses import causal_lm_loss
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import MaskSpec
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.transformer_xl import SegmentRecurrentLM
from lmlab.tokenizers import train_tokenizer


@pytest.fixture(scope="module")
def real(data_dir):
    pre = data_dir / "pretrain"
    books = [
        (pre / "gutenberg" / "pg14263_katrine.txt").read_text(encoding="utf-8")[:120_000],
        (pre / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:120_000],
    ]
    tok = train_tokenizer("bytelevel", books, vocab_size=512)
    held_out = (pre / "gutenberg" / "pg14263_katrine.txt").read_text(encoding="utf-8")[150_000:190_000]
    return tok, [torch.tensor(tok.encode(t)) for t in (*books, held_out)]


def windows(stream, b, t, g, start=None):
    starts = torch.randint(0, len(stream) - t, (b,), generator=g) if start is None else start
    ids = torch.stack([stream[s : s + t] for s in starts.tolist()])
    return TokenBatch(ids, torch.zeros_like(ids), torch.arange(t).expand(b, t) + starts[:, None])


def tiny(vocab, mem_len=16):
    torch.manual_seed(0)
    return build_model(get_preset("transfo-xl-tiny", vocab_size=vocab, mem_len=mem_len, dropout=0.0))


def test_memory_is_used_and_positions_stay_consistent():
    model = tiny(100).eval()
    g = torch.Generator().manual_seed(0)
    seg1, seg2 = torch.randint(0, 100, (2, 16), generator=g)
    seg1b = (seg1 + 1) % 100
    with torch.no_grad():
        m1 = model(seg1[None]).extra["mems"]
        m1b = model(seg1b[None]).extra["mems"]
        out = model(seg2[None], mems=m1).logits
        out_b = model(seg2[None], mems=m1b).logits
        # changing segment 1 changes the output on segment 2: the memory is read
        assert (out - out_b).abs().max() > 1e-3
        # masking the memory out makes segment 1 irrelevant again (the check above can fail)
        blind = torch.zeros(1, 16, 32, dtype=torch.bool)
        blind[:, :, 16:] = torch.ones(16, 16).tril().bool()
        torch.testing.assert_close(
            model(seg2[None], mems=m1, mask=MaskSpec(pattern=blind)).logits,
            model(seg2[None], mems=m1b, mask=MaskSpec(pattern=blind)).logits,
        )
        # with a memory as long as the segment, two segments equal one pass over both: relative
        # positions are the same whether a token is in memory or in the segment
        whole = model(torch.cat([seg1, seg2])[None]).logits
        torch.testing.assert_close(out, whole[:, 16:], atol=1e-5, rtol=1e-5)


def test_no_gradient_flows_into_memory():
    model = tiny(100)
    seg1, seg2 = torch.randint(0, 100, (2, 1, 16), generator=torch.Generator().manual_seed(1))
    out1 = model(seg1, output_hidden_states=True)
    assert all(not m.requires_grad and m.grad_fn is None for m in out1.extra["mems"])
    loss2 = causal_lm_loss(model(seg2, mems=out1.extra["mems"]).logits, seg2)
    grads = torch.autograd.grad(loss2, [out1.hidden_states[0], out1.hidden_states[1]], allow_unused=True)
    assert grads == (None, None)
    # control: without the stop-gradient, segment 2's loss would reach segment 1's states
    live = tuple(out1.hidden_states[:-1])
    loss_live = causal_lm_loss(model(seg2, mems=live).logits, seg2)
    assert torch.autograd.grad(loss_live, out1.hidden_states[0])[0].abs().sum() > 0


def test_causal_inside_a_segment():
    model = tiny(100).eval()
    seg = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(2))
    mem = model(seg).extra["mems"]
    with torch.no_grad():
        base = model(seg, mems=mem).logits
        for k in (0, 7, 15):
            other = seg.clone()
            other[0, k] = (other[0, k] + 3) % 100
            out = model(other, mems=mem).logits
            torch.testing.assert_close(out[:, :k], base[:, :k])
            assert (out[:, k:] - base[:, k:]).abs().amax(-1).min() > 0


def test_objective_labels_documents_and_carry(real):
    tok, streams = real
    obj = SegmentRecurrentLM(tok, segment_len=8)
    model = tiny(tok.vocab_size, mem_len=8).eval()
    s = streams[0]
    ids = torch.stack([s[:24], s[100:124]])
    docs = torch.zeros_like(ids)
    docs[1, 10:] = 1
    pos = torch.stack([torch.arange(24), torch.cat([torch.arange(90, 100), torch.arange(14)])])
    inp = obj.prepare(TokenBatch(ids, docs, pos), torch.Generator())
    assert inp["labels"][1, 10] == -100 and (inp["labels"][0] == ids[0]).all()
    with torch.no_grad():
        _, m = obj.loss(model, inp)
        assert m["memory_rows"] == 0.0
        # next batch: row 0 continues (positions 24..), row 1 jumps to a new place
        nxt = TokenBatch(
            torch.stack([s[24:48], s[500:524]]),
            torch.zeros(2, 24, dtype=torch.long),
            torch.stack([torch.arange(24, 48), torch.arange(300, 324)]),
        )
        _, m = obj.loss(model, obj.prepare(nxt, torch.Generator()))
        assert m["memory_rows"] == 0.5
        # a third batch: row 0 continues again, row 1 starts a new document. The new document's
        # row gets the same logits as with no memory at all (memory attention stays inside a
        # document); the continuing row's logits change
        ids3 = torch.stack([s[48:72], s[600:624]])
        pos3 = torch.stack([torch.arange(48, 72), torch.arange(24)])
        mems, mem_docs = obj._incoming(model, ids3, pos3)
        a, _, _ = obj.run(model, ids3, torch.zeros_like(ids3), mems, mem_docs)
        b, _, _ = obj.run(model, ids3, torch.zeros_like(ids3))
        torch.testing.assert_close(a[1], b[1])
        assert (a[0] - b[0]).abs().max() > 1e-3
    obj.reset_memory()
    assert obj._carry[False] is None
    with pytest.raises(LmlabError, match="segment_len"):
        SegmentRecurrentLM(tok, segment_len=0)
    with pytest.raises(LmlabError, match="Transformer-XL"):
        obj.loss(build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size)), inp)


def test_trains_and_memory_lowers_loss_on_real_text(real):
    tok, streams = real
    model = tiny(tok.vocab_size, mem_len=16)
    obj = get_objective("transfo-xl")(tok, segment_len=16, carry_memory=False)
    g = torch.Generator().manual_seed(0)
    # held-out text of the same book (the short run learns the books' style, not WikiText's)
    held_out = streams[2]
    inp = obj.prepare(windows(held_out, 8, 128, torch.Generator().manual_seed(1)), g)
    ids = inp["input_ids"]

    def token_nll(memory: bool) -> torch.Tensor:
        """Per-target NLL [8, 127]: the window read with memory, or each 16-token segment alone."""
        model.eval()
        with torch.no_grad():
            if memory:
                logits = obj.run(model, ids, inp["doc_ids"])[0]
            else:
                logits = torch.cat([model(ids[:, s : s + 16]).logits for s in range(0, 128, 16)], dim=1)
        model.train()
        return F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")

    before = token_nll(True).mean()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for step in range(120):
        loss, _ = obj.loss(model, obj.prepare(windows(streams[step % 2], 16, 64, g), g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    with_mem, without = token_nll(True), token_nll(False)
    # compare on the same targets: those a segment alone can predict (not a segment's first token)
    same = torch.ones(127, dtype=torch.bool)
    same[15::16] = False
    assert with_mem.mean() < before - 0.8, (before, with_mem.mean())
    assert with_mem[:, same].mean() < without[:, same].mean() - 0.015, (
        with_mem[:, same].mean(),
        without[:, same].mean(),
    )

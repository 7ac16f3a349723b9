"""XLNet permutation LM: hand-checked two-stream masks, no target leakage, trains on real text."""

from __future__ import annotations

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import MaskSpec
from lmlab.objectives import TokenBatch, get_objective
from lmlab.objectives.xlnet import PermutationLM, permutation_ranks, two_stream_masks
from lmlab.tokenizers import train_tokenizer


@pytest.fixture(scope="module")
def real(data_dir):
    """A 512-token byte-level BPE, training streams from two books, WikiText-2 valid ids."""
    pre = data_dir / "pretrain"
    books = [
        (pre / "gutenberg" / "pg14263_katrine.txt").read_text(encoding="utf-8")[:120_000],
        (pre / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:120_000],
    ]
    tok = train_tokenizer("bytelevel", books, vocab_size=512)
    val = (pre / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")[:30_000]
    return tok, [torch.tensor(tok.encode(b)) for b in books], torch.tensor(tok.encode(val))


def windows(stream: torch.Tensor, b: int, t: int, g: torch.Generator) -> TokenBatch:
    starts = torch.randint(0, len(stream) - t, (b,), generator=g)
    ids = torch.stack([stream[s : s + t] for s in starts.tolist()])
    return TokenBatch(ids, torch.zeros_like(ids), torch.arange(t).expand(b, t).clone())


def test_two_stream_masks_hand_checked():
    # order z = (2, 0, 3, 1): rank of positions 0..3 is (1, 3, 0, 2); the last 2 places (3, 1)
    # are targets, positions 2 and 0 are context
    ranks = torch.tensor([[1, 3, 0, 2]])
    content, query = two_stream_masks(ranks, num_context=2)
    expected_content = torch.tensor(
        [
            [1, 0, 1, 0],  # 0 (context): the context only
            [1, 1, 1, 1],  # 1 (last in order): everything, itself included
            [1, 0, 1, 0],  # 2 (context)
            [1, 0, 1, 1],  # 3 (first target): context + itself
        ],
        dtype=torch.bool,
    )
    expected_query = torch.tensor(
        [
            [0, 0, 0, 0],  # context tokens are never predicted: their query stream sees nothing
            [1, 0, 1, 1],  # target 1: context + target 3 (earlier in the order), not itself
            [0, 0, 0, 0],
            [1, 0, 1, 0],  # target 3: the context only
        ],
        dtype=torch.bool,
    )
    assert torch.equal(content[0], expected_content)
    assert torch.equal(query[0], expected_query)
    # same-document restriction applies to both streams
    docs = torch.tensor([[0, 0, 1, 1]])
    c2, q2 = two_stream_masks(ranks, 2, docs[:, :, None] == docs[:, None, :])
    assert c2[0].tolist() == [[1, 0, 0, 0], [1, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]]
    assert q2[0].tolist() == [[0, 0, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 1, 0]]


def test_ranks_are_permutations_and_seeded():
    r1 = permutation_ranks(4, 9, torch.Generator().manual_seed(3))
    r2 = permutation_ranks(4, 9, torch.Generator().manual_seed(3))
    assert torch.equal(r1, r2)
    assert torch.equal(r1.sort(1).values, torch.arange(9).expand(4, 9))
    assert not torch.equal(r1[0], r1[1])


def test_prepare_targets_labels_and_documents(real):
    tok, streams, _ = real
    obj = PermutationLM(tok, predict_fraction=1 / 6)
    ids = streams[0][:96].view(2, 48).clone()
    ids[0, 10] = tok.eos_id
    docs = torch.zeros_like(ids)
    docs[:, 30:] = 1
    batch = TokenBatch(ids, docs, torch.arange(48).expand(2, 48).clone())
    inp = obj.prepare(batch, torch.Generator().manual_seed(0))
    tp, lab, qp, cp = inp["target_positions"], inp["labels"], inp["query_pattern"], inp["attention_pattern"]
    assert tp.shape == (2, 8)  # round(48 / 6)
    for b in range(2):
        for k, p in enumerate(tp[b].tolist()):
            want = -100 if (b == 0 and p == 10) or not qp[b, k].any() else int(ids[b, p])
            assert int(lab[b, k]) == want
            assert not qp[b, k, p]  # never its own content
            assert cp[b, p, p]  # the content stream sees itself
    same = docs[:, :, None] == docs[:, None, :]
    assert not (cp & ~same).any() and not (qp & ~same.gather(1, tp[:, :, None].expand(2, 8, 48))).any()
    with pytest.raises(LmlabError, match="predict_fraction"):
        PermutationLM(tok, predict_fraction=0)


def scores(model, inp, input_ids=None):
    """The model's output on prepared XLNet inputs, called as the objective calls it."""
    streams = MaskSpec(pattern=inp["attention_pattern"], query_stream=inp["query_pattern"])
    ids = inp["input_ids"] if input_ids is None else input_ids
    return model(ids, inp["position_ids"], mask=streams, targets=inp["target_positions"])


def test_query_stream_never_sees_its_target(real):
    tok, streams, _ = real
    torch.manual_seed(0)
    model = build_model(get_preset("xlnet-tiny", vocab_size=tok.vocab_size)).eval()
    obj = PermutationLM(tok, predict_fraction=0.5)
    batch = TokenBatch(
        streams[0][:32][None].clone(), torch.zeros(1, 32, dtype=torch.long), torch.arange(32)[None]
    )
    inp = obj.prepare(batch, torch.Generator().manual_seed(1))
    base = scores(model, inp)
    tp, qp = inp["target_positions"][0], inp["query_pattern"][0]
    changed_other = 0
    for k, p in enumerate(tp.tolist()):
        ids = inp["input_ids"].clone()
        ids[0, p] = (ids[0, p] + 7) % tok.vocab_size
        out = scores(model, inp, ids)
        # its own prediction does not move...
        torch.testing.assert_close(out.logits[0, k], base.logits[0, k], rtol=0, atol=1e-5)
        # ...but targets later in the order, which may see it, do
        later = qp[:, p].nonzero().flatten()
        if len(later):
            changed_other += int((out.logits[0, later] - base.logits[0, later]).abs().max() > 1e-4)
    assert changed_other > 0
    # gradient check: d logits_k / d (embedding of token at target k) is exactly zero
    emb = model.tok_embed(inp["input_ids"]).detach().requires_grad_()
    handle = model.tok_embed.register_forward_hook(lambda m, a, o: emb)
    try:
        out = scores(model, inp)
        k, p = 0, int(tp[0])
        (g,) = torch.autograd.grad(out.logits[0, k].logsumexp(-1), emb)
    finally:
        handle.remove()
    assert g[0, p].abs().max() == 0
    assert g[0].abs().sum() > 0


def test_trains_on_real_text_and_round_trips(real, tmp_path):
    tok, streams, val = real
    torch.manual_seed(0)
    model = build_model(get_preset("xlnet-tiny", vocab_size=tok.vocab_size, dropout=0.0))
    obj = get_objective("xlnet")(tok)
    g, gv = torch.Generator().manual_seed(0), torch.Generator().manual_seed(1)
    val_batches = [windows(val, 8, 64, gv) for _ in range(3)]

    def val_loss():
        model.eval()
        with torch.no_grad():
            r = sum(obj.loss(model, obj.prepare(b, torch.Generator().manual_seed(5)))[0] for b in val_batches)
        model.train()
        return float(r) / len(val_batches)

    before = val_loss()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(60):
        loss, _ = obj.loss(model, obj.prepare(windows(streams[step % 2], 16, 64, g), g))
        opt.zero_grad()
        loss.backward()
        opt.step()
    after = val_loss()
    assert after < before - 0.5, (before, after)
    model.save(tmp_path / "ck", tokenizer=tok)
    again = load_model(tmp_path / "ck")
    inp = obj.prepare(val_batches[0], torch.Generator().manual_seed(5))
    torch.testing.assert_close(scores(again, inp).logits, scores(model.eval(), inp).logits)

"""Prompt tuning: a soft prompt equal to the embeddings of real tokens must give exactly what the
frozen model gives with those tokens inserted (after [CLS] for encoders, in front otherwise), with
masks, positions, labels and the heads' read positions handled."""

from __future__ import annotations

import pytest
import torch

from lmlab.adapt import apply_method, trainable_parameters
from lmlab.adapt.prompt import input_embedding
from lmlab.errors import LmlabError
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset

V, P = 300, 3


def tiny(preset: str, heads=None, **cfg):
    torch.manual_seed(0)
    return build_model(get_preset(preset, vocab_size=V, dropout=0.0, **cfg), heads=heads).eval()


def ids(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, V, (b, t), generator=torch.Generator().manual_seed(seed))


def prompt_as_tokens(model) -> torch.Tensor:
    """Apply prompt tuning with the prompt set to the embeddings of P real tokens; return them."""
    q = ids(1, P, seed=9)[0]
    apply_method(model, "prompt", {"num_virtual_tokens": P})
    with torch.no_grad():
        model.soft_prompt.embedding.copy_(input_embedding(model).weight[q])
    return q


def insert(x: torch.Tensor, q: torch.Tensor, at: int) -> torch.Tensor:
    return torch.cat((x[:, :at], q[None].expand(x.shape[0], -1), x[:, at:]), 1)


@pytest.mark.parametrize("preset", ["bert-tiny", "roberta-tiny"])
def test_encoder_prompt_goes_after_cls(preset):
    model = tiny(preset, ("seq_cls", "token_cls"))
    x, mask = ids(2, 6), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    seg = torch.tensor([[0, 0, 0, 1, 1, 1], [0, 0, 1, 1, 0, 0]]) if preset == "bert-tiny" else None
    tags = torch.tensor([[0, 1, 1, 0, 1, 0], [1, 0, 1, 1, -100, -100]])
    q = prompt_as_tokens(model)
    one = torch.ones(P, dtype=torch.long)
    with torch.no_grad():
        # the class's forward, not model(...): the frozen model on the real tokens, hooks bypassed
        ref = model.__class__.forward(
            model,
            insert(x, q, 1),
            attention_mask=insert(mask, one, 1),
            token_type_ids=None if seg is None else insert(seg, 0 * one, 1),
        )
        got = model(x, attention_mask=mask, token_type_ids=seg)
    assert torch.allclose(got.logits, ref.logits, atol=1e-6)  # the head read [CLS] at position 0
    keep = [0, *range(1 + P, 6 + P)]
    assert got.extra["token_cls_logits"].shape[:2] == (2, 6)
    assert torch.allclose(got.extra["token_cls_logits"], ref.extra["token_cls_logits"][:, keep], atol=1e-6)
    classes = torch.tensor([0, 1])
    got_loss = head_loss("seq_cls", got.logits, classes) + head_loss(
        "token_cls", got.extra["token_cls_logits"], tags)
    ref_loss = head_loss("seq_cls", ref.logits, classes) + head_loss(
        "token_cls", ref.extra["token_cls_logits"], insert(tags, -100 * one, 1))  # the prompt: no loss
    assert torch.allclose(got_loss, ref_loss, atol=1e-6)
    assert got.last_hidden_state.shape[1] == 6


def test_decoder_prompt_goes_in_front_and_lm_loss_skips_it():
    model = tiny("gpt2-tiny", ("lm", "cls"))
    x, mask = ids(2, 6), torch.tensor([[1] * 6, [1] * 4 + [0] * 2])
    q = prompt_as_tokens(model)
    ones = torch.ones(2, P, dtype=torch.long)
    labels = x.masked_fill(mask == 0, -100)
    with torch.no_grad():
        ref = model.__class__.forward(model, insert(x, q, 0), attention_mask=insert(mask, ones[0], 0))
        got = model(x, attention_mask=mask)
    assert got.logits.shape == (2, 6, V)
    assert torch.allclose(got.logits, ref.logits[:, P:], atol=1e-5)
    # the deprecated labels= path (one release): the adapter gives the prompt IGNORE labels
    with torch.no_grad(), pytest.warns(DeprecationWarning, match=r"forward\(labels=\.\.\.\) is deprecated"):
        old_ref = model.__class__.forward(model, insert(x, q, 0), attention_mask=insert(mask, ones[0], 0),
                                          labels=insert(labels, -100 * ones[0], 0))
        old = model(x, attention_mask=mask, labels=labels)
    assert torch.allclose(old.loss, old_ref.loss, atol=1e-6)
    # the cls head reads the last real token through the extended mask
    assert torch.allclose(got.extra["cls_logits"], ref.extra["cls_logits"], atol=1e-6)


def test_decoder_cached_steps_equal_the_full_forward():
    model = tiny("llama-tiny", ("lm",))
    prompt_as_tokens(model)
    x = ids(2, 7)
    with torch.no_grad():
        full = model(x).logits
        out = model(x[:, :4], attention_mask=torch.ones(2, 4, dtype=torch.long), use_cache=True)
        step = model(
            x[:, 4:], attention_mask=torch.ones(2, 7, dtype=torch.long), past_key_values=out.past_key_values
        ).logits
    assert (step - full[:, 4:]).abs().max() < 1e-5


@pytest.mark.parametrize("preset", ["t5-tiny", "bart-tiny"])
def test_seq2seq_prompt_goes_in_front_of_the_source_and_encode_sees_it(preset):
    model = tiny(preset)
    x, mask, dec = ids(2, 6), torch.tensor([[1] * 6, [1] * 4 + [0] * 2]), ids(2, 4, seed=4)
    q = prompt_as_tokens(model)
    ones = torch.ones(2, P, dtype=torch.long)
    patched = model.__dict__.pop("encode")  # the frozen model's own encode for the reference
    with torch.no_grad():
        ref = model.__class__.forward(
            model, insert(x, q, 0), attention_mask=insert(mask, ones[0], 0), decoder_input_ids=dec
        )
    model.encode = patched
    with torch.no_grad():
        got = model(x, attention_mask=mask, decoder_input_ids=dec)
        enc = model.encode(x, mask)  # generation encodes once, then passes encoder_outputs
        again = model(attention_mask=mask, encoder_outputs=enc, decoder_input_ids=dec)
    assert (got.logits - ref.logits).abs().max() < 1e-5
    assert (again.logits - ref.logits).abs().max() < 1e-5


def test_span_positions_shift_with_the_prompt():
    model = tiny("bert-tiny", ("span",))
    x = ids(2, 8)
    start, end = torch.tensor([2, 0]), torch.tensor([4, 0])
    q = prompt_as_tokens(model)
    with torch.no_grad():
        ref = model.__class__.forward(model, insert(x, q, 1))
        got = model(x)
    assert got.extra["start_logits"].shape == (2, 8)
    keep = [0, *range(1 + P, 8 + P)]
    assert torch.allclose(got.logits, ref.logits[:, keep], atol=1e-6)
    # the deprecated keywords (one release): the adapter moves the positions past the prompt
    with torch.no_grad(), pytest.warns(DeprecationWarning, match=r"forward\(labels=\.\.\.\) is deprecated"):
        moved = torch.tensor([P, 0])
        old_ref = model.__class__.forward(model, insert(x, q, 1), start_positions=start + moved,
                                          end_positions=end + moved)
        old = model(x, start_positions=start, end_positions=end)
    assert torch.allclose(old.loss, old_ref.loss, atol=1e-6)


def test_only_the_prompt_and_head_train():
    model = tiny("bert-tiny", ("seq_cls",))
    head = sum(p.numel() for p in model.heads.parameters()) + sum(
        p.numel() for p in model.pooler.parameters()
    )
    apply_method(model, "prompt", {"num_virtual_tokens": 4, "init": "random"})
    assert trainable_parameters(model)[0] == 4 * 64 + head
    frozen = {k: p.clone() for k, p in model.named_parameters() if not p.requires_grad}
    start = model.soft_prompt.embedding.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model.train()
    for _ in range(3):
        head_loss("seq_cls", model(ids(2, 6)).logits, torch.tensor([0, 1])).backward()
        opt.step()
        opt.zero_grad()
    now = dict(model.named_parameters())
    assert all(torch.equal(now[k], p) for k, p in frozen.items())
    assert not torch.equal(model.soft_prompt.embedding, start)


def test_too_long_inputs_and_bad_options_are_clear_errors():
    model = tiny("bert-tiny", ("seq_cls",), max_positions=10)
    apply_method(model, "prompt", {"num_virtual_tokens": P})
    with pytest.raises(LmlabError, match="truncate inputs to 7 tokens"):
        model(ids(1, 9))
    with pytest.raises(LmlabError, match="prompt option init must be one of vocab, random"):
        apply_method(tiny("gpt2-tiny"), "prompt", {"init": "text"})


def test_a_deep_copy_has_its_own_prompt():
    import copy

    model = tiny("t5-tiny")
    prompt_as_tokens(model)
    x, dec = ids(1, 5), ids(1, 3, seed=4)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        before = model(x, decoder_input_ids=dec).logits
        assert torch.equal(twin(x, decoder_input_ids=dec).logits, before)
        twin.soft_prompt.embedding.add_(1.0)
        assert torch.equal(model(x, decoder_input_ids=dec).logits, before)
        assert not torch.allclose(twin(x, decoder_input_ids=dec).logits, before)
        assert not torch.allclose(twin.encode(x).last_hidden_state, model.encode(x).last_hidden_state)

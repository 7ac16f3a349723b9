"""Prefix tuning: a prefix is a KV cache, so a prefix set to the cache of a real context must give
exactly the logits of the model run on that context; masks, T5 biases and caching stay right."""

from __future__ import annotations

import pytest
import torch

from lmlab.adapt import apply_method, trainable_parameters
from lmlab.adapt.prefix import PrefixAttention
from lmlab.errors import LmlabError
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset

V = 300


def tiny(preset: str, heads=None):
    torch.manual_seed(0)
    return build_model(get_preset(preset, vocab_size=V, dropout=0.0), heads=heads).eval()


def ids(b: int, t: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(5, V, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_prefix_equal_to_a_context_cache_gives_the_context_logits(preset):
    model = tiny(preset, ("lm",))
    p, t = 4, 6
    context, x = ids(1, p, seed=2).expand(2, -1), ids(2, t)  # every row shares the one prefix
    mask = torch.ones(2, t, dtype=torch.long)
    mask[1, 4:] = 0
    full_mask = torch.cat((torch.ones(2, p, dtype=torch.long), mask), 1)
    with torch.no_grad():
        ref = model(torch.cat((context, x), 1), attention_mask=full_mask, use_cache=True)
    apply_method(model, "prefix", {"num_virtual_tokens": p, "init": "random"})
    with torch.no_grad():
        for i, (k, v) in enumerate(ref.past_key_values):
            model.prefix_encoder.prefix[i, 0] = k[0, :, :p]
            model.prefix_encoder.prefix[i, 1] = v[0, :, :p]
        got = model(x, attention_mask=mask, position_ids=torch.arange(p, p + t)[None]).logits
    real = mask.bool()
    assert (got[real] - ref.logits[:, p:][real]).abs().max() < 1e-5
    with torch.no_grad():  # and the prefix matters: a random one gives other logits
        model.prefix_encoder.prefix.normal_()
        other = model(x, attention_mask=mask, position_ids=torch.arange(p, p + t)[None]).logits
    assert (other[real] - ref.logits[:, p:][real]).abs().max() > 1e-2


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_after_prefix_positions_continue_a_context_without_position_ids(preset):
    """``positions=after_prefix``: the input is numbered after the prefix, as after a real
    context of ``P`` tokens (what transformers and peft compute)."""
    model = tiny(preset, ("lm",))
    p, t = 4, 6
    context, x = ids(1, p, seed=2).expand(2, -1), ids(2, t)
    with torch.no_grad():
        ref = model(torch.cat((context, x), 1), use_cache=True)
    apply_method(model, "prefix", {"num_virtual_tokens": p, "init": "random", "positions": "after_prefix"})
    with torch.no_grad():
        for i, (k, v) in enumerate(ref.past_key_values):
            model.prefix_encoder.prefix[i, 0] = k[0, :, :p]
            model.prefix_encoder.prefix[i, 1] = v[0, :, :p]
        got = model(x).logits
        shifted = model(x, position_ids=torch.arange(t)[None]).logits  # explicit ids are shifted by P too
        out = model(x[:, :4], use_cache=True)  # and cached decoding goes on after the prefix
        step = model(x[:, 4:], past_key_values=out.past_key_values).logits
    assert (got - ref.logits[:, p:]).abs().max() < 1e-5
    assert (shifted - got).abs().max() < 1e-6 and (step - got[:, 4:]).abs().max() < 1e-5
    if preset == "gpt2-tiny":  # learned positions: numbered from 0 (-P + P) the prefix gives other logits
        with torch.no_grad():
            start = model(x, position_ids=torch.arange(-p, t - p)[None]).logits
        assert (start - got).abs().max() > 1e-3


def test_after_prefix_keeps_robertas_padding_and_refuses_too_long_inputs():
    model = tiny("roberta-tiny", ("token_cls",))
    apply_method(model, "prefix", {"num_virtual_tokens": 3, "positions": "after_prefix"})
    x = ids(1, 5)
    padded = torch.cat((x, torch.full((1, 3), model.config.pad_token_id)), 1)
    mask = torch.tensor([[1] * 5 + [0] * 3])
    with torch.no_grad():
        a, b = model(x).logits, model(padded, attention_mask=mask).logits
    assert (a - b[:, :5]).abs().max() < 1e-5
    limit = model.config.max_positions - model.config.pad_token_id - 1
    model(ids(1, limit - 3))
    with pytest.raises(LmlabError, match="after a prefix of 3"):
        model(ids(1, limit - 2))


def test_cached_decoding_equals_a_full_forward():
    model = tiny("gpt2-tiny", ("lm",))
    apply_method(model, "prefix", {"num_virtual_tokens": 3})
    x = ids(2, 7)
    with torch.no_grad():
        full = model(x).logits
        out = model(x[:, :4], use_cache=True)
        assert out.past_key_values[0][0].shape[2] == 4  # the caller's cache holds no prefix
        step = model(x[:, 4:], past_key_values=out.past_key_values).logits
    assert (step - full[:, 4:]).abs().max() < 1e-5


@pytest.mark.parametrize(
    "preset,heads", [("bert-tiny", ("seq_cls",)), ("t5-tiny", None), ("bart-tiny", None)]
)
def test_padding_does_not_change_the_real_rows(preset, heads):
    model = tiny(preset, heads)
    apply_method(
        model, "prefix", {"num_virtual_tokens": 3, "reparameterize": preset == "t5-tiny",
                          **({"hidden": 32} if preset == "t5-tiny" else {})}
    )
    x = ids(1, 5)
    padded = torch.cat((x, torch.full((1, 3), 7)), 1)
    kw, kw_pad = {"input_ids": x}, {"input_ids": padded, "attention_mask": torch.tensor([[1] * 5 + [0] * 3])}
    if model.architecture == "seq2seq":
        kw["decoder_input_ids"] = kw_pad["decoder_input_ids"] = ids(1, 4, seed=5)
    with torch.no_grad():
        a, b = model(**kw), model(**kw_pad)
    if model.architecture == "seq2seq":
        assert (a.logits - b.logits).abs().max() < 1e-5
    else:
        assert (a.last_hidden_state - b.last_hidden_state[:, :5]).abs().max() < 1e-5


def test_only_the_prefix_and_head_train():
    model = tiny("bert-tiny", ("seq_cls",))
    head = sum(p.numel() for p in model.heads.parameters()) + sum(
        p.numel() for p in model.pooler.parameters()
    )
    apply_method(model, "prefix", {"num_virtual_tokens": 5})
    n, _, _ = trainable_parameters(model)
    assert n == 2 * 2 * 4 * 5 * 16 + head  # layers · (k, v) · heads · P · head_dim
    assert all(isinstance(b.attn, PrefixAttention) for b in model.layers)
    frozen = {k: p.clone() for k, p in model.named_parameters() if not p.requires_grad}
    prefix = model.prefix_encoder.prefix.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model.train()
    for _ in range(3):
        head_loss(model.head_names[0], model(ids(2, 6)).logits, torch.tensor([0, 1])).backward()
        opt.step()
        opt.zero_grad()
    now = dict(model.named_parameters())
    assert all(torch.equal(now[k], p) for k, p in frozen.items())
    assert not torch.equal(model.prefix_encoder.prefix, prefix)


def test_reparameterised_prefix_trains_the_mlp():
    model = tiny("gpt2-tiny", ("lm",))
    apply_method(model, "prefix", {"num_virtual_tokens": 2, "reparameterize": True, "hidden": 16})
    enc = model.prefix_encoder
    assert enc.prefix is None
    x = ids(2, 5)
    head_loss("lm", model(x).logits, x).backward()
    assert enc.mlp_out.weight.grad is not None and enc.embedding.grad.abs().sum() > 0


def test_bad_options():
    with pytest.raises(LmlabError, match="num_virtual_tokens"):
        apply_method(tiny("gpt2-tiny"), "prefix", {"num_virtual_tokens": 0})
    with pytest.raises(LmlabError, match="prefix option init must be one of vocab, random"):
        apply_method(tiny("gpt2-tiny"), "prefix", {"init": "zeros"})
    with pytest.raises(LmlabError, match="prefix option positions must be one of from_start, after_prefix"):
        apply_method(tiny("gpt2-tiny"), "prefix", {"positions": "end"})
    with pytest.raises(LmlabError, match="encoders and decoders"):
        apply_method(tiny("t5-tiny"), "prefix", {"positions": "after_prefix"})

"""Houlsby and Pfeiffer bottleneck adapters: identity at init, placement, counts, frozen base."""

from __future__ import annotations

import pytest
import torch

from lmlab.adapt import apply_method, trainable_parameters
from lmlab.adapt.adapters import AdaptedAttention, AdaptedFeedForward, BottleneckAdapter, adapter_count
from lmlab.errors import LmlabError
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset

V = 300


def tiny(preset: str = "bert-tiny", heads=("seq_cls",)):
    torch.manual_seed(0)
    return build_model(get_preset(preset, vocab_size=V, dropout=0.0), heads=heads).eval()


def inputs(model, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (2, 8), generator=g)
    mask = torch.ones(2, 8, dtype=torch.long)
    mask[0, 5:] = 0
    kw = {"input_ids": ids, "attention_mask": mask}
    if model.architecture == "seq2seq":
        kw["decoder_input_ids"] = ids[:, :5]
    return kw


@pytest.mark.parametrize(
    "preset,heads", [("bert-tiny", ("seq_cls",)), ("t5-tiny", None), ("llama-tiny", ("lm",))]
)
@pytest.mark.parametrize("kind", ["houlsby", "pfeiffer"])
def test_starts_as_the_base_model_and_adapters_are_live(preset, heads, kind):
    model = tiny(preset, heads)
    x = inputs(model)
    with torch.no_grad():
        base = model(**x).last_hidden_state
    apply_method(model, "adapter", {"kind": kind, "bottleneck": 8})
    n_blocks = (
        len(model.layers)
        if hasattr(model, "layers")
        else len(model.encoder.layers) + len(model.decoder.layers)
    )
    assert adapter_count(model) == n_blocks * (2 if kind == "houlsby" else 1)
    with torch.no_grad():
        assert (model(**x).last_hidden_state - base).abs().max() < 1e-6
        for m in model.modules():
            if isinstance(m, BottleneckAdapter):
                m.up.weight.normal_(0, 0.1)
        assert (model(**x).last_hidden_state - base).abs().max() > 1e-3


def test_houlsby_sits_on_the_attention_and_ffn_outputs():
    model = tiny()
    apply_method(model, "adapter", {"kind": "houlsby", "bottleneck": 4})
    block = model.layers[0]
    assert isinstance(block.attn, AdaptedAttention) and isinstance(block.ffn, AdaptedFeedForward)
    seen = {}
    block.attn.inner.register_forward_hook(lambda m, a, out: seen.__setitem__("attn", out[0]))
    block.attn.adapter.register_forward_hook(lambda m, a, out: seen.__setitem__("attn_adapter", a[0]))
    block.ffn.inner.register_forward_hook(lambda m, a, out: seen.__setitem__("ffn", out))
    block.ffn.adapter.register_forward_hook(lambda m, a, out: seen.__setitem__("ffn_adapter", (a[0], out)))
    with torch.no_grad():
        block.ffn.adapter.up.weight.normal_(0, 0.1)
        model(**inputs(model))
    assert torch.equal(seen["attn_adapter"], seen["attn"])
    adapter_in, adapter_out = seen["ffn_adapter"]
    assert torch.equal(adapter_in, seen["ffn"])
    up = block.ffn.adapter
    assert torch.allclose(adapter_out, adapter_in + up.up(torch.relu(up.down(adapter_in))), atol=1e-6)


def test_pfeiffer_has_one_adapter_and_half_the_parameters():
    d, m = 64, 4
    per_adapter = 2 * d * m + m + d
    counts = {}
    for kind in ("houlsby", "pfeiffer"):
        model = tiny()
        head = sum(p.numel() for p in model.heads.parameters()) + sum(
            p.numel() for p in model.pooler.parameters()
        )
        norms = sum(
            p.numel() for b in model.layers for n in (b.attn_norm, b.ffn_norm) for p in n.parameters()
        )
        apply_method(model, "adapter", {"kind": kind, "reduction_factor": 16})
        assert not isinstance(model.layers[0].attn, AdaptedAttention) if kind == "pfeiffer" else True
        n, _, _ = trainable_parameters(model)
        counts[kind] = n - head - (norms if kind == "houlsby" else 0)
    assert counts == {"houlsby": 2 * 2 * per_adapter, "pfeiffer": 2 * per_adapter}


def test_only_adapters_norms_and_head_train():
    model = tiny()
    apply_method(model, "adapter", {"kind": "houlsby", "bottleneck": 8})
    frozen = {n: p.clone() for n, p in model.named_parameters() if not p.requires_grad}
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all(".adapter." in n or "_norm." in n or n.startswith(("heads.", "pooler.")) for n in trainable)
    assert any("attn_norm" in n for n in trainable)  # Houlsby trains the layer norms
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model.train()
    for _ in range(3):
        head_loss("seq_cls", model(**inputs(model)).logits, torch.tensor([0, 1])).backward()
        opt.step()
        opt.zero_grad()
    now = dict(model.named_parameters())
    assert all(torch.equal(now[n], p) for n, p in frozen.items())
    assert not torch.equal(
        now["layers.0.ffn.adapter.up.weight"], torch.zeros_like(now["layers.0.ffn.adapter.up.weight"])
    )


def test_pfeiffer_keeps_norms_frozen_and_bad_kind_fails():
    model = tiny()
    apply_method(model, "adapter", {"kind": "pfeiffer"})
    assert not any(p.requires_grad for n, p in model.named_parameters() if "_norm." in n)
    houlsby = tiny()
    apply_method(houlsby, "adapter", {"kind": "houlsby", "train_norms": "false"})  # as from the CLI
    assert not any(p.requires_grad for n, p in houlsby.named_parameters() if "_norm." in n)
    with pytest.raises(LmlabError, match="train_norms"):
        apply_method(tiny(), "adapter", {"train_norms": "maybe"})
    with pytest.raises(LmlabError, match="adapter option kind must be one of houlsby, pfeiffer"):
        apply_method(tiny(), "adapter", {"kind": "lora"})
    with pytest.raises(LmlabError, match="bottleneck"):
        apply_method(tiny(), "adapter", {"bottleneck": -3})

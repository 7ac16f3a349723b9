"""Transformer blocks against their textbook formulas and against transformers' reference code."""

from __future__ import annotations

import math

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.models.attention_masks import attention_bias, causal_mask, prefix_lm_mask
from lmlab.models.blocks import (
    Attention,
    FeedForward,
    LayerNorm,
    RelativePositionBias,
    RMSNorm,
    RotaryEmbedding,
    SinusoidalPositions,
    TransformerBlock,
    apply_rotary,
    relative_position_bucket,
)
from lmlab.models.config import DecoderConfig, EncoderConfig, get_preset


def naive_attention(att: Attention, x, context=None, allowed=None, bias=None, scale=None):
    """softmax(q·kᵀ·scale + bias) v written out by hand, heads repeated for GQA."""
    b, t, _ = x.shape
    src = x if context is None else context
    q = att.q_proj(x).view(b, t, att.n_heads, att.head_dim).transpose(1, 2)
    k = att.k_proj(src).view(b, src.shape[1], att.n_kv_heads, att.head_dim).transpose(1, 2)
    v = att.v_proj(src).view(b, src.shape[1], att.n_kv_heads, att.head_dim).transpose(1, 2)
    rep = att.n_heads // att.n_kv_heads
    k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
    scores = q @ k.transpose(-1, -2) * (1 / math.sqrt(att.head_dim) if scale is None else scale)
    if bias is not None:
        scores = scores + bias
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    out = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, -1)
    return att.o_proj(out)


@pytest.fixture
def x():
    torch.manual_seed(0)
    return torch.randn(2, 7, 32)


def test_attention_bidirectional_and_causal_match_formula(x):
    att = Attention(32, 4).eval()
    out, _ = att(x)
    assert torch.allclose(out, naive_attention(att, x), atol=1e-5)
    out, _ = att(x, is_causal=True)
    assert torch.allclose(out, naive_attention(att, x, allowed=causal_mask(7, 7)), atol=1e-5)


def test_padding_prefix_and_arbitrary_masks(x):
    att = Attention(32, 4).eval()
    pad = torch.tensor([[1] * 7, [1] * 4 + [0] * 3])
    bias, is_causal = attention_bias(pad, 7, 7, causal=True)
    assert not is_causal and bias.shape == (2, 1, 7, 7)
    allowed = causal_mask(7, 7)[None, None] & pad.bool()[:, None, None, :]
    out, _ = att(x, mask=bias)
    ref = naive_attention(att, x, allowed=allowed)
    assert torch.allclose(out[0], ref[0], atol=1e-5) and torch.allclose(out[1, :4], ref[1, :4], atol=1e-5)
    # prefix LM: prefix of 3 sees itself bidirectionally, the rest is causal
    pm = prefix_lm_mask(7, 3)
    assert pm[0, 2] and pm[1, 2] and not pm[3, 4] and pm[4, 3]
    bias, _ = attention_bias(None, 7, 7, mask=pm)
    out, _ = att(x, mask=bias)
    assert torch.allclose(out, naive_attention(att, x, allowed=pm), atol=1e-5)
    # per-example prefix lengths
    pm_b = prefix_lm_mask(7, torch.tensor([3, 5]))
    assert pm_b.shape == (2, 1, 7, 7) and pm_b[1, 0, 0, 4] and not pm_b[0, 0, 0, 4]
    # a boolean mask passed directly (True = attend)
    rnd = torch.rand(7, 7) > 0.5
    rnd |= torch.eye(7, dtype=torch.bool)
    out, _ = att(x, mask=rnd)
    assert torch.allclose(out, naive_attention(att, x, allowed=rnd), atol=1e-5)


def test_fast_paths_need_no_mask():
    assert attention_bias(None, 5, 5, causal=True) == (None, True)
    assert attention_bias(torch.ones(2, 5), 5, 5, causal=True) == (None, True)  # no padding: fused path
    assert attention_bias(None, 5, 5, causal=False) == (None, False)
    assert attention_bias(None, 1, 9, causal=True) == (None, False)  # one cached step sees everything


def test_grouped_query_and_cross_attention(x):
    gqa = Attention(32, 4, n_kv_heads=2).eval()
    assert gqa.k_proj.out_features == 16
    out, _ = gqa(x, is_causal=True)
    assert torch.allclose(out, naive_attention(gqa, x, allowed=causal_mask(7, 7)), atol=1e-5)
    cross = Attention(32, 4, cross=True).eval()
    enc = torch.randn(2, 11, 32)
    out, present = cross(x, context=enc, use_cache=True)
    assert out.shape == (2, 7, 32) and present[0].shape == (2, 4, 11, 8)
    assert torch.allclose(out, naive_attention(cross, x, context=enc), atol=1e-5)
    again, _ = cross(x, past_kv=present)  # cached cross keys/values are reused as they are
    assert torch.allclose(again, out, atol=1e-6)


def test_unscaled_attention_with_position_bias(x):
    att = Attention(32, 4, bias=False, scale=1.0).eval()
    rel = RelativePositionBias(4, num_buckets=8, max_distance=16, bidirectional=False)
    pb = rel(7, 7)
    assert pb.shape == (1, 4, 7, 7)
    out, _ = att(x, position_bias=pb, is_causal=True)
    ref = naive_attention(att, x, allowed=causal_mask(7, 7), bias=pb, scale=1.0)
    assert torch.allclose(out, ref, atol=1e-5)


def test_relative_bucket_equals_t5_reference():
    from transformers.models.t5.modeling_t5 import T5Attention

    rel = torch.arange(-300, 300)[None, :] - torch.arange(0, 20)[:, None]
    for bidirectional in (True, False):
        ours = relative_position_bucket(rel, bidirectional, 32, 128)
        ref = T5Attention._relative_position_bucket(rel, bidirectional, 32, 128)
        assert torch.equal(ours, ref)


def test_norms_follow_their_formulas():
    torch.manual_seed(1)
    h = torch.randn(3, 5, 16)
    ln = LayerNorm(16, eps=1e-5)
    with torch.no_grad():
        ln.weight.normal_()
        ln.bias.normal_()
    mu, var = h.mean(-1, keepdim=True), h.var(-1, unbiased=False, keepdim=True)
    assert torch.allclose(ln(h), ln.weight * (h - mu) / torch.sqrt(var + 1e-5) + ln.bias, atol=1e-5)
    rms = RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        rms.weight.normal_()
    expect = rms.weight * h / torch.sqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
    assert torch.allclose(rms(h), expect, atol=1e-5)


def test_rms_norm_backward_matches_autograd_of_the_formula():
    """RMSNorm's gradients are autograd's of the plain formula, for x and the weight, and a second
    derivative too (no hand-written backward); no-grad and bf16 give the formula's values."""
    torch.manual_seed(3)
    rms = RMSNorm(24, eps=1e-6)
    with torch.no_grad():
        rms.weight.normal_()
    x = torch.randn(4, 7, 24, dtype=torch.float64).float().requires_grad_()
    g = torch.randn(4, 7, 24)
    out = rms(x)
    assert out.grad_fn is not None
    gx, gw = torch.autograd.grad(out, (x, rms.weight), g)
    expect = rms.weight * x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    ex, ew = torch.autograd.grad(expect, (x, rms.weight), g, retain_graph=True)
    torch.testing.assert_close(out, expect)
    torch.testing.assert_close(gx, ex, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(gw, ew, rtol=1e-5, atol=1e-5)
    # second order (e.g. a gradient penalty)
    (gx1,) = torch.autograd.grad(rms(x).square().sum(), x, create_graph=True)
    assert gx1.requires_grad
    (gx2,) = torch.autograd.grad(expect.square().sum(), x, create_graph=True)
    h1 = torch.autograd.grad(gx1.sum(), x)[0]
    h2 = torch.autograd.grad(gx2.sum(), x)[0]
    torch.testing.assert_close(h1, h2, rtol=1e-4, atol=1e-5)
    with torch.no_grad():
        torch.testing.assert_close(rms(x), expect.detach())
    assert torch.allclose(rms(x.bfloat16()).float(), expect, atol=0.1)


def test_ffn_activations():
    torch.manual_seed(2)
    h = torch.randn(2, 3, 8)
    ffn = FeedForward(8, 16, "swiglu")
    expect = ffn.fc_out(torch.nn.functional.silu(ffn.fc_gate(h)) * ffn.fc_in(h))
    assert torch.allclose(ffn(h), expect)
    relu = FeedForward(8, 16, "relu")
    assert torch.allclose(relu(h), relu.fc_out(torch.relu(relu.fc_in(h))))
    with pytest.raises(LmlabError, match="unknown activation"):
        FeedForward(8, 16, "sparkle")


def test_sinusoidal_and_rotary_positions():
    table = SinusoidalPositions(50, 8)(torch.arange(50))
    p, i = 13, 2
    assert math.isclose(table[p, 2 * i].item(), math.sin(p / 10000 ** (2 * i / 8)), abs_tol=1e-6)
    assert math.isclose(table[p, 2 * i + 1].item(), math.cos(p / 10000 ** (2 * i / 8)), abs_tol=1e-6)
    # RoPE: q_p · k_r depends only on p - r
    rope = RotaryEmbedding(8)
    q, k = torch.randn(1, 1, 1, 8), torch.randn(1, 1, 1, 8)

    def dot(p, r):
        cq, sq = rope(torch.tensor([p]))
        ck, sk = rope(torch.tensor([r]))
        return (apply_rotary(q, cq, sq) * apply_rotary(k, ck, sk)).sum().item()

    assert math.isclose(dot(5, 2), dot(13, 10), rel_tol=1e-4)
    assert not math.isclose(dot(5, 2), dot(5, 4), rel_tol=1e-3)


@pytest.mark.parametrize("preset", ["gpt2-tiny", "llama-tiny"])
def test_block_kv_cache_matches_full_pass(preset):
    cfg = get_preset(preset, dropout=0.0, attn_dropout=0.0)
    block = TransformerBlock(cfg).eval()
    x = torch.randn(2, 9, cfg.d_model)
    rot = RotaryEmbedding(cfg.dim_head) if cfg.positions == "rotary" else None

    def rope(a, b):
        return rot(torch.arange(a, b)) if rot else None

    full, _ = block(x, is_causal=True, rope=rope(0, 9))
    first, cache = block(x[:, :5], is_causal=True, rope=rope(0, 5), use_cache=True)
    outs = [first]
    for t in range(5, 9):
        o, cache = block(x[:, t : t + 1], is_causal=True, rope=rope(t, t + 1), past_kv=cache, use_cache=True)
        outs.append(o)
    assert cache[0].shape[2] == 9
    assert torch.allclose(torch.cat(outs, 1), full, atol=1e-5)


def test_post_norm_and_pre_norm_wiring():
    cfg = EncoderConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.0, attn_dropout=0.0)
    block = TransformerBlock(cfg).eval()
    x = torch.randn(1, 4, 16)
    a, _ = block.attn(x)
    h = block.attn_norm(x + a)
    assert torch.allclose(block(x)[0], block.ffn_norm(h + block.ffn(h)), atol=1e-6)
    pre = TransformerBlock(
        DecoderConfig(d_model=16, n_heads=2, d_ff=32, dropout=0.0, attn_dropout=0.0)
    ).eval()
    a, _ = pre.attn(pre.attn_norm(x))
    h = x + a
    assert torch.allclose(pre(x)[0], h + pre.ffn(pre.ffn_norm(h)), atol=1e-6)


def test_config_validation_is_one_line():
    for bad, match in [
        (dict(d_model=30, n_heads=4), "does not divide d_model"),
        (dict(n_kv_heads=3), "n_kv_heads 3 does not divide"),
        (dict(activation="nope"), "unknown activation"),
        (dict(vocab_size=0), "vocab_size must be at least 1 \\(got 0\\)"),
        (dict(dropout=1.5), "dropout must be less than 1"),
    ]:
        with pytest.raises(LmlabError, match=match) as e:
            get_preset("llama-tiny", **bad)
        assert "\n" not in str(e.value)
    with pytest.raises(LmlabError, match="unknown model preset"):
        get_preset("bert-huge")
    with pytest.raises(LmlabError, match="no settings"):
        get_preset("bert-tiny", n_experts=4)

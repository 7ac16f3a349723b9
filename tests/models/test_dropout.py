"""lmlab's CPU dropout (models/dropout.py): the distribution of nn.Dropout, a cheaper mask."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmlab.models import build_model, get_preset
from lmlab.models import dropout as dropout_module
from lmlab.models.dropout import Dropout, add_dropout, dropout, scaled_keep_mask


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_mask_holds_zero_or_the_scale_with_the_keep_rate(p):
    torch.manual_seed(0)
    n = 400_000
    mask = scaled_keep_mask((n,), p)
    assert mask.unique().tolist() == [0.0, pytest.approx(1 / (1 - p))]
    kept = (mask > 0).double().mean().item()
    assert abs(kept - (1 - p)) < 5 * math.sqrt(p * (1 - p) / n)  # 5 standard deviations
    # independent elements: a neighbour is kept at the same rate, whatever this one did
    pairs = (mask[:-1] > 0) & (mask[1:] > 0)
    assert abs(pairs.double().mean().item() - (1 - p) ** 2) < 0.01


def test_seeded_calls_repeat_and_successive_calls_differ():
    torch.manual_seed(3)
    a = scaled_keep_mask((3, 50_001), 0.3)  # an odd length: not a whole number of 64-bit words
    later = scaled_keep_mask((3, 50_001), 0.3)
    torch.manual_seed(3)
    b = scaled_keep_mask((3, 50_001), 0.3)
    assert torch.equal(a, b)
    assert not torch.equal(a > 0, later > 0)  # each call draws anew


def test_keep_probability_is_the_16_bit_rounding_of_1_minus_p():
    assert dropout_module._threshold(0.1) / 2**16 == pytest.approx(0.9, abs=2**-17)
    x = torch.ones(1000)
    # a p that rounds to 0 or 1 in 16 bits is left to torch's own dropout
    assert not dropout_module._fast(x, 1e-7) and not dropout_module._fast(x, 1 - 1e-7)
    assert dropout_module._fast(x, 0.1)


def test_many_threads_use_torch_dropout(monkeypatch):
    x = torch.randn(100)
    monkeypatch.setattr(torch, "get_num_threads", lambda: dropout_module.MAX_THREADS + 1)
    assert not dropout_module._fast(x, 0.1)
    monkeypatch.setattr(dropout_module.F, "dropout", lambda x, p, training: x * 0 + 7)
    assert torch.equal(dropout(x, 0.1), torch.full_like(x, 7.0))


def test_double_backward_through_dropout():
    torch.manual_seed(1)
    x = torch.randn(40, 30, requires_grad=True)
    y = dropout(x, 0.5)
    (g,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    g.sum().backward()
    kept = (y != 0).float()
    torch.testing.assert_close(x.grad, kept * 2 / 0.25)


def test_dropout_forward_and_backward_use_one_mask():
    torch.manual_seed(0)
    x = torch.randn(64, 4101, requires_grad=True)
    y = dropout(x, 0.25)
    (y * 2).sum().backward()
    kept = y != 0
    assert 0.7 < kept.float().mean().item() < 0.8
    torch.testing.assert_close(y[kept], x[kept] / 0.75)
    torch.testing.assert_close(x.grad, kept.float() * 2 / 0.75)


def test_dropped_values_are_zero_even_where_scaling_overflows():
    # x / (1 - p) overflows float32 here: a dropped element must still be 0 (as F.dropout gives),
    # not inf · 0 = NaN, in the forward pass and in the gradient
    torch.manual_seed(0)
    x = torch.full((1000,), 3e38, requires_grad=True)
    y = dropout(x, 0.5)
    y.backward(torch.full((1000,), 3e38))
    dropped = y == 0
    assert 300 < int(dropped.sum()) < 700
    assert not y.isnan().any() and not x.grad.isnan().any()
    assert (x.grad[dropped] == 0).all() and x.grad[~dropped].isinf().all()


def test_add_dropout_is_residual_plus_dropout_with_the_same_draws():
    r = torch.randn(6, 50, 70, requires_grad=True)
    x = torch.randn(6, 50, 70, requires_grad=True)
    torch.manual_seed(5)
    fused = add_dropout(r, x, 0.2)
    fused.square().sum().backward()
    grads = r.grad.clone(), x.grad.clone()
    r.grad = x.grad = None
    torch.manual_seed(5)
    plain = r + dropout(x, 0.2)
    plain.square().sum().backward()
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(grads[0], r.grad)
    torch.testing.assert_close(grads[1], x.grad)


def test_identity_and_fallbacks():
    x = torch.randn(10, 10)
    assert dropout(x, 0.5, training=False) is x
    assert dropout(x, 0.0) is x
    assert torch.equal(dropout(x, 1.0), torch.zeros_like(x))  # torch's own p = 1
    half = dropout(x.bfloat16(), 0.5)  # other dtypes: torch's dropout
    assert half.dtype == torch.bfloat16
    assert set(half.float().div(x.bfloat16().float()).unique().tolist()) <= {0, 2}
    module = Dropout(0.5)
    assert isinstance(module, nn.Dropout)
    module.eval()
    assert module(x) is x
    torch.testing.assert_close(module.add_to(x, x), 2 * x)


def test_the_models_use_it():
    model = build_model(get_preset("t5-tiny", vocab_size=64))
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(type(m) is Dropout for m in drops)
    assert F.dropout is not dropout


def test_written_out_attention_matches_sdpa_with_a_fully_masked_row(monkeypatch):
    """The CPU attention-dropout path equals SDPA (p = 0), and a query row whose every key is masked
    (left padding under a causal mask) gives zeros and finite gradients, as SDPA does, not NaN."""
    from lmlab.models.blocks import attention_with_dropout

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.zeros(2, 1, 5, 5)
    mask[0, :, :, :2] = float("-inf")  # row 0 of batch 0 sees keys 0..1 only: all masked under causal
    ours = attention_with_dropout(q, k, v, mask, True, None, 0.0)
    causal = torch.ones(5, 5, dtype=torch.bool).tril()
    full = mask.masked_fill(~causal, float("-inf"))
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=full)
    torch.testing.assert_close(ours, sdpa, rtol=1e-5, atol=1e-6)
    assert ours[0, :, 0].abs().sum() == 0
    dropped = attention_with_dropout(q, k, v, mask, True, None, 0.5)
    dropped.sum().backward()
    assert torch.isfinite(dropped).all() and all(torch.isfinite(t.grad).all() for t in (q, k, v))
    # the path torch.compile takes (no private _safe_softmax) gives the same
    monkeypatch.delattr(torch, "_safe_softmax", raising=False)
    again = attention_with_dropout(q, k, v, mask, True, None, 0.0)
    torch.testing.assert_close(again, sdpa, rtol=1e-5, atol=1e-6)
    q.grad = None
    attention_with_dropout(q, k, v, mask, True, None, 0.5).sum().backward()
    assert torch.isfinite(q.grad).all()


def test_relu_dropout_is_dropout_of_relu_with_the_same_draws():
    from lmlab.models.dropout import relu_dropout

    x = torch.randn(7, 300, requires_grad=True)
    torch.manual_seed(11)
    fused = relu_dropout(x, 0.3)
    (fused * torch.arange(300.0)).sum().backward()
    grad = x.grad.clone()
    x.grad = None
    torch.manual_seed(11)
    plain = dropout(F.relu(x), 0.3)
    (plain * torch.arange(300.0)).sum().backward()
    torch.testing.assert_close(fused, plain)
    torch.testing.assert_close(grad, x.grad)
    assert (fused[x <= 0] == 0).all() and 0.6 < (fused[x > 0] != 0).float().mean() < 0.8


def test_t5_feed_forward_folds_relu_into_dropout(monkeypatch):
    """The FFN of a ReLU model in training takes the one-mask path; the output is fc_out of the
    dropped ReLU either way (same seed)."""
    from lmlab.models.blocks import FeedForward

    ffn = FeedForward(16, 64, activation="relu", bias=False, dropout=0.2).train()
    x = torch.randn(3, 5, 16)
    calls = []
    real = dropout_module._Dropout.apply
    monkeypatch.setattr(dropout_module._Dropout, "apply", lambda *a: calls.append(a[3:]) or real(*a))
    torch.manual_seed(2)
    fused = ffn(x)
    assert calls == [(True,)]
    torch.manual_seed(2)
    plain = ffn.fc_out(dropout(F.relu(ffn.fc_in(x)), 0.2))
    torch.testing.assert_close(fused, plain)


def test_attention_skips_the_empty_row_guard_only_where_no_row_can_be_empty(monkeypatch):
    from lmlab.models import blocks

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 4, 8) for _ in range(3))
    guarded = []
    real = blocks._safe_softmax
    monkeypatch.setattr(blocks, "_safe_softmax", lambda s, dim: guarded.append(s.shape) or real(s, dim))
    bias = torch.randn(1, 3, 4, 4)
    bias[..., 0, :] = torch.finfo(torch.float32).min  # T5's causal bias style: finite, no -inf
    out = blocks.attention_with_dropout(q, k, v, bias, False, 1.0, 0.0)
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0))
    blocks.attention_with_dropout(q, k, v, None, True, None, 0.0)  # causal, as many keys as queries
    assert guarded == []
    padded = torch.zeros(2, 1, 1, 4)
    padded[1, ..., :] = float("-inf")  # a row with every key masked
    out = blocks.attention_with_dropout(q, k, v, padded, False, None, 0.0)
    assert guarded and out[1].abs().sum() == 0 and torch.isfinite(out).all()
    guarded.clear()
    blocks.attention_with_dropout(q, k[:, :, :2], v[:, :, :2], None, True, None, 0.0)  # fewer keys
    assert guarded


def _native_or_skip():
    """The C kernel; a skip only where there is no compiler (a failed build with one is a failure)."""
    from lmlab import native

    library = dropout_module._kernels()
    if library is None and native.compiler() is None:
        pytest.skip("no C compiler on this machine: only the NumPy twin runs")
    assert library is not None, "a C compiler is here, but the dropout kernel did not build (see the log)"
    return library


@pytest.mark.parametrize("n", [1, 3, 4, 5, 4095, 4096, 4097, 3 * 4096 + 7, 50_001])
@pytest.mark.parametrize("relu, with_residual", [(False, False), (True, False), (False, True)])
def test_c_kernel_gives_the_numpy_twins_masks_and_values(monkeypatch, n, relu, with_residual):
    """Same seed, same bits, same float32 values to the last bit, forward and backward, whether
    the C kernel or the NumPy twin runs (lengths around the kernel's 4096-element blocks and not
    a whole number of 64-bit words)."""
    library = _native_or_skip()
    gen = torch.Generator().manual_seed(n)
    x = torch.randn(n, generator=gen) * 3
    residual = torch.randn(n, generator=gen) if with_residual else None
    grad = torch.randn(n, generator=gen)
    results = {}
    for name, kernels in (("c", library), ("numpy", None)):
        monkeypatch.setattr(dropout_module, "_kernels", lambda kernels=kernels: kernels)
        torch.manual_seed(7)
        out, keep = dropout_module._forward(x, 0.3, residual, relu)
        results[name] = out, keep, dropout_module._backward(grad, keep, 0.3)
    (out_c, keep_c, back_c), (out_np, keep_np, back_np) = results["c"], results["numpy"]
    assert torch.equal(keep_c, keep_np)
    assert torch.equal(out_c.view(torch.int32), out_np.view(torch.int32))  # bit for bit, -0.0 too
    assert torch.equal(back_c.view(torch.int32), back_np.view(torch.int32))
    if relu:
        assert not keep_c[x <= 0].any()


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's inf · 0 and overflow warnings
def test_c_kernel_and_twin_agree_on_special_values_and_odd_layouts(monkeypatch):
    """NaN, ±inf, values whose rescale overflows, denormals and ±0; a non-contiguous input,
    residual and gradient; an empty tensor: the kernel gives the twin's very bits."""
    library = _native_or_skip()
    special = torch.tensor([float("nan"), float("inf"), -float("inf"), 3e38, -3e38, 1e-45, -1e-45, 0.0, -0.0])
    x = torch.cat([special.repeat(50), torch.randn(550)]).view(20, 50).t()  # non-contiguous
    residual = torch.randn(50, 20).t().t().t()
    residual[0, :5] = float("-inf")
    grad = torch.randn(20, 50).t()
    for args in ((x, 0.5, None, False), (x, 0.5, residual, False), (x, 0.5, None, True),
                 (torch.empty(0), 0.5, None, False)):
        results = []
        for kernels in (library, None):
            monkeypatch.setattr(dropout_module, "_kernels", lambda kernels=kernels: kernels)
            torch.manual_seed(1)
            out, keep = dropout_module._forward(*args)
            back = dropout_module._backward(grad if args[0].numel() else args[0], keep, 0.5)
            results.append((out.view(torch.int32), keep, back.view(torch.int32)))
        assert all(torch.equal(a, b) for a, b in zip(*results))


def test_a_t5_training_step_is_the_same_with_or_without_the_c_kernel(monkeypatch):
    """A seed gives the same training run on a machine without a C compiler: loss and every
    gradient of a T5 step with dropout agree exactly between the kernel and the NumPy twin."""
    library = _native_or_skip()
    torch.manual_seed(0)
    model = build_model(get_preset("t5-tiny", vocab_size=64, dropout=0.2)).train()
    src, tgt = torch.randint(0, 64, (2, 24)), torch.randint(0, 64, (2, 9))
    runs = []
    for kernels in (library, None):
        monkeypatch.setattr(dropout_module, "_kernels", lambda kernels=kernels: kernels)
        model.zero_grad()
        torch.manual_seed(3)
        loss = model(src, decoder_input_ids=tgt[:, :-1], labels=tgt[:, 1:]).loss
        loss.backward()
        runs.append((loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]))
    assert torch.equal(runs[0][0], runs[1][0])
    torch.manual_seed(4)  # another seed, other masks: the dropout is really on in this step
    assert not torch.equal(model(src, decoder_input_ids=tgt[:, :-1], labels=tgt[:, 1:]).loss, runs[0][0])
    assert len(runs[0][1]) == len(runs[1][1]) > 10
    assert all(torch.equal(a, b) for a, b in zip(runs[0][1], runs[1][1]))

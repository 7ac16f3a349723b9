"""Dropout is plain PyTorch (nn.Dropout, SDPA's dropout_p), and its masks come from the seed alone:
the same at any intra-op thread count, eager or compiled."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lmlab.losses import token_loss
from lmlab.models import build_model, get_preset
from lmlab.runtime import set_threads

FAMILIES = ("bert-tiny", "gpt2-tiny", "llama-tiny", "t5-tiny", "bart-tiny")


@pytest.fixture
def threads():
    """``threads(n)`` sets the intra-op thread count; the test process's own count comes back after."""
    before = torch.get_num_threads()
    yield set_threads
    set_threads(before)


@pytest.mark.parametrize("preset", FAMILIES)
def test_every_dropout_is_torchs_own(preset):
    model = build_model(get_preset(preset, vocab_size=64, dropout=0.1))
    drops = [m for m in model.modules() if isinstance(m, nn.Dropout)]
    assert drops and all(type(m) is nn.Dropout for m in drops)


def test_dropout_masks_do_not_depend_on_the_thread_count(threads):
    """torch's CPU Bernoulli draws (MKL streams skipped ahead per chunk, or one serial stream) give
    the same mask on 1 thread as on 5, for F.dropout and for SDPA's attention dropout."""
    draws = {}
    for n in (1, 5):
        threads(n)
        torch.manual_seed(0)
        x = torch.ones(3, 700, 517)  # large enough to be split among threads
        q = torch.randn(2, 4, 64, 16)
        draws[n] = F.dropout(x, 0.1), F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    assert 0.85 < (draws[1][0] > 0).float().mean() < 0.95
    assert all(torch.equal(a, b) for a, b in zip(draws[1], draws[5]))


def _t5_step(seed: int = 3):
    """Loss and gradients of one T5 training step with dropout 0.1 on (residual, FFN, attention)."""
    torch.manual_seed(0)
    model = build_model(get_preset("t5-tiny", vocab_size=64, dropout=0.1, attn_dropout=0.1)).train()
    src, tgt = torch.randint(0, 64, (2, 24)), torch.randint(0, 64, (2, 9))
    torch.manual_seed(seed)
    loss = token_loss(model(src, decoder_input_ids=tgt[:, :-1]).logits, tgt[:, 1:])
    loss.backward()
    return loss.detach(), [p.grad for p in model.parameters() if p.grad is not None]


def test_a_t5_step_with_dropout_is_the_same_on_1_and_5_threads(threads):
    """Same seed, same masks: the loss and every gradient agree between 1 and 5 threads (to the
    rounding of sums split among threads). Before, lmlab's own CPU dropout switched to another
    random stream above 4 threads."""
    runs = {}
    for n in (1, 5):
        threads(n)
        runs[n] = _t5_step()
    (loss1, grads1), (loss5, grads5) = runs[1], runs[5]
    torch.testing.assert_close(loss1, loss5, rtol=1e-6, atol=1e-6)
    assert len(grads1) == len(grads5) > 10
    for a, b in zip(grads1, grads5):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    threads(1)
    other = _t5_step(seed=4)[0]
    assert abs(other - loss1) > 1e-3  # another seed, other masks: the dropout is really on


def test_compiled_dropout_masks_do_not_depend_on_the_thread_count(threads):
    """Under torch.compile the masks come from the graph's own random ops (not eager's draws), and
    they too are the same on 1 thread as on 5."""
    import torch._dynamo

    def dropped(x, q):
        return F.dropout(x, 0.1), F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)

    draws = {}
    for n in (1, 5):
        threads(n)
        torch._dynamo.reset()
        torch.manual_seed(0)
        x, q = torch.ones(3, 700, 517), torch.randn(2, 4, 64, 16)
        draws[n] = torch.compile(dropped, backend="aot_eager")(x, q)
    assert 0.85 < (draws[1][0] > 0).float().mean() < 0.95
    assert all(torch.equal(a, b) for a, b in zip(draws[1], draws[5]))

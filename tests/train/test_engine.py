"""The one optimizer step of every training loop (pretraining, fine-tuning, distillation)."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.train.engine import Engine
from lmlab.train.optim import adamw


def _setup(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    x, y = torch.randn(8, 6), torch.randn(8, 1)
    return model, x, y


def _loss(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y), {"rows": float(len(x))}


def test_two_micro_batches_make_the_update_of_one_whole_batch():
    model, x, y = _setup()
    twin = copy.deepcopy(model)
    one = Engine(adamw([model], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0), lambda s: 1e-2, clip=0)
    two = Engine(adamw([twin], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0), lambda s: 1e-2, clip=0)
    a = one.step(0, [lambda: _loss(model, x, y)])
    b = two.step(0, [lambda: _loss(twin, x[:4], y[:4]), lambda: _loss(twin, x[4:], y[4:])])
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)
    assert b.metrics == {"rows": 4.0} and a.metrics == {"rows": 8.0}  # averaged over micro-batches
    assert b.loss == pytest.approx((_loss_value(x[:4], y[:4]) + _loss_value(x[4:], y[4:])) / 2, rel=1e-5)


def _loss_value(x, y, seed=0):
    model, _, _ = _setup(seed)
    with torch.no_grad():
        return float(torch.nn.functional.mse_loss(model(x), y))


def test_schedule_clipping_and_the_reported_norm():
    model, x, y = _setup()
    engine = Engine(adamw([model], lr=1.0, betas=(0.9, 0.99), weight_decay=0.0), lambda s: 0.1 * (s + 1),
                    clip=1e-3)
    done = engine.step(4, [lambda: _loss(model, x, y)])
    assert done.lr == pytest.approx(0.5)
    assert all(g["lr"] == pytest.approx(0.5) for g in engine.optimizer.param_groups)
    assert done.grad_norm > 1e-3  # the norm before clipping is what is reported
    assert all(p.grad is None for p in model.parameters())  # gradients cleared for the next step


def test_a_non_finite_loss_never_reaches_the_weights():
    model, x, y = _setup()
    before = copy.deepcopy(model.state_dict())
    engine = Engine(adamw([model], lr=1e-2, betas=(0.9, 0.99), weight_decay=0.0), lambda s: 1e-2,
                    fix="lower the learning rate (--lr)")
    with pytest.raises(LmlabError, match="non-finite at step 3") as err:
        engine.step(2, [lambda: _loss(model, x, y)[0] * float("nan")])
    assert err.value.fix == "lower the learning rate (--lr)"
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k])

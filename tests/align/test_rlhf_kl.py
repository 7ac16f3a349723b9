"""RLHF logs a KL that cannot be negative (issue 27): the k3 estimator, not the mean log ratio
(which goes below 0 whenever the sampled responses happen to be likelier under the reference, as
they often are when sampling at a temperature above 1)."""

from __future__ import annotations

import math

import pytest
import torch
from align_fixtures import synthetic_pairs, tiny_model

from lmlab.align import align
from lmlab.align.rlhf import kl_estimate


def test_k3_on_known_numbers_and_never_below_zero():
    logp = torch.tensor([-1.0, -2.0, -3.0, -1.0])
    ref = torch.tensor([-2.0, -1.0, -3.0, -200.0])  # last: the reference finds it 199 nats less likely
    k3 = kl_estimate(logp, ref)
    assert k3[0].item() == pytest.approx(math.exp(-1) - 1 + 1)     # rho = e^-1: e^-1 - 1 - (-1)
    assert k3[1].item() == pytest.approx(math.e - 1 - 1)           # rho = e: where log ratio is -1
    assert k3[2].item() == 0.0 and math.isfinite(k3[3].item()) and bool((k3 >= 0).all())
    assert (logp - ref)[1].item() == -1.0 and k3[1].item() > 0      # the log ratio alone goes negative
    assert k3[3].item() == pytest.approx(29.0)                      # the log ratio clamped at -30


def test_the_kl_logged_by_rlhf_is_never_negative():
    res = align(tiny_model(), synthetic_pairs(200, 0), synthetic_pairs(40, 1), None, method="rlhf",
                max_steps=12, batch_size=8, lr=1e-3, reward_steps=5, max_new_tokens=2, samples=4,
                temperature=2.0, eval_every=50, log_every=1, progress=False, log=lambda m: None)
    kls = [row["kl"] for row in res.history if row.get("phase") == "policy" and "kl" in row]
    assert len(kls) == 12 and min(kls) >= 0.0 and max(kls) > 0.0

"""Packed documents through FlexAttention's CUDA kernel equal the dense mask, forward and backward,
in a model and in a training run."""

from __future__ import annotations

import pytest
import torch
from cuda_tier import QUIET, rows, run_config

from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import MaskSpec
from lmlab.train import pretrain

pytestmark = pytest.mark.cuda

DOCS = torch.tensor([[0] * 20 + [1] * 28 + [2] * 16, [0] * 64])  # a packed row and a single-document row
PREFIX = torch.zeros(2, 64, dtype=torch.bool)
PREFIX[0, :6] = PREFIX[0, 20:30] = PREFIX[0, 48:52] = PREFIX[1, :16] = True


def _forward_backward(model, backend: str, ids, labels, mask):
    model.zero_grad(set_to_none=True)
    model.attention_backend = backend
    out = model(input_ids=ids, mask=mask)
    assert model.backend_now() == backend  # training with gradients: flex runs for real on CUDA
    loss = head_loss(model.head_names[0], out.logits, labels)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.logits.detach(), loss.detach(), grads


@pytest.mark.parametrize("preset, prefix", [("gpt2-tiny", False), ("gpt2-tiny", True), ("llama-tiny", False),
                                            ("bert-tiny", False)])
def test_flex_equals_the_dense_mask_forward_and_backward(preset, prefix):
    torch.manual_seed(0)
    model = build_model(get_preset(preset, vocab_size=300, max_positions=64, dropout=0.0,
                                   attn_dropout=0.0)).cuda().train()
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(5, 300, (2, 64), generator=g).cuda()
    labels = ids.clone()
    if preset.startswith("bert"):
        labels[:, ::3] = -100
    mask = MaskSpec(causal=model.architecture == "decoder", doc_ids=DOCS.cuda(),
                    prefix=PREFIX.cuda() if prefix else None)
    dense = _forward_backward(model, "sdpa", ids, labels, mask)
    flex = _forward_backward(model, "flex", ids, labels, mask)
    torch.testing.assert_close(flex[0], dense[0], rtol=2e-3, atol=2e-4)
    torch.testing.assert_close(flex[1], dense[1], rtol=1e-4, atol=1e-5)
    assert set(flex[2]) == set(dense[2])
    for name, grad in dense[2].items():  # each gradient to a thousandth of its own scale
        scale = float(grad.abs().max()) or 1.0
        torch.testing.assert_close(flex[2][name], grad, rtol=1e-2, atol=1e-3 * scale, msg=name)


def test_a_training_run_on_flex_repeats_the_dense_one(corpus, tmp_path):
    steps = {}
    for attention in ("sdpa", "flex"):
        cfg = run_config("clm", corpus, precision="fp32", attention=attention)
        pretrain(cfg, tmp_path / attention, log=QUIET)
        steps[attention] = rows(tmp_path / attention)
    for a, b in zip(steps["sdpa"], steps["flex"]):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-3)
    assert steps["flex"][-1]["val_loss"] == pytest.approx(steps["sdpa"][-1]["val_loss"], rel=1e-4)

"""Activation checkpointing recomputes each block in the backward pass: the same gradients, less
memory held between forward and backward, nothing else changed."""

from __future__ import annotations

import copy

import pytest
import torch

from lmlab.models import build_model, get_preset
from lmlab.models.activation_checkpointing import enable_activation_checkpointing, is_checkpointed
from lmlab.tasks.base import scored_loss


def _inputs(preset: str, vocab: int = 300):
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, vocab, (2, 24), generator=gen)
    if preset.startswith(("t5", "bart")):
        return {"input_ids": ids, "labels": ids[:, :10]}
    if preset.startswith("transfo"):
        return {"input_ids": ids, "labels": ids}
    labels = ids.clone()
    if preset.startswith(("bert", "albert")):
        labels[:, ::2] = -100  # an MLM: loss only at some positions
    return {"input_ids": ids, "labels": labels}


def _grads_and_saved_bytes(model, inputs, seed=3):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    torch.manual_seed(seed)  # dropout is on: the recomputation must draw the same masks
    model.zero_grad(set_to_none=True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = scored_loss(model, inputs)  # the first head's loss, from the model's scores
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, sum(saved)


@pytest.mark.parametrize("preset", ["bert-tiny", "gpt2-tiny", "t5-tiny", "bart-tiny", "albert-tiny",
                                    "transfo-xl-tiny"])
def test_same_gradients_with_fewer_activations_held(preset):
    cfg = get_preset(preset, vocab_size=300)
    cfg = cfg.replace(dropout=0.1) if hasattr(cfg, "dropout") else cfg
    torch.manual_seed(0)
    plain = build_model(cfg).train()
    ckpt = copy.deepcopy(plain)
    keys = list(ckpt.state_dict())
    n = enable_activation_checkpointing(ckpt)
    assert n >= 1 and list(ckpt.state_dict()) == keys  # checkpoints and PEFT see the same names
    inputs = _inputs(preset)
    loss_a, grads_a, held_a = _grads_and_saved_bytes(plain, inputs)
    loss_b, grads_b, held_b = _grads_and_saved_bytes(ckpt, inputs)
    assert torch.equal(loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], rtol=1e-5, atol=1e-6, msg=name)
    assert held_b < 0.8 * held_a, (held_a, held_b)


def test_evaluation_runs_the_block_as_before_and_a_copy_is_its_own():
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=300))
    ids = _inputs("gpt2-tiny")["input_ids"]
    before = model.eval()(input_ids=ids).logits
    assert enable_activation_checkpointing(model) == 2
    wrapped = [b.forward for b in model.layers]
    assert enable_activation_checkpointing(model) == 2  # a second call wraps nothing again
    assert [b.forward for b in model.layers] == wrapped
    torch.testing.assert_close(model(input_ids=ids).logits, before, rtol=0, atol=0)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        for p in twin.parameters():
            p.mul_(0.5)
    # the copy's blocks run the copy's weights (a wrapper bound to the original would not)
    assert not torch.allclose(twin(input_ids=ids).logits, before)
    assert all(is_checkpointed(b) for b in twin.layers)


def test_models_without_transformer_blocks_report_none():
    model = build_model(get_preset("lstm-tiny", vocab_size=300))
    assert enable_activation_checkpointing(model) == 0

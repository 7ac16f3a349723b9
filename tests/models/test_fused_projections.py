"""Attention projects q/k/v (cross-attention: k/v) in one matmul; parameters stay separate."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from lmlab.interop import hf_export
from lmlab.loading import load_model
from lmlab.models.blocks import Attention, projections
from lmlab.models.seq2seq.hf import _namer
from lmlab.objectives.base import teacher_forced

T = pytest.importorskip("transformers")  # the oracle


class LinearCalls(TorchFunctionMode):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += func is F.linear
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("cross", [False, True])
def test_one_matmul_for_the_projections_of_the_inputs(cross):
    torch.manual_seed(0)
    attn = Attention(32, 4, n_kv_heads=2, cross=cross)
    x, ctx = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    with LinearCalls() as mode:
        fused, _ = attn(x, context=ctx if cross else None)
    assert mode.calls == (3 if cross else 2)  # [q,] kv or qkv in one, plus the output projection
    handle = attn.k_proj.register_forward_hook(lambda *a: None)  # a hooked layer: one by one
    with LinearCalls() as mode:
        separate, _ = attn(x, context=ctx if cross else None)
    handle.remove()
    assert mode.calls == 4
    torch.testing.assert_close(fused, separate, atol=1e-6, rtol=0)
    with torch.no_grad(), LinearCalls() as mode:  # inference (decoding): no weights concatenated per call
        attn(x, context=ctx if cross else None)
    assert mode.calls == 4


def test_projections_match_the_layers_with_gradients():
    torch.manual_seed(0)
    layers = (nn.Linear(16, 8), nn.Linear(16, 4), nn.Linear(16, 4))
    x = torch.randn(3, 6, 16, requires_grad=True)
    outs = projections(layers, x, lambda y: y)
    assert [o.shape[-1] for o in outs] == [8, 4, 4]
    sum((o * (i + 1)).sum() for i, o in enumerate(outs)).backward()
    fused_grads = [x.grad.clone()] + [p.grad.clone() for m in layers for p in m.parameters()]
    x.grad = None
    for m in layers:
        m.zero_grad(set_to_none=True)
    sum((m(x) * (i + 1)).sum() for i, m in enumerate(layers)).backward()
    plain_grads = [x.grad] + [p.grad for m in layers for p in m.parameters()]
    for a, b in zip(fused_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    mixed = (nn.Linear(16, 8), nn.Linear(16, 4, bias=False))  # different bias settings: one by one
    for got, layer in zip(projections(mixed, x, lambda y: y), mixed, strict=True):
        torch.testing.assert_close(got, layer(x))


def test_t5_training_gradients_match_transformers(tmp_path):
    """A loaded HF T5 trains to the same loss and the same gradient on every parameter, and its
    state dict keeps the separate q/k/v layout (the HF checkpoint round-trips)."""
    torch.manual_seed(0)
    cfg = T.T5Config(vocab_size=120, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
                     decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
    ref = T.T5ForConditionalGeneration(cfg).train()
    ref.save_pretrained(tmp_path, safe_serialization=True)
    model = load_model(tmp_path).train()
    g = torch.Generator().manual_seed(1)
    batch = {"input_ids": torch.randint(3, 120, (2, 11), generator=g),
             "labels": torch.randint(3, 120, (2, 5), generator=g)}
    loss, ref_loss = teacher_forced(model, batch)[1], ref(**batch).loss
    loss.backward()
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, atol=1e-6, rtol=0)
    hf_params, name = dict(ref.named_parameters()), _namer(model)
    checked = 0
    for key, p in model.named_parameters():
        theirs = hf_params[name(key)]
        torch.testing.assert_close(p.grad, theirs.grad, atol=1e-6, rtol=1e-4, msg=key)
        checked += key.endswith(("q_proj.weight", "k_proj.weight", "v_proj.weight"))
    assert checked == 2 * 3 + 2 * 3 + 2 * 3  # encoder self, decoder self, decoder cross
    # the layout stays HF's: exported back, the checkpoint holds the very tensors it was loaded from
    hf_export(model, tmp_path / "back")
    back = T.T5ForConditionalGeneration.from_pretrained(tmp_path / "back").state_dict()
    mine = ref.state_dict()
    assert back.keys() == mine.keys()
    for key, value in mine.items():
        assert torch.equal(back[key], value), key

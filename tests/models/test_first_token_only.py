"""The [CLS]-only last layer (``keep=slice(0, 1)``, once ``first_token_only``): same logits, loss
and gradients as the full computation, for post-norm and pre-norm encoders, with padding, with
every PEFT method; and the block-level ``queries`` slice it is built on equals the full layer's
rows."""

from __future__ import annotations

import pytest
import torch

from lmlab.adapt import apply_method
from lmlab.errors import LmlabError
from lmlab.losses import head_loss
from lmlab.models import build_model, get_preset
from lmlab.models.attention_masks import attention_bias, prefix_lm_mask
from lmlab.models.blocks import (
    Packing,
    RotaryEmbedding,
    TransformerBlock,
)

V = 200
ATOL = 1e-5
CLS = slice(0, 1)  # the [CLS]-only last layer (the old first_token_only=True)


def encoder(preset="bert-tiny", heads=("seq_cls",), **kw):
    torch.manual_seed(0)
    opts = {"vocab_size": V, "dropout": 0.0, "attn_dropout": 0.0, "num_labels": 3, **kw}
    return build_model(get_preset(preset, **opts), heads=heads)


def batch(b=4, t=11, seed=1):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, V, (b, t), generator=g)
    mask = torch.ones(b, t, dtype=torch.long)
    mask[1, 7:] = 0
    mask[3, 3:] = 0
    ids = ids.masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 2, 1, 2])}


def scored(model, inputs, **kw):
    """The model's output on ``inputs`` less their labels, and the loss of the labels per head
    (``labels`` for the first head, ``<head>_labels`` for the others), summed."""
    labels = {k: v for k, v in inputs.items() if k.endswith("labels")}
    out = model(**{k: v for k, v in inputs.items() if k not in labels}, **kw)
    losses = [head_loss(h, out.extra[f"{h}_logits"], labels[k]) for i, h in enumerate(model.head_names)
              for k in (("labels" if i == 0 else f"{h}_labels"),) if k in labels]
    return out, sum(losses[1:], losses[0])


def loss_logits_grads(model, inputs, **kw):
    model.zero_grad(set_to_none=True)
    out, loss = scored(model, inputs, **kw)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, loss, grads


def assert_same(model, inputs):
    full, full_loss, g_full = loss_logits_grads(model, inputs)
    cls, cls_loss, g_cls = loss_logits_grads(model, inputs, keep=CLS)
    assert (cls.logits - full.logits).abs().max() < ATOL
    assert abs(float(cls_loss.detach()) - float(full_loss.detach())) < ATOL
    assert g_cls.keys() == g_full.keys() and g_cls
    for name in g_full:
        assert torch.allclose(g_cls[name], g_full[name], atol=ATOL, rtol=1e-4), name
    assert cls.last_hidden_state.shape == (inputs["input_ids"].shape[0], 1, model.config.d_model)
    assert torch.allclose(cls.last_hidden_state, full.last_hidden_state[:, :1], atol=ATOL)
    return full


@pytest.mark.parametrize(
    "preset,kw",
    [
        ("bert-tiny", {}),  # post-norm, pooler
        ("bert-tiny", {"prenorm": True}),  # pre-norm
        ("roberta-tiny", {"pad_token_id": 1}),  # own dense head, positions after padding
        ("electra-tiny", {}),  # factorized embeddings, gelu head
        ("albert-tiny", {"n_layers": 3}),  # one block shared by every layer
    ],
)
def test_cls_only_last_layer_equals_the_full_computation(preset, kw):
    model = encoder(preset, **kw).train()  # training mode, dropout 0: the fine-tuning path
    inputs = batch()
    if preset.startswith("roberta"):
        inputs["input_ids"] = inputs["input_ids"].masked_fill(inputs["attention_mask"] == 0, 1)
    assert_same(model, inputs)
    model.eval()
    del inputs["labels"]
    with torch.no_grad():
        full = model(**inputs).logits
        cls = model(**inputs, keep=CLS).logits
    assert torch.allclose(cls, full, atol=ATOL)


def test_the_last_layer_runs_at_one_position_and_padding_is_skipped():
    model = encoder()
    seen = []
    last = model.layers[-1]
    hooks = [last.ffn.register_forward_hook(lambda m, a, out: seen.append(tuple(a[0].shape))),
             last.attn.q_proj.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape))),
             last.attn.k_proj.register_forward_hook(lambda m, a, out: seen.append(tuple(out.shape))),
             model.layers[0].ffn.register_forward_hook(lambda m, a, out: seen.append(tuple(a[0].shape)))]
    inputs = batch()
    model(inputs["input_ids"], inputs["attention_mask"], keep=CLS)
    d, real = model.config.d_model, int(inputs["attention_mask"].sum())
    assert real < 4 * 11
    # packed: the real tokens in one row; q at each [CLS], k over the real tokens, FFN at [CLS]
    assert seen == [(1, real, d), (1, 4, d), (1, real, d), (1, 4, d)]
    seen.clear()
    model(inputs["input_ids"], keep=CLS)  # no padding: nothing to pack
    assert seen == [(4, 11, d), (4, 1, d), (4, 11, d), (4, 1, d)]
    for h in hooks:
        h.remove()


def test_nsp_heads_and_hidden_states():
    model = encoder(heads=("seq_cls", "nsp")).eval()
    inputs = batch()
    inputs["nsp_labels"] = torch.tensor([0, 1, 1, 0])
    with torch.no_grad():
        full, full_loss = scored(model, inputs, output_hidden_states=True)
        cls, cls_loss = scored(model, inputs, keep=CLS)
        # asking for every layer's states computes every layer in full: the states are unaffected
        both, _ = scored(model, inputs, keep=CLS, output_hidden_states=True)
    assert abs(float(cls_loss) - float(full_loss)) < ATOL
    assert torch.allclose(cls.extra["nsp_logits"], full.extra["nsp_logits"], atol=ATOL)
    assert all(torch.equal(a, b) for a, b in zip(both.hidden_states, full.hidden_states, strict=True))
    assert both.last_hidden_state.shape[1] == 1


@pytest.mark.parametrize("head", ["mlm", "token_cls", "span", "discriminator"])
def test_heads_that_read_every_position_refuse_it(head):
    model = encoder(heads=("seq_cls", head)).eval()
    with pytest.raises(LmlabError, match=f"{head} head reads every position"):
        model(batch()["input_ids"], keep=CLS)
    hidden = model.backbone(batch()["input_ids"], keep=CLS)  # the [CLS] head alone: fine
    assert model.heads["seq_cls"](hidden, model.pool(hidden)).shape == (4, 3)
    assert model(batch()["input_ids"]).extra[f"{head}_logits"].shape[1] == 11  # off: unchanged


@pytest.mark.parametrize(
    "method,options",
    [
        ("lora", {"rank": 4, "target_modules": ["all-linear"]}),
        ("adapter", {"kind": "houlsby", "bottleneck": 8}),
        ("prefix", {"num_virtual_tokens": 5}),
        ("prompt", {"num_virtual_tokens": 5}),
    ],
)
@pytest.mark.parametrize("prenorm", [False, True])
def test_peft_methods_give_the_same_loss_and_gradients(method, options, prenorm):
    model = encoder(prenorm=prenorm)
    apply_method(model, method, options)
    with torch.no_grad():  # move LoRA B / adapter up-projections off zero so they matter
        for p in model.parameters():
            if p.requires_grad and p.abs().sum() == 0 and p.dim() == 2:
                p.normal_(0.0, 0.05)
    model.train()
    assert_same(model, batch())


def test_sentence_classification_tasks_pass_it_for_encoders_only():
    from lmlab.tasks import make_task

    task = make_task("sst2")
    inputs = {**batch(), "token_type_ids": torch.zeros(4, 11, dtype=torch.long)}
    enc = encoder()
    assert task.model_inputs(enc, inputs)["keep"] == slice(0, 1)
    both = encoder(heads=("seq_cls", "mlm"))
    assert "keep" not in task.model_inputs(both, inputs)
    assert "keep" not in make_task("conll").model_inputs(enc, inputs)


# ----------------------------------------------------------------------------- the block's slice


def block(prenorm: bool, cross: bool = False, n_kv_heads: int | None = None):
    torch.manual_seed(0)
    cfg = get_preset("bert-tiny", dropout=0.0, attn_dropout=0.0, prenorm=prenorm)
    if n_kv_heads:
        cfg = cfg.replace(n_kv_heads=n_kv_heads)
    return TransformerBlock(cfg, cross_attention=cross).eval()


@pytest.mark.parametrize("prenorm", [False, True])
@pytest.mark.parametrize("queries", [slice(0, 1), slice(3, 7), slice(8, 9)])
def test_block_queries_are_the_rows_of_the_full_layer(prenorm, queries):
    b, t, d = 3, 9, 64
    x = torch.randn(b, t, d)
    pad = torch.ones(b, t, dtype=torch.long)
    pad[2, 5:] = 0
    cases = {
        "padding": {"mask": attention_bias(pad, t, t)[0]},
        "causal": {"is_causal": True},
        "prefix-lm": {"mask": attention_bias(pad, t, t, mask=prefix_lm_mask(t, 4))[0]},
        "bias": {"position_bias": torch.randn(1, 4, t, t)},
        "rotary": {"rope": RotaryEmbedding(16)(torch.arange(t)[None] + 2)},
        "past": {"past_kv": (torch.randn(b, 4, 3, 16), torch.randn(b, 4, 3, 16))},
    }
    layer = block(prenorm)
    for name, kw in cases.items():
        full, _ = layer(x, **kw)
        part, _ = layer(x, queries=queries, **kw)
        assert part.shape == (b, queries.stop - queries.start, d), name
        assert torch.allclose(part, full[:, queries], atol=ATOL), name
    gqa = block(prenorm, n_kv_heads=2)
    assert torch.allclose(gqa(x, queries=queries)[0], gqa(x)[0][:, queries], atol=ATOL)
    ctx = torch.randn(b, 6, d)
    dec = block(prenorm, cross=True)
    full, _ = dec(x, is_causal=True, context=ctx)
    part, _ = dec(x, is_causal=True, context=ctx, queries=queries)
    assert torch.allclose(part, full[:, queries], atol=ATOL)


@pytest.mark.parametrize("prenorm", [False, True])
def test_packed_block_equals_the_padded_one_at_real_positions(prenorm):
    b, t, d = 3, 9, 64
    x = torch.randn(b, t, d, requires_grad=True)
    pad = torch.ones(b, t, dtype=torch.long)
    pad[1, 4:] = 0
    pad[2, 7:] = 0
    packing = Packing(pad)
    real = pad.bool()
    layer = block(prenorm)
    mask = attention_bias(pad, t, t)[0]
    rope = RotaryEmbedding(16)(torch.arange(t)[None])
    past = {
        "past_kv": (torch.randn(b, 4, 3, 16), torch.randn(b, 4, 3, 16)),
        "mask": attention_bias(torch.cat((torch.ones(b, 3, dtype=torch.long), pad), 1), t, t + 3)[0],
    }
    for kw in ({"mask": mask}, {"mask": mask, "rope": rope}, past):
        full, _ = layer(x, **kw)
        packed, _ = layer(packing.unpad(x), packing=packing, **kw)
        assert packed.shape == (1, int(pad.sum()), d)
        assert torch.allclose(packed[0], full[real], atol=ATOL)
        assert torch.allclose(packing.pad(packed)[real], full[real], atol=ATOL)
        first, _ = layer(packing.unpad(x), packing=packing, queries=slice(0, 2), **kw)
        assert torch.allclose(first.view(b, 2, d), full[:, :2], atol=ATOL)
    g_full = torch.autograd.grad(layer(x, mask=mask)[0][:, 0].sum(), x)[0]
    g_packed = torch.autograd.grad(
        layer(packing.unpad(x), mask=mask, packing=packing, queries=slice(0, 1))[0].sum(), x
    )[0]
    assert torch.allclose(g_packed, g_full, atol=ATOL)
    assert Packing.worth_it(pad) and not Packing.worth_it(torch.ones(2, 3)) and not Packing.worth_it(None)
    assert not Packing.worth_it(torch.tensor([[1, 1], [0, 1]]))  # a padded first token: not packed
    with pytest.raises(LmlabError, match="real tokens"):
        packing.take(packing.unpad(x), slice(5, 6))

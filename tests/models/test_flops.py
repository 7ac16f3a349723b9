"""Parameter and FLOP counts from the config, checked against the built models and against
PyTorch's own FLOP counter (``torch.utils.flop_counter``) running the real forward/backward."""

from __future__ import annotations

import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from lmlab.errors import LmlabError
from lmlab.losses import causal_lm_loss, selected_mean_cross_entropy
from lmlab.models import build_model, get_preset
from lmlab.models.encoder.model import masked_rows
from lmlab.models.flops import approx_training_flops, count_parameters, forward_flops, training_flops

FAMILIES = ["bert", "roberta", "albert", "electra", "gpt2", "llama", "t5", "bart"]
SEQ2SEQ = {"t5", "bart"}


def _config(name: str, **kw):
    return get_preset(name, vocab_size=500, dropout=0.0, attn_dropout=0.0, **kw)


def _counted_flops(model, x, **kw) -> int:
    """FLOPs PyTorch counts for a forward pass (:func:`_counted_training_flops`)."""
    return _counted_training_flops(lambda: model(x, **kw), backward=False)


def _counted_training_flops(loss, backward: bool = True) -> int:
    """FLOPs PyTorch counts for ``loss()`` (+ its backward pass); SDPA forced onto its math path so
    the attention products are visible to the counter as ordinary matmuls."""
    with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
        out = loss()
        if backward:
            out.backward()
    return counter.get_total_flops()


@pytest.mark.parametrize("family", FAMILIES)
def test_parameter_count_matches_the_built_model(family):
    for size in ("tiny", "small"):
        cfg = _config(f"{family}-{size}")
        count = count_parameters(cfg)
        model = build_model(cfg)
        assert count.total == model.num_parameters(), (family, size)
        tables = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Embedding))
        assert count.embedding == tables  # tied heads reuse the token table, counted there once
        assert 0 < count.non_embedding < count.total


def test_parameter_count_follows_the_structural_options():
    shared = _config("t5-tiny", share_encoder_decoder=True)
    assert count_parameters(shared).total == build_model(shared).num_parameters()
    assert count_parameters(shared).total < count_parameters(_config("t5-tiny")).total
    gqa = _config("llama-tiny", n_kv_heads=1)
    assert count_parameters(gqa).total == build_model(gqa).num_parameters()
    bare = _config("gpt2-tiny", tie_embeddings=False)
    assert count_parameters(bare, heads=()).total == build_model(bare, heads=()).num_parameters()
    assert count_parameters(bare).total - count_parameters(bare, heads=()).total == 64 * 500


@pytest.mark.parametrize("family", FAMILIES)
def test_forward_flops_equal_pytorch_flop_counter(family):
    cfg = _config(f"{family}-tiny", max_positions=512) if family != "bart" else _config("bart-tiny")
    model = build_model(cfg).eval()
    b, t, t_dec = 2, 24, 8
    x = torch.randint(5, 500, (b, t))
    kw = {"decoder_input_ids": torch.randint(5, 500, (b, t_dec))} if family in SEQ2SEQ else {}
    assert _counted_flops(model, x, **kw) == forward_flops(cfg, t, b, decoder_len=t_dec)


def test_mlm_flops_count_the_head_only_where_labels_are():
    cfg = _config("bert-tiny")
    model = build_model(cfg).train()
    b, t = 3, 32
    x = torch.randint(5, 500, (b, t))
    labels = torch.full((b, t), -100)
    labels[:, ::8] = x[:, ::8]  # 4 labelled positions per row
    counted = _counted_training_flops(  # the MLM objective's way: the head at the labelled rows only
        lambda: selected_mean_cross_entropy(*masked_rows(model.heads["mlm"], model.backbone(x), labels)))
    assert counted == training_flops(cfg, t, b, logit_positions=4)
    assert counted < training_flops(cfg, t, b)  # the full-vocabulary head everywhere costs more


def test_training_is_three_forwards_for_a_decoder():
    cfg = _config("gpt2-tiny")
    model = build_model(cfg).train()
    x = torch.randint(5, 500, (2, 16))
    counted = _counted_training_flops(lambda: causal_lm_loss(model(x).logits, x))
    projections = training_flops(cfg, 16, 2, attention=False)
    # matmuls: exactly 3x; the attention backward of the math path is counted as PyTorch runs it
    assert projections < counted <= training_flops(cfg, 16, 2) * 1.01


def test_rule_of_thumb_matches_the_exact_count_for_a_decoder():
    cfg = _config("llama-small", tie_embeddings=False)
    n = count_parameters(cfg).non_embedding - 2 * cfg.n_layers * cfg.d_model - cfg.d_model  # no norms
    t = 256
    exact = training_flops(cfg, t, 1)
    approx = approx_training_flops(n, t, cfg.n_layers, t, cfg.d_model)
    assert approx == pytest.approx(exact, rel=1e-9)
    assert approx_training_flops(1e6, 1e9) == 6e15


def test_bad_input_is_a_one_line_error():
    with pytest.raises(LmlabError):
        forward_flops(_config("gpt2-tiny"), 0)
    with pytest.raises(LmlabError):
        count_parameters(_config("bert-tiny"), heads=("span",))
    with pytest.raises(LmlabError):
        count_parameters(get_preset("lstm-tiny"))

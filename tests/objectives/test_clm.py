"""Causal LM objective: labels, loss = mean next-token NLL within documents, and it learns real text."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from lmlab.data.packing import pack
from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.objectives import get_objective
from lmlab.objectives.base import mask_of
from lmlab.objectives.clm import CausalLM
from tests.objectives.conftest import model_mask


class _Tok:
    vocab_size = 50
    special_ids = {0, 1}


def test_registry_and_labels_skip_the_first_token_of_each_document():
    assert get_objective("clm") is CausalLM and CausalLM.architectures == ("decoder",)
    batch = pack(np.array([[11, 12, 13, 14, 15]]), np.array([[4, 5, 0, 1, 2]]))
    inputs = CausalLM(_Tok()).prepare(batch, torch.Generator())
    assert inputs["labels"].tolist() == [[-100, 12, -100, 14, 15]]
    assert inputs["position_ids"].tolist() == [[0, 1, 0, 1, 2]]
    assert torch.equal(inputs["doc_ids"], batch.doc_ids)  # the decoder builds the mask from them
    pat = model_mask(inputs, causal=True)[0].int().tolist()
    assert pat == [[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [0, 0, 1, 0, 0], [0, 0, 1, 1, 0], [0, 0, 1, 1, 1]]
    one_doc = CausalLM(_Tok()).prepare(pack(np.array([[1, 2, 3]]), np.array([[0, 1, 2]])))
    assert "doc_ids" not in one_doc  # fast is_causal path


def test_loss_is_the_mean_next_token_nll_within_documents():
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=50, dropout=0.0, attn_dropout=0.0)).eval()
    batch = pack(
        np.random.default_rng(0).integers(2, 50, (2, 12)),
        np.array([[3, 4, 5, 0, 1, 2, 3, 0, 1, 2, 3, 4], list(range(12))]),
    )
    obj = CausalLM(_Tok())
    inputs = obj.prepare(batch)
    with torch.no_grad():
        loss, extra = obj.loss(model, inputs)
        logits = model(inputs["input_ids"], inputs.get("attention_mask"), inputs.get("position_ids"),
                       mask=mask_of(inputs, causal=True)).logits
        logp = F.log_softmax(logits, -1)
    nll = []
    for r in range(2):
        for i in range(1, 12):
            if (
                batch.doc_ids[r, i] == batch.doc_ids[r, i - 1]
            ):  # the first token of a document is not predicted
                nll.append(-logp[r, i - 1, batch.input_ids[r, i]].item())
    assert extra["targets"] == len(nll) == 11 + 11 - 2
    assert loss.item() == pytest_approx(sum(nll) / len(nll))
    assert math.exp(loss.item()) == pytest_approx(math.exp(sum(nll) / len(nll)))


def pytest_approx(x):
    import pytest

    return pytest.approx(x, rel=1e-5)


def test_short_run_lowers_validation_loss_on_real_text(data_dir, tmp_path):
    """Raw text in, tokenizer trained by the run: 40 steps on Shakespeare lower the WikiText-2 val loss."""
    from lmlab.train import pretrain

    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    wiki = (data_dir / "pretrain" / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    (tmp_path / "train.txt").write_text(text[:150_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(wiki[:30_000], encoding="utf-8")
    config = {
        "model": {
            "preset": "gpt2-tiny",
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "d_ff": 64,
            "dropout": 0.0,
        },
        "objective": {"name": "clm"},
        "data": {
            "train": [str(tmp_path / "train.txt")],
            "val": [str(tmp_path / "val.txt")],
            "tokenizer": {"algo": "bytelevel", "vocab_size": 300},
        },
        "train": {
            "max_steps": 40,
            "batch_size": 8,
            "seq_len": 32,
            "lr": 1e-2,
            "warmup_steps": 4,
            "eval_every": 40,
            "eval_batches": 4,
            "threads": 1,
            "precision": "fp32",
            "progress": "off",
        },
    }
    s = pretrain(config, tmp_path / "run", log=lambda m: None)
    assert (tmp_path / "run" / "data" / "tokenizer" / "tokenizer.json").is_file()
    # from about ln(300) = 5.7 at initialisation to clearly lower on held-out WikiText
    assert s["initial_val_loss"] > 5.3
    assert s["val_loss"] < s["initial_val_loss"] - 1.0, s
    assert s["val_ppl"] == pytest_approx(math.exp(s["val_loss"]))


def test_the_base_objectives_default_loss_scores_the_first_head_without_the_deprecated_path():
    """A new objective that only writes prepare() gets Objective.loss: the model's first head scored
    with lmlab.losses, the same number as CLM's own loss, and no DeprecationWarning (the default
    once read the model's deprecated forward(labels=...))."""
    import warnings

    from lmlab.objectives.base import Objective

    class PrepareOnly(CausalLM):
        loss = Objective.loss

    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=50, dropout=0.0, attn_dropout=0.0)).eval()
    batch = pack(np.random.default_rng(0).integers(2, 50, (2, 12)), np.tile(np.arange(12), (2, 1)))
    inputs = CausalLM(_Tok()).prepare(batch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        default, _ = PrepareOnly(_Tok()).loss(model, inputs)
    assert torch.allclose(default, CausalLM(_Tok()).loss(model, inputs)[0], atol=1e-6)
    with pytest.raises(LmlabError, match="no labels"):
        PrepareOnly(_Tok()).loss(model, {"input_ids": inputs["input_ids"]})

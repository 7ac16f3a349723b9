"""Fine-tuning (full and LoRA) and preference tuning (DPO) in bf16 autocast on CUDA."""

from __future__ import annotations

import json
import math

import pytest
import torch
from cuda_tier import labelled_lines, tiny_model, tiny_tokenizer

from lmlab.align import PreferencePair, align
from lmlab.finetune import evaluate, finetune

pytestmark = pytest.mark.cuda
QUIET = {"progress": False, "log": lambda m: None}


@pytest.fixture(scope="module")
def tok(corpus):
    return tiny_tokenizer(corpus)


@pytest.mark.parametrize("method, preset", [("full", "bert-tiny"), ("full", "gpt2-tiny"),
                                            ("lora", "bert-tiny")])
def test_finetune_in_bf16_on_cuda(method, preset, tok, corpus, tmp_path):
    train, dev = labelled_lines(corpus, 400), labelled_lines(corpus, 100, offset=400)
    out = tmp_path / "ft"
    res = finetune(tiny_model(preset, tok), "classification", train, dev, out, method=method,
                   device="cuda", precision="bf16", epochs=2, batch_size=16, lr=1e-3, max_length=48,
                   select_on="train-slice", **QUIET)
    summary = json.loads((out / "finetune.json").read_text())
    assert summary["machine"]["device"].startswith("cuda") and summary["machine"]["precision"] == "bf16"
    assert summary["selection"]["data"] == "train-slice"
    assert all(math.isfinite(v) for v in res.metrics.values())
    assert next(res.model.parameters()).device.type == "cuda"
    losses = [r["loss"] for r in res.history if "loss" in r]
    assert all(math.isfinite(x) for x in losses) and losses[0] != losses[-1]
    # the saved model scores the same on CUDA as the run reported (bf16 autocast apart)
    again = evaluate(out, dev, device="cuda")
    assert again["accuracy"] == pytest.approx(res.metrics["accuracy"], abs=0.03)


def _pairs(n: int, seed: int) -> list[PreferencePair]:
    import random

    rng = random.Random(seed)
    words = ["king", "love", "night", "sword", "lord", "sweet", "death", "queen"]
    good = {"king", "love", "lord", "sweet"}
    out = []
    for _ in range(n):
        w = rng.choice(words)
        yes, no = (" yes", " no") if w in good else (" no", " yes")
        out.append(PreferencePair(f"{w}:", yes, no))
    return out


@pytest.mark.parametrize("preset", ["gpt2-tiny", "t5-tiny"])
def test_dpo_in_bf16_on_cuda(preset, tok):
    res = align(tiny_model(preset, tok), _pairs(64, 0), _pairs(24, 1), None, max_steps=6, batch_size=8,
                lr=1e-3, device="cuda", precision="bf16", eval_every=3, **QUIET)
    assert res.start["loss"] == pytest.approx(math.log(2), abs=1e-3)  # policy = reference at step 0
    assert math.isfinite(res.metrics["loss"]) and res.metrics["margin"] != 0
    assert next(res.model.parameters()).device.type == "cuda"
    assert all(not p.requires_grad for p in res.reference.parameters())
    assert torch.cuda.is_available()

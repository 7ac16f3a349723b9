"""The machine a pretraining run used is recorded, and its randomness does not depend on it:
the same recipe and seed give the same losses on 1 thread and on 5, with dropout on."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.runtime import set_threads
from lmlab.train import pretrain


def _losses(run_dir) -> list[float]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in rows if "loss" in r]


def test_same_seed_same_losses_on_1_and_5_threads_with_dropout(tiny_config, tmp_path):
    before = torch.get_num_threads()
    try:
        runs = {n: pretrain(tiny_config(max_steps=3, eval_every=3, threads=n), tmp_path / f"t{n}",
                            log=lambda m: None) for n in (1, 5)}
    finally:
        set_threads(before)  # the test process's own count, put back
    one, five = _losses(tmp_path / "t1"), _losses(tmp_path / "t5")
    assert len(one) == len(five) == 3
    assert five == pytest.approx(one, rel=1e-6)
    assert runs[5]["val_loss"] == pytest.approx(runs[1]["val_loss"], rel=1e-6)
    # what each run ran on is in its summary
    assert runs[1]["machine"]["threads"] == 1 and runs[5]["machine"]["threads"] == 5
    assert runs[5]["machine"]["device"] == "cpu" and runs[5]["machine"]["precision"] == "fp32"
    assert runs[5]["machine"]["reasons"]["threads"] == "5 (requested)"
    written = json.loads((tmp_path / "t5" / "summary.json").read_text())
    assert written["machine"] == runs[5]["machine"]

"""The machine a pretraining run used is recorded, and its randomness does not depend on it:
the same recipe and seed give the same losses on 1 thread and on 5, with dropout on."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.runtime import set_threads
from lmlab.train import pretrain


def _losses(run_dir) -> list[float]:
    rows = map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())
    return [r["loss"] for r in rows if "loss" in r]


def test_same_seed_same_losses_on_1_and_5_threads_with_dropout(tiny_config, tmp_path, monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # the reason says when it is not used
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
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


def test_omp_num_threads_is_the_thread_count_a_run_uses_and_says(tiny_config, tmp_path, monkeypatch):
    """train.threads = 0 with OMP_NUM_THREADS set: the variable applies, and the log says so (it used
    to be replaced by the automatic count, unnamed); a value that is no count is refused before any
    work, leaving no run folder."""
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    with pytest.raises(LmlabError, match=r"^OMP_NUM_THREADS='abc' is not a whole number"):
        pretrain(tiny_config(threads=0), tmp_path / "bad", log=lambda m: None)
    assert not (tmp_path / "bad").exists()
    before, lines = torch.get_num_threads(), []
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    try:
        set_threads(2)
        summary = pretrain(tiny_config(threads=0, max_steps=1, eval_every=1, checkpoint_every=1),
                           tmp_path / "r", log=lines.append)
    finally:
        set_threads(before)
    assert "threads: 1 (OMP_NUM_THREADS=1)" in lines
    assert summary["machine"]["threads"] == 1

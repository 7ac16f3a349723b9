"""Objectives that prepare their inputs on the host (``prepare_on_host``) do it in the trainer's
data path, a step ahead on the prefetch thread, and a run stays a pure function of its config:
the same with prefetching on or off, and the same when interrupted and resumed."""

from __future__ import annotations

import json
import threading

from lmlab.objectives.electra import Electra
from lmlab.train import pretrain

QUIET = lambda m: None  # noqa: E731


def _electra(tiny_config, **train):
    """ELECTRA: masking on the host, then sampling from the generator on the device."""
    cfg = tiny_config(**train)
    cfg["model"] = {"preset": "electra-tiny", "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64,
                    "max_positions": 64, "dropout": 0.1, "attn_dropout": 0.0}
    cfg["objective"] = {"name": "electra"}
    return cfg


def _rows(run_dir):
    keys = ("step", "loss", "grad_norm", "val_loss", "gen_loss", "disc_loss", "disc_auc")
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [{k: r.get(k) for k in keys} for r in rows]


def test_preparation_runs_on_the_prefetch_thread_and_changes_nothing(tiny_config, tmp_path, monkeypatch):
    plain = tmp_path / "plain"
    pretrain(_electra(tiny_config, max_steps=4, grad_accum=2, prefetch=False), plain, log=QUIET)
    where = []
    original = Electra.prepare

    def prepare(self, batch, generator):
        where.append((threading.current_thread().name, batch.input_ids.device.type, generator.device.type))
        return original(self, batch, generator)

    monkeypatch.setattr(Electra, "prepare", prepare)
    ahead = tmp_path / "ahead"
    pretrain(_electra(tiny_config, max_steps=4, grad_accum=2), ahead, log=QUIET)
    assert _rows(ahead) == _rows(plain)
    assert len({r["loss"] for r in _rows(plain)}) == 4  # the loss moved: the comparison can fail
    # 4 steps x 2 micro-batches (+ evaluation batches on the main thread), all prepared on the CPU;
    # every training micro-batch after the first step's on the background thread
    assert {(dev, gen) for _, dev, gen in where} == {("cpu", "cpu")}
    on_thread = [name for name, _, _ in where if name.startswith("lmlab-prefetch")]
    assert len(on_thread) == 3 * 2


def test_a_resumed_run_repeats_the_uninterrupted_one(tiny_config, tmp_path):
    every = {"checkpoint_every": 2, "eval_every": 2}
    full = pretrain(_electra(tiny_config, max_steps=4, **every), tmp_path / "full", log=QUIET)
    pretrain(_electra(tiny_config, max_steps=2, **every), tmp_path / "part", log=QUIET)
    resumed = pretrain(_electra(tiny_config, max_steps=4, **every), tmp_path / "part", resume=True, log=QUIET)
    assert _rows(tmp_path / "part") == _rows(tmp_path / "full")
    assert resumed["val_loss"] == full["val_loss"]

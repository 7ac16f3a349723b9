"""DDP: 2 processes (gloo, CPU) train exactly like 1 process with the same global batch."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from lmlab.train import pretrain

WORKER = """
import json, sys
from lmlab.train import pretrain
cfg, out = json.loads(sys.argv[1]), sys.argv[2]
pretrain(cfg, out, log=lambda m: None)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_gloo_processes_match_one_process_with_the_same_global_batch(tiny_config, tmp_path):
    steps = 4
    # one process: 2 micro-batches of 4 rows per step = global batch 8
    pretrain(
        tiny_config(max_steps=steps, grad_accum=2, eval_every=2, checkpoint_every=4),
        tmp_path / "one",
        log=lambda m: None,
    )
    # two processes: 4 rows each, no accumulation = global batch 8
    cfg = tiny_config(max_steps=steps, grad_accum=1, eval_every=2, checkpoint_every=4, distributed="ddp")
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            WORLD_SIZE="2",
            LOCAL_RANK=str(rank),
            LOCAL_WORLD_SIZE="2",
            OMP_NUM_THREADS="1",
        )
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", WORKER, json.dumps(cfg), str(tmp_path / "two")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    outs = [p.communicate(timeout=240)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    one, two = _rows(tmp_path / "one" / "metrics.jsonl"), _rows(tmp_path / "two" / "metrics.jsonl")
    assert [r["step"] for r in two] == list(range(1, steps + 1))
    for a, b in zip(one, two):
        assert b["tokens"] == a["tokens"] == a["step"] * 8 * 32
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4)
    for step in (2, 4):  # evaluation is split over the ranks and gathered
        assert two[step - 1]["val_loss"] == pytest.approx(one[step - 1]["val_loss"], abs=1e-5)
    assert one[0]["loss"] != one[-1]["loss"]
    summary = json.loads((tmp_path / "two" / "summary.json").read_text())
    assert summary["world_size"] == 2

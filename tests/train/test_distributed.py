"""DDP and FSDP: 2 processes (gloo, CPU) train exactly like 1 process with the same global batch,
and an FSDP run resumes from its sharded checkpoint exactly."""

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
pretrain(cfg, out, resume=sys.argv[3] == "resume", log=lambda m: None)
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
    _two_processes(cfg, tmp_path / "two")
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


def _two_processes(cfg, out, resume=False):
    port = _free_port()
    procs = []
    for rank in range(2):
        env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE="2",
                   LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, "-c", WORKER, json.dumps(cfg), str(out),
                                       "resume" if resume else "new"],
                                      env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:  # a hung collective: stop both ranks, then fail
            p.kill()
        pytest.fail("the two processes did not finish within 240 s (a rank waiting on a collective?)")
    assert all(p.returncode == 0 for p in procs), outs


def test_fsdp_matches_one_process_and_resumes_from_its_shards_exactly(tiny_config, tmp_path):
    one_cfg = tiny_config(max_steps=4, grad_accum=2, eval_every=2, checkpoint_every=2)
    pretrain(one_cfg, tmp_path / "one", log=lambda m: None)
    fsdp = dict(max_steps=4, grad_accum=1, eval_every=2, checkpoint_every=2, distributed="fsdp")
    _two_processes(tiny_config(**fsdp), tmp_path / "full")
    # the same run "killed" after step 2, then resumed by two new processes
    _two_processes(tiny_config(**{**fsdp, "max_steps": 2}), tmp_path / "part")
    step2 = tmp_path / "part" / "checkpoints" / "step_2"
    assert (step2 / "sharded").is_dir() and (step2 / "model.safetensors").is_file()
    assert not [p for p in (tmp_path / "part" / "checkpoints").iterdir() if p.name.startswith(".")]
    _two_processes(tiny_config(**fsdp), tmp_path / "part", resume=True)
    one, full, part = (_rows(tmp_path / d / "metrics.jsonl") for d in ("one", "full", "part"))
    assert [r["step"] for r in part] == [r["step"] for r in full] == [1, 2, 3, 4]
    for a, b, c in zip(one, full, part):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)           # sharding changes nothing
        assert c["loss"] == pytest.approx(b["loss"], abs=1e-6)           # nor does resuming
        assert c["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-6)
    assert part[-1]["val_loss"] == pytest.approx(full[-1]["val_loss"], abs=1e-6)
    assert one[0]["loss"] != one[-1]["loss"]
    # the gathered weights are an ordinary checkpoint; a plain run cannot resume sharded state
    from lmlab.loading import load_model

    assert load_model(step2).num_parameters() > 0
    from lmlab.errors import LmlabError

    with pytest.raises(LmlabError, match="FSDP"):
        pretrain(tiny_config(max_steps=4), tmp_path / "part", resume=True, log=lambda m: None)


def test_ranks_with_unequal_evaluation_windows_do_not_hang(tiny_config, tmp_path):
    """3 evaluation windows of 1 row over 2 ranks: rank 0 has 2 batches, rank 1 one. Under FSDP every
    forward gathers weights from both ranks, so rank 1 must join rank 0's second forward (it hung)."""
    cfg = tiny_config(max_steps=2, batch_size=1, eval_batches=3, eval_every=1, checkpoint_every=2,
                      distributed="fsdp")
    _two_processes(cfg, tmp_path / "run")  # times out (and fails) if a rank waits forever
    rows = _rows(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2] and all("val_loss" in r for r in rows)
    one = pretrain(tiny_config(max_steps=2, batch_size=1, grad_accum=2, eval_batches=3, eval_every=1,
                               checkpoint_every=2), tmp_path / "one", log=lambda m: None)
    # the stand-in batch of the short rank is not scored: the same mean as one process
    assert rows[-1]["val_loss"] == pytest.approx(one["val_loss"], abs=1e-5)

"""torchrun on the GPU(s) with NCCL: DDP and FSDP2 train as one process does with the same global
batch, and an FSDP run resumes from its DCP shards exactly. World size 2 where there are two GPUs,
1 where one GPU is all there is (torchrun's single process still joins an NCCL group of one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from cuda_tier import QUIET, rows, run_config

from lmlab.train import pretrain

pytestmark = pytest.mark.cuda

WORKER = """
import json, sys
from lmlab.train import pretrain
cfg, out = json.loads(sys.argv[1]), sys.argv[2]
pretrain(cfg, out, resume=sys.argv[3] == "resume", log=print)
"""


def _world() -> int:
    return min(2, torch.cuda.device_count())


def _torchrun(tmp_path, cfg, out, resume=False) -> str:
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(_world()),
           str(script), json.dumps(cfg), str(out), "resume" if resume else "new"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _config(corpus, **train):
    """fp32 (exact comparisons); each process gets batch_size rows, the one process grad_accum x."""
    settings = {"precision": "fp32", "max_steps": 4, "eval_every": 2, "checkpoint_every": 2, **train}
    return run_config("clm", corpus, **settings)


@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_torchrun_nccl_matches_one_process(mode, corpus, tmp_path):
    world = _world()
    pretrain(_config(corpus, grad_accum=world), tmp_path / "one", log=QUIET)
    said = _torchrun(tmp_path, _config(corpus, distributed=mode), tmp_path / "run")
    assert f"{world} process(es), mode {mode}" in said, said[-2000:]
    one, run = rows(tmp_path / "one"), rows(tmp_path / "run")
    assert [r["step"] for r in run] == [1, 2, 3, 4]
    for a, b in zip(one, run):
        assert b["tokens"] == a["tokens"]
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4)
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == world and summary["machine"]["device"].startswith("cuda")


def test_fsdp_resumes_from_its_dcp_shards_exactly(corpus, tmp_path):
    cfg = dict(distributed="fsdp")
    _torchrun(tmp_path, _config(corpus, **cfg), tmp_path / "full")
    _torchrun(tmp_path, _config(corpus, **{**cfg, "max_steps": 2}), tmp_path / "part")
    assert (tmp_path / "part" / "checkpoints" / "step_2" / "sharded").is_dir()
    _torchrun(tmp_path, _config(corpus, **cfg), tmp_path / "part", resume=True)
    full, part = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in part] == [1, 2, 3, 4]
    for a, b in zip(full, part):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    assert part[-1]["val_loss"] == pytest.approx(full[-1]["val_loss"], abs=1e-5)

"""torchrun with one process (the one GPU of a machine, or here one CPU process on gloo) joins a
process group of one: DDP/FSDP, the collectives and the sharded (DCP) checkpoints run for real, and
an FSDP run resumes from its shards exactly (lmlab.train.distributed.init)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from lmlab.train import pretrain

WORKER = """
import json, sys
from lmlab.train import pretrain
cfg, out = json.loads(sys.argv[1]), sys.argv[2]
pretrain(cfg, out, resume=sys.argv[3] == "resume", log=print)
"""


def _torchrun(tmp_path, cfg, out, resume=False) -> str:
    script = tmp_path / "worker.py"
    script.write_text(WORKER, encoding="utf-8")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "1",
           str(script), json.dumps(cfg), str(out), "resume" if resume else "new"]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_one_torchrun_process_shards_with_fsdp_and_resumes_from_dcp(tiny_config, tmp_path):
    one = tiny_config(max_steps=4, eval_every=2, checkpoint_every=2)
    pretrain(one, tmp_path / "one", log=lambda m: None)
    fsdp = dict(max_steps=4, eval_every=2, checkpoint_every=2, distributed="fsdp")
    said = _torchrun(tmp_path, tiny_config(**{**fsdp, "max_steps": 2}), tmp_path / "part")
    assert "1 process(es), mode fsdp" in said  # a group of one, not a plain single process
    assert (tmp_path / "part" / "checkpoints" / "step_2" / "sharded").is_dir()  # written through DCP
    _torchrun(tmp_path, tiny_config(**fsdp), tmp_path / "part", resume=True)
    a, b = _rows(tmp_path / "one" / "metrics.jsonl"), _rows(tmp_path / "part" / "metrics.jsonl")
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-5)
    assert b[-1]["val_loss"] == pytest.approx(a[-1]["val_loss"], abs=1e-5)
    assert a[0]["loss"] != a[-1]["loss"]

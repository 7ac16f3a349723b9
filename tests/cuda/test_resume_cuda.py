"""Stop and resume on CUDA: the resumed run repeats the uninterrupted one (dropout on, so the CUDA
generator's state is part of what a checkpoint must bring back)."""

from __future__ import annotations

import pytest
from cuda_tier import QUIET, rows, run_config

from lmlab.train import pretrain

pytestmark = pytest.mark.cuda


@pytest.mark.parametrize("objective", ["clm", "electra"])
def test_a_resumed_cuda_run_repeats_the_uninterrupted_one(objective, corpus, tmp_path):
    every = {"checkpoint_every": 3, "eval_every": 3, "precision": "fp32"}

    def cfg(steps):
        c = run_config(objective, corpus, max_steps=steps, **every)
        c["model"].update(dropout=0.1)
        return c

    full = pretrain(cfg(6), tmp_path / "full", log=QUIET)
    pretrain(cfg(3), tmp_path / "part", log=QUIET)
    resumed = pretrain(cfg(6), tmp_path / "part", resume=True, log=QUIET)
    a, b = rows(tmp_path / "full"), rows(tmp_path / "part")
    assert [r["step"] for r in b] == [r["step"] for r in a] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b):
        assert y["loss"] == pytest.approx(x["loss"], abs=1e-5), x["step"]
        assert y["lr"] == x["lr"]
    assert resumed["val_loss"] == pytest.approx(full["val_loss"], abs=1e-5)
    assert a[0]["loss"] != a[-1]["loss"]

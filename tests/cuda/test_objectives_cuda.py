"""Every pretraining objective trains on CUDA in bf16 autocast, eager and under train.compile."""

from __future__ import annotations

import pytest
from cuda_tier import QUIET, RECIPES, finite, rows, run_config

from lmlab.objectives import OBJECTIVES
from lmlab.train import pretrain

pytestmark = pytest.mark.cuda


def test_the_tier_covers_every_objective():
    assert set(RECIPES) == set(OBJECTIVES)


@pytest.mark.parametrize("objective", list(RECIPES))
def test_objective_trains_on_cuda_in_bf16_eager_and_compiled(objective, corpus, tmp_path):
    runs = {}
    for mode, compiled in (("eager", False), ("compiled", True)):
        summary = pretrain(run_config(objective, corpus, compile=compiled), tmp_path / mode, log=QUIET)
        runs[mode] = (summary, rows(tmp_path / mode))
    for summary, steps in runs.values():
        assert [r["step"] for r in steps] == [1, 2, 3]
        assert all(finite(r["loss"]) and finite(r["grad_norm"]) for r in steps)
        assert finite(summary["val_loss"])
        assert summary["machine"]["device"].startswith("cuda") and summary["machine"]["precision"] == "bf16"
    eager, compiled = runs["eager"][1], runs["compiled"][1]
    # the same weights and batch: the compiled step computes the first loss the eager one does
    # (bf16 rounding apart); the loss then moves in both
    assert compiled[0]["loss"] == pytest.approx(eager[0]["loss"], rel=3e-2)
    assert eager[0]["loss"] != eager[-1]["loss"]

"""Under torchrun every process runs the command; the summary is printed by rank 0 only (issue 27)."""

from __future__ import annotations

import lmlab.train
from lmlab.cli import main
from lmlab.cli.common import is_main_process

SUMMARY = {"steps": 2, "tokens": 512, "seconds": 1.0, "train_loss": 5.0, "checkpoint": "run/step_2"}


def test_the_pretraining_summary_is_printed_by_rank_zero_only(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(lmlab.train, "pretrain", lambda *args, **kwargs: SUMMARY)
    monkeypatch.setenv("WORLD_SIZE", "2")
    command = ["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(tmp_path / "run")]
    monkeypatch.setenv("RANK", "1")
    assert main(command) == 0
    assert capsys.readouterr().out == ""
    monkeypatch.setenv("RANK", "0")
    assert main(command) == 0
    assert capsys.readouterr().out.startswith("trained 2 steps, 512 tokens")


def test_which_process_is_the_main_one(monkeypatch):
    monkeypatch.delenv("RANK", raising=False)
    assert is_main_process()
    for rank, main_one in (("0", True), ("3", False), ("", True), ("x", True)):
        monkeypatch.setenv("RANK", rank)
        assert is_main_process() is main_one

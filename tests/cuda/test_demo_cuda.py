"""`lmlab demo --device cuda`: the built-in example pretrains and samples on the GPU."""

from __future__ import annotations

import json

import pytest

from lmlab.cli import main

pytestmark = pytest.mark.cuda


def test_demo_on_cuda(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--device", "cuda", "--steps", "20", "--vocab-size", "400", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "[3/3] sampling" in printed and "done in" in printed
    summary = json.loads((out / "run" / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["machine"]["device"].startswith("cuda")
    assert summary["val_loss"] < summary["initial_val_loss"]

"""`lmlab demo --device`: where the demo pretrains and samples (auto: a GPU when there is one);
the CUDA tier runs `lmlab demo --device cuda` (tests/cuda/test_demo_cuda.py)."""

from __future__ import annotations

from pathlib import Path

from lmlab.cli import main
from lmlab.demo import demo_config


def test_demo_takes_a_device_and_passes_it_to_the_run(tmp_path, monkeypatch):
    import lmlab.demo

    seen = {}
    monkeypatch.setattr(lmlab.demo, "run_demo", lambda *a, **k: seen.update(k) or {})
    assert main(["demo", "--device", "cpu", "--out", str(tmp_path / "d"), "--steps", "5"]) == 0
    assert seen["device"] == "cpu" and seen["steps"] == 5
    assert main(["demo", "--out", str(tmp_path / "d")]) == 0 and seen["device"] == "auto"
    assert demo_config(Path("x"), 10, "cuda:1")["train"]["device"] == "cuda:1"


def test_a_bad_device_is_refused_before_any_work(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit) as stopped:
        main(["demo", "--device", "tpu", "--out", str(tmp_path / "d")])
    err = capsys.readouterr().err.strip()
    assert stopped.value.code == 2 and err.startswith("error: argument --device:") and "\n" not in err
    assert not (tmp_path / "d").exists()

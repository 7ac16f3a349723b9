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


def test_a_device_this_machine_lacks_is_refused_before_the_tokenizer_and_leaves_no_folder(tmp_path, capsys,
                                                                                         monkeypatch):
    """`lmlab demo --device mps` on a machine without MPS trained the tokenizer, then stopped and left
    the folder filled; the device is now checked first (lmlab.runtime.check_device)."""
    import torch

    import lmlab.tokenizers

    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    monkeypatch.setattr(lmlab.tokenizers, "train_tokenizer",
                        lambda *a, **k: (_ for _ in ()).throw(AssertionError("tokenizer trained")))
    out = tmp_path / "dm"
    assert main(["demo", "--device", "mps", "--out", str(out), "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: device mps asked for but MPS is not available") and "\n" not in err
    assert not out.exists()


def test_other_device_takers_check_the_device_before_loading(monkeypatch):
    """The harness and the fine-tuned scorers (Python API as the CLI) refuse the device first."""
    import pytest
    import torch

    from lmlab.errors import LmlabError
    from lmlab.finetune import scoring, variants
    from lmlab.icl import harness

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for call in (lambda: harness.run_harness("no-such-checkpoint", ["nope"], device="cuda"),
                 lambda: scoring.evaluate("no-such-checkpoint", "x.tsv", device="cuda"),
                 lambda: variants.evaluate_variants("no-such-checkpoint", {"a": "nowhere"}, "x.tsv",
                                                    device="cuda")):
        with pytest.raises(LmlabError, match="CUDA is not available"):
            call()

"""train.compile, train.activation_checkpointing and the MFU column: the same training, faster
or in less memory, and the utilisation logged where it can be known."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.cli import main
from lmlab.objectives import get_objective
from lmlab.train import pretrain
from lmlab.train.device import peak_tflops

QUIET = lambda m: None  # noqa: E731


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_compiled_training_repeats_the_eager_one(tiny_config, tmp_path):
    eager = _rows(_run(pretrain(tiny_config(max_steps=4), tmp_path / "eager", log=QUIET)))
    # aot_eager traces forward and backward through dynamo and AOTAutograd like inductor does,
    # without the C++ build (inductor itself is exercised in benchmarks/)
    compiled = _rows(_run(pretrain(tiny_config(max_steps=4, compile=True, compile_backend="aot_eager"),
                                   tmp_path / "compiled", log=QUIET)))
    assert [r["step"] for r in compiled] == [r["step"] for r in eager]
    for a, b in zip(eager, compiled):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-5)
    assert compiled[-1]["val_loss"] == pytest.approx(eager[-1]["val_loss"], abs=1e-5)


def test_activation_checkpointing_changes_nothing_but_memory(tiny_config, tmp_path):
    plain = _rows(_run(pretrain(tiny_config(max_steps=4), tmp_path / "plain", log=QUIET)))
    lines = []
    ckpt = _rows(_run(pretrain(tiny_config(max_steps=4, activation_checkpointing=True), tmp_path / "ckpt",
                               log=lines.append)))
    assert any("activation checkpointing: 1 Transformer block" in line for line in lines)
    assert len(plain) == len(ckpt) == 4
    for a, b in zip(plain, ckpt):
        assert b["loss"] == pytest.approx(a["loss"], abs=1e-6)
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-5)


def test_mfu_is_logged_against_the_given_peak_and_only_then(tiny_config, tmp_path):
    rows = _rows(_run(pretrain(tiny_config(max_steps=3, peak_tflops=0.05), tmp_path / "peak", log=QUIET)))
    flops = get_objective("clm").step_flops(_model_config(tmp_path / "peak"), 32, 4, {})
    for r in rows:
        # the achieved rate is the objective's FLOPs over the step's time, MFU its share of the peak
        assert r["tflops"] == pytest.approx(flops / 1e12 * r["tokens_per_s"] / (4 * 32), rel=0.02)
        assert r["mfu"] == pytest.approx(r["tflops"] / 0.05, rel=0.01)
    summary = json.loads((tmp_path / "peak" / "summary.json").read_text())
    assert 0 < summary["mfu"] and summary["tflops"] > 0
    no_peak = _rows(_run(pretrain(tiny_config(max_steps=2), tmp_path / "cpu", log=QUIET)))
    assert "tflops" in no_peak[-1] and "mfu" not in no_peak[-1]  # a CPU's peak is not known


def test_peak_table(monkeypatch):
    assert peak_tflops(torch.device("cpu"), None) is None
    assert peak_tflops(torch.device("cpu"), torch.bfloat16, given=12.5) == 12.5
    gpu = torch.device("cuda", 0)
    for name, half, tf32 in (("NVIDIA H100 80GB HBM3", 989.4, 494.7), ("NVIDIA H100 PCIe", 756.0, 378.0),
                             ("NVIDIA A100-SXM4-40GB", 312.0, 156.0)):
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None, n=name: n)
        assert peak_tflops(gpu, torch.bfloat16) == half and peak_tflops(gpu, None) == tf32
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert peak_tflops(gpu, torch.bfloat16) is None


def test_an_unknown_compile_backend_is_one_line(tiny_config, tmp_path, capsys):
    cfg = tmp_path / "run.toml"
    from lmlab.train.config import load_config, to_toml

    cfg.write_text(to_toml(load_config(tiny_config())))
    code = main(["pretrain", "--config", str(cfg), "--out", str(tmp_path / "r"),
                 "--set", "train.compile=true", "train.compile_backend=inductr"])
    err = capsys.readouterr().err
    assert code == 2 and "inductor" in err
    assert err.startswith("error: --set train.compile_backend must be one of inductor, aot_eager, eager")
    assert "(did you mean inductor?) (got 'inductr')" in err
    assert not (tmp_path / "r").exists()


def _run(summary):
    from pathlib import Path

    return Path(summary["run_dir"])


def _model_config(run_dir):
    from lmlab.loading import load_model

    return load_model(run_dir / "checkpoints" / "step_3").config


def test_prefetching_reads_the_next_steps_data_on_a_thread_without_changing_the_run(tiny_config, tmp_path,
                                                                                    monkeypatch):
    import threading

    from lmlab.data.packing import PackedWindows

    plain = _rows(_run(pretrain(tiny_config(max_steps=6, grad_accum=2, prefetch=False), tmp_path / "plain",
                                log=QUIET)))
    readers = []
    original = PackedWindows.batch

    def batch(self, position, rows):
        readers.append((position, threading.current_thread().name))
        return original(self, position, rows)

    monkeypatch.setattr(PackedWindows, "batch", batch)
    ahead = _rows(_run(pretrain(tiny_config(max_steps=6, grad_accum=2), tmp_path / "ahead", log=QUIET)))
    keys = ("step", "loss", "grad_norm", "val_loss", "lr")
    assert [{k: r.get(k) for k in keys} for r in ahead] == [{k: r.get(k) for k in keys} for r in plain]
    # 6 steps x 2 micro-batches, each read once; all but the first step's on the background thread
    assert sorted(p for p, _ in readers) == [4 * i for i in range(12)]
    on_thread = [p for p, name in readers if name.startswith("lmlab-prefetch")]
    assert sorted(on_thread) == [4 * i for i in range(2, 12)]
    assert not any(t.name.startswith("lmlab-prefetch") for t in threading.enumerate())  # closed at the end

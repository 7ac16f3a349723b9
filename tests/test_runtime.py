"""Device / precision / thread decisions: each one explained, the bf16 decision made from a
measurement (faked here where the test needs a given outcome), bad requests a one-line error."""

from __future__ import annotations

import os
import time

import pytest
import torch

from lmlab import runtime
from lmlab.errors import LmlabError


def test_physical_cores_within_what_the_process_may_use():
    n = runtime.physical_cores()
    assert 1 <= n <= len(os.sched_getaffinity(0)) <= (os.cpu_count() or n)


@pytest.mark.parametrize(("text", "want"), [("200000 100000", 2), ("150000 100000", 2),
                                           ("50000 100000", 1), ("max 100000", None), ("", None)])
def test_cgroup_quota_parsing(tmp_path, text, want):
    path = tmp_path / "cpu.max"
    path.write_text(text + "\n")
    assert runtime._cgroup_cpu_limit(path) == want
    assert runtime._cgroup_cpu_limit(tmp_path / "missing") is None


def test_choose_threads_default_is_physical_cores_and_says_why():
    n, reason = runtime.choose_threads()
    assert n == runtime.physical_cores()
    assert "physical cores" in reason
    assert runtime.choose_threads(3) == (3, "3 (requested)")
    with pytest.raises(LmlabError, match="positive"):
        runtime.choose_threads(0)


def test_auto_dtype_follows_the_measured_speed(monkeypatch):
    monkeypatch.setattr(runtime, "bf16_speedup", lambda device: (0.01, 50e9, 0.5e9))
    dtype, reason = runtime.choose_dtype("auto", "cpu")
    assert dtype is torch.float32 and "0.01x" in reason and "0.5 GFLOP/s" in reason
    monkeypatch.setattr(runtime, "bf16_speedup", lambda device: (3.0, 20e9, 60e9))
    dtype, reason = runtime.choose_dtype("auto", "cpu")
    assert dtype is torch.bfloat16 and "3.00x" in reason
    monkeypatch.setattr(runtime, "bf16_speedup", lambda device: (0.5, 20e9, 10e9))
    dtype, reason = runtime.choose_dtype("bf16", "cpu")  # honoured, with a warning
    assert dtype is torch.bfloat16 and "WARNING" in reason


def test_explicit_fp32_needs_no_probe(monkeypatch):
    def boom(device):
        raise AssertionError("probe should not run")

    monkeypatch.setattr(runtime, "bf16_speedup", boom)
    assert runtime.choose_dtype("fp32")[0] is torch.float32
    with pytest.raises(LmlabError, match="precision"):
        runtime.choose_dtype("fp8")


def test_real_probe_is_quick_and_consistent():
    start = time.perf_counter()
    ratio, fp32, bf16 = runtime.bf16_speedup("cpu", n=128)
    assert time.perf_counter() - start < 10
    assert fp32 > 0 and bf16 > 0 and ratio == pytest.approx(bf16 / fp32)
    # the probe bounds its time even when a dtype is very slow
    start = time.perf_counter()
    runtime.matmul_flops(torch.float32, 256, min_seconds=5.0, repeats=3, max_seconds=0.2)
    assert time.perf_counter() - start < 2.0


def test_configure_applies_threads_and_explains_everything():
    before = torch.get_num_threads()
    try:
        choice = runtime.configure(device="cpu", dtype="fp32", threads=1)
        assert torch.get_num_threads() == 1
        assert choice.device == torch.device("cpu") and choice.dtype is torch.float32
        assert choice.autocast_dtype is None
        assert set(choice.reasons) == {"device", "dtype", "threads"}
        assert "requested" in choice.describe()
    finally:
        torch.set_num_threads(before)


def test_unavailable_device_is_a_one_line_error():
    if not torch.cuda.is_available():
        with pytest.raises(LmlabError, match="CUDA is not available"):
            runtime.choose_device("cuda")
    with pytest.raises(LmlabError, match="unknown device"):
        runtime.choose_device("tpu9")
    device, reason = runtime.choose_device("auto")
    assert device.type in ("cpu", "cuda") and reason

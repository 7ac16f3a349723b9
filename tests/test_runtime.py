"""The machine policy (lmlab.runtime): device, threads and precision decided in one place, each
decision explained and recorded, nothing timed, bad requests a one-line error."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch

from lmlab import runtime
from lmlab.errors import LmlabError

ROOT = Path(__file__).resolve().parents[1]


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


@pytest.mark.parametrize(("cores", "load", "processes", "want"), [
    (2, 5.0, 1, 1),     # the busy 2-core machine: 2 threads ran at a third of 1 thread's speed
    (2, 1.0, 1, 1),     # one other process holds a core
    (2, 0.3, 1, 2),     # idle
    (8, 0.0, 1, 8),
    (8, 3.2, 1, 5),     # the cores the others leave
    (8, 0.0, 2, 4),     # two processes of a distributed run share the node
    (64, 0.0, 1, runtime.MAX_AUTO_THREADS),
    (1, 0.0, 1, 1),
])
def test_auto_threads_are_the_idle_physical_cores(monkeypatch, cores, load, processes, want):
    _no_thread_variables(monkeypatch)
    monkeypatch.setattr(runtime, "physical_cores", lambda: cores)
    monkeypatch.setattr(runtime, "_load_average", lambda: load)
    n, reason = runtime.choose_threads(0, processes)
    assert n == want
    assert reason.startswith(f"{n} (auto: {cores} physical core(s)") and f"load average {load:.1f}" in reason
    assert runtime.choose_threads(None, processes)[0] == want  # None (a command's unset flag) = auto


def _no_thread_variables(monkeypatch):
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)


def test_requested_threads_are_used_as_given(monkeypatch):
    _no_thread_variables(monkeypatch)
    assert runtime.choose_threads(3) == (3, "3 (requested)")
    with pytest.raises(LmlabError, match="thread count"):
        runtime.choose_threads(-1)


@pytest.mark.parametrize(("env", "requested", "keep", "want"), [
    ({"OMP_NUM_THREADS": "1"}, 0, None, (1, "1 (OMP_NUM_THREADS=1)")),  # the idle machine's auto is 2
    ({"OMP_NUM_THREADS": "1"}, None, None, (1, "1 (OMP_NUM_THREADS=1)")),
    ({"OMP_NUM_THREADS": "3"}, 0, 2, (3, "3 (OMP_NUM_THREADS=3)")),  # above a resumed run's count
    ({"MKL_NUM_THREADS": "3"}, 0, None, (3, "3 (MKL_NUM_THREADS=3)")),
    ({"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "3"}, 0, None, (1, "1 (OMP_NUM_THREADS=1)")),
    ({"OMP_NUM_THREADS": "4,2"}, 0, None, (4, "4 (OMP_NUM_THREADS=4,2)")),  # OpenMP's nested list
    ({"OMP_NUM_THREADS": "1"}, 3, None, (3, "3 (requested; OMP_NUM_THREADS=1 not used)")),
    ({"OMP_NUM_THREADS": "3"}, 3, None, (3, "3 (requested)")),
    ({}, 0, 1, (1, "1 (as this run started; set the thread count or OMP_NUM_THREADS to change it)")),
])
def test_thread_variables_apply_between_a_requested_count_and_auto(monkeypatch, env, requested, keep, want):
    """One precedence: a count asked for > OMP_NUM_THREADS > MKL_NUM_THREADS > a resumed run's count
    > auto, and the reason names the one that applied (OMP_NUM_THREADS=1 used to give 2, auto)."""
    _no_thread_variables(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runtime, "physical_cores", lambda: 2)
    monkeypatch.setattr(runtime, "_load_average", lambda: 0.0)
    n, reason = runtime.choose_threads(requested, **({"keep": keep} if keep else {}))
    assert n == want[0]
    assert reason == want[1] if want[1] else reason.startswith("2 (auto:")


@pytest.mark.parametrize("value", ["abc", "0", "-1", "1.5", "2x", "٣", "", " "])
def test_a_thread_variable_that_is_no_count_is_a_one_line_error(monkeypatch, value):
    _no_thread_variables(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", value)
    for requested in (0, 2):  # refused whichever count applies: torch and OpenMP read it too
        with pytest.raises(LmlabError, match=f"^OMP_NUM_THREADS={value!r} is not a whole number of threads "
                                             "from 1; set OMP_NUM_THREADS to e.g. 2, or unset it"):
            runtime.choose_threads(requested)
    with pytest.raises(LmlabError, match="OMP_NUM_THREADS="):
        runtime.check_device("cpu")  # the check a command makes before any work


@pytest.mark.parametrize(("env", "requested"), [({}, 1000), ({"OMP_NUM_THREADS": "1000"}, 0)])
def test_an_explicit_count_above_the_cpus_is_honoured_with_one_note(monkeypatch, capsys, env, requested):
    """train.threads=1000 or OMP_NUM_THREADS=1000 on a 2-CPU machine: honoured as asked, but said
    once on stderr (threads beyond the CPUs only wait for each other); a count that fits says nothing."""
    _no_thread_variables(monkeypatch)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(runtime, "available_cpus", lambda: 2)
    monkeypatch.setattr(runtime, "_noted", set())
    assert runtime.choose_threads(requested)[0] == 1000
    assert runtime.choose_threads(requested)[0] == 1000
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("note: 1000 threads (")
    assert "exceed the 2 CPUs available to this process" in err
    assert runtime.choose_threads(2)[0] == 2 and capsys.readouterr().err == ""


def test_commands_that_only_run_a_model_take_the_same_thread_policy(monkeypatch):
    _no_thread_variables(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    before = torch.get_num_threads()
    try:
        runtime.set_threads(2)
        assert runtime.pick_device("cpu") == torch.device("cpu")
        assert torch.get_num_threads() == 1
    finally:
        runtime.set_threads(before)


def test_auto_precision_is_bf16_on_a_gpu_that_has_it_and_fp32_elsewhere(monkeypatch):
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert runtime.choose_precision("auto", cpu)[0] is None
    assert runtime.choose_precision("fp32", cpu) == (None, "fp32 (requested)")
    assert runtime.choose_precision("bf16", cpu)[0] is torch.bfloat16  # asked for: honoured
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert runtime.choose_precision("auto", cuda)[0] is torch.bfloat16
    assert runtime.choose_precision("fp16", cuda)[0] is torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert runtime.choose_precision("auto", cuda)[0] is None
    with pytest.raises(LmlabError, match="no bfloat16"):
        runtime.choose_precision("bf16", cuda)
    with pytest.raises(LmlabError, match="unknown precision"):
        runtime.choose_precision("fp8", cpu)


def test_unavailable_or_unknown_device_is_a_one_line_error():
    if not torch.cuda.is_available():
        with pytest.raises(LmlabError, match="CUDA is not available"):
            runtime.choose_device("cuda")
    with pytest.raises(LmlabError, match="unknown device"):
        runtime.choose_device("tpu9")
    device, reason = runtime.choose_device("auto")
    assert device.type in ("cpu", "cuda") and reason.startswith(str(device))
    assert runtime.pick_device("cpu") == torch.device("cpu")


def test_resolve_applies_the_threads_and_records_every_decision(monkeypatch):
    _no_thread_variables(monkeypatch)
    before = torch.get_num_threads()
    try:
        machine = runtime.resolve(device="cpu", threads=1, precision="auto")
        assert torch.get_num_threads() == 1
    finally:
        runtime.set_threads(before)
    record = json.loads(json.dumps(machine.record()))  # what a run writes into its summary
    assert record == {"device": "cpu", "threads": 1, "precision": "fp32", "reasons": {
        "device": "cpu (requested)", "threads": "1 (requested)", "precision": record["reasons"]["precision"]}}
    assert record["reasons"]["precision"].startswith("fp32 (auto")
    assert machine.notes[1] == "threads: 1 (requested)"
    with machine.autocast():  # float32: no autocast
        assert not torch.is_autocast_enabled("cpu")


def test_the_thread_count_is_set_in_one_place():
    """Every command, loop, benchmark and test goes through runtime.set_threads."""
    calls = [str(f.relative_to(ROOT)) for folder in ("src", "benchmarks", "tests", "tools")
             for f in sorted((ROOT / folder).rglob("*.py"))
             if re.search(r"\bset_num_threads\(", f.read_text(encoding="utf-8"))]
    assert calls == ["src/lmlab/runtime.py"]


def test_a_command_that_runs_a_model_refuses_a_bad_thread_variable_before_reading_it(monkeypatch, capsys,
                                                                                     tmp_path):
    from lmlab.cli import main

    _no_thread_variables(monkeypatch)
    monkeypatch.setenv("OMP_NUM_THREADS", "abc")
    assert main(["generate", "--checkpoint", str(tmp_path / "none"), "--prompt", "to"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: OMP_NUM_THREADS='abc' is not a whole number") and err.count("\n") == 1

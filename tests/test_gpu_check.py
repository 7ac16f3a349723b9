"""``benchmarks/gpu_check.sh --quick`` on the CPU: every part of the GPU check runs in its smallest
form under its time box and lands in $OUT with a summary, so the script cannot rot between loans
(docs/gpu.md). No timing is asserted; the GPU figures come from a lent GPU."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"


def check(out: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {**os.environ, "OUT": str(out), "PYTHON": sys.executable, "CUDA_VISIBLE_DEVICES": "",
            "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=full)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("out")
    done = check(out, "--quick")
    return done, out


def test_quick_check_runs_every_part_and_writes_a_summary(quick):
    done, out = quick
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["quick"] is True and summary["ok"] is True
    parts = {p["part"]: p for p in summary["parts"]}
    assert list(parts) == ["machine", "cuda-tier", "throughput", "claims-grid"]
    assert all(p["status"] == "passed" and p["exit_code"] == 0 for p in parts.values()), parts
    assert all(isinstance(p["seconds"], int) and p["seconds"] >= 0 for p in parts.values())
    assert summary["seconds"] == sum(p["seconds"] for p in parts.values())
    # without CUDA the tier is collected and every test of it skipped, with the reason
    tier = (out / "tier.log").read_text()
    assert " skipped" in tier and "passed" not in parts["cuda-tier"]["note"]
    assert "no CUDA device here" in tier
    raw = json.loads((out / "throughput.json").read_text())
    assert raw["quick"] and raw["device"] == "cpu" and raw["complete"]
    report = (out / "grid.md").read_text()
    assert "gpu-check-quick" in report and "| mlm |" in report and "| clm |" in report
    # only flat files come back from a lent machine, at most 8 of them
    files = sorted(p.name for p in out.iterdir())
    assert all((out / f).is_file() for f in files) and len(files) <= 8
    assert set(files) == {"summary.json", "tier.log", "throughput.log", "throughput.json", "grid.log",
                          "grid.md", "grid.json"}


def test_a_part_past_its_time_box_is_recorded_and_the_others_still_run(tmp_path):
    done = check(tmp_path, "--quick", GPU_CHECK_TIER_S="1", GPU_CHECK_THROUGHPUT_S="1", GPU_CHECK_GRID_S="1")
    assert done.returncode == 1
    parts = {p["part"]: p for p in json.loads((tmp_path / "summary.json").read_text())["parts"]}
    for name in ("cuda-tier", "throughput", "claims-grid"):
        assert parts[name]["status"] == "timed out" and parts[name]["exit_code"] in (124, 137), parts[name]
    assert "some part failed or timed out" in done.stdout


def test_bad_use_is_one_line(tmp_path):
    done = check(tmp_path, "--fast")
    assert done.returncode == 2 and done.stderr.startswith("error: unknown option --fast;")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(["bash", str(SCRIPT), "--quick"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert done.returncode == 2 and done.stderr.startswith("error: OUT is not set;")

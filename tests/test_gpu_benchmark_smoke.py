"""Smoke test of ``benchmarks/gpu_throughput.py --quick`` on the CPU (CUDA hidden): every row of
every group is there, the implementations hold the same weights (equal float32 losses), the packed
rows' inputs are what lmlab's CLM objective makes, and no verdict is claimed from a CPU run. No
timing is asserted; the GPU figures come from a lent GPU, never from this test."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import gpu_throughput as gt  # noqa: E402
from model_throughput import QUICK  # noqa: E402

CPU_ONLY = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}


def run(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "gpu_throughput.py"), *args], capture_output=True,
                          text=True, timeout=timeout, cwd=ROOT, env=CPU_ONLY)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("gpubench")
    md, raw = tmp / "BENCHMARKS.md", tmp / "results.json"
    md.write_text("kept as it was\n")
    proc = run("--quick", "--no-write", "--threads", "1", "--json", str(raw), "--markdown", str(md))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert md.read_text() == "kept as it was\n"  # --no-write
    return proc.stdout, json.loads(raw.read_text())


def test_every_row_runs_with_the_same_weights(quick_run):
    _, raw = quick_run
    assert raw["device"] == "cpu" and raw["quick"] and raw["complete"]
    assert raw["peaks"][0]["flops"] > 0
    results = {r["group"]: r for r in raw["results"]}
    assert list(results) == list(gt.GROUPS)
    for group, res in results.items():
        assert "error" not in res, res.get("error")
        assert list(res["rows"]) == [spec.name for spec in gt.ROWS[group]]
        assert res["params"] == res["params_hf"], group
        for spec in gt.ROWS[group]:
            row = res["rows"][spec.name]
            if spec.compiled:  # inductor on a CPU costs minutes: skipped, with the reason
                assert row == {"skipped": gt.COMPILE_SKIPPED}
                continue
            assert row["tokens_per_s"] > 0 and len(row["times"]) == 2 and row["mfu"] > 0
            assert row["tokens_per_s"] == pytest.approx(res["tokens_per_step"] / row["step_s"])
            if spec.ref is not None:
                ref = res["rows"][spec.ref]
                assert row["ratio"] == pytest.approx(row["tokens_per_s"] / ref["tokens_per_s"])
            if spec.ratio_target is not None or spec.mfu_target is not None:
                assert row["verdict"] == "n/a"  # a CPU smoke run judges nothing
            assert "peak_gb" not in row  # CUDA's allocator statistics only
    for group in ("gpt2", "bert", "t5"):  # same weights, same math
        losses = results[group]["losses"]
        assert losses["lmlab"] == pytest.approx(losses["transformers"], abs=1e-4), group
    assert results["gpt2"]["losses"]["nanoGPT-style"] == pytest.approx(
        results["gpt2"]["losses"]["transformers"], abs=1e-4)
    packed = results["packed"]["losses"]
    assert packed["packed, lmlab's mask backend"] == pytest.approx(packed["packed, dense mask"], abs=1e-4)
    assert results["packed"]["docs_per_row"] > 2
    t5 = results["t5"]
    assert t5["tokens_per_step"] == QUICK.batch * (QUICK.seq + QUICK.dec)


def test_report_lists_every_row(quick_run):
    stdout, _ = quick_run
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in stdout.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]
    assert len(rows) == sum(len(r) for r in gt.ROWS.values())
    for _model, impl, rate, _ratio, mfu, _target, verdict, peak in rows:
        assert peak == "—" and verdict in ("n/a", "—")
        if "compiled" in impl:
            assert rate == "—"
        else:
            assert rate.replace(",", "").isdigit() and mfu.endswith("%")
    assert "**CPU smoke run**" in stdout and "compile-on-cpu" in stdout
    legend = " ".join(stdout.split())  # MFU's denominator, said where its targets are read
    assert "the bf16 matmul rate measured in this run (the issue's definition" in legend
    assert "not the card's rated peak" in legend


def test_packed_rows_are_what_the_clm_objective_makes():
    packed, single, docs = gt.packed_batches(QUICK, mean_doc=6)
    assert docs > 1 and "doc_ids" in packed and "doc_ids" not in single
    starts = packed["position_ids"] == 0
    previous = torch.nn.functional.pad(packed["doc_ids"], (1, -1), value=-1)
    assert torch.equal(starts, packed["doc_ids"] != previous)  # positions restart with each document
    assert (packed["labels"][starts] == -100).all() and (packed["labels"][~starts] >= 0).all()
    assert torch.equal(packed["input_ids"], single["input_ids"])
    assert torch.equal(single["position_ids"], torch.arange(QUICK.seq).expand(QUICK.batch, -1))


def test_verdicts_on_a_gpu_run():
    res = {"group": "gpt2", "rows": {
        "lmlab": {"tokens_per_s": 100.0, "model_flops_per_s": 40.0},
        "lmlab compiled": {"tokens_per_s": 210.0, "model_flops_per_s": 60.0},
        "transformers": {"tokens_per_s": 90.0, "model_flops_per_s": 40.0},
        "nanoGPT-style": {"tokens_per_s": 150.0, "model_flops_per_s": 50.0},
        "nanoGPT-style compiled": {"tokens_per_s": 200.0, "model_flops_per_s": 55.0}}}
    gt.judge([res], peak=100.0, judged=True)
    row = res["rows"]["lmlab compiled"]
    assert row["ratio"] == pytest.approx(1.05) and row["mfu"] == pytest.approx(0.6)
    assert row["verdict"] == "met; met"
    res["rows"]["lmlab compiled"]["model_flops_per_s"] = 45.0  # 45% MFU: under the 50% target
    gt.judge([res], peak=100.0, judged=True)
    assert row["verdict"] == "met; **missed**"
    assert "verdict" not in res["rows"]["lmlab"]  # eager lmlab has no target


def test_full_shapes_without_cuda_are_refused_before_any_work():
    proc = run("--no-write", timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "error: no CUDA device; run with --quick for a CPU smoke run"
    proc = run("--quick", "--models", "gpt2,llama", "--no-write", timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: unknown model group 'llama'")


def test_dropout_with_the_packed_group_is_refused_before_any_work():
    proc = run("--quick", "--dropout", "0.1", "--no-write", timeout=120)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    assert proc.stderr.startswith("error: --dropout 0.1 with the packed group: FlexAttention has no "
                                  "attention dropout")
    assert proc.stderr.strip().endswith("; pass --dropout 0, or leave packed out of --models")
    args = gt.parse_args(["--quick", "--models", "gpt2,bert", "--dropout", "0.1", "--no-write"])
    assert args.dropout == 0.1  # the dense groups take dropout


class FakeRunner:
    """A row whose ``step`` raises from its ``fail_at``-th call on (an out-of-memory error, say)."""

    def __init__(self, name: str, fail_at: int | None = None):
        self.name, self.fail_at, self.calls, self.times = name, fail_at, 0, []
        self.model, self.optimizer = torch.nn.Linear(2, 2), object()

    def step(self) -> float:
        self.calls += 1
        if self.fail_at is not None and self.calls >= self.fail_at:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return 0.01 * self.calls


def test_a_row_failing_in_the_timed_rounds_costs_only_that_row():
    first, last = FakeRunner("lmlab"), FakeRunner("transformers")
    broken = FakeRunner("lmlab compiled", fail_at=2)
    rows: dict = {}
    survivors = gt.timed_rounds([first, broken, last], 4, rows, "cpu")
    assert survivors == [first, last]
    oom = "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert rows == {"lmlab compiled": {"error": oom}}
    assert len(first.times) == len(last.times) == 4 and first.calls == last.calls == 4
    assert broken.calls == 2  # left the rounds at its failure
    assert broken.model is None and broken.optimizer is None  # its weights and AdamW state let go
    assert first.model is not None and first.optimizer is not None


def test_report_shows_failed_rows_and_a_failed_peak_step():
    res = {"group": "bert", "params": 1e6, "params_hf": 1e6, "hf_attention": "sdpa", "losses": {"lmlab": 1.0},
           "rows": {"lmlab": {"tokens_per_s": 10.0, "model_flops_per_s": 5.0,
                              "peak_error": "OutOfMemoryError: x"},
                    "lmlab compiled": {"error": "RuntimeError: CUDA out of memory"},
                    "transformers": {"tokens_per_s": 8.0, "model_flops_per_s": 4.0, "peak_gb": 3.25}}}
    gt.judge([res], peak=10.0, judged=True)
    text = gt.report([res], "header")
    lines = [line for line in text.splitlines() if line.startswith("| BERT")]
    assert [line.split("|")[-2].strip() for line in lines] == ["failed", "—", "3.2"]
    assert "- bert / lmlab: peak GB step failed: OutOfMemoryError: x" in text
    assert "- bert / lmlab compiled: failed: RuntimeError: CUDA out of memory" in text
    assert res["rows"]["lmlab"]["ratio"] == pytest.approx(1.25)  # its timed figures stand


def test_build_group_builds_exactly_the_rows_skip_reason_lets_run(monkeypatch):
    """One home for the rule: a row is built when ``skip_reason`` is None, whatever it decides."""
    def only(*names):
        return lambda group, spec, args: None if spec.name in names else "left out"

    args = SimpleNamespace(device="cpu", dropout=0.0, quick=True, compiled=False, packed_compiled=False)
    wanted = [spec.name for spec in gt.ROWS["packed"] if spec.name != f"lmlab, {gt.ONE_DOC}"]
    monkeypatch.setattr(gt, "skip_reason", only(*wanted))  # compiled rows in, though compiled=False
    built, _ = gt.build_group("packed", QUICK, args)
    assert list(built) == wanted  # and an eager row out
    compiled = built[f"lmlab compiled, {gt.ONE_DOC}"].model
    assert compiled is built[f"lmlab compiled, {gt.PACKED}"].model  # one compiled module, two graphs
    assert compiled is not built[f"lmlab, {gt.PACKED}"].model


def test_rerun_command_drops_where_results_go_in_both_spellings():
    argv = ["--quick", "--json=/tmp/a.json", "--models", "gpt2", "--markdown", "/tmp/B.md",
            "--markdown=/tmp/C.md", "--json", "/tmp/b.json", "--steps", "3"]
    assert common.rerun_command("gpu_throughput.py", argv) == (
        "python benchmarks/gpu_throughput.py --quick --models gpt2 --steps 3")


def test_static_bytes_is_the_sum_the_memory_figures_used():
    model = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3, bias=False))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    assert common.static_bytes(model, optimizer) == 4 * (6 * 5 + 5 + 5 * 3)  # before a step: no state
    model(torch.randn(4, 6)).sum().backward()
    optimizer.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    state = sum(t.numel() * t.element_size() for st in optimizer.state.values()
                for t in st.values() if torch.is_tensor(t))
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters())
    assert common.static_bytes(model, optimizer) == params + state  # model/finetune benchmarks' sum
    assert common.static_bytes(model, optimizer, grads=True) == params + grads + state  # the GPU rows'
    assert state == 2 * params + 4 * 3  # exp_avg, exp_avg_sq and a float32 step per parameter

"""Smoke test of ``benchmarks/model_throughput.py --quick``: every family runs on both sides with
the same weights, the report table and the BENCHMARKS.md section are produced. No timing is
asserted (the machine is shared); the equal losses prove both sides compute the same model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import model_throughput as mt  # noqa: E402

FAMILIES = ["bert", "gpt2", "llama", "t5", "bart"]
NUMBER = re.compile(r"^\d+(\.\d+)?$")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bench")
    md, raw = tmp / "BENCHMARKS.md", tmp / "results.json"
    common.update_section("tokenizer_encoding", "other section kept", md)
    proc = subprocess.run(
        [sys.executable, str(BENCH / "model_throughput.py"), "--quick", "--threads", "1", "--bf16",
         "--markdown", str(md), "--json", str(raw)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, md.read_text(), json.loads(raw.read_text())


def test_every_family_runs_on_both_sides_with_the_same_weights(quick_run):
    _, _, raw = quick_run
    results = {r["family"]: r for r in raw["results"]}
    assert list(results) == FAMILIES
    for fam, r in results.items():
        assert "error" not in r, r.get("error")
        assert r["params_lmlab"] == r["params_hf"], fam
        assert r["loss_lmlab"] == pytest.approx(r["loss_hf"], abs=1e-4), fam  # same model, same math
        assert set(r["rows"]) == {"lmlab", "transformers", "lmlab bf16"}
        for row in r["rows"].values():
            assert row["tokens_per_s"] > 0 and len(row["times"]) == 2
            # weights + gradients + two AdamW moments (4 bytes each) at least, plus activations
            assert row["peak_mb"] * 2**20 > 16 * r["params_lmlab"]
    # MFU numerator: the MLM objective needs less than transformers' full-vocabulary head does
    bert = results["bert"]["rows"]
    assert bert["lmlab"]["done_flops_per_s"] == pytest.approx(bert["lmlab"]["model_flops_per_s"])
    hf = bert["transformers"]
    assert hf["done_flops_per_s"] > hf["model_flops_per_s"]
    assert raw["peaks"][0]["flops"] > 0


def test_report_table_and_section(quick_run):
    stdout, text, _ = quick_run
    assert "<!-- model_throughput:start -->" in text and "other section kept" in text
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in text.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]
    assert len(rows) == 3 * len(FAMILIES)
    for fam, _obj, _params, tokens, impl, rate, ratio, _target, verdict, mfu, _hfu, _mv, peak, _loss in rows:
        assert fam in FAMILIES and NUMBER.match(rate) and NUMBER.match(tokens) and NUMBER.match(peak)
        assert mfu.endswith("%")
        if impl.startswith("lmlab"):
            assert ratio.endswith("x")
        else:
            assert impl.startswith("transformers (")
        assert verdict in ("met", "**missed**", "—")
    assert "Re-run on a quiet machine" in stdout


def test_mlm_batch_labels_exactly_fifteen_percent():
    s = mt.Shape(batch=3, seq=40, vocab=100)
    batch, dec, k = mt.make_batch("bert", s)
    labelled = batch["labels"] != -100
    assert dec == 0 and k == 6 and (labelled.sum(1) == k).all()
    assert (batch["input_ids"][labelled] == 4).all()  # the mask id
    t5, dec, k = mt.make_batch("t5", s)
    assert dec == k == s.dec and t5["labels"].shape == (3, s.dec)
    assert torch.equal(mt.make_batch("gpt2", s)[0]["labels"], mt.make_batch("gpt2", s)[0]["input_ids"])


@pytest.mark.parametrize("option, value, message", [
    ("--steps", "0", "error: --steps must be at least 1, got 0; pass e.g. --steps 6, or leave it out"),
    ("--warmup", "-1", "error: --warmup must be at least 1, got -1; pass e.g. --warmup 2, or leave it out"),
    ("--threads", "-1",
     "error: thread count must be 0 (auto) or more, got -1; pass e.g. --threads 2, or 0 for auto"),
])
def test_bad_counts_are_one_line_errors_before_any_work(option, value, message):
    """(Before: --steps 0 ran every family into an empty median, --threads 0 ended in a traceback.)"""
    proc = subprocess.run([sys.executable, str(BENCH / "model_throughput.py"), "--quick", "--no-write",
                           option, value], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stderr.strip() == message and proc.stdout == ""

"""Smoke tests of ``benchmarks/pretrain_throughput.py`` and ``benchmarks/pretrain_quality.py`` with
``--quick`` (tiny shapes, slices of the real corpus). No timing is asserted (the machine is
shared). What is asserted: every side of every comparison runs and has the same parameter count,
the report sections are written without touching other sections, the transformers span
corruption matches lmlab's golden ``corrupt_spans``, and the quality comparison is like for like
(same initial weights, same windows, same optimizer: the two training runs end at the same loss)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
sys.path.insert(0, str(BENCH))

import common  # noqa: E402
import pretrain_throughput as pt  # noqa: E402


def _run(script: str, tmp: Path, *extra: str) -> tuple[str, str, object]:
    md, raw = tmp / "BENCHMARKS.md", tmp / f"{script}.json"
    if not md.exists():
        common.update_section("tokenizer_encoding", "other section kept", md)
    proc = subprocess.run(
        [sys.executable, str(BENCH / f"{script}.py"), "--quick", "--threads", "1", "--markdown", str(md),
         "--json", str(raw), "--cache", str(tmp / "cache"), *extra],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, md.read_text(), json.loads(raw.read_text())


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pretrain-bench")
    throughput = _run("pretrain_throughput", tmp)
    quality = _run("pretrain_quality", tmp)
    return throughput, quality, (tmp / "BENCHMARKS.md").read_text()


def test_throughput_runs_every_side_of_every_objective(runs):
    (_, _, raw), _, _ = runs
    results = {r["objective"]: r for r in raw["results"]}
    assert list(results) == ["mlm", "clm", "t5"]
    expected = {"mlm": {"lmlab", "transformers"}, "t5": {"lmlab", "transformers"},
                "clm": {"lmlab", "lmlab, one stream", "transformers", "plain PyTorch"}}
    for obj, r in results.items():
        assert "error" not in r, r.get("error")
        assert set(r["rows"]) == expected[obj]
        # every side trains a model of the same size
        assert len({row["parameters"] for row in r["rows"].values()}) == 1, (obj, r["rows"])
        assert r["model_flops_per_step"] > 0
        for row in r["rows"].values():
            assert row["tokens_per_s"] > 0 and len(row["times"]) == 2
    assert raw["peaks"][0]["flops"] > 0


def test_quality_is_like_for_like(runs):
    _, (_, _, raw), _ = runs
    assert [r["dataset"] for r in raw] == ["shakespeare-char", "english-mix"]
    for r in raw:
        assert "error" not in r, r.get("error")
        lm, hf = r["lmlab"], r["transformers"]
        assert lm["parameters"] == hf["parameters"]
        assert lm["tokens"] == hf["tokens"] == r["steps"] * 4 * 32
        # same initial weights and the same evaluation windows
        assert lm["initial_val_loss"] == pytest.approx(hf["initial_val_loss"], abs=1e-4)
        assert lm["val_loss"] == pytest.approx(lm["trainer_val_loss"], abs=1e-5)
        # same windows, schedule and AdamW groups: the two runs end where the other does
        assert lm["train_losses"] == pytest.approx(hf["train_losses"], abs=2e-3)
        assert lm["val_loss"] == pytest.approx(hf["val_loss"], abs=2e-3)
        assert lm["val_loss"] < lm["initial_val_loss"]  # it trained
    char = raw[0]
    assert char["vocab_size"] == 263  # 256 bytes + the 7 default special tokens: character level


def test_reports_are_written_next_to_other_sections(runs):
    (out_t, _, _), (out_q, _, _), md = runs
    assert "other section kept" in md
    for section, title in (("pretrain_throughput", "Pretraining step throughput"),
                           ("pretrain_quality", "Pretraining quality per compute")):
        assert md.count(f"<!-- {section}:start -->") == 1 and title in md
    assert "| CLM (GPT-2) | plain PyTorch |" in out_t and "MFU" in out_t
    assert "| shakespeare-char |" in out_q and "| english-mix |" in out_q


def test_span_corruption_of_the_transformers_side_matches_lmlab_golden_function():
    from lmlab.objectives.t5 import corrupt_spans

    rng = np.random.default_rng(3)
    ids = rng.integers(10, 500, size=(3, 64))
    src, tgt = pt.span_corrupt(ids, np.random.default_rng(7), first_sentinel=999, eos=2)
    assert (src.shape[1], tgt.shape[1]) == pt.nominal_t5_lengths(64)
    check = np.random.default_rng(7)
    for row, s, t in zip(ids, src, tgt):
        mask = pt.noise_mask(len(row), check)
        assert mask.sum() == round(0.15 * 64) and not mask[0]
        edges = np.flatnonzero(np.diff(np.concatenate([[0], mask.astype(int), [0]])))
        spans = list(zip(edges[::2], edges[1::2]))
        want_src, want_tgt = corrupt_spans(row.tolist(), spans, [999 - k for k in range(len(spans) + 1)])
        assert s.tolist() == want_src + [2] and t.tolist() == want_tgt + [2]


def test_plain_gpt_is_causal():
    import torch

    torch.manual_seed(0)
    model = pt.PlainGPT(vocab=50, context=16, d=32, layers=2, heads=4, d_ff=64)
    x = torch.randint(0, 50, (1, 16))
    y = x.clone()
    y[0, 10] = (y[0, 10] + 1) % 50   # change a later token
    with torch.no_grad():
        h = [model.head(model.ln_f(_hidden(model, z))) for z in (x, y)]
    assert torch.allclose(h[0][0, :10], h[1][0, :10], atol=1e-6)
    assert not torch.allclose(h[0][0, 10:], h[1][0, 10:])


def _hidden(model, idx):
    import torch

    x = model.wte(idx) + model.wpe(torch.arange(idx.shape[1]))
    for block in model.blocks:
        x = block(x)
    return x

"""``benchmarks/claims_trend.py``: paired gaps per compute multiple, the fit against log2(compute) and
where it crosses zero, on a synthetic compare folder with a known answer and on a real micro grid."""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import claims_trend  # noqa: E402

MULTIPLES = (1, 2, 4, 8)
HEAD = ["arm", "size", "seed", "objective", "preset", "params", "steps", "tokens", "flops", "val_loss",
        "sst2_accuracy"]


def synthetic(folder: Path) -> None:
    """runs.csv of a trend grid: b scores 0.62 (+-0.003, alternating with seed and multiple), so
    b - scratch = +0.02 with no trend; a - b = -0.04 + 0.01 * log2(K) (+-0.002 by seed: closes at
    16x); c - b = +0.02 + 0.01 * log2(K) (ahead, moving away). results.json: the grid's contrasts."""
    folder.mkdir()
    rows = []
    for seed, noise in ((0, 0.002), (1, -0.002)):
        rows.append(["scratch", "base", seed, "none", "bert-tiny", 10, 0, 0, 0.0, "", 0.60])
        for k in MULTIPLES:
            x = math.log2(k)
            b = 0.62 + 0.003 * (-1) ** (seed + int(x))
            series = {"a": b - 0.04 + 0.01 * x + noise, "b": b, "c": b + 0.02 + 0.01 * x}
            for name, score in series.items():
                rows.append([f"{name}-x{k}", "base", seed, "mlm", "bert-tiny", 10, 100 * k, 4096 * k,
                             1e12 * k, 2.0, score])
    rows.append(["a-x1", "base", 2, "mlm", "bert-tiny", 10, 100, 4096, 1e12, 2.0, ""])  # unfinished
    with open(folder / "runs.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(HEAD)
        w.writerows(rows)
    contrasts = [{"better": f"a-x{k}", "than": f"b-x{k}"} for k in MULTIPLES]
    contrasts += [{"better": f"b-x{k}", "than": "scratch"} for k in MULTIPLES]
    (folder / "results.json").write_text(json.dumps({"name": "trend-synthetic", "contrasts": contrasts}))


def test_synthetic_trend_closes_where_the_line_says(tmp_path):
    synthetic(tmp_path / "grid")
    out = tmp_path / "out"
    assert claims_trend.main([str(tmp_path / "grid"), "--out", str(out)]) == 0
    data = json.loads((out / "trend.json").read_text())["trends"]
    assert [t["better"] + ":" + t["than"] for t in data] == ["a:b", "b:scratch"]
    closing, flat = data
    assert [p["multiple"] for p in closing["points"]] == [1.0, 2.0, 4.0, 8.0]
    assert [p["seeds"] for p in closing["points"]] == [[0, 1]] * 4  # seed 2 did not finish: left out
    assert closing["points"][0]["mean"] == pytest.approx(-0.04)
    assert closing["points"][0]["std"] == pytest.approx(0.004 / math.sqrt(2))
    fit = closing["fit"]
    assert fit["a"] == pytest.approx(-0.04) and fit["b"] == pytest.approx(0.01)
    assert fit["crossing"] == pytest.approx(16.0)
    low, high = fit["crossing_range"]
    assert low < 16.0 < high
    assert "moving towards zero" in fit["reading"] and "crosses at 16x" in fit["reading"]
    assert flat["fit"]["b"] == pytest.approx(0.0, abs=1e-12) and flat["fit"]["a"] == pytest.approx(0.02)
    assert "no trend distinguishable from zero" in flat["fit"]["reading"] and flat["fit"]["crossing"] is None
    assert flat["fit"]["reading"].startswith("ahead at 1x (+0.0200")  # a level, not only "no trend"
    md = (out / "trend.md").read_text()
    assert "| trend-synthetic | a - b | 1x | 1e+12 |" in md and "**-0.0400 ± 0.0028**" in md
    assert "| trend-synthetic | a - b | -0.0400 ± " in md and "| 16x |" in md
    assert (out / "trend.png").read_bytes().startswith(b"\x89PNG")


def test_a_gap_moving_away_does_not_close(tmp_path):
    synthetic(tmp_path / "grid")
    out = tmp_path / "out"
    assert claims_trend.main([str(tmp_path / "grid"), "--gap", "b:a", "--out", str(out)]) == 0
    (trend,) = json.loads((out / "trend.json").read_text())["trends"]
    # b - a = +0.04 - 0.01 log2 K: ahead at 1x, shrinking, crosses at 16x
    assert trend["fit"]["crossing"] == pytest.approx(16.0) and "ahead at 1x" in trend["fit"]["reading"]
    assert claims_trend.main([str(tmp_path / "grid"), "--gap", "c:b", "--out", str(out)]) == 0
    (trend,) = json.loads((out / "trend.json").read_text())["trends"]
    # c - b = 0.02 + 0.01 log2 K: ahead from 1x on and growing
    assert "moving away from zero" in trend["fit"]["reading"] and "does not close" in trend["fit"]["reading"]
    assert trend["fit"]["crossing"] is None and trend["fit"]["crossing_range"] is None


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--gap", "electra"], "error: --gap 'electra' is not of the form A:B;"),
        (["--gap", "a:mlm"], "no arm 'mlm' or mlm-xK in runs.csv;"),
        (["--metric", "rte_accuracy"], "runs.csv has no column 'rte_accuracy';"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    synthetic(tmp_path / "grid")
    assert claims_trend.main([str(tmp_path / "grid"), *args, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("error: ")
    assert not (tmp_path / "out").exists()


def test_a_folder_without_runs_is_refused(tmp_path, capsys):
    assert claims_trend.main([str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert "has no runs.csv; pass the --out folder of a finished `lmlab compare` run" in err


def test_real_micro_trend_grid(tmp_path, data_dir):
    """A real `lmlab compare` of arms mlm-x1, mlm-x2 and scratch (two seeds), then the trend of it."""
    from lmlab.lab import load_grid, run_grid

    shakespeare = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "train.txt").write_text(shakespeare[:60_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(shakespeare[-20_000:], encoding="utf-8")
    grid = {
        "name": "micro-trend", "seeds": [0, 1], "budget": {"tokens": 2560},
        "pretrain": {"data": {"train": [str(tmp_path / "train.txt")], "val": [str(tmp_path / "val.txt")],
                              "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                     "train": {"batch_size": 8, "seq_len": 32, "eval_batches": 2, "threads": 1},
                     "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64, "max_positions": 64}},
        "arms": [{"name": "mlm-x1", "preset": "bert-tiny", "objective": "mlm"},
                 {"name": "mlm-x2", "preset": "bert-tiny", "objective": "mlm", "budget": {"tokens": 5120}},
                 {"name": "scratch", "preset": "bert-tiny", "objective": "none"}],
        "contrasts": [{"better": "mlm-x1", "than": "scratch"}, {"better": "mlm-x2", "than": "scratch"}],
        "finetune": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_length": 32, "threads": 1},
        "tasks": [{"task": "sst2", "train": str(data_dir / "glue/sst2/train.tsv"),
                   "dev": str(data_dir / "glue/sst2/dev.tsv"), "max_train_examples": 64,
                   "max_eval_examples": 32}],
    }
    run_grid(load_grid(grid), tmp_path / "compare", progress=False, log=lambda msg: None)
    out = tmp_path / "trend"
    assert claims_trend.main([str(tmp_path / "compare"), "--out", str(out)]) == 0
    (trend,) = json.loads((out / "trend.json").read_text())["trends"]
    assert trend["grid"] == "micro-trend" and trend["better"] == "mlm" and trend["than"] == "scratch"
    assert trend["metric"] == "sst2_accuracy"
    points = trend["points"]
    assert [p["multiple"] for p in points] == [1.0, 2.0] and all(p["seeds"] == [0, 1] for p in points)
    assert points[1]["flops"] == pytest.approx(2 * points[0]["flops"])
    assert trend["fit"] is not None and math.isfinite(trend["fit"]["b"])
    assert "| micro-trend | mlm - scratch | 2x |" in (out / "trend.md").read_text()


@pytest.mark.parametrize(("name", "gap"), [("claims-trend-electra", ("electra-40", "mlm-40")),
                                            ("claims-trend-t5", ("t5-spans", "t5-prefix-lm"))])
def test_trend_grids_double_the_compute_at_every_multiple(data_dir, name, gap):
    """Each series at 1x, 2x, 4x, 8x its 1x compute (within a step), two seeds; ELECTRA at the masked
    LM's FLOPs of the same multiple; every gap the trend follows is a contrast of the grid."""
    from lmlab.lab import load_grid

    grid = load_grid(ROOT / "configs" / "grids" / f"{name}.toml")
    assert grid.seeds == [0, 1]
    runs = {r.arm.name: r for r in grid.pretrain_runs if r.seed == 0}
    for s in gap:
        base = runs[f"{s}-x1"]
        for k in MULTIPLES:
            run = runs[f"{s}-x{k}"]
            assert abs(run.flops - k * base.flops) <= k * run.flops_per_step, (s, k)
    if name == "claims-trend-electra":
        for k in MULTIPLES:
            mlm, electra = runs[f"mlm-40-x{k}"], runs[f"electra-40-x{k}"]
            assert mlm.flops - electra.flops_per_step < electra.flops <= mlm.flops
    pairs = {(claims_trend.split_arm(c.better)[0], claims_trend.split_arm(c.than)[0]) for c in grid.contrasts}
    (scratch,) = [a.name for a in grid.arms if not a.pretrained]
    assert pairs == {gap, (gap[0], scratch), (gap[1], scratch)}
    # listed by compute, so a seed cut short has every multiple below the one it reached
    multiples = [claims_trend.split_arm(a.name)[1] if a.pretrained else 0.0 for a in grid.arms]
    assert multiples == sorted(multiples) and multiples[0] == 0.0
    # the epoch and the rate chosen on a slice of train, never on the dev set that scores
    assert all(t.settings["select_on"] == "train-slice" for t in grid.tasks)
    assert all(t.settings["lr"] == "auto" and len(t.settings["lr_sweep"]) == 3 for t in grid.tasks)

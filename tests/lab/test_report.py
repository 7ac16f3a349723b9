"""The report from synthetic run results: means and spreads, the Markdown and CSV tables, the plots."""

from __future__ import annotations

import csv
import io
import json
import math
from types import SimpleNamespace

import pytest

from lmlab.lab.report import aggregate, csv_text, markdown_table, mean_std, runs_csv_text, write_report


def records():
    """Two arms x 3 seeds; the scratch arm has no pretraining (no val loss, no curve) and one
    missing RTE result."""
    out = []
    for seed, (acc, rte, loss) in enumerate([(0.80, 0.55, 5.0), (0.90, 0.60, 5.2), (0.85, 0.65, 5.4)]):
        out.append(
            {
                "arm": "bert-mlm",
                "size": "base",
                "seed": seed,
                "objective": "mlm",
                "preset": "bert-tiny",
                "parameters": 378944,
                "steps": 600,
                "tokens": 1228800,
                "flops": 1.26e12,
                "val_loss": loss,
                "curve": [[0.0, 8.3], [6.3e11, 7.0 + seed / 10], [1.26e12, loss]],
                "tasks": {"sst2": {"accuracy": acc}, "rte": {"accuracy": rte, "f1": rte - 0.1}},
            }
        )
    for seed, acc in enumerate([0.60, 0.70, 0.65]):
        tasks = {"sst2": {"accuracy": acc}}
        if seed != 2:
            tasks["rte"] = {"accuracy": 0.5, "f1": 0.4}
        out.append(
            {
                "arm": "scratch",
                "size": "base",
                "seed": seed,
                "objective": "none",
                "preset": "bert-tiny",
                "parameters": 378944,
                "steps": 0,
                "tokens": 0,
                "flops": 0.0,
                "val_loss": None,
                "curve": [],
                "tasks": tasks,
            }
        )
    return out


def test_mean_std_is_the_sample_spread():
    mean, std, n = mean_std([0.80, 0.90, 0.85])
    assert mean == pytest.approx(0.85) and n == 3
    assert std == pytest.approx(math.sqrt(((0.05**2) * 2) / 2))  # n - 1 in the denominator
    assert math.isnan(mean_std([0.7])[1]) and mean_std([0.7])[:1] == (0.7,)
    assert mean_std([None, float("nan")])[2] == 0


def test_aggregate_groups_by_arm_and_size():
    rows = aggregate(records())
    assert [r["run"] for r in rows] == ["bert-mlm", "scratch"]
    mlm, scratch = rows
    assert mlm["seeds"] == 3 and mlm["val_loss"][0] == pytest.approx(5.2)
    assert mlm["val_loss"][1] == pytest.approx(0.2)
    assert list(mlm["metrics"]) == ["sst2 accuracy", "rte accuracy", "rte f1"]
    assert mlm["metrics"]["rte f1"][0] == pytest.approx(0.5)
    assert scratch["metrics"]["rte accuracy"][2] == 2  # the missing seed is not averaged in
    assert scratch["val_loss"][2] == 0


def test_markdown_table_content():
    md = markdown_table(aggregate(records()))
    lines = md.strip().splitlines()
    head = "| run | objective | params | FLOPs | tokens | val loss | sst2 accuracy | rte accuracy | rte f1 |"
    assert lines[0] == head + " seeds |"
    assert lines[2] == (
        "| bert-mlm | mlm | 379K | 1.26e+12 | 1.23M | 5.2000 ± 0.2000 | 0.8500 ± 0.0500 | "
        "0.6000 ± 0.0500 | 0.5000 ± 0.0500 | 3 |"
    )
    assert lines[3] == (
        "| scratch | none | 379K | 0 | 0 | – | 0.6500 ± 0.0500 | 0.5000 ± 0.0000 | 0.4000 ± 0.0000 | 3 |"
    )


def test_csv_round_trips_the_numbers():
    rows = list(csv.DictReader(io.StringIO(csv_text(aggregate(records())))))
    assert [r["run"] for r in rows] == ["bert-mlm", "scratch"]
    assert float(rows[0]["sst2_accuracy_mean"]) == pytest.approx(0.85)
    assert float(rows[0]["sst2_accuracy_std"]) == pytest.approx(0.05)
    assert rows[0]["params"] == "378944" and float(rows[0]["flops"]) == 1.26e12
    assert rows[1]["val_loss_mean"] == "" and rows[1]["rte_accuracy_n"] == "2"
    per_seed = list(csv.DictReader(io.StringIO(runs_csv_text(records()))))
    assert len(per_seed) == 6 and per_seed[5]["rte_accuracy"] == "" and per_seed[1]["sst2_accuracy"] == "0.9"


def test_write_report_files(tmp_path):
    grid = SimpleNamespace(
        name="synthetic", budget="{tokens = 1,228,800}", seeds=[0, 1, 2], share_pretraining=False
    )
    paths = write_report(records(), grid, tmp_path)
    assert set(paths) == {"markdown", "csv", "runs_csv", "json", "loss_plot", "downstream_plot"}
    for key in ("loss_plot", "downstream_plot"):
        assert paths[key].read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = paths["markdown"].read_text(encoding="utf-8")
    assert text.startswith("# synthetic\n") and "0.8500 ± 0.0500" in text
    data = json.loads(paths["json"].read_text(encoding="utf-8"))  # strict JSON: no NaN
    assert data["rows"][1]["val_loss"] == [None, None, 0]


def test_no_plots_without_results(tmp_path):
    recs = [{**r, "curve": [], "tasks": {}} for r in records()]
    paths = write_report(recs, SimpleNamespace(name="x"), tmp_path)
    assert "loss_plot" not in paths and "downstream_plot" not in paths
    assert "| bert-mlm | mlm |" in paths["markdown"].read_text(encoding="utf-8")


def test_contrasts_pair_seeds_and_say_how_consistent_the_answer_is(tmp_path):
    from lmlab.lab.grid import Contrast
    from lmlab.lab.report import contrast_rows

    recs = records()
    rows = contrast_rows(recs, [Contrast("pretraining helps", "bert-mlm", "scratch")])
    by_metric = {r["metric"]: r for r in rows}
    sst2 = by_metric["sst2 accuracy"]
    # per-seed differences 0.20, 0.20, 0.20: every seed agrees
    assert sst2["seeds"] == 3 and sst2["agree"] == 3 and sst2["verdict"] == "yes (every seed)"
    assert sst2["difference"][0] == pytest.approx(0.20)
    assert sst2["difference"][1] == pytest.approx(0.0, abs=1e-12)
    rte = by_metric["rte accuracy"]
    assert rte["seeds"] == 2  # scratch has no rte result for seed 2: only paired seeds count
    assert rte["difference"][0] == pytest.approx(0.075)
    assert math.isnan(sst2["flops_ratio"])  # scratch has no pretraining FLOPs
    # the opposite claim, and a mixed one
    against = contrast_rows(recs, [Contrast("x", "scratch", "bert-mlm")])
    assert {r["verdict"] for r in against} == {"no (every seed)"}
    mixed = [dict(r) for r in recs]
    mixed[3] = {**mixed[3], "tasks": {"sst2": {"accuracy": 0.95}}}  # scratch seed 0 now beats MLM
    mixed_rows = contrast_rows(mixed, [Contrast("x", "bert-mlm", "scratch")])
    row = next(r for r in mixed_rows if r["metric"] == "sst2 accuracy")
    assert row["verdict"] == "yes on average (2/3 seeds)"
    # "at-least": a tie agrees
    tie = [dict(r) for r in recs]
    for i in range(3):
        tie[3 + i] = {**tie[3 + i], "tasks": {"sst2": {"accuracy": tie[i]["tasks"]["sst2"]["accuracy"]}}}
    row = contrast_rows(tie, [Contrast("x", "bert-mlm", "scratch", "at-least")])[0]
    assert row["verdict"] == "yes (every seed)" and row["difference"][0] == 0
    grid = SimpleNamespace(name="g", budget="{tokens = 1}", seeds=[0, 1, 2],
                           contrasts=[Contrast("pretraining helps", "bert-mlm", "scratch")])
    text = write_report(recs, grid, tmp_path)["markdown"].read_text(encoding="utf-8")
    assert "## Claims" in text
    assert "| pretraining helps (A > B) | bert-mlm | scratch | sst2 accuracy |" in text

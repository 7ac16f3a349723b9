"""Failed arms are visible (issue 27, item 3): each task's baseline beside every arm in results.md,
results.csv, the console and the plot; an arm at the baseline or at zero is flagged with the reason
(a T5 arm whose answers are no label says so)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from types import SimpleNamespace

from test_runner import Fakes, micro  # noqa: F401 - a real micro grid, and stand-ins for the trainers

from lmlab.lab import load_grid, run_grid
from lmlab.lab import runner as runner_mod
from lmlab.lab.report import aggregate, csv_text, flag_lines, markdown_table, write_report
from lmlab.lab.runner import count_text, finetune_line
from lmlab.tasks.base import Example
from lmlab.tasks.text2text import OUTSIDE_LABELS

SST2_BASE = {"answer": "majority class '1'", "dev": {"accuracy": 0.5092}}


def record(arm: str, objective: str, seed: int, accuracy: float, **extra_metrics) -> dict:
    return {"arm": arm, "size": "base", "seed": seed, "objective": objective, "preset": f"{arm}-tiny",
            "parameters": 1000, "steps": 10, "tokens": 2560, "flops": 1e9, "val_loss": 5.0, "curve": [],
            "tasks": {"sst2": {"accuracy": accuracy, **extra_metrics}},
            "baselines": {"sst2": SST2_BASE}, "select": {"sst2": "accuracy"}}


def objectives_tiny_like() -> list[dict]:
    """The issue's grid: every arm at the majority class but one, and T5 at 0.0000."""
    return [record("bert-mlm", "mlm", s, 0.80 + s / 100) for s in (0, 1)] + \
           [record("gpt2-clm", "clm", s, 0.5092) for s in (0, 1)] + \
           [record("t5-spans", "t5", s, 0.0, **{OUTSIDE_LABELS: 1.0}) for s in (0, 1)]


def test_the_table_shows_the_baseline_row_the_differences_and_the_flags():
    rows = aggregate(objectives_tiny_like())
    lines = markdown_table(rows).strip().splitlines()
    assert lines[0].endswith("| sst2 accuracy | seeds | flags |")  # no outside_labels column
    assert lines[2] == "| baseline (no model) | – | – | – | – | – | 0.5092 | – |  |"
    assert "| 0.8050 ± 0.0071 (+0.2958) | 2 |  |" in lines[3]
    assert lines[4].endswith("| 0.5092 ± 0.0000 (+0.0000) | 2 | at baseline: sst2 |")
    assert lines[5].endswith("| 0.0000 ± 0.0000 (-0.5092) | 2 | 0: sst2 |")
    flags = flag_lines(rows)
    assert flags == [
        "gpt2-clm: sst2 accuracy 0.5092 is at the baseline (majority class '1': 0.5092) in every seed: "
        "it learned nothing usable there",
        "t5-spans: sst2 accuracy is 0 (baseline 0.5092, majority class '1'): 100% of its answers are "
        "outside the label set",
    ]


def test_a_zero_without_outside_answers_and_a_partial_baseline_say_so():
    recs = [record("a", "clm", 0, 0.0), record("b", "mlm", 0, 0.5092), record("b", "mlm", 1, 0.70)]
    assert flag_lines(aggregate(recs)) == [
        "a: sst2 accuracy is 0 (baseline 0.5092, majority class '1'): every answer is wrong",
        "b: sst2 accuracy 0.6046 is at the baseline (majority class '1': 0.5092) in 1/2 seeds: it learned "
        "nothing usable there",
    ]


def test_csv_and_report_files_carry_the_baseline_and_flags(tmp_path):
    rows = list(csv.DictReader(io.StringIO(csv_text(aggregate(objectives_tiny_like())))))
    assert [float(r["sst2_accuracy_baseline"]) for r in rows] == [0.5092] * 3
    assert rows[0]["flags"] == "" and "outside the label set" in rows[2]["flags"]
    paths = write_report(objectives_tiny_like(), SimpleNamespace(name="objectives-tiny"), tmp_path)
    text = paths["markdown"].read_text(encoding="utf-8")
    assert "| baseline (no model) |" in text
    assert "- sst2 accuracy: 0.5092 (majority class '1', no model)" in text
    assert "## Flags" in text and "100% of its answers are outside the label set" in text
    assert paths["downstream_plot"].read_bytes()[:4] == b"\x89PNG"
    saved = json.loads(paths["json"].read_text(encoding="utf-8"))
    assert [len(r["flags"]) for r in saved["rows"]] == [0, 1, 1]


def test_without_baselines_the_table_is_as_before():
    recs = [{**r, "baselines": {}} for r in objectives_tiny_like()[:2]]
    lines = markdown_table(aggregate(recs)).strip().splitlines()
    assert lines[0].endswith("| sst2 accuracy | seeds |") and lines[2].endswith("| 0.8050 ± 0.0071 | 2 |")


def test_a_text_to_text_task_counts_answers_outside_its_labels():
    from lmlab.tasks import make_task

    task = make_task("sst2", "seq2seq")
    task.fit([Example("good", label="1"), Example("bad", label="0")])
    dev = [Example("x", label="1"), Example("y", label="0")]
    assert task.score(["1", "<invalid: posi>"], dev) == {"accuracy": 0.5, OUTSIDE_LABELS: 0.5}


def test_the_console_line_shows_the_baseline_and_what_is_wrong():
    base = {"accuracy": 0.5092}
    assert finetune_line({"accuracy": 0.8}, base, False) == "accuracy 0.8000 (baseline 0.5092)"
    assert finetune_line({"accuracy": 0.0, OUTSIDE_LABELS: 1.0}, base, False) == (
        "accuracy 0.0000 (baseline 0.5092), outside_labels 1.0000; 100% of the answers are outside the "
        "label set")
    assert finetune_line({"accuracy": 0.5}, {"accuracy": 0.5}, True).endswith(
        "; at the baseline: it learned nothing usable")


def test_the_run_counts_add_up_in_words():
    assert count_text(8, 16, 2) == "8 pretraining runs + 16 fine-tuning runs (2 tasks) = 24 runs"
    assert count_text(1, 1, 1) == "1 pretraining run + 1 fine-tuning run (1 task) = 2 runs"


class BaselineFakes(Fakes):
    """Fine-tuning that writes what the real one writes about the baseline (finetune.json)."""

    def finetune(self, checkpoint, task, train, dev, out, log=None, **settings):
        result = super().finetune(checkpoint, task, train, dev, out, log, **settings)
        summary = {"baseline": {"answer": "majority class '0'", "dev": {"accuracy": 0.5}},
                   "select_metric": "accuracy"}
        (Path(out) / "finetune.json").write_text(json.dumps(summary), encoding="utf-8")
        return SimpleNamespace(metrics=result.metrics, baseline={"accuracy": 0.5},
                               at_baseline=result.metrics["accuracy"] <= 0.505)


def test_a_grid_run_says_the_baseline_and_the_flags_on_the_console(micro, tmp_path, monkeypatch):  # noqa: F811
    fakes = BaselineFakes()
    monkeypatch.setattr(runner_mod, "pretrain", fakes.pretrain)
    monkeypatch.setattr(runner_mod, "finetune", fakes.finetune)
    said: list[str] = []
    grid = load_grid(micro(seeds=[0], arms=[{"name": "mlm", "preset": "bert-tiny", "objective": "mlm"}]))
    result = run_grid(grid, tmp_path / "out", progress=False, log=said.append)
    assert said[0].startswith("grid micro: 1 pretraining run + 1 fine-tuning run (1 task) = 2 runs, budget")
    done = next(line for line in said if "-> sst2 seed 0: done" in line)
    assert done.endswith("accuracy 0.5000 (baseline 0.5000); at the baseline: it learned nothing usable")
    assert said[-1] == ("flag: mlm: sst2 accuracy 0.5000 is at the baseline (majority class '0': 0.5000) in "
                        "every seed: it learned nothing usable there")
    text = result.report["markdown"].read_text(encoding="utf-8")
    assert "| baseline (no model) | – | – | – | – | – | 0.5000 |" in text and "at baseline: sst2" in text


class RateFakes(BaselineFakes):
    """Fine-tuning with ``lr = "auto"``: its summary records the rates tried and the one kept."""

    def finetune(self, checkpoint, task, train, dev, out, log=None, **settings):
        result = super().finetune(checkpoint, task, train, dev, out, log, **settings)
        path = Path(out) / "finetune.json"
        summary = json.loads(path.read_text(encoding="utf-8"))
        summary["lr_sweep"] = {"select_metric": "accuracy", "selected_on": "train-slice",
                               "scores": {"0.0002": 0.6, "0.0005": 0.7}, "chosen": 0.0005}
        path.write_text(json.dumps(summary), encoding="utf-8")
        return result


def test_runs_csv_says_which_rate_an_auto_sweep_kept(micro, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.setattr(runner_mod, "pretrain", Fakes().pretrain)
    monkeypatch.setattr(runner_mod, "finetune", RateFakes().finetune)
    grid = load_grid(micro(seeds=[0, 1], arms=[{"name": "mlm", "preset": "bert-tiny", "objective": "mlm"}]))
    result = run_grid(grid, tmp_path / "out", progress=False, log=lambda _: None)
    rows = list(csv.DictReader(io.StringIO(result.report["runs_csv"].read_text(encoding="utf-8"))))
    assert [float(r["sst2_lr"]) for r in rows] == [0.0005, 0.0005]
    # a grid with one fixed rate has no such column
    monkeypatch.setattr(runner_mod, "finetune", BaselineFakes().finetune)
    fixed = run_grid(grid, tmp_path / "fixed", progress=False, log=lambda _: None)
    assert "sst2_lr" not in fixed.report["runs_csv"].read_text(encoding="utf-8").splitlines()[0]

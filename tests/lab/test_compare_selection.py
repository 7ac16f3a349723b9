"""`lmlab compare` chooses each fine-tuning run's step (and --lr auto rate) on a slice held out of
the task's training file, scores on the dev file, and its report says so (docs/lab.md)."""

from __future__ import annotations

import json

import pytest

from lmlab.lab import load_grid
from lmlab.lab.report import selection_of, write_report


@pytest.fixture()
def grid_dict(tmp_path, data_dir):
    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "train.txt").write_text(text[:20_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(text[-5_000:], encoding="utf-8")
    g = data_dir / "glue"

    def task(name: str, **finetune):
        entry = {"task": name, "train": str(g / name / "train.tsv"), "max_train_examples": 100}
        entry["dev"] = str(g / name / ("dev_in_domain.tsv" if name == "cola" else "dev.tsv"))
        return {**entry, "finetune": finetune} if finetune else entry

    def make(*tasks):
        return {
            "name": "sel",
            "seeds": [0],
            "budget": {"tokens": 40_960},
            "pretrain": {
                "data": {"train": [str(tmp_path / "train.txt")], "val": [str(tmp_path / "val.txt")],
                         "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                "train": {"batch_size": 8, "seq_len": 32, "lr": 1e-3},
                "model": {"max_positions": 64},
            },
            "arms": [{"name": "bert", "preset": "bert-tiny", "objective": "mlm"}],
            "finetune": {"epochs": 1, "lr": 1e-3},
            "tasks": list(tasks) or [task("sst2")],
        }

    make.task = task
    return make


def test_compare_chooses_on_a_slice_of_train_by_default(grid_dict):
    grid = load_grid(grid_dict())
    assert [f.settings["select_on"] for f in grid.finetune_runs] == ["train-slice"]
    on_dev = load_grid(grid_dict(grid_dict.task("sst2", select_on="dev")))
    assert on_dev.finetune_runs[0].settings["select_on"] == "dev"
    assert on_dev.finetune_runs[0].key != grid.finetune_runs[0].key  # a run chosen on dev is not reused


def test_the_report_says_which_data_chose_and_which_scored(grid_dict, tmp_path):
    grid = load_grid(grid_dict(grid_dict.task("sst2"), grid_dict.task("cola", select_on="dev"),
                               grid_dict.task("rte", select_fraction=0.2)))
    assert selection_of(grid) == {
        "sst2": {"chosen_on": "train-slice", "fraction": 0.1, "scored_on": "dev"},
        "cola": {"chosen_on": "dev", "fraction": None, "scored_on": "dev"},
        "rte": {"chosen_on": "train-slice", "fraction": 0.2, "scored_on": "dev"},
    }
    out = tmp_path / "report"
    out.mkdir()
    paths = write_report([], grid, out)
    text = paths["markdown"].read_text(encoding="utf-8")
    assert "Chosen on a slice of train, scored on dev (sst2, rte)" in text and "10% / 20%" in text
    assert "Chosen and scored on dev (cola)" in text and "optimistic" in text
    assert json.loads(paths["json"].read_text(encoding="utf-8"))["selection"] == selection_of(grid)

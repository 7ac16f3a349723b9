"""The FLAN-style mixture builder on the real GLUE files: held-out task and templates stay out of training."""

from __future__ import annotations

import json

import pytest

from lmlab.errors import LmlabError
from lmlab.tasks import make_task
from lmlab.tasks.instruct_mixture import SPECS, build_mixture


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_mixture_holds_out_a_task_and_a_template_per_task(data_dir, tmp_path):
    out = tmp_path / "mix"
    manifest = build_mixture(data_dir, out, "stsb", tasks=("cola", "rte", "stsb"), per_task=30,
                             eval_per_task=8)
    names = ("train", "heldout_task", "heldout_templates")
    train, held_task, held_tpl = (read(out / f"{n}.jsonl") for n in names)
    assert manifest["counts"] == {"train": 60, "dev": 4, "heldout_templates": 16, "heldout_task": 8}
    assert {r["task"] for r in train} == {"cola", "rte"} and {r["task"] for r in held_task} == {"stsb"}
    assert {r["template"] for r in train} == {0, 1, 2, 3} and {r["template"] for r in held_tpl} == {4}
    assert not {r["instruction"] for r in train} & {r["instruction"] for r in held_tpl + held_task}
    for r in train + held_task:
        assert r["output"] in r["options"] and all(o in r["instruction"] for o in r["options"])
        assert r["output"] == SPECS[r["task"]].answer_words(r["template"])[r["label"]]
    rte_words = {r["output"] for r in train if r["task"] == "rte"}
    assert rte_words == {"no", "yes", "true", "false", "right", "wrong"}      # varied option words
    assert {r["output"] for r in held_tpl} == {"no", "yes"}
    assert "\n" in held_task[0]["input"]              # a pair: one sentence per line
    examples = make_task("instruct", "decoder").read(out / "train.jsonl")   # read back as written
    assert len(examples) == 60 and examples[0].extra["options"] == train[0]["options"]
    build_mixture(data_dir, out, "rte", tasks=("cola", "rte"), per_task=5, eval_per_task=4)  # replaces it


def test_mixture_refuses_bad_settings_and_foreign_directories(data_dir, tmp_path):
    with pytest.raises(LmlabError, match="no instruction templates"):
        build_mixture(data_dir, tmp_path / "m", "mrpc")
    with pytest.raises(LmlabError, match="nothing to train on"):
        build_mixture(data_dir, tmp_path / "m", "rte", tasks=("rte",))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(LmlabError):
        build_mixture(data_dir, mine, "rte", tasks=("cola", "rte"), per_task=5, eval_per_task=4)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert all(len(s.templates) == 5 for s in SPECS.values())

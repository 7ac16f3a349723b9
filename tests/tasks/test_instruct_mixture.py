"""The FLAN-style mixture builder on the real GLUE files: held-out task and templates stay out of training."""

from __future__ import annotations

import json
from collections import Counter

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
        build_mixture(data_dir, tmp_path / "m", "qqp")
    with pytest.raises(LmlabError, match="can only be held out"):
        build_mixture(data_dir, tmp_path / "m", "rte", tasks=("mrpc", "rte", "stsb"))
    with pytest.raises(LmlabError, match="one cap for every trained task"):
        build_mixture(data_dir, tmp_path / "m", "rte", tasks=("cola", "rte", "stsb"), per_task={"cola": 5})
    with pytest.raises(LmlabError, match="per_task"):
        build_mixture(data_dir, tmp_path / "m", "rte", tasks=("cola", "rte"), per_task={"cola": 0})
    with pytest.raises(LmlabError, match="nothing to train on"):
        build_mixture(data_dir, tmp_path / "m", "rte", tasks=("rte",))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(LmlabError):
        build_mixture(data_dir, mine, "rte", tasks=("cola", "rte"), per_task=5, eval_per_task=4)
    assert (mine / "notes.txt").read_text() == "keep me"
    assert all(len(s.templates) == 5 for s in SPECS.values())


def test_mrpc_is_offered_as_a_held_out_task_only_with_a_cap_per_trained_task(data_dir, tmp_path):
    from lmlab.tasks.instruct_mixture import TASK_NAMES

    assert "mrpc" in SPECS and "mrpc" not in TASK_NAMES           # research-use data: never trained
    out = tmp_path / "mix"
    manifest = build_mixture(data_dir, out, "mrpc", tasks=("rte", "stsb"), per_task={"rte": 6, "stsb": 9},
                             eval_per_task=10)
    train, held = read(out / "train.jsonl"), read(out / "heldout_task.jsonl")
    assert manifest["trained_tasks"] == ["rte", "stsb"] and manifest["counts"]["heldout_task"] == 10
    assert Counter(r["task"] for r in train) == {"rte": 6, "stsb": 9}
    assert {r["task"] for r in held} == {"mrpc"} and [r["template"] for r in held] == [0, 1, 2, 3, 4] * 2
    mrpc = [(e.text, e.pair, e.label) for e in make_task("mrpc").read(data_dir / "glue" / "mrpc" / "dev.tsv")]
    for r in held:
        first, second = r["input"].split("\n")
        assert (first, second, r["label"]) in mrpc                      # the evaluation split, labels kept
        assert r["output"] == SPECS["mrpc"].answer_words(r["template"])[r["label"]] in r["options"]
        assert all(o in r["instruction"] for o in r["options"]) and len(r["options"]) == 2
    assert not {r["instruction"] for r in train} & {r["instruction"] for r in held}
    other = tmp_path / "other"                    # another mixture scores the same held-out records
    build_mixture(data_dir, other, "mrpc", tasks=("cola", "rte"), per_task=3, eval_per_task=10)
    assert read(other / "heldout_task.jsonl") == held

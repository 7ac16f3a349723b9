"""`lmlab evaluate --harness` speaks in lmlab's lines only (issue 27): no `fatal: not a git
repository` from the harness asking git for the folder's commit, none of its log warnings or
progress bars; what it did is one line at the start and one at the end."""

from __future__ import annotations

import json

from test_harness import offline, setup  # noqa: F401 - its fixtures: a checkpoint, local task files

from lmlab.cli import main
from lmlab.icl.harness import headline


def test_the_harness_prints_lmlabs_lines_only(setup, tmp_path, monkeypatch, capfd):  # noqa: F811
    monkeypatch.chdir(tmp_path)  # not a git repository (git would say so on the terminal)
    out = tmp_path / "r.json"
    assert main(["evaluate", "--checkpoint", str(setup["root"] / "ck"), "--harness",
                 str(setup["tasks"] / "mc.yaml"), "--out", str(out)]) == 0
    printed, err = capfd.readouterr()
    printed = json.loads(printed)
    assert printed.pop("baseline") and printed == json.loads(out.read_text(encoding="utf-8"))["results"]
    lines = [line for line in err.splitlines() if not line.startswith("warning: lmlab_mc acc ")]  # at chance
    assert len(lines) == 2, err
    assert lines[0].startswith("harness: lmlab_mc on ")
    assert lines[1].startswith("harness: lmlab_mc acc ") and "(6 documents)" in lines[1]
    assert "fatal" not in err and "it/s" not in err


def test_the_headline_names_each_tasks_numbers():
    quiz = {"alias": "quiz", "sample_len": 2, "acc,none": 0.5, "acc_stderr,none": 0.1}
    record = {"results": {"quiz": quiz},
              "n-samples": {"quiz": {"original": 4, "effective": 2}}}
    assert headline(record) == "quiz acc 0.5000 (2 documents)"
    assert headline({}) == "no results"

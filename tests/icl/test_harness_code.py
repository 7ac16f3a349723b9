"""`lmlab evaluate --harness`: a local task file that brings Python code (``!function``) runs it only
with --allow-code; without, a one-line error names the Python file, and nothing of it has run."""

from __future__ import annotations

import json

import pytest
from assertions import assert_one_line_error

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.icl.harness import check_task_code, check_tasks_load, resolve_tasks, run_harness

#: a Python file that leaves a mark when it is imported
HELPERS = """\
import pathlib
pathlib.Path(__file__).with_name("RAN").write_text("imported")


def process_docs(dataset):
    return dataset
"""


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


@pytest.fixture
def tasks(tmp_path):
    """A folder of task files: ``plain`` (no code), ``coded`` (``!function`` through an included
    base YAML, helpers.py beside it), ``imports`` (a module with no file beside) and the group
    ``quiz_group`` of ``plain`` and ``coded``; ``coded`` has the tag ``quiz_tag``."""
    (tmp_path / "mc.jsonl").write_text(json.dumps({"question": "2 + 2 =", "choices": ["4", "5"], "label": 0})
                                       + "\n", encoding="utf-8")
    d = tmp_path / "tasks"
    d.mkdir()
    base = (f"dataset_path: json\ntest_split: test\ndataset_kwargs:\n  cache_dir: {tmp_path / 'cache'}\n"
            f"  data_files:\n    test: {tmp_path / 'mc.jsonl'}\noutput_type: multiple_choice\n"
            "doc_to_text: '{{question}}'\ndoc_to_target: label\ndoc_to_choice: choices\n"
            "metric_list:\n  - metric: acc\n")
    (d / "plain.yaml").write_text("task: plain\n" + base, encoding="utf-8")
    (d / "_coded_base.yaml").write_text(base + "process_docs: !function helpers.process_docs\n",
                                        encoding="utf-8")
    (d / "coded.yaml").write_text("task: coded\ntag: quiz_tag\ninclude: _coded_base.yaml\n", encoding="utf-8")
    (d / "helpers.py").write_text(HELPERS, encoding="utf-8")
    (d / "imports.yaml").write_text("task: imports\n" + base + "process_docs: !function json.loads\n",
                                    encoding="utf-8")
    (d / "group.yaml").write_text("group: quiz_group\ntask:\n  - plain\n  - coded\n", encoding="utf-8")
    return d


@pytest.mark.parametrize("spec, names", [
    ("coded.yaml", "coded.yaml"),              # the task file itself (its include holds the tag)
    ("group.yaml", "group.yaml"),              # a group whose second task brings code
    (".", "tasks"),                            # the whole folder
])
def test_a_task_that_brings_code_is_refused_naming_the_python_file(tasks, spec, names, tmp_path):
    with pytest.raises(LmlabError) as e:
        run_harness(tmp_path / "no-model-needed", str(tasks / spec), out=tmp_path / "r.json")
    assert str(e.value) == (f"task file {tasks / '_coded_base.yaml'} runs Python code: its `!function "
                            f"helpers.process_docs` would run {tasks / 'helpers.py'}; pass --allow-code "
                            "(allow_code=True) to run it, only for task files you trust")
    assert not (tasks / "RAN").exists() and not (tmp_path / "r.json").exists()


def test_a_tag_leads_to_its_tasks(tasks):
    from lm_eval.tasks import TaskManager

    manager = TaskManager(include_path=str(tasks), include_defaults=False)
    with pytest.raises(LmlabError, match=r"_coded_base\.yaml runs Python code"):
        check_task_code(["quiz_tag"], manager)
    check_task_code(["plain"], manager)


def test_a_function_from_an_installed_module_is_refused_too(tasks):
    names, manager = resolve_tasks(str(tasks / "imports.yaml"))
    with pytest.raises(LmlabError, match=r"imports\.yaml runs Python code: its `!function json\.loads` would "
                                         r"run the Python module 'json'"):
        check_task_code(names, manager)


def test_allow_code_runs_it_and_a_task_without_code_needs_nothing(tasks):
    names, manager = resolve_tasks(str(tasks / "plain.yaml"))
    check_task_code(names, manager)                       # no code: nothing to allow
    names, manager = resolve_tasks(str(tasks / "coded.yaml"))
    check_task_code(names, manager, allow_code=True)
    check_tasks_load(names, manager)
    assert (tasks / "RAN").read_text() == "imported"


def test_the_cli_refuses_in_one_line_and_allow_code_goes_with_harness(tasks, tmp_path, capsys):
    args = ["evaluate", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "r.json")]
    assert main([*args, "--harness", str(tasks / "coded.yaml")]) == 2
    assert_one_line_error(capsys, f"would run {tasks / 'helpers.py'}; pass --allow-code")
    assert not (tasks / "RAN").exists()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "ck"), "--data", "x.tsv", "--allow-code"]) == 2
    assert_one_line_error(capsys, "--allow-code applies only with --harness")

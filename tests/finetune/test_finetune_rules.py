"""One home for "a fine-tuning run's settings are valid": the rules between settings are the
[finetune] section's (lmlab.config.finetune.RULES, TASK_RULES), so `lmlab finetune`, Python's
lmlab.finetune.finetune and a compare grid ([finetune], [[tasks]] finetune, --set finetune.X,
--dry-run) refuse the same things before any work, each naming the setting as its user wrote it:
a flag, a grid key, a keyword. A grid's fine-tuning checks (select_metric, max_length, device) run
when the grid is planned, not after an arm has pretrained."""

from __future__ import annotations

import copy

import pytest
import torch
from assertions import assert_one_line_error, exit_code

from lmlab.config.finetune import FinetuneConfig
from lmlab.config.toml import parse_value
from lmlab.errors import LmlabError
from lmlab.lab import load_grid, run_grid

SST2 = "sentence\tlabel\ngood film\t1\nbad film\t0\nfine film\t1\nawful film\t0\n"


@pytest.fixture()
def sst2_files(tmp_path):
    train, dev = tmp_path / "train.tsv", tmp_path / "dev.tsv"
    train.write_text(SST2, encoding="utf-8")
    dev.write_text(SST2, encoding="utf-8")
    return train, dev


def base_argv(tmp_path, train, dev) -> list[str]:
    return ["finetune", "--checkpoint", str(tmp_path / "no-model"), "--task", "sst2", "--train", str(train),
            "--dev", str(dev), "--out", str(tmp_path / "out")]


# --------------------------------------------------------------------------- lmlab finetune

#: flags given without their partner -> the words of the one line (the flag, then its partner)
CLI_CASES = {
    "select_fraction": (["--select-fraction", "0.3"], "--select-fraction", "--select-on train-slice"),
    "lr_sweep": (["--lr-sweep", "1e-3", "1e-4"], "--lr-sweep", "--lr auto"),
    "doc_stride": (["--doc-stride", "64"], "--doc-stride", "--task qa or squad"),
    "max_answer_length": (["--max-answer-length", "10"], "--max-answer-length", "--task qa or squad"),
    "max_bad_fraction": (["--max-bad-fraction", "0.5"], "--max-bad-fraction", "--on-bad-line skip"),
    "delimiter": (["--format", "tsv", "--delimiter", ";"], "--delimiter", "--format csv"),
    "rouge_stemmer": (["--rouge-stemmer"], "--rouge-stemmer", "--task text2text"),
    "packing": (["--no-packing"], "--packing/--no-packing", "--task instruct"),
    "template": (["--template", "TEMPLATE"], "--template", "--task instruct"),
    # instruction tuning reads none of a decoder classifier's settings, nor a text-to-text prefix
    "lm_weight": (["--task", "instruct", "--lm-weight", "0.3"], "--lm-weight", "a task other than instruct"),
    "decoder_style": (["--task", "instruct", "--decoder-style", "last"], "--decoder-style",
                      "a task other than instruct"),
    "prefix": (["--task", "instruct", "--prefix", "sst2: "], "--prefix", "a task other than instruct"),
}


def test_every_rule_of_the_section_is_tried_here():
    from lmlab.config.finetune import RULES, TASK_RULES
    from lmlab.config.rules import NotAbove

    assert {r.flag for r in (*RULES, *TASK_RULES) if not isinstance(r, NotAbove)} == set(CLI_CASES)
    assert {r.flag for r in RULES if isinstance(r, NotAbove)} == {"warmup_steps"}  # tried below


def test_a_warmup_longer_than_the_run_is_refused_everywhere(tmp_path, capsys, sst2_files, grid):
    from lmlab.finetune import finetune

    argv = base_argv(tmp_path, *sst2_files)
    assert exit_code([*argv, "--max-steps", "2", "--set", "finetune.warmup_steps=1000"]) == 2
    assert_one_line_error(capsys, "error: --set finetune.warmup_steps 1000 is more than --max-steps 2 "
                                  "(the learning rate would never reach lr); lower --set "
                                  "finetune.warmup_steps to at most 2, or raise --max-steps")  # no such flag
    assert not (tmp_path / "out").exists()
    with pytest.raises(LmlabError, match="warmup_steps 1000 is more than max_steps 2"):
        finetune(tmp_path / "no-model", "sst2", *sst2_files, tmp_path / "out", warmup_steps=1000, max_steps=2)
    msg = grid_error(grid, ["finetune.max_steps=1", "finetune.warmup_steps=1000"])
    assert msg.startswith("task 'sst2': --set finetune.warmup_steps 1000 is more than --set "
                          "finetune.max_steps 1"), msg  # named as given, and not as the grid file's
    grid["finetune"].update(max_steps=1, warmup_steps=1000)
    msg = grid_error(grid)
    assert "finetune.warmup_steps 1000 is more than finetune.max_steps 1" in msg and "--" not in msg, msg
    del grid["finetune"]["max_steps"], grid["finetune"]["warmup_steps"]
    load_grid(copy.deepcopy(grid), ["finetune.max_steps=10", "finetune.warmup_steps=10"])


@pytest.mark.parametrize("field", sorted(CLI_CASES))
def test_cli_refuses_a_setting_without_its_partner_naming_the_flags(tmp_path, capsys, sst2_files, field):
    template = tmp_path / "template.txt"
    template.write_text("{instruction}\n", encoding="utf-8")
    extra, flag, partner = CLI_CASES[field]
    argv = base_argv(tmp_path, *sst2_files) + [str(template) if a == "TEMPLATE" else a for a in extra]
    assert exit_code(argv) == 2
    assert_one_line_error(capsys, f"error: {flag} applies only with {partner}", f"drop {flag}")
    assert not (tmp_path / "out").exists()


def test_cli_names_a_setting_where_config_or_set_wrote_it(tmp_path, capsys, sst2_files):
    argv = base_argv(tmp_path, *sst2_files)
    assert exit_code([*argv, "--set", "finetune.doc_stride=64"]) == 2
    assert_one_line_error(capsys, "error: --set finetune.doc_stride applies only with --task qa or squad")
    config = tmp_path / "ft.toml"
    config.write_text("[finetune]\nepochs = 1\nselect_fraction = 0.3\n", encoding="utf-8")
    assert exit_code([*argv, "--config", str(config)]) == 2
    assert_one_line_error(capsys, f"error: {config}:3: finetune.select_fraction applies only with "
                          "--select-on train-slice")
    # the partner in the file, or from --set: the rule holds (the missing checkpoint is what stops it)
    config.write_text('[finetune]\nlr = "auto"\n', encoding="utf-8")
    assert exit_code([*argv, "--config", str(config), "--lr-sweep", "1e-3"]) == 2
    assert_one_line_error(capsys, "no-model")
    config.write_text("[finetune]\nselect_fraction = 0.3\n", encoding="utf-8")
    assert exit_code([*argv, "--config", str(config), "--set", "finetune.select_on=train-slice"]) == 2
    assert_one_line_error(capsys, "no-model")


def test_cli_names_the_flags_of_a_delimiter_for_a_tsv_file(tmp_path, capsys, sst2_files):
    assert exit_code([*base_argv(tmp_path, *sst2_files), "--delimiter", ";"]) == 2
    assert_one_line_error(capsys, "error: --delimiter applies to CSV, but ", "is a TSV file",
                          "drop --delimiter, or add --format csv")


def test_cli_partners_given_pass_the_rules(tmp_path, capsys, sst2_files):
    train, dev = sst2_files
    csv_train, csv_dev = tmp_path / "train.csv", tmp_path / "dev.csv"
    argv = base_argv(tmp_path, csv_train, csv_dev) + [
        "--select-on", "train-slice", "--select-fraction", "0.3", "--lr", "auto", "--lr-sweep", "1e-3",
        "--on-bad-line", "skip", "--max-bad-fraction", "0.5", "--delimiter", ";"]
    assert exit_code(argv) == 2
    assert_one_line_error(capsys, "no-model")  # every rule held: the missing checkpoint stops it


# --------------------------------------------------------------------------- Python


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"doc_stride": 64}, 'doc_stride applies only with task="qa" or "squad"'),
    ({"lr_sweep": [1e-3]}, 'lr_sweep applies only with lr="auto"'),
    ({"max_bad_fraction": 0.5}, 'max_bad_fraction applies only with on_bad_line="skip"'),
    ({"select_fraction": 0.3}, 'select_fraction applies only with select_on="train-slice"'),
    ({"template": "{instruction}"}, 'template applies only with task="instruct"'),
    ({"packing": False}, 'packing applies only with task="instruct"'),
    ({"delimiter": ";"}, 'delimiter applies to CSV, but '),
])
def test_python_refuses_what_the_cli_refuses_naming_the_keyword(tmp_path, sst2_files, kwargs, words):
    from lmlab.finetune import finetune

    with pytest.raises(LmlabError) as e:
        finetune(tmp_path / "no-model", "sst2", *sst2_files, tmp_path / "out", **kwargs)
    assert str(e.value).startswith(words), str(e.value)
    assert not (tmp_path / "out").exists()


def test_python_partners_given_pass_the_rules(tmp_path, sst2_files):
    from lmlab.finetune import finetune

    with pytest.raises(LmlabError, match="no-model"):  # past the rules: the missing checkpoint stops it
        finetune(tmp_path / "no-model", "sst2", *sst2_files, tmp_path / "out", lr="auto", lr_sweep=[1e-3],
                 select_on="train-slice", select_fraction=0.3, on_bad_line="skip", max_bad_fraction=0.5)
    FinetuneConfig.from_dict({"doc_stride": 64}).check_task("squad", {"doc_stride"})


def test_python_refuses_an_unknown_select_metric_before_any_step(ckpt, tmp_path, sst2_files, monkeypatch):
    """It used to be found at the first evaluation, after training steps."""
    from lmlab.finetune import finetune
    from lmlab.finetune.run import FinetuneRun

    def no_training(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr(FinetuneRun, "fit_loop", no_training)
    with pytest.raises(LmlabError, match="select_metric 'bogus' is not a metric of task sst2; choose one of: "
                       "accuracy"):
        finetune(ckpt, "sst2", *sst2_files, None, select_metric="bogus", max_steps=1, progress=False,
                 log=lambda msg: None)


def test_the_cli_names_an_unknown_select_metric_as_its_flag(ckpt, tmp_path, sst2_files, capsys):
    """probe8 #8: ``lmlab finetune --select-metric bleu`` said ``select_metric 'bleu'``, the keyword."""
    argv = base_argv(tmp_path, *sst2_files)
    argv[argv.index("--checkpoint") + 1] = str(ckpt)
    assert exit_code([*argv, "--select-metric", "bleu", "--max-steps", "1", "--no-progress"]) == 2
    assert_one_line_error(capsys, "error: --select-metric 'bleu' is not a metric of task sst2; "
                                  "choose one of: accuracy")


def test_a_select_metric_checked_at_the_first_evaluation_is_named_as_its_flag(ckpt, tmp_path, sst2_files,
                                                                               capsys, monkeypatch):
    """A task that cannot tell its metrics before scoring (``metric_names`` None) has
    ``--select-metric`` checked at its first evaluation: that message named the keyword."""
    from lmlab.tasks.base import Task

    monkeypatch.setattr(Task, "metric_names", lambda self, examples: None)
    argv = base_argv(tmp_path, *sst2_files)
    argv[argv.index("--checkpoint") + 1] = str(ckpt)
    assert exit_code([*argv, "--select-metric", "bleu", "--max-steps", "1", "--no-progress"]) == 2
    last = capsys.readouterr().err.splitlines()[-1]  # after the plan: the check needed a score
    assert last == "error: --select-metric 'bleu' is not a metric of task sst2; choose one of: accuracy", last


# --------------------------------------------------------------------------- grids


@pytest.fixture()
def grid(tmp_path, data_dir, sst2_files):
    """Two arms (mlm, none) of a tiny bert, a tiny token budget, sst2 from small files."""
    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "corpus.txt").write_text(text[:20_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(text[-5_000:], encoding="utf-8")
    train, dev = sst2_files
    return {"name": "t", "seeds": [0], "budget": {"tokens": 2560},
            "pretrain": {"data": {"train": [str(tmp_path / "corpus.txt")], "val": [str(tmp_path / "val.txt")],
                                  "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                         "train": {"batch_size": 8, "seq_len": 32, "lr": 1e-3},
                         "model": {"max_positions": 64}},
            "arms": [{"name": "bert", "preset": "bert-tiny", "objective": "mlm"},
                     {"name": "scratch", "preset": "bert-tiny", "objective": "none"}],
            "finetune": {"epochs": 1, "lr": 1e-3},
            "tasks": [{"task": "sst2", "train": str(train), "dev": str(dev)}]}


def grid_error(raw, overrides=()) -> str:
    with pytest.raises(LmlabError) as e:
        load_grid(copy.deepcopy(raw), list(overrides))
    assert "\n" not in str(e.value)
    return str(e.value)


@pytest.mark.parametrize(("override", "words"), [
    ("finetune.doc_stride=64", 'finetune.doc_stride applies only with tasks[0].task = "qa" or "squad"'),
    ("finetune.lr_sweep=[1e-3]", 'finetune.lr_sweep applies only with finetune.lr = "auto"'),
    ("finetune.max_bad_fraction=0.5", 'finetune.max_bad_fraction applies only with finetune.on_bad_line = '
                                      '"skip"'),
    ("finetune.packing=true", 'finetune.packing applies only with tasks[0].task = "instruct"'),
    ('finetune.template="{instruction}"', 'finetune.template applies only with tasks[0].task = "instruct"'),
    ("finetune.rouge_stemmer=true", 'finetune.rouge_stemmer applies only with tasks[0].task = "text2text"'),
    ("finetune.select_metric='bogus'", "finetune.select_metric 'bogus' is not a metric of task sst2; "
                                       "choose one of: accuracy"),
    ("finetune.delimiter=';'", "finetune.delimiter applies to CSV, but "),
    ("finetune.max_length=100000", "finetune.max_length 100000 exceeds the model's 64 positions; use "
                                   "finetune.max_length 64 or less"),
])
def test_a_grid_refuses_what_a_fine_tuning_would_naming_the_grid_key(grid, override, words):
    key, text = override.split("=", 1)
    written = copy.deepcopy(grid)
    written["finetune"][key.removeprefix("finetune.")] = parse_value(text)
    msg = grid_error(written)  # written in the grid: named by its key
    assert words in msg and "--" not in msg, msg
    msg = grid_error(grid, [override])  # given by --set: named as that --set
    assert f"--set {key}" in msg and words.split(" ", 1)[1].split(";")[0] in msg, msg


def test_a_grid_names_a_tasks_own_setting_and_partner(grid):
    grid["tasks"][0]["finetune"] = {"select_on": "dev", "select_fraction": 0.2}
    msg = grid_error(grid)
    assert 'tasks[0].finetune.select_fraction applies only with tasks[0].finetune.select_on = "train-slice"' \
        in msg, msg
    grid["tasks"][0]["finetune"] = {"doc_stride": 64}
    assert grid_error(grid).startswith("tasks[0].finetune.doc_stride applies only with tasks[0].task")


def test_a_grid_with_the_partners_given_loads(grid):
    # select_fraction with the grid's own select_on (train-slice); lr_sweep with lr auto from a task
    grid["finetune"].update(select_fraction=0.2, lr_sweep=[1e-3])
    grid["tasks"][0]["finetune"] = {"lr": "auto", "on_bad_line": "skip", "max_bad_fraction": 0.5,
                                    "select_metric": "accuracy", "max_length": 64}
    assert len(load_grid(grid).finetune_runs) == 2


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize(("override", "key"), [("finetune.device='cuda'", "finetune.device"),
                                               ("pretrain.train.device='cuda'", "pretrain.train.device")])
def test_a_device_this_machine_lacks_is_refused_by_the_dry_run_not_by_reading(grid, tmp_path, override, key):
    written = copy.deepcopy(grid)  # written in the grid's tables (a --set is named as that --set)
    table, name = key.rsplit(".", 1)
    node = written
    for part in table.split("."):
        node = node.setdefault(part, {})
    node[name] = override.split("=", 1)[1].strip("'")
    planned = load_grid(written)  # reading a grid (a GPU run's, to report it) works
    with pytest.raises(LmlabError, match=rf"^{key} cuda asked for but CUDA is not available; use {key} cpu"):
        run_grid(planned, tmp_path / "cmp", dry_run=True, log=lambda msg: None)
    with pytest.raises(LmlabError, match=rf"^{key} cuda"):
        run_grid(planned, tmp_path / "cmp", log=lambda msg: None)
    assert not (tmp_path / "cmp").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_compare_dry_run_refuses_a_device_naming_the_key(grid, tmp_path, capsys):
    from lmlab.config.toml import to_toml

    path = tmp_path / "g.toml"
    path.write_text(to_toml(grid), encoding="utf-8")
    argv = ["compare", "--config", str(path), "--out", str(tmp_path / "cmp"), "--dry-run", "--set",
            "finetune.device='cuda'"]
    assert exit_code(argv) == 2
    assert_one_line_error(capsys, "finetune.device cuda asked for but CUDA is not available")


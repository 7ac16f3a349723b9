"""The one config system (lmlab.config): sections read from TOML and --set, one error style naming
the file and line, the flag or the --set; finetune and align read [finetune]/[align] tables."""

from __future__ import annotations

import argparse
import dataclasses
import glob
import tomllib

import pytest

from lmlab.config import load_config, to_toml
from lmlab.errors import LmlabError
from tests.assertions import assert_one_line_error, exit_code

#: a run folder's config.toml as the trainer wrote it before lmlab.config existed (t5-tiny-spans)
OLD_RUN_CONFIG = """\
[model]
preset = "t5-tiny"
vocab_size = 4196
dropout = 0.0

[objective]
name = "t5"
noise_density = 0.15
mean_span_length = 3.0
variant = "spans"

[data]
train = ["$LMLAB_DATA/pretrain/gutenberg", "$LMLAB_DATA/pretrain/tinyshakespeare/input.txt"]
val = []
val_fraction = 0.05
max_tokens = 0
doc_separator = "blank-line"
encoding = "utf-8"
append_eos = false
text_field = "text"
workers = 1
cache_dir = ""

[data.tokenizer]
algo = "bytelevel"
vocab_size = 4096

[train]
max_steps = 600
batch_size = 16
seq_len = 128
lr = 0.003
min_lr = 0.0003
warmup_steps = 50
decay_steps = 600
schedule = "cosine"
weight_decay = 0.1
betas = [0.9, 0.98]
eps = 1e-08
grad_accum = 1
clip = 1.0
eval_every = 100
eval_batches = 16
eval_at_start = true
checkpoint_every = 200
keep_checkpoints = 3
log_every = 1
seed = 1337
threads = 0
precision = "auto"
device = "auto"
distributed = "auto"
progress = "auto"
compile = false
compile_backend = "inductor"
activation_checkpointing = false
peak_tflops = 0.0
attention = "auto"
prefetch = true
loggers = []
"""


@pytest.mark.parametrize("recipe", sorted(glob.glob("configs/*.toml")))
def test_every_recipe_writes_back_to_the_same_config(recipe):
    cfg = load_config(recipe)
    assert load_config(tomllib.loads(to_toml(cfg))) == cfg


def test_an_old_run_folder_config_reads_back_the_same(tmp_path):
    saved = tmp_path / "config.toml"
    saved.write_text(OLD_RUN_CONFIG)
    cfg = load_config(saved)
    assert cfg == load_config("configs/t5-tiny-spans.toml")
    assert to_toml(cfg) == OLD_RUN_CONFIG  # and is written the same way again


def test_the_old_import_paths_are_the_new_sections():
    from lmlab import config
    from lmlab.align.config import AlignConfig
    from lmlab.finetune.config import FinetuneConfig
    from lmlab.train import config as train_config

    assert train_config.RunConfig is config.RunConfig and train_config.load_config is config.load_config
    assert FinetuneConfig.__module__ == "lmlab.config.finetune"
    assert AlignConfig.__module__ == "lmlab.config.align"


def test_a_misspelled_set_key_names_the_closest_field():
    with pytest.raises(LmlabError) as e:
        load_config("configs/gpt-tiny-clm.toml", ["train.max_step=5"])
    assert "--set train.max_step" in e.value.problem and "did you mean train.max_steps?" in e.value.fix


def test_a_recipe_value_error_names_the_file_and_line(tmp_path):
    recipe = tmp_path / "r.toml"
    recipe.write_text(open("configs/gpt-tiny-clm.toml").read().replace("lr = ", "lr = -", 1))
    line = recipe.read_text().splitlines().index(next(x for x in recipe.read_text().splitlines()
                                                     if x.startswith("lr = -"))) + 1
    with pytest.raises(LmlabError, match=rf"^{recipe}:{line}: train.lr must be greater than 0"):
        load_config(recipe)


@pytest.mark.parametrize("line, says, fix", [
    ('max_steps = "10"', "train.max_steps must be a whole number, got the string '10'", "max_steps = 10"),
    ('lr = "3e-4"', "train.lr must be a number, got the string '3e-4'", "lr = 3e-4"),
    ('compile = "false"', "train.compile must be true or false, got the string 'false'", "compile = false"),
    ('progress = "off"', "", ""),  # progress takes a word: a string is its type
    ('betas = "0.9,0.95"', "train.betas must be a list, got the string '0.9,0.95'", "betas = [...]"),
    ('seed = "many"', "train.seed must be a whole number, got the string 'many'", "seed = 100"),
])
def test_a_file_writes_numbers_without_quotes_and_a_set_writes_text(tmp_path, line, says, fix):
    recipe = tmp_path / "r.toml"
    recipe.write_text(f'[model]\npreset = "gpt2-tiny"\n[objective]\nname = "clm"\n[data]\ntrain = "t.txt"\n'
                      f"[train]\n{line}\n")
    if not says:
        load_config(recipe)
        return
    with pytest.raises(LmlabError) as e:  # was quietly converted: "types are checked"
        load_config(recipe)
    assert says in e.value.problem and e.value.problem.startswith(f"{recipe}:") and fix in e.value.fix
    # the command line is text: the same values given there are parsed
    given = ["train.max_steps=10", "train.lr=3e-4", "train.betas=0.9,0.95"]
    cfg = load_config("configs/gpt-tiny-clm.toml", given)
    assert (cfg.train.max_steps, cfg.train.lr, list(cfg.train.betas)) == (10, 3e-4, [0.9, 0.95])


def test_finetune_and_align_tables_are_as_strict(tmp_path, capsys):
    from lmlab.config.align import AlignConfig
    from lmlab.finetune import FinetuneConfig

    f = tmp_path / "ft.toml"
    f.write_text('[finetune]\nepochs = "2"\n')
    assert exit_code([*FINETUNE, "--config", str(f)]) == 2
    assert_one_line_error(capsys, f"{f}:2: finetune.epochs must be a whole number, got the string '2'")
    assert exit_code([*FINETUNE, "--set", "finetune.epochs=2", "--set", "finetune.lr=3e-4"]) == 2
    assert_one_line_error(capsys, "no/such/checkpoint")  # the settings passed: the missing model is next
    with pytest.raises(LmlabError, match="align.beta must be a number, got the string '0.2'"):
        AlignConfig.from_dict({"beta": "0.2"})  # a grid's or a caller's dict: typed too
    assert FinetuneConfig.from_dict({"lr": "auto", "epochs": 2}).lr == "auto"


# --------------------------------------------------------------------------- finetune and align
FINETUNE = ["finetune", "--checkpoint", "no/such/checkpoint", "--task", "sst2", "--train", "t.tsv",
            "--dev", "d.tsv", "--out", "ft"]
ALIGN = ["align", "--checkpoint", "no/such/checkpoint", "--train", "t.jsonl", "--dev", "d.jsonl",
         "--out", "al"]


def test_a_bad_value_in_a_finetune_toml_is_one_line_before_any_model(tmp_path, capsys):
    f = tmp_path / "ft.toml"
    f.write_text("[finetune]\nepochs = 2\nlr = -1\n")
    # the checkpoint does not exist: the settings are refused before it is looked at
    assert exit_code([*FINETUNE, "--config", str(f)]) == 2
    assert_one_line_error(capsys, f"{f}:3: finetune.lr must be greater than 0 (got -1)")


@pytest.mark.parametrize("argv,page", [(FINETUNE, "docs/finetuning.md"), (ALIGN, "docs/align.md")])
def test_a_missing_config_file_points_at_an_example_that_exists(argv, page, tmp_path, capsys):
    from pathlib import Path

    assert exit_code([*argv, "--config", str(tmp_path / "none.toml")]) == 2
    assert_one_line_error(capsys, "does not exist", page)
    assert (Path(__file__).parents[2] / page).is_file()


def test_a_misspelled_finetune_set_or_file_key_names_the_closest_field(tmp_path, capsys):
    assert exit_code([*FINETUNE, "--set", "finetune.epoch=2"]) == 2
    assert_one_line_error(capsys, "--set finetune.epoch", "did you mean finetune.epochs?")
    f = tmp_path / "al.toml"
    f.write_text("[align]\nbeat = 0.2\n")
    assert exit_code([*ALIGN, "--config", str(f)]) == 2
    assert_one_line_error(capsys, f"{f}:2: align.beat", "did you mean align.beta?")
    with pytest.raises(LmlabError, match="did you mean epochs"):
        from lmlab.finetune import FinetuneConfig

        FinetuneConfig.from_dict({"epoch": 2})


def _parse(argv):
    from lmlab.cli import build_parser

    return build_parser().parse_args(argv)


def test_file_then_flags_then_set(tmp_path):
    from lmlab.cli.finetune import settings_of

    f = tmp_path / "ft.toml"
    f.write_text("[finetune]\nlr = 1e-4\nepochs = 5\nbatch_size = 8\nbetas = [0.9, 0.98]\n")
    args = _parse([*FINETUNE, "--config", str(f), "--epochs", "2", "--batch-size", "4",
                   "--set", "finetune.batch_size=16", "--no-header", "--text-field", "1"])
    assert settings_of(args) == {"lr": 1e-4, "epochs": 2, "batch_size": 16, "betas": (0.9, 0.98),
                                 "header": False, "fields": {"text": "1"}}
    assert settings_of(_parse(FINETUNE)) == {}  # nothing given: every default is the section's


def _flag_fields(parser_argv, cls, mapped):
    """(section fields that no flag sets, flags whose destination is not a field)."""
    from lmlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[parser_argv]
    fields = {f.name for f in dataclasses.fields(cls)}
    dests = {a.dest: a.option_strings[0] for a in parser._actions if a.option_strings and a.dest != "help"}
    orphans = {flag for dest, flag in dests.items() if dest not in fields and dest not in mapped}
    return fields - set(dests), orphans


def test_every_finetune_flag_is_a_field_and_every_field_has_a_flag_or_a_reason():
    from lmlab.cli.finetune import FIELD_FLAGS, NO_FLAG
    from lmlab.finetune import FinetuneConfig

    mapped = {"checkpoint", "task", "train", "dev", "out", "method", "method_option", "tokenizer", "config",
              "overrides", "resume", "template_file", *(f"field_{role}" for role in FIELD_FLAGS)}
    unflagged, orphans = _flag_fields("finetune", FinetuneConfig, mapped)
    assert orphans == set()
    assert unflagged == set(NO_FLAG)


def test_every_align_flag_is_a_field_and_every_field_has_a_flag_or_a_reason():
    from lmlab.align import AlignConfig
    from lmlab.cli.align import NO_FLAG

    mapped = {"checkpoint", "train", "dev", "out", "tokenizer", "config", "overrides", "resume"}
    unflagged, orphans = _flag_fields("align", AlignConfig, mapped)
    assert orphans == set()
    assert unflagged == set(NO_FLAG)


def test_the_align_tasks_are_the_templates():
    from lmlab.align.from_task import TEMPLATES
    from lmlab.config.align import TASKS

    assert TASKS == tuple(TEMPLATES)


def test_a_flag_takes_the_range_of_its_field(capsys):
    assert exit_code([*FINETUNE, "--select-on", "devv"]) == 2
    assert "'dev', 'train-slice'" in capsys.readouterr().err
    assert exit_code([*ALIGN, "--samples", "0"]) == 2
    assert "--samples" in capsys.readouterr().err


# --------------------------------------------------------------------------- malformed --set keys
PRETRAIN = ["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", "no/such/run"]


@pytest.mark.parametrize(
    ("argv", "item", "problem", "fix"),
    [
        (PRETRAIN, "train.=1", "--set key `train.` has an empty part",
         "write SECTION.KEY=VALUE, e.g. train.max_steps=100"),
        (PRETRAIN, ".lr=1", "--set key `.lr` has an empty part", "e.g. train.max_steps=100"),
        (PRETRAIN, "objective=clm", "objective is a section", "set one of its keys, e.g. objective.name=clm"),
        (PRETRAIN, "model=5", "model is a section", "e.g. model.preset="),
        (PRETRAIN, "max_steps=5", "--set key `max_steps` names no section", "e.g. train.max_steps="),
        (FINETUNE, "finetune=5", "finetune is a section", "e.g. finetune.epochs=3"),
        (FINETUNE, "finetune.=5", "--set key `finetune.` has an empty part", "e.g. finetune.epochs=3"),
        (FINETUNE, "lr", "is not of the form SECTION.KEY=VALUE", "e.g. --set finetune.epochs=3"),
        (ALIGN, "align.=1", "--set key `align.` has an empty part", "e.g. align.beta=0.1"),
        (ALIGN, "align=1", "align is a section", "e.g. align.beta=0.1"),
    ],
)
def test_a_malformed_set_key_gets_the_right_form(argv, item, problem, fix, capsys):
    assert exit_code([*argv, "--set", item]) == 2
    err = assert_one_line_error(capsys, problem, fix)
    assert ".train." not in err and "finetune.finetune" not in err and "align.align" not in err


@pytest.mark.parametrize(("item", "problem"), [("budget.=1", "--set key `budget.` has an empty part"),
                                               ("pretrain=5", "pretrain is a section")])
def test_compare_reads_set_with_the_same_reader(item, problem):
    from lmlab.lab import load_grid

    with pytest.raises(LmlabError, match=problem.replace(".", r"\.")):
        load_grid({"budget": {"tokens": 1}}, [item])


def test_overrides_apply_in_order_so_a_later_one_wins():
    """Overrides compose (docs/training.md: a quick list, then one more setting): each applies in
    turn, as `--set` does on the command line, in recipes, fine-tuning and grids alike."""
    from lmlab.lab import load_grid

    cfg = load_config("configs/gpt-tiny-clm.toml", ["train.max_steps=2", "train.max_steps=3"])
    assert cfg.train.max_steps == 3
    cfg = load_config("configs/gpt-tiny-clm.toml",
                      ["train.lr=1e-3", "train.betas=[0.9,0.95]", "train.lr=5e-4"])
    assert list(cfg.train.betas) == [0.9, 0.95] and cfg.train.lr == 5e-4
    grid = load_grid("configs/grids/objectives-tiny.toml", ["budget.tokens=20480", "budget.tokens=40960"])
    assert grid.budget.amount == 40960


def test_a_quoted_number_in_a_list_shows_the_list_to_write(tmp_path):
    """betas = [0.9, "0.95"]: the fix writes the whole list, not `betas = 0.95`."""
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\npreset = "gpt2-tiny"\n[objective]\nname = "clm"\n[data]\ntrain = "t.txt"\n'
                      '[train]\nbetas = [0.9, "0.95"]\n')
    with pytest.raises(LmlabError) as e:
        load_config(recipe)
    assert "train.betas[1] must be a number, got the string '0.95'" in e.value.problem
    assert e.value.fix == "write it without quotes: betas = [0.9, 0.95]"

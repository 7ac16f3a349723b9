"""One validator (lmlab.values): every value lmlab reads from a flag, a recipe, ``--set`` or a grid
is checked against one typed range before any work, and a refused value is one line naming the
flag or the file and key, the value and the fix, with exit code 2."""

from __future__ import annotations

import argparse
import math
import typing

import pytest
from assertions import assert_one_line_error, exit_code

from lmlab import values
from lmlab.cli import build_parser
from lmlab.errors import LmlabError

HUGE = str(2**64)  # above every integer range (a seed's is 0 .. 2**63 - 1)
TINY_GRID = 'name = "g"\nbudget = {tokens = 100000}\n[pretrain.data]\ntrain = ["x.txt"]\n'


def refused(capsys, argv: list[str], *needles: str) -> str:
    """``lmlab ARGV`` exits with 2 and one ``error: ...`` line holding every needle."""
    assert exit_code(argv) == 2
    return assert_one_line_error(capsys, *needles)


# --------------------------------------------------------------------------- the cases found on main
FT = ["finetune", "--checkpoint", "ck", "--task", "sst2", "--train", "t.tsv", "--dev", "d.tsv", "--out", "o"]
ALIGN = ["align", "--checkpoint", "ck", "--train", "t.jsonl", "--dev", "d.jsonl", "--out", "o"]
DISTILL = ["compress", "distill", "--teacher", "ck", "--train", "t.tsv", "--out", "o"]
TRAIN_TOK = ["tokenizer", "train", "--algo", "bpe", "--vocab-size", "100", "--input", "c.txt", "--out", "o"]


@pytest.mark.parametrize("argv, needle", [
    (["generate", "--checkpoint", "ck", "--seed", "-1"], "argument --seed: must be at least 0 (got '-1')"),
    (["generate", "--checkpoint", "ck", "--seed", HUGE], "--seed: must be at most 9223372036854775807"),
    ([*FT, "--seed", "-1"], "argument --seed: must be at least 0"),
    ([*FT, "--seed", HUGE], "argument --seed: must be at most"),
    ([*ALIGN, "--seed", "-1"], "argument --seed: must be at least 0"),
    ([*DISTILL, "--seed", HUGE], "argument --seed: must be at most"),
    ([*ALIGN, "--device", "meta"], "argument --device: is not a device lmlab runs on (got 'meta'); use auto"),
    ([*FT, "--device", "meta"], "argument --device: is not a device"),
    (["generate", "--checkpoint", "ck", "--device", "meta"], "argument --device: is not a device"),
    (["compress", "quantize", "--checkpoint", "ck", "--out", "o", "--threads", "-1"],
     "argument --threads: must be at least 0 (got '-1')"),
    ([*DISTILL, "--lr", "nan"], "argument --lr: must be a finite number (got 'nan'); use a learning rate"),
    (["scale", "fit", "--huber-delta", "nan"], "argument --huber-delta: must be a finite number (got 'nan')"),
    (["generate", "--checkpoint", "ck", "--length-penalty", "nan"], "--length-penalty: must be a finite"),
    ([*TRAIN_TOK, "--special-tokens", "[PAD]", ""], "argument --special-tokens: must not be empty (got '')"),
    ([*FT, "--delimiter", '"'], "argument --delimiter: is CSV's quote character"),
    ([*TRAIN_TOK, "--sentinels", "-3"], "argument --sentinels: must be at least 0 (got '-3')"),
    ([*DISTILL, "--temperature", "nan"], "argument --temperature: must be a finite number (got 'nan'); use a "
                                         "temperature"),
    ([*FT, "--method", "lora2"], "argument --method: invalid choice: 'lora2'"),
])
def test_the_bad_flags_found_on_main_are_one_line_errors(capsys, argv, needle):
    err = refused(capsys, argv, needle)
    assert "learning rate" not in err or "--lr" in err  # a temperature is no learning-rate problem
    assert "not one character" not in err


def test_a_delimiter_that_is_one_character_is_not_called_longer(capsys):
    err = refused(capsys, [*FT, "--delimiter", "ab"], "must be one character or one of tab")
    assert "(got 'ab')" in err
    assert values.check(values.Delimiter, "tab", "--delimiter") == "tab"  # kept as written
    assert values.delimiter_character("tab") == "\t"


def test_recipe_values_name_the_file_or_the_set(tmp_path, capsys):
    out = tmp_path / "run"
    for setting, needle in [
        ("train.seed=-1", "--set train.seed must be at least 0 (got -1)"),
        (f"train.seed={HUGE}", "--set train.seed must be at most 9223372036854775807"),
        ("train.seed=true", "--set train.seed must be a number, not true or false (got True)"),
        ("train.lr=nan", "--set train.lr must be a finite number"),
        ("train.device=meta", "--set train.device is not a device lmlab runs on (got 'meta')"),
        ("train.threads=-1", "--set train.threads must be at least 0"),
        ("data.text_field=''", "--set data.text_field must not be empty"),
    ]:
        assert exit_code(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(out),
                          "--set", setting]) == 2
        assert_one_line_error(capsys, needle)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(open("configs/gpt-tiny-clm.toml").read().replace("seed = 1337", "seed = -5"))
    assert exit_code(["pretrain", "--config", str(recipe), "--out", str(out)]) == 2
    line = recipe.read_text().splitlines().index("seed = -5") + 1  # the error names the file and line
    assert_one_line_error(capsys, f"{recipe}:{line}: train.seed must be at least 0 (got -5); use a whole "
                          "number")
    assert not out.exists()


def test_a_section_that_is_a_number_is_one_line_also_with_set(tmp_path, capsys):
    recipe = tmp_path / "r.toml"
    recipe.write_text("train = 3\n")
    out = str(tmp_path / "run")
    assert exit_code(["pretrain", "--config", str(recipe), "--out", out]) == 2
    assert_one_line_error(capsys, f"{recipe}: [train] must be a table, got 3")
    assert exit_code(["pretrain", "--config", str(recipe), "--out", out, "--set", "train.lr=1e-3"]) == 2
    assert_one_line_error(capsys, f"{recipe}: [train] must be a table, got 3", "--set train.lr")


def test_objective_parameters_have_ranges():
    from lmlab.train.config import load_config

    for recipe, setting, needle in [
        ("configs/t5-tiny-spans.toml", "objective.num_sentinels=0", r"sentinels must be at least 1 \(got 0"),
        ("configs/t5-tiny-spans.toml", "objective.num_sentinels=-3", "num_sentinels must be at least 1"),
        ("configs/bert-tiny-mlm.toml", "objective.mask_prob=nan", "mask_prob must be a finite number"),
        ("configs/bert-tiny-mlm.toml", "objective.seed=-1", "objective.seed must be at least 0"),
        ("configs/t5-tiny-spans.toml", "objective.variant=spams", "did you mean spans?"),
    ]:
        with pytest.raises(LmlabError, match=needle):
            load_config(recipe, [setting])


@pytest.mark.parametrize("change, needle", [
    ('name = "../../../escape"', "grid name '../../../escape' cannot be part of a file name"),
    ("seeds = [-1]", "seeds: 0: must be at least 0 (got -1)"),
    (f"seeds = [{HUGE}]", "seeds: 0: must be at most 9223372036854775807"),
    ("seeds = [1, 1]", "seeds lists 1 twice"),
    ("budget = {tokens = nan}", "budget.tokens must be a whole number"),  # a count of tokens
    ("budget = {flops = nan}", "budget.flops must be a finite number"),
])
def test_grid_values_are_checked_before_anything_else(tmp_path, capsys, change, needle):
    key = change.split(" =")[0]
    grid = tmp_path / "grid.toml"
    lines = [line for line in TINY_GRID.splitlines() if not line.startswith(f"{key} =")]
    grid.write_text("\n".join([change, *lines]) + "\n")
    out = tmp_path / "out"
    assert exit_code(["compare", "--config", str(grid), "--out", str(out), "--dry-run"]) == 2
    assert_one_line_error(capsys, f"{grid}: {needle}")
    assert not out.exists() and not (tmp_path / "escape").exists()


def test_an_empty_special_token_is_refused_before_training():
    from lmlab.tokenizers import train_tokenizer
    from lmlab.tokenizers.wordpiece import WordPieceTokenizer

    with pytest.raises(LmlabError, match=r"special tokens: 1: must not be empty \(got ''\)"):
        train_tokenizer("bpe", iter(()), vocab_size=50, special_tokens=["[PAD]", ""])
    with pytest.raises(LmlabError, match="special tokens: 0: must not be empty"):
        WordPieceTokenizer(["[UNK]", "", "a"], special_tokens=[""])  # a vocabulary read from a file


def test_finetune_and_align_settings_have_ranges():
    from lmlab.align import AlignConfig
    from lmlab.finetune import FinetuneConfig

    for data, needle in [({"seed": -1}, "seed must be at least 0"), ({"lr": "fast"}, "lr must be a number"),
                         ({"device": "meta"}, "device is not a device"),
                         ({"delimiter": '"'}, "quote character"),
                         ({"lm_weight": math.nan}, "lm_weight must be a finite number"),
                         ({"lr_sweep": []}, "lr_sweep must not be empty")]:
        with pytest.raises(LmlabError, match=needle):
            FinetuneConfig.from_dict(data)
    assert FinetuneConfig.from_dict({"lr": "auto", "threads": 0}).lr == "auto"
    for data, needle in [({"seed": -1}, "seed must be at least 0"), ({"max_length": 1}, "at least 2"),
                         ({"temperature": math.nan}, "temperature must be a finite number"),
                         ({"device": "meta"}, "device is not a device")]:
        with pytest.raises(LmlabError, match=needle):
            AlignConfig.from_dict(data)


# --------------------------------------------------------------------------- every flag of every command
def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """``(command words, action)`` of every option of every command."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))
        elif action.option_strings and not isinstance(action, argparse._HelpAction | argparse._VersionAction):
            yield path, action


PARSER = build_parser()  # = what lmlab.cli.main parses with first; built once for the sweeps below
OPTIONS = list(_commands(PARSER))
#: the options that take a value of their own (not a switch, not one of fixed choices)
FLAGS = [(path, action) for path, action in OPTIONS if action.nargs != 0 and action.choices is None]


def _base(kind) -> type:
    while typing.get_origin(kind) in (typing.Annotated, typing.Union, list, tuple):
        kind = next(a for a in typing.get_args(kind) if a is not type(None))
    return kind


def _number_flags():
    for path, action in FLAGS:
        kind = getattr(action.type, "kind", None)
        if kind is values.LearningRateOrAuto or _base(kind) in (int, float):
            yield pytest.param(path, action.option_strings[-1], _base(kind) is int,
                               id=f"{' '.join(path)} {action.option_strings[-1]}")


def refused_by_parser(capsys, argv: list[str], *needles: str) -> None:
    with pytest.raises(SystemExit) as exited:
        PARSER.parse_args(argv)
    assert exited.value.code == 2
    assert_one_line_error(capsys, *needles)


NEGATIVE_OK = {("generate", "--length-penalty")}  # an exponent: negative favours short beams


def test_every_value_flag_takes_its_type_from_lmlab_values():
    """No flag reads a number or a name with a bare int/float/str: each has one of lmlab.values's
    types (the ones left as free text are listed here, with why)."""
    free_text = {("generate", "--prompt"): "empty: start from BOS",
                 ("tokenizer", "encode", "--text"): "any text, even empty",
                 ("pretrain", "--set"): "load_config checks it", ("compare", "--set"): "load_grid checks it",
                 ("finetune", "--set"): "the [finetune] section checks it",
                 ("align", "--set"): "the [align] section checks it"}
    plain = [(p, a.option_strings[-1]) for p, a in FLAGS if not hasattr(a.type, "kind")]
    assert sorted((*p, flag) for p, flag in plain) == sorted(free_text), plain
    assert len(list(_number_flags())) > 80  # the sweeps below are not empty


@pytest.mark.parametrize("path, flag, whole", list(_number_flags()))
def test_every_number_flag_refuses_nan_infinite_huge_and_negative_values(capsys, path, flag, whole):
    bad = ["nan", "inf", "-inf", "1e999", HUGE if whole else "1e400", "-1"]
    if whole:
        bad += ["1.5", "x"]
    if (*path, flag) in NEGATIVE_OK:
        bad.remove("-1")
    for value in bad:
        refused_by_parser(capsys, [*path, f"{flag}={value}"], f"argument {flag}: ", f"(got '{value}')")


@pytest.mark.parametrize("path, flag", [
    pytest.param(p, a.option_strings[-1], id=f"{' '.join(p)} {a.option_strings[-1]}") for p, a in FLAGS
    if getattr(a.type, "kind", None) in (values.Text, values.PathText)])
def test_every_text_and_path_flag_refuses_an_empty_value(capsys, path, flag):
    refused_by_parser(capsys, [*path, f"{flag}="], f"argument {flag}: must not be empty (got '')")


def test_help_describes_every_option_and_lists_the_methods(capsys):
    missing = [f"{' '.join(p)} {a.option_strings[-1]}" for p, a in OPTIONS if not a.help]
    assert missing == []
    with pytest.raises(SystemExit):
        PARSER.parse_args(["finetune", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "lmlab.finetune.METHODS" not in text and "lora, adapter, prefix, prompt, adamix" in text


# --------------------------------------------------------------------------- the recipe's own keys
def _number_fields(cls):
    hints = typing.get_type_hints(cls, include_extras=True)
    return [name for name, hint in hints.items() if _base(hint) in (int, float)]


@pytest.mark.parametrize("section, cls", [("train", "TrainConfig"), ("data", "DataConfig")])
def test_every_number_key_of_a_recipe_refuses_nan_and_huge_values(section, cls):
    from lmlab.train import config

    names = _number_fields(getattr(config, cls))
    assert len(names) >= (15 if section == "train" else 3)
    for name in names:
        for value in ("nan", "inf", HUGE, "-1e400"):
            with pytest.raises(LmlabError) as e:
                config.load_config("configs/gpt-tiny-clm.toml", [f"{section}.{name}={value}"])
            assert f"--set {section}.{name}" in str(e.value) and "\n" not in str(e.value)


def test_the_written_out_document_separators_are_the_preparer_s():
    from lmlab.data.prepare import DOC_SEPARATORS
    from lmlab.train.config import DOC_SEPARATORS as IN_CONFIG

    assert IN_CONFIG == DOC_SEPARATORS


def test_a_value_above_the_maximum_is_told_the_maximum():
    """The fix named only the type's words ('a whole number of at least 1') for 10**30, leaving out
    the bound it broke."""
    from lmlab import values

    kind = values.whole(1, 2**40, hint="a whole number of at least 1")
    with pytest.raises(LmlabError, match=r"use a whole number of at least 1, and at most 1099511627776$"):
        values.check(kind, 10**30, "--vocab-size")
    with pytest.raises(LmlabError, match=r"use a number from 0 to 1$"):  # the words say it already
        values.check(values.Probability, 2, "mask_prob")
    # probe10a M8: written otherwise ("1e6", "65,536"), the bound was said twice
    with pytest.raises(LmlabError, match=r"from 1 to 1e6 tokens, e\.g\. 3$"):
        values.check(values.MeanSpanLength, 1e30, "objective.mean_span_length")
    with pytest.raises(LmlabError, match=r"from 1 to 65,536 \(the global batch is the batch size times "
                                         r"this\), e\.g\. 8$"):
        values.check(values.GradAccum, 65537, "train.grad_accum")

"""A message names a setting as its caller wrote it (lmlab.setting_names.SettingNames): the Python
keyword from a Python call, the flag from the command line. Cases from probe9 #6."""

from __future__ import annotations

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.scaling import RunPoint, fit_runs
from tests.assertions import assert_one_line_error


def test_make_student_names_its_keyword_and_distill_its_flag(ckpt, data_dir, tmp_path, capsys):
    from lmlab.adapt.distill import make_student
    from lmlab.finetune import finetune
    from lmlab.loading import load_model

    with pytest.raises(LmlabError) as e:
        make_student(load_model(ckpt), n_layers=9)
    assert "choose n_layers in 1..2" in str(e.value) and "--layers" not in str(e.value)
    g = data_dir / "glue" / "sst2"
    teacher = tmp_path / "teacher"
    finetune(ckpt, "sst2", g / "train.tsv", g / "dev.tsv", teacher, max_train_examples=16,
             max_eval_examples=8, max_steps=1, batch_size=8, progress=False, log=lambda m: None)
    capsys.readouterr()
    assert main(["compress", "distill", "--teacher", str(teacher), "--train", str(g / "train.tsv"),
                 "--layers", "9", "--max-train-examples", "8", "--steps", "1",
                 "--out", str(tmp_path / "st")]) == 2
    assert_one_line_error(capsys, "choose --layers in 1..2")


def test_fit_runs_names_hold_out_and_scale_fit_its_flag(tmp_path, capsys):
    runs = [RunPoint(f"r{n}", n, 1e9, 3.0 - 0.1 * k) for k, n in enumerate((1e6, 2e6, 4e6, 8e6))]
    with pytest.raises(LmlabError) as e:
        fit_runs(runs, hold_out="zz", bootstrap=0)
    assert str(e.value).startswith('hold_out="zz" is none of the runs'), e.value
    from lmlab.setting_names import SettingNames

    with pytest.raises(LmlabError) as e:
        flags = SettingNames("flag", flags={"hold_out": "--holdout"})
        fit_runs(runs, hold_out="zz", bootstrap=0, names=flags)
    assert str(e.value).startswith("--holdout zz is none of the runs"), e.value


def test_json_schema_budget_is_max_new_tokens_in_python():
    from lmlab.generate.json_backend import json_schema_constraint
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", ["to be or not to be </s>\n" * 40], vocab_size=280)
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    with pytest.raises(LmlabError) as e:
        json_schema_constraint(schema, tok, prompt_len=1, max_new_tokens=2, backend="lmlab")
    assert "more than max_new_tokens=2; use max_new_tokens >= " in str(e.value)

"""A recipe's rules between settings name the setting as the user wrote it (lmlab.config.overrides.
Origin.of): ``--set train.betas``, ``r.toml:LINE: train.betas``. probe8 #8: ``--set train.betas=[0.9]``,
``--set model.d_model=65`` and ``--set data.train=[]`` were named as the code calls them, without
``--set``; ``model.d_model=65`` was refused only after the tokenizer was trained."""

from __future__ import annotations

import pytest

from lmlab.config import load_config
from lmlab.errors import LmlabError

RECIPE = "configs/gpt-tiny-clm.toml"

#: (a --set, the key it names, words of the problem)
CASES = [
    ("train.betas=[0.9]", "train.betas", "must be two numbers in [0, 1)"),
    ("model.d_model=65", "model.d_model", "n_heads 4 does not divide d_model 65"),
    ("model.n_heads=5", "model.n_heads", "n_heads 5 does not divide d_model"),
    ("data.train=[]", "data.train", "is empty"),
    ("train.seq_len=1", "train.seq_len", "is too short"),
]


@pytest.mark.parametrize(("given", "key", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_set_is_named_as_that_set(given, key, words):
    with pytest.raises(LmlabError) as e:
        load_config(RECIPE, [given])
    assert str(e.value).startswith(f"--set {key}") and words in str(e.value), str(e.value)


@pytest.mark.parametrize(("given", "key", "words"), CASES, ids=[c[0] for c in CASES])
def test_a_file_key_is_named_by_its_file_and_line(given, key, words, tmp_path):
    section, name = key.split(".")
    value = given.split("=", 1)[1]
    lines = open(RECIPE, encoding="utf-8").read().splitlines()
    start = lines.index(f"[{section}]")
    at = next((i for i in range(start + 1, len(lines)) if lines[i].split(" = ")[0] == name), None)
    if at is None:
        at = start + 1
        lines.insert(at, f"{name} = {value}")
    else:
        lines[at] = f"{name} = {value}"
    recipe = tmp_path / "r.toml"
    recipe.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        load_config(recipe)
    assert str(e.value).startswith(f"{recipe}:{at + 1}: {key}") and words in str(e.value), str(e.value)


def test_a_model_rule_is_refused_before_any_work(tmp_path, capsys):
    from lmlab.cli import main

    out = tmp_path / "r"
    assert main(["pretrain", "--config", RECIPE, "--out", str(out), "--set", "model.d_model=65"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --set model.d_model: n_heads 4 does not divide d_model 65; ") and \
        err.count("\n") == 1, err
    assert not out.exists()

"""One rule for a whole number at every entry point (lmlab.values.whole_number): an int written as
one. A float is not a whole number even without a fraction (``1.0``, ``1e0``, ``1e3``), nor is a
truth value; a command line's text ``1`` is the number 1, a quoted "1" in a file or a Python call
is text. Before, flags took ``1.0`` but refused ``1e0``, ``--set`` and TOML took both
(``--set train.max_steps=1e3`` trained 1000 steps), ``pretrain()`` took ``2.0`` while
``train_tokenizer(vocab_size=300.0)`` was refused."""

from __future__ import annotations

import pytest

from lmlab.errors import LmlabError

RECIPE = "configs/gpt-tiny-clm.toml"
FINETUNE = ["finetune", "--checkpoint", "x", "--task", "sst2", "--train", "t.tsv", "--dev", "d.tsv",
            "--out", "ft"]

#: (as written on a command line or in TOML, as a Python value, whether it is a whole number)
SPELLINGS = [("1", 1, True), ("1.0", 1.0, False), ("1e0", 1e0, False), ("1e3", 1e3, False),
             ("2.5", 2.5, False), ("true", True, False)]


def verdict(call) -> bool:
    """Whether ``call()`` accepted its value: True, or False on a one-line refusal."""
    try:
        call()
    except LmlabError as e:
        assert "\n" not in str(e)
        return False
    except SystemExit as e:  # argparse refuses a flag's value as it parses it
        assert e.code == 2
        return False
    return True


def a_flag(text: str) -> None:  # a flag generated from a config field ([finetune] max_steps)
    from lmlab.cli import build_parser

    build_parser().parse_args([*FINETUNE, "--max-steps", text])


def a_plain_flag(text: str) -> None:  # a flag typed by a value type directly
    from lmlab.cli import build_parser

    build_parser().parse_args(["generate", "--checkpoint", "x", "--max-new-tokens", text])


def a_set(text: str) -> None:
    from lmlab.config import load_config

    load_config(RECIPE, [f"train.max_steps={text}"])


def a_recipe_file(text: str, tmp_path) -> None:
    from lmlab.config import load_config

    recipe = tmp_path / "r.toml"
    with open(RECIPE, encoding="utf-8") as f:
        recipe.write_text(f.read().replace("max_steps = 600", f"max_steps = {text}"), encoding="utf-8")
    load_config(recipe)


def a_finetune_table(text: str, tmp_path) -> None:
    from lmlab.config import toml
    from lmlab.finetune import FinetuneConfig

    f = tmp_path / "ft.toml"
    f.write_text(f"[finetune]\nmax_steps = {text}\n", encoding="utf-8")
    FinetuneConfig.from_dict(toml.read_toml(f)["finetune"])


def a_pretrain_dict(value) -> None:  # pretrain(config={...}) reads its dict by this
    import tomllib

    from lmlab.config import load_config

    with open(RECIPE, "rb") as f:
        raw = tomllib.load(f)
    raw["train"]["max_steps"] = value
    load_config(raw)


def a_python_argument(value) -> None:  # lmlab.arguments.number_argument
    from lmlab.models import get_preset
    from lmlab.models.flops import forward_flops

    forward_flops(get_preset("gpt2-tiny"), seq_len=value)


@pytest.mark.parametrize(("text", "value", "whole"), SPELLINGS, ids=[s[0] for s in SPELLINGS])
def test_every_entry_point_has_the_same_verdict(text, value, whole, tmp_path):
    verdicts = {
        "flag": verdict(lambda: a_flag(text)),
        "plain flag": verdict(lambda: a_plain_flag(text)),
        "--set": verdict(lambda: a_set(text)),
        "recipe file": verdict(lambda: a_recipe_file(text, tmp_path)),
        "[finetune] table": verdict(lambda: a_finetune_table(text, tmp_path)),
        "pretrain dict": verdict(lambda: a_pretrain_dict(value)),
        "Python argument": verdict(lambda: a_python_argument(value)),
    }
    assert verdicts == dict.fromkeys(verdicts, whole)


def test_quoted_text_is_no_number_in_a_file_or_python(tmp_path):
    """A file and a Python call are typed: ``"1"`` is text there, refused as the wrong kind."""
    assert not verdict(lambda: a_recipe_file('"1"', tmp_path))
    assert not verdict(lambda: a_pretrain_dict("1"))
    assert not verdict(lambda: a_python_argument("1"))


def test_a_float_is_refused_in_one_line_that_says_how_to_write_it(capsys):
    from lmlab.config import load_config
    from lmlab.tokenizers import train_tokenizer

    with pytest.raises(LmlabError, match=r"--set train.max_steps must be a whole number, written without a "
                                         r"decimal point or exponent \(got 1000.0\)"):
        load_config(RECIPE, ["train.max_steps=1e3"])  # trained 1000 steps before
    with pytest.raises(LmlabError, match="train_tokenizer's vocab_size must be a whole number, written "
                                         r"without a decimal point or exponent \(got 300.0\)"):
        train_tokenizer("bytelevel", ["some text"], vocab_size=300.0)
    with pytest.raises(SystemExit):
        a_flag("1.0")  # accepted before, while 1e0 was refused
    assert "argument --max-steps: must be a whole number, written without a decimal point or exponent " \
           "(got '1.0')" in capsys.readouterr().err

import argparse
import subprocess
import sys

import pytest

from lmlab.cli import build_parser, main


def _leaf_commands(parser: argparse.ArgumentParser, prefix=()) -> list[list[str]]:
    """Every runnable `lmlab ...` command, found by walking the parser (so new ones are covered)."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += _leaf_commands(sub, prefix + (name,))
    if not found and prefix:
        found.append(list(prefix))
    return found


SUBCOMMANDS = _leaf_commands(build_parser())


def test_the_issue_commands_exist():
    names = {" ".join(c) for c in SUBCOMMANDS}
    for required in (
        "tokenizer train",
        "tokenizer encode",
        "tokenizer inspect",
        "data prepare",
        "demo",
        "pretrain",
        "generate",
        "export",
        "import",
    ):
        assert required in names, f"`lmlab {required}` is missing"


@pytest.mark.parametrize("sub", SUBCOMMANDS, ids=lambda s: " ".join(s))
def test_every_subcommand_help_has_an_example(sub, capsys):
    with pytest.raises(SystemExit) as e:
        main(sub + ["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "examples:" in out and "lmlab " + sub[0] in out


def test_top_level_help_lists_commands():
    p = subprocess.run([sys.executable, "-m", "lmlab.cli", "--help"], capture_output=True, text=True)
    assert p.returncode == 0
    for name in ("demo", "tokenizer", "data"):
        assert name in p.stdout


def test_unknown_algorithm_is_a_one_line_error(tmp_path, capsys):
    f = tmp_path / "c.txt"
    f.write_text("some text\n")
    with pytest.raises(SystemExit) as e:
        main(
            [
                "tokenizer",
                "train",
                "--algo",
                "nope",
                "--vocab-size",
                "10",
                "--input",
                str(f),
                "--out",
                str(tmp_path / "t"),
            ]
        )
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "'nope'" in err and "bytelevel" in err
    assert not (tmp_path / "t").exists()


def test_decode_command_and_out_of_range_ids(tmp_path, capsys):
    f = tmp_path / "c.txt"
    f.write_text("low lower lowest newer wider\n" * 20)
    assert (
        main(
            [
                "tokenizer",
                "train",
                "--algo",
                "bytelevel",
                "--vocab-size",
                "300",
                "--input",
                str(f),
                "--out",
                str(tmp_path / "t"),
            ]
        )
        == 0
    )
    capsys.readouterr()
    from lmlab.tokenizers import load_tokenizer

    ids = load_tokenizer(tmp_path / "t").encode("lower wider")
    assert main(["tokenizer", "decode", "--tokenizer", str(tmp_path / "t"), "--ids", *map(str, ids)]) == 0
    assert capsys.readouterr().out == "lower wider\n"
    assert main(["tokenizer", "decode", "--tokenizer", str(tmp_path / "t"), "--ids", "99999"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "out of range" in err


def test_missing_input_file_is_a_one_line_error(tmp_path, capsys):
    code = main(
        [
            "tokenizer",
            "train",
            "--algo",
            "bpe",
            "--vocab-size",
            "100",
            "--input",
            str(tmp_path / "missing.txt"),
            "--out",
            str(tmp_path / "t"),
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "t").exists()


def test_every_help_shows_each_default_once():
    import argparse

    from lmlab.cli import build_parser

    def parsers(p):
        yield p
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub in action.choices.values():
                    yield from parsers(sub)

    for p in parsers(build_parser()):
        text = " ".join(p.format_help().split())
        assert "(default: None)" not in text and "(default: False)" not in text, p.prog
        for action in p._actions:
            if action.help and "default" in action.help:
                assert (action.help + " (default:") not in text, (p.prog, action.help)

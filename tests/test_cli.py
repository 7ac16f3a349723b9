import subprocess
import sys

import pytest

from lmlab.cli import main

SUBCOMMANDS = [["tokenizer", "train"], ["tokenizer", "encode"], ["tokenizer", "inspect"], ["data", "prepare"], ["demo"]]


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
    with pytest.raises(SystemExit) as e:  # argparse rejects it with its usage line, exit 2
        main(["tokenizer", "train", "--algo", "nope", "--vocab-size", "10", "--input", str(f), "--out", str(tmp_path / "t")])
    assert e.value.code == 2


def test_missing_input_file_is_a_one_line_error(tmp_path, capsys):
    code = main(["tokenizer", "train", "--algo", "bpe", "--vocab-size", "100",
                 "--input", str(tmp_path / "missing.txt"), "--out", str(tmp_path / "t")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and "does not exist" in err and err.count("\n") == 1
    assert not (tmp_path / "t").exists()

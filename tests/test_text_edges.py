"""Text at the edges: command-line values and JSON files that are not valid text (a byte that is
not UTF-8, a lone surrogate) are one-line errors naming the argument, or the file and line, before
any work; every error message is one line, whatever the paths it names hold."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from assertions import assert_one_line_error

from lmlab.cli import main
from lmlab.errors import LmlabError, one_line
from lmlab.fileio import iter_text_lines
from lmlab.text_input import check_argument_text, check_text, parse_json

ROOT = Path(__file__).resolve().parents[1]
NOT_UTF8 = os.fsdecode(b"ab\xffc")   # what Python makes of the argument bytes 61 62 ff 63
LONE = '{"text": "a\\ud800b"}'     # JSON text whose escape decodes to a lone surrogate


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, shakespeare):
    """A random 2-layer GPT-2 with a small byte-level tokenizer, saved."""
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("edges")
    tok = train_tokenizer("bytelevel", [shakespeare[:20_000]], vocab_size=300)
    tok.save(root / "tok")
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, n_layers=2, max_positions=64))
    model.save(root / "ck", tokenizer=tok)
    return root


# --------------------------------------------------------------------------- command line


def run(argv: list[str]) -> int:
    """``main(argv)``'s exit code, also when argparse stops it (a flag's own type refusing a value)."""
    try:
        return main(argv)
    except SystemExit as e:
        return e.code


def test_check_argument_text_names_the_flag_and_leaves_file_names_alone():
    import argparse

    parser = argparse.ArgumentParser(prog="t")
    sub = parser.add_subparsers(dest="command")
    p = sub.add_parser("go")
    p.add_argument("--text")
    p.add_argument("--words", nargs="+")
    p.add_argument("--input", metavar="FILE")
    p.add_argument("--out")
    p.add_argument("sentence", metavar="SENTENCE", nargs="?")
    files = parser.parse_args(["go", "--input", NOT_UTF8, "--out", NOT_UTF8, "--text", "ok"])
    check_argument_text(parser, files)  # file names may hold any bytes
    for argv, flag in ((["--text", NOT_UTF8], "--text"), (["--words", "fine", NOT_UTF8], "--words"),
                       ([NOT_UTF8], "SENTENCE")):
        with pytest.raises(LmlabError, match=f"^{flag} is not valid UTF-8 \\(byte 0xff at offset 2\\); pass "
                                             "the text in UTF-8"):
            check_argument_text(parser, parser.parse_args(["go", *argv]))


@pytest.mark.parametrize("command, flag", [
    (["tokenizer", "encode", "--tokenizer", "{tok}", "--text", NOT_UTF8], "--text"),
    (["tokenizer", "inspect", "{tok}", "--sample", NOT_UTF8], "--sample"),
    (["generate", "--checkpoint", "{ck}", "--prompt", NOT_UTF8, "--max-new-tokens", "2"], "--prompt"),
    (["generate", "--checkpoint", "{ck}", "--prompt", "To be", "--stop", NOT_UTF8], "--stop"),
    (["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "300", "--input", "{corpus}",
      "--out", "{tmp}/t", "--special-tokens", "<s>", NOT_UTF8], "--special-tokens"),
])
def test_a_text_argument_that_is_not_utf8_is_one_line_naming_the_flag(command, flag, checkpoint, tmp_path,
                                                                       capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("some text to train on\n" * 50, encoding="utf-8")
    where = {"tok": str(checkpoint / "tok"), "ck": str(checkpoint / "ck"), "corpus": str(corpus),
             "tmp": str(tmp_path)}
    assert run([part.format(**where) if part != NOT_UTF8 else part for part in command]) == 2
    assert_one_line_error(capsys, flag, "not valid UTF-8")
    assert not (tmp_path / "t").exists()


def test_a_lone_surrogate_argument_is_named_too(checkpoint, capsys):
    assert run(["tokenizer", "encode", "--tokenizer", str(checkpoint / "tok"), "--text", "x\ud800"]) == 2
    assert_one_line_error(capsys, "--text", "not valid UTF-8")
    with pytest.raises(LmlabError, match=r"^--text is not valid UTF-8 \(a lone surrogate U\+D800 at char"):
        check_text("x\ud800", "--text")


def test_demo_refuses_a_prompt_that_is_not_utf8_before_training(tmp_path, capsys):
    out = tmp_path / "demo"
    assert run(["demo", "--out", str(out), "--steps", "1", "--vocab-size", "300", "--prompt", NOT_UTF8]) == 2
    assert_one_line_error(capsys, "--prompt", "not valid UTF-8")
    assert not out.exists()
    from lmlab.demo import run_demo

    with pytest.raises(LmlabError, match=r"^the prompt \(--prompt\) is not valid UTF-8"):
        run_demo(out, vocab_size=300, steps=1, prompt=NOT_UTF8)
    assert not out.exists()


def test_a_file_name_that_is_not_utf8_is_still_a_file_name(checkpoint, tmp_path, capsys):
    name = tmp_path / os.fsdecode(b"caf\xe9.txt")
    name.write_text("hello world\n", encoding="utf-8")
    assert run(["tokenizer", "encode", "--tokenizer", str(checkpoint / "tok"), "--input", str(name)]) == 0
    assert capsys.readouterr().out.strip()
    assert run(["tokenizer", "encode", "--tokenizer", str(checkpoint / "tok"), "--input",
                str(tmp_path / os.fsdecode(b"caf\xe9-missing.txt"))]) == 2
    assert_one_line_error(capsys, "caf\\xe9-missing.txt does not exist")


def test_check_text_passes_text_and_emoji():
    assert check_text("caf\u00e9 \U0001f600", "--prompt") == "caf\u00e9 \U0001f600"


# --------------------------------------------------------------------------- JSON files


def test_parse_json_refuses_a_lone_surrogate_at_its_column():
    with pytest.raises(json.JSONDecodeError) as e:
        parse_json(LONE)
    assert e.value.colno == LONE.index("\\ud800") + 1
    assert "\\ud800 is half of a UTF-16 surrogate pair" in e.value.msg
    low_first = '["\\udc00\\ud800"]'                      # the wrong order is no pair either
    with pytest.raises(json.JSONDecodeError, match=r"\\udc00 is half"):
        parse_json(low_first)
    with pytest.raises(json.JSONDecodeError, match=r"\\uD83D is half"):
        parse_json('{"\\uD83D": 1}')                        # in a key
    # a pair is one character; an escaped backslash before "ud800" is plain text
    assert parse_json('{"t": "\\ud83d\\ude00"}') == {"t": "\U0001f600"}
    assert parse_json('"a\\\\ud800"') == "a\\ud800"


def _write(path, lines: list[str]):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_data_prepare_names_the_file_and_line(checkpoint, tmp_path, capsys):
    src = _write(tmp_path / "docs.jsonl", ['{"text": "fine"}', LONE])
    assert run(["data", "prepare", "--tokenizer", str(checkpoint / "tok"), "--input", str(src),
                 "--out", str(tmp_path / "shards")]) == 2
    assert_one_line_error(capsys, "docs.jsonl line 2", "\\ud800 is half of a UTF-16 surrogate pair")
    assert not (tmp_path / "shards").exists()


def test_finetune_names_the_file_and_line(checkpoint, tmp_path, capsys):
    train = _write(tmp_path / "train.jsonl", ['{"instruction": "Say hi", "output": "hi"}',
                                              '{"instruction": "Say \\udfff", "output": "no"}'])
    assert run(["finetune", "--checkpoint", str(checkpoint / "ck"), "--task", "instruct", "--train",
                str(train), "--dev", str(train), "--out", str(tmp_path / "ft"), "--max-steps", "1",
                "--no-progress"]) == 2
    assert_one_line_error(capsys, "train.jsonl line 2: invalid JSON (\\udfff is half of a UTF-16 surrogate")
    assert not (tmp_path / "ft").exists()


def test_align_names_the_file_and_line(checkpoint, tmp_path, capsys):
    prefs = _write(tmp_path / "prefs.jsonl", ['{"prompt": "Q", "chosen": "a", "rejected": "b"}',
                                              '{"prompt": "Q", "chosen": "\\ud800", "rejected": "b"}'])
    assert run(["align", "--checkpoint", str(checkpoint / "ck"), "--train", str(prefs), "--dev", str(prefs),
                 "--out", str(tmp_path / "al"), "--max-steps", "1"]) == 2
    assert_one_line_error(capsys, "prefs.jsonl line 2: invalid JSON (\\ud800 is half")
    assert not (tmp_path / "al").exists()


def test_generate_prompts_file_names_the_file_and_line(checkpoint, tmp_path, capsys):
    rows = _write(tmp_path / "rows.jsonl", ['{"variant": "plain", "prompt": "To be"}',
                                            '{"variant": "plain", "prompt": "\\ud800"}'])
    assert run(["generate", "--checkpoint", str(checkpoint / "ck"), "--variant", "plain", "--prompts",
                 str(rows), "--max-new-tokens", "2"]) == 2
    assert_one_line_error(capsys, "rows.jsonl line 2 is not JSON (\\ud800 is half")


@pytest.mark.parametrize("reader", ["squad", "pairs", "table"])
def test_the_task_readers_report_it_as_a_bad_line(reader, tmp_path):
    from lmlab.tasks.readers import BadLines, read_pairs, read_squad

    good = {"squad": '{"question": "Who?", "context": "Ann ran.", "answers": {"text": ["Ann"], '
                     '"answer_start": [0]}}',
            "pairs": '{"source": "a", "target": "b"}', "table": '{"text": "a", "label": "x"}'}[reader]
    bad = good.replace('"a"', '"\\ud800"').replace('"Who?"', '"\\ud800"')
    path = _write(tmp_path / "f.jsonl", [good, bad, good])
    if reader == "table":
        from lmlab.tasks import make_task

        task = make_task("classification")
        read = task.read
    else:
        read = {"squad": read_squad, "pairs": read_pairs}[reader]
    with pytest.raises(LmlabError, match=r"f\.jsonl line 2: invalid JSON \(\\ud800 is half of a UTF-16 "
                                         r"surrogate pair.* at column \d+\)"):
        read(path, "error")
    assert len(read(path, BadLines("skip", warn=lambda m: None, max_fraction=0.5))) == 2


# --------------------------------------------------------------------------- text files


def test_a_codec_that_decodes_to_a_lone_surrogate_names_the_file_and_line(tmp_path):
    path = tmp_path / "u7.txt"
    path.write_bytes(b"fine\n+2AA-\n")  # UTF-7 for U+D800
    with pytest.raises(LmlabError, match=r"u7\.txt line 2 is not text in utf-7 \(a lone surrogate U\+D800 "
                                         r"at character 0\); convert the file to UTF-8"):
        list(iter_text_lines(path, "utf-7"))


# --------------------------------------------------------------------------- one line


def test_every_error_message_is_one_line_whatever_the_path_holds():
    e = LmlabError("input file a\nb\r\x1b[2J\u2028c does not exist", "check\nthe path")
    assert str(e) == "input file a\\nb\\r\\x1b[2J\\u2028c does not exist; check\\nthe path"
    assert e.problem == "input file a\nb\r\x1b[2J\u2028c does not exist"      # kept as given
    assert one_line("tab\tstays, caf\u00e9, " + os.fsdecode(b"\xe9")) == "tab\tstays, caf\u00e9, \\xe9"
    assert one_line(one_line("a\nb")) == "a\\nb"


def test_a_path_with_a_newline_is_named_on_one_line(checkpoint, tmp_path, capsys):
    (tmp_path / "two\nlines").mkdir()
    assert run(["data", "prepare", "--tokenizer", str(checkpoint / "tok"), "--input",
                str(tmp_path / "two\nlines" / "x.txt"), "--out", str(tmp_path / "o")]) == 2
    assert_one_line_error(capsys, "two\\nlines/x.txt does not exist")


# --------------------------------------------------------------------------- text files


def test_a_text_file_that_is_not_in_its_encoding_is_one_line_naming_file_line_and_offset(tmp_path):
    """Whichever codec refuses the bytes (utf-16 without a byte-order mark raises a bare UnicodeError,
    which used to end in the catch-all 'tokenizer failed on input lmlab does not check yet')."""
    utf8 = tmp_path / "u.txt"
    utf8.write_text("plain line\nanother\n", encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        list(iter_text_lines(utf8, "utf-16"))
    assert str(e.value).startswith(f"{utf8} line 1, byte offset 0: not valid utf-16 (UTF-16 stream does not "
                                   "start with BOM); convert the file to UTF-8 or pass its encoding "
                                   "(--encoding")
    latin = tmp_path / "l.txt"
    latin.write_bytes(b"plain\nna\xefve\n")
    with pytest.raises(LmlabError, match=r"l.txt line 2, byte offset 8: not valid utf-8 \(byte b'\\xef'\); "
                                         r"convert the file to UTF-8 or pass its encoding \(--encoding"):
        list(iter_text_lines(latin, "utf-8"))
    # a file lmlab reads as UTF-8 whatever the user says (a task's TSV): no --encoding to suggest
    with pytest.raises(LmlabError, match=r"line 2, byte offset 8: .*; convert the file to UTF-8 \(") as e:
        list(iter_text_lines(latin))
    assert "--encoding" not in str(e.value)


def test_tokenizer_train_with_the_wrong_encoding_names_the_file(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be\n" * 20, encoding="utf-8")
    assert main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input", str(corpus),
                 "--out", str(tmp_path / "t"), "--encoding", "utf-16"]) == 2
    assert_one_line_error(capsys, f"error: {corpus} line 1, byte offset 0: not valid utf-16", "--encoding")
    assert not (tmp_path / "t").exists()


BOM = b"\xef\xbb\xbf"


def test_a_recipe_and_a_grid_with_a_byte_order_mark_are_read_as_without(tmp_path):
    """probe10a #6: a UTF-8 BOM (Notepad writes one) made a recipe "not valid TOML (Invalid
    statement at line 1)" while text, TSV and JSON Lines inputs drop it; and a key's line is found
    as without it."""
    from lmlab.config import load_config
    from lmlab.config.toml import key_line, read_toml

    src = (ROOT / "configs" / "gpt-tiny-clm.toml").read_bytes()
    with_bom = tmp_path / "bom.toml"
    with_bom.write_bytes(BOM + src)
    assert read_toml(with_bom) == read_toml(ROOT / "configs" / "gpt-tiny-clm.toml")
    assert load_config(with_bom).to_dict() == load_config(ROOT / "configs" / "gpt-tiny-clm.toml").to_dict()
    plain = ROOT / "configs" / "gpt-tiny-clm.toml"
    assert key_line(with_bom, "model.preset") == key_line(plain, "model.preset") is not None


def test_a_json_schema_with_a_byte_order_mark_is_read_as_without(checkpoint, tmp_path, capsys):
    schema = tmp_path / "s.json"
    schema.write_bytes(BOM + b'{"type": "integer", "minimum": 0, "maximum": 9}')
    assert main(["generate", "--checkpoint", str(checkpoint / "ck"), "--json-schema", str(schema),
                 "--max-new-tokens", "8"]) == 0
    assert 0 <= json.loads(capsys.readouterr().out.splitlines()[0]) <= 9

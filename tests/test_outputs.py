"""Every output of every command is checked in one place before any work (lmlab.cli._check_outputs,
lmlab.ownership.check_output_spares_inputs and check_destination): it may not be, hold or lie inside
one of the command's inputs, and it must be somewhere lmlab can write. The parser is walked, so a
new command or a new path flag that is not classified (input, output) fails here."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
from assertions import assert_one_line_error

from lmlab.cli import INPUT_ARGS, OUTPUT_ARGS, UNGUARDED_INPUT_ARGS, build_parser, main
from lmlab.values import path_flag

#: (command, output flag) -> the rest of a command line that parses, its inputs as {D} (a folder:
#: a checkpoint, a tokenizer, runs) and {F} (a file: text, data, task YAML, recipe)
COMMANDS = {
    ("demo", "--out"): [],
    ("tokenizer train", "--out"): ["--algo", "bytelevel", "--vocab-size", "300", "--input", "{F}"],
    ("data prepare", "--out"): ["--tokenizer", "{D}", "--input", "{F}"],
    ("pretrain", "--out"): ["--config", "{F}"],
    ("export", "--out"): ["--checkpoint", "{D}"],
    ("import", "--out"): ["--hf", "{D}"],
    ("finetune", "--out"): ["--checkpoint", "{D}", "--task", "sst2", "--train", "{F}", "--dev", "{F}"],
    ("evaluate", "--out"): ["--checkpoint", "{D}", "--harness", "{F}", "--overwrite"],
    ("evaluate", "--predictions"): ["--checkpoint", "{D}", "--data", "{F}"],
    ("align", "--out"): ["--checkpoint", "{D}", "--train", "{F}", "--dev", "{F}"],
    ("compress distill", "--out"): ["--teacher", "{D}", "--train", "{F}"],
    ("compress quantize", "--out"): ["--checkpoint", "{D}"],
    ("compress prune", "--out"): ["--checkpoint", "{D}", "--sparsity", "0.5"],
    ("scale fit", "--out"): ["{D}"],
    ("compare", "--out"): ["--config", "{F}"],
}
#: commands whose only input is a recipe (--config, not compared with the outputs: see the cli)
NO_GUARDED_INPUT = {("demo", "--out"), ("pretrain", "--out"), ("compare", "--out")}


def _commands(parser: argparse.ArgumentParser, words=()):
    """(command words, its parser) for every runnable subcommand."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*words, name))
    if words and parser.get_default("func") is not None:
        yield " ".join(words), parser


def test_every_path_argument_is_an_input_or_an_output_and_every_output_is_tested_here():
    seen, outputs = set(), set()
    for command, parser in _commands(build_parser()):
        for action in parser._actions:
            if action.type is path_flag or action.dest in ("harness", "variant"):
                seen.add(action.dest)
                if action.dest in OUTPUT_ARGS:
                    outputs.add((command, action.option_strings[0]))
    assert seen == set(INPUT_ARGS) | set(OUTPUT_ARGS) | set(UNGUARDED_INPUT_ARGS)  # none left out, none stale
    assert outputs == set(COMMANDS)


@pytest.fixture()
def inputs(tmp_path):
    """``tmp/in`` holding an input folder (with a config.json, as a checkpoint has) and an input file."""
    folder = tmp_path / "in"
    (folder / "ck").mkdir(parents=True)
    (folder / "ck" / "config.json").write_text('{"mine": true}\n')
    (folder / "text.txt").write_text("my text\n")
    return folder


def _snapshot(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _argv(key, out, folder: Path) -> list[str]:
    command, flag = key
    rest = [a.format(D=folder / "ck", F=folder / "text.txt") for a in COMMANDS[key]]
    return [*command.split(), *rest, flag, str(out)]


CLASHES = {  # what the output is -> what the one line says
    "the input folder": ("{D}", "would replace the input"),
    "a file inside the input folder": ("{D}/config.json", "would be written inside the input"),
    "a folder holding the inputs": ("{root}", "would replace the input"),
    "the input file": ("{F}", "would replace the input"),
}


def _clash_cases():
    """Every command with an input, with every clash its inputs allow (a folder input, a file input)."""
    for key in COMMANDS:
        if key in NO_GUARDED_INPUT:
            continue
        for clash, (where, _) in CLASHES.items():
            needs = [m for m in ("{D}", "{F}") if m in where]
            if all(any(m in a for a in COMMANDS[key]) for m in needs):
                yield pytest.param(key, clash, id=f"{' '.join(key)}: {clash}")


@pytest.mark.parametrize(("key", "clash"), list(_clash_cases()))
def test_no_output_of_any_command_replaces_or_goes_into_an_input(key, clash, inputs, capsys):
    where, needle = CLASHES[clash]
    out = where.format(D=inputs / "ck", F=inputs / "text.txt", root=inputs)
    before = _snapshot(inputs.parent)
    assert main(_argv(key, out, inputs)) == 2
    assert_one_line_error(capsys, f"{key[1]} {out} {needle}", "nothing was written")
    assert _snapshot(inputs.parent) == before  # nothing replaced, nothing added


@pytest.mark.parametrize("key", list(COMMANDS), ids=" ".join)
def test_every_output_under_a_file_is_refused_before_any_work(key, inputs, capsys):
    out = inputs / "text.txt" / "sub"
    before = _snapshot(inputs.parent)
    assert main(_argv(key, out, inputs)) == 2
    assert_one_line_error(capsys, f"{key[1]} {out} cannot be written", "text.txt is a file")
    assert _snapshot(inputs.parent) == before


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="needs /proc, where nothing can be made")
@pytest.mark.parametrize("key", list(COMMANDS), ids=" ".join)
def test_every_output_where_nothing_can_be_written_is_refused_before_any_work(key, inputs, capsys):
    """/proc takes no new entries, for root too (whose permission bits say yes everywhere): the folder
    is tried for real, so a forbidden or read-only place is one line before the work, not after it."""
    out = Path("/proc/lmlab-out/sub")
    assert main(_argv(key, out, inputs)) == 2
    assert_one_line_error(capsys, f"{key[1]} {out} cannot be written: the folder /proc")


def test_two_outputs_of_one_command_are_never_one_path_nor_one_inside_the_other(tmp_path):
    """probe8 #5: ``evaluate --harness --out q.json --predictions q.json`` was accepted (one output
    would go over the other). Every command's outputs are checked against each other in one place
    (``lmlab.ownership.check_outputs_apart``, called with all of OUTPUT_ARGS by the CLI), before any
    work, as its outputs are against its inputs."""
    from lmlab import ownership
    from lmlab.cli import _check_outputs
    from lmlab.errors import LmlabError

    q, ft = tmp_path / "q.json", tmp_path / "ft"
    args = argparse.Namespace(out=str(q), predictions=str(tmp_path / "." / "q.json"), checkpoint=None)
    with pytest.raises(LmlabError, match="--out .*q.json and --predictions .*q.json are the same path"):
        _check_outputs(args)
    with pytest.raises(LmlabError, match=r"--predictions .*ft/p.jsonl is inside --out .*ft: both are"):
        ownership.check_outputs_apart({"--out": str(ft), "--predictions": str(ft / "p.jsonl")})
    with pytest.raises(LmlabError, match="give --predictions a path outside --out"):
        ownership.check_outputs_apart({"--predictions": str(ft / "p.jsonl"), "--out": str(ft)})
    ownership.check_outputs_apart({"--out": str(q), "--predictions": str(tmp_path / "p.jsonl"), "--x": None})
    assert not q.exists() and not ft.exists()

"""What `lmlab COMMAND --help` shows: every default that is not simply "off", every choice."""

from __future__ import annotations

import argparse

from lmlab.cli import HelpFormatter, build_parser


def _help(*options: tuple[str, object]) -> str:
    p = argparse.ArgumentParser(prog="x", formatter_class=HelpFormatter)
    for name, default in options:
        p.add_argument(name, default=default, help="a value")
    return " ".join(p.format_help().split())


def test_a_zero_default_is_shown():
    text = _help(("--seed", 0), ("--fraction", 0.0), ("--steps", 5))
    assert "--seed SEED a value (default: 0)" in text
    assert "--fraction FRACTION a value (default: 0.0)" in text and "(default: 5)" in text


def test_an_option_that_is_off_until_given_shows_no_default():
    text = _help(("--name", None), ("--on", False))
    assert "(default:" not in text


def test_lmlab_data_prepare_shows_its_zero_defaults():
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    data = next(a for a in sub.choices["data"]._actions if isinstance(a, argparse._SubParsersAction))
    text = " ".join(data.choices["prepare"].format_help().split())
    assert "train/val (default: 0)" in text  # --seed
    assert "in [0, 1) (default: 0.0)" in text  # --val-fraction


def test_finetune_offers_every_method_the_loop_knows():
    from lmlab.finetune import METHODS

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    method = next(a for a in sub.choices["finetune"]._actions if a.dest == "method")
    assert list(method.choices) == list(METHODS)


def test_help_examples_keep_their_line_continuations():
    """A `\\` at the end of an example line in the source is Python's line continuation unless it is
    doubled: the help then shows two lines glued with a run of spaces, which cannot be pasted."""
    import re

    from lmlab.cli import build_parser

    def parsers(p):
        yield p
        for action in p._actions:
            if hasattr(action, "_name_parser_map"):  # a group's subcommands
                for sub in action.choices.values():
                    yield from parsers(sub)

    glued = [line for p in parsers(build_parser()) for line in p.format_help().splitlines()
             if re.search(r"lmlab \S.* {4,}--", line)]
    assert glued == []

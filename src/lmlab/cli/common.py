"""Helpers shared by the subcommand modules."""

from __future__ import annotations

import argparse
import os

from lmlab.cli import HelpFormatter


def add_command(subparsers, name: str, help: str, description: str, examples: str) -> argparse.ArgumentParser:
    """Add a subcommand parser whose --help ends with worked examples."""
    return subparsers.add_parser(
        name,
        help=help,
        description=f"{description}\n\nexamples:\n{examples}",
        formatter_class=HelpFormatter,
    )


def add_group(subparsers, name: str, help: str, description: str):
    """Add a command group (like `lmlab tokenizer`) and return (parser, its subparsers)."""
    p = subparsers.add_parser(name, help=help, description=description, formatter_class=HelpFormatter)
    p.set_defaults(_parser=p, func=None)
    return p, p.add_subparsers(dest=f"{name}_command", metavar="COMMAND")


def is_main_process() -> bool:
    """False in a process of rank 1, 2, ... under ``torchrun`` (``RANK``): a run's summary is
    printed once, by rank 0, not once per process."""
    try:
        return int(os.environ.get("RANK", "0") or 0) == 0
    except ValueError:
        return True

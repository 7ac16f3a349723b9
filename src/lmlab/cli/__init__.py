"""The ``lmlab`` command.

Each subcommand lives in its own module in this package and exposes
``register(subparsers)``, which adds its parser and sets ``func`` to the function that runs it.
Adding a subcommand is one module plus one line in ``COMMAND_MODULES``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import signal
import sys
import threading

from safetensors import SafetensorError

from lmlab import __version__
from lmlab.errors import LmlabError, one_line
from lmlab.text_input import check_argument_text

# Order here is the order shown in `lmlab --help`.
COMMAND_MODULES = [
    "lmlab.cli.demo",
    "lmlab.cli.tokenizer",
    "lmlab.cli.data",
    "lmlab.cli.pretrain",
    "lmlab.cli.export",
    "lmlab.cli.generate",
    "lmlab.cli.finetune",
    "lmlab.cli.evaluate",
    "lmlab.cli.align",
    "lmlab.cli.compress",
    "lmlab.cli.scale",
    "lmlab.cli.compare",
    "lmlab.cli.probe",
]

DESCRIPTION = """\
lmlab: pretrain language models and adapt them.

Train a tokenizer on your corpus, turn text into token shards, pretrain and fine-tune
encoders, decoders and encoder-decoders.

examples:
  lmlab demo                                   # tiny end-to-end run on built-in Shakespeare
  lmlab tokenizer train --algo bytelevel --vocab-size 8000 --input corpus.txt --out tok/
  lmlab tokenizer encode --tokenizer tok/ --text "Hello world"
  lmlab data prepare --tokenizer tok/ --input corpus.txt --out shards/ --val-fraction 0.01

Run `lmlab COMMAND --help` for the options of each command.
"""


#: a negative number as a command line writes one: -1, -0.5, -.5, -1e15, -2.5E-3, -inf, -nan
NEGATIVE_NUMBER = re.compile(r"^-(\d+\.?\d*|\.\d+)(e[+-]?\d+)?$|^-(inf|infinity|nan)$", re.IGNORECASE)


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keep hand-written examples as they are and show each default once: argparse's own
    "(default: ...)" only where the help does not already say it, and never "(default: None)"
    or "(default: False)" for an option that is simply off until given."""

    def _get_help_string(self, action):
        text = action.help or ""
        off = action.default is None or action.default is False  # `is`: 0 and 0.0 are defaults worth showing
        if "default" in text or off or action.default is argparse.SUPPRESS:
            return text
        return super()._get_help_string(action)


class Parser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line naming the problem and the fix, and that
    reads a negative number after a flag (``--flops -1e15``, ``--lr -.5``) as that flag's value, so
    the flag's own range check answers (argparse's own rule knows no exponents: it took ``-1e15``
    for a flag and said "expected one argument"). Every subcommand's parser is one of these."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._negative_number_matcher = NEGATIVE_NUMBER

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lmlab", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"lmlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGINT arrived while a command ran: raised in the main thread so that every
    ``with`` block unwinds (temporaries removed, locks released) before the one-line message."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _stop(signum, frame) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def _stop_signals_unwind():
    """While a command runs, SIGTERM (and SIGINT) unwind it like Ctrl-C does, in every command:
    what it was writing is removed, nothing of the user's is touched. Pretraining and fine-tuning
    install their own handlers while they train (finish the step, save, then stop)."""
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for s in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError, OSError):
                previous[s] = signal.signal(s, _stop)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _fail(message: str, code: int = 2) -> int:
    print(f"error: {one_line(message)}", file=sys.stderr)
    return code


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        # `lmlab` or `lmlab tokenizer` alone: show the relevant help.
        (getattr(args, "_parser", None) or parser).print_help()
        return 0 if args.command is None else 2
    try:
        with _stop_signals_unwind():
            check_argument_text(parser, args)  # text values (--prompt, --text...) that are not UTF-8
            _resolve_run_directories(args)
            _check_output_keeps_inputs(args)
            result = args.func(args)
    except LmlabError as e:
        return _fail(str(e), e.exit_code)
    except Stopped as e:
        name = signal.Signals(e.signum).name
        return _fail(f"stopped by {name}; what this command was writing was removed, nothing else was "
                     "touched", 128 + e.signum)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `lmlab ... | head`: the reader has all it wanted; no message, as Unix tools do
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:  # a full disk, a read-only or forbidden path: what was there stays intact
        return _fail(describe_os_error(e))
    except RecursionError:
        return _fail("the input is nested too deeply to process; flatten it (fewer levels of nesting)")
    except SafetensorError as e:  # safetensors' own I/O errors (no errno attribute)
        return _fail(describe_safetensors_error(e))
    except MemoryError:
        return _fail("this machine ran out of memory; use smaller sizes (batch, samples, lengths, "
                     "vocabulary) or a machine with more memory")
    except Exception as e:  # noqa: BLE001 - the last line of defence: never a traceback for a user
        if os.environ.get("LMLAB_DEBUG"):
            raise
        first = (str(e).strip().splitlines() or [""])[0][:200]
        return _fail(f"{args.command} failed on input lmlab does not check yet "
                     f"({type(e).__name__}: {first}); check the files and values given, and rerun with "
                     "LMLAB_DEBUG=1 for the traceback to report")
    return int(result or 0)


def describe_os_error(e: OSError) -> str:
    """``<problem>; <fix>`` for an operating-system error while reading or writing a file."""
    import errno

    path = e.filename or "a file"
    if e.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full while writing {path}; free some space and run the command again"
    if e.errno == errno.EROFS:
        return f"{path} is on a read-only file system; write the output somewhere else (--out)"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"permission denied for {path}; choose a path you may write to, or fix its permissions"
    if e.errno == errno.ENOENT:
        return f"{path} does not exist; check the path"
    return f"{e.strerror or e} ({path}); check the path and the disk"


def describe_safetensors_error(e: Exception) -> str:
    """``<problem>; <fix>`` for a safetensors failure, which reports the OS error code in its text."""
    import re

    m = re.search(r"code: (\d+)", str(e))
    if m:
        code = int(m.group(1))
        return describe_os_error(OSError(code, os.strerror(code), "a weights file"))
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"could not read or write a weights file ({first}); check the disk and the path"


#: arguments that name something a command reads: ``--out`` may never be (or hold) one of them
INPUT_ARGS = ("checkpoint", "input", "train", "dev", "test", "hf", "tokenizer", "teacher",
              "base", "adapter", "json_schema", "runs", "data", "prompts_file")


def _resolve_run_directories(args: argparse.Namespace) -> None:
    """A ``--checkpoint``/``--teacher`` that is a pretraining run directory means its newest
    complete checkpoint (what a user has after ``lmlab pretrain --out RUN``)."""
    from pathlib import Path

    for name in ("checkpoint", "teacher"):
        value = getattr(args, name, None)
        if not isinstance(value, str) or not value:
            continue
        p = Path(value)
        if (p / "config.json").is_file() or not (p / "checkpoints").is_dir():
            continue
        from lmlab.train.checkpoint import latest_checkpoint

        newest = latest_checkpoint(p)
        if newest is None:
            raise LmlabError(f"run directory {p} has no complete checkpoint yet",
                             "wait for the run's first checkpoint (train.checkpoint_every) or resume it")
        print(f"{value}: using its newest checkpoint, {newest}", file=sys.stderr)
        setattr(args, name, str(newest))


def _check_output_keeps_inputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, an ``--out`` that would replace one of the command's inputs, or
    (for commands that write one artifact, ``out_kind = (marker file, what)``) an existing
    directory that is not an earlier output of the same kind."""
    from lmlab.fileio import check_output_keeps_inputs, check_replaceable_dir

    out = getattr(args, "out", None)
    if isinstance(out, str) and out:
        inputs = {f"--{k.replace('_', '-')}": getattr(args, k) for k in INPUT_ARGS if hasattr(args, k)}
        check_output_keeps_inputs(out, inputs)
        kind = getattr(args, "out_kind", None)
        if kind:
            check_replaceable_dir(out, *(kind(args) if callable(kind) else kind))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

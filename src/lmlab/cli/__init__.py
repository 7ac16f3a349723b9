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
import sys

from safetensors import SafetensorError

from lmlab import __version__
from lmlab.cli.flag_rules import check_flag_rules
from lmlab.errors import LmlabError, one_line
from lmlab.runtime import threads_from_environment
from lmlab.stopping import as_stopped, unwind_on_signals
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

    # Which options the command line gave (not their defaults), for the flag rules
    # (lmlab.cli.flag_rules): argparse reads the values of every option it meets through
    # _get_values, and a subcommand's namespace is copied into its parent's.
    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        from lmlab.cli.flag_rules import GIVEN

        self._given: set[str] = set()
        namespace, extras = super().parse_known_args(args, namespace)
        setattr(namespace, GIVEN, frozenset(set(getattr(namespace, GIVEN, ())) | self._given))
        return namespace, extras

    def _get_values(self, action, arg_strings):  # type: ignore[override]
        if action.option_strings:
            self._given.add(action.dest)
        return super()._get_values(action, arg_strings)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="lmlab", description=DESCRIPTION, formatter_class=HelpFormatter)
    parser.add_argument("--version", action="version", version=f"lmlab {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


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
        with unwind_on_signals():
            check_flag_rules(parser, args)  # a flag given without the one it needs (lmlab.cli.flag_rules)
            check_argument_text(parser, args)  # text values (--prompt, --text...) that are not UTF-8
            threads_from_environment()  # OMP_NUM_THREADS=abc: one line, before torch (and OpenMP) load
            notes = _resolve_run_directories(args)
            _check_outputs(args)
            with notes_before_output(notes):
                result = args.func(args)
    except LmlabError as e:
        return _fail(str(e), e.exit_code)
    except KeyboardInterrupt as e:  # SIGTERM or SIGINT (lmlab.stopping): one line, 128 + the signal
        stopped = as_stopped(e)
        return _fail(stopped.message, stopped.exit_code)
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
        if e.filename is None and _cwd_is_gone():
            return ("the current folder no longer exists (it was deleted or replaced); cd to an existing "
                    "folder (cd \"$PWD\" if it was replaced) and run the command again")
        return f"{path} does not exist; check the path"
    return f"{e.strerror or e} ({path}); check the path and the disk"


def _cwd_is_gone() -> bool:
    """Whether the current folder no longer exists (os.getcwd fails): the file a command could
    not find, unnamed, is then the folder it runs in."""
    try:
        os.getcwd()
    except FileNotFoundError:
        return True
    return False


def describe_safetensors_error(e: Exception) -> str:
    """``<problem>; <fix>`` for a safetensors failure, which reports the OS error code in its text."""
    import re

    m = re.search(r"code: (\d+)", str(e))
    if m:
        code = int(m.group(1))
        return describe_os_error(OSError(code, os.strerror(code), "a weights file"))
    first = str(e).splitlines()[0] if str(e) else type(e).__name__
    return f"could not read or write a weights file ({first}); check the disk and the path"


#: arguments that name what a command reads (files, folders, or paths inside a value), with the name
#: an error shows: no output may be one of them, hold one, or lie inside one
#: (:func:`lmlab.ownership.check_output_spares_inputs`). ``harness`` is a comma-separated list of
#: task names and task files or folders; ``variant`` is ``NAME=DIR`` (see :func:`input_paths`).
INPUT_ARGS = {name: f"--{name.replace('_', '-')}" for name in (
    "checkpoint", "input", "train", "dev", "hf", "tokenizer", "teacher", "base", "json_schema", "data",
    "prompts", "harness", "variant")} | {"template_file": "--template", "runs": "RUN_DIR", "path": "PATH"}
#: arguments that name what a command writes: every one is checked before any work, in one place
#: (:func:`_check_outputs`): it may not clash with an input, and its folder must be writable
OUTPUT_ARGS = ("out", "predictions")
#: arguments that name a file read but are not compared with the outputs, and why
UNGUARDED_INPUT_ARGS = {
    "config": "a TOML of settings, read before any output is written; an output that could hold it refuses "
              "it anyway (a finished output holding a file lmlab did not write is never replaced, a folder a "
              "command fills rewrites only its own entries, such as the config.toml that pretrain --resume "
              "may be given back)",
}


def input_paths(name: str, value: object) -> list[str]:
    """The paths in the value of the input argument ``name``: ``harness`` names task files and folders
    among task names (only those that exist as paths count), ``variant`` is ``NAME=DIR``."""
    values = value if isinstance(value, (list, tuple)) else [value]
    items = [v for v in values if isinstance(v, (str, os.PathLike)) and str(v)]
    if name == "harness":
        from lmlab.icl.harness import local_task_paths

        return [str(path) for path in local_task_paths(items)]
    if name == "variant":
        return [str(item).partition("=")[2] for item in items if "=" in str(item)]
    return [str(item) for item in items]


def _resolve_run_directories(args: argparse.Namespace) -> list[str]:
    """A ``--checkpoint``/``--teacher``/``--base`` that is a pretraining run directory means its
    newest complete checkpoint (what a user has after ``lmlab pretrain --out RUN``,
    :func:`lmlab.train.checkpoint.run_checkpoint`). Returns the notes that say so, for
    :func:`notes_before_output`: a command refused by a later check says only its error."""
    from lmlab.train.checkpoint import run_checkpoint

    notes = []
    for name in ("checkpoint", "teacher", "base"):
        value = getattr(args, name, None)
        if not isinstance(value, str) or not value:
            continue
        newest = run_checkpoint(value)
        if str(newest) != value:
            notes.append(f"{value}: using its newest checkpoint, {newest}")
            setattr(args, name, str(newest))
    return notes


_RETIRED_STREAMS: list = []


class _NotesFirst:
    """A stream (stdout or stderr) that says the pending notes on stderr before its first write."""

    def __init__(self, stream, pending: _Pending):
        self._stream, self._pending = stream, pending

    def write(self, text):
        self._pending.release()
        return self._stream.write(text)

    def writelines(self, lines):
        self._pending.release()
        return self._stream.writelines(lines)

    def __getattr__(self, name):
        return getattr(self._stream, name)


class _Pending:
    def __init__(self, notes: list[str]):
        self.notes = list(notes)
        self.streams = (sys.stdout, sys.stderr)

    def restore(self) -> None:
        if isinstance(sys.stdout, _NotesFirst):
            sys.stdout = self.streams[0]
        if isinstance(sys.stderr, _NotesFirst):
            sys.stderr = self.streams[1]

    def release(self) -> None:
        self.restore()
        notes, self.notes = self.notes, []
        for note in notes:
            print(note, file=sys.stderr, flush=True)


@contextlib.contextmanager
def notes_before_output(notes: list[str]):
    """Say ``notes`` (``RUN: using its newest checkpoint, ...``) once the command proceeds: before
    the first line it writes (to stdout or stderr), or at its end when it writes nothing; a
    command refused before it writes anything (a bad data file, a wrong setting) prints only its
    one ``error:`` line."""
    if not notes:
        yield
        return
    pending = _Pending(notes)
    wrappers = (_NotesFirst(sys.stdout, pending), _NotesFirst(sys.stderr, pending))
    # kept alive for good: print() holds sys.stdout as a borrowed reference while it writes, and the
    # first write puts the real stream back (freeing the wrapper mid-print would crash CPython)
    _RETIRED_STREAMS.extend(wrappers)
    sys.stdout, sys.stderr = wrappers
    try:
        yield
    except BaseException:
        pending.restore()
        raise
    pending.release()


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse, before any work, every output (``OUTPUT_ARGS``) that would replace, delete or write
    into one of the command's inputs, or that cannot be written where it is asked to go (a file in
    the way, a folder that refuses writes, inside another lmlab output); then, for commands that
    write one artifact (``out_kind = (marker file, what)``), an existing ``--out`` that is not an
    earlier output of the same kind."""
    from lmlab import ownership
    from lmlab.fileio import check_replaceable_dir

    inputs = {shown: input_paths(k, getattr(args, k)) for k, shown in INPUT_ARGS.items() if hasattr(args, k)}
    for k, shown in INPUT_ARGS.items():  # a list of files or runs: each once (a file read twice, a run
        value = getattr(args, k, None)     # counted twice, means nothing); --harness checks its own
        if isinstance(value, list) and k not in ("harness", "variant"):
            from lmlab.values import check_distinct

            check_distinct(value, shown, f"give each path to {shown} once", key=lambda v: os.path.realpath(v))
    # two outputs of one command never at one path, nor one inside the other
    ownership.check_outputs_apart({f"--{name}": getattr(args, name, None) for name in OUTPUT_ARGS})
    for name in OUTPUT_ARGS:
        out = getattr(args, name, None)
        if isinstance(out, str) and out:
            flag = f"--{name}"
            ownership.check_output_spares_inputs(out, inputs, flag)
            # every --out but evaluate's results file is a folder lmlab makes and fills: not even a
            # new name inside another command's entry (a run's checkpoints/, data/) is its own
            folder = name == "out" and not getattr(args, "out_is_file", False)
            ownership.check_destination(out, flag, fills=folder)
    out = getattr(args, "out", None)
    kind = getattr(args, "out_kind", None)
    if isinstance(out, str) and out and kind:
        check_replaceable_dir(out, *(kind(args) if callable(kind) else kind))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

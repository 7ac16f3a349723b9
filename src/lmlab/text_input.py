"""Text that comes in from the edges: the command line and the user's JSON files.

Python turns bytes that are not UTF-8 into lone surrogates instead of failing: an argument with
byte 0xff arrives as ``"\\udcff"`` (``surrogateescape``), and JSON's ``"\\ud800"`` escape
decodes to a lone surrogate too. Such a string is no text: it fails much later, when a tokenizer
or a writer encodes it, as a traceback. Here it is caught where it comes in, with one line that
names the argument, or the file and line.

* :func:`check_argument_text` - every parsed command-line value that is text (not a file name:
  a file name that is not UTF-8 is a valid name and stays allowed);
* :func:`check_text` - one value, for callers that take text through the Python API;
* :func:`parse_json` - ``json.loads`` that refuses a lone surrogate as a :class:`json.JSONDecodeError`,
  so every JSON Lines reader reports it as it reports any other bad line (file, line, column).

Text files are decoded strictly by :func:`lmlab.fileio.iter_text_lines`, which names the file and
line of the first byte that is not valid in their encoding (and of a lone surrogate that a codec
such as utf-7 decoded). Messages that name a path stay one line through
:func:`lmlab.errors.one_line`, which every :class:`LmlabError` applies (it lives there: this module
raises LmlabError, so errors cannot import it back).
"""

from __future__ import annotations

import argparse
import json
import re

from lmlab.errors import LmlabError

#: one UTF-16 surrogate code point: never a character on its own
SURROGATE = re.compile("[\ud800-\udfff]")
#: a ``\\uD800``-``\\uDFFF`` escape in JSON text, not itself escaped (an odd run of backslashes)
_SURROGATE_ESCAPE = re.compile(r"(?<!\\)(?:\\\\)*(\\u[dD][89a-fA-F][0-9a-fA-F]{2})")

#: metavars of options whose values may name files (a non-UTF-8 file name is valid there)
PATH_METAVARS = frozenset({"FILE", "DIR", "PATH", "RUN_DIR", "NAME=DIR", "TASKS", "KEY=VALUE"})
#: destinations of options without such a metavar whose values are paths
PATH_DESTS = frozenset({"out", "config"})

TEXT_FIX = "pass the text in UTF-8 (check the encoding of the terminal or the script that runs lmlab)"


def surrogate_problem(text: str, escaped_bytes: bool = True) -> str | None:
    """What makes ``text`` no valid text, or None: ``"byte 0xff at offset 2"`` for a byte that
    was not UTF-8 (kept by Python as U+DC80..U+DCFF: command-line values, ``escaped_bytes``),
    ``"a lone surrogate U+D800 at character 2"`` for any other surrogate."""
    m = SURROGATE.search(text)
    if m is None:
        return None
    code = ord(m.group())
    if escaped_bytes and 0xDC80 <= code <= 0xDCFF:
        offset = len(text[:m.start()].encode("utf-8"))
        return f"byte 0x{code - 0xDC00:02x} at offset {offset}"
    return f"a lone surrogate U+{code:04X} at character {m.start()}"


def check_text(text: str, what: str, fix: str = TEXT_FIX) -> str:
    """``text``, or a one-line error naming ``what`` when it holds a byte that is not UTF-8 or a
    lone surrogate."""
    problem = surrogate_problem(text)
    if problem is not None:
        raise LmlabError(f"{what} is not valid UTF-8 ({problem})", fix)
    return text


def check_argument_text(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, before any work, a command-line value given as text (``--prompt``, ``--text``,
    ``--sample``...) that is not valid UTF-8; options that name files or folders may hold any bytes."""
    for action in _chosen_actions(parser, args):
        if _names_a_path(action):
            continue
        values = getattr(args, action.dest, None)
        for value in values if isinstance(values, list) else [values]:
            if isinstance(value, str):
                check_text(value, _flag(action))


def _chosen_actions(parser: argparse.ArgumentParser, args: argparse.Namespace) -> list[argparse.Action]:
    """The arguments of ``parser`` and of the subcommand (and sub-subcommand) that ``args`` chose."""
    actions: list[argparse.Action] = []
    while parser is not None:
        chosen = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                chosen = action.choices.get(getattr(args, action.dest, None) or "")
            elif action.dest != argparse.SUPPRESS:
                actions.append(action)
        parser = chosen
    return actions


def _names_a_path(action: argparse.Action) -> bool:
    return action.metavar in PATH_METAVARS or action.dest in PATH_DESTS


def _flag(action: argparse.Action) -> str:
    if not action.option_strings:
        return str(action.metavar or action.dest)
    return max(action.option_strings, key=len)


def parse_json(text: str):
    """``json.loads(text)``, where a ``\\ud800``-style escape without its other half (a lone
    surrogate: no character) is a :class:`json.JSONDecodeError` at that escape. Pairs such as
    ``\\ud83d\\ude00`` (one emoji) are characters and fine."""
    value = json.loads(text)
    if _SURROGATE_ESCAPE.search(text) and _holds_surrogate(value):
        position, escape = _lone_escape(text)
        raise json.JSONDecodeError(f"{escape} is half of a UTF-16 surrogate pair, not a character "
                                   "(write the character itself, or both halves)", text, position)
    return value


def _holds_surrogate(value) -> bool:
    """Whether a decoded JSON value has a lone surrogate in any string, key or value (no recursion:
    the value may be nested as deeply as the JSON decoder allows)."""
    todo = [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            if SURROGATE.search(v):
                return True
        elif isinstance(v, dict):
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
    return False


def _lone_escape(text: str) -> tuple[int, str]:
    """(position, escape) of the first surrogate escape in ``text`` that is not a high-low pair."""
    found = list(_SURROGATE_ESCAPE.finditer(text))
    i = 0
    while i < len(found):
        high, low = found[i], found[i + 1] if i + 1 < len(found) else None
        is_pair = (low is not None and low.start(1) == high.end(1)
                   and int(high.group(1)[2:], 16) < 0xDC00 <= int(low.group(1)[2:], 16))
        if not is_pair:
            return high.start(1), high.group(1)
        i += 2
    return 0, "a \\ud800-\\udfff escape"  # pragma: no cover - only when the value holds one

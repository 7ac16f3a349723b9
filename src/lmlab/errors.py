"""User-facing errors.

Every problem caused by the user's input (a missing file, an impossible setting, a corrupt
artifact) is raised as :class:`LmlabError` with a one-line message that names the problem and
the fix. The CLI prints it as ``error: ...`` and exits with code 2, never with a traceback.
"""

from __future__ import annotations

import re


def a_or_an(words: str) -> str:
    """``words`` after the article its first letter takes in a message: ``an encoder``, ``a decoder``,
    ``an --out path`` (a flag's dashes are not read)."""
    first = next((c for c in words if c.isalnum()), "")
    return f"{'an' if first.lower() in 'aeiou' and first else 'a'} {words}"


class LmlabError(Exception):
    """Bad input or configuration; the message says what is wrong and how to fix it.

    The message is always one line (:func:`one_line`): a path with a line break or a control
    character in it is shown escaped. ``problem`` and ``fix`` keep the text as given. ``setting``:
    the name of the setting the error is about, when a caller that knows where it was written
    (a recipe's line, a ``--set``, a grid's key) is to name it there."""

    exit_code = 2

    def __init__(self, problem: str, fix: str | None = None, *, setting: str | None = None):
        message = problem if not fix else f"{problem.rstrip('.')}; {fix}"
        super().__init__(one_line(message))
        self.problem = problem
        self.fix = fix
        self.setting = setting


class UnsupportedInput(LmlabError):
    """A well-formed input of a kind or with a feature lmlab does not support (a tokenizer.json
    model type, a normalizer): unlike a corrupt one, a caller may go on without it."""


#: what :func:`one_line` escapes: C0 and C1 controls but the tab, DEL, the Unicode line and
#: paragraph separators, and surrogates (a file name byte that is not UTF-8, kept by Python)
_UNPRINTABLE = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")
_NAMED = {"\n": "\\n", "\r": "\\r"}


def one_line(text: str) -> str:
    """``text`` with every line break and control character escaped as Python writes it
    (``\\n``, ``\\x1b``, ``\\u2028``), so that a message naming any path stays one line. A byte
    that was not UTF-8 in a file name (U+DC80..U+DCFF) is shown as that byte: ``\\xe9``."""
    return _UNPRINTABLE.sub(_escape, str(text))


def _escape(m: re.Match) -> str:
    c = m.group()
    code = ord(c)
    if c in _NAMED:
        return _NAMED[c]
    if 0xDC80 <= code <= 0xDCFF:
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def suggest(name: str, choices, prefix: str = "") -> str:
    """``did you mean PREFIXclosest? (valid: ...)``, or the valid names when none is close: the fix
    of an unknown name, for any layer (:mod:`lmlab.config.overrides` re-exports it)."""
    import difflib

    choices = list(choices)
    close = difflib.get_close_matches(str(name), choices, n=1, cutoff=0.5)
    valid = ", ".join(prefix + c for c in choices)
    return f"did you mean {prefix}{close[0]}? (valid: {valid})" if close else f"valid: {valid}"

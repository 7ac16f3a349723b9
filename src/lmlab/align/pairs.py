"""Preference pairs: a prompt, the response people preferred, and the one they did not.

JSON Lines, one object per line::

    {"prompt": "Review: a gorgeous film\\nSentiment:", "chosen": " positive", "rejected": " negative"}

``prompt`` may be empty (a preference between two whole texts); ``chosen`` and ``rejected`` must be
non-empty and differ. Other keys are ignored. A bad line stops the read with ``FILE line N:
problem`` or, with ``on_bad_line="skip"``, is reported and left out (:class:`BadLines`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass

from lmlab.errors import LmlabError
from lmlab.fileio import check_input_file
from lmlab.tasks.readers import BadLines, json_lines

FIELDS = ("prompt", "chosen", "rejected")


@dataclass(frozen=True)
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    where: str = ""            # "FILE line N", for messages


def pair_problem(rec) -> str | None:
    """What is wrong with one decoded JSON value as a preference pair (None: nothing)."""
    if not isinstance(rec, dict):
        return f"expected a JSON object with {', '.join(FIELDS)}, found {type(rec).__name__}"
    missing = [k for k in FIELDS if k not in rec]
    if missing:
        return f"missing {', '.join(repr(k) for k in missing)}"
    wrong = [k for k in FIELDS if not isinstance(rec[k], str)]
    if wrong:
        return f"{', '.join(repr(k) for k in wrong)} must be strings"
    if not rec["chosen"] or not rec["rejected"]:
        return "'chosen' and 'rejected' must not be empty"
    if rec["chosen"] == rec["rejected"]:
        return "'chosen' and 'rejected' are the same text: the pair states no preference"
    return None


def read_preferences(path: str | os.PathLike, on_bad_line: str | BadLines = "error",
                     warn: Callable[[str], None] | None = None) -> list[PreferencePair]:
    """The preference pairs of a JSON Lines file (``.jsonl`` or ``.jsonl.gz``)."""
    bad = on_bad_line if isinstance(on_bad_line, BadLines) else BadLines(on_bad_line, warn)
    p = check_input_file(path)
    out: list[PreferencePair] = []
    for where, rec in json_lines(p, bad):
        problem = pair_problem(rec)
        if problem:
            bad(where, problem)
            continue
        out.append(PreferencePair(rec["prompt"], rec["chosen"], rec["rejected"], where))
    if not out:
        raise LmlabError(f"{p} holds no preference pairs",
                         'write one JSON object per line: {"prompt": ..., "chosen": ..., "rejected": ...}')
    return out

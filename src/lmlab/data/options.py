"""The choices and defaults of ``lmlab data prepare``, importable without numpy or the tokenizers
(the command-line parser reads them; :mod:`lmlab.data.prepare` uses them)."""

from __future__ import annotations

import os

#: what makes a document: blank-line separated paragraphs, each non-blank line, or each whole file
DOC_SEPARATORS = ("blank-line", "line", "file")
DEFAULT_SHARD_TOKENS = 100_000_000


def default_workers() -> int:
    return max(1, min(2, os.cpu_count() or 1))

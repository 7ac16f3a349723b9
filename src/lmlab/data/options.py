"""The choices and defaults of ``lmlab data prepare``, importable without numpy or the tokenizers
(the command-line parser reads them; :mod:`lmlab.data.prepare` uses them)."""

from __future__ import annotations

#: what makes a document: blank-line separated paragraphs, each non-blank line, or each whole file
DOC_SEPARATORS = ("blank-line", "line", "file")
DEFAULT_SHARD_TOKENS = 100_000_000


def default_workers() -> int:
    """2, or 1 where this process may run on one CPU only (:func:`lmlab.runtime.available_cpus`)."""
    from lmlab.runtime import available_cpus

    return min(2, available_cpus())

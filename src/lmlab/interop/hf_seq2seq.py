"""Moved to :mod:`lmlab.models.seq2seq.hf` (the seq2seq family's folder); this path keeps working for
one release, with a DeprecationWarning."""

import importlib

from lmlab.deprecation import warn_deprecated


def __getattr__(name: str):
    warn_deprecated("lmlab.interop.hf_seq2seq", "import from lmlab.models.seq2seq.hf (its new home)")
    return getattr(importlib.import_module("lmlab.models.seq2seq.hf"), name)

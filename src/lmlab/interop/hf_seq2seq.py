"""Moved to :mod:`lmlab.models.seq2seq.hf` (the seq2seq family's folder); this path keeps working for
one release, with a DeprecationWarning."""

import importlib
import warnings


def __getattr__(name: str):
    warnings.warn("lmlab.interop.hf_seq2seq moved to lmlab.models.seq2seq.hf; the old path will be removed "
                  "in the next release", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("lmlab.models.seq2seq.hf"), name)

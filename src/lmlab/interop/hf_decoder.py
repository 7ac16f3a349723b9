"""Moved to :mod:`lmlab.models.decoder.hf` (the decoder family's folder); this path keeps working for
one release, with a DeprecationWarning."""

import importlib
import warnings


def __getattr__(name: str):
    warnings.warn("lmlab.interop.hf_decoder moved to lmlab.models.decoder.hf; the old path will be removed "
                  "in the next release", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("lmlab.models.decoder.hf"), name)

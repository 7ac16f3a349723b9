"""Moved to :mod:`lmlab.models.encoder.hf` (the encoder family's folder); this path keeps working for
one release, with a DeprecationWarning."""

import importlib
import warnings


def __getattr__(name: str):
    warnings.warn("lmlab.interop.hf_encoder moved to lmlab.models.encoder.hf; the old path will be removed "
                  "in the next release", DeprecationWarning, stacklevel=2)
    return getattr(importlib.import_module("lmlab.models.encoder.hf"), name)

"""Moved to :mod:`lmlab.models.encoder.hf` (the encoder family's folder); this path keeps working for
one release, with a DeprecationWarning."""

import importlib

from lmlab.deprecation import warn_deprecated


def __getattr__(name: str):
    warn_deprecated("lmlab.interop.hf_encoder", "import from lmlab.models.encoder.hf (its new home)")
    return getattr(importlib.import_module("lmlab.models.encoder.hf"), name)

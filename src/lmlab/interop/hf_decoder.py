"""Moved to :mod:`lmlab.models.decoder.hf` (the decoder family's folder); this path keeps working for
one release, with a DeprecationWarning."""

import importlib

from lmlab.deprecation import warn_deprecated


def __getattr__(name: str):
    warn_deprecated("lmlab.interop.hf_decoder", "import from lmlab.models.decoder.hf (its new home)")
    return getattr(importlib.import_module("lmlab.models.decoder.hf"), name)

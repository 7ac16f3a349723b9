"""The one home of lmlab's DeprecationWarning: a moved name or an old keyword keeps working for one
release, and every such path warns through :func:`warn_deprecated`, in one wording::

    <old> is deprecated and goes in the next release: <what to do instead>

The test suite turns exactly that wording into an error (``filterwarnings`` in pyproject.toml), so a
test, or lmlab code a test runs, that reaches a deprecated path fails unless the test expects it
(``pytest.warns(DeprecationWarning, match=...)``); other libraries' warnings are left alone.

This module sits below every package (it imports nothing from lmlab), so any module may use it.
"""

from __future__ import annotations

import sys
import warnings

#: the words every lmlab deprecation message contains (pyproject.toml's filter matches them)
WORDING = "is deprecated and goes in the next release"

# frames of ``torch.nn.Module.__call__`` between ``model(...)`` and ``forward``: skipped, so a
# warning from a forward points at the line that called the model
_MODULE_CALL = "torch.nn.modules.module"


def deprecation_message(old: str, instead: str) -> str:
    """The one wording: ``<old> is deprecated and goes in the next release: <instead>``."""
    return f"{old} {WORDING}: {instead}"


def warn_deprecated(old: str, instead: str, *, stacklevel: int = 2) -> None:
    """Issue lmlab's DeprecationWarning for ``old`` with the advice ``instead``.

    ``stacklevel`` counts as ``warnings.warn``'s does from the function that calls this one (2: its
    caller; 3: the caller of a function that checks its arguments with a helper, ...); the frames of
    ``nn.Module.__call__`` do not count, so ``model(..., old=...)`` and ``model.forward(...)`` both
    point at the caller's line. Silent while ``torch.compile`` traces (a warning there would break
    the graph)."""
    if _compiling():
        return
    frame, level = sys._getframe(stacklevel), stacklevel + 1
    while frame is not None and frame.f_globals.get("__name__") == _MODULE_CALL:
        frame, level = frame.f_back, level + 1
    warnings.warn(deprecation_message(old, instead), DeprecationWarning, stacklevel=level)


#: the advice for the old mask and head keywords of the models' forward
BACKBONE_INSTEAD = ("objectives call model.backbone(ids, positions, mask=MaskSpec(...)) and the heads "
                    "they need")


def pop_deprecated(kwargs: dict, name: str, where: str, instead: str = BACKBONE_INSTEAD, *,
                   stacklevel: int = 3):
    """Pop the keyword ``name`` that older releases of ``where`` took from ``kwargs`` and warn when it
    is set (None and False are unset). ``stacklevel``: 3 when called from the method ``where``
    itself, 4 from a helper of it (the warning names the method's caller)."""
    value = kwargs.pop(name, None)
    if value is not None and value is not False:
        warn_deprecated(f"{where}({name}=...)", instead, stacklevel=stacklevel)
    return value


def _compiling() -> bool:
    torch = sys.modules.get("torch")  # no torch imported: nothing can be tracing
    return torch is not None and torch.compiler.is_compiling()

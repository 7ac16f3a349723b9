"""Package namespaces that import a submodule the first time one of its names is used (PEP 562).

A package whose ``__init__`` offers names from heavy submodules (those that import torch or numpy)
declares them with :func:`lazy_exports` instead of importing them::

    __getattr__, __dir__ = lazy_exports(__name__, {"loop": ("finetune", "evaluate")})

``from lmlab.finetune import finetune`` works as before, but importing a light submodule such as
``lmlab.finetune.config`` (which runs the package's ``__init__`` first) no longer imports the
heavy ones: building the command-line parser stays fast.

A name that is also a submodule's name (``lmlab.scaling.plan``) cannot be lazy: importing that
submodule sets the package's attribute to the module. Import such a name in the ``__init__``, from
a submodule that is light to import.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterable


def lazy_exports(package: str, exports: dict[str, Iterable[str]]) -> tuple[Callable, Callable]:
    """``(__getattr__, __dir__)`` for ``package``, whose ``exports`` maps a submodule's name
    (relative to the package) to the public names it defines."""
    home = {name: submodule for submodule, names in exports.items() for name in names}

    def __getattr__(name: str):
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{home[name]}"), name)
        setattr(sys.modules[package], name, value)  # the next look-up finds it without this function
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(home))

    return __getattr__, __dir__

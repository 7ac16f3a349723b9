"""Pretraining objectives: each turns packed token windows into model inputs and labels.

``OBJECTIVES`` maps a name to ``"module:Class"``; adding an objective is one module plus one line.
``get_objective(name)`` returns the class, with a one-line error listing the valid names.
"""

from __future__ import annotations

import importlib

from lmlab.errors import LmlabError
from lmlab.objectives.base import Objective, TokenBatch

OBJECTIVES: dict[str, str] = {
    "clm": "lmlab.objectives.clm:CausalLM",
}

__all__ = ["OBJECTIVES", "Objective", "TokenBatch", "get_objective"]


def get_objective(name: str) -> type[Objective]:
    if name not in OBJECTIVES:
        import difflib

        close = difflib.get_close_matches(name, list(OBJECTIVES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LmlabError(f"unknown objective {name!r}", f"{hint}choose one of: {', '.join(OBJECTIVES)}")
    module, cls = OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module), cls)

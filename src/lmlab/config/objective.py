"""``[objective]``: the registry name plus the objective's keyword parameters, each checked against
the type its ``__init__`` declares."""

from __future__ import annotations

import inspect
import typing
from dataclasses import field
from typing import Any

from pydantic.dataclasses import dataclass

from lmlab.config.fields import build_named
from lmlab.config.overrides import NOWHERE, Origin
from lmlab.errors import LmlabError


@dataclass
class ObjectiveConfig:
    """``[objective]``: the registry name plus the objective's keyword parameters."""

    name: str = "clm"
    params: dict[str, Any] = field(default_factory=dict)


def build_objective_section(table: dict[str, Any], origin: Origin = NOWHERE) -> ObjectiveConfig:
    """``[objective]`` of a recipe: a registered name; every other key is one of its parameters."""
    return build_named(ObjectiveConfig, table, "objective", "name", origin, _objective_options)


def _objective_options(name: Any, where: str) -> tuple[dict[str, Any], str]:
    from lmlab.objectives import get_objective

    if not isinstance(name, str):
        raise LmlabError(f"{where} must be a string, got {name!r}", 'write e.g. name = "clm"')
    return objective_parameters(get_objective(name)), f"for objective {name!r}"


def objective_parameters(cls) -> dict[str, Any]:
    """Name -> type hint of every option an objective accepts, including those its ``__init__``
    passes on through ``**kwargs`` to a parent objective (NSP and UniLM take MLM's options)."""
    found: dict[str, Any] = {}
    for klass in cls.__mro__:
        init = klass.__dict__.get("__init__")
        if init is None:
            continue
        hints = typing.get_type_hints(init, include_extras=True)
        params = inspect.signature(init).parameters
        for n, p in params.items():
            if n not in ("self", "tokenizer") and p.kind in (
                inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY
            ):
                found.setdefault(n, hints.get(n, Any))
        if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
            break
    return found

"""``[objective]``: the registry name plus the objective's keyword parameters, each checked against
the type its ``__init__`` declares."""

from __future__ import annotations

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
    section = build_named(ObjectiveConfig, table, "objective", "name", origin, _objective_options)
    check_objective_params(section, origin)
    return section


def check_objective_params(section: ObjectiveConfig, origin: Origin = NOWHERE) -> None:
    """The rules between the objective's parameters (:meth:`~lmlab.objectives.base.Objective.check_params`,
    the copy its ``__init__`` runs too), at config load: before any tokenizer is trained. An error
    names where the parameters were written (the file, ``--set``)."""
    from lmlab.objectives import get_objective

    cls = get_objective(section.name)
    params = cls.with_defaults(section.params)
    try:
        cls.check_params(params, given=_given(cls, section, params, origin))
    except LmlabError as e:  # named where its parameter was written (the error says which)
        key = f"objective.{e.setting}"
        if e.setting is None or e.setting not in section.params or origin.of(key) == key:
            raise
        raise origin.naming(e, key) from None


def _given(cls, section: ObjectiveConfig, params: dict[str, Any], origin: Origin) -> set[str]:
    """The parameters the rules treat as given: each ``--set`` gave (at any value: the user asked
    for it now), and each a file wrote other than its default (a recipe, or a run's saved config,
    writes defaults too). A ``--set`` partner over a recipe's parameter wins, as ``--set`` does: the
    parameter it turns off goes back to its default (``--set objective.variant=prefix_lm`` on a
    recipe with ``noise_density``), so the run, and its saved config, say what it does."""
    from lmlab.config.rules import settings_given

    defaults = cls.with_defaults({})
    given, turned_off = settings_given(cls.rules(), section.params, params.get, defaults.get, "objective",
                                       origin, set_at_default=True)
    for name in turned_off:
        section.params.pop(name, None)
        params[name] = defaults.get(name)
    return given


def _objective_options(name: Any, where: str) -> tuple[dict[str, Any], str]:
    from lmlab.objectives import get_objective

    if not isinstance(name, str):
        raise LmlabError(f"{where} must be a string, got {name!r}", 'write e.g. name = "clm"')
    return objective_parameters(get_objective(name)), f"for objective {name!r}"


def objective_parameters(cls) -> dict[str, Any]:
    """Name -> type hint of every option an objective accepts
    (:meth:`lmlab.objectives.base.Objective.declared_params`)."""
    return {name: hint for name, (hint, _) in cls.declared_params().items()}

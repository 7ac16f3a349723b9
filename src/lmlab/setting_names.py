"""How a setting is named in a message: its Python keyword, its key in a table or its flag.

:class:`SettingNames` is the one helper of "which name did the user write". It sits below the
packages (it imports only lmlab's errors), so that any layer (the generators, the scaling fits,
the compression helpers) words its errors in its caller's terms: a Python call passes nothing
(:data:`KEYWORDS`), a command passes ``SettingNames("flag", ...)``. :mod:`lmlab.config.rules`,
which states which settings go together, re-exports it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from lmlab.errors import LmlabError

#: how each context writes a setting: a keyword argument, a key of a (TOML) table, a flag
STYLES = ("keyword", "key", "flag")


@dataclass(frozen=True)
class SettingNames:
    """How one context names settings: the one helper of "which key did the user write".

    ``style``: ``keyword`` (a Python call: ``lr``), ``key`` (a table: ``prefix`` + field,
    ``finetune.lr``) or ``flag`` (a command line: ``--lr``, or ``flags[field]``); ``written``: the
    names of the settings given somewhere else than that (``tasks[0].finetune.lr``, ``--set
    finetune.lr``, ``FILE:LINE: finetune.lr``); ``names``: a name this context gives a setting that
    is not the plain one (the grid's ``task`` is ``tasks[0].task``)."""

    style: str = "keyword"
    prefix: str = ""
    written: Mapping[str, str] = field(default_factory=dict)
    names: Mapping[str, str] = field(default_factory=dict)
    flags: Mapping[str, str] = field(default_factory=dict)

    def of(self, name: str) -> str:
        """``name`` where the user wrote it."""
        return self.written.get(name) or self.to_set(name)

    def to_set(self, name: str) -> str:
        """How to write ``name`` in this context (a fix's words)."""
        if name in self.names:
            return self.names[name]
        if self.style == "flag":
            return self.flags.get(name, "--" + name.replace("_", "-"))
        return f"{self.prefix}{name}" if self.style == "key" else name

    def setting(self, name: str, values: Iterable[Any]) -> str:
        """``name`` set to one of ``values``: ``--lr auto``, ``finetune.lr = "auto"``, ``lr="auto"``."""
        shown = [v for v in values if v is not None]
        if self.style == "flag":
            return f"{self.to_set(name)} {' or '.join(str(v) for v in shown)}".rstrip()
        literal = " or ".join(_literal(v, self.style) for v in shown)
        return f"{self.of(name)} = {literal}" if self.style == "key" else f"{self.to_set(name)}={literal}"

    @property
    def verb(self) -> str:
        """How a fix asks for a setting: ``add --lr auto``, ``set finetune.lr = "auto"``."""
        return "add" if self.style == "flag" else "set"

    def error(self, name: str, problem: str, fix: str) -> LmlabError:
        """A one-line error about setting ``name``, named where it was written."""
        return LmlabError(f"{self.of(name)} {problem}", fix)


#: a Python call's settings: named by their keyword
KEYWORDS = SettingNames()


def _literal(value: Any, style: str) -> str:
    if isinstance(value, bool):
        return ("true" if value else "false") if style == "key" else str(value)
    return json.dumps(value) if isinstance(value, str) else str(value)

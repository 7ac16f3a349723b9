"""The one validator of a config section: every key known (an unknown one names the closest), every
value converted to its field's type and checked against its range (the value types of
:mod:`lmlab.values`), so ``--set train.lr=3e-4`` and ``lr = 3e-4`` in a file give the same float.

Only command-line text (a ``--set`` value) is read as text: ``--set train.max_steps=10`` and
``--set train.betas=0.9,0.95`` are parsed. A file or a dict is typed already, so a string where
a number, a truth value or a list belongs (``max_steps = "10"`` in TOML) is a one-line error, not
quietly converted."""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from typing import Any

from lmlab import values
from lmlab.config.overrides import NOWHERE, Origin, suggest
from lmlab.config.toml import parse_value
from lmlab.errors import LmlabError


def section_fields(cls) -> dict[str, Any]:
    """Field name -> type hint (``Annotated`` kept) of a section class, in field order."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def build_section(cls, table: dict[str, Any], section: str, origin: Origin = NOWHERE,
                  what: str = "config key"):
    """``cls(**table)``, every key and value checked; errors name ``origin.of("section.key")``."""
    hints = section_fields(cls)
    kwargs = {}
    for key, value in table.items():
        if key not in hints:
            raise LmlabError(f"unknown {what} {origin.of(f'{section}.{key}')}",
                             suggest(key, hints, f"{section}."))
        where = origin.of(f"{section}.{key}")
        text = origin.from_command_line(f"{section}.{key}")
        value = coerce(value, hints[key], f"{section}.{key}", where, text)
        kwargs[key] = values.check(hints[key], value, where)
    return cls(**kwargs)


def coerce(value: Any, hint, key: str, where: str | None = None, text: bool = False) -> Any:
    """Convert ``value`` to the type ``hint`` of config field ``key`` and check its range (an
    ``Annotated`` type of :mod:`lmlab.values`), or a one-line error naming ``where`` (the file and
    key, or the ``--set``; default: ``key``). ``text``: the value is command-line text (``--set``),
    which may spell a number, a truth value or a comma-separated list; any other string there is
    refused (:func:`refuse_text`)."""
    where = where or key
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:  # a value type of lmlab.values: it says the range and the message
        base = typing.get_args(hint)[0]
        if base in (int, float):
            value = _from_text(value, base, key, where, text)
        else:
            value = coerce(value, base, key, where, text)
        return values.check(hint, value, where)
    if origin in (typing.Union, types.UnionType):
        return _coerce_union(value, typing.get_args(hint), key, where, text)
    if hint is Any:
        return value
    if origin in (list, tuple):
        return _coerce_sequence(value, hint, key, where, text)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise LmlabError(f"{where} must be a table, got {value!r}", f"write {key} as a TOML table")
        return dict(value)
    simple = _SIMPLE.get(hint)
    if simple is None:
        return value
    return simple(_from_text(value, hint, key, where, text) if hint is not str else value, key, where)


#: what each typed value is called in an error, and how to write one in TOML
_KINDS = {int: ("a whole number", "100"), float: ("a number", "0.001"), bool: ("true or false", "true"),
          list: ("a list", "[...]")}


def refuse_text(value: str, kind: type, key: str, where: str, written: str | None = None) -> None:
    """A string from a file or a dict where a ``kind`` (number, truth value, list) belongs: TOML
    writes those without quotes, so ``max_steps = "10"`` is a typing slip, refused in one line.
    ``written``: the whole value to show unquoted when ``value`` is an item of it (a list)."""
    what, example = _KINDS[kind]
    bare, name = value.strip(), key.rpartition(".")[2]
    shown = example if written is None else f"[{example}]"
    fix = (f"write it without quotes: {name} = {bare if written is None else written}"
           if _written_as(bare, kind) else f"write e.g. {name} = {shown}")
    raise LmlabError(f"{where} must be {what}, got the string {value!r}", fix)


def _toml_list(items: list, unquote: int) -> str:
    """``items`` written as a TOML list, its item ``unquote`` (a quoted number) without quotes."""
    import json

    def one(i: int, v: Any) -> str:
        if i == unquote:
            return str(v).strip()
        if isinstance(v, bool):
            return "true" if v else "false"
        return json.dumps(v, ensure_ascii=False) if isinstance(v, str) else str(v)

    return "[" + ", ".join(one(i, v) for i, v in enumerate(items)) + "]"


def _written_as(text: str, kind: type) -> bool:
    """Whether ``text`` unquoted is a TOML value of ``kind``."""
    parsed = parse_value(text)
    if kind is bool or isinstance(parsed, bool):
        return kind is bool and isinstance(parsed, bool)
    return isinstance(parsed, (int, float) if kind is float else kind)


def _from_text(value: Any, kind: type, key: str, where: str, text: bool) -> Any:
    """``value`` parsed as a TOML literal when it is command-line text; a string from a file or a
    dict is refused (:func:`refuse_text`)."""
    if not isinstance(value, str):
        return value
    if not text:
        refuse_text(value, kind, key, where)
    return parse_value(value)


def _coerce_union(value: Any, args: tuple, key: str, where: str, text: bool = False) -> Any:
    if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
        if type(None) in args:
            return None
    errors = []
    for arg in (a for a in args if a is not type(None)):
        try:
            return coerce(value, arg, key, where, text)
        except LmlabError as e:
            errors.append(e)
    raise errors[0]


def _coerce_sequence(value: Any, hint, key: str, where: str, text: bool = False) -> Any:
    args = [a for a in typing.get_args(hint) if a is not Ellipsis] or [Any]
    words = base_type(args[0]) is str
    if isinstance(value, str):
        if not (text or words):
            refuse_text(value, list, key, where)
        split = not words or "," in value
        try:
            value = [] if not value.strip() else values.comma_list(value) if split else [value]
        except values.ListProblem as e:
            raise LmlabError(f"{where} {e} (got {value!r})", f"write e.g. {key}=a,b or {key}=[]") from None
    if isinstance(value, tuple):
        value = list(value)
    if not isinstance(value, list):
        raise LmlabError(f"{where} must be a list, got {value!r}", f"write e.g. {key}=[...]")
    if typing.get_origin(hint) is tuple and Ellipsis not in typing.get_args(hint) and len(value) != len(args):
        each = values.hint(args[0])  # a fixed number of values (Adam's two betas)
        raise LmlabError(f"{where} must hold {len(args)} values, got {len(value)} ({value!r})",
                         f"write {len(args)} values in brackets, each {each or 'of its kind'}")
    inner = [args[min(i, len(args) - 1)] for i in range(len(value))]
    if not text:  # a file's list holding a quoted number: the fix writes the whole list, unquoted
        for i, (v, kind) in enumerate(zip(value, inner, strict=True)):
            base = base_type(kind)
            if isinstance(v, str) and base in _KINDS and base is not list:
                refuse_text(v, base, key, f"{where}[{i}]", written=_toml_list(value, i))
    out = [coerce(v, kind, key, where, text) for v, kind in zip(value, inner, strict=True)]
    return tuple(out) if typing.get_origin(hint) is tuple else out


def _bool(value: Any, key: str, where: str) -> bool:
    """The one rule for a truth value of a config: ``true`` or ``false``. Command-line text (a
    ``--set``) was read as a TOML literal already (:func:`_from_text`), so ``--set k=true`` arrives
    here as True; ``yes``, ``on``, ``1`` or ``0`` (text or number, from the command line, a file or
    a dict) are refused, as a number is never a truth value (:mod:`lmlab.values`)."""
    if isinstance(value, bool):
        return value
    raise LmlabError(f"{where} must be true or false, got {value!r}",
                     f"write {key}=true or {key}=false (not 1, 0, yes or no)")


def _int(value: Any, key: str, where: str) -> int:
    """A field typed plain ``int``: the one rule of a whole number (:func:`lmlab.values.whole_number`:
    ``1.0`` and ``1e3`` are not one, from a file, ``--set`` or a dict alike)."""
    if isinstance(value, str):
        value = parse_value(value)
    return values.check(values.Integer, value, where, f"write it as digits, e.g. {key}=100")


def _float(value: Any, key: str, where: str) -> float:
    if isinstance(value, str):
        value = parse_value(value)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise LmlabError(f"{where} must be a number, got {value!r}", f"write e.g. {key}=0.001")
    if not math.isfinite(value):
        raise LmlabError(f"{where} must be a finite number, got {value!r}", f"write e.g. {key}=0.001")
    return float(value)


def _str(value: Any, key: str, where: str) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise LmlabError(f"{where} must be a string, got {value!r}", f'write {key}="..."')


_SIMPLE = {bool: _bool, int: _int, float: _float, str: _str}


def base_type(hint):
    """``str`` for ``Annotated[str, ...]``; any other hint as it is."""
    return typing.get_args(hint)[0] if typing.get_origin(hint) is typing.Annotated else hint


def build_named(cls, table: dict[str, Any], section: str, name_key: str, origin: Origin, options) -> Any:
    """``cls(name, options)`` of a section that names a thing plus its options (``[model]``: a preset
    and its config's fields; ``[objective]``: an objective and its parameters). ``options(name)``:
    ``(hint of each option, whose options they are)``, or a one-line error for an unknown name.
    Every other key must be one of those options (else the closest is named); every value is
    converted and checked against its hint."""
    name = table.pop(name_key, getattr(cls, name_key))
    hints, owner = options(name, origin.of(f"{section}.{name_key}"))
    for key in table:
        if key not in hints:
            fix = suggest(key, [name_key, *hints], f"{section}.") if hints else "it takes no parameters"
            raise LmlabError(f"unknown config key {origin.of(f'{section}.{key}')} {owner}", fix)
    return cls(name, {k: coerce(v, hints[k], f"{section}.{k}", origin.of(f"{section}.{k}"),
                                origin.from_command_line(f"{section}.{k}"))
                      for k, v in table.items()})

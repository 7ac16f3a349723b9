"""Command-line flags generated from a config section, and a section read from ``--config FILE``
plus ``--set section.key=value``: a flag, a file key and a ``--set`` accept the same values because
each is checked by the field's one type (:mod:`lmlab.values`).

A generated flag's default is SUPPRESS: only the flags given on the command line reach the
namespace, so :func:`section_settings` can layer them over the file (file < flags < ``--set``), and
a field's default is written once, in its section (``--help`` shows it from there).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from pathlib import Path
from typing import Any

from lmlab import values
from lmlab.config.fields import build_section, section_fields
from lmlab.config.overrides import Origin, apply_override, override_items
from lmlab.config.overrides import example as example_override
from lmlab.config.rules import SettingNames
from lmlab.config.toml import read_toml
from lmlab.errors import LmlabError

#: the flags of the machine a fine-tuning or preference-tuning run uses (fields of both sections)
MACHINE_FLAGS: dict[str, str | dict[str, Any]] = {
    "device": {"help": "auto, cpu, cuda, cuda:1...", "metavar": "DEVICE"},
    "precision": "auto: bf16 autocast on a CUDA GPU with bfloat16, fp32 elsewhere",
    "threads": {"help": "torch CPU threads (default: OMP_NUM_THREADS, else auto)", "metavar": "N"},
    "progress": {"flag": "--no-progress", "action": "store_false", "help": "no progress bar"},
}
#: argparse settings a flag table may give besides ``help`` (everything else comes from the field)
_PASSED = ("action", "nargs", "metavar", "type", "choices")


def plain_type(hint: Any) -> Any:
    """``Count`` for ``Count | None``; any other hint as it is."""
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return hint


def choices_of(hint: Any) -> tuple[str, ...]:
    """The options of a :func:`lmlab.values.choice` type (from its description, ``one of a, b``)."""
    words = values.hint(plain_type(hint))
    return tuple(words.removeprefix("one of ").split(", ")) if words.startswith("one of ") else ()


def add_section_flags(group, cls, table: dict[str, str | dict[str, Any]]) -> None:
    """One flag per entry of ``table`` (field -> help, or a dict of help and argparse settings; the
    flag is ``--field-name`` unless ``flag`` says otherwise), typed, ranged and listed (choices) from
    the field of section ``cls``, its default shown from the section."""
    hints, defaults = section_fields(cls), {f.name: f.default for f in dataclasses.fields(cls)}
    for name, spec in table.items():
        spec = {"help": spec} if isinstance(spec, str) else dict(spec)
        kwargs = {k: spec[k] for k in _PASSED if k in spec}
        if "action" not in kwargs:
            kinds = choices_of(hints[name])
            if kinds and "choices" not in kwargs:
                kwargs["choices"] = kinds
            elif not kinds and "type" not in kwargs:
                kwargs["type"] = values.flag(plain_type(hints[name]))
        default = defaults[name]
        quiet = default in (None, (), []) or default is dataclasses.MISSING or isinstance(default, bool)
        shown = "" if quiet else f" (default: {_shown(default)})"
        flag = spec.get("flag", f"--{name.replace('_', '-')}")
        group.add_argument(flag, dest=name, default=argparse.SUPPRESS,
                           help=spec["help"].replace("%", "%%") + shown, **kwargs)


def _shown(value: Any) -> str:
    return " ".join(str(v) for v in value) if isinstance(value, (tuple, list)) else str(value)


def add_config_flags(p, section: str, example: str) -> None:
    """``--config FILE`` (a TOML file with a ``[section]`` table) and ``--set section.key=value``."""
    p.add_argument("--config", type=values.path_flag, metavar="FILE", default=None,
                   help=f"TOML file whose [{section}] table sets any of the settings below (flags given on "
                        f"the command line win), e.g. {example}")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", dest="overrides",
                   help=f"override one setting, e.g. {section}.lr=3e-4 (wins over --config and the flags)")


def section_settings(cls, section: str, args, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The settings of section ``cls`` that the file ``args.config``, the flags given (attributes of
    ``args`` named like fields, plus ``extra``) and ``args.overrides`` (``--set``) say, in that order;
    every value checked (a bad one is one line naming the file and line, the flag or the ``--set``)
    before anything else runs. Only what was given is returned (the rest stays the section's default)."""
    raw: dict[str, Any] = {section: {}}
    file = getattr(args, "config", None)
    if file:
        page = {"finetune": "finetuning", "align": "align"}.get(section, section)
        example = f"the [{section}] example in docs/{page}.md"
        raw = read_toml(file, f"{section} config file", example)
        _check_tables(raw, section, file)
        raw.setdefault(section, {})
    flags = given_flags(cls, args)
    raw[section].update(flags)
    raw[section].update({k: v for k, v in (extra or {}).items() if v is not None})
    items = override_items(getattr(args, "overrides", None), example_override(section))
    origin = _origin(section, args, flags, items)
    for key, value in items:
        apply_override(raw, key, value, (section,), origin)
    checked = build_section(cls, dict(raw[section]), section, origin, f"{section} setting")
    return {k: getattr(checked, k) for k in raw[section]}


def given_flags(cls, args) -> dict[str, Any]:
    """The flags of section ``cls`` given on the command line (a generated flag's default is SUPPRESS)."""
    names = section_fields(cls)
    return {k: v for k, v in vars(args).items() if k in names}


def _origin(section: str, args, flags, items, extra_flags: dict[str, str] | None = None) -> Origin:
    file = getattr(args, "config", None)
    shown = {**{k: f"--{k.replace('_', '-')}" for k in flags}, **(extra_flags or {})}
    return Origin(str(file or ""), frozenset(k for k, _ in items),
                  tuple((f"{section}.{k}", flag) for k, flag in shown.items()))


def setting_origin(section: str, args) -> Origin:
    """Where a command's ``section`` settings came from, besides its flags: ``--set section.key``
    (``args.overrides``) or its ``--config`` file (named ``FILE:LINE: section.key``)."""
    items = override_items(getattr(args, "overrides", None), example_override(section)) if section else []
    return _origin(section, args, (), items)


def section_names(cls, section: str, args, given, extra_flags: dict[str, str] | None = None,
                  flags: dict[str, str] | None = None) -> SettingNames:
    """How a command whose flags mirror section ``cls`` names its settings in a message
    (:class:`lmlab.config.rules.SettingNames`): each of ``given`` where the user wrote it (its flag,
    ``--set section.key``, ``FILE:LINE: section.key``), any other by its flag (``flags``: those that
    are not ``--field-name``). ``extra_flags``: field -> the flag that gave it, for settings a command
    reads from a flag of its own (``--template FILE`` is ``template``)."""
    items = override_items(getattr(args, "overrides", None), example_override(section))
    shown = {**(flags or {}), **(extra_flags or {})}
    origin = _origin(section, args, given_flags(cls, args), items,
                     {k: v for k, v in shown.items() if k in given})
    return SettingNames("flag", written={k: origin.of(f"{section}.{k}") for k in given},
                        flags={**(extra_flags or {}), **(flags or {})})


def rule_settings(cls, section: str, settings=None):
    """The ``rule_settings`` a command whose flags mirror section ``cls`` gives
    :func:`lmlab.cli.flag_rules.check_flag_rules`: ``args -> (section, the settings given anywhere
    (--config, flags, --set), the section's defaults)``; ``settings(args)``: the command's own
    reading of them (default :func:`section_settings`)."""
    defaults = {f.name: f.default for f in dataclasses.fields(cls)}

    def given(args) -> tuple[str, dict[str, Any], dict[str, Any]]:
        return section, (settings(args) if settings else section_settings(cls, section, args)), defaults

    return given


def _check_tables(raw: dict[str, Any], section: str, file) -> None:
    for key, value in raw.items():
        if key != section:
            raise LmlabError(f"{file}: unknown table [{key}]",
                             f"write the settings under [{section}] (the paths are flags: see --help)")
        if not isinstance(value, dict):
            raise LmlabError(f"{file}: [{section}] must be a table, got {value!r}",
                             f"write [{section}] with key = value lines")


def read_section_file(path: str | Path, cls, section: str) -> Any:
    """The section ``cls`` of the TOML file ``path`` (its ``[section]`` table), checked."""
    raw = read_toml(path, f"{section} config file")
    _check_tables(raw, section, path)
    return build_section(cls, dict(raw.get(section, {})), section, Origin(str(path)), f"{section} setting")

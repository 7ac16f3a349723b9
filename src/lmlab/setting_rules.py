"""Which settings go together, and how a setting is named in a message.

It sits below the packages (it imports only lmlab's errors and :mod:`lmlab.setting_names`), so any
layer states its rules with it: a config section, a command's flags, an objective's parameters
(:attr:`lmlab.objectives.base.Objective.only_when`). :mod:`lmlab.config.rules` re-exports it.

A rule says that a setting means something only with another (:class:`Needs`: ``select_fraction``
only with ``select_on = "train-slice"``), never with another (:class:`Excludes`), or is a number
no larger than another's (:class:`NotAbove`: a warmup no longer than the run). A section
states its rules once, by field name (:data:`lmlab.config.finetune.RULES`); a command whose flags
are not a section's states them by flag (:mod:`lmlab.cli.flag_rules`). Only what the user gave
triggers a rule (a default never does); a partner's value is the one the run will use.

:class:`SettingNames` words the message in the user's own terms: the same rule reads
``--lr-sweep applies only with --lr auto`` on the command line, ``finetune.lr_sweep applies only
with finetune.lr = "auto"`` in a grid and ``lr_sweep applies only with lr="auto"`` from Python.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from lmlab.errors import LmlabError
from lmlab.setting_names import KEYWORDS, SettingNames


def is_set(value: Any) -> bool:
    """A partner counts as given when it holds something (a default None, False or [] does not)."""
    if isinstance(value, (list, tuple, str)):
        return bool(value)
    return value is not None and value is not False


@dataclass(frozen=True)
class Needs:
    """``flag`` applies only when ``partner`` is set (``values`` None) or has one of ``values``
    (``None`` among them: left unset, e.g. a format told from the file's extension); ``shown``
    writes that condition for the message (default ``PARTNER V1 or V2``); ``note``: added to it
    (``or .csv files``); ``when``: the rule holds only for those values of ``flag``; ``why``: a few
    words on what ``flag`` does, shown in brackets. ``flag`` and ``partner`` are flags
    (:mod:`lmlab.cli.flag_rules`) or field names (a section's rules, named by :class:`SettingNames`)."""

    flag: str
    partner: str
    values: tuple[Any, ...] | Callable[[Any], bool] | None = None
    shown: str = ""
    when: Callable[[Any], bool] | None = None
    why: str = ""
    note: str = ""
    verb: str = ""  # how the fix asks for the condition, when not the context's (``add``, ``set``)

    def condition(self, names: SettingNames | None = None) -> str:
        if self.shown:
            return self.shown
        if self.values is None or callable(self.values):
            text = names.to_set(self.partner) if names else self.partner
        elif names is not None:
            text = names.setting(self.partner, self.values)
        else:
            text = f"{self.partner} {' or '.join(str(v) for v in self.values if v is not None)}"
        return f"{text} ({self.note})" if self.note else text

    def broken(self, value: Callable[[str], Any]) -> bool:
        """Whether the rule is broken, given what the run will use (``value(name)``)."""
        return not self.holds(value(self.partner))

    def holds(self, value: Any) -> bool:
        if self.values is None:
            return is_set(value)
        if callable(self.values):
            return bool(self.values(value))
        return value in self.values

    def problem(self, flag: str, value: Any, names: SettingNames | None = None,
                partner: Any = None) -> tuple[str, str]:
        why, condition = f" ({self.why})" if self.why else "", self.condition(names)
        verb = self.verb or (names.verb if names is not None else "add")
        if self.when is not None:  # the rule of some values of flag: name the value
            return f"{flag} {value} needs {condition}{why}", f"{verb} {condition}"
        return f"{flag} applies only with {condition}{why}", f"{verb} {condition}, or drop {flag}"


@dataclass(frozen=True)
class Excludes:
    """``flag`` and ``partner`` may not be given together; ``why`` says why (shown in brackets);
    ``when``: the rule holds only for those values of ``flag`` (then named with its value)."""

    flag: str
    partner: str
    why: str = ""
    when: Callable[[Any], bool] | None = None
    shown: str = ""

    def broken(self, value: Callable[[str], Any]) -> bool:
        return not self.holds(value(self.partner))

    def holds(self, value: Any) -> bool:
        return not is_set(value)

    def problem(self, flag: str, value: Any, names: SettingNames | None = None,
                partner: Any = None) -> tuple[str, str]:
        why = f" ({self.why})" if self.why else ""
        partner = self.shown or (names.to_set(self.partner) if names else self.partner)
        if self.when is not None:  # the rule of some values of flag: name the value
            flag = f"{flag} {value}"
        return f"{flag} cannot be combined with {partner}{why}", f"drop {flag} or {partner}"


@dataclass(frozen=True)
class NotAbove:
    """``flag``'s number may not exceed ``partner``'s when both are set (a warmup longer than the
    run); ``why`` says what would happen (shown in brackets)."""

    flag: str
    partner: str
    why: str = ""
    when: Callable[[Any], bool] | None = None

    def broken(self, value: Callable[[str], Any]) -> bool:
        mine, limit = value(self.flag), value(self.partner)
        return mine is not None and limit is not None and mine > limit

    def problem(self, flag: str, value: Any, names: SettingNames | None = None,
                partner: Any = None) -> tuple[str, str]:
        why = f" ({self.why})" if self.why else ""
        other = names.of(self.partner) if names else self.partner
        # both named as the user wrote them (a setting may have no flag of its own)
        return (f"{flag} {value} is more than {other} {partner}{why}",
                f"lower {flag} to at most {partner}, or raise {other}")


@dataclass(frozen=True)
class ForArchitectures:
    """``flag`` does something only on a model of one of ``architectures`` (``encoder``,
    ``decoder``, ``seq2seq``: told from the model's config, before any weight is read), or, whatever
    the model, with one of ``tasks``; ``why`` says what it does (shown in brackets). The one kind
    of rule for "another architecture ignores this": fine-tuning's settings
    (:data:`lmlab.config.finetune.ARCHITECTURE_RULES`) and the PEFT methods' options
    (:data:`lmlab.adapt.options.MODEL_RULES`)."""

    flag: str
    architectures: tuple[str, ...]
    why: str
    tasks: tuple[str, ...] = ()

    def holds(self, architecture: str, task: str | None = None) -> bool:
        return architecture in self.architectures or (task is not None and task in self.tasks)

    def problem(self, shown: str, architecture: str, model: str = "", drop: str = "") -> tuple[str, str]:
        """``shown``: the setting as the user wrote it (``--lm-weight``, ``before_cls=true``);
        ``model``: the checkpoint it is about, when there is one to name; ``drop``: what to drop."""
        what = f"{model}, {_model(architecture)}" if model else _model(architecture)
        wanted = _model(" or ".join(_ARCHITECTURE_WORDS.get(a, a) for a in self.architectures))
        if self.tasks:
            wanted += f" (or task {' or '.join(self.tasks)})"
        return (f"{shown} has no effect on {what} ({self.why})",
                f"drop {drop or shown}, or use {wanted}")


#: how an architecture is called in a message
_ARCHITECTURE_WORDS = {"seq2seq": "encoder-decoder"}


def _model(architecture: str) -> str:
    from lmlab.errors import a_or_an

    return f"{a_or_an(_ARCHITECTURE_WORDS.get(architecture, architecture))} model"


def check_architecture(rules: Iterable[ForArchitectures], given: Iterable[str], architecture: str,
                       task: str | None = None, names: SettingNames = KEYWORDS, model: str = "") -> None:
    """Refuse, in one line named by ``names``, a setting of ``given`` (the names the user set: a
    default never counts) that a model of ``architecture`` fine-tuned on ``task`` would ignore
    (``rules``); ``model``: the checkpoint named in the message."""
    given = set(given)
    for rule in rules:
        if rule.flag in given and not rule.holds(architecture, task):
            raise LmlabError(*rule.problem(names.of(rule.flag), architecture, model))


Rule = Needs | Excludes | NotAbove


def check_rules(rules: Iterable[Rule], given: Iterable[str], value: Callable[[str], Any],
                names: SettingNames = KEYWORDS) -> None:
    """Refuse, in one line named by ``names``, a setting of ``given`` (the names the user set) whose
    partner (``value(name)``: what the run will use) breaks one of ``rules``."""
    given = set(given)
    for rule in rules:
        if rule.flag not in given or (rule.when is not None and not rule.when(value(rule.flag))):
            continue
        if rule.broken(value):  # the setting named too, for a caller to say where it was written
            raise LmlabError(*rule.problem(names.of(rule.flag), value(rule.flag), names, value(rule.partner)),
                             setting=rule.flag)

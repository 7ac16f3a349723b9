"""Which flags go together: one declarative table, checked for every command right after parsing.

A flag that only means something with another (``--select-fraction`` with ``--select-on
train-slice``, ``--base`` with ``--format peft``) used to be ignored in silence when given alone,
or refused by a check of the command's own, each worded its own way. Every such dependency is a
row of :data:`RULES` instead, and :func:`check_flag_rules` (called by :func:`lmlab.cli.main`
before anything else) refuses a flag given without its partner in one line naming both:
``error: --lr-sweep applies only with --lr auto; add --lr auto, or drop --lr-sweep``.

Only what the user gave counts: a flag on the command line (the parser records which, see
:class:`lmlab.cli.Parser`; a default never triggers a rule), or, for a command that reads a
settings section (``lmlab finetune``'s ``[finetune]``, from ``--config`` and ``--set`` too), a
setting given there. A partner's value is what the command will use: given, or its default.

* :class:`Needs`: ``flag`` applies only when ``partner`` is set (``values`` None) or has one of
  ``values``; ``when`` limits the rule to some values of ``flag`` (``--steps`` above 0).
* :class:`Excludes`: ``flag`` and ``partner`` may not both be given (one overrides the other).

A rule that needs the files' contents or the checkpoint (a ``.tsv`` file with ``--delimiter``, a
decoder's ``--lm-weight``) stays with the code that reads them.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from lmlab.errors import LmlabError

#: the namespace attribute where :class:`lmlab.cli.Parser` records the dests given on the command line
GIVEN = "_given_dests"


def _is_set(value: Any) -> bool:
    """A partner counts as given when it holds something (a default None, False or [] does not)."""
    if isinstance(value, (list, tuple, str)):
        return bool(value)
    return value is not None and value is not False


@dataclass(frozen=True)
class Needs:
    """``flag`` applies only with ``partner`` set, or set to one of ``values`` (``None`` among them:
    left unset, e.g. a format told from the file's extension); ``shown`` writes that condition for
    the message (default ``PARTNER V1 or V2``); ``when``: the rule holds only for those values of
    ``flag``; ``why``: a few words on what ``flag`` does, shown in brackets."""

    flag: str
    partner: str
    values: tuple[Any, ...] | Callable[[Any], bool] | None = None
    shown: str = ""
    when: Callable[[Any], bool] | None = None
    why: str = ""

    def condition(self) -> str:
        if self.shown:
            return self.shown
        if self.values is None or callable(self.values):
            return self.partner
        return f"{self.partner} {' or '.join(str(v) for v in self.values if v is not None)}"

    def holds(self, value: Any) -> bool:
        if self.values is None:
            return _is_set(value)
        if callable(self.values):
            return bool(self.values(value))
        return value in self.values

    def problem(self, flag: str, value: Any) -> tuple[str, str]:
        why = f" ({self.why})" if self.why else ""
        if self.when is not None:  # the rule of some values of flag: name the value
            return f"{flag} {value} needs {self.condition()}{why}", f"add {self.condition()}"
        return (f"{flag} applies only with {self.condition()}{why}",
                f"add {self.condition()}, or drop {flag}")


@dataclass(frozen=True)
class Excludes:
    """``flag`` and ``partner`` may not be given together; ``why`` says why (shown in brackets)."""

    flag: str
    partner: str
    why: str = ""
    when: Callable[[Any], bool] | None = None
    shown: str = ""

    def holds(self, value: Any) -> bool:
        return not _is_set(value)

    def problem(self, flag: str, value: Any) -> tuple[str, str]:
        why = f" ({self.why})" if self.why else ""
        return (f"{flag} cannot be combined with {self.shown or self.partner}{why}",
                f"drop {flag} or {self.shown or self.partner}")


Rule = Needs | Excludes

_QA = ("qa", "squad")

#: command (as typed: "compress prune") -> its flag dependencies. tests/test_flag_rules.py tries every one.
RULES: dict[str, tuple[Rule, ...]] = {
    "tokenizer train": (
        Needs("--num-merges", "--algo", ("bpe",)),
        Excludes("--num-merges", "--vocab-size", "--num-merges sets the vocabulary size"),
        Needs("--score", "--algo", ("wordpiece",)),
        Needs("--lowercase", "--algo", ("wordpiece",), why="the other algorithms keep the case"),
    ),
    "export": (
        Needs("--base", "--format", ("peft",)),
        Needs("--format", "--base", when=lambda v: v == "peft", shown="--base DIR",
              why="--format peft writes the pretrained checkpoint the fine-tune started from"),
    ),
    "finetune": (
        Needs("--select-fraction", "--select-on", ("train-slice",)),
        Needs("--lr-sweep", "--lr", ("auto",)),
        Needs("--doc-stride", "--task", _QA, why="context windows of extractive QA"),
        Needs("--max-answer-length", "--task", _QA, why="answer spans of extractive QA"),
        Needs("--max-bad-fraction", "--on-bad-line", ("skip",)),
        Needs("--delimiter", "--format", ("csv", None), shown="--format csv (or .csv files)"),
        Needs("--rouge-stemmer", "--task", ("text2text",)),
        Needs("--packing/--no-packing", "--task", ("instruct",)),
        Needs("--template", "--task", ("instruct",)),
    ),
    "align": (
        *(Needs(flag, "--method", ("rlhf",), why="a setting of RLHF")
          for flag in ("--sft-steps", "--reward-steps", "--reward-lr", "--samples", "--max-new-tokens",
                       "--temperature")),
        *(Needs(flag, "--method", ("dpo",), why="a setting of DPO's loss") for flag in ("--loss",
                                                                                    "--label-smoothing")),
    ),
    "evaluate": (
        Needs("--max-bad-fraction", "--on-bad-line", ("skip",)),
        Needs("--delimiter", "--format", ("csv", None), shown="--format csv (or .csv files)"),
        *(Needs(flag, "--harness", why="it sets how harness tasks are scored")
          for flag in ("--num-fewshot", "--out", "--overwrite", "--log-samples", "--seed", "--allow-code")),
        *(Excludes(flag, "--harness", "--harness scores harness tasks, not a data file of a task or variant")
          for flag in ("--data", "--task", "--variant")),
    ),
    "generate": (
        Needs("--grammar-backend", "--json-schema", shown="--json-schema FILE",
              why="it chooses the engine of --json-schema decoding"),
        Excludes("--stop", "--json-schema", "--json-schema ends each output when its document is complete"),
        Needs("--variant", "--prompts", why="the variants continue the prompts of --prompts FILE"),
        Needs("--prompts", "--variant", why="each line names its --variant"),
        *(Excludes(flag, "--variant", "--variant reads its prompts from --prompts")
          for flag in ("--prompt", "--json-schema", "--tokenizer")),
    ),
    "compress distill": (
        Needs("--student-layers", "--init", ("teacher",), why="the teacher layers copied into the student; "
              "a fresh student takes --layers N"),
        Excludes("--layers", "--student-layers", "--student-layers sets the number of layers"),
    ),
    "compress prune": (
        Needs("--train", "--steps", lambda v: isinstance(v, int) and v > 0, shown="--steps N above 0",
              why="it is read only to fine-tune after pruning"),
        Needs("--steps", "--train", when=lambda v: v > 0, why="fine-tuning after pruning reads it"),
        Needs("--steps", "--dev", when=lambda v: v > 0, why="fine-tuning after pruning chooses on it"),
    ),
}


def _dest(flag: str, actions: dict[str, argparse.Action]) -> str:
    return actions[flag.split("/")[0]].dest


def command_actions(parser: argparse.ArgumentParser, args: argparse.Namespace
                    ) -> tuple[str, dict[str, argparse.Action]]:
    """The command ``args`` chose, as typed (``"compress prune"``), and its options by flag."""
    words: list[str] = []
    actions: dict[str, argparse.Action] = {}
    while parser is not None:
        chosen = None
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                name = getattr(args, action.dest, None)
                chosen = action.choices.get(name or "")
                if chosen is not None:
                    words.append(name)
            for flag in action.option_strings:
                actions[flag] = action
        parser = chosen
    return " ".join(words), actions


def check_flag_rules(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse, in one line naming both flags, a flag given without the partner it needs, or with
    one it excludes (:data:`RULES`). A command whose flags mirror a settings section names it with
    ``args.rule_settings(args)`` -> ``(section, settings given anywhere, defaults)``, so a setting
    from ``--config``/``--set`` counts as given, and a partner's value is the one the run will use."""
    command, actions = command_actions(parser, args)
    rules = RULES.get(command, ())
    if not rules:
        return
    on_line = set(getattr(args, GIVEN, ()))
    hook = getattr(args, "rule_settings", None)
    section, settings, defaults = hook(args) if callable(hook) else ("", {}, {})

    def given(flag: str) -> tuple[bool, str]:
        dest = _dest(flag, actions)
        if dest in on_line:
            return True, flag
        key = {"template_file": "template"}.get(dest, dest)
        return key in settings, f"{section}.{key}"

    def value(flag: str) -> Any:
        dest = _dest(flag, actions)
        key = {"template_file": "template"}.get(dest, dest)
        if key in settings:
            return settings[key]
        if hasattr(args, dest):
            return getattr(args, dest)
        return defaults.get(key)

    for rule in rules:
        is_given, shown = given(rule.flag)
        if not is_given or (rule.when is not None and not rule.when(value(rule.flag))):
            continue
        if not rule.holds(value(rule.partner)):
            raise LmlabError(*rule.problem(shown, value(rule.flag)))

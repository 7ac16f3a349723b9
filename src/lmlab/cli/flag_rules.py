"""Which flags go together: one declarative table, checked for every command right after parsing.

A flag that only means something with another (``--base`` with ``--format peft``) used to be
ignored in silence when given alone, or refused by a check of the command's own, each worded its
own way. Every such dependency is a row of :data:`RULES` instead, and :func:`check_flag_rules`
(called by :func:`lmlab.cli.main` before anything else) refuses a flag given without its partner
in one line naming both: ``error: --base applies only with --format peft; add --format peft, or
drop --base``.

The settings of fine-tuning (``lmlab finetune``'s flags, ``[finetune]``, a grid's fine-tuning, the
keywords of ``lmlab.finetune``) have their rules in their section, by field name
(:data:`lmlab.config.finetune.RULES`, checked by :meth:`lmlab.config.FinetuneConfig.validate`);
``lmlab evaluate``'s data flags take theirs from there (:func:`section_rules`).

Only what the user gave counts: a flag on the command line (the parser records which, see
:class:`lmlab.cli.Parser`; a default never triggers a rule), or, for a command that reads a
settings section (``lmlab align``'s ``[align]``, from ``--config`` and ``--set`` too), a
setting given there. A partner's value is what the command will use: given, or its default.

* :class:`Needs`: ``flag`` applies only when ``partner`` is set (``values`` None) or has one of
  ``values``; ``when`` limits the rule to some values of ``flag`` (``--steps`` above 0).
* :class:`Excludes`: ``flag`` and ``partner`` may not both be given (one overrides the other).

A rule that needs the files' contents or the checkpoint (a ``.tsv`` file with ``--delimiter``, a
decoder's ``--lm-weight``: :data:`lmlab.config.finetune.ARCHITECTURE_RULES`) is checked where they
are read.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from lmlab.config.finetune import RULES as FINETUNE_RULES
from lmlab.config.flags import setting_origin
from lmlab.config.rules import Excludes, Needs, Rule, SettingNames
from lmlab.errors import LmlabError

#: the namespace attribute where :class:`lmlab.cli.Parser` records the dests given on the command line
GIVEN = "_given_dests"


def section_rules(rules, fields) -> tuple[Rule, ...]:
    """A section's rules (by field name, :mod:`lmlab.config.rules`) of ``fields``, in its flags' words:
    a command that reads those settings as flags (``lmlab evaluate``) states no rule of its own."""
    names = SettingNames("flag")
    return tuple(dataclasses.replace(r, flag=names.to_set(r.flag), partner=names.to_set(r.partner))
                 for r in rules if r.flag in fields)

def _holds_records(inputs) -> bool:
    """Whether one of ``--input``'s paths is a file of records (:func:`lmlab.data.records.is_record_file`)."""
    from lmlab.data.records import is_record_file

    return any(is_record_file(p) for p in inputs or ())


def _holds_text(inputs) -> bool:
    """Whether one of ``--input``'s paths is a text file (not a file or folder of records)."""
    from lmlab.data.records import is_record_file

    return any(not is_record_file(p) for p in inputs or ())


def _above(n: int):
    """A partner's condition: a whole number above ``n`` (``--steps N above 0``)."""
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v > n


#: what only scoring --dev reads (every compress command's "common" flags)
_EVAL_RULES = (
    Needs("--max-eval-examples", "--dev", shown="--dev FILE", why="it limits the dev examples scored"),
    Needs("--eval-batch-size", "--dev", shown="--dev FILE", why="it batches the scoring of --dev"),
)


#: ``lmlab evaluate``'s flags that say how its --data file is read (its "data files" group,
#: lmlab.cli.finetune.add_data_arguments; tests/test_flag_rules.py checks that every one is here)
EVALUATE_DATA_FLAGS = (
    "--format", "--header/--no-header", "--delimiter", "--on-bad-line", "--max-bad-fraction",
    *(f"--{role}-field" for role in ("text", "text-pair", "label", "tokens", "tags", "question", "context",
                                     "answer", "answer-start")))


#: command (as typed: "compress prune") -> its flag dependencies. tests/test_flag_rules.py tries every one.
RULES: dict[str, tuple[Rule, ...]] = {
    "tokenizer train": (
        Needs("--num-merges", "--algo", ("bpe",)),
        Excludes("--num-merges", "--vocab-size", "--num-merges sets the vocabulary size"),
        Needs("--score", "--algo", ("wordpiece",)),
        Needs("--lowercase", "--algo", ("wordpiece",), why="the other algorithms keep the case"),
    ),
    "export": (
        # --format peft without --base: asked by the export itself, once the input is known to be a
        # fine-tune peft can hold (lmlab.cli.export._export_peft: what the input is comes first)
        Needs("--base", "--format", ("peft",)),
    ),
    "align": (
        *(Needs(flag, "--method", ("rlhf",), why="a setting of RLHF")
          for flag in ("--sft-steps", "--reward-steps", "--reward-lr", "--samples", "--max-new-tokens",
                       "--temperature")),
        *(Needs(flag, "--method", ("dpo",), why="a setting of DPO's loss") for flag in ("--loss",
                                                                                    "--label-smoothing")),
        Needs("--save-every", "--method", ("dpo",), why="it writes DPO's resume state; RLHF saves none"),
        Needs("--label-smoothing", "--loss", ("sigmoid",), why="the IPO loss has no label smoothing"),
    ),
    "evaluate": (
        *(Needs(flag, "--harness", why="it sets how harness tasks are scored")
          for flag in ("--num-fewshot", "--out", "--overwrite", "--log-samples", "--seed", "--allow-code")),
        *(Excludes(flag, "--harness", "--harness scores harness tasks, not a data file of a task or variant")
          for flag in ("--data", "--task", "--variant")),
        # what only a data file's scoring reads: refused with --harness (and alone), never ignored
        Needs("--predictions", "--data", shown="--data FILE", why="it writes each example's prediction "
              "on the data file; --harness writes its results to --out"),
        *(Needs(flag, "--data", shown="--data FILE", why="it says how the data file is read")
          for flag in EVALUATE_DATA_FLAGS),
        *section_rules(FINETUNE_RULES, ("max_bad_fraction", "delimiter")),  # read as fine-tuning reads
    ),
    "generate": (
        Needs("--grammar-backend", "--json-schema", shown="--json-schema FILE",
              why="it chooses the engine of --json-schema decoding"),
        Excludes("--stop", "--json-schema", "--json-schema ends each output when its document is complete"),
        Needs("--variant", "--prompts", why="the variants continue the prompts of --prompts FILE"),
        Needs("--prompts", "--variant", why="each line names its --variant"),
        *(Excludes(flag, "--variant", "--variant reads its prompts from --prompts")
          for flag in ("--prompt", "--json-schema", "--tokenizer")),
        # what only some decoding modes read
        Needs("--length-penalty", "--num-beams", _above(1), shown="--num-beams B above 1",
              why="it scores finished beams"),
        Needs("--seed", "--num-beams", (1,), shown="--num-beams 1",
              why="it seeds sampling; beam search draws nothing"),
        Needs("--seed", "--temperature", lambda t: t is None or t > 0, shown="a --temperature above 0",
              why="it seeds sampling; --temperature 0 is greedy decoding"),
        # --prompts FILE: each row's prompt as written, printed as JSON lines
        Excludes("--instruction", "--prompts", "each row of --prompts is the prompt as written"),
        Excludes("--format", "--prompts", "--prompts prints JSON lines", when=lambda v: v == "text"),
    ),
    "data prepare": (
        # the field of a record: told from the inputs' extensions (a datasets folder by its files)
        Needs("--text-field", "--input", _holds_records,
              shown="--input records (.jsonl, .parquet or a datasets folder)",
              why="it names each record's text field; a text file has none"),
        Needs("--doc-separator", "--input", _holds_text, shown="--input text files",
              why="it cuts a text file into documents; each record is one document"),
        Needs("--encoding", "--input", _holds_text, shown="--input text files",
              why="it decodes text files; JSON Lines are read as UTF-8, Parquet and datasets folders "
                  "hold no text encoding"),
        Needs("--seed", "--val-fraction", lambda f: f is not None and f > 0, shown="--val-fraction F above 0",
              why="it seeds the hash that sends documents to val; with no val every one is train"),
    ),
    "compress distill": (
        Needs("--student-layers", "--init", ("teacher",), why="the teacher layers copied into the student; "
              "a fresh student takes --layers N"),
        Excludes("--layers", "--student-layers", "--student-layers sets the number of layers"),
        Needs("--temperature", "--alpha", lambda a: a is not None and a > 0, shown="--alpha A above 0",
              why="it softens the soft targets, whose weight is --alpha; --alpha 0 is ordinary training"),
        *_EVAL_RULES,
    ),
    "compress quantize": _EVAL_RULES,
    "compress prune": (
        *(Needs(flag, "--steps", _above(0), shown="--steps N above 0",
                why="it is read only to fine-tune after pruning")
          for flag in ("--train", "--lr", "--batch-size", "--seed", "--max-train-examples")),
        Needs("--steps", "--train", when=lambda v: v > 0, why="fine-tuning after pruning reads it"),
        Needs("--steps", "--dev", when=lambda v: v > 0, why="fine-tuning after pruning chooses on it"),
        *_EVAL_RULES,
    ),
    "scale fit": (
        Needs("--seed", "--bootstrap", _above(0), shown="--bootstrap B above 0",
              why="it seeds the bootstrap resampling"),
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

    origin = setting_origin(section, args)

    def given(flag: str) -> tuple[bool, str, str]:
        """Whether ``flag``'s setting was given, its name in a message, and where it was written
        (``FILE:LINE: `` before the message for a ``--config`` value; a ``--set`` is its name)."""
        dest = _dest(flag, actions)
        if dest in on_line:
            return True, flag, ""
        if dest not in settings:  # not given: nothing to name (and no file to read for its line)
            return False, flag, ""
        key = f"{section}.{dest}"
        written = origin.of(key)
        if written.endswith(f": {key}"):  # FILE:LINE: key
            return True, key, written[:-len(key)]
        return True, written, ""

    def value(flag: str) -> Any:
        dest = _dest(flag, actions)
        if dest in settings:
            return settings[dest]
        if hasattr(args, dest):
            return getattr(args, dest)
        return defaults.get(dest)

    for rule in rules:
        is_given, shown, place = given(rule.flag)
        if not is_given or (rule.when is not None and not rule.when(value(rule.flag))):
            continue
        if rule.broken(value):
            problem, fix = rule.problem(shown, value(rule.flag), partner=value(rule.partner))
            raise LmlabError(place + problem, fix)

"""Preference pairs made from a labelled classification task: the right answer is preferred.

Each example becomes a prompt that asks for its label and, for every wrong label, one pair whose
chosen response is the right label word and whose rejected response the wrong one::

    Review: it 's a charming and often affecting journey .
    Sentiment:                       chosen " positive", rejected " negative"

The files are read as fine-tuning reads them (:func:`lmlab.tasks.make_task`), so the same GLUE
TSV files serve both. The prompts are plain-text questions a language model can continue; the
label words start with a space, as they would in running text.
"""

from __future__ import annotations

import os

from lmlab.align.pairs import PreferencePair
from lmlab.errors import LmlabError
from lmlab.tasks.readers import BadLines

#: task -> (prompt with {text} and {pair}, label -> the response that answers it)
TEMPLATES: dict[str, tuple[str, dict[str, str]]] = {
    "sst2": ("Review: {text}\nSentiment:", {"1": " positive", "0": " negative"}),
    "cola": ("Sentence: {text}\nGrammatical:", {"1": " yes", "0": " no"}),
    "rte": ("{text}\nQuestion: {pair} True or False?\nAnswer:",
            {"entailment": " True", "not_entailment": " False"}),
    "mrpc": ("Sentence 1: {text}\nSentence 2: {pair}\nSame meaning:", {"1": " yes", "0": " no"}),
}


#: the data-reading flags of `lmlab finetune` that task files' errors may suggest
COLUMN_FLAGS = ("-field", "--header", "--no-header", "--format", "--delimiter")


def task_pairs(task: str, path: str | os.PathLike,
               on_bad_line: str | BadLines = "error") -> list[PreferencePair]:
    """The preference pairs of a labelled ``task`` file (``sst2``, ``cola``, ``rte``, ``mrpc``)."""
    from lmlab.tasks import make_task

    if task not in TEMPLATES:
        raise LmlabError(f"cannot make preference pairs from task {task!r}",
                         f"choose one of: {', '.join(TEMPLATES)}, or write the pairs as JSON Lines")
    template, words = TEMPLATES[task]
    try:
        examples = make_task(task, "decoder").read(path, on_bad_line)
    except LmlabError as e:
        if e.fix and any(flag in e.fix for flag in COLUMN_FLAGS):  # flags `lmlab align` does not have
            raise LmlabError(e.problem, f"pass {task}'s own file (a GLUE TSV, or CSV/JSON Lines with its "
                             "usual column names), or write the pairs as JSON Lines without --task") from None
        raise
    out = []
    for e in examples:
        label = str(e.label)
        if label not in words:
            raise LmlabError(f"{e.where}: label {e.label!r} is not one of {task}'s labels "
                             f"({', '.join(words)})",
                             "fix the label or choose the matching --task")
        prompt = template.replace("{text}", e.text).replace("{pair}", e.pair or "")
        out += [PreferencePair(prompt, words[label], word, e.where)
                for lab, word in words.items() if lab != label]
    return out

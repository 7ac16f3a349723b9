"""Fine-tuning tasks: how examples become model inputs, which head reads them, which metrics judge.

>>> from lmlab.tasks import make_task
>>> task = make_task("sst2", "encoder")        # [CLS] classification, accuracy
>>> task = make_task("rte", "decoder")         # GPT-style [START] a [DELIM] b [EXTRACT]
>>> task = make_task("sst2", "seq2seq")        # "sst2 sentence: ..." -> "positive"
>>> task = make_task("classification", fields={"text": 1, "label": 0})   # your own file, any labels

``TASKS`` maps a task name to the class that reads and scores it. The model's architecture picks
the formulation: encoders use the task's own head, decoders classify GPT-style
(:mod:`lmlab.tasks.decoder_cls`), encoder-decoders pose the task as text-to-text
(:mod:`lmlab.tasks.text2text`). Adding a task is one class plus one line in ``TASKS``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lmlab.errors import LmlabError, a_or_an
from lmlab.tasks.base import Task, TaskOptions, attach_head, check_tokenizer, collate
from lmlab.tasks.classification import SST2, Classification, CoLA, SequenceClassification
from lmlab.tasks.decoder_cls import DecoderClassification
from lmlab.tasks.instruct import Instruct
from lmlab.tasks.ner import CoNLL, TokenClassification
from lmlab.tasks.pairs import MRPC, RTE, PairClassification
from lmlab.tasks.qa import Squad, SquadQA
from lmlab.tasks.readers import BadLines, Example
from lmlab.tasks.regression import STSB, Regression
from lmlab.tasks.text2text import Text2Text

#: task name -> class (None: only as text-to-text with an encoder-decoder). The generic tasks read
#: your own files (TSV, CSV, JSON Lines, Parquet; columns chosen by name or index, any labels); the
#: GLUE, SQuAD and CoNLL names are presets over them (their files' layouts, fixed label sets).
TASKS: dict[str, type[Task] | None] = {
    "classification": Classification,
    "pair-classification": PairClassification,
    "regression": Regression,
    "tagging": TokenClassification,
    "qa": SquadQA,
    "sst2": SST2,
    "cola": CoLA,
    "rte": RTE,
    "mrpc": MRPC,
    "stsb": STSB,
    "squad": Squad,
    "conll": CoNLL,
    "text2text": None,
    "instruct": Instruct,
}

ARCHITECTURES = ("encoder", "decoder", "seq2seq")

__all__ = ["ARCHITECTURES", "TASKS", "BadLines", "Example", "Task", "TaskOptions", "attach_head",
           "check_fields", "check_tokenizer", "collate", "load_task", "make_task"]


def check_fields(name: str, fields: dict[str, Any] | None) -> None:
    """Every column chosen in ``fields`` (``--ROLE-field``, role -> column) must be one task ``name``
    reads: a flag the task would ignore is refused, not silently dropped. The one check of the data
    flags against a task, for ``lmlab finetune`` (before the model is loaded), ``lmlab evaluate``
    (its overrides, :func:`lmlab.finetune.scoring.reread`) and every task built (:func:`make_task`)."""
    chosen = sorted(k for k, v in (fields or {}).items() if v is not None)
    if not chosen or name not in TASKS:
        return
    cls = TASKS[name]
    roles = cls.roles if cls is not None else ()
    unread = [r for r in chosen if r not in roles]
    if unread:
        flag = f"--{unread[0].replace('_', '-')}-field"
        reads = (f"it reads the {', '.join(roles)} columns" if roles
                 else "it reads its own file layout, no chosen columns")
        raise LmlabError(f"{flag} is not read by task {name} ({reads})", f"drop {flag}")


def make_task(name: str, architecture: str = "encoder", **options: Any) -> Task:
    """The task ``name`` formulated for a model of ``architecture``.

    ``options``: :class:`TaskOptions` fields (``max_length``, ``doc_stride``, ``lm_weight``,
    ``decoder_style``...); None values keep the task's defaults.
    """
    if name not in TASKS:
        raise LmlabError(f"unknown task {name!r}", f"choose one of: {', '.join(TASKS)}")
    cls = TASKS[name]
    defaults = dict(cls.defaults) if cls else {}
    given = {k: v for k, v in options.items() if v is not None}
    fields = {f.name for f in dataclasses.fields(TaskOptions)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise LmlabError(f"unknown task options {unknown}", f"use some of: {', '.join(sorted(fields))}")
    opts = TaskOptions(**{**defaults, **given}).validate()
    check_fields(name, opts.fields)
    if cls is Instruct:   # one formulation for decoders and encoder-decoders alike
        return Instruct(options=opts, architecture=architecture)
    if architecture == "seq2seq":
        if cls is not None and issubclass(cls, TokenClassification):
            raise LmlabError(f"{name} (token classification) is not offered as text-to-text",
                             f"fine-tune an encoder checkpoint for {name}")
        return Text2Text(None if cls is None else cls(options=opts), opts)
    if cls is None:
        raise LmlabError(f"task {name!r} is generation and needs an encoder-decoder, "
                         f"not {a_or_an(architecture)}",
                         "use a T5 or BART checkpoint")
    if architecture == "encoder":
        return cls(options=opts)
    if architecture == "decoder":
        if not issubclass(cls, SequenceClassification):
            raise LmlabError(f"task {name!r} is not offered for decoder-only models",
                             "use an encoder (or an encoder-decoder) checkpoint; decoders do sentence "
                             "(pair) classification and regression")
        return DecoderClassification(cls(options=opts), opts)
    raise LmlabError(f"cannot fine-tune a {architecture!r} model on task {name!r}",
                     f"use a checkpoint whose architecture is one of {', '.join(ARCHITECTURES)}")


def load_task(state: dict[str, Any]) -> Task:
    """Rebuild a task from :meth:`Task.state` (the ``task.json`` of a fine-tuned checkpoint)."""
    if not isinstance(state, dict) or "task" not in state:
        raise LmlabError("task.json is not a task description", "fine-tune the checkpoint again")
    options = dict(state.get("options") or {})
    cls = TASKS.get(state["task"])
    if isinstance(options.get("fields"), dict):  # a task.json written before columns were checked
        options["fields"] = {k: v for k, v in options["fields"].items() if cls and k in cls.roles}
    task = make_task(state["task"], state.get("architecture", "encoder"), **options)
    task.load_state(state)
    return task

"""Scoring a fine-tuned model: ``evaluate(checkpoint, data)`` (``lmlab evaluate``), the same metrics
as the run's ``eval.json``, with what it scores said up front, progress over the batches and a
one-line summary; ``--predictions`` written as one JSON line per example."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab import ownership, values
from lmlab.arguments import callable_argument, number_argument, path_argument
from lmlab.errors import LmlabError
from lmlab.fileio import read_json, write_output_file
from lmlab.finetune.methods import method_class
from lmlab.progress import LINES_PER_RUN, Progress
from lmlab.runtime import check_device, pick_device
from lmlab.tasks import Task, check_tokenizer, load_task
from lmlab.tasks.baseline import at_baseline_text, baseline_record, baseline_text, trivial_baseline
from lmlab.tasks.readers import BadLines, Example, limit
from lmlab.train.estimate import duration

TASK_FILE = "task.json"
SUMMARY_FILE = "finetune.json"


def read_examples(task: Task, data, what: str, bad: BadLines) -> list[Example]:
    if isinstance(data, (str, os.PathLike)):
        return task.read(data, bad)
    if isinstance(data, Sequence) and all(isinstance(e, Example) for e in data):
        return list(data)
    raise LmlabError(f"{what} must be a file path or a list of Examples", "pass e.g. glue/sst2/train.tsv")


def finetuned_task(checkpoint: str | os.PathLike) -> Task:
    """The task saved with a fine-tuned checkpoint (its ``task.json``), without loading the model."""
    d = Path(checkpoint)
    if not d.is_dir():
        raise LmlabError(f"checkpoint {d} does not exist", "pass a directory written by `lmlab finetune`")
    if not (d / TASK_FILE).is_file():
        raise LmlabError(f"{d} is not a fine-tuned checkpoint (no {TASK_FILE})",
                         "fine-tune it first with `lmlab finetune ... --out DIR`")
    return load_task(read_json(d / TASK_FILE, "task file"))


def load_finetuned(checkpoint: str | os.PathLike) -> tuple[nn.Module, Task]:
    """A fine-tuned model and its task, from a directory written by :func:`finetune`."""
    d = path_argument(checkpoint, "load_finetuned's checkpoint")
    task = finetuned_task(d)
    method = "full"
    if (d / SUMMARY_FILE).is_file():
        method = read_json(d / SUMMARY_FILE, "fine-tuning summary").get("method", "full")
    model = method_class(method).load(d)
    check_tokenizer(model)
    return model, task


def evaluate(checkpoint: str | os.PathLike, data, task: str | None = None, *, on_bad_line: str = "error",
             max_bad_fraction: float = 0.01, batch_size: int = 64, max_examples: int | None = None,
             device: str = "auto", predictions: str | os.PathLike | None = None,
             log: Callable[[str], None] | None = None, progress: bool = True, with_baseline: bool = False,
             **reading) -> dict[str, Any]:
    """Score a fine-tuned checkpoint on ``data``; the same metrics as its ``eval.json``.

    The task's trivial baseline on the same examples (:mod:`lmlab.tasks.baseline`: the majority
    class of those examples, no model) is said beside the scores, with a warning when the model's
    score is at (or below) it; ``with_baseline`` also returns it under the key ``"baseline"``
    (``{"answer", "metrics", "metric", "at_baseline"}``, None for a task without one: tags, spans).

    The data is read as the training files were (format, header, columns and label set saved in
    ``task.json``); ``reading`` (``format``, ``header``, ``delimiter``, ``fields``) overrides that
    for a file laid out differently. ``predictions``: also write one JSON line per example,
    ``{"where", "prediction", "label"}``, labels as their names.

    ``log`` (default: stderr) hears what will be scored, the progress over the batches (a bar on a
    terminal, a line every ~5% otherwise; none with ``progress=False``) and a one-line summary.
    """
    checkpoint = path_argument(checkpoint, "evaluate's checkpoint")
    if isinstance(data, (str, bytes)) or not isinstance(data, Sequence):  # a list of Examples is read below
        data = path_argument(data, "evaluate's data (a file or a list of examples)")
    if log is not None:
        callable_argument(log, "evaluate's log")
    number_argument(values.BatchSize, batch_size, "evaluate's batch_size")
    check_device(device)  # before the model is loaded
    if predictions is not None:
        check_predictions_file(predictions, {"--data": data, "--checkpoint": checkpoint})
    saved = finetuned_task(checkpoint)
    if task is not None and task != saved.name:
        raise LmlabError(f"{checkpoint} was fine-tuned for task {saved.name!r}, not {task!r}",
                         f"pass --task {saved.name} or another checkpoint")
    reread(saved, **reading)  # the reading flags are checked against the task before the model loads
    model, _ = load_finetuned(checkpoint)
    model.to(pick_device(device))
    bad = BadLines(on_bad_line, log, max_bad_fraction)
    examples = limit(read_examples(saved, data, "data", bad), max_examples)
    saved.check(examples, "data")
    say = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    select = _selected_metric(checkpoint, saved)
    preds, metrics, baseline = _score_and_report(saved, model, examples, batch_size, say, progress, select)
    if predictions is not None:
        rows = [{"where": e.where, "prediction": p, "label": e.label} for p, e in zip(preds, examples)]
        write_output_file(predictions, "".join(json.dumps(r) + "\n" for r in rows), PREDICTIONS_KIND,
                          "--predictions")
    if with_baseline:
        return {**metrics, "baseline": baseline}
    return metrics


PREDICTIONS_KIND = "predictions"


def _selected_metric(checkpoint: Path, task: Task) -> str:
    """The metric a score is judged on: the one the checkpoint's fine-tuning selected on (its
    ``finetune.json``), else the task's main metric."""
    chosen = None
    if (checkpoint / SUMMARY_FILE).is_file():
        with contextlib.suppress(LmlabError):
            chosen = read_json(checkpoint / SUMMARY_FILE, "fine-tuning summary").get("select_metric")
    return chosen if isinstance(chosen, str) and chosen else task.main_metric


def _score_and_report(task: Task, model: nn.Module, examples: list[Example], batch_size: int,
                      say: Callable[[str], None], progress: bool,
                      select: str) -> tuple[list, dict[str, float], dict[str, Any] | None]:
    """``task.predict_and_score``, saying first what it scores, then its progress, then the result
    beside the task's trivial baseline on these examples (flagged when the score is at it); returns
    the predictions, the metrics and the baseline's record (:func:`lmlab.tasks.baseline.baseline_record`)."""
    n_batches = math.ceil(len(examples) / batch_size)
    on = next(model.parameters()).device
    threads = f" ({torch.get_num_threads()} thread(s))" if on.type == "cpu" else ""
    say(f"evaluate: {len(examples):,} examples of task {task.name} in {n_batches:,} batch(es) of "
        f"{batch_size}, device {on}{threads}")
    start = time.perf_counter()
    bar = Progress(n_batches, desc=f"evaluate {task.name}", show="auto" if progress else "off", log=say,
                   unit="batch")
    with _predicting_in_chunks(task, bar, batch_size):
        preds, metrics = task.predict_and_score(model, examples, batch_size)
    elapsed = time.perf_counter() - start
    baseline = trivial_baseline(task, examples)
    say(f"evaluated {len(examples):,} examples in {duration(elapsed)} "
        f"({len(examples) / max(elapsed, 1e-9):,.1f} examples/s): "
        + ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        + ("" if baseline is None else f"; {baseline_text(baseline)}"))
    flagged = at_baseline_text(metrics, baseline, select)
    if flagged:
        say(f"warning: {flagged}: the model does no better on these examples than that answer without a "
            "model; check that it was fine-tuned long enough and on labels like these")
    record = baseline_record(baseline, select)
    if record is not None:
        record["at_baseline"] = flagged is not None
    return preds, metrics, record


@contextlib.contextmanager
def _predicting_in_chunks(task: Task, progress: Progress, batch_size: int):
    """While inside, ``task.predict`` works through its examples a few batches at a time and moves
    ``progress`` (counted in batches) after each chunk; the predictions are the same.

    The task's own ``predict`` sorts what it is given by length before batching; here the
    examples are first sorted by a rough length (their characters), so each chunk's batches still
    hold similar lengths. A chunk is ~5% of the batches (those between two progress lines).
    """
    predict = task.predict
    batches = math.ceil(progress.total / LINES_PER_RUN)
    chunk = max(1, batches) * batch_size

    def predict_by_chunks(model, examples, size=batch_size):
        examples = list(examples)
        order = sorted(range(len(examples)), key=lambda i: _rough_length(examples[i]))
        out: list[Any] = [None] * len(examples)
        for k in range(0, len(order), chunk):
            idx = order[k:k + chunk]
            for i, p in zip(idx, predict(model, [examples[i] for i in idx], size)):
                out[i] = p
            progress.update(min(progress.total, math.ceil((k + len(idx)) / size)))
        return out

    task.predict = predict_by_chunks
    try:
        yield
    finally:
        del task.predict  # the class's own again
        progress.close()


def _rough_length(example: Example) -> int:
    """The characters of an example's input texts (its question, context...)."""
    texts = [example.text, example.pair or "", *(v for v in example.extra.values() if isinstance(v, str))]
    return sum(len(t) for t in texts)


def check_predictions_file(path: str | os.PathLike, inputs: dict[str, object]) -> None:
    """Before any work: ``path`` may receive predictions unless that would lose a file: it is one
    of the inputs (or inside one), or it exists and lmlab did not write it there as predictions
    (:mod:`lmlab.ownership`: the folder's manifest records every predictions file lmlab wrote)."""
    p = Path(path)
    ownership.check_output_spares_inputs(p, inputs, "--predictions")
    if p.is_dir():
        raise LmlabError(f"--predictions {p} is a directory", "name a file, e.g. dev.predictions.jsonl")
    ownership.check_replaceable_file(path, PREDICTIONS_KIND, "--predictions")  # as given: a trailing /


def reread(task: Task, format: str | None = None, header: bool | None = None, delimiter: str | None = None,
           fields: dict[str, str | int] | None = None) -> None:
    """Read the next files of ``task`` (and of the task it wraps) with other reading settings; a
    column chosen for a role the task does not read is refused (:func:`lmlab.tasks.check_fields`)."""
    from lmlab.tasks import check_fields

    check_fields(task.name, fields)
    changes: dict[str, Any] = {k: v for k, v in (("format", format), ("header", header),
                                                  ("delimiter", delimiter)) if v is not None}
    if fields:
        changes["fields"] = {**task.options.fields, **fields}
    if not changes:
        return
    options = dataclasses.replace(task.options, **changes).validate()
    while task is not None:
        task.options = options
        task = getattr(task, "base", None)

"""Score several fine-tuned variants of one base on one data file in a single pass
(``lmlab evaluate --checkpoint BASE --variant NAME=DIR ...``).

Every variant is an ``lmlab finetune --method lora|prefix|prompt`` output of the same task. The
variants share a :class:`lmlab.adapt.multi.MultiAdapterModel`: each forward carries the batch
once per variant (the rows of variant ``v`` run its own LoRA/prefix/prompt and task head), so the
data is read, tokenised and batched once and the base's weights are streamed once per batch for
all variants. The task's own prediction code runs unchanged for each variant: the first
variant's calls compute every variant's outputs, which the others then replay in the same order.
The metrics equal those of ``lmlab evaluate`` on each variant alone (the outputs agree to float
rounding).
"""

from __future__ import annotations

import json
import os
from collections import deque
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmlab.errors import LmlabError
from lmlab.fileio import read_json, write_output_file
from lmlab.finetune.loop import (
    PREDICTIONS_KIND,
    TASK_FILE,
    _read,
    check_predictions_file,
    reread,
)
from lmlab.models.output import ModelOutput
from lmlab.runtime import check_device, pick_device
from lmlab.tasks import load_task
from lmlab.tasks.readers import BadLines, limit

#: keyword arguments the tasks pass for their losses, which prediction does not need
_LABEL_KEYS = ("labels", "start_positions", "end_positions")


class _VariantView(nn.Module):
    """What a task's ``predict`` sees as variant ``index`` 's model. Variant 0's calls run the
    batch for every variant at once and queue the others' outputs; their views replay them."""

    def __init__(self, multi: nn.Module, index: int, queues: list[deque]):
        super().__init__()
        self.multi, self.index, self._queues = multi, index, queues
        self.config, self.architecture = multi.config, multi.architecture
        self.head_names, self.tokenizer = multi.head_names, multi.tokenizer

    def forward(self, input_ids: torch.Tensor, **kwargs) -> ModelOutput:
        if self.index:
            if not self._queues[self.index]:
                raise LmlabError("internal error: a variant asked for more batches than the first one ran",
                                 "please report it")
            ids, out = self._queues[self.index].popleft()
            if not torch.equal(ids, input_ids):
                raise LmlabError("internal error: the variants' batches came in another order",
                                 "please report it")
            return out
        kwargs = {k: v for k, v in kwargs.items() if k not in _LABEL_KEYS and not k.endswith("_labels")}
        n, b = len(self._queues), input_ids.shape[0]
        wide = {k: torch.cat([v] * n) if isinstance(v, torch.Tensor) and v.shape[:1] == (b,) else v
                for k, v in kwargs.items()}
        variant_ids = torch.arange(n, device=input_ids.device).repeat_interleave(b)
        out = self.multi(torch.cat([input_ids] * n), variant_ids=variant_ids, **wide)
        parts = [_rows(out, slice(v * b, (v + 1) * b)) for v in range(n)]
        for v in range(1, n):
            self._queues[v].append((input_ids, parts[v]))
        return parts[0]


def _rows(out: ModelOutput, rows: slice) -> ModelOutput:
    """The outputs of ``rows`` (logits and the other heads' outputs; no hidden states)."""
    pick = lambda t: t[rows] if isinstance(t, torch.Tensor) else t  # noqa: E731
    return ModelOutput(logits=pick(out.logits), extra={k: pick(v) for k, v in out.extra.items()})


def variant_task(directory: Path, name: str):
    """The task saved with the fine-tuned variant in ``directory``."""
    if not (directory / TASK_FILE).is_file():
        raise LmlabError(f"variant {name!r} ({directory}) is not a fine-tuned checkpoint (no {TASK_FILE})",
                         "pass `lmlab finetune --method lora|prefix|prompt` outputs")
    return load_task(read_json(directory / TASK_FILE, "task file"))


def evaluate_variants(checkpoint: str | os.PathLike, variants: dict[str, str | os.PathLike | None], data,
                      task: str | None = None, *, on_bad_line: str = "error", max_bad_fraction: float = 0.01,
                      batch_size: int = 64, max_examples: int | None = None, device: str = "auto",
                      predictions: str | os.PathLike | None = None, log=None, with_baseline: bool = False,
                      **reading):
    """Metrics ``{variant: {metric: value}}`` of every variant on ``data``, in one pass; with
    ``with_baseline``, ``(metrics, baseline)``: the task's trivial baseline on the same examples
    (:func:`lmlab.tasks.baseline.baseline_record`: ``{"answer", "metrics", "metric"}``, or None).

    ``checkpoint`` is the base the variants were fine-tuned from; ``variants`` maps names to
    ``lmlab finetune`` outputs of one task; ``batch_size`` counts the rows of one forward (all
    variants together). ``predictions``: one JSON line per variant and example,
    ``{"variant", "where", "prediction", "label"}``. The other options are those of
    :func:`lmlab.finetune.evaluate`.
    """
    from lmlab.adapt.multi import MultiAdapterModel
    from lmlab.loading import load_model

    if batch_size < 1:
        raise LmlabError(f"batch size must be at least 1, got {batch_size}", "pass e.g. batch_size=64")
    check_device(device)  # before the variants, the data and the model are read
    if predictions is not None:
        check_predictions_file(predictions, {"--data": data, "--checkpoint": checkpoint,
                                             **{f"--variant {k}": v for k, v in variants.items()}})
    tasks = {}
    for name, d in variants.items():
        if d is None:
            raise LmlabError(f"variant {name!r} is the base model, which has no fine-tuned task to score",
                             "give every --variant a fine-tuned directory (NAME=DIR)")
        tasks[name] = variant_task(Path(d), name)
    first_name, first = next(iter(tasks.items()))
    for name, t in tasks.items():
        differ = sorted(k for k, v in t.state().items() if first.state().get(k) != v)
        if differ:
            raise LmlabError(f"variants {first_name!r} and {name!r} were fine-tuned with different task "
                             f"settings ({', '.join(differ)})",
                             "score variants of one task (same labels and options) together")
    if task is not None and task != first.name:
        raise LmlabError(f"the variants were fine-tuned for task {first.name!r}, not {task!r}",
                         f"pass --task {first.name} or other variants")
    reread(first, **reading)
    bad = BadLines(on_bad_line, log, max_bad_fraction)
    examples = limit(_read(first, data, "data", bad), max_examples)
    first.check(examples, "data")
    multi = MultiAdapterModel(load_model(checkpoint), variants)
    multi.to(pick_device(device))
    names = list(variants)
    queues: list[deque] = [deque() for _ in names]
    per_forward = max(1, batch_size // len(names))
    metrics: dict[str, dict[str, float]] = {}
    rows: list[dict[str, Any]] = []
    for i, name in enumerate(names):
        preds, metrics[name] = first.predict_and_score(_VariantView(multi, i, queues), examples, per_forward)
        rows += [{"variant": name, "where": e.where, "prediction": p, "label": e.label}
                 for p, e in zip(preds, examples)]
    if predictions is not None:
        write_output_file(predictions, "".join(json.dumps(r) + "\n" for r in rows), PREDICTIONS_KIND,
                          "--predictions")
    if with_baseline:
        from lmlab.tasks.baseline import baseline_record, trivial_baseline

        return metrics, baseline_record(trivial_baseline(first, examples), first.main_metric)
    return metrics

"""A task's trivial baseline: the score of an answer that needs no model, shown beside every score.

One home for what ``lmlab finetune``, ``lmlab evaluate --data`` and ``lmlab compress --dev`` say
about it: the answer and its scores on the examples scored (:meth:`lmlab.tasks.Task.baseline`: the
majority class for class labels, the mean for numbers; none for tags, spans and free text), the
words that show it (``baseline (majority class '1', no model): accuracy 0.5092``), the test for a
score at (or below) it (:func:`at_trivial_baseline`, within :data:`MARGIN`) and the words that
flag one (``accuracy 0.5092 is at the trivial baseline (majority class '1': 0.5092)``), and its
JSON record. The report of a grid (:mod:`lmlab.lab.baselines`) flags with the same margin.

A baseline is ``(answer, metrics)``, as :meth:`Task.baseline` returns it, or None.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

#: a score within this of the baseline counts as at the baseline
MARGIN = 0.005

Baseline = tuple[str, dict[str, float]]


def trivial_baseline(task, examples: Sequence, train: Sequence | None = None) -> Baseline | None:
    """The trivial answer of ``task`` and its scores on ``examples``: the answer is taken from
    ``train`` when given (fine-tuning: the training labels' majority class), else from ``examples``
    themselves (scoring a data file: the best constant answer on it). None where the task has none."""
    if not examples:
        return None
    return task.baseline(list(train) if train else list(examples), list(examples))


def baseline_metric(baseline: Baseline | None, select: str | None) -> str | None:
    """The metric a score is judged on: ``select`` when the baseline has it, else None."""
    if baseline is None or not select or select not in baseline[1]:
        return None
    return select


def at_trivial_baseline(metrics: dict[str, float], baseline: Baseline | None, select: str,
                        margin: float = MARGIN) -> bool:
    """True when the ``select`` metric is no better than the trivial answer's (within ``margin``)."""
    if baseline_metric(baseline, select) is None or select not in metrics:
        return False
    return bool(metrics[select] <= baseline[1][select] + margin)


def baseline_text(baseline: Baseline) -> str:
    """``baseline (majority class '1', no model): accuracy 0.5092, matthews_corr 0.0000``."""
    shown = ", ".join(f"{k} {v:.4f}" for k, v in baseline[1].items())
    return f"baseline ({baseline[0]}, no model): {shown}"


def baseline_note(baseline: Baseline | None, select: str) -> str:
    """`` (baseline 0.5092)`` after a ``select`` score ('' when the baseline has no such metric)."""
    if baseline_metric(baseline, select) is None:
        return ""
    return f" (baseline {baseline[1][select]:.4f})"


def at_baseline_text(metrics: dict[str, float], baseline: Baseline | None, select: str) -> str | None:
    """``accuracy 0.5092 is at the trivial baseline (majority class '1': 0.5092)`` when the score is
    at (or below) it; None otherwise. The callers put what was scored before it and a fix after."""
    if not at_trivial_baseline(metrics, baseline, select):
        return None
    return (f"{select} {metrics[select]:.4f} is at the trivial baseline "
            f"({baseline[0]}: {baseline[1][select]:.4f})")


def baseline_record(baseline: Baseline | None, select: str | None = None) -> dict[str, Any] | None:
    """The JSON record: ``{"answer", "metrics", "metric"}`` (``metric``: the one scores are judged
    on, None when the baseline lacks ``select``); the callers add ``at_baseline``. None without one."""
    if baseline is None:
        return None
    return {"answer": baseline[0], "metrics": dict(baseline[1]), "metric": baseline_metric(baseline, select)}

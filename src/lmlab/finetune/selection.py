"""Which data chooses, and which data scores.

A fine-tuning run makes choices from numbers it measures: the epoch (the step) whose weights it
keeps and, with ``lr = "auto"``, the learning rate. If it measures them on the dev file and then
reports the dev file's score, every reported number is a maximum over the candidates of the number
reported: optimistic by about as much as the spread between epochs, often more than the 1-4
points the effects being measured here are worth.

``select_on = "train-slice"`` keeps the dev file out of every choice: a validation slice
(``select_fraction`` of the training examples, at least one, drawn by ``seed``) is carved from the
training file before anything trains; the run trains on the rest only, picks the step and the rate
on the slice, and then scores the chosen model once on the dev file. ``select_on = "dev"`` is the
classic recipe (Devlin et al. 2019 choose on dev and report dev), kept as `lmlab finetune`'s
default; `lmlab compare` selects on the slice.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import TypeVar

from lmlab.errors import LmlabError

#: the data that chooses the epoch and the --lr auto rate
#: the key prefix of the selection scores in metrics.jsonl (``dev_accuracy``, ``slice_accuracy``)
ROW_PREFIX = {"dev": "dev", "train-slice": "slice"}
#: the selection slice draws its examples with this seed offset, so that it is not the same
#: permutation as anything else seeded with the run's seed
SLICE_SALT = 0x5E1EC7

E = TypeVar("E")


def carve_selection(examples: Sequence[E], fraction: float, seed: int) -> tuple[list[E], list[E]]:
    """``(train, slice)``: a random ``fraction`` of ``examples`` (at least one, drawn by ``seed``)
    held out as the validation slice, the rest to train on; both keep the file's order, and no
    example is in both. The same examples, fraction and seed give the same slice."""
    n = len(examples)
    size = max(1, round(fraction * n))
    if n - size < 1:
        raise LmlabError(f"the training data has {n} example(s): too few to hold out a validation slice "
                         f"of {fraction:g} and still train",
                         "use more training examples, or choose on the dev file (--select-on dev)")
    held = set(random.Random(seed ^ SLICE_SALT).sample(range(n), size))
    train = [e for i, e in enumerate(examples) if i not in held]
    chosen = [e for i, e in enumerate(examples) if i in held]
    return train, chosen


def selection_record(select_on: str, fraction: float, examples: int, metric: str,
                     metrics: dict[str, float] | None) -> dict:
    """What ``finetune.json`` says about the choice: the data that chose, its size, the metric and
    the chosen step's scores there (the reported scores, ``dev``, come from the dev file)."""
    return {"data": select_on, "fraction": fraction if select_on == "train-slice" else None,
            "examples": examples, "metric": metric, "scores": metrics, "scored_on": "dev"}

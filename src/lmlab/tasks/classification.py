"""Sentence classification from ``[CLS]`` (BERT; Devlin et al. 2019, fig. 4a/b): SST-2, CoLA.

Input ``[CLS] sentence [SEP]`` (pairs: ``[CLS] a [SEP] b [SEP]`` with segment ids 0/1, see
:mod:`lmlab.tasks.pairs`); the ``seq_cls`` head maps the pooled ``[CLS]`` vector to one score
per class; loss is cross-entropy. Labels are the strings found in the training file, sorted
(``"0"``, ``"1"`` for SST-2), so predictions are written back in the file's own vocabulary.

Metrics: accuracy for every classification task; CoLA adds Matthews correlation (its GLUE
metric, robust to the 70/30 class imbalance).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch

from lmlab.errors import LmlabError
from lmlab.models.encoder import FIRST_TOKEN_HEADS
from lmlab.tasks import metrics as M
from lmlab.tasks.base import (
    Task,
    by_length,
    check_tokenizer,
    collate,
    model_device,
    pad_id_of,
    table_chosen,
    unseen_label_error,
)
from lmlab.tasks.readers import Example, read_glue


class SequenceClassification(Task):
    """Single-sentence classification (``layout = "single"``); subclasses change the layout/metrics."""

    head = "seq_cls"
    layout: ClassVar[str] = "single"
    main_metric = "accuracy"
    extra_metrics: ClassVar[tuple[str, ...]] = ()
    positive_label: ClassVar[str | None] = None
    #: the task's published label set (GLUE); None = learned from the training file
    label_set: ClassVar[tuple[str, ...] | None] = None
    #: a GLUE preset: its own TSV files are read by their GLUE layout (:func:`read_glue`)
    glue_preset: ClassVar[bool] = False
    roles = ("text", "label")

    def read(self, path, on_bad_line="error", warn=None) -> list[Example]:
        if self.glue_preset and not table_chosen(self.options, path):
            return read_glue(path, self.layout, on_bad_line, warn)
        return self.read_table(path, on_bad_line, warn)

    def example(self, values, where, bad) -> Example | None:
        text = text_value(values, "text", where, bad)
        pair = text_value(values, "text_pair", where, bad) if "text_pair" in self.roles else None
        if text is None or (pair is None and self.layout == "pair"):
            return None
        label = self.label_value(values.get("label"), where, bad)
        return None if label is None else Example(text, pair, label, where)

    def label_value(self, value, where: str, bad) -> Any:
        """A label cell as the class name (a string; integers, and floats that are whole, as digits)."""
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str) or not value.strip():
            bad(where, "empty label" if value in (None, "") or isinstance(value, str)
                else f"label {value!r} is a {type(value).__name__}, not a class name")
            return None
        return value.strip()

    def header_probe(self, first, rest) -> bool | None:
        """The first row is a header when its label is no label: not in the known label set (a
        preset's, or training's for dev files) and not found again in the label column (a value that
        recurs is data, a wrong label then reported as such)."""
        label = (first.get("label") or "").strip()
        known = self.labels or self.label_set
        if known and label in known:
            return False
        others = {(r.get("label") or "").strip() for r in rest}
        return None if not others and not known else label not in others

    def fit(self, train: Sequence[Example]) -> None:
        if self.label_set is not None:
            known = set(self.label_set)
            for e in train:
                if str(e.label) not in known:
                    raise LmlabError(f"{e.where}: label {e.label!r} is not one of {self.name}'s labels "
                                     f"{list(self.label_set)}",
                                     f"fix the label, or fine-tune with a task whose labels are {e.label!r}")
        self.labels = sorted({str(e.label) for e in train})
        if len(self.labels) < 2:
            raise one_class_error(train, self.labels)

    def check(self, examples: Sequence[Example], what: str = "dev") -> None:
        known = set(self.labels)
        for e in examples:
            if str(e.label) not in known:
                raise unseen_label_error(e.label, e.where, self.labels)

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        texts = [e.text for e in examples]
        pairs = [e.pair or "" for e in examples] if self.layout != "single" else None
        enc = tokenizer.encode_batch(texts, pairs, padding=False, truncation=True,
                                     max_length=self.options.max_length)
        index = {lab: i for i, lab in enumerate(self.labels)}
        feats = []
        for i, e in enumerate(examples):
            f = {"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                 "token_type_ids": enc["token_type_ids"][i]}
            if e.label is not None and str(e.label) in index:
                f["labels"] = index[str(e.label)]
            feats.append(f)
        return feats

    def model_inputs(self, model, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The batch's model arguments; an encoder whose heads read only ``[CLS]`` also gets
        ``keep=slice(0, 1)``: its last layer is computed at ``[CLS]`` alone (same logits and
        loss, about one layer's work less), in training and evaluation alike."""
        inputs = super().model_inputs(model, batch)
        heads = set(getattr(model, "head_names", ()))
        if getattr(model, "architecture", "") == "encoder" and heads <= set(FIRST_TOKEN_HEADS):
            inputs["keep"] = slice(0, 1)
        return inputs

    def logits(self, model, examples: Sequence[Example], batch_size: int = 64) -> torch.Tensor:
        """Scores ``[N, num_labels]`` of ``examples`` (no labels needed)."""
        tok = check_tokenizer(model)
        feats = self.features([Example(e.text, e.pair) for e in examples], tok)
        pad, dev = pad_id_of(tok, model), model_device(model)
        out = torch.zeros(len(feats), self.num_labels)
        for idx, chunk in by_length(feats, batch_size):
            inputs = self.model_inputs(model, collate(chunk, pad, dev))
            out[idx] = model(**inputs).logits.float().cpu()
        return out

    def predict(self, model, examples, batch_size=64) -> list[str]:
        return [self.labels[i] for i in self.logits(model, examples, batch_size).argmax(-1).tolist()]

    def score(self, predictions, examples) -> dict[str, float]:
        truth = [str(e.label) for e in examples]
        out = {"accuracy": M.accuracy(predictions, truth)}
        if "f1" in self.extra_metrics:
            pos = self.positive_label if self.positive_label in self.labels else self.labels[-1]
            out["f1"] = M.binary_f1(predictions, truth, positive=pos)
        if "matthews_corr" in self.extra_metrics:
            out["matthews_corr"] = M.matthews_corrcoef(predictions, truth)
        return out


def text_value(values: dict[str, Any], role: str, where: str, bad) -> str | None:
    """A text cell, stripped; None (reported to ``bad``) when it is missing, empty or not text."""
    value = values.get(role)
    if isinstance(value, str) and value.strip():
        return value.strip()
    name = role.replace("_", " ")
    bad(where, f"empty {name}" if value is None or isinstance(value, str)
        else f"the {name} is a {type(value).__name__}, not text")
    return None


def one_class_error(train: Sequence[Example], labels: list) -> LmlabError:
    where = train[0].where.rsplit(" line", 1)[0] if train else "training data"
    return LmlabError(f"{where} has only the label(s) {labels}: nothing to classify",
                      "pass training data with at least two classes")


class Classification(SequenceClassification):
    """Your own single-text classification data: any labels, any of the table formats."""

    name = "classification"


class SST2(SequenceClassification):
    name = "sst2"
    label_set = ("0", "1")
    glue_preset = True


class CoLA(SequenceClassification):
    name = "cola"
    glue_preset = True
    label_set = ("0", "1")
    main_metric = "matthews_corr"
    extra_metrics = ("matthews_corr",)

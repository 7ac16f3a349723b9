"""Regression from ``[CLS]``: a score per text or text pair; STS-B similarity 0-5 (Cer et al. 2017).

The ``seq_cls`` head with one output (``num_labels = 1``) predicts the score directly and is
trained with mean squared error; inputs are built as for pairs (segment ids 0/1).
Metrics: Pearson and Spearman correlation between predicted and gold scores (GLUE).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from lmlab.tasks import metrics as M
from lmlab.tasks.classification import SequenceClassification, text_value
from lmlab.tasks.readers import Example


class Regression(SequenceClassification):
    """A number per text or text pair (``regression``): the ``text_pair`` column is optional."""

    name = "regression"
    layout = "regression"
    main_metric = "pearson"
    roles = ("text", "text_pair", "label")
    optional_roles = ("text_pair",)

    def example(self, values, where, bad) -> Example | None:
        text = text_value(values, "text", where, bad)
        pair = None
        if values.get("text_pair") is not None:
            pair = text_value(values, "text_pair", where, bad)
            if pair is None:
                return None
        if text is None:
            return None
        value = values.get("label")
        try:
            score = float(value.strip() if isinstance(value, str) else value)
        except (TypeError, ValueError):
            bad(where, f"score {value!r} is not a number")
            return None
        if not math.isfinite(score) or isinstance(value, bool):
            bad(where, f"score {value!r} is not a finite number")
            return None
        return Example(text, pair, score, where)

    def header_probe(self, first, rest) -> bool | None:
        """The first row is a header when its score is no number."""
        try:
            float(first.get("label", ""))
        except ValueError:
            return True
        return False

    def fit(self, train: Sequence[Example]) -> None:
        self.labels = []  # one output

    def check(self, examples, what="dev") -> None:
        pass

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        texts = [e.text for e in examples]
        pairs = [e.pair or "" for e in examples] if any(e.pair is not None for e in examples) else None
        enc = tokenizer.encode_batch(texts, pairs, padding=False, truncation=True,
                                     max_length=self.options.max_length)
        feats = []
        for i, e in enumerate(examples):
            f = {"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i],
                 "token_type_ids": enc["token_type_ids"][i]}
            if e.label is not None:
                f["labels"] = float(e.label)
            feats.append(f)
        return feats

    def predict(self, model, examples, batch_size=64) -> list[float]:
        return self.logits(model, examples, batch_size)[:, 0].tolist()

    def score(self, predictions, examples) -> dict[str, float]:
        truth = [float(e.label) for e in examples]
        return {"pearson": M.pearson(predictions, truth), "spearman": M.spearman(predictions, truth)}



class STSB(Regression):
    name = "stsb"
    glue_preset = True

"""Sentence-pair regression from ``[CLS]``: STS-B similarity scores 0-5 (Cer et al. 2017).

The ``seq_cls`` head with one output (``num_labels = 1``) predicts the score directly and is
trained with mean squared error; inputs are built as for pairs (segment ids 0/1).
Metrics: Pearson and Spearman correlation between predicted and gold scores (GLUE).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmlab.tasks import metrics as M
from lmlab.tasks.classification import SequenceClassification
from lmlab.tasks.readers import Example


class Regression(SequenceClassification):
    name = "stsb"
    layout = "regression"
    main_metric = "pearson"

    def fit(self, train: Sequence[Example]) -> None:
        self.labels = []  # one output

    def check(self, examples, what="dev") -> None:
        pass

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        texts = [e.text for e in examples]
        pairs = [e.pair or "" for e in examples]
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


STSB = Regression

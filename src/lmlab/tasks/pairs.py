"""Sentence-pair classification (BERT; Devlin et al. 2019, fig. 4a): RTE, MRPC.

Input ``[CLS] sentence1 [SEP] sentence2 [SEP]``: segment id 0 on the first sentence (and
``[CLS]``/first ``[SEP]``), 1 on the second, so the model can tell the two apart; longest-first
truncation to ``max_length``. Same ``seq_cls`` head and loss as single sentences.

Metrics: accuracy and F1 of the positive class (MRPC: "1" = paraphrase, as GLUE reports it;
RTE: "entailment").
"""

from __future__ import annotations

from lmlab.tasks.classification import SequenceClassification


class PairClassification(SequenceClassification):
    """Your own sentence-pair data (``pair-classification``): any labels, any table format."""

    name = "pair-classification"
    layout = "pair"
    roles = ("text", "text_pair", "label")


class RTE(PairClassification):
    name = "rte"
    label_set = ("entailment", "not_entailment")
    positive_label = "entailment"
    extra_metrics = ("f1",)
    glue_preset = True


class MRPC(PairClassification):
    name = "mrpc"
    label_set = ("0", "1")
    main_metric = "f1"
    positive_label = "1"
    extra_metrics = ("f1",)
    glue_preset = True

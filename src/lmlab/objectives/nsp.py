"""Next-sentence prediction, trained jointly with masked LM (BERT; Devlin et al. 2019, §3.1 "Task #2").

Each row becomes one segment pair ``[CLS] A [SEP] B [SEP]`` with segment ids 0 for ``[CLS] A
[SEP]`` and 1 for ``B [SEP]``. With probability ``next_prob`` (0.5) B is the text that really
follows A (label 0, IsNext); otherwise B is a span of the same length taken from another row of
the batch, i.e. from elsewhere in the corpus (label 1, NotNext). The ``nsp`` head classifies the
pooled ``[CLS]`` vector; MLM masking (see :mod:`lmlab.objectives.mlm`) runs on the pair as in
BERT, and the loss is ``mlm + nsp``.

Worked example (T = 12, so 9 content tokens; A takes 4)::

    row b      the cat sat on | the mat . it was ...
    IsNext     [CLS] the cat sat on [SEP] the mat . it was [SEP]   label 0
    NotNext    [CLS] the cat sat on [SEP] <5 tokens of row b'> [SEP]  label 1
    segments     0    0   0   0   0   0    1   1  1  1   1    1

Where A ends: at a document (paragraph) boundary between 1/4 and 3/4 of the row when there is
one, so segments are whole paragraphs like BERT's whole sentences; otherwise at a random point in
that range. The NotNext segment starts at a document start of the other row when one fits.
Special tokens are never masked. Needs ``[CLS]``, ``[SEP]``, ``[MASK]`` and a batch of two or more
rows (NotNext text comes from the other rows).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.objectives.base import encoder_hidden, masked_lm
from lmlab.objectives.masking import label_positions, rand
from lmlab.objectives.mlm import MaskedLM
from lmlab.values import Probability

IS_NEXT, NOT_NEXT = 0, 1
#: a NotNext segment is drawn from another row of the batch
MIN_ROWS = 2
#: [CLS] A [SEP] B [SEP] with A and B at least one token each
MIN_SEQ_LEN = 5


class NextSentencePrediction(MaskedLM):
    """BERT's MLM + NSP; ``mlm=False`` trains the NSP head alone."""

    name = "nsp"
    architectures = ("encoder",)
    heads = ("mlm", "nsp")
    loss_kind = "other"  # MLM + NSP losses
    #: with ``mlm = false`` no token is masked: the masking options would be ignored
    only_when = {name: ("mlm", True) for name in ("mask_prob", "mask_token_prob", "random_token_prob",
                                                  "masking", "whole_word", "seed")}

    @classmethod
    def needed_roles(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """[CLS] and [SEP] of the ``[CLS] A [SEP] B [SEP]`` pair, besides MLM's [MASK]."""
        return (*super().needed_roles(params), "cls", "sep")

    @classmethod
    def check_train(cls, params: dict[str, Any], train: Any) -> None:
        """A NotNext segment comes from another row, and a row holds ``[CLS] A [SEP] B [SEP]``."""
        super().check_train(params, train)
        if train.batch_size < MIN_ROWS:
            raise LmlabError(f"train.batch_size {train.batch_size} is too few rows for the nsp objective, "
                             f"which needs at least {MIN_ROWS} (NotNext segments come from the other rows)",
                             f"set train.batch_size to {MIN_ROWS} or more", setting="batch_size")
        if train.seq_len < MIN_SEQ_LEN:
            raise LmlabError(f"train.seq_len {train.seq_len} is too short for the nsp objective's "
                             "[CLS] A [SEP] B [SEP]", f"set train.seq_len to {MIN_SEQ_LEN} or more",
                             setting="seq_len")

    def __init__(self, tokenizer, next_prob: Probability = 0.5, mlm: bool = True, **mlm_params):
        super().__init__(tokenizer, **mlm_params)
        p = NextSentencePrediction.checked({"next_prob": next_prob, "mlm": mlm})
        self.next_prob, self.mlm = float(p["next_prob"]), bool(p["mlm"])
        roles = self.require_roles(tokenizer, NextSentencePrediction.with_defaults(p))
        self.cls_id, self.sep_id = roles["cls"], roles["sep"]

    def pairs(self, batch: TokenBatch, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """``(input_ids, token_type_ids, nsp_labels)``: one ``[CLS] A [SEP] B [SEP]`` pair per row."""
        ids, docs = batch.input_ids, batch.doc_ids
        b_size, t = ids.shape
        if b_size < MIN_ROWS:
            raise LmlabError(f"the nsp objective needs at least {MIN_ROWS} rows per batch (NotNext segments "
                             "come from the other rows)", f"set train.batch_size to {MIN_ROWS} or more")
        n = t - 3
        if t < MIN_SEQ_LEN:
            raise LmlabError(f"sequence length {t} is too short for [CLS] A [SEP] B [SEP]",
                             f"set train.seq_len to {MIN_SEQ_LEN} or more")
        u = rand((b_size, 5), generator).tolist()
        new_doc = (docs[:, 1:] != docs[:, :-1]).cpu()
        out_ids = torch.empty_like(ids)
        types = torch.zeros_like(ids)
        labels = torch.empty(b_size, dtype=torch.long, device=ids.device)
        lo, hi = max(1, n // 4), max(1, (3 * n) // 4)
        for b in range(b_size):
            r = u[b]
            # A: up to a paragraph boundary in [lo, hi] if there is one
            bounds = (torch.nonzero(new_doc[b, lo - 1:hi]).flatten() + lo).tolist()
            k = bounds[int(r[0] * len(bounds))] if bounds else lo + int(r[0] * (hi - lo + 1))
            k = min(max(k, 1), n - 1)
            length_b = n - k
            if r[1] < self.next_prob:
                segment_b, labels[b] = ids[b, k:n], IS_NEXT
            else:
                other = int(r[2] * (b_size - 1))
                other += other >= b
                starts = [0] + (torch.nonzero(new_doc[other, : t - length_b]).flatten() + 1).tolist()
                starts = [s for s in starts if s + length_b <= t]
                s = starts[int(r[3] * len(starts))] if len(starts) > 1 else int(r[4] * (t - length_b + 1))
                segment_b, labels[b] = ids[other, s:s + length_b], NOT_NEXT
            out_ids[b] = torch.cat((ids.new_tensor([self.cls_id]), ids[b, :k], ids.new_tensor([self.sep_id]),
                                    segment_b, ids.new_tensor([self.sep_id])))
            types[b, k + 2:] = 1
        return out_ids, types, labels

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        ids, types, nsp_labels = self.pairs(batch, generator)
        inputs = {"input_ids": ids, "token_type_ids": types, "nsp_labels": nsp_labels}
        if self.mlm:
            # one example per row: the pair attends to itself as a whole (positions 0..T-1)
            inputs["input_ids"], inputs["labels"] = self.mask(ids, torch.zeros_like(ids), generator)
            inputs["label_positions"] = label_positions(inputs["labels"])
        return inputs

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        hidden = encoder_hidden(model, inputs)
        pooled = model.pool(hidden)
        mlm = masked_lm(model, hidden, inputs) if self.mlm else None
        nsp_logits = model.heads["nsp"](hidden, pooled)
        nsp_loss = F.cross_entropy(nsp_logits, inputs["nsp_labels"].view(-1).long())
        metrics = {
            "nsp_loss": nsp_loss.detach(),
            "nsp_acc": (nsp_logits.argmax(-1) == inputs["nsp_labels"]).float().mean(),
        }
        if mlm is None:
            return nsp_loss, metrics
        metrics["mlm_loss"] = mlm[1].detach()
        metrics.update(self.hidden_token_signal(mlm[0], inputs))
        return mlm[1] + nsp_loss, metrics

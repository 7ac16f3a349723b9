"""Causal language modelling (GPT; Radford et al. 2018, 2019): predict every next token.

Loss: ``-1/N Σ_i log p(x_i | x_<i)`` over the N predicted tokens of the batch; perplexity is
``exp`` of that mean negative log-likelihood (lecture 3). With packed windows two rules keep the
documents apart:

* attention is causal *and* block-diagonal: token i attends to j only if ``j <= i`` and both
  belong to the same document (the objective passes ``doc_ids``; the decoder builds the mask,
  block-sparse on GPUs: :mod:`lmlab.models.attention_masks`);
* the first token of each document is not a target: it would be predicted from the end of the
  previous, unrelated document. Its label is ``-100`` (ignored).

Worked example (one row, two documents ``a b c | d e``)::

    input_ids     a  b  c  d  e
    doc_ids       0  0  0  1  1
    position_ids  0  1  2  0  1
    labels        a  b  c  -  e      (the model shifts: position i is scored on labels[i+1])
    targets       b  c  -  e         -> a->b, b->c, d->e; nothing predicts d from c

When no row of the batch contains a document boundary ``doc_ids`` is left out and the fused
``is_causal`` attention kernel runs.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.losses import IGNORE, causal_lm_loss
from lmlab.objectives.base import Objective, mask_of, token_signal


class CausalLM(Objective):
    """Next-token prediction for decoders (GPT-2, Llama), documents kept apart."""

    name = "clm"
    architectures = ("decoder",)
    heads = ("lm",)
    loss_kind = "nll"
    signals = (("next_acc", "next_acc_guess", "most frequent token"),)

    def prepare(self, batch: TokenBatch, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        labels = batch.input_ids.masked_fill(batch.position_ids == 0, IGNORE)
        inputs = {"input_ids": batch.input_ids, "position_ids": batch.position_ids, "labels": labels}
        if not batch.is_single_document():
            inputs["doc_ids"] = batch.doc_ids  # the decoder keeps attention inside each document
        return inputs

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        hidden = model.backbone(inputs["input_ids"], inputs.get("position_ids"), mask_of(inputs, causal=True))
        logits = model.heads["lm"](hidden)
        loss = causal_lm_loss(logits, inputs["labels"])
        targets = (inputs["labels"][:, 1:] != IGNORE).sum()
        with torch.no_grad():
            signal = token_signal(logits[:, :-1].detach(), inputs["labels"][:, 1:], "next", IGNORE)
        return loss, {**signal, "targets": targets}

"""Prefix language modelling (Raffel et al. 2020, §3.2.2 "Prefix LM"; Liu et al. 2018; lecture 3).

A decoder-only model that reads a *prefix* bidirectionally, like an encoder, and continues it
causally, like a decoder: token i may attend to token j when ``j <= i`` (causal) **or** j lies in
the prefix. The loss is next-token prediction on the continuation only; predicting a prefix
token would be cheating, since every prefix position already sees the whole prefix.

Each document of a packed row gets its own split point, uniform in ``[1, len - 1]`` (a
one-token document is all prefix), and attention never crosses documents. With one document
per row this is exactly :func:`lmlab.models.attention_masks.prefix_lm_mask`. The objective passes
``doc_ids`` and ``prefix_mask`` (the keys of each document's prefix); the decoder builds the mask
(:mod:`lmlab.models.attention_masks`).

Worked example (one document of 5 tokens, prefix length 2)::

    tokens      a  b | c  d  e
    may attend  a: a b        b: a b        c: a b c     d: a b c d     e: a b c d e
    labels      -  -   c  d  e     (position i is scored on labels[i+1]: b->c, c->d, d->e)
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.losses import IGNORE, causal_lm_loss
from lmlab.objectives.base import Objective, mask_of, token_signal
from lmlab.objectives.masking import rand


def document_lengths(batch: TokenBatch) -> Tensor:
    """Length of the document each token belongs to (within its row), ``[B, T]``."""
    b, t = batch.doc_ids.shape
    counts = torch.zeros(b, t, dtype=torch.long, device=batch.doc_ids.device)
    counts.scatter_add_(1, batch.doc_ids, torch.ones_like(batch.doc_ids))
    return counts.gather(1, batch.doc_ids)


def sample_prefix_lengths(batch: TokenBatch, generator: torch.Generator) -> Tensor:
    """Prefix length of the document of every token, ``[B, T]``: uniform in ``[1, len - 1]``
    per document (one draw per document, read at each of its tokens)."""
    lengths = document_lengths(batch)
    b, t = batch.doc_ids.shape
    u = rand((b, t), generator, batch.doc_ids.device).gather(1, batch.doc_ids)  # one draw per document
    prefix = 1 + (u * (lengths - 1).clamp(min=0)).long()
    return torch.minimum(prefix, lengths)


class PrefixLM(Objective):
    """Prefix LM for decoders with an ``lm`` head (see the module docstring)."""

    name = "prefix_lm"
    architectures = ("decoder",)
    heads = ("lm",)
    loss_kind = "masked_nll"
    signals = (("next_acc", "next_acc_guess", "most frequent token"),)

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        prefix_len = sample_prefix_lengths(batch, generator)
        target = batch.position_ids >= prefix_len  # never a document's first token (prefix >= 1)
        return {"input_ids": batch.input_ids, "position_ids": batch.position_ids,
                "labels": batch.input_ids.masked_fill(~target, IGNORE),
                "doc_ids": batch.doc_ids, "prefix_mask": batch.position_ids < prefix_len}

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        hidden = model.backbone(inputs["input_ids"], inputs.get("position_ids"), mask_of(inputs, causal=True))
        logits = model.heads["lm"](hidden)
        loss = causal_lm_loss(logits, inputs["labels"])
        with torch.no_grad():  # position i predicts token i + 1 (of the part after the prefix)
            signal = token_signal(logits[:, :-1].detach(), inputs["labels"][:, 1:], "next", IGNORE)
        return loss, {**signal, "targets": (inputs["labels"][:, 1:] != IGNORE).sum()}

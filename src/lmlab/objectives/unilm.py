"""UniLM: one shared Transformer trained with three self-attention masks (Dong et al. 2019, §2).

The same encoder (an ``mlm`` head) does cloze prediction under different views of the context,
chosen per row with UniLM's proportions: 1/3 **bidirectional** (BERT's MLM), 1/3
**unidirectional** (half left-to-right, half right-to-left LM) and 1/3 **sequence-to-sequence**.
Tokens are masked as in BERT (15%, 80/10/10) and predicted from what the mask lets them see; only
the mask differs, passed to the encoder as ``attention_pattern`` (True = may attend)::

    bidirectional    every token sees every token of its document
    left-to-right    token i sees tokens j <= i
    right-to-left    token i sees tokens j >= i
    seq-to-seq       source tokens (the document's first s) see the source only;
                     target tokens see the source and the target up to themselves

Worked example (one document ``s1 s2 | t1 t2``, source length 2; rows = queries, 1 = attend)::

    bidirectional    left-to-right    seq-to-seq
    1 1 1 1          1 0 0 0          1 1 0 0
    1 1 1 1          1 1 0 0          1 1 0 0
    1 1 1 1          1 1 1 0          1 1 1 0
    1 1 1 1          1 1 1 1          1 1 1 1

Every mask is also block-diagonal over the documents of a packed row. In seq-to-seq rows each
document is split at a random point (uniform in ``[1, len - 1]``) and, when the model has segment
embeddings, the source gets segment id 0 and the target 1, as UniLM does. (UniLM also masks
bigrams/trigrams 20% of the time; this implementation masks single tokens.)
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE
from lmlab.objectives.base import encoder_hidden, first_given, masked_lm
from lmlab.objectives.masking import label_positions, rand
from lmlab.objectives.mlm import MaskedLM
from lmlab.objectives.prefix_lm import sample_prefix_lengths
from lmlab.values import NonNegative

BIDIRECTIONAL, LEFT_TO_RIGHT, RIGHT_TO_LEFT, SEQ2SEQ = 0, 1, 2, 3
MODES = ("bidirectional", "left_to_right", "right_to_left", "seq2seq")


def bidirectional_mask(batch: TokenBatch) -> Tensor:
    return batch.same_document()


def left_to_right_mask(batch: TokenBatch) -> Tensor:
    t = batch.input_ids.shape[1]
    return batch.same_document() & torch.ones(t, t, dtype=torch.bool, device=batch.input_ids.device).tril()


def right_to_left_mask(batch: TokenBatch) -> Tensor:
    t = batch.input_ids.shape[1]
    return batch.same_document() & torch.ones(t, t, dtype=torch.bool, device=batch.input_ids.device).triu()


def seq2seq_mask(batch: TokenBatch, source_len: Tensor) -> Tensor:
    """``source_len`` ``[B, T]``: the source length of each token's document."""
    t = batch.input_ids.shape[1]
    causal = torch.ones(t, t, dtype=torch.bool, device=batch.input_ids.device).tril()
    is_source = batch.position_ids < source_len  # [B, T]
    # a key in the source is visible to everyone in the document; a target key only causally to targets
    allowed = is_source[:, None, :] | (~is_source[:, :, None] & causal[None])
    return batch.same_document() & allowed


class UniLM(MaskedLM):
    """UniLM pretraining for encoders with an ``mlm`` head (see the module docstring)."""

    name = "unilm"
    architectures = ("encoder",)
    heads = ("mlm",)

    @classmethod
    def check_params(cls, params: dict[str, Any], given=None) -> None:
        """The three proportions are not all 0."""
        super().check_params(params, given)
        parts = [params[k] for k in ("bidirectional", "unidirectional", "seq2seq")]
        if sum(parts) <= 0:
            raise LmlabError(f"UniLM proportions must not all be 0, got objective.bidirectional={parts[0]}, "
                             f"objective.unidirectional={parts[1]}, objective.seq2seq={parts[2]}",
                             "UniLM uses 1/3 each",
                             setting=first_given(("bidirectional", "unidirectional", "seq2seq"), given))

    def __init__(self, tokenizer, bidirectional: NonNegative = 1 / 3, unidirectional: NonNegative = 1 / 3,
                 seq2seq: NonNegative = 1 / 3, segment_ids: bool = True, **mlm_params):
        super().__init__(tokenizer, **mlm_params)
        p = UniLM.checked({"bidirectional": bidirectional, "unidirectional": unidirectional,
                           "seq2seq": seq2seq, "segment_ids": segment_ids})
        bidirectional, unidirectional, seq2seq = p["bidirectional"], p["unidirectional"], p["seq2seq"]
        weights = [bidirectional, unidirectional / 2, unidirectional / 2, seq2seq]
        total = sum(weights)
        self.cumulative = torch.tensor(weights).cumsum(0) / total
        self.segment_ids = bool(segment_ids)

    def sample_modes(self, rows: int, generator: torch.Generator) -> Tensor:
        """Mode of each row: 0 bidirectional, 1 left-to-right, 2 right-to-left, 3 seq-to-seq."""
        u = rand((rows,), generator, "cpu")
        return torch.searchsorted(self.cumulative, u, right=True).clamp(max=3)

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        device = batch.input_ids.device
        modes = self.sample_modes(batch.input_ids.shape[0], generator).to(device)
        source_len = sample_prefix_lengths(batch, generator)
        masks = torch.stack([bidirectional_mask(batch), left_to_right_mask(batch), right_to_left_mask(batch),
                             seq2seq_mask(batch, source_len)], dim=1)  # [B, 4, T, T]
        pattern = masks[torch.arange(len(modes), device=device), modes]
        corrupted, labels = self.mask(batch.input_ids, batch.doc_ids, generator)
        inputs = {"input_ids": corrupted, "labels": labels, "label_positions": label_positions(labels),
                  "position_ids": batch.position_ids, "attention_pattern": pattern, "modes": modes}
        if self.segment_ids:
            is_target = (batch.position_ids >= source_len) & (modes == SEQ2SEQ)[:, None]
            inputs["token_type_ids"] = is_target.long()
        return inputs

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        inputs = dict(inputs)
        modes = inputs.pop("modes")
        if getattr(model.config, "type_vocab_size", 0) < 2:
            inputs.pop("token_type_ids", None)  # no segment embeddings (RoBERTa-style): masks only
        logits, loss = masked_lm(model, encoder_hidden(model, inputs), inputs)
        labels = inputs["labels"]
        # tensors, read by the engine with the step's other numbers (no device read per metric)
        metrics = {**self.hidden_token_signal(logits, inputs), "targets": (labels != IGNORE).sum()}
        for m, name in enumerate(MODES):
            metrics[f"rows_{name}"] = (modes == m).sum()
        return loss, metrics

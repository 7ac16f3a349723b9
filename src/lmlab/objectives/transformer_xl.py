"""Transformer-XL segment-recurrent language modelling (Dai et al. 2019, section 3.2).

The model (``models/transformer_xl.py``) reads a text segment by segment; each layer attends to
its own segment and to a memory of the previous segments' hidden states (no gradient flows into
the memory). This objective feeds it consecutive segments of the same token stream and carries
the memory:

* **inside a batch**: each packed window ``[B, T]`` is cut into segments of ``segment_len``
  tokens, read left to right, the memory of one segment feeding the next;
* **across batches** (``carry_memory = true``): the memory left by the last segment of a batch
  is kept in the objective (one state for training, one for evaluation) and offered to the next
  batch of the same mode. Row ``b`` keeps it only when the new row continues the old one: its
  first token's position in the document is the old row's last position + 1. Otherwise (a new
  document, a jump in the data order, a different batch shape) that row's memory is masked out,
  which is the same as a reset. ``reset_memory()`` drops all state (call it when you reorder
  data yourself). The memory is not saved in checkpoints: after a resume the first batch starts
  with an empty memory.

Attention never crosses documents: each query sees memory and segment keys of its own document
only (document ids of memory tokens are carried with the memory), causally. The loss is the
mean next-token cross-entropy over the whole window; the first token of each document is not
predicted from the previous document.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, causal_lm_loss
from lmlab.models.attention_masks import MaskSpec
from lmlab.objectives.base import Objective, token_signal
from lmlab.values import Count

_NO_DOC = -(2**40)  # document id that matches nothing: memory of a row that does not continue


@dataclass
class _Carry:
    mems: tuple[Tensor, ...]
    mem_docs: Tensor  # [B, M] document ids relative to the row's last document (0 = same)
    last_pos: Tensor  # [B] position-in-document of the row's last token


class SegmentRecurrentLM(Objective):
    """Causal LM over consecutive segments with Transformer-XL memory (``objective = "transfo-xl"``)."""

    name = "transfo-xl"
    architectures = ("transfo-xl",)
    heads = ("lm",)
    loss_kind = "nll"
    signals = (("next_acc", "next_acc_guess", "most frequent token"),)

    def __init__(self, tokenizer, segment_len: Count = 64, carry_memory: bool = True, **params):
        super().__init__(tokenizer)
        if params:
            raise LmlabError(
                f"the transfo-xl objective has no parameters {sorted(params)}",
                "use segment_len and carry_memory",
            )
        p = SegmentRecurrentLM.checked({"segment_len": segment_len, "carry_memory": carry_memory})
        self.segment_len = int(p["segment_len"])
        self.carry_memory = bool(p["carry_memory"])
        self._carry: dict[bool, _Carry | None] = {True: None, False: None}

    def reset_memory(self) -> None:
        """Forget the memory carried between batches (both training and evaluation)."""
        self._carry = {True: None, False: None}

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        ids, docs = batch.input_ids, batch.doc_ids
        labels = ids.clone()
        labels[:, 1:] = labels[:, 1:].masked_fill(docs[:, 1:] != docs[:, :-1], IGNORE)
        return {"input_ids": ids, "doc_ids": docs, "position_ids": batch.position_ids, "labels": labels}

    def _incoming(self, model, ids: Tensor, pos: Tensor) -> tuple[tuple[Tensor, ...] | None, Tensor | None]:
        """The carried memory for this batch, with rows that do not continue masked out."""
        carry = self._carry.get(model.training) if self.carry_memory else None
        if (
            carry is None
            or carry.mem_docs.shape[0] != ids.shape[0]
            or carry.mem_docs.device != ids.device
            or len(carry.mems) != model.config.n_layers
            or carry.mems[0].shape[1] == 0
        ):
            return None, None
        continues = pos[:, 0] == carry.last_pos + 1
        mem_docs = carry.mem_docs.masked_fill(~continues[:, None], _NO_DOC)
        return carry.mems, mem_docs

    def run(self, model, input_ids: Tensor, doc_ids: Tensor, mems=None, mem_docs=None):
        """Read the window segment by segment; return ``(logits [B,T,V], mems, mem_docs)``."""
        b, t = input_ids.shape
        logits = []
        for s in range(0, t, self.segment_len):
            seg, seg_docs = input_ids[:, s : s + self.segment_len], doc_ids[:, s : s + self.segment_len]
            key_docs = seg_docs if mem_docs is None else torch.cat([mem_docs, seg_docs], dim=1)
            out = model(seg, mems=mems, mask=MaskSpec(causal=True, doc_ids=key_docs))
            logits.append(out.logits)
            mems = out.extra["mems"]
            mem_docs = key_docs[:, key_docs.shape[1] - mems[0].shape[1] :]
        return torch.cat(logits, dim=1), mems, mem_docs

    def loss(self, model, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        if not hasattr(model, "config") or not hasattr(model.config, "mem_len"):
            raise LmlabError(
                "the transfo-xl objective needs a Transformer-XL model",
                "set [model] preset = 'transfo-xl-tiny'",
            )
        ids, docs, pos = inputs["input_ids"], inputs["doc_ids"], inputs["position_ids"]
        mems, mem_docs = self._incoming(model, ids, pos)
        carried = torch.zeros(()) if mem_docs is None else (mem_docs != _NO_DOC).any(1).float().mean()
        logits, mems, mem_docs = self.run(model, ids, docs, mems, mem_docs)
        if self.carry_memory:
            self._carry[model.training] = _Carry(mems, mem_docs - docs[:, -1:], pos[:, -1].clone())
        loss = causal_lm_loss(logits, inputs["labels"])
        with torch.no_grad():
            signal = token_signal(logits[:, :-1].detach(), inputs["labels"][:, 1:], "next", IGNORE)
        return loss, {"memory_rows": carried, **signal}

"""XLNet permutation language modelling (Yang et al. 2019, section 2.2-2.3).

For each sequence sample a factorization order ``z`` (a random permutation of the positions)
and maximise ``sum_t log p(x_{z_t} | x_{z_<t})``. The text keeps its natural positions; only the
attention masks follow the order. Predicting every token is slow to converge, so only the last
``1/K`` of the order is predicted (*partial prediction*, K = 6-7 in the paper): the first
``T - T/K`` tokens of the order are context, the rest are targets.

Masks (True = may attend), with ``rank[i]`` = place of position i in the order:

* content stream ``h_i`` sees token j iff ``rank[j] <= rank[i]`` (itself included);
* query stream ``g_i`` sees the content of token j iff ``rank[j] < rank[i]`` (never itself).

As in the reference implementation, the context tokens are never predicted, so their order
among themselves does not matter: they all get rank -1 and see each other (and no target),
while every target sees the whole context plus the targets before it. Packed documents stay
apart: both masks are also restricted to the same document (an independent order per document
follows, since a random permutation of the row induces one on each document). Special tokens
are never predicted, nor a target that has nothing to look at (a one-token document piece).

``two_stream_masks`` and ``permutation_ranks`` are pure functions so the masks can be checked
by hand; :class:`PermutationLM` is the objective (``objective = "xlnet"``, model ``xlnet-*``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE, token_loss
from lmlab.models.attention_masks import MaskSpec
from lmlab.objectives.base import Objective, token_signal
from lmlab.values import PositiveShare


def permutation_ranks(batch_size: int, seq_len: int, generator: torch.Generator, device=None) -> Tensor:
    """``[B, T]`` long: ``rank[b, i]`` = place of position i in a uniformly random order of row b."""
    order = torch.rand(batch_size, seq_len, generator=generator).argsort(dim=1)  # order[t] = z_t
    return order.argsort(dim=1).to(device)  # inverse permutation: position -> place


def two_stream_masks(
    ranks: Tensor, num_context: int, same_document: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Content and query masks ``[B, T, T]`` (query row i, key j; True = may attend).

    ``ranks``: ``[B, T]`` place of each position in the factorization order; the first
    ``num_context`` places are context (rank -1, mutually visible), the rest are targets.
    """
    eff = torch.where(ranks < num_context, torch.full_like(ranks, -1), ranks)
    content = eff[:, None, :] <= eff[:, :, None]
    query = eff[:, None, :] < eff[:, :, None]
    if same_document is not None:
        content = content & same_document
        query = query & same_document
    return content, query


class PermutationLM(Objective):
    """XLNet's permutation LM with partial prediction (``predict_fraction`` = 1/K)."""

    name = "xlnet"
    architectures = ("xlnet",)
    heads = ("lm",)
    loss_kind = "masked_nll"
    #: accuracy on the predicted tokens (the last part of each row's factorisation order)
    signals = (("target_acc", "target_acc_guess", "most frequent token"),)

    def __init__(self, tokenizer, predict_fraction: PositiveShare = 1 / 6, **params):
        super().__init__(tokenizer)
        if params:
            raise LmlabError(
                f"the xlnet objective has no parameters {sorted(params)}",
                "use predict_fraction (1/K, e.g. 0.1667)",
            )
        predict_fraction = PermutationLM.checked({"predict_fraction": predict_fraction})["predict_fraction"]
        self.predict_fraction = float(predict_fraction)

    def num_targets(self, seq_len: int) -> int:
        return max(1, min(seq_len, round(seq_len * self.predict_fraction)))

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        ids = batch.input_ids
        b, t = ids.shape
        p = self.num_targets(t)
        ranks = permutation_ranks(b, t, generator, ids.device)
        content, query = two_stream_masks(ranks, t - p, batch.same_document())
        # the targets, in left-to-right order of position: the last p places of the order
        # (a stable sort puts each row's p targets first, in position order: nonzero() would give the
        # same, but its output size depends on the data, a read of the device)
        target_positions = torch.argsort((ranks < t - p).to(torch.uint8), dim=1, stable=True)[:, :p]
        query_pattern = query.gather(1, target_positions[:, :, None].expand(b, p, t))
        labels = ids.gather(1, target_positions)
        labels = labels.masked_fill(self.is_special(labels) | ~query_pattern.any(-1), IGNORE)
        return {
            "input_ids": ids,
            "position_ids": batch.position_ids,
            "attention_pattern": content,
            "query_pattern": query_pattern,
            "target_positions": target_positions,
            "labels": labels,
        }

    def loss(self, model, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        labels = inputs["labels"]
        streams = MaskSpec(pattern=inputs["attention_pattern"], query_stream=inputs["query_pattern"])
        out = model(inputs["input_ids"], inputs["position_ids"], mask=streams,
                    targets=inputs["target_positions"])
        with torch.no_grad():
            signal = token_signal(out.logits.detach(), labels, "target", IGNORE)
        return token_loss(out.logits, labels), {**signal, "targets": (inputs["labels"] != IGNORE).sum()}

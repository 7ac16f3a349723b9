"""SpanBERT: span masking and the span-boundary objective (Joshi et al. 2020, §3.1-3.2).

**Span masking.** Instead of single tokens, mask contiguous spans of whole words until 15% of the
row's (non-special) tokens are masked. Each iteration samples a span length in words from a
geometric distribution ``ℓ ~ Geo(p = 0.2)`` clipped at ``ℓ_max = 10`` (mean ≈ 3.6 words), picks
a random token, snaps to the start of its word, and masks that many whole words, stopping at
the budget, a special token, an already masked token or the end of the document. The 80/10/10
replacement is decided per *span*: a span is all ``[MASK]``, all random tokens, or all unchanged.

**Span-boundary objective (SBO, optional, ``sbo = true``).** Each masked token ``x_i`` of a span
``(s, e)`` is also predicted from the encoder outputs at the two boundary tokens just outside the
span and a relative-position embedding of ``i`` within the span::

    h = LayerNorm(GeLU(W2 · LayerNorm(GeLU(W1 · [x_{s-1}; x_{e+1}; p_{i-s+1}]))))
    loss_SBO = -log p(x_i | h)      (output projection shared with the MLM head)

and the total loss is ``MLM + SBO``. The SBO head belongs to the objective (it is built in
:meth:`SpanBERT.setup`, sized from the model) and is trained with it. A boundary outside the
document (a span at a document start or end) falls back to the span's own edge token.

Worked example (budget 4 tokens, words ``the|cat|sat|on|the|mat``, one span of 3 words drawn at
"cat")::

    input_ids   the [MASK] [MASK] [MASK] the mat
    labels      -100  cat    sat    on   -100 -100
    boundaries       (the, the) for each masked token; relative positions 0, 1, 2
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.models.blocks import LayerNorm
from lmlab.objectives.base import encoder_hidden, masked_lm
from lmlab.objectives.masking import (
    IGNORE,
    document_ids,
    geometric_lengths,
    label_positions,
    rand,
    replace_80_10_10,
    special_mask,
    word_boundary_tables,
    word_ids,
)
from lmlab.objectives.mlm import MaskedLM
from lmlab.values import Count, PositiveProbability, Probability


class SpanBoundaryHead(nn.Module):
    """SBO: a 2-layer GeLU + LayerNorm MLP over ``[left boundary; right boundary; position]``."""

    def __init__(self, d_model: int, out_dim: int, max_span_tokens: int, eps: float = 1e-12):
        super().__init__()
        self.position = nn.Embedding(max_span_tokens, d_model)
        self.fc1 = nn.Linear(3 * d_model, d_model)
        self.norm1 = LayerNorm(d_model, eps)
        self.fc2 = nn.Linear(d_model, out_dim)
        self.norm2 = LayerNorm(out_dim, eps)
        for m in (self.position, self.fc1, self.fc2):
            nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.zeros_(self.fc1.bias)
        nn.init.zeros_(self.fc2.bias)

    def forward(self, left: Tensor, right: Tensor, rel: Tensor) -> Tensor:
        rel = rel.clamp(max=self.position.num_embeddings - 1)
        h = torch.cat((left, right, self.position(rel)), dim=-1)
        h = self.norm1(F.gelu(self.fc1(h)))
        return self.norm2(F.gelu(self.fc2(h)))


class SpanBERT(MaskedLM):
    """Span masking (+ optional SBO) for encoders with an ``mlm`` head."""

    name = "spanbert"
    architectures = ("encoder",)
    heads = ("mlm",)
    loss_kind = "other"  # MLM + span-boundary losses (with use_sbo)
    #: the span-boundary head's position table is all that reads max_span_tokens (:meth:`setup`)
    only_when = {"max_span_tokens": ("sbo", True)}

    @classmethod
    def own_parameters(cls, params: dict[str, Any], model_config) -> tuple[int, str]:
        """The span-boundary head (with ``sbo``): its position table of ``max_span_tokens`` rows and
        its two layers (:class:`SpanBoundaryHead`)."""
        d, e = getattr(model_config, "d_model", None), getattr(model_config, "embed_dim", None)
        if not params.get("sbo") or not isinstance(d, int) or not isinstance(e, int):
            return 0, ""
        count = int(params["max_span_tokens"]) * d + 3 * d * d + d * e + 4 * d + 3 * e
        return count, "objective.max_span_tokens"

    def __init__(self, tokenizer, mask_prob: PositiveProbability = 0.15,
                 geometric_p: PositiveProbability = 0.2,
                 max_span_words: Count = 10, mask_token_prob: Probability = 0.8,
                 random_token_prob: Probability = 0.1, sbo: bool = True, max_span_tokens: Count = 32):
        super().__init__(tokenizer, mask_prob=mask_prob, mask_token_prob=mask_token_prob,
                         random_token_prob=random_token_prob)
        p = SpanBERT.checked({"geometric_p": geometric_p, "max_span_words": max_span_words, "sbo": sbo,
                              "max_span_tokens": max_span_tokens})
        self.geometric_p, self.max_span_words = float(p["geometric_p"]), int(p["max_span_words"])
        self.use_sbo = bool(p["sbo"])
        self.max_span_tokens = int(p["max_span_tokens"])
        self.word_tables = word_boundary_tables(tokenizer)
        self.sbo: SpanBoundaryHead | None = None

    def setup(self, model: nn.Module) -> None:
        if self.use_sbo and self.sbo is None:
            cfg = model.config
            self.sbo = SpanBoundaryHead(cfg.d_model, cfg.embed_dim, self.max_span_tokens, cfg.norm_eps)
            self.sbo.to(next(model.parameters()).device)

    # ------------------------------------------------------------------ span sampling
    def sample_spans(self, ids: Tensor, doc_ids: Tensor, generator: torch.Generator) -> Tensor:
        """Span id per token, ``[B, T]``: -1 where not masked, else 0, 1, 2... (one id per span)."""
        b_size, t = ids.shape
        words = word_ids(ids, doc_ids, *self.word_tables).cpu()
        candidate = (~special_mask(ids, self.special_ids)).cpu()
        docs = doc_ids.cpu()
        budgets = (candidate.sum(1).float() * self.mask_prob).round().long().tolist()
        tries = max(8, 4 * (int(t * self.mask_prob) + 1))
        lengths = geometric_lengths(b_size * tries, self.geometric_p, self.max_span_words, generator)
        anchors = (rand(b_size * tries, generator) * t).long().clamp(max=t - 1)
        lengths, anchors = lengths.view(b_size, tries).tolist(), anchors.view(b_size, tries).tolist()
        span_ids = torch.full((b_size, t), -1, dtype=torch.long)
        for b in range(b_size):
            w, cand, d = words[b].tolist(), candidate[b].tolist(), docs[b].tolist()
            taken = [False] * t
            used, next_id = 0, 0
            for length, anchor in zip(lengths[b], anchors[b]):
                if used >= budgets[b]:
                    break
                if not cand[anchor] or taken[anchor]:
                    continue
                start = anchor
                while start > 0 and w[start - 1] == w[anchor]:
                    start -= 1
                end, n_words = start, 0  # grow whole words: [start, end)
                while end < t and n_words < length and used + (end - start) < budgets[b]:
                    word_end = end
                    while word_end < t and w[word_end] == w[end]:
                        word_end += 1
                    if not all(cand[end:word_end]) or any(taken[end:word_end]) or d[end] != d[start]:
                        break
                    end, n_words = word_end, n_words + 1
                if end == start:
                    continue
                for i in range(start, end):
                    taken[i] = True
                span_ids[b, start:end] = next_id
                next_id += 1
                used += end - start
        return span_ids.to(ids.device)

    # ------------------------------------------------------------------ objective contract
    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        ids = batch.input_ids
        spans = self.sample_spans(ids, batch.doc_ids, generator)
        selected = spans >= 0
        corrupted = replace_80_10_10(ids, selected, self.mask_id, self.pool, generator, self.mask_token_prob,
                                     self.random_token_prob, units=spans.clamp(min=0))
        labels = ids.masked_fill(~selected, IGNORE)
        inputs = {"input_ids": corrupted, "labels": labels, "label_positions": label_positions(labels),
                  "position_ids": batch.position_ids}
        docs = document_ids(batch)
        if docs is not None:
            inputs["doc_ids"] = docs
        if self.use_sbo:
            inputs.update(span_boundaries(spans, batch.doc_ids))
        return inputs

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        inputs = dict(inputs)
        left, right, rel = (inputs.pop(k, None) for k in ("sbo_left", "sbo_right", "sbo_position"))
        h = encoder_hidden(model, inputs)
        mlm_logits, mlm_loss = masked_lm(model, h, inputs)
        labels = inputs["labels"]
        signal = self.hidden_token_signal(mlm_logits, inputs)
        metrics = {"mlm_loss": mlm_loss.detach(), **signal, "targets": (labels != IGNORE).sum()}
        if not self.use_sbo:
            return mlm_loss, metrics
        if self.sbo is None:
            raise LmlabError("the SpanBERT span-boundary head was never built",
                             "call objective.setup(model) before training (the trainer does)")
        positions = inputs.get("label_positions")
        if positions is None:  # inputs made elsewhere: find the masked positions (reads the device)
            positions = label_positions(labels)

        def at_masked(x: Tensor) -> Tensor:
            return x.reshape(-1).index_select(0, positions)

        rows = torch.div(positions, labels.shape[1], rounding_mode="floor")
        rep = self.sbo(h[rows, at_masked(left)], h[rows, at_masked(right)], at_masked(rel))
        logits = model.heads["mlm"].decoder(rep)  # the MLM output embeddings, as in the paper
        sbo_loss = F.cross_entropy(logits, at_masked(labels)) if rep.shape[0] else logits.sum()
        metrics["sbo_loss"] = sbo_loss.detach()
        return mlm_loss + sbo_loss, metrics


def span_boundaries(span_ids: Tensor, doc_ids: Tensor) -> dict[str, Tensor]:
    """For every token of a span: the positions of the boundary tokens just outside it and its
    0-based position inside the span (``sbo_left``, ``sbo_right``, ``sbo_position``; 0 elsewhere).

    A boundary in another document (or outside the row) is replaced by the span's own edge token.
    """
    b_size, t = span_ids.shape
    idx = torch.arange(t, device=span_ids.device).expand(b_size, t)
    in_span = span_ids >= 0
    # span start/end per token: a span is a maximal run of one span id
    new = in_span.clone()
    new[:, 1:] &= span_ids[:, 1:] != span_ids[:, :-1]
    start = torch.cummax(torch.where(new, idx, torch.zeros_like(idx)), dim=1).values
    last = in_span.clone()
    last[:, :-1] &= span_ids[:, :-1] != span_ids[:, 1:]
    big = torch.full_like(idx, t - 1)
    end = torch.flip(torch.cummin(torch.flip(torch.where(last, idx, big), [1]), dim=1).values, [1])
    left = (start - 1).clamp(min=0)
    right = (end + 1).clamp(max=t - 1)
    left = torch.where((start == 0) | (doc_ids.gather(1, left) != doc_ids), start, left)
    right = torch.where((end == t - 1) | (doc_ids.gather(1, right) != doc_ids), end, right)
    zero = torch.zeros_like(idx)
    return {"sbo_left": torch.where(in_span, left, zero), "sbo_right": torch.where(in_span, right, zero),
            "sbo_position": torch.where(in_span, idx - start, zero)}

"""T5 span corruption and its variants (Raffel et al. 2020, §3.3 and Table 3; lecture 3).

**Span corruption.** Pick ``noise_density`` (15%) of the tokens in spans of mean length
``mean_span_length`` (3); replace each span in the input by one sentinel token; the target is
each sentinel followed by the tokens it hides, closed by one more sentinel::

    tokens   Thank you for inviting me to your party last week .
    spans            (2,4)                      (8,9)
    inputs   Thank you <X> me to your party <Y> week .
    targets  <X> for inviting <Y> last <Z>

:func:`corrupt_spans` is that transformation as a pure function (any token type). The spans are
drawn as in the T5 code (``random_spans_noise_mask``): for a length ``L`` the number of noise
tokens is ``round(L · density)`` (at least 1, at most ``L - 1``) and the number of spans
``round(noise / mean_span_length)`` (at least 1); the noise and the non-noise tokens are each
cut into that many non-empty segments at uniformly random points, and the segments alternate,
non-noise first. Sentinels are the tokenizer's ``<extra_id_0>``, ``<extra_id_1>``...; they are
added to the tokenizer (as special tokens) when it lacks them, before the model is built.

Variants (``variant``):

* ``"spans"`` (default) - the above.
* ``"drop"`` - "drop corrupted tokens": the noise tokens are removed from the input without
  sentinels and the target is just the dropped tokens in order
  (``Thank you me to your party week .`` -> ``for inviting last``).
* ``"bert"`` - BERT-style for encoder-decoders: the input is the text with 15% of the tokens
  masked 80/10/10 and the target is the whole original text.
* ``"prefix_lm"`` - plain language modelling for encoder-decoders (the T5 paper's "prefix language
  modeling", Table 4): each row is cut at a point drawn uniformly from ``1 .. L-1``; the encoder
  reads the part before it and the decoder predicts the rest, token by token
  (``Thank you for inviting`` -> ``me to your party last week .``). ``noise_density`` and
  ``mean_span_length`` are not used.

Packed rows: each row is one example (T5's own preprocessing concatenates documents the same
way); noise spans are drawn inside each document, never across a boundary, and special tokens
are never corrupted. The end-of-sequence token (when the tokenizer has one) closes every input
and target. Rows are padded to the longest in the batch (``attention_mask``; labels ``-100``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

import torch
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.objectives.base import Objective, teacher_forced, token_signal
from lmlab.objectives.masking import (
    IGNORE,
    replace_80_10_10,
    replacement_pool,
    select_tokens,
    special_mask,
)
from lmlab.setting_rules import Needs
from lmlab.tokenizers.base import sentinel_tokens
from lmlab.tokenizers.special_tokens import check_sentinel_count
from lmlab.values import Count, MeanSpanLength, PositiveProbability, choice

T = TypeVar("T")
VARIANTS = ("spans", "drop", "bert", "prefix_lm")
Variant = choice(*VARIANTS)


def corrupt_spans(tokens: Sequence[T], spans: Sequence[tuple[int, int]],
                  sentinels: Sequence[T]) -> tuple[list[T], list[T]]:
    """Replace each ``(start, end)`` span of ``tokens`` (end exclusive) by the next sentinel.

    Returns ``(inputs, targets)``: inputs keep the other tokens with one sentinel per span;
    targets list each sentinel followed by the tokens it replaced, then one final sentinel.
    Needs ``len(spans) + 1`` sentinels; spans must be sorted, non-empty and non-overlapping.
    """
    spans = [(int(s), int(e)) for s, e in spans]
    if len(sentinels) < len(spans) + 1:
        raise LmlabError(f"{len(spans)} spans need {len(spans) + 1} sentinel tokens, got {len(sentinels)}",
                         "add sentinel tokens (<extra_id_0>, ...) or corrupt fewer spans")
    prev = 0
    for s, e in spans:
        if not prev <= s < e <= len(tokens):
            raise LmlabError(f"span ({s}, {e}) is empty, overlaps another or lies outside the "
                             f"{len(tokens)} tokens", "give sorted, non-overlapping (start, end) pairs")
        prev = e
    inputs: list[T] = []
    targets: list[T] = []
    pos = 0
    for k, (s, e) in enumerate(spans):
        inputs += list(tokens[pos:s]) + [sentinels[k]]
        targets += [sentinels[k]] + list(tokens[s:e])
        pos = e
    inputs += list(tokens[pos:])
    targets.append(sentinels[len(spans)])
    return inputs, targets


def drop_spans(tokens: Sequence[T], spans: Sequence[tuple[int, int]]) -> tuple[list[T], list[T]]:
    """The "drop corrupted tokens" variant: inputs without the spans, targets = the dropped tokens."""
    keep = [True] * len(tokens)
    for s, e in spans:
        keep[s:e] = [False] * (e - s)
    return ([t for t, k in zip(tokens, keep) if k], [t for t, k in zip(tokens, keep) if not k])


def random_spans(length: int, noise_density: float, mean_span_length: float,
                 generator: torch.Generator) -> list[tuple[int, int]]:
    """T5's ``random_spans_noise_mask`` as ``(start, end)`` spans of a sequence of ``length``.

    Empty when ``length < 2`` (nothing can be both kept and corrupted).
    """
    if length < 2:
        return []
    num_noise = min(max(int(round(length * noise_density)), 1), length - 1)
    num_spans = max(int(round(num_noise / mean_span_length)), 1)
    num_spans = min(num_spans, num_noise, length - num_noise)
    noise_lengths = _random_segmentation(num_noise, num_spans, generator)
    keep_lengths = _random_segmentation(length - num_noise, num_spans, generator)
    spans, pos = [], 0
    for keep, noise in zip(keep_lengths, noise_lengths):
        pos += keep
        spans.append((pos, pos + noise))
        pos += noise
    return spans


def split_point(length: int, generator: torch.Generator) -> int:
    """Where prefix LM cuts a row of ``length`` tokens: uniform over ``1 .. length - 1`` (both parts
    non-empty; 1 for a row shorter than 2)."""
    if length < 2:
        return 1
    return 1 + int(torch.randint(length - 1, (1,), generator=generator, device=generator.device))


def _random_segmentation(num_items: int, num_segments: int, generator: torch.Generator) -> list[int]:
    """Cut ``num_items`` into ``num_segments`` non-empty parts at uniformly random points."""
    cuts = torch.randperm(num_items - 1, generator=generator, device=generator.device)[:num_segments - 1]
    bounds = [0] + sorted((cuts + 1).tolist()) + [num_items]
    return [b - a for a, b in zip(bounds, bounds[1:])]


def pad_rows(rows: list[list[int]], value: int, device) -> tuple[Tensor, Tensor]:
    """Right-pad ragged rows: ``(ids [B, L], mask [B, L])``. See :func:`padding_inputs`."""
    width = max(1, max(len(r) for r in rows))
    ids = torch.full((len(rows), width), value, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, :len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, :len(r)] = 1
    return ids.to(device), mask.to(device)


def padding_inputs(rows: list[list[int]], mask: Tensor) -> dict[str, Tensor]:
    """``{"attention_mask": mask}`` when the rows have different lengths, else nothing: decided
    from the host's lists, so the model neither builds a padding mask nor reads the device to
    find out that there is none."""
    return {"attention_mask": mask} if len({len(r) for r in rows}) > 1 else {}


def _check_sentinel_count(n) -> None:
    """Refuse, before the token list is made, a sentinel count that is no count or cannot fit."""
    check_sentinel_count(n, "objective.num_sentinels")


class SpanCorruption(Objective):
    """T5 span corruption for encoder-decoders (see the module docstring)."""

    name = "t5"
    architectures = ("seq2seq",)
    heads = ("lm",)
    loss_kind = "masked_nll"
    #: rows of data-dependent length built from host lists: run in the trainer's data path
    prepare_on_host = True
    #: accuracy on the target's content tokens (sentinels left out)
    signals = (("target_acc", "target_acc_guess", "most frequent token"),)

    #: only the ``spans`` variant puts sentinels in place of the spans
    only_when = {"num_sentinels": ("variant", "spans")}
    #: prefix_lm cuts each row at a uniform point (no noise); bert selects tokens by density alone
    param_rules = (
        Needs("noise_density", "variant", ("spans", "drop", "bert"), why="the share of tokens corrupted"),
        Needs("mean_span_length", "variant", ("spans", "drop"), why="the mean length of a noise span"),
    )

    @classmethod
    def added_tokens(cls, params: dict[str, Any]) -> int:
        return int(params.get("num_sentinels", 100)) if params.get("variant", "spans") == "spans" else 0

    @classmethod
    def step_flops(cls, model_config, seq_len: int, rows: int, params: dict[str, Any]) -> float:
        """Encoder over the corrupted source, decoder over the target, with the lengths span
        corruption gives on average (module docstring)."""
        from lmlab.models.flops import training_flops

        variant = params.get("variant", "spans")
        noise = max(1, round(seq_len * float(params.get("noise_density", 0.15))))
        spans = max(1, round(noise / float(params.get("mean_span_length", 3.0))))
        source = seq_len - noise + spans + 1  # kept tokens + one sentinel per span + </s>
        target = noise + spans + 1  # sentinels + dropped tokens + </s>
        if variant == "bert":
            source, target = seq_len + 1, seq_len + 1
        if variant == "prefix_lm":  # cut uniformly: half each on average
            source, target = seq_len // 2 + 1, seq_len - seq_len // 2 + 1
        return float(training_flops(model_config, source, rows, decoder_len=target))

    @classmethod
    def needed_roles(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """[PAD] of the targets; [MASK] for the ``bert`` variant."""
        return (*super().needed_roles(params), "pad", *(("mask",) if params["variant"] == "bert" else ()))

    @classmethod
    def check_params(cls, params: dict[str, Any], given=None) -> None:
        """The sentinels of the ``spans`` variant fit this machine and a tokenizer."""
        super().check_params(params, given)
        if params["variant"] == "spans":
            try:
                _check_sentinel_count(params["num_sentinels"])
            except LmlabError as e:
                raise LmlabError(e.problem, e.fix, setting="num_sentinels") from None

    def __init__(self, tokenizer, noise_density: PositiveProbability = 0.15,
                 mean_span_length: MeanSpanLength = 3.0, variant: Variant = "spans",
                 num_sentinels: Count = 100, add_eos: bool = True):
        p = SpanCorruption.checked({"noise_density": noise_density, "mean_span_length": mean_span_length,
                                    "variant": variant, "num_sentinels": num_sentinels, "add_eos": add_eos})
        noise_density, variant = float(p["noise_density"]), p["variant"]
        if variant == "spans":
            missing = [t for t in sentinel_tokens(num_sentinels) if t not in tokenizer.token_to_id]
            if missing:
                tokenizer.add_special_tokens(missing)
        super().__init__(tokenizer)  # after the sentinels: they are special tokens too
        self.variant, self.noise_density = variant, noise_density
        self.mean_span_length = float(mean_span_length)
        self.sentinel_ids = [tokenizer.token_to_id[t] for t in sentinel_tokens(num_sentinels)] \
            if variant == "spans" else []
        roles = self.require_roles(tokenizer, SpanCorruption.with_defaults(p))
        self.pad_id = roles["pad"]
        self.eos_id = tokenizer.eos_id if add_eos else None
        if variant == "bert":
            self.mask_id = roles["mask"]
            self.pool = replacement_pool(tokenizer)

    def document_spans(self, ids: Tensor, doc_ids: Tensor,
                       generator: torch.Generator) -> list[list[tuple[int, int]]]:
        """Noise spans of each row: T5's procedure run on every document segment of the row,
        then cut around special tokens (which are never corrupted)."""
        out = []
        special = special_mask(ids, self.special_ids).cpu().tolist()
        docs = doc_ids.cpu().tolist()
        for row_docs, row_special in zip(docs, special):
            spans, start, t = [], 0, len(row_docs)
            for i in range(1, t + 1):
                if i == t or row_docs[i] != row_docs[start]:
                    for s, e in random_spans(i - start, self.noise_density, self.mean_span_length, generator):
                        spans += _split_at(start + s, start + e, row_special)
                    start = i
            out.append(spans)
        return out

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        ids, device = batch.input_ids, batch.input_ids.device
        eos = [] if self.eos_id is None else [self.eos_id]
        if self.variant == "bert":
            selected = select_tokens(~special_mask(ids, self.special_ids), self.noise_density, generator)
            corrupted = replace_80_10_10(ids, selected, self.mask_id, self.pool, generator)
            sources = [r + eos for r in corrupted.tolist()]
            targets = [r + eos for r in ids.tolist()]
        elif self.variant == "prefix_lm":
            sources, targets = [], []
            for row in ids.tolist():
                cut = split_point(len(row), generator)
                sources.append(row[:cut] + eos)
                targets.append(row[cut:] + eos)
        else:
            sources, targets = [], []
            for row, spans in zip(ids.tolist(), self.document_spans(ids, batch.doc_ids, generator)):
                if self.variant == "spans":
                    if len(spans) + 1 > len(self.sentinel_ids):
                        raise LmlabError(f"a row needs {len(spans) + 1} sentinels but only "
                                         f"{len(self.sentinel_ids)} exist",
                                         "raise objective.num_sentinels or lower train.seq_len")
                    src, tgt = corrupt_spans(row, spans, self.sentinel_ids)
                else:
                    src, tgt = drop_spans(row, spans)
                sources.append(src + eos)
                targets.append(tgt + eos)
        input_ids, attention_mask = pad_rows(sources, self.pad_id, device)
        labels, label_mask = pad_rows(targets, self.pad_id, device)
        return {"input_ids": input_ids, **padding_inputs(sources, attention_mask),
                "labels": labels.masked_fill(label_mask == 0, IGNORE)}

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        out, loss = teacher_forced(model, inputs)
        with torch.no_grad():
            # the sentinels are scored by the loss but not by the signal: their order is fixed, so
            # predicting them is bookkeeping, not language (the first target token is always one)
            sentinels = torch.tensor(self.sentinel_ids, dtype=inputs["labels"].dtype,
                                     device=inputs["labels"].device)
            signal = token_signal(out.logits.detach(), inputs["labels"], "target", IGNORE,
                                  shown=torch.isin(inputs["labels"], sentinels))
        return loss, {**signal, "targets": (inputs["labels"] != IGNORE).sum()}


def _split_at(start: int, end: int, special: list[bool]) -> list[tuple[int, int]]:
    """The parts of span ``[start, end)`` that avoid special-token positions."""
    parts, s = [], None
    for i in range(start, end):
        if not special[i] and s is None:
            s = i
        if special[i] and s is not None:
            parts.append((s, i))
            s = None
    if s is not None:
        parts.append((s, end))
    return parts


__all__ = ["SpanCorruption", "corrupt_spans", "drop_spans", "random_spans", "split_point"]

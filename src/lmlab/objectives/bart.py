"""BART denoising (Lewis et al. 2020, §2.2 and Figure 2): corrupt the text, reconstruct it.

The encoder reads a noised document; the decoder reproduces the **original** (labels = the
original tokens, ``decoder_input_ids`` = labels shifted right, done by the model). Each noise is
a function of one token sequence and a generator, testable alone:

* :func:`token_masking` - each token becomes ``[MASK]`` with probability ``ratio`` (BERT-like).
* :func:`token_deletion` - each token is deleted with probability ``ratio``; the model must also
  find *where* text is missing.
* :func:`text_infilling` - span lengths are drawn from Poisson(λ = 3) until ``ratio`` of the
  tokens is covered; each span is replaced by **one** ``[MASK]`` (so the model must predict how
  many tokens are missing), and a 0-length span *inserts* a ``[MASK]``. :func:`infill_spans` does
  the replacement for given spans.
* :func:`sentence_permutation` - the document is split into sentences after sentence-final
  punctuation tokens (``.``, ``!``, ``?``) and the sentences are shuffled.
* :func:`document_rotation` - a token is chosen uniformly and the document rotated to start
  there; the model must find the true start.

``noise`` picks the combination, applied in this order: permutation, rotation, masking,
deletion, infilling. The default is BART's best, ``["sentence_permutation", "text_infilling"]``
(mask ratio 0.3, λ = 3). Special tokens are never masked, deleted or swallowed by a span.

Worked example (text infilling, spans (1, 2) and (4, 0))::

    original   A B C D E F
    spans      B C -> one mask; insertion before E
    input      A [MASK] D [MASK] E F
    labels     A B C D E F

Packed rows: every document segment of a row is noised on its own (sentences never move across
documents, rotation stays inside its document) and the noised segments are concatenated; the
row is one example and the target is the original row. Inputs are padded to the longest row.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.objectives.base import Objective, teacher_forced, token_signal
from lmlab.objectives.masking import IGNORE, poisson_lengths, rand, special_mask
from lmlab.objectives.t5 import pad_rows, padding_inputs
from lmlab.setting_rules import Needs
from lmlab.values import MeanLength, Probability, repeated

#: BART's best combination (Lewis et al. 2020, Table 1)
DEFAULT_NOISE = ("sentence_permutation", "text_infilling")
NOISES = ("sentence_permutation", "document_rotation", "token_masking", "token_deletion", "text_infilling")
SENTENCE_END = (".", "!", "?")


# ----------------------------------------------------------------------------- noise functions
def token_masking(tokens: Tensor, ratio: float, mask_id: int, protected: Tensor,
                  generator: torch.Generator) -> Tensor:
    """Replace each unprotected token by ``mask_id`` with probability ``ratio``."""
    hit = (rand(tokens.shape, generator, tokens.device) < ratio) & ~protected
    return tokens.masked_fill(hit, mask_id)


def token_deletion(tokens: Tensor, ratio: float, protected: Tensor, generator: torch.Generator) -> Tensor:
    """Delete each unprotected token with probability ``ratio``."""
    hit = (rand(tokens.shape, generator, tokens.device) < ratio) & ~protected
    return tokens[~hit]


def infill_spans(tokens: Tensor, spans: list[tuple[int, int]], mask_id: int) -> Tensor:
    """Replace each ``(start, length)`` span by one ``mask_id``; length 0 inserts a mask before
    ``start``. Overlapping or touching spans merge into one mask."""
    n = len(tokens)
    covered = [False] * n
    insert = [False] * (n + 1)
    for s, length in spans:
        if length == 0:
            insert[s] = True
        for i in range(s, min(s + length, n)):
            covered[i] = True
    out, values = [], tokens.tolist()
    for i in range(n + 1):
        if insert[i] and not (i < n and covered[i]) and not (i > 0 and covered[i - 1]):
            out.append(mask_id)
        if i == n:
            break
        if covered[i]:
            if i == 0 or not covered[i - 1]:
                out.append(mask_id)
        else:
            out.append(values[i])
    return torch.tensor(out, dtype=tokens.dtype, device=tokens.device)


def text_infilling(tokens: Tensor, ratio: float, lam: float, mask_id: int, protected: Tensor,
                   generator: torch.Generator) -> Tensor:
    """BART text infilling: Poisson(λ) spans covering ``ratio`` of the tokens, one mask each.

    Span lengths are drawn until they sum to ``ceil(ratio · n)`` (the last one trimmed); each span
    starts at a distinct random position; a span stops before a protected token.
    """
    n = len(tokens)
    budget = math.ceil(ratio * n)
    if n == 0 or budget == 0:
        return tokens
    lengths: list[int] = []
    while sum(lengths) < budget:
        lengths += poisson_lengths(max(4, budget // max(1, int(lam))), lam, generator).tolist()
    total, trimmed = 0, []
    for length in lengths:
        if total >= budget:
            break
        trimmed.append(min(length, budget - total))
        total += trimmed[-1]
    starts = torch.randperm(n, generator=generator, device=generator.device)[:len(trimmed)].tolist()
    prot = protected.tolist()
    spans = []
    for s, length in zip(starts, trimmed):
        if prot[s]:
            continue
        end = s
        while end < min(s + length, n) and not prot[end]:
            end += 1
        spans.append((s, end - s))
    return infill_spans(tokens, spans, mask_id)


def sentence_permutation(tokens: Tensor, sentence_end: Tensor, generator: torch.Generator) -> Tensor:
    """Shuffle the sentences (a sentence ends after each ``sentence_end`` token, and at the end)."""
    ends = (torch.nonzero(sentence_end[:-1]).flatten() + 1).tolist()
    bounds = [0] + ends + [len(tokens)]
    pieces = [tokens[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    if len(pieces) < 2:
        return tokens
    order = torch.randperm(len(pieces), generator=generator, device=generator.device).tolist()
    return torch.cat([pieces[i] for i in order])


def document_rotation(tokens: Tensor, generator: torch.Generator) -> Tensor:
    """Rotate so the document starts at a uniformly chosen token."""
    if len(tokens) < 2:
        return tokens
    start = int(torch.randint(len(tokens), (1,), generator=generator, device=generator.device))
    return torch.cat((tokens[start:], tokens[:start]))


def sentence_end_table(tokenizer) -> Tensor:
    """Per vocabulary id: does the token end a sentence (its text ends with ``.``, ``!`` or ``?``)?

    The text is read without the tokenizer's word markers (``##``, ``▁``, ``Ġ``, trailing ``_``).
    """
    table = torch.zeros(tokenizer.vocab_size, dtype=torch.bool)
    special = tokenizer.special_ids
    for i, t in enumerate(tokenizer.vocab):
        if i in special:
            continue
        t = t.removeprefix("##").replace("\u2581", "").replace("\u0120", "")
        if tokenizer.algo == "bpe":
            t = t.removesuffix("_")
        table[i] = t.rstrip("\"')\u201d\u2019").endswith(SENTENCE_END)
    return table


# ----------------------------------------------------------------------------- the objective
def _needs_noise(param: str, noises: tuple[str, ...], why: str) -> Needs:
    """``param`` does something only when ``noise`` holds one of ``noises``."""
    def holds(noise) -> bool:
        return bool(set([noise] if isinstance(noise, str) else noise or ()) & set(noises))

    wanted = " or ".join(f'"{n}"' for n in noises)
    return Needs(param, "noise", holds, shown=f"objective.noise holding {wanted}", why=why, verb="use")


class BartDenoising(Objective):
    """BART's denoising autoencoder for encoder-decoders (see the module docstring)."""

    name = "bart"
    architectures = ("seq2seq",)
    heads = ("lm",)
    loss_kind = "masked_nll"
    #: rows of data-dependent length built from host lists: run in the trainer's data path
    prepare_on_host = True
    signals = (("target_acc", "target_acc_guess", "most frequent token"),)
    #: each ratio is read by some noises only (:meth:`noise_document`)
    param_rules = (
        _needs_noise("mask_ratio", ("text_infilling", "token_masking"), "the share of tokens masked"),
        _needs_noise("delete_ratio", ("token_deletion",), "the share of tokens deleted"),
        _needs_noise("poisson_lambda", ("text_infilling",), "the mean length of an infilled span"),
    )

    @classmethod
    def needed_roles(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """[MASK] of the infilled spans, [PAD] of the rows."""
        return (*super().needed_roles(params), "mask", "pad")

    @classmethod
    def check_params(cls, params: dict[str, Any], given=None) -> None:
        """At least one noise, each a known one, each once; then the rules of the ratios each
        noise reads (:attr:`param_rules`)."""
        noise = params["noise"]
        noise = [noise] if isinstance(noise, str) else list(noise)
        if not noise:
            raise LmlabError("objective.noise is empty: BART needs at least one noise",
                             f"choose one or more of: {', '.join(NOISES)}", setting="noise")
        bad = [n for n in noise if n not in NOISES]
        if bad:
            raise LmlabError(f"objective.noise has unknown BART noise {bad!r}",
                             f"choose one or more of: {', '.join(NOISES)}", setting="noise")
        twice = repeated(noise)
        if twice is not None:  # each noise runs once, in a fixed order: a repeat would be dropped
            raise LmlabError(f"objective.noise names {twice!r} more than once",
                             f"give each noise once, e.g. {sorted(set(noise))!r}", setting="noise")
        super().check_params(params, given)

    def __init__(self, tokenizer, noise: list[str] | tuple[str, ...] | str = DEFAULT_NOISE,
                 mask_ratio: Probability = 0.3, delete_ratio: Probability = 0.15,
                 poisson_lambda: MeanLength = 3.0):
        super().__init__(tokenizer)
        p = BartDenoising.checked({"noise": [noise] if isinstance(noise, str) else noise,
                                   "mask_ratio": mask_ratio, "delete_ratio": delete_ratio,
                                   "poisson_lambda": poisson_lambda})
        self.noise = [n for n in NOISES if n in p["noise"]]  # the fixed order
        self.mask_ratio, self.delete_ratio = float(p["mask_ratio"]), float(p["delete_ratio"])
        self.poisson_lambda = float(p["poisson_lambda"])
        roles = self.require_roles(tokenizer, BartDenoising.with_defaults(p))
        self.mask_id, self.pad_id = roles["mask"], roles["pad"]
        self.sentence_end = sentence_end_table(tokenizer)

    def noise_document(self, tokens: Tensor, generator: torch.Generator) -> Tensor:
        """Apply the configured noise functions, in order, to one document's tokens."""
        for name in self.noise:
            protected = special_mask(tokens, self.special_ids)
            if name == "sentence_permutation":
                tokens = sentence_permutation(tokens, self.sentence_end.to(tokens.device)[tokens], generator)
            elif name == "document_rotation":
                tokens = document_rotation(tokens, generator)
            elif name == "token_masking":
                tokens = token_masking(tokens, self.mask_ratio, self.mask_id, protected, generator)
            elif name == "token_deletion":
                tokens = token_deletion(tokens, self.delete_ratio, protected, generator)
            else:
                tokens = text_infilling(tokens, self.mask_ratio, self.poisson_lambda, self.mask_id, protected,
                                        generator)
        return tokens

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        ids = batch.input_ids.cpu()
        docs = batch.doc_ids.cpu()
        sources = []
        for row, row_docs in zip(ids, docs):
            cuts = [0] + (torch.nonzero(row_docs[1:] != row_docs[:-1]).flatten() + 1).tolist() + [len(row)]
            noised = [self.noise_document(row[a:b], generator) for a, b in zip(cuts, cuts[1:])]
            sources.append(torch.cat(noised).tolist())
        input_ids, attention_mask = pad_rows(sources, self.pad_id, batch.input_ids.device)
        return {"input_ids": input_ids, **padding_inputs(sources, attention_mask), "labels": batch.input_ids}

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        out, loss = teacher_forced(model, inputs)
        with torch.no_grad():
            signal = token_signal(out.logits.detach(), inputs["labels"], "target", IGNORE)
        return loss, {**signal, "targets": (inputs["labels"] != IGNORE).sum()}

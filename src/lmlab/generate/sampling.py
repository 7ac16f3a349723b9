"""Logits processors: the small functions that reshape next-token scores before a token is chosen.

Each processor is a callable ``(sequences [N, T], scores [N, V]) -> scores [N, V]``, where
``sequences`` are the tokens so far (the prompt and what was generated; for an encoder-decoder
the decoder tokens). Tokens a processor rules out get ``-inf``. They follow the definitions of the
Hugging Face ``transformers`` processors of the same names, so results can be compared one to one:

* repetition penalty (Keskar et al. 2019, CTRL): every token already in ``sequences`` has its
  score divided by ``penalty`` when positive and multiplied by it when negative (each token
  once, however often it occurred); ``penalty > 1`` discourages repeats.
* temperature: ``scores / T``; ``T < 1`` sharpens the distribution, ``T > 1`` flattens it.
* top-k (Fan et al. 2018): keep the ``k`` highest scores (and any tied with the k-th).
* top-p / nucleus (Holtzman et al. 2020): keep the smallest set of most likely tokens whose
  probability adds up to at least ``p``.

Extra processors (e.g. a JSON-schema constraint) have the same signature and are passed to
:func:`lmlab.generate.generate` as ``logits_processors``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from lmlab import values
from lmlab.arguments import number_argument, optional_number
from lmlab.errors import LmlabError

LogitsProcessor = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def repetition_penalty(sequences: torch.Tensor, scores: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL repetition penalty on the tokens present in ``sequences`` (see the module docstring)."""
    seen = scores.gather(1, sequences)
    seen = torch.where(seen < 0, seen * penalty, seen / penalty)
    return scores.scatter(1, sequences, seen)


def temperature(scores: torch.Tensor, t: float) -> torch.Tensor:
    """Divide the scores by the temperature ``t``."""
    return scores / t


def top_k(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` best scores per row (ties with the k-th are kept); the rest become -inf."""
    k = min(k, scores.shape[-1])
    kth = torch.topk(scores, k, dim=-1).values[..., -1:]
    return scores.masked_fill(scores < kth, float("-inf"))


def top_p(scores: torch.Tensor, p: float) -> torch.Tensor:
    """Nucleus filtering: keep the smallest most-likely set with probability mass >= ``p``.

    Sort descending; a token is dropped when the tokens ranked above it already reach ``p``.
    The most likely token is always kept.
    """
    sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
    probs = sorted_scores.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs
    drop_sorted = mass_before >= p
    drop_sorted[..., 0] = False
    drop = drop_sorted.scatter(-1, order, drop_sorted)
    return scores.masked_fill(drop, float("-inf"))


def check_sampling_options(temperature_: float, top_k_: int | None, top_p_: float | None,
                           penalty: float, do_sample: bool = True) -> None:
    """One-line errors for impossible settings, each range the one its flag of ``lmlab generate``
    has (:mod:`lmlab.values`); ``temperature`` 0 (greedy) only when not sampling."""
    number_argument(values.SamplingTemperature, temperature_, "temperature")
    if do_sample and not temperature_ > 0:
        raise LmlabError(f"temperature must be > 0 when sampling, got {temperature_}",
                         "use greedy decoding (do_sample=False / --temperature 0) for the most likely tokens")
    optional_number(values.Count, top_k_, "top_k")
    optional_number(values.TopP, top_p_, "top_p")
    number_argument(values.Penalty, penalty, "repetition_penalty")


def build_processors(*, do_sample: bool, temperature_: float = 1.0, top_k_: int | None = None,
                     top_p_: float | None = None, penalty: float = 1.0,
                     extra: Sequence[LogitsProcessor] = ()) -> list[LogitsProcessor]:
    """The processor chain, in the order transformers applies it.

    Repetition penalty and ``extra`` processors always apply; temperature, top-k and top-p only
    when sampling (greedy and beam search pick the best scores, which they would not change).
    """
    procs: list[LogitsProcessor] = []
    if penalty != 1.0:
        procs.append(lambda seq, s: repetition_penalty(seq, s, penalty))
    procs.extend(extra)
    if do_sample:
        if temperature_ != 1.0:
            procs.append(lambda seq, s: temperature(s, temperature_))
        if top_k_ is not None:
            procs.append(lambda seq, s: top_k(s, top_k_))
        if top_p_ is not None and top_p_ < 1.0:
            procs.append(lambda seq, s: top_p(s, top_p_))
    return procs


def apply_processors(procs: Sequence[LogitsProcessor], sequences: torch.Tensor,
                     scores: torch.Tensor) -> torch.Tensor:
    """Run ``procs`` in order."""
    for proc in procs:
        scores = proc(sequences, scores)
    return scores


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """Draw one token per row of ``probs [N, V]`` by inverting the cumulative distribution.

    One uniform number per row comes from ``generator`` (seeded: reproducible), and the token is
    the first whose cumulative probability exceeds it.
    """
    cdf = probs.cumsum(dim=-1)
    u = torch.rand(probs.shape[0], 1, generator=generator, device=probs.device, dtype=cdf.dtype) * cdf[:, -1:]
    return (cdf <= u).sum(dim=-1).clamp(max=probs.shape[-1] - 1)

"""Compute-optimal sizing: how large a model, trained on how many tokens, for a FLOPs budget.

The rule (Kaplan et al. 2020, §2.1; Hoffmann et al. 2022, "Training compute-optimal large
language models", the Chinchilla paper): training a model of ``N`` parameters on ``D`` tokens
costs ``C ≈ 6·N·D`` FLOPs (2 per parameter per token forward, 4 backward). Chinchilla found that
for a fixed ``C`` loss is lowest when ``N`` and ``D`` grow together, at about ``r = 20`` tokens per
parameter (their Table 3). With ``D = r·N``::

    C = 6·N·(r·N)  =>  N = sqrt(C / (6·r)),  D = r·N = sqrt(C·r / 6)

e.g. ``C = 1.2e17`` and ``r = 20``: ``N = sqrt(1e15) ≈ 31.6 M`` parameters, ``D ≈ 632 M`` tokens.

Then a concrete shape: the family's aspect ratio ``d_model / n_layers`` (64 for the ``-base``
presets: 768 / 12; Kaplan §3.1 found loss flat over a wide range of it), heads of 64 dimensions
(4 heads below ``d_model`` 256, as the tiny and small presets), the family's ``d_ff / d_model``;
among those shapes the one whose parameter count (``lmlab.models.flops.count_parameters``, the
same number as ``build_model(...).num_parameters()``) is closest to ``N`` (a small penalty keeps
the aspect ratio near the family's). Chinchilla counts every parameter, embeddings included;
``count="non-embedding"`` matches Kaplan's ``N`` instead.

The 6·N·D rule leaves out attention's ``q·kᵀ`` and ``p·v`` products, about ``12·L·T·d`` FLOPs
per token for ``L`` layers, context ``T``, width ``d`` (Kaplan, Table 1), and it counts the
embedding look-ups as if they were matmuls. :func:`plan` therefore also reports the shape's
exact training FLOPs from :func:`lmlab.models.flops.training_flops` with and without attention,
and the number of tokens that spends exactly ``C`` with that shape.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from lmlab.errors import LmlabError

if TYPE_CHECKING:  # the models (and torch) are imported when a plan is made, not to read ARCHS
    from lmlab.models.config import TransformerConfig

__all__ = ["ARCHS", "Plan", "compute_optimal", "model_shape", "plan"]

#: families a plan can size (ALBERT shares one layer's weights, so depth does not add parameters);
#: written out for ``lmlab scale --help``, the same as the families' ``SPEC.plan.families``
ARCHS = ("gpt2", "llama", "bert", "roberta", "electra", "t5", "bart")
COUNTS = ("total", "non-embedding")


def compute_optimal(flops: float, tokens_per_param: float = 20.0) -> tuple[float, float]:
    """``(N, D)`` with ``6·N·D = flops`` and ``D = tokens_per_param · N`` (Chinchilla)."""
    from lmlab import values
    from lmlab.arguments import number_argument

    flops = number_argument(values.Flops, flops, "compute_optimal's flops")
    tokens_per_param = number_argument(values.Ratio, tokens_per_param, "compute_optimal's tokens_per_param")
    n = math.sqrt(flops / (6.0 * tokens_per_param))
    return n, tokens_per_param * n


def check_budget_buys_a_model(flops: float, n: float, tokens_per_param: float, smallest) -> None:
    """The budget's compute-optimal ``n`` parameters must reach the smallest shape the planner
    builds (``smallest``: one layer of width 16), counted without its embeddings (a vocabulary too
    large for the budget is a note of the plan, not an error): below that there is no model to plan
    (``--flops 1`` would buy 0.09 parameters)."""
    from lmlab.models.flops import count_parameters

    least = count_parameters(smallest).non_embedding
    if n >= least:
        return
    need = 6.0 * tokens_per_param * least**2  # the budget whose compute-optimal N is that shape
    step = 10.0 ** (math.floor(math.log10(need)) - 1)
    bought = f"{n:,.0f}" if n >= 1 else f"{n:.2g}"
    raise LmlabError(f"--flops {_e(flops)} buys a compute-optimal model of {bought} parameters, fewer than "
                     f"the smallest {smallest.family} shape has besides its embeddings ({least:,}: one layer "
                     f"of width 16)", f"use --flops {_e(math.ceil(need / step) * step)} or more")


def _e(x: float) -> str:
    """``x`` as a command line writes it: ``1e9``, ``1.4e9``, ``3e-05`` -> ``3e-5``, ``12``."""
    return f"{x:.3g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


@dataclass(frozen=True)
class Plan:
    """A compute-optimal plan and the concrete shape chosen for it (all FLOPs for training)."""

    flops: float  # the budget C
    tokens_per_param: float
    n_params: float  # N = sqrt(C / (6 r))
    n_tokens: float  # D = r N
    count: str  # which parameters N counts: total | non-embedding
    arch: str
    config: TransformerConfig  # the shape (vocabulary and context included)
    seq_len: int
    shape_params: int  # the shape's parameters, counted as ``count`` says
    total_params: int
    embedding_params: int
    approx_flops: float  # 6·N'·D + 12·L·T·d·D for the shape's matmul parameters N'
    matmul_flops: float  # exact, attention products left out
    exact_flops: float  # exact, attention included
    tokens_for_budget: float  # tokens that spend exactly C with this shape

    @property
    def attention_flops(self) -> float:
        return self.exact_flops - self.matmul_flops

    def to_dict(self) -> dict:
        c = self.config
        return {
            "flops": self.flops,
            "tokens_per_param": self.tokens_per_param,
            "n_params": self.n_params,
            "n_tokens": self.n_tokens,
            "count": self.count,
            "arch": self.arch,
            "shape": {
                "d_model": c.d_model,
                "n_layers": c.n_layers,
                "n_heads": c.n_heads,
                "n_kv_heads": c.kv_heads,
                "d_ff": c.d_ff,
                "vocab_size": c.vocab_size,
                "seq_len": self.seq_len,
            },
            "shape_params": self.shape_params,
            "total_params": self.total_params,
            "embedding_params": self.embedding_params,
            "approx_flops": self.approx_flops,
            "matmul_flops": self.matmul_flops,
            "attention_flops": self.attention_flops,
            "exact_flops": self.exact_flops,
            "tokens_for_budget": self.tokens_for_budget,
        }


def _family_base(arch: str) -> TransformerConfig:
    if arch not in ARCHS:
        extra = " (ALBERT shares its layers, so depth adds no parameters)" if arch == "albert" else ""
        raise LmlabError(
            f"cannot plan a shape for arch {arch!r}{extra}", f"choose one of: {', '.join(ARCHS)}"
        )
    return _base_preset(arch).replace()


@functools.cache
def _base_preset(arch: str) -> TransformerConfig:
    from lmlab.models import get_preset

    return get_preset(f"{arch}-base")


def _heads(d_model: int, head_dim: int) -> int:
    """64-dimensional heads from d_model 256 up, else 4 heads (the tiny and small presets)."""
    return d_model // head_dim if d_model >= 4 * head_dim else 4


def _widths(lo: float, hi: float, head_dim: int) -> list[int]:
    """Candidate d_model values in [lo, hi]: multiples of 16 below 4 heads of ``head_dim``, then of it."""
    small = range(16, 4 * head_dim, 16)
    large = range(4 * head_dim, int(hi) + head_dim + 1, head_dim)
    return [d for d in (*small, *large) if lo <= d <= hi]


def _divisor_at_most(n: int, k: int) -> int:
    return max(d for d in range(1, n + 1) if n % d == 0 and d <= max(1, k))


def _shapes_of_depth(arch: str, widths: list[int], n_layers: int, vocab: int, context: int, head_dim: int,
                     count: str):
    """``shape(i)``: the config at ``widths[i]`` and ``n_layers``, and its parameter count, each made once."""
    import functools

    @functools.cache
    def shape(i: int) -> tuple[TransformerConfig, int]:
        cfg = model_shape(arch, widths[i], n_layers, vocab, context, head_dim)
        return cfg, _count(cfg, count)

    return shape


def _candidates(widths: list[int], n: float, aspect_width: float, params) -> list[int]:
    """The indices of ``widths`` (ascending) where a shape of one depth can cost least: the cost
    (:func:`plan`) adds how far its parameters ``params(i)`` (growing with the width) are from ``n``
    to a tenth of how far its width is from ``aspect_width``, both on a log scale, so its least is
    beside the width whose count crosses ``n`` (found by bisection), beside the aspect's width, or
    at an end: a few shapes counted a depth instead of every width (``--flops 1e25`` counted tens of
    thousands of shapes)."""
    if not widths:
        return []
    lo, hi = 0, len(widths)
    while lo < hi:  # the first width whose count reaches n
        mid = (lo + hi) // 2
        if params(mid) >= n:
            hi = mid
        else:
            lo = mid + 1
    near = min(range(len(widths)), key=lambda i: abs(math.log(widths[i] / aspect_width)))
    picks = {0, len(widths) - 1, *range(lo - 2, lo + 3), *range(near - 2, near + 3)}
    return sorted(i for i in picks if 0 <= i < len(widths))


def model_shape(
    arch: str,
    d_model: int,
    n_layers: int,
    vocab_size: int | None = None,
    seq_len: int | None = None,
    head_dim: int = 64,
) -> TransformerConfig:
    """The ``arch`` family's config at width ``d_model`` and depth ``n_layers``.

    Heads as :func:`_heads`, ``d_ff`` at the family's ratio (4 x; Llama's SwiGLU 8/3 x, rounded
    to 16), grouped key/value heads at the family's ratio, learned positions sized to ``seq_len``.
    """
    base = _family_base(arch)
    h = _heads(d_model, head_dim)
    if d_model % h:
        raise LmlabError(f"d_model {d_model} is not a multiple of {h} heads", f"use a multiple of {head_dim}")
    d_ff = max(16, round(base.d_ff / base.d_model * d_model / 16) * 16)
    changes: dict = {"d_model": d_model, "n_layers": n_layers, "n_heads": h, "d_ff": d_ff}
    if base.n_kv_heads is not None:
        changes["n_kv_heads"] = _divisor_at_most(h, round(h * base.n_kv_heads / base.n_heads))
    if vocab_size is not None:
        changes["vocab_size"] = vocab_size
        for special in ("pad_token_id", "bos_token_id", "eos_token_id"):
            v = getattr(base, special, None)
            if isinstance(v, int) and v >= vocab_size:
                changes[special] = None
    if seq_len is not None and base.positions == "learned":
        changes["max_positions"] = seq_len
    return base.replace(**{**changes, **_hooks(base).resize(base, changes)})


def _hooks(cfg: TransformerConfig):
    """What the config's family (its spec, lmlab.models.family) tells the planner."""
    from lmlab.models.registry import spec_of_config

    return spec_of_config(cfg).plan


def _count(cfg: TransformerConfig, count: str) -> int:
    from lmlab.models.flops import count_parameters

    pc = count_parameters(cfg)
    return pc.total if count == "total" else pc.non_embedding


def _flops_per_token(cfg: TransformerConfig, seq_len: int, attention: bool) -> float:
    """Exact training FLOPs per token, as the family's spec counts them (encoder-decoders read
    ``seq_len`` source tokens and write ``seq_len`` target tokens, both count as tokens; MLM
    encoders project to the vocabulary only at the masked 15%)."""
    return _hooks(cfg).flops_per_token(cfg, seq_len, attention)


def plan(
    flops: float,
    arch: str = "gpt2",
    tokens_per_param: float = 20.0,
    vocab_size: int | None = None,
    seq_len: int | None = None,
    aspect_ratio: float | None = None,
    count: str = "total",
) -> Plan:
    """Compute-optimal ``N``, ``D`` for ``flops`` and the ``arch`` shape whose count is closest to ``N``.

    ``vocab_size`` and ``seq_len`` default to the family's ``-base`` preset (its vocabulary and
    context); ``aspect_ratio`` (``d_model / n_layers``) to that preset's (64, BART 128).
    """
    from lmlab import values
    from lmlab.arguments import number_argument, optional_number
    from lmlab.models.flops import approx_training_flops, count_parameters

    flops = number_argument(values.Flops, flops, "plan's flops")
    tokens_per_param = number_argument(values.Ratio, tokens_per_param, "plan's tokens_per_param")
    vocab_size = optional_number(values.VocabSize, vocab_size, "plan's vocab_size")
    seq_len = optional_number(values.Count, seq_len, "plan's seq_len")
    aspect_ratio = optional_number(values.Ratio, aspect_ratio, "plan's aspect_ratio")
    if count not in COUNTS:
        raise LmlabError(f"unknown parameter count {count!r}", f"choose one of: {', '.join(COUNTS)}")
    n, d_tokens = compute_optimal(flops, tokens_per_param)
    base = _family_base(arch)
    vocab = base.vocab_size if vocab_size is None else vocab_size
    context = base.max_positions if seq_len is None else seq_len
    if vocab < 2 or context < 1:
        raise LmlabError(
            f"vocab_size {vocab} and seq_len {context} must be at least 2 and 1",
            "pass e.g. --vocab-size 8000 --seq-len 512",
        )
    aspect = base.d_model / base.n_layers if aspect_ratio is None else aspect_ratio
    head_dim = base.d_model // base.n_heads
    narrowest = model_shape(arch, 16, 1, vocab, context, head_dim)  # the smallest model a shape can be
    check_budget_buys_a_model(flops, n, tokens_per_param, narrowest)

    grouped = base.n_kv_heads is not None
    best, best_cost = None, math.inf
    for n_layers in range(1, 257):
        widths = _widths(aspect * n_layers / 2, aspect * n_layers * 2, head_dim)
        shape = _shapes_of_depth(arch, widths, n_layers, vocab, context, head_dim, count)
        # grouped key/value heads make the count dip at some widths (a prime head count gets one
        # key/value head): there every width is counted, elsewhere the count grows with the width
        picks = range(len(widths)) if grouped else \
            _candidates(widths, n, n_layers * aspect, lambda i, shape=shape: shape(i)[1])
        for i in picks:
            cfg, p = shape(i)
            cost = abs(math.log(max(p, 1) / n)) + 0.1 * abs(math.log(widths[i] / n_layers / aspect))
            if cost < best_cost:
                best, best_cost = cfg, cost
        smallest = min((shape(i)[1] for i in picks), default=None) if grouped else \
            (shape(0)[1] if widths else None)
        if best is not None and smallest is not None and smallest > 4 * n:
            break  # deeper shapes only grow
    if best is None:  # aspect ratio so small that no width fits: the narrowest one-layer model
        best = narrowest

    pc = count_parameters(best)
    matmul = _flops_per_token(best, context, attention=False)
    exact = _flops_per_token(best, context, attention=True)
    n_matmul = matmul / 6.0  # parameters a token passes through (non-embedding, plus the output head)
    return Plan(
        flops=float(flops),
        tokens_per_param=float(tokens_per_param),
        n_params=n,
        n_tokens=d_tokens,
        count=count,
        arch=arch,
        config=best,
        seq_len=context,
        shape_params=_count(best, count),
        total_params=pc.total,
        embedding_params=pc.embedding,
        approx_flops=approx_training_flops(n_matmul, d_tokens, best.n_layers, context, best.d_model),
        matmul_flops=matmul * d_tokens,
        exact_flops=exact * d_tokens,
        tokens_for_budget=flops / exact,
    )

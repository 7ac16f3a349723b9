"""What a model is, without its weights: :class:`ModelFacts` (architecture, family, heads, config).

A command that needs a particular kind of model (``generate``: a language-model head; ``probe
fill-mask``: an MLM head...) or a length the model can take (``--max-length``) asks these facts,
which :func:`lmlab.loading.model_facts` reads from a model directory's config files before any
weight is loaded, and :func:`facts_of` takes from a model already in memory; so the same check
(:func:`lmlab.models.heads.require_head`, :func:`lmlab.models.config.max_length_for`) answers
for both, and a wrong model is one line before any work.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelFacts:
    """``architecture`` (``decoder``, ``encoder``, ``seq2seq``, ``rnn``...), ``family`` (``gpt2``,
    ``bert``...), ``heads`` (the first is the one whose scores are the model's ``logits``; empty:
    none, the bare network, or a model that is its own output layer like the LSTM LM; None: a
    model from outside lmlab that does not say) and the typed model ``config``."""

    architecture: str
    family: str
    heads: tuple[str, ...] | None
    config: Any


def facts_of(model) -> ModelFacts:
    """The facts of ``model`` (a loaded model, or :class:`ModelFacts` already)."""
    if isinstance(model, ModelFacts):
        return model
    config = getattr(model, "config", None)
    arch = getattr(model, "architecture", "") or ""
    family = getattr(config, "family", "") or arch or type(model).__name__
    heads = getattr(model, "head_names", None)
    return ModelFacts(arch, family, None if heads is None else tuple(heads), config)

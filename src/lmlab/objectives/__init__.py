"""Pretraining objectives: each turns packed token windows into model inputs and labels.

``OBJECTIVES`` maps a name to ``"module:Class"``; adding an objective is one module plus one line.
``get_objective(name)`` returns the class, with a one-line error listing the valid names.
"""

from __future__ import annotations

import importlib

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.objectives.base import Objective

OBJECTIVES: dict[str, str] = {
    "clm": "lmlab.objectives.clm:CausalLM",
    "mlm": "lmlab.objectives.mlm:MaskedLM",
    "nsp": "lmlab.objectives.nsp:NextSentencePrediction",
    "spanbert": "lmlab.objectives.spans:SpanBERT",
    "electra": "lmlab.objectives.electra:Electra",
    "t5": "lmlab.objectives.t5:SpanCorruption",
    "bart": "lmlab.objectives.bart:BartDenoising",
    "prefix_lm": "lmlab.objectives.prefix_lm:PrefixLM",
    "unilm": "lmlab.objectives.unilm:UniLM",
    "xlnet": "lmlab.objectives.xlnet:PermutationLM",
    "transfo-xl": "lmlab.objectives.transformer_xl:SegmentRecurrentLM",
    "elmo": "lmlab.objectives.elmo:BiLMObjective",
}

__all__ = ["OBJECTIVES", "Objective", "TokenBatch", "get_objective"]


def get_objective(name: str) -> type[Objective]:
    """The objective class registered as ``name`` (:data:`OBJECTIVES`)."""
    if not isinstance(name, str):
        raise LmlabError(f"get_objective's name must be an objective name, got {type(name).__name__} "
                         f"{name!r}",
                         f"choose one of: {', '.join(OBJECTIVES)}")
    if name not in OBJECTIVES:
        import difflib

        close = difflib.get_close_matches(name, list(OBJECTIVES), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise LmlabError(f"unknown objective {name!r}", f"{hint}choose one of: {', '.join(OBJECTIVES)}")
    module, cls = OBJECTIVES[name].split(":")
    return getattr(importlib.import_module(module), cls)

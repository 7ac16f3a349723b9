"""Transformer-XL: a segment-recurrent decoder with relative positional encoding.

``config.py`` holds TransfoXLConfig (``mem_len``) and the ``transfo-xl-tiny`` preset, ``model.py``
the recurrent model with its memory; ``SPEC`` registers the family as ``transfo-xl``.
"""

from lmlab.models.family import FamilySpec
from lmlab.models.transformer_xl.config import TransfoXLConfig, transfo_xl_tiny
from lmlab.models.transformer_xl.model import Memory, RelativeAttention, TransfoXLBlock, TransfoXLModel

SPEC = FamilySpec("transfo-xl", TransfoXLConfig, {"transfo-xl-tiny": transfo_xl_tiny}, TransfoXLModel,
                  heads=("lm",))

__all__ = ["SPEC", "Memory", "RelativeAttention", "TransfoXLBlock", "TransfoXLConfig", "TransfoXLModel",
           "transfo_xl_tiny"]

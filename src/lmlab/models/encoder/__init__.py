"""Bidirectional Transformer encoders: BERT, RoBERTa, ALBERT, ELECTRA (one class, four configs).

The family's folder: ``config.py`` (EncoderConfig and the bert/roberta/albert/electra presets),
``model.py`` (EncoderModel), ``flops.py`` (counts, and what the scaling planner asks) and
``hf.py`` (transformers' Bert/Roberta/Albert/Electra classes both ways); ``SPEC`` names them.
"""

from lmlab.models.encoder import flops
from lmlab.models.encoder.config import PRESETS, EncoderConfig
from lmlab.models.encoder.model import (  # noqa: F401
    DEFAULT_HEADS,
    FIRST_TOKEN_HEADS,
    EncoderEmbeddings,
    EncoderModel,
    _pop_head_labels,
)
from lmlab.models.family import FamilySpec, PlanHooks
from lmlab.models.heads import ENCODER_HEADS

SPEC = FamilySpec(
    "encoder", EncoderConfig, PRESETS, EncoderModel, ENCODER_HEADS, ("bert", "roberta", "albert", "electra"),
    pretraining_heads=flops.pretraining_heads, count_parameters=flops.count_parameters,
    forward_flops=flops.forward_flops, hf="lmlab.models.encoder.hf",
    plan=PlanHooks(("bert", "roberta", "electra"), flops.resize, flops.flops_per_token),  # not ALBERT
)

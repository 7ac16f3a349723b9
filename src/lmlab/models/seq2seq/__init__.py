"""Encoder-decoder Transformers: the T5 and BART families, assembled from ``models/blocks.py``.

Seq2SeqConfig with its t5/bart presets, Seq2SeqModel, the FLOP counts of both stacks (a row is
read and written, so its tokens count twice) and the T5/BART converters; ``SPEC`` names them.
"""

from lmlab.models.family import FamilySpec, PlanHooks
from lmlab.models.seq2seq import flops
from lmlab.models.seq2seq.config import PRESETS, Seq2SeqConfig
from lmlab.models.seq2seq.model import (  # noqa: F401
    _SHARED_LAYER_PARTS,
    Seq2SeqCache,
    Seq2SeqModel,
    Seq2SeqStack,
    _encoder_tensor,
    shift_right,
)

SPEC = FamilySpec("seq2seq", Seq2SeqConfig, PRESETS, Seq2SeqModel, ("lm",), ("t5", "bart"),
                  count_parameters=flops.count_parameters, forward_flops=flops.forward_flops,
                  plan=PlanHooks(("t5", "bart"), flops.resize, flops.flops_per_token),
                  hf="lmlab.models.seq2seq.hf")

"""Causal Transformer decoders: GPT-2 and Llama (one class, two configs).

Here: the config with the gpt2 and llama presets, DecoderModel, its counts and planner hooks,
and the conversion from and to transformers' GPT2LMHeadModel and LlamaForCausalLM; ``SPEC``
names them for the registry.
"""

from lmlab.models.decoder import flops
from lmlab.models.decoder.config import PRESETS, DecoderConfig
from lmlab.models.decoder.model import DecoderModel
from lmlab.models.family import FamilySpec, PlanHooks
from lmlab.models.heads import DECODER_HEADS

SPEC = FamilySpec("decoder", DecoderConfig, PRESETS, DecoderModel, DECODER_HEADS, ("gpt2", "llama"),
                  count_parameters=flops.count_parameters, forward_flops=flops.forward_flops,
                  plan=PlanHooks(("gpt2", "llama"), flops.resize, flops.flops_per_token),
                  hf="lmlab.models.decoder.hf")

__all__ = ["SPEC", "DecoderConfig", "DecoderModel"]

"""Preference tuning: teach a pretrained model which of two responses people prefer.

* :mod:`lmlab.align.pairs`: the ``{prompt, chosen, rejected}`` JSON Lines reader;
* :mod:`lmlab.align.logprobs`: ``log π(response | prompt)`` for decoders and encoder-decoders;
* :mod:`lmlab.align.dpo`: the DPO loss (and IPO, conservative DPO) and its preference metrics;
* :mod:`lmlab.align.loop`: a whole DPO run through the training engine (and what RLHF shares);
* :mod:`lmlab.align.methods`: :func:`align`, one run of a method by name;
* :mod:`lmlab.align.reward` and :mod:`lmlab.align.rlhf`: a Bradley-Terry reward model and the
  policy-gradient step of RLHF (``method="rlhf"``).

See docs/align.md.
"""

from lmlab.align.config import AlignConfig
from lmlab.align.dpo import dpo_loss, preference_metrics
from lmlab.align.logprobs import encode_response, response_logprobs
from lmlab.align.loop import AlignResult, frozen_reference
from lmlab.align.methods import align
from lmlab.align.pairs import PreferencePair, read_preferences

__all__ = ["AlignConfig", "AlignResult", "PreferencePair", "align", "dpo_loss", "encode_response",
           "frozen_reference", "preference_metrics", "read_preferences", "response_logprobs"]

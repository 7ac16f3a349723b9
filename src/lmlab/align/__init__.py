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

from lmlab.lazy import lazy_exports

# imported on first use: reading lmlab.align.config (the command-line parser does) costs no torch
__getattr__, __dir__ = lazy_exports(__name__, {
    "config": ("AlignConfig",),
    "dpo": ("dpo_loss", "preference_metrics"),
    "logprobs": ("encode_response", "response_logprobs"),
    "loop": ("AlignResult", "frozen_reference"),
    "methods": ("align",),
    "pairs": ("PreferencePair", "read_preferences"),
})

__all__ = ["AlignConfig", "AlignResult", "PreferencePair", "align", "dpo_loss", "encode_response",
           "frozen_reference", "preference_metrics", "read_preferences", "response_logprobs"]

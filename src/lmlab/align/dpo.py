"""Direct Preference Optimization (Rafailov et al. 2023, "Direct Preference Optimization: Your
Language Model is Secretly a Reward Model").

A policy ``π`` and a frozen reference ``π_ref`` (the starting checkpoint) define an implicit
reward for a response ``y`` to a prompt ``x``: ``r(x, y) = β · (log π(y|x) − log π_ref(y|x))``.
DPO fits the Bradley–Terry preference model with that reward, no reward model and no sampling::

    h = (log π(y_c|x) − log π_ref(y_c|x)) − (log π(y_r|x) − log π_ref(y_r|x))
    L_sigmoid = −(1 − ε) · log σ(β h) − ε · log σ(−β h)        (ε: label smoothing, "conservative
                                                                 DPO", for noisy labels; 0 = DPO)
    L_ipo     = (h − 1 / (2β))²                                  (IPO, Azar et al. 2023: regresses
                                                                 h to a fixed margin, never to ∞)

``β`` sets how far the policy may move from the reference (larger = closer). The numbers a run
watches (:func:`preference_metrics`): the rewards of the chosen and rejected responses, their mean
margin ``β h``, the *win rate* (share of pairs with ``β h > 0``: the policy moved toward the chosen
response more than toward the rejected one), and the *accuracy* (share with ``log π(y_c|x) >
log π(y_r|x)``: which response the model itself now finds likelier; the reference's accuracy is the
starting point). At step 0 ``π = π_ref``: every margin is 0, the win rate 0 and the loss ``log 2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# the losses and their checks live with the config, which the command-line parser reads without torch
from lmlab.align.config import LOSSES, check_dpo_options

__all__ = ["LOSSES", "check_dpo_options", "dpo_loss", "preference_metrics"]


def dpo_loss(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor, ref_rejected: Tensor,
             beta: float = 0.1, loss: str = "sigmoid", label_smoothing: float = 0.0) -> Tensor:
    """The mean DPO loss over a batch of pairs, from summed response log-probabilities ``[B]``."""
    check_dpo_options(beta, loss, label_smoothing)
    h = (policy_chosen - ref_chosen) - (policy_rejected - ref_rejected)
    if loss == "ipo":
        return ((h - 1 / (2 * beta)) ** 2).mean()
    z = beta * h
    return (-(1 - label_smoothing) * F.logsigmoid(z) - label_smoothing * F.logsigmoid(-z)).mean()


@torch.no_grad()
def preference_metrics(policy_chosen: Tensor, policy_rejected: Tensor, ref_chosen: Tensor,
                       ref_rejected: Tensor, beta: float) -> dict[str, float]:
    """Means over the pairs: ``chosen_reward``, ``rejected_reward``, ``margin``, ``win_rate`` and
    the policy's and the reference's ``accuracy`` (chosen likelier than rejected)."""
    chosen = beta * (policy_chosen - ref_chosen).float()
    rejected = beta * (policy_rejected - ref_rejected).float()
    margin = chosen - rejected
    return {"chosen_reward": float(chosen.mean()), "rejected_reward": float(rejected.mean()),
            "margin": float(margin.mean()), "win_rate": float((margin > 0).float().mean()),
            "accuracy": float((policy_chosen > policy_rejected).float().mean()),
            "ref_accuracy": float((ref_chosen > ref_rejected).float().mean())}

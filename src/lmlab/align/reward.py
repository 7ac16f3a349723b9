"""A reward model: the language model's body with a scalar head, trained on preference pairs.

``r(x, y)`` is a linear function of the model's final hidden state at the response's last token
(a decoder's last position has read the whole prompt and response; an encoder-decoder's decoder
has read the response and, through cross-attention, the prompt). It is fitted to the pairs with
the Bradley-Terry model of preferences, ``P(y_c ≻ y_r | x) = σ(r(x, y_c) − r(x, y_r))``: the loss
is ``−log σ(r_c − r_r)``, as in InstructGPT (Ouyang et al. 2022, eq. 1; Stiennon et al. 2020).
Rewards are defined up to a constant; only their differences matter.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lmlab.align.logprobs import IGNORE


def bradley_terry_loss(chosen: Tensor, rejected: Tensor) -> Tensor:
    """``mean(−log σ(r_c − r_r))`` over a batch of pairs."""
    return -F.logsigmoid(chosen.float() - rejected.float()).mean()


class RewardModel(nn.Module):
    """``body`` (a copy of an lmlab decoder or encoder-decoder) and a scalar ``score`` head."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.body = copy.deepcopy(lm)
        d = lm.config.d_model
        self.score = nn.Linear(d, 1)
        nn.init.normal_(self.score.weight, 0.0, 1.0 / (d + 1) ** 0.5)   # as InstructGPT's 1/sqrt(d+1)
        nn.init.zeros_(self.score.bias)

    def forward(self, batch: dict[str, Tensor]) -> Tensor:
        """``[B]`` rewards of rows built like the log-probability rows (``labels`` mark the response)."""
        labels = batch["labels"]
        if self.body.architecture == "seq2seq":
            from lmlab.models.seq2seq import shift_right

            cfg = self.body.config
            dec_in = shift_right(labels, cfg.decoder_start_token_id, cfg.pad_token_id)
            hidden = self.body(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               decoder_input_ids=dec_in).last_hidden_state
        else:
            hidden = self.body.decode(batch["input_ids"])[0]          # no LM head: only the states
        positions = torch.arange(labels.shape[1], device=labels.device)
        last = torch.where(labels != IGNORE, positions, -1).amax(1)      # the response's last token
        pooled = hidden[torch.arange(labels.shape[0], device=labels.device), last]
        return self.score(pooled.to(self.score.weight.dtype)).squeeze(-1)

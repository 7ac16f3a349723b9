"""The ELMo bidirectional LM objective (Peters et al. 2018, section 3.1).

A forward LM predicts ``t_{k+1}`` from ``t_1..t_k`` and a backward LM predicts ``t_{k-1}`` from
``t_k..t_N``; ELMo maximises the sum of both log-likelihoods. The model is
:class:`lmlab.models.rnn.ELMoBiLM` (character-CNN token encoder, separate forward and backward
LSTM stacks, shared softmax); this objective turns packed windows into its inputs and computes
both directions' losses with the document boundaries respected: no token is predicted from a
different document in either direction (the LSTMs run over the whole packed window, so their
state may still carry context across a boundary, as in ELMo's own training on concatenated
sentences, but no target crosses it).

The reported ``loss`` is the *mean* of the two directions' token NLLs (so ``val_ppl`` is a
per-token perplexity, comparable with a causal LM's); ``forward_loss`` and ``backward_loss`` are
logged too. The gradient is half the paper's sum, which Adam does not notice.

The model needs its token -> characters table; a model built without one gets it from the
objective's tokenizer on the first batch (``model.set_vocab``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from lmlab.arguments import ids_argument, tensor_argument
from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE
from lmlab.objectives.base import Objective, token_signal


def forward_targets(input_ids: Tensor, doc_ids: Tensor) -> Tensor:
    """What ``logits[:, k]`` of the forward LM predicts: ``input_ids[:, k+1]``, or ``IGNORE`` where
    that token starts another document."""
    return input_ids[:, 1:].masked_fill(doc_ids[:, 1:] != doc_ids[:, :-1], IGNORE)


def bilm_losses(
    logits: Tensor, backward_logits: Tensor, input_ids: Tensor, doc_ids: Tensor
) -> tuple[Tensor, Tensor]:
    """Mean forward and backward NLL over the ``[B, T]`` window, never across documents.

    ``logits[:, k]`` predicts ``input_ids[:, k+1]``; ``backward_logits[:, k]`` predicts
    ``input_ids[:, k-1]``.
    """
    tensor_argument(logits, "bilm_losses' logits", dims=3, kind="float", shape="[batch, length, vocab]")
    tensor_argument(backward_logits, "bilm_losses' backward_logits", dims=3, kind="float",
                    shape="[batch, length, vocab]")
    ids = ids_argument(input_ids, "bilm_losses' input_ids", logits.shape[-1])
    tensor_argument(doc_ids, "bilm_losses' doc_ids", dims=2, kind="integer")
    if logits.shape != backward_logits.shape or logits.shape[:2] != ids.shape or doc_ids.shape != ids.shape:
        raise LmlabError(f"bilm_losses' shapes disagree: logits {tuple(logits.shape)}, backward_logits "
                         f"{tuple(backward_logits.shape)}, input_ids {tuple(ids.shape)}, doc_ids "
                         f"{tuple(doc_ids.shape)}", "pass [B, T, V] scores for the [B, T] ids and doc_ids")
    same = doc_ids[:, 1:] == doc_ids[:, :-1]
    fwd_targets = forward_targets(input_ids, doc_ids)
    bwd_targets = input_ids[:, :-1].masked_fill(~same, IGNORE)
    v = logits.shape[-1]
    fwd = F.cross_entropy(logits[:, :-1].reshape(-1, v), fwd_targets.reshape(-1), ignore_index=IGNORE)
    bwd = F.cross_entropy(backward_logits[:, 1:].reshape(-1, v), bwd_targets.reshape(-1), ignore_index=IGNORE)
    return fwd, bwd


class BiLMObjective(Objective):
    """Forward + backward LM over an ELMo model (``objective = "elmo"``)."""

    name = "elmo"
    architectures = ("rnn",)
    heads = ()
    loss_kind = "nll"  # mean of the forward and backward LMs' per-token NLL
    #: the forward LM's next-token accuracy (never across documents)
    signals = (("next_acc", "next_acc_guess", "most frequent token"),)

    def __init__(self, tokenizer, **params):
        super().__init__(tokenizer)
        if params:
            raise LmlabError(f"the elmo objective has no parameters {sorted(params)}", "remove them")

    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        return {"input_ids": batch.input_ids, "doc_ids": batch.doc_ids}

    def _ensure_char_table(self, model) -> None:
        if bool(model.char_table.any()):
            return
        vocab = list(self.tokenizer.vocab)
        extra = model.config.vocab_size - len(vocab)
        if extra < 0:
            raise LmlabError(
                f"tokenizer has {len(vocab)} tokens but the ELMo model only {model.config.vocab_size}",
                f"build the model with vocab_size >= {len(vocab)}",
            )
        model.set_vocab(vocab + [f"<unused{i}>" for i in range(extra)])

    def loss(self, model, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        if not hasattr(model, "backward_lstm"):
            raise LmlabError(
                f"the elmo objective needs an ELMo bi-LM, got {type(model).__name__}",
                "set [model] preset = 'elmo-tiny'",
            )
        self._ensure_char_table(model)
        out = model(input_ids=inputs["input_ids"])
        fwd, bwd = bilm_losses(
            out.logits, out.extra["backward_logits"], inputs["input_ids"], inputs["doc_ids"]
        )
        with torch.no_grad():
            targets = forward_targets(inputs["input_ids"], inputs["doc_ids"])
            signal = token_signal(out.logits[:, :-1].detach(), targets, "next", IGNORE)
        return (fwd + bwd) / 2, {"forward_loss": fwd.detach(), "backward_loss": bwd.detach(),
                                 **signal}

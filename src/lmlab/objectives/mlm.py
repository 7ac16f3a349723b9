"""Masked language modelling (BERT; Devlin et al. 2019, §3.1 "Task #1: Masked LM").

Select 15% of the (non-special) tokens; of those, 80% become ``[MASK]``, 10% a random token and
10% stay unchanged; predict the original token at the selected positions only (labels ``-100``
everywhere else, so the loss is ``-1/|S| Σ_{i∈S} log p(x_i | x̃)``).

Worked example (one row, selection drawn at positions 1 and 4)::

    tokens      the  cat  sat  on   the  mat
    selected         ✓              ✓
    draw             0.31 (<0.8: [MASK])  0.93 (>=0.9: unchanged)
    input_ids   the [MASK] sat on   the  mat
    labels      -100 cat  -100 -100 the  -100

Options (the ``[objective]`` table of a recipe):

* ``mask_prob`` (0.15), ``mask_token_prob`` (0.8), ``random_token_prob`` (0.1).
* ``masking = "dynamic"`` (RoBERTa, Liu et al. 2019: a new mask every time a row is seen) or
  ``"static"`` (BERT's preprocessing: the mask is a function of ``seed`` and each token's place in
  the corpus, so every token is masked the same way in every epoch, although the windows that
  hold it shift between epochs).
* ``whole_word = true`` - whole-word masking (the BERT WWM release): a word is selected or not as a
  whole (word starts read from the tokenizer, see :mod:`lmlab.objectives.masking`).

Packed rows hold several documents: attention is kept inside each document (block-diagonal
pattern) and positions restart at every document start. Special tokens are never selected.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from lmlab.data.batch import TokenBatch
from lmlab.errors import LmlabError
from lmlab.losses import IGNORE
from lmlab.objectives.base import Objective, encoder_hidden, first_given, masked_lm, token_signal
from lmlab.objectives.masking import (
    apply_80_10_10,
    corpus_uniforms,
    document_ids,
    label_positions,
    mlm_labels,
    replace_80_10_10,
    replacement_pool,
    row_generator,
    select_tokens,
    select_words,
    special_mask,
    word_boundary_tables,
    word_ids,
)
from lmlab.setting_rules import Needs
from lmlab.values import PositiveProbability, Probability, Seed, check, choice

#: how MLM masks: anew every time a row is seen (RoBERTa) or once per row (BERT)
Masking = choice("dynamic", "static")


def check_probability(name: str, value: float, kind: Any = Probability) -> float:
    """A probability parameter checked as its type ``kind`` (:data:`lmlab.values.Probability`,
    :data:`~lmlab.values.PositiveProbability`), or a one-line error naming it."""
    return float(check(kind, value, f"objective.{name}", f"set objective.{name} to e.g. 0.15"))


class MaskedLM(Objective):
    """BERT/RoBERTa masked LM; see the module docstring."""

    name = "mlm"
    architectures = ("encoder",)
    heads = ("mlm",)
    loss_kind = "masked_nll"
    #: masking runs in the data path, on the host: the positions to predict (``label_positions``)
    #: are then known before the step, so the head gathers them without waiting for the device
    prepare_on_host = True
    #: accuracy at the selected positions whose input is not the answer itself ([MASK] or a random
    #: token): the 10% kept unchanged would let a model that copies its input look as if it learned
    signals = (("mlm_acc", "mlm_acc_guess", "most frequent token"),)
    #: a dynamic mask is drawn from the trainer's generator: ``seed`` keys static masks only
    param_rules = (Needs("seed", "masking", ("static",), why="it keys the static masks"),)

    @classmethod
    def step_flops(cls, model_config, seq_len: int, rows: int, params: dict[str, Any]) -> float:
        """The encoder over every position, the MLM output layer only at the masked ones."""
        from lmlab.models.config import EncoderConfig
        from lmlab.models.flops import training_flops

        if not isinstance(model_config, EncoderConfig):
            return super().step_flops(model_config, seq_len, rows, params)
        masked = max(1, round(float(params.get("mask_prob", 0.15)) * seq_len))
        return float(training_flops(model_config, seq_len, rows, logit_positions=masked, heads=("mlm",)))

    @classmethod
    def needed_roles(cls, params: dict[str, Any]) -> tuple[str, ...]:
        """[MASK], what selected tokens become."""
        return (*super().needed_roles(params), "mask")

    @classmethod
    def check_params(cls, params: dict[str, Any], given=None) -> None:
        """Of the selected tokens, the [MASK] share and the random-token share together are at most 1."""
        super().check_params(params, given)
        mask, random = params["mask_token_prob"], params["random_token_prob"]
        if mask + random > 1:
            raise LmlabError(f"objective.mask_token_prob + objective.random_token_prob = {mask} + {random} "
                             "exceeds 1", "lower one of them (BERT uses 0.8 and 0.1)",
                             setting=first_given(("mask_token_prob", "random_token_prob"), given))

    def __init__(self, tokenizer, mask_prob: PositiveProbability = 0.15, mask_token_prob: Probability = 0.8,
                 random_token_prob: Probability = 0.1, masking: Masking = "dynamic", whole_word: bool = False,
                 seed: Seed = 0):
        super().__init__(tokenizer)
        p = MaskedLM.checked({"mask_prob": mask_prob, "mask_token_prob": mask_token_prob,
                              "random_token_prob": random_token_prob, "masking": masking,
                              "whole_word": whole_word, "seed": seed})
        self.mask_prob, self.mask_token_prob = float(p["mask_prob"]), float(p["mask_token_prob"])
        self.random_token_prob = float(p["random_token_prob"])
        self.masking, self.whole_word, self.seed = p["masking"], bool(p["whole_word"]), int(p["seed"])
        self.mask_id = self.require_roles(tokenizer, MaskedLM.with_defaults(p))["mask"]
        self.pool = replacement_pool(tokenizer)
        self.word_tables = word_boundary_tables(tokenizer) if self.whole_word else None

    # ------------------------------------------------------------------ masking
    def select(self, ids: Tensor, doc_ids: Tensor, generator: torch.Generator) -> Tensor:
        """Boolean ``[B, T]``: the positions to predict (never special tokens)."""
        candidates = ~special_mask(ids, self.special_ids)
        if self.whole_word:
            words = word_ids(ids, doc_ids, *self.word_tables)
            return select_words(words, candidates, self.mask_prob, generator)
        return select_tokens(candidates, self.mask_prob, generator)

    def _mask_with(self, ids: Tensor, doc_ids: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        selected = self.select(ids, doc_ids, generator)
        corrupted = replace_80_10_10(ids, selected, self.mask_id, self.pool, generator,
                                     self.mask_token_prob, self.random_token_prob)
        return corrupted, mlm_labels(ids, selected)

    def _mask_at_corpus_positions(self, ids: Tensor, doc_ids: Tensor,
                                  offsets: Tensor) -> tuple[Tensor, Tensor]:
        """Static masking: every draw is a function of ``seed`` and the token's place in the corpus."""
        pick, action, which = corpus_uniforms(self.seed, offsets, 3)
        candidates = ~special_mask(ids, self.special_ids)
        if self.whole_word:  # a word is selected or not by the draw at its first token
            words = word_ids(ids, doc_ids, *self.word_tables)
            index = torch.arange(ids.shape[1], device=ids.device).expand_as(words)
            first = torch.full_like(words, ids.shape[1] - 1).scatter_reduce(1, words, index, "amin")
            pick = torch.gather(pick, 1, torch.gather(first, 1, words))
        selected = candidates & (pick < self.mask_prob)
        pool = self.pool.to(ids.device)
        random_tok = pool[(which * len(pool)).long().clamp(max=len(pool) - 1)]
        corrupted = apply_80_10_10(ids, selected, self.mask_id, action, random_tok,
                                   self.mask_token_prob, self.random_token_prob)
        return corrupted, mlm_labels(ids, selected)

    def mask(self, ids: Tensor, doc_ids: Tensor, generator: torch.Generator,
             offsets: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``(corrupted input_ids, labels)`` for ``[B, T]`` ids: static or dynamic per the options.
        ``offsets`` (the tokens' places in the corpus, :class:`TokenBatch`) keys static masks."""
        if self.masking == "dynamic":
            return self._mask_with(ids, doc_ids, generator)
        if offsets is not None:
            return self._mask_at_corpus_positions(ids, doc_ids, offsets)
        pieces = [self._mask_with(ids[b:b + 1], doc_ids[b:b + 1], row_generator(self.seed, ids[b]))
                  for b in range(ids.shape[0])]
        return torch.cat([p[0] for p in pieces]), torch.cat([p[1] for p in pieces])

    @staticmethod
    def hidden_token_signal(logits: Tensor, inputs: dict[str, Tensor],
                            prefix: str = "mlm") -> dict[str, Tensor]:
        """:func:`token_signal` on the selected tokens the input hides ([MASK] or a random token):
        the ones left unchanged would reward a model that copies its input. With the inputs'
        ``label_positions`` (``logits`` for those rows) the labels are gathered, not selected, so
        nothing waits for the device."""
        labels, shown = inputs["labels"], inputs["input_ids"] == inputs["labels"]
        positions = inputs.get("label_positions")
        if positions is not None:
            labels, shown = (x.reshape(-1).index_select(0, positions) for x in (labels, shown))
        return token_signal(logits, labels, prefix, shown=shown)

    # ------------------------------------------------------------------ objective contract
    def prepare(self, batch: TokenBatch, generator: torch.Generator) -> dict[str, Tensor]:
        corrupted, labels = self.mask(batch.input_ids, batch.doc_ids, generator, batch.offsets)
        inputs = {"input_ids": corrupted, "labels": labels, "label_positions": label_positions(labels),
                  "position_ids": batch.position_ids}
        docs = document_ids(batch)
        if docs is not None:
            inputs["doc_ids"] = docs
        return inputs

    def loss(self, model: nn.Module, inputs: dict[str, Tensor]) -> tuple[Tensor, dict[str, float]]:
        logits, loss = masked_lm(model, encoder_hidden(model, inputs), inputs)
        labels = inputs["labels"]
        metrics = {**self.hidden_token_signal(logits, inputs), "targets": (labels != IGNORE).sum()}
        return loss, metrics

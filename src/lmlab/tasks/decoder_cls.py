"""Classification with a decoder, the GPT way (Radford et al. 2018, "Improving Language
Understanding by Generative Pre-Training", fig. 1; lecture 4).

Two styles (``TaskOptions.decoder_style``):

* ``gpt``: the input is rewritten as one token sequence with new special tokens,
  ``[START] a [EXTRACT]`` for one sentence and ``[START] a [DELIM] b [EXTRACT]`` for a pair.
  The three tokens are added to the tokenizer and the embedding table grows by three fresh rows.
  A linear head reads the final hidden state at ``[EXTRACT]`` (the last real token, so the
  causal model has seen the whole input there). The fine-tuning loss adds the language-model
  loss on the same sequence as an auxiliary objective: ``L = L_cls + λ · L_lm`` (GPT: λ = 0.5;
  ``TaskOptions.lm_weight``; 0 turns it off and drops the LM head).
* ``last``: no new tokens; the texts are joined (pairs with the tokenizer's end-of-text or
  separator token between them) and the head reads the last real token's hidden state, as
  ``GPT2ForSequenceClassification`` does.

The task being solved (labels, reader, metrics) is any sentence / pair classification or
regression task; this class wraps it and changes only how inputs are built and the loss.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmlab.losses import causal_lm_loss, classification_loss
from lmlab.tasks.base import (
    Task,
    attach_head,
    by_length,
    check_architecture,
    check_tokenizer,
    collate,
    model_device,
    pad_id_of,
    truncate_pair,
)
from lmlab.tasks.classification import SequenceClassification
from lmlab.tasks.readers import Example

START, DELIM, EXTRACT = "[START]", "[DELIM]", "[EXTRACT]"
GPT_TOKENS = (START, DELIM, EXTRACT)


class DecoderClassification(Task):
    head = "cls"
    architectures = ("decoder",)

    def __init__(self, base: SequenceClassification, options=None):
        super().__init__(base.name, options or base.options)
        self.base = base
        self.main_metric = base.main_metric
        self.regression = base.layout == "regression"

    # the base task decides what the data means
    def read(self, path, on_bad_line="error", warn=None):
        return self.base.read(path, on_bad_line, warn)

    def fit(self, train):
        self.base.fit(train)
        self.labels = self.base.labels

    def check(self, examples, what="dev"):
        self.base.check(examples, what)

    def score(self, predictions, examples):
        return self.base.score(predictions, examples)

    def load_state(self, state):
        super().load_state(state)
        self.base.labels = self.labels

    @property
    def heads(self) -> tuple[str, ...]:
        aux = self.options.decoder_style == "gpt" and self.options.lm_weight > 0
        return ("cls", "lm") if aux else ("cls",)

    def prepare_model(self, model):
        check_architecture(self, model)
        tok = check_tokenizer(model)
        if self.options.decoder_style == "gpt":
            missing = [t for t in GPT_TOKENS if t not in tok.token_to_id]
            if missing:
                tok.add_special_tokens(missing)
        new = attach_head(model, self.heads, self.num_labels, vocab_size=tok.vocab_size)
        new.tokenizer = tok
        return new

    def _join_id(self, tokenizer) -> list[int]:
        for role in ("eos", "sep", "bos"):
            i = tokenizer.role_id(role)
            if i is not None:
                return [i]
        return tokenizer.encode_plus("\n", add_special_tokens=False).ids

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        gpt = self.options.decoder_style == "gpt"
        index = {lab: i for i, lab in enumerate(self.labels)}
        join = [tokenizer.token_to_id[DELIM]] if gpt else self._join_id(tokenizer)
        feats = []
        for e in examples:
            a = tokenizer.encode_plus(e.text, add_special_tokens=False).ids
            b = tokenizer.encode_plus(e.pair, add_special_tokens=False).ids if e.pair is not None else None
            n_extra = (2 if gpt else 0) + (len(join) if b is not None else 0)
            a, b = truncate_pair(a, b, self.options.max_length - n_extra)
            ids = ([tokenizer.token_to_id[START]] if gpt else []) + a + (join + b if b is not None else [])
            if gpt:
                ids.append(tokenizer.token_to_id[EXTRACT])
            f = {"input_ids": ids, "attention_mask": [1] * len(ids), "lm_labels": list(ids)}
            if e.label is not None:
                if self.regression:
                    f["labels"] = float(e.label)
                elif str(e.label) in index:
                    f["labels"] = index[str(e.label)]
            feats.append(f)
        return feats

    def loss(self, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        out = model(batch["input_ids"], attention_mask=batch["attention_mask"])
        loss = classification_loss(out.extra["cls_logits"], batch["labels"])
        if "lm" in self.heads:
            loss = loss + self.options.lm_weight * causal_lm_loss(out.extra["lm_logits"], batch["lm_labels"])
        return loss

    def logits(self, model, examples, batch_size=64) -> torch.Tensor:
        tok = check_tokenizer(model)
        feats = self.features([Example(e.text, e.pair) for e in examples], tok)
        pad, dev = pad_id_of(tok, model), model_device(model)
        out = torch.zeros(len(feats), self.num_labels)
        for idx, chunk in by_length(feats, batch_size):
            b = collate(chunk, pad, dev)
            res = model(b["input_ids"], attention_mask=b["attention_mask"])
            out[idx] = res.extra["cls_logits"].float().cpu()
        return out

    def predict(self, model, examples, batch_size=64) -> list:
        logits = self.logits(model, examples, batch_size)
        if self.regression:
            return logits[:, 0].tolist()
        return [self.labels[i] for i in logits.argmax(-1).tolist()]

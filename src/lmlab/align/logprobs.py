"""The log-probability a model gives a response after a prompt, ``log π(y | x)``.

``log π(y | x) = Σ_t log π(y_t | x, y_<t)``, summed over the response's tokens only: the prompt's
tokens are read but never scored. Each row carries ``labels``: the response's token ids, ``-100``
everywhere else (the prompt, a BOS, padding).

* **Decoders** read ``[BOS] prompt response [EOS]`` as one sequence; position ``t`` predicts token
  ``t+1``. Prompt and response are tokenised apart and joined, so where the prompt ends is exact
  (write the space between them at the start of the response, ``" positive"``). A row longer than
  ``max_length`` (or the model's learned positions) loses the start of its prompt; a response
  longer than that on its own loses its end. Rows are right-padded: causal attention never lets
  a real token see the padding after it, so no attention mask is needed.
* **Encoder-decoders** (T5, BART) read the prompt with the encoder (the tokenizer's own special
  tokens, cut at ``max_length`` from the right, as text-to-text fine-tuning does) and score the
  response, always ended by EOS, with the decoder under teacher forcing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import Tensor, nn

from lmlab.errors import LmlabError, a_or_an
from lmlab.losses import IGNORE
from lmlab.models.config import max_length_for
from lmlab.models.facts import facts_of
from lmlab.models.heads import require_head
from lmlab.models.seq2seq import shift_right


def check_generative(model) -> None:
    """Preference tuning scores text, so the model must write it: a decoder or encoder-decoder
    with its language-model head first. ``model``: a model, or a directory's facts
    (:func:`lmlab.loading.model_facts`), so that a wrong checkpoint is refused before it loads."""
    facts = facts_of(model)
    if facts.architecture not in ("decoder", "seq2seq"):
        raise LmlabError("preference tuning needs a model that writes text, not "
                         f"{a_or_an(facts.architecture or type(model).__name__)}",
                         "use a decoder (GPT-2, Llama) or encoder-decoder (T5, BART) checkpoint")
    require_head(facts, "lm", "preference tuning (lmlab align)",
                 "start from the pretrained checkpoint (with its language-model head), not a classifier")


def position_limit(model: nn.Module, max_length: int) -> int:
    """The longest row: ``max_length``, or less where the model's positions end sooner
    (:func:`lmlab.models.config.max_length_for`)."""
    return max_length_for(model.config, None, max_length)


def end_token(tokenizer, model: nn.Module) -> int | None:
    """The token that ends a response: the tokenizer's EOS (or SEP), else the model's."""
    for role in ("eos", "sep"):
        i = tokenizer.role_id(role)
        if i is not None:
            return i
    return getattr(model.config, "eos_token_id", None)


def encode_response(tokenizer, model: nn.Module, prompt: str, response: str, max_length: int,
                    eos: bool = False) -> dict[str, Any]:
    """One row (``input_ids``, ``labels``, and for encoder-decoders ``attention_mask``)."""
    end = end_token(tokenizer, model)
    if model.architecture == "seq2seq":
        src = tokenizer.encode_plus(prompt, truncation=True, max_length=max_length).ids
        tgt = tokenizer.encode(response)[: max_length - 1] + ([end] if end is not None else [])
        return {"input_ids": src, "attention_mask": [1] * len(src), "labels": tgt}
    tail = tokenizer.encode(response) + ([end] if eos and end is not None else [])
    return decoder_row(bos_of(tokenizer), tokenizer.encode(prompt), tail, position_limit(model, max_length))


def bos_of(tokenizer) -> list[int]:
    """What a decoder reads before any prompt: ``[BOS]``, or nothing when the tokenizer has none."""
    return [tokenizer.bos_id] if tokenizer.bos_id is not None else []


def decoder_row(head: list[int], prompt: list[int], response: list[int], limit: int) -> dict[str, Any]:
    """``head + prompt + response`` with the response as labels, at most ``limit`` tokens: the
    prompt loses its start, the response its end only when it cannot fit otherwise."""
    tail = response[: max(1, limit - len(head) - 1)]      # keep at least one token to read before it
    ctx = prompt[max(0, len(head) + len(prompt) + len(tail) - limit):]
    ids = head + ctx + tail
    return {"input_ids": ids, "labels": [IGNORE] * (len(ids) - len(tail)) + tail}


def token_logprobs(logits: Tensor, targets: Tensor) -> Tensor:
    """``log softmax(logits)[..., target]`` in float32, without materialising the whole softmax."""
    logits = logits.float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def response_logprobs(model: nn.Module, batch: dict[str, Tensor]) -> Tensor:
    """``[B]``: the summed log-probability of each row's response tokens (``labels != -100``)."""
    labels = batch["labels"]
    if model.architecture == "seq2seq":
        cfg = model.config
        dec_in = shift_right(labels, cfg.decoder_start_token_id, cfg.pad_token_id)
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                       decoder_input_ids=dec_in).logits
        targets = labels
    else:
        logits = model(input_ids=batch["input_ids"]).logits[:, :-1]
        targets = labels[:, 1:]
    mask = targets != IGNORE
    return (token_logprobs(logits, targets.clamp(min=0)) * mask).sum(-1)


def pair_rows(encoded: Sequence[tuple[dict, dict]]) -> list[dict]:
    """The chosen rows of ``encoded`` pairs, then their rejected rows (one forward for both)."""
    return [c for c, _ in encoded] + [r for _, r in encoded]

"""An lmlab language model as an lm-evaluation-harness model (``lm_eval.api.model.TemplateLM``).

The harness asks three things of a model, and this adapter answers them with lmlab's own forward
pass and tokenizer, so any lmlab decoder (gpt2, llama and the rest) or LSTM LM is scored without a
conversion:

* ``loglikelihood``: ``(log p(continuation | context), whether greedy decoding gives it)``. The
  harness' ``TemplateLM`` tokenises the pair as its Hugging Face model does (trailing spaces of the
  context move to the continuation; the joint encoding is split after the context's tokens; an
  empty context is replaced by the start-of-text token, or end-of-text); sequences longer than
  the model reads are cut from the left, keeping the continuation.
* ``loglikelihood_rolling``: the log-likelihood of a whole text (perplexity tasks), in the
  harness' disjoint windows of the model's length.
* ``generate_until``: greedy (or, with ``do_sample``, sampled) continuation, cut at the first
  ``until`` string, at most ``max_gen_toks`` tokens.

Imported only when ``lm_eval`` is installed (``pip install 'lmlab[eval]'``); :mod:`lmlab.icl.harness`
is the entry point.
"""

from __future__ import annotations

from typing import Any

import torch
from lm_eval import utils as lm_utils
from lm_eval.api.model import TemplateLM

from lmlab.errors import LmlabError
from lmlab.models.config import max_length_for

#: when a model sets no length (rotary positions), windows of this many tokens
DEFAULT_MAX_LENGTH = 2048
DEFAULT_MAX_GEN_TOKS = 256


class LmlabLM(TemplateLM):
    """``model``: an lmlab decoder or LSTM LM whose first head is the language-model head, with its
    ``tokenizer``; ``batch_size`` sequences per forward pass."""

    backend = "causal"

    def __init__(self, model, tokenizer, batch_size: int = 16, max_length: int | None = None):
        super().__init__()
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_size = batch_size
        cfg = model.config
        default = getattr(cfg, "max_positions", None) or DEFAULT_MAX_LENGTH
        self._max_length = max_length_for(cfg, max_length, default, flag="max_length")
        eot = tokenizer.eos_id if tokenizer.eos_id is not None else tokenizer.bos_id
        if eot is None:
            raise LmlabError("the checkpoint's tokenizer has no end-of-text token, which the harness "
                             "uses as the context of an empty prompt",
                             "train the tokenizer with an end-of-text special token")
        self._eot = eot

    # ------------------------------------------------------------------ what TemplateLM needs
    @property
    def eot_token_id(self) -> int:
        return self._eot

    @property
    def prefix_token_id(self) -> int:
        """What stands before an empty context: the start-of-text token where there is one (as the
        harness' Hugging Face model uses), else end-of-text."""
        bos = self.tokenizer.bos_id
        return bos if bos is not None else self._eot

    @property
    def max_length(self) -> int:
        return self._max_length

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def tokenizer_name(self) -> str:
        return type(self.tokenizer).__name__

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.tokenizer.encode(string)

    def tok_decode(self, tokens: list[int]) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    @torch.no_grad()
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False,
                              **kwargs) -> list[tuple[float, bool]]:
        """``requests``: ``(cache key, context ids, continuation ids)``; longest first in batches (right
        padding: a causal model never reads the positions after a sequence)."""
        rows = []
        for _, ctx, cont in requests:
            if not cont:
                raise LmlabError("a harness request has a continuation of no tokens",
                                 "check the task's doc_to_choice / doc_to_target")
            rows.append(((ctx + cont)[-(self.max_length + 1):][:-1], cont))
        order = sorted(range(len(rows)), key=lambda i: -len(rows[i][0]))
        out: list[tuple[float, bool] | None] = [None] * len(rows)
        for start in range(0, len(order), self.batch_size):
            chunk = order[start:start + self.batch_size]
            width = max(len(rows[i][0]) for i in chunk)
            batch = torch.zeros(len(chunk), width, dtype=torch.long)
            for j, i in enumerate(chunk):
                batch[j, :len(rows[i][0])] = torch.tensor(rows[i][0])
            logp = self.model(input_ids=batch.to(self.device)).logits.float().log_softmax(dim=-1).cpu()
            for j, i in enumerate(chunk):
                inp, cont = rows[i]
                scores = logp[j, len(inp) - len(cont):len(inp)]  # the positions that predict cont
                target = torch.tensor(cont)
                greedy = bool((scores.argmax(dim=-1) == target).all())
                out[i] = (float(scores.gather(1, target[:, None]).sum()), greedy)
        return out  # type: ignore[return-value]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for k, (text,) in enumerate(req.args for req in requests):
            for ctx, cont in map(lm_utils.make_disjoint_window, lm_utils.get_rolling_token_windows(
                    token_list=self.tok_encode(text), prefix_token=self.prefix_token_id,
                    max_seq_len=self.max_length, context_len=1)):
                windows.append((None, ctx, cont))
                owner.append(k)
        totals = [0.0] * len(requests)
        for k, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[k] += logprob
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        from lmlab.generate import generate

        out = []
        for req in requests:
            context, options = req.args
            options = dict(options or {})
            until = options.pop("until", None) or []
            until = [until] if isinstance(until, str) else list(until)
            max_new = min(int(options.pop("max_gen_toks", DEFAULT_MAX_GEN_TOKS)), self.max_length - 1)
            sample = _sampling(options)
            ids = self.tok_encode(context) or [self.prefix_token_id]
            ids = ids[-max(1, self.max_length - max_new):]  # room for the new tokens
            # stop early at a stop string's tokens; the text is cut at the string below in any case
            stops = [s for s in (self.tok_encode(stop) for stop in until if stop) if s]
            tokens = generate(self.model, torch.tensor([ids], device=self.device), max_new_tokens=max_new,
                              eos_token_id=self.eot_token_id, stop_sequences=stops, **sample)
            text = self.tok_decode(tokens[0, len(ids):].tolist())
            for stop in until:
                if stop and stop in text:
                    text = text[:text.index(stop)]
            out.append(text)
        return out


def _sampling(options: dict[str, Any]) -> dict[str, Any]:
    """The harness' generation options that lmlab's ``generate`` takes (greedy unless ``do_sample``
    with a positive temperature)."""
    temperature = float(options.get("temperature", 0.0) or 0.0)
    if not options.get("do_sample") or temperature <= 0:
        return {}
    sample: dict[str, Any] = {"do_sample": True, "temperature": temperature, "seed": 0}
    if options.get("top_p") is not None:
        sample["top_p"] = float(options["top_p"])
    if options.get("top_k") is not None:
        sample["top_k"] = int(options["top_k"])
    return sample

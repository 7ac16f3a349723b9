"""Zero-, one- and few-shot evaluation of a decoder (Brown et al. 2020, "LMs are Few-Shot Learners").

No weights change: the task is shown in the prompt (:mod:`lmlab.icl.prompts`) and the model's
answer is read off in one of two ways:

* **label likelihood** (classification, multiple choice): for each candidate label ``y``,
  ``log p(continuation(y) | prompt) = sum_t log p(c_t | prompt, c_<t)`` over the continuation's
  tokens; the prediction is the label with the largest sum (``scoring="likelihood"``) or the
  largest mean per token (``"likelihood-mean"``, which does not favour short labels). The prompt
  and continuation are tokenised together and split where the prompt's own tokens end, as the
  LM evaluation harness does, so the tokens are the ones the model would see in running text.
* **generation** (``scoring="generate"``, completion tasks): greedy decoding after the prompt,
  cut at the line separator; correct when it equals the answer after :func:`normalize_answer`.

The demonstrations for each query are drawn at random (seeded) from the ``shots`` pool, never
the query itself, as in GPT-3's evaluation.
"""

from __future__ import annotations

import random
import re
import string
from collections.abc import Sequence
from typing import Any

import torch

from lmlab import values
from lmlab.arguments import (
    describe,
    model_argument,
    number_argument,
    optional_number,
    tokenizer_argument,
)
from lmlab.errors import LmlabError
from lmlab.icl.prompts import PromptTemplate
from lmlab.models.config import position_limit
from lmlab.models.heads import require_head

SCORINGS = ("likelihood", "likelihood-mean", "generate")


def normalize_answer(text: str) -> str:
    """Lower case, punctuation at either end removed, whitespace collapsed."""
    text = " ".join(text.lower().split())
    return text.strip(string.punctuation + " ")


def _ids(tokenizer, text: str) -> list[int]:
    return tokenizer.encode(text)


def _split_ids(tokenizer, prompt: str, continuation: str) -> tuple[list[int], list[int]]:
    """(prompt ids, continuation ids): the joint tokenisation split after the prompt's tokens."""
    ctx = _ids(tokenizer, prompt)
    full = _ids(tokenizer, prompt + continuation)
    if full[:len(ctx)] == ctx and len(full) > len(ctx):
        return ctx, full[len(ctx):]
    return ctx, _ids(tokenizer, continuation)      # a token straddles the boundary: encode apart


def _position_limit(model) -> int | None:
    """Longest sequence the model reads (None: no limit; :func:`lmlab.models.config.position_limit`)."""
    return position_limit(model.config)


def _prefix(tokenizer) -> list[int]:
    bos = tokenizer.bos_id
    return [bos] if bos is not None else []


@torch.no_grad()
def continuation_logprobs(model, tokenizer, prompt: str,
                          continuations: Sequence[str]) -> list[tuple[float, int]]:
    """``(sum of log-probabilities, number of tokens)`` of each continuation after ``prompt``.

    All continuations run in one right-padded batch (causal attention: padding after a sequence
    never affects it). Prompts longer than a model with learned positions can read are cut
    from the left.
    """
    rows, spans = [], []
    limit = _position_limit(model)
    for cont in continuations:
        ctx, tail = _split_ids(tokenizer, prompt, cont)
        if not tail:
            raise LmlabError(f"continuation {cont!r} encodes to no tokens", "use non-empty labels")
        seq = _prefix(tokenizer) + ctx + tail
        if limit is not None and len(seq) > limit:
            seq = seq[len(seq) - limit:]
        rows.append(seq)
        spans.append(len(tail))
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_id if tokenizer.pad_id is not None else 0
    device = next(model.parameters()).device
    batch = torch.tensor([r + [pad] * (width - len(r)) for r in rows], device=device)
    was_training = model.training
    model.eval()
    try:
        logp = model(input_ids=batch).logits.float().log_softmax(dim=-1)
    finally:
        model.train(was_training)
    out = []
    for i, (row, n) in enumerate(zip(rows, spans)):
        start = len(row) - n                      # first continuation position
        targets = torch.tensor(row[start:], device=device)
        picked = logp[i, start - 1:len(row) - 1].gather(1, targets[:, None])
        out.append((float(picked.sum()), n))
    return out


def _pairs(examples, what: str) -> list[tuple[str, str]]:
    out = []
    for i, ex in enumerate(examples):
        if isinstance(ex, dict):
            ex = (ex.get("input"), ex.get("answer"))
        if not (isinstance(ex, (tuple, list)) and len(ex) == 2 and all(isinstance(v, str) for v in ex)):
            raise LmlabError(f"{what} item {i} is not an (input, answer) pair of strings: {ex!r}",
                             "pass [(text, answer), ...] or [{'input': ..., 'answer': ...}, ...]")
        out.append((ex[0], ex[1]))
    return out


def check_fewshot_count(k, what: str = "the number of few-shot examples K") -> None:
    """The count alone (:func:`check_fewshot` without a pool): a whole number, 0 (zero-shot) or
    more (:data:`lmlab.values.Size`); ``what`` names it."""
    number_argument(values.Size, k, what)


def check_fewshot(k, documents: int, where: str, leaves_out_query: bool = False) -> None:
    """The one rule for the number ``k`` of few-shot examples (demonstrations) drawn from a pool of
    ``documents``, for :func:`evaluate_icl` and the harness (``lmlab evaluate --harness
    --num-fewshot K``) alike: a whole number from 0 to the documents there are (one fewer when the
    query is drawn from the same documents and is left out of its own examples); a one-line
    ``LmlabError`` naming K and the count, before any model is run."""
    check_fewshot_count(k)
    available = max(documents - (1 if leaves_out_query else 0), 0)
    if k > available:
        less = " less the query itself" if leaves_out_query else ""
        raise LmlabError(f"K={k:,} few-shot examples asked for, but {where} has {documents:,} document(s) "
                         f"to draw them from{less}",
                         f"pass --num-fewshot {available} or fewer (k={available} in Python), "
                         "or give the task more examples")


def evaluate_icl(model, tokenizer, task_examples, shots, k: int, template: PromptTemplate | None = None,
                 scoring: str = "likelihood", *, labels: Sequence[str] | None = None, seed: int = 0,
                 max_new_tokens: int | None = None) -> dict[str, Any]:
    """Accuracy of ``model`` on ``task_examples`` given ``k`` demonstrations from ``shots``.

    Args:
        task_examples: ``(input, answer)`` pairs (or dicts with ``input``/``answer``) to score.
        shots: the pool demonstrations are drawn from (e.g. the training split).
        k: demonstrations per prompt; 0 = zero-shot (description and query only).
        template: the prompt format (default: no description, ``"{input} => {answer}"``).
        scoring: ``"likelihood"`` (sum of label log-probs), ``"likelihood-mean"`` (per token) or
            ``"generate"`` (greedy generation compared after :func:`normalize_answer`).
        labels: candidate answers for likelihood scoring (default: every answer seen in
            ``task_examples`` and ``shots``).
        seed: draws the demonstrations (per query, reproducibly).
        max_new_tokens: generation length (default: the longest answer's tokens + 2).

    Returns:
        ``{"accuracy", "correct", "n", "k", "scoring", "predictions"}``.
    """
    model = model_argument(model, "evaluate_icl's model")
    tokenizer = tokenizer_argument(tokenizer, "evaluate_icl's tokenizer")
    check_fewshot_count(k, "evaluate_icl's k")
    number_argument(values.Seed, seed, "evaluate_icl's seed")
    optional_number(values.Count, max_new_tokens, "evaluate_icl's max_new_tokens")
    if template is not None and not isinstance(template, PromptTemplate):
        raise LmlabError(f"evaluate_icl's template must be a PromptTemplate, got {describe(template)}",
                         "pass PromptTemplate(example='{input} => {answer}') (lmlab.icl)")
    if getattr(model, "architecture", "") != "decoder":
        raise LmlabError("in-context learning needs a decoder (a left-to-right language model)",
                         "use a gpt2 or llama checkpoint")
    require_head(model, "lm", "in-context learning",
                 "use the pretrained checkpoint, not a fine-tuned classifier")
    if scoring not in SCORINGS:
        raise LmlabError(f"unknown scoring {scoring!r}", f"use one of {', '.join(SCORINGS)}")
    examples = _pairs(task_examples, "task_examples")
    pool = _pairs(shots, "shots")
    if not examples:
        raise LmlabError("no task examples to evaluate", "pass at least one (input, answer) pair")
    # a query that is also in the pool is never its own demonstration: one fewer to draw from
    check_fewshot(k, len(pool), "the shots pool", leaves_out_query=any(e in pool for e in examples))
    template = template or PromptTemplate()
    if scoring != "generate":
        labels = list(dict.fromkeys(labels if labels is not None else [a for _, a in examples + pool]))
        if len(labels) < 2:
            raise LmlabError("likelihood scoring needs at least two candidate labels", "pass labels=[...]")
    rng = random.Random(seed)
    predictions, correct = [], 0
    for x, y in examples:
        others = [s for s in pool if s != (x, y)]
        demos = rng.sample(others, min(k, len(others)))
        prompt = template.build(demos, x)
        if scoring == "generate":
            pred = _generate_answer(model, tokenizer, template, prompt, x, examples, max_new_tokens)
            hit = normalize_answer(pred) == normalize_answer(y)
        else:
            conts = [template.continuation(x, lab) for lab in labels]
            scores = continuation_logprobs(model, tokenizer, prompt, conts)
            totals = [s / n if scoring == "likelihood-mean" else s for s, n in scores]
            pred = labels[max(range(len(labels)), key=totals.__getitem__)]
            hit = pred == y
        predictions.append(pred)
        correct += int(hit)
    return {"accuracy": correct / len(examples), "correct": correct, "n": len(examples), "k": k,
            "scoring": scoring, "predictions": predictions}


def _generate_answer(model, tokenizer, template: PromptTemplate, prompt: str, x: str,
                     examples: Sequence[tuple[str, str]], max_new_tokens: int | None) -> str:
    from lmlab.generate import generate

    if max_new_tokens is None:
        max_new_tokens = max(len(_ids(tokenizer, template.continuation(a, b))) for a, b in examples) + 2
    ids = _prefix(tokenizer) + _ids(tokenizer, prompt)
    limit = _position_limit(model)
    if limit is not None and len(ids) + max_new_tokens > limit:
        ids = ids[len(ids) + max_new_tokens - limit:]
    device = next(model.parameters()).device
    eos = tokenizer.eos_id
    out = generate(model, torch.tensor([ids], device=device), max_new_tokens=max_new_tokens,
                   eos_token_id=[] if eos is None else eos)
    new = out[0, len(ids):].tolist()
    if eos is not None and eos in new:
        new = new[:new.index(eos)]
    text = tokenizer.decode(new, skip_special_tokens=True)
    sep = template.separator
    if sep and sep in text:
        text = text[:text.index(sep)]
    return re.sub(r"\s+", " ", text).strip()

"""Instruction tuning (Wei et al. 2022, FLAN; Ouyang et al. 2022; lecture decks 000/001/004).

A pretrained LM becomes an instruction follower by fine-tuning on ``(instruction, input,
output)`` records rendered through one prompt template. The loss is taken on the **response
only**: a decoder's labels are ``-100`` on every prompt token and the response tokens plus the
end-of-sequence token carry the loss; an encoder-decoder reads the prompt with its encoder and
learns the response (plus EOS) with its decoder.

Records, one JSON object per line (``.jsonl``)::

    {"instruction": "Translate to French.", "input": "a house", "output": "une maison"}
    {"messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "Hi"},
                  {"role": "assistant", "content": "Hello!"}]}

``input`` may be missing or empty. Other keys are kept in ``Example.extra`` (the mixture builder
stores the answer ``options`` of a classification record there). Chat records are rendered turn
by turn with role headers (``### User:``, ``### Assistant:``, ``### System:``); the last message
must be the assistant's, and a decoder learns every assistant turn.

Template (``TaskOptions.template``; empty = :data:`DEFAULT_TEMPLATE`): text with ``{instruction}``
and ``{input}`` that ends where the response begins. A paragraph (text between blank lines) that
holds ``{input}`` is left out when the input is empty. The template is saved in ``task.json``,
so ``lmlab evaluate`` and ``lmlab generate --instruction`` render prompts the same way.

Packing (``TaskOptions.packing``; default on for decoders): several examples share one row of at
most ``max_length`` tokens; ``doc_ids`` keep attention inside each example
(:mod:`lmlab.models.attention_masks`) and ``position_ids`` restart at 0 for each, so a packed
example sees exactly what it would see alone, and the loss is the mean over all response tokens
of the batch either way.

Dev metrics: ``loss`` (mean cross-entropy per response token) and ``response_logprob`` (its
negative, the main metric: higher is better), plus ``exact_match`` and ``rouge1/2/L`` of greedy
responses (during fine-tuning on the first :data:`GENERATED_DURING_TRAINING` dev examples;
``lmlab evaluate`` generates for all of them).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import torch

from lmlab.errors import LmlabError, a_or_an
from lmlab.fileio import check_input_file, iter_text_lines, read_text
from lmlab.losses import IGNORE
from lmlab.models.attention_masks import MaskSpec
from lmlab.tasks import metrics as M
from lmlab.tasks.base import (
    Task,
    attach_generation_head,
    batches,
    check_tokenizer,
    collate,
    model_device,
    pad_id_of,
)
from lmlab.tasks.readers import BadLines, Example, finish, policy
from lmlab.text_input import parse_json

DEFAULT_TEMPLATE = "### Instruction:\n{instruction}\n\n### Input:\n{input}\n\n### Response:\n"
ROLES = ("system", "user", "assistant")
#: dev examples answered by greedy decoding at each evaluation during fine-tuning
GENERATED_DURING_TRAINING = 16


def check_template(template: str) -> str:
    """The template text, refused when it cannot render a prompt."""
    if "{instruction}" not in template:
        raise LmlabError("the prompt template has no {instruction} placeholder",
                         "write e.g. '### Instruction:\\n{instruction}\\n\\n### Response:\\n'")
    try:
        _check_plain_fields(template)
        template.format(instruction="", input="")
    except (KeyError, IndexError, ValueError) as e:
        raise LmlabError(f"the prompt template cannot be filled in ({type(e).__name__}: {e})",
                         "use only {instruction} and {input}; write literal braces as {{ and }}") from None
    return template


def _check_plain_fields(template: str) -> None:
    """Refuse a field other than ``{instruction}`` and ``{input}``, and one with a format spec or a
    conversion: ``{input:>2000000000}`` pads every prompt to two billion characters and
    ``{input:{instruction}}`` lets the data choose the width; the size of a prompt is its texts'."""
    import string

    fix = "write the fields as {instruction} and {input}; write literal braces as {{ and }}"
    for _, field, spec, conversion in string.Formatter().parse(template):
        if field is None:
            continue
        written = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        shown = "{" + written[:40] + "}"
        if field not in ("instruction", "input"):
            raise LmlabError(f"the prompt template has a field {shown}, which is neither {{instruction}} "
                             "nor {input}", fix)
        if spec or conversion:
            raise LmlabError(f"the prompt template's field {shown} has a format width or conversion, which "
                             "would set the size of every prompt", fix)


def read_template(path: str | os.PathLike) -> str:
    """A template file (``--template FILE``), checked."""
    return check_template(read_text(check_input_file(path)))


def render_prompt(template: str, instruction: str, input: str = "") -> str:
    """The prompt of one record: ``template`` filled in, the ``{input}`` paragraph dropped when empty."""
    if not input.strip() and "{input}" in template:
        template = "\n\n".join(p for p in template.split("\n\n") if "{input}" not in p)
        if not template.endswith("\n"):
            template += "\n"
    return template.format(instruction=instruction, input=input)


def role_header(role: str) -> str:
    return f"### {role.capitalize()}:\n"


def chat_segments(messages: list[dict[str, str]]) -> list[tuple[str, bool]]:
    """``(text, is_response)`` pieces of a conversation: role headers and user/system turns are
    prompt, assistant turns are responses (each followed by EOS when tokenised)."""
    out: list[tuple[str, bool]] = []
    for m in messages:
        out.append((role_header(m["role"]), False))
        if m["role"] == "assistant":
            out.append((m["content"], True))
        else:
            out.append((m["content"] + "\n\n", False))
    return out


def _record_problem(rec: Any) -> str | None:
    if not isinstance(rec, dict):
        return "is not a JSON object"
    if "messages" in rec:
        msgs = rec["messages"]
        if not isinstance(msgs, list) or not msgs:
            return "'messages' must be a non-empty list of {role, content} objects"
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
                return f"message {i} needs a role ({', '.join(ROLES)}) and a string content"
        if msgs[-1]["role"] != "assistant" or not msgs[-1]["content"].strip():
            return "the last message must be a non-empty assistant turn (the response to learn)"
        return None
    for key in ("instruction", "output"):
        if not isinstance(rec.get(key), str) or not rec[key].strip():
            return f"needs a non-empty string {key!r} (or a 'messages' list)"
    if not isinstance(rec.get("input", ""), str):
        return "'input' must be a string"
    return None


def read_instructions(path: str | os.PathLike, template: str, on_bad_line: str | BadLines = "error",
                      warn=None) -> list[Example]:
    """Instruction records from JSON Lines, rendered with ``template``.

    Each example: ``text`` = the prompt of the final response, ``label`` = that response,
    ``extra["segments"]`` = every ``(text, is_response)`` piece in order (one prompt and one
    response, or a whole conversation), plus the record's other keys.
    """
    bad = policy(on_bad_line, warn)
    p = check_input_file(path)
    out: list[Example] = []
    for lineno, line in enumerate(iter_text_lines(p), 1):
        if not line.strip():
            continue
        where = f"{p} line {lineno}"
        try:
            rec = parse_json(line)
        except json.JSONDecodeError as e:
            bad(where, f"invalid JSON ({e.msg} at column {e.colno})")
            continue
        problem = _record_problem(rec)
        if problem:
            bad(where, problem)
            continue
        if "messages" in rec:
            segments = chat_segments(rec["messages"])
            prompt = "".join(t for t, _ in segments[:-1])
            response = rec["messages"][-1]["content"]
        else:
            prompt = render_prompt(template, rec["instruction"], rec.get("input", ""))
            response = rec["output"]
            segments = [(prompt, False), (response, True)]
        extra = {k: v for k, v in rec.items() if k not in ("instruction", "input", "output", "messages")}
        out.append(Example(prompt, None, response, where, {**extra, "segments": segments}))
    return finish(bad, p, out, "write one JSON object per line: {instruction, input, output} or {messages}")


class Instruct(Task):
    """``instruct``: responses to instructions, for decoders and encoder-decoders (module docstring)."""

    name = "instruct"
    head = "lm"
    main_metric = "response_logprob"
    architectures = ("decoder", "seq2seq")
    defaults = {"max_length": 256, "max_target_length": 64}

    def __init__(self, name=None, options=None, architecture: str = "decoder"):
        super().__init__(name, options)
        if architecture not in self.architectures:
            raise LmlabError(f"instruction tuning needs a decoder or an encoder-decoder, not "
                             f"{a_or_an(architecture)}", "use a GPT/Llama or T5/BART checkpoint")
        self.architecture = architecture
        self.template = check_template(self.options.template or DEFAULT_TEMPLATE)
        if self.options.packing and architecture == "seq2seq":
            raise LmlabError("packing is for decoders: an encoder-decoder reads one prompt per row",
                             "drop packing (--no-packing) for this checkpoint")
        self.packing = architecture == "decoder" if self.options.packing is None else self.options.packing
        self.end: int | None = None

    # ----------------------------------------------------------------- data
    def read(self, path, on_bad_line="error", warn=None):
        return read_instructions(path, self.template, on_bad_line, warn)

    def baseline(self, train, dev):
        return None  # free text: no trivial answer

    def metric_names(self, examples):
        names = super().metric_names(examples)  # evaluate adds the responses' log-probability and loss
        return None if names is None else ("response_logprob", "loss", *names)

    def prompt(self, instruction: str, input: str = "") -> str:
        return render_prompt(self.template, instruction, input)

    # ----------------------------------------------------------------- model
    def prepare_model(self, model):
        return attach_generation_head(self, model)

    def end_id(self, tokenizer, model=None) -> int | None:
        from lmlab.tasks.text2text import Text2Text

        return Text2Text.end_id(tokenizer, model)

    def _end(self, tokenizer) -> list[int]:
        if self.end is None:
            self.end = self.end_id(tokenizer)
        return [] if self.end is None else [self.end]

    def example_ids(self, e: Example, tokenizer) -> tuple[list[int], list[int]]:
        """Decoder: ``(input_ids, labels)`` of one example, labels -100 except on responses + EOS,
        truncated to ``max_length`` (prompt tokens cut from the left first, then the end)."""
        bos = tokenizer.bos_id
        ids = [] if bos is None or bos == self.end else [bos]
        labels = [IGNORE] * len(ids)
        for text, response in e.extra.get("segments") or [(e.text, False), (str(e.label), True)]:
            piece = tokenizer.encode(text) + (self._end(tokenizer) if response else [])
            ids += piece
            labels += piece if response else [IGNORE] * len(piece)
        n = self.options.max_length
        if len(ids) > n:
            first = next((i for i, x in enumerate(labels) if x != IGNORE), len(ids))
            cut = min(len(ids) - n, max(0, first - 1))   # keep at least one prompt token
            ids, labels = ids[cut:][:n], labels[cut:][:n]
        labels[0] = IGNORE   # the first token of a row is never predicted (a packed row's boundary)
        return ids, labels

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        if self.architecture == "seq2seq":
            return self._seq2seq_features(examples, tokenizer)
        feats = []
        for e in examples:
            ids, labels = self.example_ids(e, tokenizer)
            feats.append({"input_ids": ids, "attention_mask": [1] * len(ids), "labels": labels})
        return pack(feats, self.options.max_length) if self.packing else feats

    def _seq2seq_features(self, examples, tokenizer) -> list[dict[str, Any]]:
        end = self._end(tokenizer)
        feats = []
        for e in examples:
            src = tokenizer.encode(e.text)[-(self.options.max_length - len(end)):] + end
            f = {"input_ids": src, "attention_mask": [1] * len(src)}
            if e.label is not None:
                target = tokenizer.encode(str(e.label))
                f["labels"] = target[: self.options.max_target_length - len(end)] + end
            feats.append(f)
        return feats

    def model_inputs(self, model, batch):
        if "doc_ids" in batch and (hasattr(model, "prefix_encoder") or hasattr(model, "soft_prompt")):
            raise LmlabError("packed rows cannot take a prefix or a soft prompt: the examples of a row would "
                             "share one", "add --no-packing for --method prefix or prompt")
        keys = ("input_ids", "attention_mask", "labels", "position_ids")
        inputs = {k: batch[k] for k in keys if k in batch}
        if "doc_ids" in batch:  # packed examples: attention stays inside each one
            inputs["mask"] = MaskSpec(causal=True, doc_ids=batch["doc_ids"])
        return inputs

    # ----------------------------------------------------------------- evaluation
    def response_loss(self, model, examples: Sequence[Example], batch_size: int = 64) -> float:
        """Mean cross-entropy per response token over ``examples`` (unpacked, token-weighted)."""
        tok = check_tokenizer(model)
        packing, self.packing = self.packing, False
        try:
            feats = self.features(examples, tok)
        finally:
            self.packing = packing
        pad, dev = pad_id_of(tok, model), model_device(model)
        total, count = 0.0, 0
        for chunk in batches(feats, batch_size):
            b = collate(chunk, pad, dev)
            n = response_tokens(b["labels"], self.architecture)
            total += float(self.loss(model, b)) * n
            count += n
        return total / max(count, 1)

    def generate_responses(self, model, examples: Sequence[Example], batch_size: int = 64) -> list[str]:
        """Greedy responses to the examples' prompts (up to ``max_target_length`` tokens each)."""
        from lmlab.generate import generate

        tok = check_tokenizer(model)
        self.end = self.end_id(tok, model)
        pad, dev = pad_id_of(tok, model), model_device(model)
        out = []
        for chunk in batches(list(examples), batch_size):
            if self.architecture == "seq2seq":
                feats = self._seq2seq_features([Example(e.text, where=e.where) for e in chunk], tok)
                b = collate(feats, pad, dev)
                ids, mask, start = b["input_ids"], b["attention_mask"], 1
            else:
                rows = [self.prompt_ids(e, tok) for e in chunk]
                width = max(len(r) for r in rows)   # left padding: every prompt ends at the same column
                ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=dev)
                mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=dev)
                start = width
            seqs = generate(model, ids, mask, eos_token_id=[] if self.end is None else self.end,
                            pad_token_id=pad, max_new_tokens=self.options.max_target_length)
            for row in seqs[:, start:].tolist():
                if self.end is not None and self.end in row:
                    row = row[:row.index(self.end)]
                out.append(tok.decode(row, skip_special_tokens=True).strip())
        return out

    def prompt_ids(self, e: Example, tokenizer) -> list[int]:
        """A decoder's input for answering ``e``: BOS and the prompt, as in training, cut to fit."""
        bos = tokenizer.bos_id
        ids = ([] if bos is None or bos == self.end else [bos]) + tokenizer.encode(e.text)
        room = max(1, self.options.max_length - self.options.max_target_length)
        return ids[-room:]

    def predict(self, model, examples, batch_size=64) -> list:
        return self.generate_responses(model, examples, batch_size)

    def score(self, predictions, examples) -> dict[str, float]:
        refs = [str(e.label) for e in examples]
        em = sum(M.squad_normalize(p) == M.squad_normalize(r) for p, r in zip(predictions, refs))
        return {"exact_match": em / max(len(refs), 1), **M.rouge_scores(predictions, refs)}

    def predict_and_score(self, model, examples, batch_size=64, generated: int | None = None):
        """Responses (greedy) and metrics: response loss on all ``examples``, exact match and ROUGE
        on the first ``generated`` of them (all when None)."""
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                loss = self.response_loss(model, examples, batch_size)
                shown = list(examples)[:generated] if generated is not None else list(examples)
                preds = self.predict(model, shown, batch_size)
        finally:
            model.train(was_training)
        metrics = {"response_logprob": -loss, "loss": loss, **self.score(preds, shown)}
        return preds, {k: float(v) for k, v in metrics.items()}

    def evaluate(self, model, examples, batch_size=64) -> dict[str, float]:
        return self.predict_and_score(model, examples, batch_size, GENERATED_DURING_TRAINING)[1]

    # ----------------------------------------------------------------- persistence
    def state(self) -> dict[str, Any]:
        return {**super().state(), "architecture": self.architecture}


def response_tokens(labels: torch.Tensor, architecture: str) -> int:
    """Tokens that carry the loss in a batch (a decoder's first label is never a target)."""
    if architecture == "seq2seq":
        return int((labels != IGNORE).sum())
    return int((labels[:, 1:] != IGNORE).sum())


def pack(feats: Sequence[dict[str, list[int]]], max_length: int) -> list[dict[str, list[int]]]:
    """Examples packed greedily, in order, into rows of at most ``max_length`` tokens.

    Each row has ``doc_ids`` (0, 1, 2... per example: attention stays inside an example) and
    ``position_ids`` restarting at 0 for each example; an example longer than a row (cannot
    happen after :meth:`Instruct.example_ids`) gets a row of its own.
    """
    rows: list[dict[str, list[int]]] = []
    row: dict[str, list[int]] | None = None
    for f in feats:
        n = len(f["input_ids"])
        if row is None or len(row["input_ids"]) + n > max_length:
            row = {"input_ids": [], "attention_mask": [], "labels": [], "doc_ids": [], "position_ids": []}
            rows.append(row)
        doc = row["doc_ids"][-1] + 1 if row["doc_ids"] else 0
        row["input_ids"] += f["input_ids"]
        row["attention_mask"] += [1] * n
        row["labels"] += [IGNORE] + f["labels"][1:]
        row["doc_ids"] += [doc] * n
        row["position_ids"] += list(range(n))
    return rows

"""Extractive question answering, SQuAD v1.1 (Rajpurkar et al. 2016; BERT, Devlin et al. 2019 fig. 4c).

Input ``[CLS] question [SEP] context [SEP]``; the ``span`` head scores every token as the
answer's start and as its end; the answer is the best-scoring span ``(s, e)`` with ``s <= e``,
``e - s < max_answer_length``, inside the context. Training loss: mean of the start and end
cross-entropies at the gold positions.

Long contexts: a context longer than the room left after the question is cut into windows of
``room`` tokens, consecutive windows sharing ``doc_stride`` tokens (the ``stride`` of Hugging
Face tokenizers), so every answer lies whole inside some window. A training window that does
not contain the answer points both positions at ``[CLS]`` (index 0). At prediction every window
of a question proposes its best span and the highest score wins.

Offsets: each context token keeps its ``(start, end)`` character span in the original context
(the tokenizer's offsets), so a predicted token span maps back to the exact context text.

Metrics: exact match and F1 after the official normalisation, max over the reference answers
(:func:`lmlab.tasks.metrics.squad_scores`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from lmlab.errors import LmlabError
from lmlab.tasks import metrics as M
from lmlab.tasks.base import Task, batches, check_tokenizer, collate, model_device, pad_id_of, table_chosen
from lmlab.tasks.readers import Example, read_squad, squad_example

MAX_QUESTION_TOKENS = 64
N_BEST = 20


def char_span_to_tokens(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int] | None:
    """First and last token (inclusive) overlapping characters ``[start, end)``; None if none does."""
    first = next((i for i, (s, e) in enumerate(offsets) if e > start), None)
    last = next((i for i in range(len(offsets) - 1, -1, -1) if offsets[i][0] < end), None)
    if first is None or last is None or last < first:
        return None
    return first, last


class SquadQA(Task):
    """Extractive QA (``qa``): SQuAD v1.1 JSON files, or table rows with a question, a context and
    the answer (a string, a list of strings, or SQuAD's answers as dict or list), with an optional
    ``answer_start`` column; without one the answer's first occurrence in the context is used."""

    name = "qa"
    head = "span"
    main_metric = "f1"
    roles = ("question", "context", "answer", "answer_start")
    #: the SQuAD preset: SQuAD JSON, or JSON Lines of SQuAD records
    squad_preset: ClassVar[bool] = False

    defaults = {"max_length": 384}

    def read(self, path, on_bad_line="error", warn=None) -> list[Example]:
        name = str(path).lower()
        if name.endswith(".json") or (self.squad_preset and not table_chosen(self.options, path)):
            return read_squad(path, on_bad_line, warn)
        return self.read_table(path, on_bad_line, warn)

    def example(self, values, where, bad) -> Example | None:
        record = {"question": values.get("question"), "context": values.get("context"),
                  "answers": values.get("answer"), "answer_start": values.get("answer_start")}
        return squad_example(record, where, bad)

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        """One feature per (question, context window); ``example_index`` and ``offsets`` map back."""
        n_special = tokenizer.num_special_tokens_to_add(pair=True)
        feats: list[dict[str, Any]] = []
        for idx, ex in enumerate(examples):
            context = ex.extra.get("context", ex.pair or "")
            q = tokenizer.tokenize_with_offsets(ex.text)[:MAX_QUESTION_TOKENS]
            c = tokenizer.tokenize_with_offsets(context)
            room = self.options.max_length - len(q) - n_special
            if room < 1:
                raise LmlabError(f"max_length {self.options.max_length} leaves no room for the context",
                                 f"use max_length >= {len(q) + n_special + 32}")
            step = room - self.options.doc_stride
            if step < 1 and len(c) > room:
                raise LmlabError(f"doc_stride {self.options.doc_stride} must be smaller than the {room} "
                                 "context tokens per window", "lower doc_stride or raise max_length")
            c_offsets = [(s, e) for _, s, e in c]
            answer = None
            if ex.extra.get("answer_starts"):
                a0 = ex.extra["answer_starts"][0]
                answer = char_span_to_tokens(c_offsets, a0, a0 + len(ex.extra["answers"][0]))
            start = 0
            while True:
                window = c[start:start + room]
                feats.append(self._feature(tokenizer, q, window, start, answer, idx))
                if start + room >= len(c):
                    break
                start += step
        return feats

    @staticmethod
    def _feature(tokenizer, q, window, start, answer, idx) -> dict[str, Any]:
        layout, types = tokenizer._template(len(q), len(window))
        pieces = iter([(t, None) for t, _, _ in q] + [(t, (s, e)) for t, s, e in window])
        ids, offsets, ctx_first = [], [], None
        n_q = 0
        for slot in layout:
            if slot is None:
                tok, off = next(pieces)
                ids.append(tokenizer.id_of(tok))
                if off is None:
                    n_q += 1
                elif ctx_first is None:
                    ctx_first = len(offsets)
                offsets.append(off)
            else:
                ids.append(tokenizer.token_to_id[slot])
                offsets.append(None)
        f = {"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": types,
             "example_index": idx, "offsets": offsets}
        if answer is not None:
            s, e = answer
            if ctx_first is not None and start <= s and e < start + len(window):
                f["start_positions"], f["end_positions"] = ctx_first + s - start, ctx_first + e - start
            else:
                f["start_positions"], f["end_positions"] = 0, 0
        return f

    def best_span(self, start_logits: list[float], end_logits: list[float],
                  offsets: Sequence) -> tuple[float, int, int] | None:
        """Highest ``start + end`` score over valid context spans of one window (n-best search)."""
        ctx = [i for i, o in enumerate(offsets) if o is not None]
        if not ctx:
            return None
        starts = sorted(ctx, key=lambda i: start_logits[i], reverse=True)[:N_BEST]
        ends = sorted(ctx, key=lambda i: end_logits[i], reverse=True)[:N_BEST]
        best = None
        for s in starts:
            for e in ends:
                if e < s or e - s + 1 > self.options.max_answer_length:
                    continue
                score = start_logits[s] + end_logits[e]
                if best is None or score > best[0]:
                    best = (score, s, e)
        return best

    def predict(self, model, examples, batch_size=64) -> list[str]:
        tok = check_tokenizer(model)
        unlabelled = [Example(e.text, e.pair, None, e.where, {"context": e.extra.get("context", e.pair)})
                      for e in examples]
        feats = self.features(unlabelled, tok)
        pad, dev = pad_id_of(tok, model), model_device(model)
        best: dict[int, tuple[float, str]] = {}
        for chunk in batches(feats, batch_size):
            out = model(**self.model_inputs(model, collate(chunk, pad, dev)))
            start_l, end_l = out.extra["start_logits"].float().cpu(), out.extra["end_logits"].float().cpu()
            for row, f in enumerate(chunk):
                n = len(f["input_ids"])
                span = self.best_span(start_l[row, :n].tolist(), end_l[row, :n].tolist(), f["offsets"])
                if span is None:
                    continue
                i = f["example_index"]
                if i not in best or span[0] > best[i][0]:
                    context = examples[i].extra.get("context", examples[i].pair)
                    best[i] = (span[0], span_text(f["offsets"], span[1], span[2], context))
        return [best[i][1] if i in best else "" for i in range(len(examples))]

    def score(self, predictions, examples) -> dict[str, float]:
        refs = [e.extra.get("answers") or [e.label] for e in examples]
        return M.squad_scores(predictions, refs)


class Squad(SquadQA):
    name = "squad"
    squad_preset = True


def span_text(offsets: Sequence, start: int, end: int, context: str) -> str:
    """Context text covered by feature tokens ``start..end`` (inclusive)."""
    return context[offsets[start][0]:offsets[end][1]]


def oracle_predictions(task: SquadQA, examples: Sequence[Example], tokenizer) -> list[str]:
    """The answers the gold training labels of the features point at (checks the offsets mapping)."""
    feats = task.features(examples, tokenizer)
    out = [""] * len(examples)
    for f in feats:
        if f.get("start_positions", 0) > 0:
            ex = examples[f["example_index"]]
            out[f["example_index"]] = span_text(f["offsets"], f["start_positions"], f["end_positions"],
                                                ex.extra["context"])
    return out


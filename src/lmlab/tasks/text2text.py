"""Text-to-text with an encoder-decoder (T5; Raffel et al. 2020, sec. 2.4 and appendix D).

Every task becomes "read a text, write a text": the encoder reads a source with a task prefix,
the decoder is trained with teacher forcing (cross-entropy on the target tokens, which end with
the end-of-sequence token) and at evaluation writes its answer greedily, which is then mapped
back to a label and scored with the task's own metrics.

=========  ==============================================  ==========================
task       source                                          target
=========  ==============================================  ==========================
sst2       ``sst2 sentence: {a}``                          ``negative`` / ``positive``
cola       ``cola sentence: {a}``                          ``unacceptable`` / ``acceptable``
rte        ``rte sentence1: {a} sentence2: {b}``           ``entailment`` / ``not_entailment``
mrpc       ``mrpc sentence1: {a} sentence2: {b}``          ``not_equivalent`` / ``equivalent``
stsb       ``stsb sentence1: {a} sentence2: {b}``          the score rounded to 0.2, e.g. ``3.8``
squad      ``question: {q} context: {c}``                  the answer text
text2text  ``{prefix}{source}``                            the target (summary, translation...)
=========  ==============================================  ==========================

A generated label word is compared after the tokenizer's own round trip (so a lower-casing
WordPiece vocabulary still matches); a word that is no label counts as wrong, and the share of
such answers is reported as the metric ``outside_labels`` (a model that scores 0 because it never
writes a label says so); an STS-B output that is no number counts as 0. ``text2text``
(source/target files, see :func:`lmlab.tasks.readers.read_pairs`) is scored with ROUGE-1/2/L and
corpus BLEU.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lmlab.tasks import metrics as M
from lmlab.tasks.base import (
    Task,
    attach_generation_head,
    by_length,
    check_tokenizer,
    collate,
    model_device,
    pad_id_of,
)
from lmlab.tasks.readers import Example, read_pairs

LABEL_WORDS = {
    "sst2": {"0": "negative", "1": "positive"},
    "cola": {"0": "unacceptable", "1": "acceptable"},
    "mrpc": {"0": "not_equivalent", "1": "equivalent"},
}


#: extractive QA tasks, posed as "question: ... context: ..." -> the answer text
EXTRACTIVE = ("squad", "qa")
#: the metric of a label task: the share of answers that are no label at all (counted as wrong)
OUTSIDE_LABELS = "outside_labels"
INVALID = "<invalid: "


def source_text(task: str, e: Example, prefix: str = "") -> str:
    """The encoder input of example ``e`` for ``task`` (table in the module docstring)."""
    if task in EXTRACTIVE:
        return f"question: {e.text} context: {e.extra.get('context', e.pair)}"
    if task == "text2text":
        return f"{prefix}{e.text}"
    if e.pair is None:
        return f"{task} sentence: {e.text}"
    return f"{task} sentence1: {e.text} sentence2: {e.pair}"


class Text2Text(Task):
    head = "lm"
    architectures = ("seq2seq",)

    def __init__(self, base: Task | None = None, options=None):
        super().__init__(base.name if base else "text2text", options or (base.options if base else None))
        self.base = base
        self.main_metric = base.main_metric if base else "rougeL"

    # ----------------------------------------------------------------- data, delegated to the base task
    def read(self, path, on_bad_line="error", warn=None):
        return self.base.read(path, on_bad_line, warn) if self.base else read_pairs(path, on_bad_line, warn)

    def fit(self, train):
        if self.base:
            self.base.fit(train)
            self.labels = self.base.labels

    def check(self, examples, what="dev"):
        if self.base:
            self.base.check(examples, what)

    def load_state(self, state):
        super().load_state(state)
        if self.base:
            self.base.labels = self.labels

    @property
    def regression(self) -> bool:
        return getattr(self.base, "layout", "") == "regression"

    def target_text(self, e: Example) -> str:
        if self.base is None or self.name in EXTRACTIVE:
            return str(e.label)
        if self.regression:
            return f"{round(float(e.label) * 5) / 5:.1f}"
        return LABEL_WORDS.get(self.name, {}).get(str(e.label), str(e.label))

    # ----------------------------------------------------------------- model
    def prepare_model(self, model):
        return attach_generation_head(self, model)

    @staticmethod
    def end_id(tokenizer, model=None) -> int | None:
        """The token that ends a target: the tokenizer's eos (or sep), else the model's eos."""
        for role in ("eos", "sep"):
            i = tokenizer.role_id(role)
            if i is not None:
                return i
        return None if model is None else model.config.eos_token_id

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        end = getattr(self, "end", None)
        if end is None:
            end = self.end_id(tokenizer)
        enc = tokenizer.encode_batch([source_text(self.name, e, self.options.prefix) for e in examples],
                                     padding=False,
                                     truncation=True, max_length=self.options.max_length)
        feats = []
        for i, e in enumerate(examples):
            f = {"input_ids": enc["input_ids"][i], "attention_mask": enc["attention_mask"][i]}
            if e.label is not None:
                ids = tokenizer.encode_plus(self.target_text(e), add_special_tokens=False).ids
                f["labels"] = ids[: self.options.max_target_length - 1] + ([end] if end is not None else [])
            feats.append(f)
        return feats

    def model_inputs(self, model, batch):
        return {k: batch[k] for k in ("input_ids", "attention_mask", "labels") if k in batch}

    # ----------------------------------------------------------------- evaluation
    def generate_texts(self, model, examples: Sequence[Example], batch_size: int = 64) -> list[str]:
        """Greedy decoding of every example's source; the decoded strings (special tokens dropped)."""
        from lmlab.generate import generate

        tok = check_tokenizer(model)
        self.end = self.end_id(tok, model)
        feats = self.features([Example(e.text, e.pair, None, e.where, e.extra) for e in examples], tok)
        pad, dev, end = pad_id_of(tok, model), model_device(model), self.end
        out = [""] * len(feats)
        for idx, chunk in by_length(feats, batch_size):
            b = collate(chunk, pad, dev)
            seqs = generate(model, b["input_ids"], b["attention_mask"], eos_token_id=end, pad_token_id=pad,
                            max_new_tokens=self.options.max_target_length)
            for i, row in zip(idx, seqs.tolist()):
                out[i] = tok.decode(row[1:], skip_special_tokens=True).strip()
        return out

    def predict(self, model, examples, batch_size=64) -> list:
        texts = self.generate_texts(model, examples, batch_size)
        if self.base is None or self.name in EXTRACTIVE:
            return texts
        if self.regression:
            return [_number(t) for t in texts]
        tok = check_tokenizer(model)
        canon = {_canonical(tok, LABEL_WORDS.get(self.name, {}).get(lab, lab)): lab for lab in self.labels}
        return [canon.get(" ".join(t.split()), f"{INVALID}{t}>") for t in texts]

    def score(self, predictions, examples) -> dict[str, float]:
        if self.base is not None:
            scores = self.base.score(predictions, examples)
            if self.name not in EXTRACTIVE and not self.regression and predictions:
                outside = sum(isinstance(p, str) and p.startswith(INVALID) for p in predictions)
                scores[OUTSIDE_LABELS] = outside / len(predictions)
            return scores
        refs = [str(e.label) for e in examples]
        rouge = M.rouge_scores(predictions, refs, stem=self.options.rouge_stemmer)
        return {**rouge, "bleu": M.corpus_bleu(predictions, refs)}


def _canonical(tokenizer, word: str) -> str:
    """``word`` as the tokenizer writes it back (e.g. lower-cased, ``not _ entailment``)."""
    ids = tokenizer.encode_plus(word, add_special_tokens=False).ids
    return " ".join(tokenizer.decode(ids, skip_special_tokens=True).split())


def _number(text: str) -> float:
    try:
        return float(text.replace(" ", ""))
    except ValueError:
        return 0.0

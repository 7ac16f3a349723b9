"""Token classification: CoNLL-2003 named entities (BERT; Devlin et al. 2019, fig. 4d).

The words of a sentence are tokenised one by one; the ``token_cls`` head gives every sub-token
a score per tag. Only the first sub-token of a word carries the word's tag in training; the
other sub-tokens and the special tokens get the label -100, which the loss ignores (as in the
BERT paper). At prediction each word takes the tag of its first sub-token; words cut off by
``max_length`` (or that tokenise to nothing) are predicted ``O``.

Metric: entity-level precision, recall and F1 over IOB2 spans (a predicted entity counts only
with the exact type and boundaries; :func:`lmlab.tasks.metrics.entity_prf`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from lmlab.errors import LmlabError
from lmlab.losses import IGNORE
from lmlab.tasks import metrics as M
from lmlab.tasks.base import (
    Task,
    by_length,
    check_tokenizer,
    collate,
    model_device,
    pad_id_of,
    table_chosen,
    unseen_label_error,
)
from lmlab.tasks.readers import Example, is_iob_tag, read_conll


class TokenClassification(Task):
    """A tag per word (``tagging``): CoNLL files (``.conll``, ``.txt``: word first, tag last, or the
    columns ``fields`` names by index), or table rows with a tokens and a tags column (lists in
    JSON Lines/Parquet, space-separated in TSV/CSV). Tags are any strings: IOB tags are scored
    by entities (precision, recall, F1), others by accuracy over words."""

    name = "tagging"
    head = "token_cls"
    main_metric = "f1"
    roles = ("tokens", "tags")
    #: the CoNLL-2003 preset: IOB tags only
    iob_only: ClassVar[bool] = False

    def read(self, path, on_bad_line="error", warn=None) -> list[Example]:
        o = self.options
        name = str(path).lower().removesuffix(".gz")
        if o.format is None and name.endswith((".conll", ".txt")) and not self.iob_only:
            words, tags = o.fields.get("tokens", 0), o.fields.get("tags", -1)
            if not isinstance(words, int) or not isinstance(tags, int):
                raise LmlabError("columns of a CoNLL file are chosen by 0-based index",
                                 "pass e.g. --tokens-field 0 --tags-field 3")
            return read_conll(path, on_bad_line, warn, iob=False, word_column=words, tag_column=tags)
        if self.iob_only and not table_chosen(o, path):
            return read_conll(path, on_bad_line, warn)
        return self.read_table(path, on_bad_line, warn)

    def example(self, values, where, bad) -> Example | None:
        words, tags = _word_list(values.get("tokens")), _word_list(values.get("tags"))
        if not words or tags is None:
            bad(where, "tokens and tags must be lists of strings (or space-separated text)")
            return None
        if len(words) != len(tags):
            bad(where, f"{len(words)} tokens but {len(tags)} tags")
            return None
        wrong = next((t for t in tags if not is_iob_tag(t)), None) if self.iob_only else None
        if wrong is not None:  # as the CoNLL file reader: entity scores need IOB tags
            bad(where, f"tag {wrong!r} is not an IOB tag (O, B-TYPE, I-TYPE)")
            return None
        return Example(" ".join(words), None, tags, where, {"words": words})

    def fit(self, train: Sequence[Example]) -> None:
        tags = {t for e in train for t in e.label}
        self.labels = ["O", *sorted(tags - {"O"}, key=lambda t: (t.partition("-")[2], t))]
        self._pick_metric()

    def load_state(self, state) -> None:
        super().load_state(state)
        self._pick_metric()

    @property
    def iob(self) -> bool:
        return all(is_iob_tag(t) for t in self.labels)

    def _pick_metric(self) -> None:
        self.main_metric = "f1" if self.iob else "accuracy"

    def check(self, examples: Sequence[Example], what: str = "dev") -> None:
        known = set(self.labels)
        for e in examples:
            for i, t in enumerate(e.label or ()):
                if t not in known:
                    where = f"{e.where} (word {i + 1} {e.extra['words'][i]!r})"
                    raise unseen_label_error(t, where, self.labels)

    def features(self, examples: Sequence[Example], tokenizer) -> list[dict[str, Any]]:
        """Sub-token ids with the single-sequence template; ``word_starts[j]`` = position of word j."""
        index = {t: i for i, t in enumerate(self.labels)}
        n_special = tokenizer.num_special_tokens_to_add(pair=False)
        room = self.options.max_length - n_special
        feats = []
        for e in examples:
            words = e.extra.get("words") or e.text.split()
            toks, word_of = [], []
            for j, w in enumerate(words):
                pieces = tokenizer.tokenize_with_offsets(w)
                if len(toks) + len(pieces) > room:
                    break
                toks += [p[0] for p in pieces]
                word_of += [j] * len(pieces)
            layout, types = tokenizer._template(len(toks), None)
            content = iter(zip(toks, word_of))
            ids, labels, starts, prev = [], [], {}, None
            for slot in layout:
                if slot is None:
                    tok, j = next(content)
                    ids.append(tokenizer.id_of(tok))
                    first = j != prev
                    prev = j
                    if first:
                        starts[j] = len(ids) - 1
                    tag = e.label[j] if (first and e.label is not None) else None
                    labels.append(index.get(tag, IGNORE) if tag is not None else IGNORE)
                else:
                    ids.append(tokenizer.token_to_id[slot])
                    labels.append(IGNORE)
            f = {"input_ids": ids, "attention_mask": [1] * len(ids), "token_type_ids": types,
                 "word_starts": [starts.get(j) for j in range(len(words))]}
            if e.label is not None:
                f["labels"] = labels
            feats.append(f)
        return feats

    def predict(self, model, examples, batch_size=64) -> list[list[str]]:
        tok = check_tokenizer(model)
        feats = self.features([Example(e.text, None, None, e.where, e.extra) for e in examples], tok)
        pad, dev = pad_id_of(tok, model), model_device(model)
        out: list[list[str]] = [[] for _ in feats]
        for idx, chunk in by_length(feats, batch_size):
            logits = model(**self.model_inputs(model, collate(chunk, pad, dev))).logits
            best = logits.argmax(-1).cpu().tolist()
            for row, (i, f) in enumerate(zip(idx, chunk)):
                out[i] = ["O" if p is None else self.labels[best[row][p]] for p in f["word_starts"]]
        return out

    def score(self, predictions, examples) -> dict[str, float]:
        gold = [e.label for e in examples]
        if self.iob_only:
            return M.entity_prf(predictions, gold)
        pairs = [(p, g) for ps, gs in zip(predictions, gold) for p, g in zip(ps, gs)]
        out = {"accuracy": sum(p == g for p, g in pairs) / max(1, len(pairs))}
        if self.iob:
            out = {**M.entity_prf(predictions, gold), **out}
        return out


class CoNLL(TokenClassification):
    name = "conll"
    iob_only = True


def _word_list(value) -> list[str] | None:
    """Tokens or tags of a table cell: a list (JSON Lines, Parquet; integers become digits) or
    space-separated text."""
    if isinstance(value, str):
        return value.split()
    if isinstance(value, list) and all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in value):
        return [str(v) for v in value]
    return None

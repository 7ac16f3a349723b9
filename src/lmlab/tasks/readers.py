"""Readers for the task file formats, read directly as distributed.

* GLUE-style TSV (:func:`read_tsv_rows`, :func:`read_glue`): tab-separated, no quoting, optional
  header row. Known layouts: SST-2 (``sentence\\tlabel``), CoLA (``x\\ty`` or GLUE's headerless
  4 columns ``source label mark sentence``), RTE (``index sentence1 sentence2 label``), MRPC
  (headerless or headed 5 columns ``Quality #1_ID #2_ID #1_String #2_String``), STS-B (the 10
  GLUE columns ``... sentence1 sentence2 score``, headed or not), and any file whose header
  names ``sentence``/``sentence1``/``sentence2``/``label``.
* SQuAD v1.1 JSON (:func:`read_squad`), or JSON Lines with one ``{"id", "context",
  "question", "answers": [{"text", "answer_start"}]}`` per line.
* CoNLL-2003 (:func:`read_conll`): ``word ... tag`` per line (first and last columns), blank
  line between sentences, ``-DOCSTART-`` lines skipped.
* Source/target pairs for generation (:func:`read_pairs`): TSV ``source\\ttarget`` (optional
  header) or JSON Lines ``{"source", "target"}``.

Bad lines: every reader takes ``on_bad_line`` = ``"error"`` (default: stop with
``FILE line N: problem``) or ``"skip"`` (leave the line out and report it through ``warn``).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from lmlab.errors import LmlabError
from lmlab.fileio import check_input_file, iter_text_lines, read_text
from lmlab.text_input import parse_json

ON_BAD_LINE = ("error", "skip")
#: the share of a file's rows that may be skipped as malformed before the file counts as misread
MAX_BAD_FRACTION = 0.01


@dataclass
class Example:
    """One task example. ``text``/``pair`` are the input texts; ``label`` is a class name (str),
    a score (float), a tag list (NER) or a target text; ``extra`` holds task-specific fields
    (SQuAD: ``context``, ``answers``, ``answer_starts``, ``id``; NER: ``words``)."""

    text: str
    pair: str | None = None
    label: Any = None
    where: str = ""                         # "FILE line N", for error messages
    extra: dict[str, Any] = field(default_factory=dict)


class BadLines:
    """Applies the ``on_bad_line`` policy, counts what was skipped, and refuses a file that reads wrong.

    ``error``: the first bad line stops the run. ``skip``: a bad line is left out and warned about
    (the first five of a file shown); at the end of each file :meth:`done` reports how many of
    its rows were skipped and stops the run when more than ``max_fraction`` of them were: a file
    read in the wrong format (CSV read as TSV, a shifted column) must stop the run, not shrink it.
    """

    def __init__(self, on_bad_line: str = "error", warn: Callable[[str], None] | None = None,
                 max_fraction: float = MAX_BAD_FRACTION):
        if on_bad_line not in ON_BAD_LINE:
            raise LmlabError(f"unknown on_bad_line {on_bad_line!r}", "use 'error' or 'skip'")
        if not 0 <= max_fraction <= 1:
            raise LmlabError(f"max_bad_fraction must be in [0, 1], got {max_fraction}", "e.g. 0.01 (1%)")
        self.policy = on_bad_line
        self.max_fraction = max_fraction
        self.warn = warn or (lambda msg: print(f"warning: {msg}", file=sys.stderr))
        self.skipped = 0                    # over every file read through this policy
        self._file_skipped = 0

    def __call__(self, where: str, problem: str) -> None:
        if self.policy == "error":
            raise LmlabError(f"{where}: {problem}", "fix the line or pass --on-bad-line skip")
        self.skipped += 1
        self._file_skipped += 1
        if self._file_skipped <= 5:
            self.warn(f"skipping {where}: {problem}")

    def done(self, path: str | os.PathLike, kept: int) -> None:
        """End of ``path``: report its skipped rows (all of them) and refuse too many."""
        n, self._file_skipped = self._file_skipped, 0
        if not n:
            return
        total = n + kept
        share = n / total
        self.warn(f"{path}: skipped {n} of {total} rows ({share:.1%}) as malformed")
        if share > self.max_fraction:
            raise LmlabError(f"{path}: {n} of {total} rows ({share:.1%}) are malformed, more than the "
                             f"{self.max_fraction:.1%} --max-bad-fraction allows: the file is probably "
                             "read wrong", "check its format, delimiter, quoting and header (--format, "
                             "--header/--no-header, --*-field), or raise --max-bad-fraction")


def policy(on_bad_line: str | BadLines, warn=None) -> BadLines:
    """``on_bad_line`` as a :class:`BadLines` (a string gets a new one)."""
    return on_bad_line if isinstance(on_bad_line, BadLines) else BadLines(on_bad_line, warn)


def finish(bad: BadLines, path, out: list, fix: str) -> list:
    """The examples of ``path`` once it is read: skipped rows reported, an empty result refused."""
    bad.done(path, len(out))
    if not out:
        raise LmlabError(f"{path} holds no usable examples", fix)
    return out


# --------------------------------------------------------------------------- TSV


def read_tsv_rows(path: str | os.PathLike) -> Iterator[tuple[int, list[str]]]:
    """``(line number, fields)`` for each non-empty line (tab-split, no quoting, newline dropped)."""
    for lineno, line in enumerate(iter_text_lines(path), 1):
        line = line.rstrip("\r\n")
        if line.strip():
            yield lineno, line.split("\t")


#: column names -> role
_TEXT_NAMES = ("sentence", "sentence1", "#1 string", "#1_string", "x", "text", "question", "source")
_PAIR_NAMES = ("sentence2", "#2 string", "#2_string")
_LABEL_NAMES = ("label", "quality", "y", "score", "gold_label", "target")


def _is_header(fields: list[str]) -> bool:
    names = {f.strip().lstrip("\ufeff").lower() for f in fields}
    return bool(names & {"sentence", "sentence1", "label", "quality", "#1 string", "#1_string", "score"}) or (
        [f.strip().lstrip("\ufeff").lower() for f in fields] in (["x", "y"], ["source", "target"]))


def _columns_from_header(fields: list[str], pair: bool, where: str) -> tuple[int, int | None, int]:
    names = [f.strip().lstrip("\ufeff").lower() for f in fields]

    def find(options):
        return next((names.index(o) for o in options if o in names), None)

    text, second, label = find(_TEXT_NAMES), find(_PAIR_NAMES) if pair else None, find(_LABEL_NAMES)
    if text is None or label is None or (pair and second is None):
        need = "sentence1, sentence2 and label" if pair else "sentence and label"
        raise LmlabError(f"{where}: header {fields} does not name the {need} columns",
                         "use the GLUE column names or the headerless GLUE layout")
    return text, second, label


def _columns_by_count(n: int, layout: str) -> tuple[int, int | None, int] | None:
    """Headerless GLUE layouts: (text column, pair column, label column) for a row of n fields."""
    if layout == "single":
        if n == 2:
            return 0, None, 1               # SST-2 / CoLA copy without header
        if n == 4:
            return 3, None, 1               # original GLUE CoLA: source, label, mark, sentence
    elif layout == "pair":
        if n == 5:
            return 3, 4, 0                  # MRPC: Quality, #1 ID, #2 ID, #1 String, #2 String
        if n == 4:
            return 1, 2, 3                  # RTE/QNLI without header: index, s1, s2, label
        if n == 3:
            return 0, 1, 2
    elif layout == "regression":
        if n == 10:
            return 7, 8, 9                  # STS-B GLUE columns
        if n == 3:
            return 0, 1, 2
    return None


def read_glue(path: str | os.PathLike, layout: str, on_bad_line: str | BadLines = "error",
              warn=None) -> list[Example]:
    """Read a GLUE-style TSV as ``layout`` ``"single"``, ``"pair"`` or ``"regression"``.

    Labels stay strings (``"0"``/``"1"``, ``"entailment"``...) for classification and become
    floats for regression. A header row picks the columns by name; without one the column count
    picks a known GLUE layout (see the module docstring).
    """
    bad = policy(on_bad_line, warn)
    p = check_input_file(path)
    pair = layout in ("pair", "regression")
    cols = None
    width = None
    out: list[Example] = []
    for lineno, fields in read_tsv_rows(p):
        where = f"{p} line {lineno}"
        if cols is None and not out and _is_header(fields):
            cols, width = _columns_from_header(fields, pair, where), len(fields)
            continue
        if cols is None:
            cols = _columns_by_count(len(fields), layout)
            width = len(fields)
            if cols is None:
                raise LmlabError(f"{where}: {len(fields)} tab-separated fields is not a known "
                                 f"{layout} GLUE layout", "add a header row naming sentence(1)/(2) and label")
        if len(fields) != width:
            bad(where, f"expected {width} tab-separated fields, found {len(fields)}")
            continue
        t, s, y = cols
        text, label = fields[t].strip(), fields[y].strip()
        second = fields[s].strip() if s is not None else None
        if not text or (s is not None and not second):
            bad(where, "empty sentence")
            continue
        if not label:
            bad(where, "empty label")
            continue
        if layout == "regression":
            try:
                value = float(label)
            except ValueError:
                bad(where, f"score {label!r} is not a number")
                continue
            if value != value or value in (float("inf"), float("-inf")):
                bad(where, f"score {label!r} is not a finite number")
                continue
            label = value
        out.append(Example(text, second, label, where))
    bad.done(p, len(out))
    if not out:
        raise LmlabError(f"{p} holds no usable examples", "check the file format (tab-separated GLUE TSV)")
    return out


# --------------------------------------------------------------------------- SQuAD


def read_squad(path: str | os.PathLike, on_bad_line: str | BadLines = "error", warn=None) -> list[Example]:
    """Questions of a SQuAD v1.1 JSON file (or JSON Lines), one :class:`Example` each.

    ``text`` = question, ``pair`` = context, ``label`` = first answer text;
    ``extra["answers"]`` = all reference texts, ``extra["answer_starts"]`` their character starts.
    A reference whose text is not at its ``answer_start`` in the context is a bad line.
    """
    bad = policy(on_bad_line, warn)
    p = check_input_file(path)
    text = read_text(p)
    records: list[tuple[str, Any]] = []
    doc, error = None, None
    try:
        doc = parse_json(text)
    except json.JSONDecodeError as e:
        error = e
    lines = [ln for ln in text.splitlines() if ln.strip()]
    first_is_object = bool(lines) and lines[0].lstrip().startswith("{") and lines[0].rstrip().endswith("}")
    json_lines = error is not None and (error.msg == "Extra data" or (len(lines) > 1 and first_is_object))
    if error is not None and not json_lines:
        raise LmlabError(f"{p} line {error.lineno} column {error.colno}: invalid JSON ({error.msg})",
                         "fix the file (SQuAD v1.1 JSON or one JSON object per line)")
    if not json_lines and isinstance(doc, dict) and "data" in doc:
        data = doc["data"]
        if not isinstance(data, list):
            raise LmlabError(f"{p} has no 'data' list", "pass a SQuAD v1.1 JSON file")
        for a, article in enumerate(data):
            paragraphs = article.get("paragraphs") if isinstance(article, dict) else None
            if not isinstance(paragraphs, list):
                bad(f"{p} data[{a}]", "article without a 'paragraphs' list")
                continue
            for i, para in enumerate(paragraphs):
                qas = para.get("qas") if isinstance(para, dict) else None
                if not isinstance(qas, list) or not isinstance(para.get("context"), str):
                    bad(f"{p} data[{a}].paragraphs[{i}]", "paragraph without 'context' and 'qas'")
                    continue
                for j, qa in enumerate(qas):
                    rec = dict(qa) if isinstance(qa, dict) else {}
                    rec["context"] = para["context"]
                    records.append((f"{p} data[{a}].paragraphs[{i}].qas[{j}]", rec))
    else:
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = parse_json(line)
            except json.JSONDecodeError as e:
                bad(f"{p} line {lineno}", f"invalid JSON ({e.msg} at column {e.colno})")
                continue
            records.append((f"{p} line {lineno}", rec if isinstance(rec, dict) else {}))
    out = []
    for where, rec in records:
        ex = squad_example(rec, where, bad)
        if ex is not None:
            out.append(ex)
    bad.done(p, len(out))
    if not out:
        raise LmlabError(f"{p} holds no usable questions", "pass a SQuAD v1.1 JSON file")
    return out


def squad_example(rec: dict, where: str, bad: BadLines) -> Example | None:
    question, context, answers = rec.get("question"), rec.get("context"), rec.get("answers")
    if not isinstance(question, str) or not question.strip() or not isinstance(context, str):
        bad(where, "needs a 'question' and a 'context' string")
        return None
    if isinstance(answers, dict):  # Hugging Face datasets layout: {"text": [...], "answer_start": [...]}
        answers = [{"text": t, "answer_start": s}
                   for t, s in zip(answers.get("text", []), answers.get("answer_start", []))]
    elif isinstance(answers, str) or (isinstance(answers, list) and answers
                                      and all(isinstance(a, str) for a in answers)):
        answers = _answer_spans(answers, rec.get("answer_start"), context, where, bad)
        if answers is None:
            return None
    if not isinstance(answers, list) or not answers:
        bad(where, "needs a non-empty 'answers' list")
        return None
    texts, starts = [], []
    for ans in answers:
        t, s = (ans.get("text"), ans.get("answer_start")) if isinstance(ans, dict) else (None, None)
        if not isinstance(t, str) or not isinstance(s, int) or isinstance(s, bool):
            bad(where, "each answer needs 'text' (string) and 'answer_start' (integer)")
            return None
        if s < 0 or not t or context[s:s + len(t)] != t:  # s < 0: Python would count from the end
            bad(where, f"answer {t!r} is not at character {s} of the context")
            return None
        texts.append(t)
        starts.append(s)
    qid = str(rec.get("id", where))
    return Example(question.strip(), context, texts[0], where,
                   {"id": qid, "context": context, "answers": texts, "answer_starts": starts})


def _answer_spans(texts, starts, context: str, where: str, bad: BadLines) -> list[dict] | None:
    """Answers given as text (one string or a list) with optional starts (an integer, a numeric
    string or a list): ``[{"text", "answer_start"}]``; a missing start is the answer's first
    occurrence in the context."""
    texts = [texts] if isinstance(texts, str) else list(texts)
    if starts is None or starts == "":
        starts = [None] * len(texts)
    elif not isinstance(starts, list):
        starts = [starts]
    if len(starts) != len(texts):
        bad(where, f"{len(texts)} answers but {len(starts)} answer starts")
        return None
    out = []
    for t, s in zip(texts, starts):
        if isinstance(s, str):
            if not s.strip().isdigit():
                bad(where, f"answer start {s!r} is not a character position")
                return None
            s = int(s)
        if s is None:
            s = context.find(t)
            if s < 0 or not t:
                bad(where, f"answer {t!r} does not occur in the context")
                return None
        out.append({"text": t, "answer_start": s})
    return out


# --------------------------------------------------------------------------- CoNLL


def is_iob_tag(tag: str) -> bool:
    if tag == "O":
        return True
    prefix, _, typ = tag.partition("-")
    return prefix in ("B", "I", "E", "S") and bool(typ)


def read_conll(path: str | os.PathLike, on_bad_line: str | BadLines = "error", warn=None, *,
               iob: bool = True, word_column: int = 0, tag_column: int = -1) -> list[Example]:
    """Sentences of a CoNLL-2003 file: ``extra["words"]`` and ``label`` = the tag list (last column).

    A line with one field, or whose last field is not an IOB tag (``O``, ``B-X``, ``I-X``), is
    bad; with ``skip`` the whole sentence it belongs to is left out. ``iob=False`` takes any tag
    (part-of-speech, chunks...); ``word_column``/``tag_column`` pick other columns (0-based).
    """
    bad = policy(on_bad_line, warn)
    p = check_input_file(path)
    out: list[Example] = []
    words: list[str] = []
    tags: list[str] = []
    start, broken = 0, False

    def flush():
        nonlocal words, tags, broken
        if words and not broken:
            out.append(Example(" ".join(words), None, tags, f"{p} line {start}", {"words": words}))
        words, tags, broken = [], [], False

    for lineno, line in enumerate(iter_text_lines(p), 1):
        fields = line.split()
        if not fields:
            flush()
            continue
        if fields[0] == "-DOCSTART-":
            flush()
            continue
        if not words and not broken:
            start = lineno
        need = max(2, word_column + 1, tag_column + 1 if tag_column >= 0 else -tag_column)
        if len(fields) < need:
            bad(f"{p} line {lineno}", f"expected 'word ... tag' ({need} columns), found {line.strip()!r}")
            broken = True
            continue
        if iob and not is_iob_tag(fields[tag_column]):
            bad(f"{p} line {lineno}", f"tag {fields[tag_column]!r} is not an IOB tag (O, B-TYPE, I-TYPE)")
            broken = True
            continue
        words.append(fields[word_column])
        tags.append(fields[tag_column])
    flush()
    bad.done(p, len(out))
    if not out:
        raise LmlabError(f"{p} holds no sentences", "pass a CoNLL-2003 file (word ... tag per line)")
    return out


# --------------------------------------------------------------------------- source/target pairs


def json_lines(path: str | os.PathLike, bad: BadLines) -> Iterator[tuple[str, Any]]:
    """``("FILE line N", decoded value)`` for each non-blank line of a JSON Lines file; a line that
    is no JSON goes to ``bad``."""
    for lineno, line in enumerate(iter_text_lines(path), 1):
        if not line.strip():
            continue
        where = f"{path} line {lineno}"
        try:
            yield where, parse_json(line)
        except json.JSONDecodeError as e:
            bad(where, f"invalid JSON ({e.msg} at column {e.colno})")


def read_pairs(path: str | os.PathLike, on_bad_line: str | BadLines = "error", warn=None) -> list[Example]:
    """Source/target pairs for generation: TSV ``source\\ttarget`` or JSON Lines ``{"source", "target"}``."""
    bad = policy(on_bad_line, warn)
    p = check_input_file(path)
    out: list[Example] = []
    if p.suffix in (".jsonl", ".json"):
        for where, rec in json_lines(p, bad):
            src = rec.get("source") if isinstance(rec, dict) else None
            tgt = rec.get("target") if isinstance(rec, dict) else None
            if not isinstance(src, str) or not isinstance(tgt, str) or not src.strip() or not tgt.strip():
                bad(where, "needs non-empty 'source' and 'target' strings")
                continue
            out.append(Example(src.strip(), None, tgt.strip(), where))
    else:
        for lineno, fields in read_tsv_rows(p):
            where = f"{p} line {lineno}"
            if not out and lineno == 1 and [f.strip().lower() for f in fields] == ["source", "target"]:
                continue
            if len(fields) != 2:
                bad(where, f"expected 2 tab-separated fields (source, target), found {len(fields)}")
                continue
            src, tgt = fields[0].strip(), fields[1].strip()
            if not src or not tgt:
                bad(where, "empty source or target")
                continue
            out.append(Example(src, None, tgt, where))
    bad.done(p, len(out))
    if not out:
        raise LmlabError(f"{p} holds no source/target pairs", "pass TSV 'source<TAB>target' or JSON Lines")
    return out


def limit(examples: list[Example], n: int | None) -> list[Example]:
    """The first ``n`` examples (all when ``n`` is None)."""
    if n is not None and n < 1:
        raise LmlabError(f"example limit must be at least 1, got {n}",
                         "pass a positive number or leave it out")
    return examples if n is None else examples[:n]

"""Labelled data as it comes: rows of TSV, CSV, JSON Lines or Parquet files, columns picked by role.

==========  ==========================================  ===========================================
format      extensions                                  rows
==========  ==========================================  ===========================================
``tsv``     ``.tsv``, ``.tab`` (``.gz`` too)             one line each, fields split on tabs, no
                                                        quoting (GLUE's and IANA's TSV)
``csv``     ``.csv`` (``.gz`` too)                       RFC 4180, read by Python's :mod:`csv`: a
                                                        field in double quotes may hold the
                                                        delimiter, newlines and doubled quotes
                                                        (``""``); ``delimiter`` changes the comma
                                                        (``tab`` reads quoted TSV, e.g. pandas')
``jsonl``   ``.jsonl``, ``.ndjson`` (``.gz``, ``.zst``)    one JSON object per line
``parquet`` ``.parquet``                                one row per table row, read one row group
                                                        at a time (needs the ``data`` extra)
==========  ==========================================  ===========================================

A task asks for *roles* (``text``, ``text_pair``, ``label``, ``tokens``, ``tags``, ``question``,
``context``, ``answer``, ``answer_start``); ``fields`` maps a role to a column chosen by name or by
0-based index (``--label-field 0``). A role not chosen is looked up in the header under its usual
names (:data:`ROLES`). TSV/CSV header rows: ``header=True``/``False`` forces; ``None`` decides: a
column chosen by name (or left to its usual names) needs a header; when every column is chosen
by index, the task's ``header_probe`` looks at the first row (for classification: is its label
cell a label?) and an undecidable file is an error asking for ``--header`` or ``--no-header``.

Every malformed row (wrong number of fields, invalid JSON, a missing or null field) goes to the
bad-line policy (:class:`lmlab.tasks.readers.BadLines`) with ``FILE line N`` (``FILE row N`` in
Parquet); a quoted CSV field that never closes stops the read whatever the policy.
"""

from __future__ import annotations

import csv
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError
from lmlab.fileio import check_input_file, iter_text_lines
from lmlab.values import Delimiter, check, delimiter_character

FORMATS = ("tsv", "csv", "jsonl", "parquet")
QQ = '""'
_EXTENSIONS = {".tsv": "tsv", ".tab": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".ndjson": "jsonl",
               ".parquet": "parquet"}


@dataclass(frozen=True)
class Role:
    """A column a task reads: its ``--NAME-field`` flag and the header names tried by default."""

    name: str
    names: tuple[str, ...]
    required: bool = True

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}-field"


ROLES = {r.name: r for r in (
    Role("text", ("text", "sentence", "sentence1", "premise", "question1", "review", "content", "document")),
    Role("text_pair", ("text_pair", "sentence2", "hypothesis", "question2")),
    Role("label", ("label", "labels", "class", "category", "gold_label", "target", "y", "score")),
    Role("tokens", ("tokens", "words")),
    Role("tags", ("tags", "ner_tags", "labels", "label")),
    Role("question", ("question",)),
    Role("context", ("context", "passage")),
    Role("answer", ("answers", "answer")),
    Role("answer_start", ("answer_start",), required=False),
)}

#: (first row, the other rows) -> True: the first row is a header, False: it is data, None: unsure
HeaderProbe = Callable[[dict[str, str], list[dict[str, str]]], "bool | None"]
#: rows of a table: ``(where, {role: value})``
Rows = list[tuple[str, dict[str, Any]]]


def column_choice(value: str | int) -> str | int:
    """A ``--*-field`` value: a 0-based column index (``"3"`` -> 3) or a column name."""
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise LmlabError(f"column index {value} is negative", "columns are counted from 0")
        return value
    text = str(value).strip()
    if not text:
        raise LmlabError("an empty column name was given", "name the column, or give its 0-based index")
    return int(text) if text.isdigit() else text


def format_of(path: str | os.PathLike, fmt: str | None = None) -> str:
    """``fmt`` when given, else the format the file's extension names (``.gz``/``.zst`` looked through)."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise LmlabError(f"unknown data format {fmt!r}", f"use one of: {', '.join(FORMATS)}")
        return fmt
    name = Path(path).name.lower()
    for packed in (".gz", ".zst"):
        name = name.removesuffix(packed)
    suffix = Path(name).suffix
    if suffix not in _EXTENSIONS:
        raise LmlabError(f"cannot tell the format of {path} from its extension {suffix or '(none)'!r}",
                         f"pass --format ({', '.join(FORMATS)})")
    return _EXTENSIONS[suffix]


def delimiter_char(delimiter: str | None, fmt: str) -> str:
    if delimiter is None:
        return "\t" if fmt == "tsv" else ","
    if fmt == "tsv":
        raise LmlabError(f"--delimiter applies to CSV, not {fmt}", "drop it, or pass --format csv")
    return delimiter_character(check(Delimiter, delimiter, "--delimiter"))  # the one rule (lmlab.values)


def read_table(path: str | os.PathLike, roles: Sequence[Role], fields: dict[str, str | int] | None = None,
               fmt: str | None = None, header: bool | None = None, delimiter: str | None = None, *,
               bad: Callable[[str, str], None], probe: HeaderProbe | None = None,
               note: Callable[[str], None] | None = None) -> Rows:
    """The rows of ``path`` as ``(where, {role: value})``; malformed rows go to ``bad(where, problem)``.

    ``fields``: role -> column name or 0-based index; ``fmt``: one of :data:`FORMATS` (None: from
    the extension); ``header``: TSV/CSV header row (None: decide, see the module docstring);
    ``delimiter``: CSV only (``header`` and ``delimiter`` are ignored for JSON Lines and Parquet);
    ``note`` hears how a header was decided when it was guessed.
    """
    p = check_input_file(path)
    fmt = format_of(p, fmt)
    chosen = {k: column_choice(v) for k, v in (fields or {}).items() if k in {r.name for r in roles}}
    if fmt in ("tsv", "csv"):
        delim = delimiter_char(delimiter, fmt)
        return _read_delimited(p, fmt, roles, chosen, header, delim, bad, probe, note)
    # header and delimiter mean nothing to JSON Lines and Parquet (a model trained on a headerless
    # CSV still evaluates a Parquet file)
    if fmt == "jsonl":
        return _read_jsonl(p, roles, chosen, bad)
    return _read_parquet(p, roles, chosen, bad)


# --------------------------------------------------------------------------- TSV / CSV


def _delimited_rows(p: Path, fmt: str, delimiter: str) -> list[tuple[int, list[str]]]:
    """``(first line of the record, fields)`` of every non-blank record."""
    out = []
    if fmt == "tsv":
        for lineno, line in enumerate(iter_text_lines(p), 1):
            line = line.rstrip("\r\n")
            if line.strip():
                out.append((lineno, line.split("\t")))
        return out
    reader = csv.reader(iter_text_lines(p), delimiter=delimiter, strict=True)
    start = 1
    try:
        for fields in reader:
            if any(f.strip() for f in fields):
                out.append((start, fields))
            start = reader.line_num + 1
    except csv.Error as e:
        if "unexpected end of data" in str(e):
            raise LmlabError(f"{p} line {start}: a quoted field opened in this record is never closed",
                             f"close the quote (a quote inside a quoted field is doubled: {QQ})") from None
        raise LmlabError(f"{p} line {start}: not valid CSV ({e})",
                         f"quote the whole field and double the quotes inside ({QQ})") from None
    return out


def _read_delimited(p: Path, fmt: str, roles: Sequence[Role], chosen: dict[str, str | int],
                    header: bool | None, delimiter: str, bad, probe: HeaderProbe | None, note) -> Rows:
    records = _delimited_rows(p, fmt, delimiter)
    if not records:
        raise LmlabError(f"{p} holds no rows", "pass a file with data")
    by_index = all(isinstance(chosen.get(r.name), int) for r in roles if r.required)
    by_index = by_index and all(isinstance(v, int) for v in chosen.values())
    first_fields = records[0][1]
    if header is None:
        if not by_index:
            header = True
        else:
            cols = {name: i for name, i in chosen.items() if i < len(first_fields)}
            pick = _picker(cols)
            rest = [pick(f) for _, f in records[1:] if len(f) == len(first_fields)]
            verdict = probe(pick(first_fields), rest) if probe else None
            if verdict is None:
                raise LmlabError(f"cannot tell whether the first row of {p} is a header",
                                 "pass --header or --no-header")
            header = verdict
            if header and note:
                note(f"{p}: first row {first_fields!r} read as a header (its label is no label of the data); "
                     "pass --no-header if it is an example")
    names = [f.strip() for f in first_fields] if header else None
    cols = _resolve_columns(p, roles, chosen, names, len(first_fields))
    width = len(first_fields)
    sep = "tab" if delimiter == "\t" else repr(delimiter)
    pick = _picker(cols)
    out: Rows = []
    for lineno, values in records[1:] if header else records:
        where = f"{p} line {lineno}"
        if len(values) != width:
            hint = ""
            if fmt == "tsv" and any(v.startswith('"') for v in values):
                hint = " (quoted fields? read the file as CSV: --format csv --delimiter tab)"
            bad(where, f"expected {width} {sep}-separated fields, found {len(values)}{hint}")
            continue
        out.append((where, pick(values)))
    return out


def _picker(cols: dict[str, int]) -> Callable[[list], dict[str, Any]]:
    return lambda values: {role: values[i] for role, i in cols.items()}


def _resolve_columns(p: Path, roles: Sequence[Role], chosen: dict[str, str | int], names: list[str] | None,
                     width: int) -> dict[str, int]:
    """role -> column index, from the choices, else from the header's usual names."""
    folded = [n.lower() for n in names] if names is not None else None
    cols: dict[str, int] = {}
    for role in roles:
        want = chosen.get(role.name)
        if isinstance(want, int):
            if want >= width:
                raise LmlabError(f"{role.flag} {want}: {p} has {width} columns (0 to {width - 1})",
                                 f"choose a column index below {width}")
            cols[role.name] = want
        elif want is not None:
            if names is None:
                raise LmlabError(f"{role.flag} {want!r} names a column, but {p} is read without a header",
                                 f"choose the column by 0-based index (e.g. {role.flag} 1)")
            if want in names:
                cols[role.name] = names.index(want)
            elif want.lower() in folded:
                cols[role.name] = folded.index(want.lower())
            else:
                raise LmlabError(f"{p} has no column {want!r} (header: {', '.join(names[:12])})",
                                 f"pass {role.flag} with one of the header's names or a 0-based index")
        else:
            found = None if folded is None else next(
                (folded.index(n) for n in role.names if n in folded and folded.index(n) not in cols.values()),
                None)
            if found is not None:
                cols[role.name] = found
            elif role.required:
                if names is None:
                    raise LmlabError(f"{role.flag} is needed: {p} is read without a header",
                                     f"choose the column by 0-based index, e.g. {role.flag} 1")
                raise LmlabError(f"{p}: no column for the {role.name.replace('_', ' ')} (header: "
                                 f"{', '.join(names[:12])}; looked for {', '.join(role.names)})",
                                 f"pass {role.flag} NAME, or --no-header and 0-based indices if the first "
                                 "row is data")
    return cols


# --------------------------------------------------------------------------- JSON Lines / Parquet


def _named_columns(p: Path, roles: Sequence[Role], chosen: dict[str, str | int], available: list[str],
                   allow_index: bool) -> dict[str, str]:
    """role -> field name of a JSON Lines or Parquet file."""
    out: dict[str, str] = {}
    for role in roles:
        want = chosen.get(role.name)
        if isinstance(want, int):
            if not allow_index:
                raise LmlabError(f"{role.flag} {want}: JSON Lines fields are chosen by name",
                                 f"pass {role.flag} NAME (e.g. one of: {', '.join(available[:8])})")
            if want >= len(available):
                raise LmlabError(f"{role.flag} {want}: {p} has {len(available)} columns",
                                 f"choose an index below {len(available)}")
            out[role.name] = available[want]
        elif want is not None:
            if allow_index and want not in available:  # a Parquet schema is the same for every row
                raise LmlabError(f"{p} has no column {want!r} (it has: {', '.join(available[:12])})",
                                 f"pass {role.flag} with one of its columns")
            out[role.name] = want
        else:
            found = next((n for n in role.names if n in available and n not in out.values()), None)
            if found is not None:
                out[role.name] = found
            elif role.required:
                raise LmlabError(f"{p}: no field for the {role.name.replace('_', ' ')} (it has: "
                                 f"{', '.join(available[:12])}; looked for {', '.join(role.names)})",
                                 f"pass {role.flag} NAME")
    return out


def _read_jsonl(p: Path, roles: Sequence[Role], chosen: dict[str, str | int], bad) -> Rows:
    from lmlab.data.records import iter_json_lines

    out: Rows = []
    cols: dict[str, str] | None = None
    optional = {r.name for r in roles if not r.required}
    for lineno, record in iter_json_lines(p):
        where = f"{p} line {lineno}"
        if isinstance(record, json.JSONDecodeError):
            bad(where, f"invalid JSON ({record.msg} at column {record.colno})")
            continue
        if not isinstance(record, dict):
            bad(where, f"a JSON {type(record).__name__}, not an object")
            continue
        if cols is None:  # the first object's fields settle the roles left to their usual names
            cols = _named_columns(p, roles, chosen, list(record), allow_index=False)
        missing = [f for role, f in cols.items() if role not in optional and record.get(f) is None]
        if missing:
            have = ", ".join(list(record)[:8]) or "no fields"
            bad(where, f"no value for field {missing[0]!r} (it has: {have})")
            continue
        out.append((where, {role: record.get(f) for role, f in cols.items()}))
    if cols is None and not out:
        raise LmlabError(f"{p} holds no JSON objects", "write one JSON object per line (JSON Lines)")
    return out


def _read_parquet(p: Path, roles: Sequence[Role], chosen: dict[str, str | int], bad) -> Rows:
    from lmlab.data.records import iter_parquet_rows, open_parquet

    names = open_parquet(p).schema_arrow.names
    cols = _named_columns(p, roles, chosen, names, allow_index=True)
    optional = {r.name for r in roles if not r.required}
    out: Rows = []
    for n, row in enumerate(iter_parquet_rows(p, sorted(set(cols.values()))), 1):
        where = f"{p} row {n}"
        missing = [f for role, f in cols.items() if role not in optional and row.get(f) is None]
        if missing:
            bad(where, f"column {missing[0]!r} is empty (null)")
            continue
        out.append((where, {role: row.get(f) for role, f in cols.items()}))
    return out

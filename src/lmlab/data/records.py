"""Documents from record files: JSON Lines and Parquet, one record = one document.

=============================================  ==========================================
file                                           read with
=============================================  ==========================================
``*.jsonl``, ``*.jsonl.gz``, ``*.jsonl.zst``   one JSON object per line (zstandard for .zst)
``*.parquet``                                  pyarrow, one row group at a time
a ``datasets`` folder (``save_to_disk``)       pyarrow, one record batch at a time (the
                                               folder's Arrow files, in ``state.json``'s order)
=============================================  ==========================================

Each record's ``text_field`` (default ``text``, ``data.text_field`` / ``--text-field``) is the
document; the other fields are ignored. Memory stays bounded by one line or one row group,
never the file. A record without the field, a field that is not a string, or a line that is not
JSON stops the run with a one-line error naming the file and the record: a file that reads wrong
must not quietly shrink the corpus. Blank lines between JSON records are allowed; records whose
text is only whitespace are dropped, like blank documents in text files.

Parquet and ``.zst`` need the optional ``data`` extra (``pip install 'lmlab[data]'``: pyarrow,
zstandard); nothing else does.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.fileio import inside, iter_text_lines, read_json
from lmlab.text_input import parse_json

JSONL_SUFFIXES = (".jsonl", ".jsonl.gz", ".jsonl.zst")
PARQUET_SUFFIXES = (".parquet",)
RECORD_SUFFIXES = JSONL_SUFFIXES + PARQUET_SUFFIXES
INSTALL = "pip install 'lmlab[data]'"


def is_dataset_dir(path: str | os.PathLike) -> bool:
    """A folder written by Hugging Face ``datasets``' ``save_to_disk`` (one split or all)."""
    p = Path(path)
    return p.is_dir() and ((p / "state.json").is_file() or (p / "dataset_dict.json").is_file())


def is_record_file(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(RECORD_SUFFIXES) or is_dataset_dir(path)


def input_stat(path: str | os.PathLike) -> tuple[int, int]:
    """``(bytes, newest modification time)`` of an input: a file, or a dataset folder's files."""
    p = Path(path)
    stats = [f.stat() for f in p.rglob("*") if f.is_file()] if p.is_dir() else [p.stat()]
    return sum(s.st_size for s in stats), int(max((s.st_mtime for s in stats), default=0))


def input_bytes(path: str | os.PathLike) -> int:
    return input_stat(path)[0]


def iter_record_texts(path: str | os.PathLike, text_field: str = "text") -> Iterator[str]:
    """The ``text_field`` of every record of ``path`` (JSON Lines, Parquet or a ``datasets``
    folder), in file order."""
    p = Path(path)
    if is_dataset_dir(p):
        yield from _dataset_texts(p, text_field)
    elif str(p).lower().endswith(PARQUET_SUFFIXES):
        yield from _parquet_texts(p, text_field)
    else:
        yield from _jsonl_texts(p, text_field)


def _jsonl_lines(p: Path) -> Iterator[str]:
    """The lines of a JSON Lines file: plain and ``.gz`` through :func:`lmlab.fileio.iter_text_lines`
    (which names an undecodable line and a cut gzip stream), ``.zst`` through zstandard."""
    if not p.name.lower().endswith(".zst"):
        yield from iter_text_lines(p)
        return
    try:
        import zstandard
    except ImportError:
        raise LmlabError(f"reading {p} needs the zstandard package", INSTALL) from None
    # every frame, not just the first (pzstd and concatenated files hold several)
    stream = zstandard.ZstdDecompressor().stream_reader(open(p, "rb"), closefd=True, read_across_frames=True)
    try:
        with io.TextIOWrapper(stream, encoding="utf-8") as f:
            yield from f
    except UnicodeDecodeError as e:
        raise LmlabError(f"{p} is not UTF-8 text ({e.reason})", "JSON Lines files are UTF-8") from None
    except zstandard.ZstdError as e:
        raise LmlabError(f"{p} could not be read to the end ({e})",
                         "check the file (a complete zstandard stream?)") from None


def iter_json_lines(path: str | os.PathLike) -> Iterator[tuple[int, object]]:
    """``(line number, value)`` for each non-blank line of a JSON Lines file (plain, ``.gz`` or
    ``.zst``); a line that is not JSON gives its :class:`json.JSONDecodeError` as the value, for
    the caller to report (pretraining stops, fine-tuning applies its bad-line policy)."""
    for lineno, line in enumerate(_jsonl_lines(Path(path)), 1):
        if not line.strip():
            continue
        try:
            yield lineno, parse_json(line)
        except json.JSONDecodeError as e:
            yield lineno, e


def _jsonl_texts(p: Path, field: str) -> Iterator[str]:
    for lineno, record in iter_json_lines(p):
        if isinstance(record, json.JSONDecodeError):
            raise LmlabError(f"{p} line {lineno} is not JSON ({record.msg})",
                             "write one JSON object per line (JSON Lines)")
        yield _text_of(record, field, p, f"line {lineno}")


def _text_of(record, field: str, p: Path, where: str) -> str:
    if not isinstance(record, dict):
        raise LmlabError(f"{p} {where} is a JSON {type(record).__name__}, not an object",
                         'write one object per line, e.g. {"text": "..."}')
    if field not in record:
        have = ", ".join(sorted(record)[:8]) or "no fields"
        raise LmlabError(f"{p} {where} has no field {field!r} (it has: {have})",
                         "set data.text_field (--text-field) to the field that holds the text")
    value = record[field]
    if not isinstance(value, str):
        raise LmlabError(f"{p} {where}: field {field!r} is {type(value).__name__}, not text",
                         "choose a text field with data.text_field (--text-field)")
    return value


def open_parquet(path: str | os.PathLike):
    """A ``pyarrow.parquet.ParquetFile`` (one-line errors without pyarrow or for a damaged file)."""
    p = Path(path)
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise LmlabError(f"reading {p} needs pyarrow", INSTALL) from None
    try:
        return pq.ParquetFile(p)
    except Exception as e:  # pyarrow raises ArrowInvalid and friends for a file that is not Parquet
        raise LmlabError(f"{p} is not a readable Parquet file ({str(e).splitlines()[0]})",
                         "check the file") from None


def iter_parquet_rows(path: str | os.PathLike, columns: list[str]) -> Iterator[dict]:
    """The ``columns`` of every row of a Parquet file as a dict, one row group in memory at a time."""
    pf = open_parquet(path)
    for group in range(pf.num_row_groups):
        table = pf.read_row_group(group, columns=columns)
        yield from table.to_pylist()


def _parquet_texts(p: Path, field: str) -> Iterator[str]:
    pf = open_parquet(p)
    _check_text_column(pf.schema_arrow, field, p)
    rows = _Rows(p, field)
    for group in range(pf.num_row_groups):
        yield from rows.texts(pf.read_row_group(group, columns=[field]).column(0).to_pylist())


def _check_text_column(schema, field: str, p: Path) -> None:
    """``field`` is a string column of the Arrow ``schema`` (one-line errors otherwise)."""
    import pyarrow as pa

    if field not in schema.names:
        raise LmlabError(f"{p} has no column {field!r} (it has: {', '.join(schema.names[:8])})",
                         "set data.text_field (--text-field) to the column that holds the text")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise LmlabError(f"{p}: column {field!r} is {kind}, not text",
                         "choose a text column with data.text_field (--text-field)")


class _Rows:
    """Counts the rows of a columnar input and refuses a null text, naming its row."""

    def __init__(self, p: Path, field: str):
        self.p, self.field, self.row = p, field, 0

    def texts(self, values) -> Iterator[str]:
        for value in values:
            self.row += 1
            if value is None:
                raise LmlabError(f"{self.p} row {self.row}: column {self.field!r} is empty (null)",
                                 "drop or fill the rows without text")
            yield value


def _dataset_texts(p: Path, field: str) -> Iterator[str]:
    from lmlab import values
    from lmlab.file_schemas import DatasetDictFile, DatasetStateFile

    fix = "save the dataset again with save_to_disk"
    if (p / "dataset_dict.json").is_file():
        where = p / "dataset_dict.json"
        splits = values.check(DatasetDictFile, read_json(where, "datasets splits"), str(where), fix)["splits"]
        raise LmlabError(f"{p} holds several splits ({', '.join(splits)}), not one",
                         f"pass one of them, e.g. {p / splits[0]}")
    try:
        import pyarrow as pa
    except ImportError:
        raise LmlabError(f"reading {p} needs pyarrow", INSTALL) from None

    where = p / "state.json"
    state = values.check(DatasetStateFile, read_json(where, "datasets state"), str(where), fix)
    files = [inside(p, f["filename"] if isinstance(f, dict) else f, str(where)) for f in state["_data_files"]]
    rows = _Rows(p, field)
    for arrow in files:
        try:
            reader = pa.ipc.open_stream(pa.memory_map(str(arrow)))
        except Exception as e:  # pyarrow's errors for a missing or damaged file
            raise LmlabError(f"{arrow} is not a readable Arrow file ({str(e).splitlines()[0]})",
                             "save the dataset again with save_to_disk") from None
        _check_text_column(reader.schema, field, p)
        for batch in reader:
            yield from rows.texts(batch.column(field).to_pylist())

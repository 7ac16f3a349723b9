"""Reading and writing the TOML files every config section comes from: one reader (one error style
for a missing, malformed or non-UTF-8 file), one parser of a command-line value, one writer whose
output reads back to the same values."""

from __future__ import annotations

import math
import os
import re
import tomllib
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError


def read_toml(path: str | os.PathLike, what: str = "config file",
              example: str = "configs/gpt-tiny-clm.toml") -> dict[str, Any]:
    """The tables of the TOML file ``path`` (``what`` names it in errors, ``example`` is the fix)."""
    from lmlab.fileio import existing_file

    p = existing_file(path, what, f"pass a file such as {example}")
    try:
        # a UTF-8 byte-order mark (some editors write one) is dropped, as for every text lmlab reads
        return tomllib.loads(Path(p).read_bytes().decode("utf-8-sig"))
    except tomllib.TOMLDecodeError as e:
        raise LmlabError(f"{what} {p} is not valid TOML ({e})", "fix the line it names") from None
    except UnicodeDecodeError as e:
        bad = e.object[e.start:e.start + 1]
        raise LmlabError(f"{what} {p} is not UTF-8 (byte {bad!r} at offset {e.start})",
                         "save it as UTF-8 (TOML files always are)") from None


def key_line(path: str | os.PathLike, dotted: str) -> int | None:
    """The line (1-based) of ``path`` where ``dotted`` (``train.lr``) is written, when it can be
    found by reading the file's table headers and ``key =`` lines; else None."""
    *tables, key = dotted.split(".")
    table, pattern = "", re.compile(rf"\s*(\"?){re.escape(key)}\1\s*=")
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    for number, line in enumerate(lines, 1):
        header = re.fullmatch(r"\s*\[([^\[\]]+)\]\s*(#.*)?", line)
        if header:
            table = header.group(1).strip()
        elif table == ".".join(tables) and pattern.match(line):
            return number
    return None


def parse_value(text: str) -> Any:
    """A command-line value: a TOML literal (``3e-4``, ``true``, ``[1, 2]``, ``"x"``), else the raw text."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def to_toml(data: dict[str, Any]) -> str:
    """``data`` (a dict of tables) as TOML text; None values are left out."""
    lines: list[str] = []

    def emit(table: dict, path: str) -> None:
        scalars = {k: v for k, v in table.items() if not isinstance(v, dict)}
        tables = {k: v for k, v in table.items() if isinstance(v, dict)}
        if path:
            lines.append(f"[{path}]")
        for k, v in scalars.items():
            if v is not None:
                lines.append(f"{toml_key(k)} = {toml_value(v)}")
        lines.append("")
        for k, v in tables.items():
            emit(v, f"{path}.{toml_key(k)}" if path else toml_key(k))

    emit(data, "")
    return "\n".join(lines).strip() + "\n"


def toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_value(k)


def toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v) if math.isfinite(v) else ("nan" if v != v else ("inf" if v > 0 else "-inf"))
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        items = (f"{toml_key(k)} = {toml_value(x)}" for k, x in v.items() if x is not None)
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")

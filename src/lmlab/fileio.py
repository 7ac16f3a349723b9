"""File helpers: reading user text safely and writing outputs atomically.

Nothing lmlab writes is ever left half-written: files and directories are written under a
temporary name next to their destination and renamed into place only when complete.
"""

from __future__ import annotations

import codecs
import contextlib
import gzip
import json
import os
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmlab import budget, ownership
from lmlab.errors import LmlabError
from lmlab.text_input import SURROGATE, surrogate_problem


def existing_file(path: str | os.PathLike, what: str = "input file", fix: str = "check the path") -> Path:
    """``path`` as a Path when it is a file that exists, else a one-line error saying which it is not:
    missing, a directory, or something else (a socket, a dangling link). The one check of every file
    lmlab reads by name (text, JSON, TOML recipes, schemas...): ``what`` names it, ``fix`` is the fix
    for a missing one."""
    p = Path(path)
    if p.is_dir():
        raise LmlabError(f"{what} {p} is a directory", "pass a file, not a folder")
    if not p.exists():
        raise LmlabError(f"{what} {p} does not exist", fix)
    if not p.is_file():
        raise LmlabError(f"{what} {p} is not a regular file", "pass a file")
    return p


def check_input_file(path: str | os.PathLike) -> Path:
    """Return ``path`` as a Path, or raise a one-line error if it is missing, a directory or empty."""
    p = existing_file(path)
    if p.stat().st_size == 0:
        raise LmlabError(f"input file {p} is empty", "pass a file that contains text")
    return p


def inside(directory: str | os.PathLike, name: object, what: str) -> Path:
    """``directory / name`` for a file name read from a file of ``directory`` (an index, a weight
    map), or a one-line error when the name points elsewhere (absolute, ``..``, a link out)."""
    base = Path(directory)
    if not isinstance(name, str) or not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise LmlabError(f"{what} names {name!r}, which is not a file inside {base}",
                         "re-create the files with lmlab (a file's entries must stay in its own directory)")
    path = base / name
    if base.resolve() not in path.resolve().parents:
        raise LmlabError(f"{what} names {name!r}, which leads outside {base}",
                         "re-create the files with lmlab (a file's entries must stay in its own directory)")
    return path


def check_name(name: str, what: str) -> str:
    """A name that becomes part of a file name: letters, digits, ``.``, ``_``, ``-``, not hidden."""
    if not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", name or "") or ".." in name:
        raise LmlabError(f"{what} {name!r} cannot be part of a file name",
                         "use letters, digits, '.', '_' and '-' only (no '/', no '..')")
    return name


def check_encoding(encoding: str) -> None:
    """One-line error for a codec name Python does not know."""
    try:
        "".encode(encoding)
    except LookupError:
        raise LmlabError(f"unknown encoding {encoding!r}",
                         "pass a Python codec name such as utf-8 or latin-1") from None


#: what a decoding error says to do, when the user may name the file's encoding (a command's
#: ``--encoding``, a recipe's ``data.encoding``) and when the file is UTF-8 by definition
ENCODING_FIX = ("convert the file to UTF-8 or pass its encoding (--encoding, data.encoding in a recipe; "
                "e.g. latin-1, utf-16-le)")
UTF8_FIX = "convert the file to UTF-8 (lmlab reads this file as UTF-8)"


def iter_text_lines(path: str | os.PathLike, encoding: str | None = None) -> Iterator[str]:
    """Stream a text file line by line (newlines kept), with a clear error on undecodable bytes.

    A UTF-8 byte-order mark at the start is dropped. ``encoding`` may be any Python codec name
    (e.g. ``latin-1`` for ISO-8859-1 files); None (UTF-8) for a file whose encoding the user cannot
    choose, so the error does not suggest ``--encoding``. A file whose name ends in ``.gz`` is read
    through gzip. The one reader of text files: bytes that are not text in the encoding are one
    line naming the file, the line and the byte offset, whichever codec refuses them (utf-16
    without a byte-order mark included).
    """
    fix = UTF8_FIX if encoding is None else ENCODING_FIX
    encoding = encoding or "utf-8"
    check_encoding(encoding)
    p = check_input_file(path)
    enc = "utf-8-sig" if encoding.lower().replace("_", "-") in ("utf-8", "utf8") else encoding
    lineno = 0
    try:
        with _open(p, "rt", encoding=enc, newline="") as f:
            for lineno, line in enumerate(_bounded_lines(f, p), 1):  # noqa: B007
                if enc != "utf-8-sig" and SURROGATE.search(line):  # utf-7, unicode_escape... may make one
                    raise LmlabError(f"{p} line {lineno} is not text in {encoding} "
                                     f"({surrogate_problem(line, escaped_bytes=False)})", fix)
                yield line
    except (gzip.BadGzipFile, EOFError) as e:
        raise LmlabError(f"{p} is not a complete gzip file ({e})",
                         "re-download or re-compress it, or pass the uncompressed text") from None
    except UnicodeError as e:  # UnicodeDecodeError, and the bare UnicodeError of utf-16/32 without a BOM
        # The reader decodes ahead in chunks, so the line being read is not the bad one: find it.
        found = _locate_decode_error(p, enc)
        if found is None:
            bad = e.object[e.start:e.start + 1] if isinstance(e, UnicodeDecodeError) else None
            found = (lineno + 1, None, f"byte {bad!r}" if bad else str(e))
        bad_line, offset, what = found
        at = f", byte offset {offset:,}" if offset is not None else ""
        raise LmlabError(
            f"{p} line {bad_line}{at}: not valid {encoding} ({what})", fix) from None


def require_text(items: Iterable[str], path: str | os.PathLike) -> Iterator[str]:
    """``items`` (the lines or documents read from the corpus file ``path``) as they come, then a
    one-line error if none held anything but whitespace: the one check of "this corpus file has
    text" that every command training on a corpus applies (``data prepare``, ``tokenizer train``,
    a recipe's tokenizer)."""
    seen = False
    for item in items:
        seen = seen or not item.isspace() and item != ""
        yield item
    if not seen:
        raise LmlabError(f"input file {path} holds only whitespace", "pass files that contain text")


def _open(path: Path, mode: str, **kwargs):
    """``open``, or ``gzip.open`` for a ``.gz`` file (a stream: it is decompressed as it is read)."""
    return gzip.open(path, mode, **kwargs) if path.suffix == ".gz" else open(path, mode, **kwargs)


def _bounded_lines(f, path: Path) -> Iterator[str]:
    """The lines of the open text file ``f``, each refused beyond :data:`lmlab.budget.MAX_LINE_CHARS`
    characters (a file without line breaks, a compressed file that expands without end) before it
    is held whole: only a plain file too small to have such a line is read without the check."""
    limit = budget.MAX_LINE_CHARS
    if path.suffix != ".gz" and path.stat().st_size <= limit:
        yield from f
        return
    read, lineno = f.readline, 0
    while line := read(limit + 1):
        lineno += 1
        if len(line) > limit and line[-1] not in "\r\n":
            raise LmlabError(f"{path} line {lineno} is longer than {limit:,} characters (a file without "
                             "line breaks, or a compressed file that expands without end)",
                             "split the text into lines, or pass another file")
        yield line


def _locate_decode_error(path: Path, encoding: str) -> tuple[int, int, str] | None:
    """``(1-based line number, byte offset, what is wrong)`` of the first undecodable bytes in
    ``path``, if found (read in pieces of at most 1 MB: a line is never held whole): ``"byte
    b'\\xff'"``, or the codec's own words (``UTF-16 stream does not start with BOM``). The offset
    counts the bytes of the decompressed text for a ``.gz`` file."""
    decoder = codecs.getincrementaldecoder(encoding)()
    lineno, offset = 1, 0
    with _open(path, "rb") as f:
        while True:
            raw = f.readline(1 << 20)
            pending = len(decoder.getstate()[0])  # bytes of an unfinished character, held from before
            try:
                decoder.decode(raw, final=not raw)
            except UnicodeDecodeError as e:
                return lineno, offset - pending + e.start, f"byte {e.object[e.start:e.start + 1]!r}"
            except UnicodeError as e:  # a codec that refuses the stream as a whole (no BOM)
                return lineno, offset - pending, str(e)
            if not raw:
                return None
            offset += len(raw)
            lineno += raw.endswith(b"\n")


def read_text(path: str | os.PathLike, encoding: str | None = None) -> str:
    """Read a whole text file (see :func:`iter_text_lines` for the checks)."""
    return "".join(iter_text_lines(path, encoding))


def check_replaceable_dir(dest: str | os.PathLike, marker: str, what: str, fix: str | None = None) -> Path:
    """``dest`` (resolved), or a one-line error when writing a ``what`` there would lose files.

    Ownership is decided in one place, :mod:`lmlab.ownership`: an existing folder is replaced only
    when its manifest proves it is an earlier ``what`` that lmlab wrote and it holds nothing else.
    ``marker`` (the file every such output holds) is kept for callers; it proves nothing. ``fix``:
    what the error says to do (:func:`lmlab.ownership.keep_work_fix` for a resumable command)."""
    return ownership.check_replaceable_dir(dest, what, fix)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike, marker: str, what: str = "lmlab",
               fix: str | None = None) -> Iterator[Path]:
    """Yield a temporary folder that replaces ``dest`` only if the block completes.

    An existing ``dest`` survives untouched if anything fails while writing, and is replaced at
    all only when lmlab provably wrote it as an earlier ``what`` (:mod:`lmlab.ownership`). The new
    folder gets a manifest listing every file in it, so the next run may replace it in turn.
    ``fix``: what the error says to do when ``dest`` is taken (:func:`check_replaceable_dir`)."""
    dest = ownership.check_replaceable_dir(dest, what, fix)
    # the folders made for it are removed again if the block fails (ownership.parents_made)
    with ownership.parents_made(dest):
        ownership.remove_leftovers(dest.parent, dest.name)
        with ownership.temporary_dir(dest.parent, dest.name, what) as tmp:
            yield tmp
            if not (tmp / marker).is_file():
                raise RuntimeError(f"atomic_dir({dest}): the {what} written has no {marker}")  # a bug
            _usual_permissions(tmp)
            ownership.seal(tmp, what)
            replace_dir(tmp, dest, what, fix)


def remove_leftovers(directory: Path, name: str | None = None, only_dead: bool = False) -> list[Path]:
    """Remove the temporaries lmlab left in ``directory`` (see :func:`lmlab.ownership.remove_leftovers`:
    only folders whose manifest proves they are lmlab's; a user's file named like one is kept).
    Without ``only_dead`` the caller holds the directory's lock, so no lmlab process is writing
    there; with it, only those whose process has ended are removed."""
    return ownership.remove_leftovers(Path(directory), name, locked=not only_dead)


def replace_dir(src: Path, dest: Path, kind: str, fix: str | None = None) -> None:
    """Move the finished folder ``src`` to ``dest`` (same file system), replacing an old ``dest``
    with two renames, never a moment without a complete one. The old one is checked again once it
    is moved aside: a file that appeared in it while lmlab was writing makes it the user's, and it
    is put back untouched (a one-line error saying ``fix``, if given; ``src`` is left for the caller
    to remove)."""
    if dest.exists() or dest.is_symlink():
        old = ownership.move_aside(dest, f"old-{os.getpid()}")  # marked: a kill leaves a provable leftover
        verdict = ownership.may_replace_dir(old, kind)
        if not verdict.ok:
            ownership.settle(old, dest)  # put back as it was, unmarked
            raise LmlabError(f"output folder {dest} changed while lmlab was writing: it {verdict.reason}; "
                             "it was left as it is",
                             fix or "choose a new --out, or move those files away and run again")
        ownership.settle(src, dest)
        ownership.remove_temporary(old)  # its marker last: a kill leaves a provable leftover
    else:
        ownership.settle(src, dest)


@contextlib.contextmanager
def directory_lock(directory: str | os.PathLike, what: str = "run directory") -> Iterator[None]:
    """Hold an exclusive lock on ``directory`` (its ``.lock`` file) for the block, or raise a one-line
    error naming the process that holds it. The operating system drops the lock when its process
    ends, however it ends (kill -9 included), so a stale lock never blocks the next run."""
    d = Path(directory)
    with ownership.parents_made(d):
        d.mkdir(exist_ok=True)
        with _locked(d, what):
            yield


@contextlib.contextmanager
def _locked(d: Path, what: str) -> Iterator[None]:
    import fcntl
    import socket

    f = open(d / ".lock", "a+", encoding="utf-8")  # noqa: SIM115 - held for the whole block
    try:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "another process"
            raise LmlabError(f"{what} {d} is in use by {holder}",
                             "wait for that run to finish, or choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"lmlab process {os.getpid()} on {socket.gethostname()}\n")
        f.flush()
        yield
    finally:
        f.close()  # closing releases the lock


def _usual_permissions(directory: Path) -> None:
    """Files and folders under ``directory`` readable as the user's umask says (0644/0755 usually):
    some writers (safetensors) create files private to their owner, unlike everything else."""
    mask = ownership.current_umask()
    for p in directory.rglob("*"):
        if not p.is_symlink():
            os.chmod(p, (0o777 if p.is_dir() else 0o666) & ~mask)


def atomic_write_bytes(dest: str | os.PathLike, data: bytes, kind: str | None = None) -> None:
    """Write ``data`` to ``dest`` via a temporary file and rename. The temporary file lives in a
    marked temporary folder beside ``dest`` (:func:`lmlab.ownership.temporary_dir`), so a kill
    mid-write leaves nothing a later run could mistake for, or that looks like, a user's file.

    In a folder a command fills (a run, a fit's folder...), ``dest`` is written over only while it
    is what lmlab wrote there (a one-line error otherwise, the file left as it is), and is stamped
    in that folder's manifest once written (:func:`lmlab.ownership.record_file`; ``kind``: the kind
    of single-file output it is, :func:`write_output_file`)."""
    dest = Path(dest)
    ownership.check_overwrite(dest)
    with ownership.parents_made(dest), ownership.temporary_dir(dest.parent, dest.name, "file") as tmp:
        part = tmp / dest.name
        with open(part, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(part, 0o666 & ~ownership.current_umask())
        os.replace(part, dest)
        ownership.remove_temporary(tmp)
    ownership.record_file(dest, kind)


def append_line(path: str | os.PathLike, line: str) -> None:
    """Append ``line`` (a newline added) to the log ``path`` and flush it, so a killed run keeps its
    log; stamped like every file lmlab writes (:func:`lmlab.ownership.record_file`), by size and
    time only: hashing a growing log at every line would cost its length each time."""
    path = Path(path)
    with ownership.parents_made(path):
        with open(path, "a", encoding="utf-8") as f:
            f.write(line.rstrip("\n") + "\n")
            f.flush()
    ownership.record_file(path, hashed=False)


def write_output_file(dest: str | os.PathLike, data: bytes | str, kind: str, flag: str = "--out") -> Path:
    """Write a single-file output (``--predictions``, ``fit.json``) the user named: refused in one
    line when ``dest`` holds a file lmlab did not write (:mod:`lmlab.ownership`), then written
    atomically and recorded in its folder's manifest so a later run may replace it."""
    dest = ownership.check_replaceable_file(dest, kind, flag)
    atomic_write_bytes(dest, data.encode("utf-8") if isinstance(data, str) else data, kind)
    return dest


def atomic_write_text(dest: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(dest, text.encode("utf-8"))


def json_bytes(obj, indent: int | None = 2) -> bytes:
    """``obj`` as the bytes of a JSON file (UTF-8, non-ASCII kept readable)."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent) + "\n"
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:  # a file name that is not UTF-8 (kept by Python as lone surrogates)
        return (json.dumps(obj, ensure_ascii=True, indent=indent) + "\n").encode("ascii")


def write_json(dest: str | os.PathLike, obj, indent: int | None = 2) -> None:
    """Write JSON atomically (UTF-8, non-ASCII kept readable)."""
    atomic_write_bytes(dest, json_bytes(obj, indent))


#: the fix of a corrupt JSON file that lmlab wrote
REWRITE = "re-create it, e.g. by training or saving again"


def read_json(path: str | os.PathLike, what: str = "JSON file", fix: str = REWRITE):
    """Read JSON with a one-line error naming the file when it is missing or corrupt. ``fix``: what
    to do about a corrupt one (default: write it again, for a file lmlab writes; a file the user or
    another tool wrote says how to mend it)."""
    p = existing_file(path, what)
    try:
        with open(p, encoding="utf-8-sig") as f:  # a byte-order mark (some editors write one) is dropped
            return json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise LmlabError(f"{what} {p} is corrupt ({e.__class__.__name__}: {e})", fix) from None
    except RecursionError:
        raise LmlabError(f"{what} {p} is nested too deeply to read",
                         "flatten it (or, if lmlab wrote it, write it again)") from None

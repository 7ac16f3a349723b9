"""Who owns a file or folder: the one place that decides whether lmlab may replace or delete it.

lmlab replaces or deletes only what it can prove it wrote. The proof is a manifest,
``.lmlab-manifest.json``, that lmlab puts in every folder it writes:

* a **whole output** (a tokenizer, a model, token shards, a fine-tuned model...) is written under a
  temporary name and renamed into place (:func:`lmlab.fileio.atomic_dir`); its manifest names its
  kind and lists every file with its size and modification time, and every empty folder
  (:func:`list_files`), so a later run may replace it only while it still holds exactly those. A
  file, link or folder the user added, or a file the user edited, makes the folder theirs again:
  it is refused, never wiped.
* a **folder written over time** (a pretraining run, the demo's folder, a comparison grid) is
  claimed when it is new or empty (:func:`claim_dir`); its manifest names the entries the command
  writes there (``metrics.jsonl``, ``checkpoints``...) and stamps every file lmlab writes there
  as it finishes writing it (:func:`record_file`). Entries the user adds are never touched; a file
  of an entry is written again (:func:`check_overwrite`) or deleted (:func:`remove_owned_tree`)
  only while its stamp matches. A command that ends having written nothing there gives the claim
  back (:func:`claimed_dir`), so a refused or stopped command leaves no trace.
* a **single file** written into a user's folder (``--predictions``, ``fit.json``) is recorded in
  that folder's manifest (:func:`record_file`), and replaced only while it is unchanged. Written
  beside the entries of a folder another command fills (results beside a run's checkpoint), it is
  recorded in that folder's manifest apart from that command's files (:data:`BESIDE`): never that
  command's to replace or delete, and replaced by its own kind of output while unchanged.
* a **temporary** (``.NAME.tmp-PID-*``, ``.NAME.old-PID``, ``.NAME.prune-PID``) is always a folder
  holding a marker (:data:`TEMPORARY_MARKER`) that names it and the process writing it, apart from
  the manifest of what is saved into it; it is removed as a leftover only when that marker is there
  and the process has ended, its marker last (:func:`remove_temporary`), so a removal cut short
  leaves one still provable. A user's file that merely looks like one is kept.
  What a command writes beside its output while it runs (a live metrics log) is one too
  (:func:`live_dir`).

A marker file (``config.json``, ``tokenizer.json``) says what a folder *is*, never who owns it.

Every name lmlab derives from an output's name (its temporaries, ``.NAME.old-PID``,
``.NAME.prune-PID``, ``.NAME.resume``) comes from :func:`derived_name`, within the file system's
limit on a name however long the output's name is. The folders made above an output are made by
:func:`parents_made`, which removes them again when the command fails.

Before any of this, every output of every command passes two checks here: it may not be, hold or lie
inside one of the command's inputs (:func:`check_output_spares_inputs`), and it must be somewhere
lmlab can write, under names the file system takes, and not inside another lmlab output
(:func:`check_destination`, :func:`check_not_inside_output`): only the command that fills a folder
writes inside it (:func:`filling`), and nothing is written into a whole output once it is sealed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from lmlab.errors import LmlabError, a_or_an

MANIFEST = ".lmlab-manifest.json"
FORMAT = 1
#: the marker naming a temporary, apart from any manifest (what is saved into a temporary writes its
#: own): lmlab puts it into a new temporary (``.NAME.tmp-PID-*``) and into a finished output just
#: before it renames it aside (``.NAME.old-PID``, ``.NAME.prune-PID``), and deletes it last; only that
#: very folder is ever taken for a leftover
TEMPORARY_MARKER = ".lmlab-temporary.json"
#: files lmlab keeps beside what it writes and that never make a folder the user's
BOOKKEEPING = frozenset({MANIFEST, ".lock", TEMPORARY_MARKER})
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<what>tmp|old|prune)-(?P<pid>\d+)(?:-.*)?")
_HOST = socket.gethostname()


#: how an output path lmlab derived itself, not given by the user, is named in errors (``evaluate
#: --harness``'s results file beside the checkpoint): ``the default --out PATH``, never ``--out
#: PATH`` as if the user had typed it; the fix still names the option (:func:`option`)
DEFAULT_LABEL = "the default "


def default_flag(flag: str) -> str:
    """The label of the output ``flag`` when lmlab derived its path (:data:`DEFAULT_LABEL`)."""
    return DEFAULT_LABEL + flag


def option(flag: str) -> str:
    """The option a label names (``--out`` for ``the default --out``): what a fix tells the user to pass."""
    return flag[len(DEFAULT_LABEL):] if flag.startswith(DEFAULT_LABEL) else flag


# ------------------------------------------------------------------------------------- manifests
def read_manifest(directory: Path) -> dict | None:
    """The manifest of ``directory`` when it is a well-formed lmlab manifest, else None."""
    path = Path(directory) / MANIFEST
    if path.is_symlink() or not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError, RecursionError):
        return None
    if (not isinstance(data, dict) or data.get("lmlab_manifest") != FORMAT
            or not isinstance(data.get("entries", {}), dict)):
        return None
    return data


def write_manifest(directory: Path, data: dict) -> None:
    """Write ``directory``'s manifest (via a temporary file in the same folder and a rename)."""
    directory = Path(directory)
    data = {"lmlab_manifest": FORMAT, **data}
    tmp = directory / f"{MANIFEST}.{os.getpid()}"
    text = json.dumps(data, ensure_ascii=True, indent=1, sort_keys=True) + "\n"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, 0o666 & ~current_umask())
    os.replace(tmp, directory / MANIFEST)


def _stamp(path: Path, hashed: bool = False) -> dict:
    """``path``'s size and modification time; ``hashed``: and, for a regular file, the sha256 of
    its contents (recorded when lmlab stamps what it wrote, so that a copy with other times, ``cp
    -r``, is still known for what it is: :func:`_matches`)."""
    st = path.lstat()
    found = {"size": st.st_size, "mtime_ns": st.st_mtime_ns}
    if hashed and not path.is_symlink() and path.is_file():
        found["sha256"] = _sha256(path)
    return found


def _sha256(path: Path) -> str | None:
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    except OSError:
        return None
    return digest.hexdigest()


#: how an empty folder is recorded (it has no size or time worth comparing)
FOLDER = {"folder": True}


def list_files(directory: Path, hashed: bool = False) -> dict[str, dict]:
    """Everything under ``directory`` that a manifest must account for, bookkeeping aside: every file
    and link (relative POSIX path -> size and mtime) and every empty folder (-> :data:`FOLDER`), so
    an empty folder someone made inside an output is as visible as a file would be. ``hashed``:
    with each regular file's sha256 too (what lmlab records, :func:`_stamp`)."""
    found: dict[str, dict] = {}
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        links = [d for d in dirs if (base / d).is_symlink()]
        for name in files + links:
            rel = (base / name).relative_to(directory).as_posix()
            if rel not in BOOKKEEPING:
                found[rel] = _stamp(base / name, hashed)
        if not files and not dirs and base != Path(directory):
            found[base.relative_to(directory).as_posix()] = dict(FOLDER)
    return found


def _matches(recorded: object, path: Path, now: dict | None = None) -> bool:
    """Whether ``path`` is as ``recorded`` says lmlab left it: the same size and time for a file or a
    link, or the same size and contents (the sha256 recorded with it) for a file copied since;
    still a folder for a recorded empty folder."""
    if not isinstance(recorded, dict) or recorded.get("tree"):
        return False
    if recorded.get("folder"):
        return path.is_dir() and not path.is_symlink()
    now = now or _stamp(path)
    if now.get("folder") or recorded.get("size") != now["size"]:
        return False
    if recorded.get("mtime_ns") == now["mtime_ns"]:
        return True
    # another time, the same size: a copy (cp -r) or a touch keeps what lmlab wrote when its
    # contents are the very bytes recorded; an edit that kept the size does not
    sha = recorded.get("sha256")
    return isinstance(sha, str) and not path.is_symlink() and path.is_file() and _sha256(path) == sha


def seal(directory: Path, kind: str) -> None:
    """Record ``directory``, just written by this process, as a complete ``kind`` output."""
    write_manifest(directory, {"kind": kind, "state": "complete",
                               "entries": list_files(directory, hashed=True)})


def start_temporary(directory: Path, kind: str, pid: int | None = None) -> None:
    """Mark the new temporary folder ``directory`` as this process's work in progress (``pid``: the
    process named in its name, this one unless given): its ``writing`` manifest, and apart from it
    the :data:`TEMPORARY_MARKER` naming this very temporary (its name, with the random characters it
    was made with), so a copy or a look-alike is never taken for it (:func:`is_dead_leftover`). The
    marker is the proof that outlives what is saved into the folder: a model or a tokenizer sealed
    there replaces the manifest (:func:`seal`), never the marker."""
    pid = os.getpid() if pid is None else pid
    write_manifest(directory, {"kind": kind, "state": "writing", "pid": pid,
                               "host": _HOST, "name": Path(directory).name, "entries": {}})
    mark_aside(directory, Path(directory).name, pid)


def mark_aside(directory: Path, aside: str, pid: int | None = None) -> None:
    """Write into ``directory`` the marker naming the temporary ``aside`` (:data:`TEMPORARY_MARKER`:
    its name, the process ``pid`` (this one unless given), this host, a random token): the proof
    that an ``aside`` left by a killed process is lmlab's (:func:`is_dead_leftover`). Written into a
    new temporary (:func:`start_temporary`), and into a finished output just before it is renamed
    to ``aside`` (``.NAME.old-PID``, being replaced; ``.NAME.prune-PID``, being deleted)."""
    import secrets

    _write_marker(directory, {"lmlab_temporary": FORMAT, "name": aside,
                              "pid": os.getpid() if pid is None else pid, "host": _HOST,
                              "token": secrets.token_hex(8)})


def _write_marker(directory: Path, data: dict) -> None:
    """Write the :data:`TEMPORARY_MARKER` of ``directory`` in one step (a temporary, then a rename)."""
    tmp = Path(directory) / f"{TEMPORARY_MARKER}.{os.getpid()}"
    tmp.write_text(json.dumps(data) + "\n", encoding="utf-8")
    os.replace(tmp, Path(directory) / TEMPORARY_MARKER)


def settle(src: Path, dest: Path) -> None:
    """Rename the finished folder ``src`` (a marked temporary) to ``dest``, where nothing stands,
    its marker fitting its new name: a ``dest`` named as this process's temporary (an output saved
    into the temporary of the output that holds it: ``compress``, ``finetune --lr auto``) is marked
    as that temporary before the rename, so that it stays provably lmlab's if the process is killed;
    anywhere else the marker goes once the folder is in place (it names a temporary no longer
    there, and proves nothing)."""
    src, dest = Path(src), Path(dest)
    own = _named_own_temporary(dest)
    if own:
        mark_aside(src, dest.name)
    os.replace(src, dest)
    if not own:
        with contextlib.suppress(OSError):
            os.unlink(dest / TEMPORARY_MARKER)


def remove_temporary(path: Path) -> None:
    """Delete the temporary folder ``path`` (``.NAME.tmp-PID-*``, ``.NAME.old-PID``,
    ``.NAME.prune-PID``) with its proof last: first all else, then its manifest, then its
    :data:`TEMPORARY_MARKER`, so that a deletion cut short (a kill) leaves a folder still provably
    lmlab's, which the next start removes (:func:`is_dead_leftover`)."""
    path = Path(path)
    if path.is_symlink() or not path.is_dir():
        return
    marker = _read_marker(path)
    if marker is not None:  # once cut short, it is being deleted: never put back as an output
        _write_marker(path, {**marker, "deleting": True})
    proof = (MANIFEST, ".lock", TEMPORARY_MARKER)
    with contextlib.suppress(OSError):
        for child in list(path.iterdir()):
            if child.name in proof:
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    child.unlink()
    for name in proof:
        with contextlib.suppress(OSError):
            (path / name).unlink()
    shutil.rmtree(path, ignore_errors=True)  # whatever is left (nothing, unless a deletion failed)


def move_aside(directory: Path, what: str) -> Path:
    """Rename the finished output ``directory`` aside, to ``.NAME.WHAT`` (:func:`derived_name`;
    ``old-PID`` or ``prune-PID``), marked first (:func:`mark_aside`). Returns the new path."""
    directory = Path(directory)
    aside = directory.with_name(derived_name(directory.name, directory.parent, what))
    mark_aside(directory, aside.name)
    os.replace(directory, aside)
    return aside


# ------------------------------------------------------------------------------------ decisions
@dataclass
class Verdict:
    """Whether a path may be replaced, and if not, why (one example of what would be lost)."""

    ok: bool
    reason: str = ""


def foreign_entries(directory: Path, manifest: dict | None, emptied: bool = False) -> list[str]:
    """What in ``directory`` lmlab did not write, as far as ``manifest`` proves (first few).
    ``emptied``: a folder lmlab wrote files into, found empty (a deletion cut short:
    :func:`remove_temporary`), is still lmlab's."""
    if manifest is None:
        return sorted(p.name for p in directory.iterdir() if p.name not in BOOKKEEPING)[:3]
    entries = manifest.get("entries", {})
    trees = {k for k, v in entries.items() if isinstance(v, dict) and v.get("tree")}
    parents = {parent.as_posix() for rel in entries for parent in Path(rel).parents} if emptied else set()
    foreign = []
    for rel, stamp in list_files(directory).items():
        top = rel.split("/", 1)[0]
        if top in trees or (stamp.get("folder") and rel in parents):
            continue
        if not _matches(entries.get(rel), directory / rel, stamp):  # a file, a link or an empty folder
            foreign.append(rel)
            if len(foreign) >= 3:
                break
    return foreign


def _own_temporary(manifest: dict | None) -> bool:
    return bool(manifest and manifest.get("state") == "writing" and manifest.get("pid") == os.getpid()
                and manifest.get("host") == _HOST)


def may_replace_dir(dest: Path, kind: str) -> Verdict:
    """May an output of ``kind`` replace the folder ``dest``? Yes when it does not exist, is empty,
    is this process's own temporary, or is an earlier ``kind`` output that lmlab wrote and that holds
    nothing else."""
    if not dest.exists() and not dest.is_symlink():
        return Verdict(True)
    if dest.is_symlink() or not dest.is_dir():
        return Verdict(False, "is not a folder")
    if not any(p.name not in BOOKKEEPING for p in dest.iterdir()):
        return Verdict(True)
    manifest = read_manifest(dest)
    if _own_temporary(manifest):
        return Verdict(True)
    if manifest is None:
        example = foreign_entries(dest, None)
        return Verdict(False, f"was not written by lmlab (it holds {', '.join(example)})")
    if manifest.get("kind") != kind:
        other = manifest.get("kind") or "folder of other outputs"
        return Verdict(False, f"is {a_or_an(other)}, not {a_or_an(kind)}")
    foreign = foreign_entries(dest, manifest)
    if foreign:
        return Verdict(False, f"holds files lmlab did not write or that changed since ({', '.join(foreign)})")
    return Verdict(True)


def _output_folder(dest: str | os.PathLike, keeps: str | None = None) -> tuple[Path, Path]:
    """(as given, resolved) for a folder output, or a one-line error for the root, a file or a place
    that cannot be written (:func:`check_destination`). ``keeps``: what lmlab keeps in ``dest``
    when it is not the output the user named but a folder derived from it (:func:`derived_name`:
    a fine-tuning's resume state): the error then names that obstacle, not ``--out``."""
    given = Path(dest)
    resolved = given.resolve()
    if resolved == resolved.parent:
        raise LmlabError(f"output {given} is the root of the file system", "choose a new folder for --out")
    if (resolved.exists() or resolved.is_symlink()) and not resolved.is_dir() and keeps:
        raise LmlabError(f"{given} is a file, in the way of the folder where lmlab keeps {keeps}; "
                         "nothing was written", f"move {given} away (it is not lmlab's), then run the same "
                         "command again")
    if resolved.exists() and not resolved.is_dir():
        raise LmlabError(f"output {given} is a file", "pass a folder path to --out")
    # a folder output is made and then filled: anywhere within another command's entry is refused
    # (fills), not only the names there, so run/checkpoints/mine is refused now, not after the work
    # the folder derived from the output's name (a resume folder, ``keeps``) is the claiming run's own
    with filling(resolved) if keeps else contextlib.nullcontext():
        check_destination(given, fills=True)
    return given, resolved


#: what to do about an output folder that is taken (see keep_work_fix for a command whose work is kept)
TAKEN_FIX = "choose a new --out, or move or delete that folder yourself"


def keep_work_fix(dest: str | os.PathLike, kept: str | os.PathLike) -> str:
    """The fix to say when the output ``dest`` of a resumable command is taken by something lmlab
    did not write: the command's work is kept in ``kept`` (its resume state), which belongs to this
    path, so another output path would start the work over; the other thing is moved away instead
    and the same command continues with ``--resume``."""
    import shlex

    there = shlex.quote(str(dest))
    return (f"move it away (mv {there} {shlex.quote(str(dest) + '.other')}) and run the same command with "
            f"--resume: the work is kept in {kept} (another --out would start over)")


def check_replaceable_dir(dest: str | os.PathLike, kind: str, fix: str | None = None) -> Path:
    """``dest`` (resolved) when a ``kind`` output may be written there, else a one-line error that
    names what would have been lost (``fix``: what to do, :data:`TAKEN_FIX` unless given). Nothing
    is left written either way."""
    given, resolved = _output_folder(dest)
    verdict = may_replace_dir(resolved, kind)
    if not verdict.ok:
        raise LmlabError(f"output folder {given} exists and {verdict.reason}; nothing was written",
                         fix or TAKEN_FIX)
    return resolved


def claim_dir(dest: str | os.PathLike, kind: str, entries: tuple[str, ...], create: bool = True,
              logs: tuple[str, ...] = (), keeps: str | None = None) -> Path:
    """Take ``dest`` as a folder that this ``kind`` of command fills over time, writing the top-level
    ``entries`` (files or folders) there. A new or empty folder is claimed (its manifest records the
    entries as lmlab's); a folder claimed earlier by the same kind is reused as it is (a resumed
    run, a re-run demo), unless one of its files is no longer what lmlab wrote there
    (:func:`claimed_file_verdict`: the command would write over it); anything else is refused in one
    line. Returns the resolved path. ``create=False``: only check, before the work, that the claim
    will succeed (nothing is made). ``logs``: the entries that are logs the command continues
    rather than writes anew (a run's ``metrics.jsonl``: a resumed run keeps its rows up to its
    checkpoint, a damaged one is named by its own check); they are not asked to be unchanged
    before they are written to, only before they are deleted. The folders above ``dest`` that it
    makes stay: use :func:`claimed_dir`, which removes them again when nothing was written.
    ``keeps``: what the folder holds when it is derived from the output's name, not the output
    itself (:func:`_output_folder`)."""
    given, resolved = _output_folder(dest, keeps)
    return _claim(given, resolved, kind, entries, create, logs)


def _claim(given: Path, resolved: Path, kind: str, entries: tuple[str, ...], create: bool,
           logs: tuple[str, ...] = ()) -> Path:
    manifest = read_manifest(resolved) if resolved.is_dir() else None
    if manifest is not None and manifest.get("kind") == kind and manifest.get("state") == "claimed":
        recorded = manifest.get("entries", {})
        # what it writes again must still be lmlab's, unchanged (while another process holds the
        # folder, that one is writing them: its lock refuses this command, lmlab.fileio.directory_lock)
        again = [e for e in entries if e in recorded and not _is_log(recorded[e])] \
            if _lock_is_free(resolved) else []
        for name in again:
            path = resolved / name
            # a file lmlab wrote there, or whatever stands in its place now (a folder included)
            if path.is_symlink() or (path.exists() and not path.is_dir()) \
                    or (path.is_dir() and "size" in (_recorded_file(manifest, name) or {})):
                verdict = claimed_file_verdict(manifest, name, path)
                if not verdict.ok:
                    raise LmlabError(f"output folder {given} holds {name}, which {verdict.reason}; "
                                     "nothing was written",
                                     f"move {name} out of {given} (or put back the one lmlab wrote) and run "
                                     "the same command again: the rest of the folder's work is kept")
        missing = [e for e in entries if e not in recorded]
        # a newer lmlab writes more entries: claim those not already there (checked by create=False too)
        clash = [e for e in missing if (resolved / e).exists() or (resolved / e).is_symlink()]
        if clash:
            raise LmlabError(f"output folder {given} holds {clash[0]}, which lmlab did not write there",
                             "choose a new --out, or move that file away")
        if missing and create:
            added = {e: _entry(e, logs) for e in missing}
            write_manifest(resolved, {**_body(manifest), "entries": {**recorded, **added}})
        return resolved
    if resolved.is_dir() and any(p.name not in BOOKKEEPING for p in resolved.iterdir()):
        if manifest is None:
            what = f"was not written by lmlab (it holds {', '.join(foreign_entries(resolved, None))})"
        elif manifest.get("kind") == kind:  # a finished output of this kind, not a folder filled over time
            what = f"is a finished {kind} output, not a folder this command fills"
        else:
            what = f"is {a_or_an(manifest.get('kind') or 'folder of other outputs')}, not {a_or_an(kind)}"
        raise LmlabError(f"output folder {given} exists and {what}; nothing was written",
                         "choose a new --out, or move or delete that folder yourself")
    if not create:
        return resolved
    made = not resolved.exists()
    make_parents(resolved)
    resolved.mkdir(exist_ok=True)
    owned = {e: _entry(e, logs) for e in entries}
    # "made": lmlab made the folder itself, so giving the claim back (release_claim) removes it too;
    # "stamped": every file lmlab writes here is recorded as it is written (record_file), so one that
    # is not recorded is not lmlab's (a claim of an lmlab before stamps trusts its entries whole)
    write_manifest(resolved, {"kind": kind, "state": "claimed", "entries": owned, "made": made,
                              "stamped": True, "files": {}})
    return resolved


def _entry(name: str, logs: tuple[str, ...]) -> dict:
    """How a claim records its entry ``name``: lmlab's (a tree: a file or a folder), and a log the
    command continues when it is one of ``logs``."""
    return {"tree": True, "log": True} if name in logs else {"tree": True}


def _is_log(entry: object) -> bool:
    return isinstance(entry, dict) and bool(entry.get("log"))


def _body(manifest: dict) -> dict:
    """``manifest`` without its format tag (what :func:`write_manifest` is given back)."""
    return {k: v for k, v in manifest.items() if k != "lmlab_manifest"}


def _holds_only_bookkeeping(directory: Path, entries: dict) -> bool:
    """Whether ``directory`` holds nothing but lmlab's bookkeeping files and empty folders among the
    ``entries`` a command writes (an empty folder of anyone else's is something: it stays)."""
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        if any(name not in BOOKKEEPING for name in files) or any((base / d).is_symlink() for d in dirs):
            return False
        if base == Path(directory) and any(d not in entries for d in dirs):
            return False
    return True


def _lock_is_free(directory: Path) -> bool:
    """Whether no process holds the lock of ``directory`` (:func:`lmlab.fileio.directory_lock`)."""
    import fcntl

    lock = directory / ".lock"
    if not lock.is_file() or lock.is_symlink():
        return not lock.is_symlink()
    with open(lock, "a", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
    return True


def release_claim(directory: str | os.PathLike) -> bool:
    """Give back the claim of ``directory`` (:func:`claim_dir`) when nothing was written into it: it
    holds only lmlab's bookkeeping (manifest, lock) and empty folders of its entries, and no process
    holds its lock. Those are removed, and the folder itself when lmlab made it; a folder the user
    had stays, empty. Returns whether the claim was given back."""
    d = Path(directory)
    manifest = read_manifest(d) if d.is_dir() and not d.is_symlink() else None
    if manifest is None or manifest.get("state") != "claimed" \
            or not _holds_only_bookkeeping(d, manifest.get("entries", {})) or not _lock_is_free(d):
        return False
    for root, dirs, files in os.walk(d, topdown=False):
        for name in files:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(Path(root) / name)
        for name in dirs:
            with contextlib.suppress(OSError):
                os.rmdir(Path(root) / name)
    if manifest.get("made"):
        with contextlib.suppress(OSError):
            d.rmdir()
    return True


@contextlib.contextmanager
def claimed_dir(dest: str | os.PathLike, kind: str, entries: tuple[str, ...], logs: tuple[str, ...] = (),
                keeps: str | None = None):
    """:func:`claim_dir` for a command that fills the folder: yields the resolved path. When the
    block ends having written nothing there (it failed or was stopped before its first file, or it
    moved what it wrote elsewhere), the claim is given back (:func:`release_claim`): a folder
    lmlab made disappears with the parent folders made for it (:func:`parents_made`), a folder the
    user had is left as it was. A command that fails before writing anything leaves no trace."""
    given, resolved = _output_folder(dest, keeps)  # checked before any folder is made for it
    before = read_manifest(resolved) if resolved.is_dir() else None
    fresh = not (before and before.get("state") == "claimed")  # claimed by this call, not an earlier run
    with parents_made(resolved):
        path = _claim(given, resolved, kind, entries, True, logs)
        try:
            with filling(path):  # its entries are this command's to write (check_not_inside_output)
                yield path
        except LmlabError:
            if fresh and path in _REFUSED_PREPARING:  # refused before its work: what it wrote goes too
                _undo_claim(path)
            raise
        finally:
            _REFUSED_PREPARING.discard(path)
            release_claim(path)


#: claimed folders whose command was refused while it prepared its work (:func:`preparing`)
_REFUSED_PREPARING: set[Path] = set()


@contextlib.contextmanager
def preparing(directory: str | os.PathLike):
    """The block prepares the work of the command filling ``directory`` (:func:`claimed_dir`): a
    run's tokenizer and shards, made before it can check what needs the text (that each split gets
    a document). A one-line refusal raised here, when this command claimed the folder, takes back
    what the block wrote there too, so the refused command leaves no trace; a refusal later in the
    work (a run that diverged) keeps what it wrote."""
    try:
        yield
    except LmlabError:
        _REFUSED_PREPARING.add(Path(directory).resolve())
        raise


def _undo_claim(directory: Path) -> None:
    """Delete what the command that claimed ``directory`` just now wrote into its entries, each
    only when all in it is provably lmlab's, unchanged (:func:`remove_owned_tree`); then
    :func:`release_claim` can give the claim back."""
    manifest = read_manifest(directory)
    for name in (manifest or {}).get("entries", {}):
        remove_owned_tree(directory, name, refuse=False)


#: the folders a command fills that this process is filling now (:func:`filling`)
_FILLING: set[Path] = set()


@contextlib.contextmanager
def filling(directory: str | os.PathLike):
    """For the block, this process is the command that fills the claimed folder ``directory``
    (:func:`claimed_dir`): the outputs it writes inside (a run's checkpoints, tokenizer and shards,
    a grid's runs) are its own entries, not outputs written into another command's folder
    (:func:`check_not_inside_output`)."""
    d = Path(directory).resolve()
    added = d not in _FILLING
    _FILLING.add(d)
    try:
        yield d
    finally:
        if added:
            _FILLING.discard(d)


def owns_entry(directory: Path, name: str) -> bool:
    """Whether the claimed folder ``directory`` records ``name`` as an entry lmlab writes."""
    manifest = read_manifest(directory)
    return bool(manifest and manifest.get("state") == "claimed" and name in manifest.get("entries", {}))


# --------------------------------------------------------- what lmlab wrote in a folder it fills
def _claim_of(path: Path) -> tuple[Path, dict, str] | None:
    """``(folder, manifest, relative path)`` when ``path`` is an entry of a folder a command fills
    (:func:`claim_dir`) or lies inside one: the nearest folder above ``path`` that holds a manifest
    is that claimed folder. None for anything else (a temporary, an output written in one go, a
    user's folder): those have their own proof."""
    path = Path(os.path.abspath(path))
    for folder in path.parents:
        manifest = read_manifest(folder)
        if manifest is None:
            continue
        if manifest.get("state") != "claimed":
            return None
        rel = path.relative_to(folder).as_posix()
        return (folder, manifest, rel) if rel.split("/", 1)[0] in manifest.get("entries", {}) else None
    return None


#: why lmlab refuses to write a file where a folder stands that it did not make (claimed_file_verdict)
FOLDER_IN_PLACE = "is a folder that lmlab did not make, where lmlab writes a file"


def _recorded_file(manifest: dict, rel: str) -> dict | None:
    """The stamp the claimed folder's ``manifest`` keeps of the file (or empty folder) ``rel`` that
    lmlab wrote there (:func:`record_file`), or None."""
    recorded = manifest.get("files", {}).get(rel) if isinstance(manifest.get("files"), dict) else None
    entry = manifest.get("entries", {}).get(rel)
    if recorded is None and isinstance(entry, dict) and "size" in entry:
        recorded = entry  # a single file recorded in the folder's entries (record_file with a kind)
    return recorded if isinstance(recorded, dict) else None


def claimed_file_verdict(manifest: dict, rel: str, path: Path) -> Verdict:
    """Is ``path`` (``rel`` inside the claimed folder of ``manifest``), where lmlab writes a file,
    still what lmlab wrote there? Yes when the manifest's stamp of it (:func:`record_file`)
    matches; a claim made before lmlab stamped what it writes trusts its entries whole. A folder
    there is never a file lmlab wrote, and is said to be a folder (:data:`FOLDER_IN_PLACE`), not a
    changed file: only an empty folder lmlab recorded making is its own."""
    recorded = _recorded_file(manifest, rel)
    if path.is_dir() and not path.is_symlink() and not (recorded or {}).get("folder"):
        # a folder where lmlab writes a file (someone made it, or replaced lmlab's file by it)
        return Verdict(False, FOLDER_IN_PLACE)
    if recorded is not None:
        return Verdict(True) if _matches(recorded, path) else Verdict(False, "changed since lmlab wrote it")
    if manifest.get("stamped"):
        return Verdict(False, "was not written by lmlab")
    return Verdict(True)


def record_file(path: str | os.PathLike, kind: str | None = None, hashed: bool = True) -> None:
    """Record that lmlab has just finished writing the file ``path`` (its size and modification
    time), so that it may later replace or delete it while it is unchanged, and only then:

    * inside a folder a command fills (an entry, or a file inside a folder entry), in that folder's
      manifest (every file lmlab writes there is stamped: :func:`lmlab.fileio.atomic_write_bytes`
      and :func:`lmlab.fileio.append_line` call this);
    * else, for a ``kind`` of single file written into a user's folder (``--predictions``), in
      that folder's manifest; a ``kind`` of file put inside a folder another command fills (results
      beside a run's checkpoint) in that folder's manifest apart from its own files
      (:func:`_record_beside`): never that command's, and replaced only by its own kind, unchanged.
      Without ``kind`` nothing is recorded anywhere else (a temporary or an output written in one
      go is sealed whole).

    ``hashed``: record its sha256 too, so that a copy of it with another time is still lmlab's
    (:func:`_matches`); a log appended to line by line is stamped without (see
    :func:`lmlab.fileio.append_line`)."""
    p = Path(path)
    claim = _claim_of(p)
    if claim is not None and kind is not None and claim[0].resolve() not in _FILLING:
        _record_beside(claim[0], claim[2], p, kind, hashed)  # another command's result in a folder it fills
        return
    if claim is not None:
        folder, manifest, rel = claim
        files = dict(manifest.get("files") or {})
        files[rel] = _stamp(p, hashed)
        write_manifest(folder, {**_body(manifest), "files": files})
        return
    if kind is None:
        return
    manifest = read_manifest(p.parent) or {"kind": None, "state": "files", "entries": {}}
    if manifest.get("state") != "files":  # an output's manifest lists that output's files only
        return
    entries = dict(manifest.get("entries", {}))
    entries[p.name] = {"kind": kind, **_stamp(p, hashed)}
    write_manifest(p.parent, _body(manifest) | {"entries": entries})


#: the map, in the manifest of a folder a command fills, of the single files other commands wrote
#: there (``evaluate --harness``'s results beside a checkpoint, ``--predictions``): relative path ->
#: kind and stamp. Not that command's files: it never replaces or deletes them (:func:`unproven`
#: does not count them as its own); the command of that kind may replace one while it is unchanged
#: (:func:`may_replace_file`, :func:`check_overwrite`)
BESIDE = "beside"


def _beside(manifest: dict) -> dict[str, dict]:
    found = manifest.get(BESIDE)
    return {k: v for k, v in found.items() if isinstance(v, dict)} if isinstance(found, dict) else {}


def _record_beside(folder: Path, rel: str, path: Path, kind: str, hashed: bool) -> None:
    """Record the ``kind`` file ``path`` (``rel`` inside the folder ``folder`` that another command
    fills) in that folder's manifest (:data:`BESIDE`), under the folder's lock, so that the command
    filling it, which holds that lock while it runs, never loses a stamp of its own to this write.
    While that command runs, nothing is recorded: the file is then the user's, never replaced."""
    import fcntl

    lock = folder / ".lock"
    if lock.is_symlink():
        return
    try:
        f = open(lock, "a", encoding="utf-8")  # noqa: SIM115 - held for the block below
    except OSError:
        return
    with f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return
        manifest = read_manifest(folder)  # read again under the lock
        if manifest is None or manifest.get("state") != "claimed":
            return
        beside = {**_beside(manifest), rel: {"kind": kind, **_stamp(path, hashed)}}
        write_manifest(folder, {**_body(manifest), BESIDE: beside})


def record_tree(directory: str | os.PathLike) -> None:
    """:func:`record_file` for everything under the folder ``directory`` that lmlab just finished
    writing through another library (a TensorBoard or W&B logger's files), in one manifest write."""
    d = Path(directory)
    claim = _claim_of(d)
    if claim is None or not d.is_dir() or d.is_symlink():
        return
    folder, manifest, rel = claim
    files = dict(manifest.get("files") or {})
    files.update({f"{rel}/{inner}": stamp for inner, stamp in list_files(d, hashed=True).items()})
    write_manifest(folder, {**_body(manifest), "files": files})


def check_overwrite(path: str | os.PathLike) -> None:
    """One-line error when lmlab is about to write over ``path``, a file inside a folder a command
    fills, that it cannot prove it wrote, unchanged (:func:`claimed_file_verdict`): the user put it
    there, or edited it since. The file is left as it is. A log the command continues is written to
    (see :func:`claim_dir`'s ``logs``)."""
    p = Path(path)
    if not (p.exists() or p.is_symlink()):
        return
    claim = _claim_of(p)
    if claim is None:
        return
    folder, manifest, rel = claim
    beside = _beside(manifest).get(rel)
    if beside is not None and folder.resolve() not in _FILLING:
        verdict = Verdict(True) if _matches(beside, p) else Verdict(False, "changed since lmlab wrote it")
    else:
        verdict = claimed_file_verdict(manifest, rel, p)
    if not verdict.ok and not _is_log(manifest.get("entries", {}).get(rel)):
        what = "folder" if p.is_dir() and not p.is_symlink() else "file"
        raise LmlabError(f"{p} {verdict.reason}; it was left as it is, and nothing was written over it",
                         f"move that {what} away, then run the command again")


def unproven(directory: Path, name: str) -> list[str]:
    """What under the entry ``name`` of the claimed folder ``directory`` lmlab cannot prove it wrote,
    unchanged (first few, relative to that entry): a file not stamped, or changed since
    (:func:`claimed_file_verdict`), an empty folder nothing records, a link, anything inside an
    output of its own that its manifest does not account for. Empty: lmlab may delete it all."""
    entry = directory / name
    found: list[str] = []
    _unproven_in(entry, directory, read_manifest(directory) or {}, found, entry, top=True)
    return found[:3]


def _unproven_in(path: Path, folder: Path, manifest: dict, found: list[str], entry: Path,
                 top: bool = False) -> None:
    """:func:`unproven` for ``path``, inside the claimed ``folder`` (``manifest``)."""
    rel = path.relative_to(folder).as_posix()
    shown = path.relative_to(entry).as_posix() if path != entry else entry.name
    if len(found) >= 3:
        return
    if path.is_symlink() or not path.is_dir():
        if not claimed_file_verdict(manifest, rel, path).ok:
            found.append(shown)
        return
    own = read_manifest(path)
    if own is not None:  # an output of its own (a checkpoint, a tokenizer, a run): its manifest proves it
        if own.get("state") == "claimed":
            for child in sorted(path.iterdir()):
                if child.name in BOOKKEEPING or is_dead_leftover(child):
                    continue
                if child.name not in own.get("entries", {}):
                    found.append(child.relative_to(entry).as_posix())
                else:
                    _unproven_in(child, path, own, found, entry, top=True)
                if len(found) >= 3:
                    return
            return
        if own.get("state") == "complete":
            prefix = "" if path == entry else f"{shown}/"
            found.extend(f"{prefix}{inner}" for inner in foreign_entries(path, own))
        elif not is_dead_leftover(path):
            found.append(shown)
        return
    children = sorted(c for c in path.iterdir() if c.name not in BOOKKEEPING)
    if not children and not top and manifest.get("stamped") \
            and not _matches(manifest.get("files", {}).get(rel), path):
        found.append(shown)  # an empty folder inside an entry that lmlab did not record making
    for child in children:
        if not is_dead_leftover(child):
            _unproven_in(child, folder, manifest, found, entry)


def remove_owned_tree(directory: Path, name: str, refuse: bool = True) -> bool:
    """Delete the entry ``name`` of the claimed folder ``directory`` (the demo's fresh start, a
    finished fine-tuning's resume state), only when the manifest records it as lmlab's and all in
    it is what lmlab wrote, unchanged (:func:`unproven`). Otherwise nothing is deleted: a one-line
    error, or with ``refuse=False`` it is kept (returns False)."""
    path = directory / name
    if not (path.exists() or path.is_symlink()):
        return True
    if not owns_entry(directory, name):
        if not refuse:
            return False
        raise LmlabError(f"{path} was not written by lmlab; nothing was deleted",
                         "choose a new --out, or move that file away")
    foreign = unproven(directory, name)
    if foreign:
        if not refuse:
            return False
        what = ("was not written by lmlab, or changed since" if path.is_symlink() or not path.is_dir()
                else f"holds {', '.join(foreign)}, which lmlab did not write or that changed since")
        raise LmlabError(f"{path} {what}; nothing was deleted",
                         "move those files away, or choose a new --out")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()
    manifest = read_manifest(directory)
    files = (manifest or {}).get("files")
    if isinstance(files, dict):
        kept = {k: v for k, v in files.items() if k != name and not k.startswith(f"{name}/")}
        write_manifest(directory, {**_body(manifest), "files": kept})
    return True


# ------------------------------------------------------------------ folders made for an output
def make_parents(path: str | os.PathLike) -> list[Path]:
    """Make the missing folders above ``path``; returns those this call made, outermost first (the
    one place lmlab makes the folders an output goes in: :func:`parents_made` removes them again)."""
    missing = []
    parent = Path(os.path.abspath(path)).parent
    while not (parent.exists() or parent.is_symlink()) and parent != parent.parent:
        missing.append(parent)
        parent = parent.parent
    made = []
    for folder in reversed(missing):
        try:
            folder.mkdir()
        except FileExistsError:  # made meanwhile by someone else: not this call's
            continue
        made.append(folder)
    return made


def remove_made(made: list[Path]) -> None:
    """Remove the folders :func:`make_parents` made (``made``), innermost first, while they are empty."""
    for folder in reversed(made):
        try:
            folder.rmdir()
        except FileNotFoundError:
            continue
        except OSError:  # something is in it now (the output, or anyone's file): it and those above stay
            return


@contextlib.contextmanager
def parents_made(path: str | os.PathLike):
    """Make the missing folders above the output ``path`` for the block (:func:`make_parents`), and
    when it ends remove those still empty (:func:`remove_made`): a command that fails or is stopped
    leaves none of them behind; one that succeeded has its output in them. Yields the folders made."""
    made = make_parents(path)
    try:
        yield made
    finally:
        remove_made(made)


# ------------------------------------------------------------------- names derived from an output's
#: bytes a derived name keeps after the output's own name: the dots, ``tmp-PID-LABEL`` and the 8
#: random characters of a temporary (``old-PID``, ``prune-PID`` and ``resume`` are shorter)
_SUFFIX_ROOM = 56
_HASH = 10
_SHORTENED = re.compile(rf".*~[0-9a-f]{{{_HASH}}}")


def name_max(folder: str | os.PathLike) -> int:
    """The longest name, in bytes, that the file system holding ``folder`` (or its nearest existing
    folder above) takes for one file or folder (255 on Linux and macOS file systems)."""
    p = Path(os.path.abspath(folder))
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return int(os.pathconf(p, "PC_NAME_MAX"))
    except (OSError, ValueError):
        return 255


def name_bytes(name: str) -> int:
    """The length of ``name`` on disk, in bytes (what the file system's limit counts)."""
    return len(os.fsencode(name))


def _stem(name: str, folder: Path) -> str:
    """``name`` as the names derived from it spell it: itself (the output's name when ``name`` is a
    temporary of that output, ``.NAME.tmp-PID-...``), or, when it leaves no room for the
    longest suffix within the limit, its start and a short hash of the whole (``abc...~1f2e3d4c5b``),
    the same for every derived name of that output."""
    m = _TEMPORARY.fullmatch(name)
    if m and m["what"] == "tmp":  # an output written into a temporary (an --lr auto arm): named after
        name = m["name"]  # the output's own name, so the next run of that output finds what it left
    room = name_max(folder) - _SUFFIX_ROOM
    if name_bytes(name) <= room:
        return name
    digest = hashlib.sha256(os.fsencode(name)).hexdigest()[:_HASH]
    kept, size = [], 0
    for ch in name:
        size += name_bytes(ch)
        if size > room - _HASH - 1:
            break
        kept.append(ch)
    return "".join(kept) + "~" + digest


def derived_name(name: str, folder: str | os.PathLike, what: str) -> str:
    """The name of what lmlab keeps beside the output ``folder/name``: ``.NAME.WHAT``, with WHAT one
    of ``tmp-PID-LABEL`` (a temporary; :func:`make_temporary` adds 8 random characters),
    ``old-PID`` (an output being replaced), ``prune-PID`` (a checkpoint being deleted) or
    ``resume`` (a fine-tuning's resume state). The one place these names are made: each stays within
    the file system's limit on a name (:func:`name_max`), however long NAME is (:func:`_stem`)."""
    folder = Path(folder)
    derived = f".{_stem(name, folder)}.{what}"
    over = name_bytes(derived) + 8 - name_max(folder)
    return derived if over <= 0 else derived[:len(derived) - over]  # only an overlong label is cut


# ------------------------------------------------------------------------- where an output may go
def check_destination(path: str | os.PathLike, flag: str = "--out", fills: bool = False) -> None:
    """One-line error, before any work, when nothing can be written at ``path``: a file stands where
    one of its folders would be, it is a link to nothing (:func:`check_not_dangling`), it lies inside
    another lmlab output (:func:`check_not_inside_output`),
    or the nearest existing folder refuses new entries (permissions, a read-only file system, a full
    disk). That folder is tried for real (an empty folder made and removed at once): permission bits
    do not tell, for root or on /sys, /proc and network disks. ``fills``: see
    :func:`check_not_inside_output`."""
    given = Path(path)
    _check_not_current_folder(given, flag)
    check_not_dangling(given, flag)
    check_writable(given, flag, before=lambda: check_not_inside_output(given, flag, fills))


def check_not_dangling(path: str | os.PathLike, flag: str = "--out") -> None:
    """One-line error when the output ``path`` is a link to nothing (a dangling symbolic link): lmlab
    would follow it and make its target, somewhere the user did not name. One rule for every output,
    a folder (``--out``) or a file (``--predictions``): refused, never followed."""
    given = Path(path)
    if given.is_symlink() and not given.exists():
        raise LmlabError(f"{flag} {given} is a link to {os.readlink(given)}, which does not exist; "
                         "nothing was written",
                         f"remove the link, or choose a {option(flag)} path that is not a link to nothing")


def check_writable(path: str | os.PathLike, flag: str, before=None) -> None:
    """The part of :func:`check_destination` that asks the file system: nothing in the way of
    ``path`` (a file where a folder goes, an overlong name) and its nearest existing folder takes new
    entries. ``flag`` names the setting the path came from in the error (``--out``, or
    ``data.cache_dir`` for a folder lmlab derives from a setting); ``before``: a check to make once
    the path is known to go through folders."""
    import errno
    import tempfile

    given = Path(path)
    target = Path(os.path.abspath(given))
    base = next((a for a in target.parents if a.exists() or a.is_symlink()), None)
    if base is None:  # pragma: no cover - the root always exists
        return
    if not base.is_dir():
        what = "a file" if base.is_file() else "not a folder"
        raise LmlabError(f"{flag} {given} cannot be written: {base} is {what}; nothing was written",
                         f"choose a {option(flag)} path that does not go through a file")
    if before is not None:
        before()
    limit = name_max(base)
    for part in target.relative_to(base).parts:  # the names still to be made
        if name_bytes(part) > limit:
            raise LmlabError(f"{flag} {given} cannot be written: a name in it is {name_bytes(part)} bytes "
                             f"long, and the file system of {base} takes at most {limit} bytes per name; "
                             "nothing was written", f"choose a {option(flag)} path with shorter names")
    try:
        probe = tempfile.mkdtemp(prefix=derived_name(target.name, base, f"tmp-{os.getpid()}-check"), dir=base)
    except OSError as e:
        why = {errno.EROFS: "is on a read-only file system", errno.ENOSPC: "is on a full disk",
               errno.EDQUOT: "is on a disk over its quota"}.get(e.errno, "is not writable")
        if e.errno in (errno.EACCES, errno.EPERM):
            why = "does not let this user write in it (permission denied)"
        raise LmlabError(f"{flag} {given} cannot be written: the folder {base} {why}; nothing was written",
                         f"choose a {option(flag)} path you may write to") from None
    os.rmdir(probe)


def _check_not_current_folder(given: Path, flag: str) -> None:
    """One-line error when the output ``given`` is the current folder, however spelled (``.``,
    ``./``, its absolute path, ``../x`` leading back to it, a link to it), or a folder above it:
    an output folder is replaced whole (or filled, and given back when nothing was written), which
    would leave the shell in a folder that no longer exists."""
    try:
        cwd = Path.cwd().resolve()
    except OSError:  # the current folder is gone already: nothing here to spare
        return
    target = given.resolve()
    if target == cwd or target in cwd.parents:
        what = "the current folder" if target == cwd else f"a folder above the current folder ({cwd})"
        raise LmlabError(f"{flag} {given} is {what}; nothing was written",
                         f"choose a new {flag}, such as a new folder inside this one ({flag} out), not "
                         "the folder you are in or one above it")


#: the states of a manifest that make its folder an lmlab output (a whole output, a folder a command
#: fills, a temporary being written); ``files`` is a user's folder holding single files lmlab wrote
_OUTPUT_STATES = ("complete", "claimed", "writing")


def enclosing_output(path: str | os.PathLike) -> tuple[Path, dict] | None:
    """``(folder, manifest)`` of the nearest lmlab output that ``path`` lies inside and that is not
    this command's own: a whole output (a checkpoint, a tokenizer, an exported model...), a folder
    another command fills (a pretraining run, a demo, a grid), or another process's temporary.
    Folders this process fills (:func:`filling`) and its own temporaries are its own: None for them
    and for a path inside no output."""
    target = Path(path).resolve()
    for folder in target.parents:
        manifest = read_manifest(folder)
        if manifest is None or manifest.get("state") not in _OUTPUT_STATES:
            continue
        if _own_temporary(manifest) or _named_own_temporary(folder) \
                or (manifest.get("state") == "claimed" and folder in _FILLING):
            continue
        return folder, manifest
    return None


def _named_own_temporary(folder: Path) -> bool:
    """Whether ``folder`` is named as this process's temporary (``.NAME.tmp-PID-...``): an output
    it is assembling there, sealed or not yet (a LoRA's merged model, then its adapter inside)."""
    m = _TEMPORARY.fullmatch(folder.name)
    return bool(m and m["what"] == "tmp" and int(m["pid"]) == os.getpid())


#: what :func:`derived_name` adds for the resume folder beside an output (``.NAME.resume``: the state
#: a fine-tuning or DPO run keeps while it writes ``NAME``, :mod:`lmlab.train.components.output_resume`)
RESUME = "resume"
#: how the manifest of a resume folder names its kind: ``"<the run in words> resume state"``
RESUME_KIND = "resume state"
_RESUME_NAME = re.compile(rf"\.(?P<name>.+)\.{RESUME}")


def resume_kind(what: str) -> str:
    """The kind a resume folder's manifest records for a ``what`` run (``fine-tuning``)."""
    return f"{what} {RESUME_KIND}"


def enclosing_resume_folder(path: str | os.PathLike) -> tuple[Path, dict | None] | None:
    """``(folder, manifest)`` of the nearest resume folder (``.NAME.resume``, :data:`RESUME`) that
    ``path`` lies inside and that this process does not fill (:func:`filling`: the run that owns it
    writes its checkpoints and logs there). Such a folder is its run's alone, whole: the run clears
    it and removes it when it ends, and ``--resume`` refuses it while it holds anything else, so no
    other output goes anywhere inside it, not even a new name beside its entries (which a
    pretraining run's folder allows). It counts when it holds a resume state's manifest (the run
    is going, or was stopped and waits for ``--resume``; ``manifest`` is that), and when it is not
    there yet (``manifest`` None): making it would take the name where lmlab keeps the resume
    state of an output ``NAME``. A folder of that name that lmlab did not claim is yours (lmlab
    never takes it for a resume folder either): None."""
    target = Path(path).resolve()
    for folder in (target, *target.parents):
        if not _RESUME_NAME.fullmatch(folder.name) or folder in _FILLING:
            continue
        if not folder.exists() and not folder.is_symlink():
            return folder, None
        if folder == target:
            continue  # an existing folder given itself: its claim (or the user's) decides
        manifest = read_manifest(folder) if folder.is_dir() else None
        kind = (manifest or {}).get("kind")
        if manifest is not None and manifest.get("state") == "claimed" and isinstance(kind, str) \
                and kind.endswith(" " + RESUME_KIND):
            return folder, manifest
    return None


def _check_not_inside_resume_folder(path: str | os.PathLike, flag: str) -> None:
    """The part of :func:`check_not_inside_output` for a resume folder (:func:`enclosing_resume_folder`)."""
    found = enclosing_resume_folder(path)
    if found is None:
        return
    folder, manifest = found
    given = Path(path)
    shown = given
    for _ in given.resolve().relative_to(folder).parts:
        shown = shown.parent
    shown = shown if shown.resolve() == folder else folder
    out = shown.with_name(_RESUME_NAME.fullmatch(folder.name)["name"])
    if given.resolve() == folder:
        raise LmlabError(f"{flag} {given} is the name where lmlab keeps the resume state of a "
                         f"fine-tuning or DPO run writing {out} (a name lmlab reserves); nothing was written",
                         f"choose {a_or_an(option(flag))} path of another name")
    if manifest is None:
        whose = (f"where lmlab keeps the resume state of a fine-tuning or DPO run writing {out} "
                 "(a name lmlab reserves)")
    else:
        run = manifest["kind"][:-len(" " + RESUME_KIND)] or "lmlab"
        whose = (f"the resume folder of the {run} run writing {out}, which only that run writes and removes "
                 "when it ends")
    raise LmlabError(f"{flag} {given} is inside {shown}, {whose}; nothing was written",
                     f"choose {a_or_an(option(flag))} path outside it")


def check_not_inside_output(path: str | os.PathLike, flag: str = "--out", fills: bool = False) -> None:
    """One-line error, before any work, when the output ``path`` lies inside another lmlab output
    (:func:`enclosing_output`): written into a whole output, it would be taken for one of its files
    and go when that output is replaced (or overwrite one: a predictions file over a model's
    weights); written into a folder another command fills, it would replace that command's entries
    (a run's shards, tokenizer or checkpoints) or lie in its way. Only the command that fills a
    folder writes inside it, and a command assembling an output inside its own temporary. ``fills``:
    ``path`` is a folder lmlab makes and then fills with outputs of its own (a data cache: its
    tokenizer, its shards): inside a folder another command fills, anywhere within one of that
    command's entries is refused, not only the names there (``run/data/mine`` would be refused
    once made, after work). Inside a resume folder (``.NAME.resume``) of another run, anywhere is
    refused (:func:`enclosing_resume_folder`)."""
    _check_not_inside_resume_folder(path, flag)
    found = enclosing_output(path)
    if found is None:
        return
    folder, manifest = found
    given = Path(path)
    rel = given.resolve().relative_to(folder)
    top = rel.parts[0]
    if manifest.get("state") == "claimed" and not _meets_an_entry(folder, manifest, rel) \
            and not (fills and top in manifest.get("entries", {})):
        return  # a new name of yours in a run's folder (results beside a checkpoint): never touched
    kind = manifest.get("kind") or "lmlab output"
    shown = given
    for _ in rel.parts:
        shown = shown.parent
    shown = shown if shown.resolve() == folder else folder
    if manifest.get("state") == "claimed":
        what = f" (its {top})" if top in manifest.get("entries", {}) else ""
        why = f"where only that {kind} writes"
    elif manifest.get("state") == "writing":
        kind, what, why = f"temporary {kind}", "", "which lmlab renames or removes when its process ends"
    else:
        what = f" (its {top})" if (folder / top).exists() or (folder / top).is_symlink() else ""
        why = "which lmlab replaces whole"
    raise LmlabError(f"{flag} {given} is inside the {kind} {shown}{what}, {why}; nothing was written",
                     f"choose {a_or_an(option(flag))} path outside it")


#: names inside a folder a command fills that it writes later, though none is there yet
_FUTURE_ENTRIES = re.compile(r"step_\d+")


def _meets_an_entry(folder: Path, manifest: dict, rel: Path) -> bool:
    """Whether ``folder/rel``, inside a folder another command fills, is one of that command's
    entries (``run/data``, ``run/metrics.jsonl``) or lies where it writes inside one: a name there
    already (``run/data/train``, ``cmp/pretrain/<run>``) or one it writes later (a checkpoint
    ``run/checkpoints/step_10``). A new name of the user's beside them (``run/notes.md``,
    ``run/checkpoints/step_6.harness.json``, ``cmp/fit``) meets none."""
    top = rel.parts[0]
    if top not in manifest.get("entries", {}):
        return False
    if len(rel.parts) == 1:
        return True
    inner = folder / rel.parts[0] / rel.parts[1]
    if inner.is_file() and not inner.is_symlink() and manifest.get("stamped") \
            and (folder / rel) == inner and rel.as_posix() not in (manifest.get("files") or {}):
        # a file that command did not write (a results file another command wrote beside a
        # checkpoint, recorded or not: :func:`record_file`): not its entry; whether it may be
        # replaced is the file's own question (:func:`may_replace_file`)
        return False
    return inner.exists() or inner.is_symlink() or bool(_FUTURE_ENTRIES.fullmatch(rel.parts[1]))


def check_output_spares_inputs(out: str | os.PathLike, inputs: dict[str, object],
                               flag: str = "--out") -> None:
    """One-line error, before any work, when writing the output ``out`` (a file or a folder) would
    lose or change one of the command's ``inputs`` (``{flag: path or paths}``): ``out`` is that
    input (it would be replaced), holds it (replacing ``out`` would delete it), or lies inside an
    input folder (it would be written into a checkpoint, a tokenizer, a folder of task files...).
    Every output of every command is checked here, whatever ``--overwrite`` says."""
    target = Path(out).resolve()
    for in_flag, value in inputs.items():
        for item in value if isinstance(value, (list, tuple)) else [value]:
            if item is None or not isinstance(item, (str, os.PathLike)) or not str(item):
                continue
            what = _clash(target, Path(item).resolve())
            if what is None:
                continue
            raise LmlabError(f"{flag} {out} {what} the input {in_flag} {item}; nothing was written",
                             f"write the output outside the command's inputs (another {option(flag)} path)")


def _clash(target: Path, path: Path) -> str | None:
    """How writing the output ``target`` would lose ``path`` (both resolved): replace it (the same
    path, or a folder holding it), be written inside it (a folder), or None."""
    if path == target or target in path.parents:
        return "would replace"
    if path in target.parents and path.is_dir():
        return "would be written inside"
    return None


def check_outputs_apart(outputs: dict[str, object]) -> None:
    """One-line error, before any work, when two outputs of one command (``{flag: path}``, the unset
    ones None) are the same path, or one would hold the other (``--out q.json --predictions q.json``:
    one would be written over the other; ``--out ft --predictions ft/p.jsonl``: replacing ``ft``
    would delete the predictions). The counterpart of :func:`check_output_spares_inputs` among the
    outputs; a command with several outputs is checked here, whatever ``--overwrite`` says."""
    given = [(flag, value) for flag, value in outputs.items()
             if isinstance(value, (str, os.PathLike)) and str(value)]
    for i, (flag, out) in enumerate(given):
        for other_flag, other in given[i + 1:]:
            a, b = Path(out).resolve(), Path(other).resolve()
            if a == b:
                raise LmlabError(f"{flag} {out} and {other_flag} {other} are the same path: one output would "
                                 "be written over the other; nothing was written",
                                 f"give {option(flag)} and {option(other_flag)} different paths")
            pair = (flag, out, other_flag, other) if a in b.parents else \
                (other_flag, other, flag, out) if b in a.parents else None
            if pair is not None:
                outer_flag, outer, inner_flag, inner = pair
                raise LmlabError(f"{inner_flag} {inner} is inside {outer_flag} {outer}: both are outputs "
                                 "of this command; nothing was written",
                                 f"give {option(inner_flag)} a path outside {option(outer_flag)}")


# ---------------------------------------------------------------------------------- single files
def may_replace_file(path: Path, kind: str) -> Verdict:
    """May lmlab write a ``kind`` file at ``path``? Yes when nothing is there, or when a manifest
    records that lmlab wrote this very file (same size and time) as that kind of file: the manifest
    of the user's folder it was written into, or of the folder a command fills (whose files are
    that command's, no other's)."""
    if not path.exists() and not path.is_symlink():
        return Verdict(True)
    if path.is_symlink() or not path.is_file():
        return Verdict(False, "is not a regular file")
    claim = _claim_of(path)
    if claim is not None:
        folder, manifest, rel = claim
        beside = _beside(manifest).get(rel)
        if beside is not None:  # a single file another command wrote here (results beside a checkpoint)
            if beside.get("kind") != kind:
                return Verdict(False, f"is {a_or_an(beside.get('kind') or 'file')}, not {a_or_an(kind)}")
            return Verdict(True) if _matches(beside, path) else Verdict(False, "changed since lmlab wrote it")
        entry = manifest.get("entries", {}).get(rel.split("/", 1)[0])
        own = entry.get("kind") if isinstance(entry, dict) else None  # a single file recorded there
        if own is None and manifest.get("kind") != kind:
            if manifest.get("stamped") and rel not in (manifest.get("files") or {}):
                return Verdict(False, "was not written by lmlab")  # nor recorded by the command that wrote it
            # an entry of a folder a command fills (a run's metrics.jsonl): that command's, no other's
            return Verdict(False, f"belongs to the {manifest.get('kind')} in {folder}")
        if own is not None and own != kind:
            return Verdict(False, f"is {a_or_an(own)}, not {a_or_an(kind)}")
        return claimed_file_verdict(manifest, rel, path)
    manifest = read_manifest(path.parent)
    recorded = (manifest or {}).get("entries", {}).get(path.name)
    if not isinstance(recorded, dict) or recorded.get("tree"):
        return Verdict(False, "was not written by lmlab")
    if recorded.get("kind") != kind:  # a file of a whole output records no kind: never a single file's
        whole = (manifest or {}).get("kind") or "lmlab output"
        what = recorded.get("kind") or f"file of the {whole} {path.parent}"
        return Verdict(False, f"is {a_or_an(what)}, not {a_or_an(kind)}")
    if not _matches(recorded, path):
        return Verdict(False, "changed since lmlab wrote it")
    return Verdict(True)


def check_replaceable_file(path: str | os.PathLike, kind: str, flag: str = "--out") -> Path:
    """``path`` when a ``kind`` file may be written there, else a one-line error (nothing written)."""
    if str(path).endswith(("/", os.sep)):
        folder = str(path).rstrip("/" + os.sep) or "."
        raise LmlabError(f"{flag} {path} names a folder, but it takes a file path",
                         f"name the file, e.g. {flag} {folder}/{kind.replace(' ', '_')}.jsonl")
    p = Path(path)
    check_destination(p, flag)
    verdict = may_replace_file(p, kind)
    if not verdict.ok:
        raise LmlabError(f"{flag} {p} exists and {verdict.reason}; nothing was written",
                         f"choose a new {option(flag)} path, or move or delete that file yourself")
    return p


# ------------------------------------------------------------------------------------ leftovers
def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    except (OverflowError, ValueError):
        return False
    return True


def is_dead_leftover(path: Path, locked: bool = False) -> bool:
    """Whether ``path`` is provably a temporary that an lmlab process made and that process has
    ended. A name alone proves nothing: the folder must hold lmlab's :data:`TEMPORARY_MARKER`,
    written when it was made (:func:`start_temporary`) or renamed aside (:func:`mark_aside`),
    naming this very temporary (its name, the process in that name, this host). What is saved into
    a temporary (a model, a tokenizer: their own manifest) never replaces that marker; a temporary
    made before lmlab wrote one is proven by its ``writing`` manifest naming it. A temporary being
    written (``.NAME.tmp-PID-*``) must hold no output changed since it was sealed there; an output
    renamed aside (``.NAME.old-PID``, ``.NAME.prune-PID``) must still hold only what its manifest
    records (a file added or edited makes it the user's), or, its deletion cut short, nothing but
    what is left of that (:func:`remove_temporary` deletes the proof last). A copy, a look-alike or
    one the user added to is kept. ``locked``: the caller holds the lock of the folder ``path`` is
    in, so no lmlab process is writing there (the process need not be found ended)."""
    m = _TEMPORARY.fullmatch(path.name)
    if not m or path.is_symlink() or not path.is_dir():
        return False
    pid = int(m["pid"])
    marker = _read_marker(path)
    if m["what"] == "tmp":
        if not _names(marker, path, pid):
            marker = read_manifest(path)  # an older temporary: its ``writing`` manifest names it
            if marker is None or marker.get("state") != "writing":
                return False
        if not _own_nested(path):
            return False
    elif not _left_as_recorded(path):
        return False
    return _names(marker, path, pid) and (locked or not _alive(pid))


def _names(marker: dict | None, path: Path, pid: int) -> bool:
    """Whether ``marker`` names the temporary ``path``, made by the process ``pid`` on this host."""
    return bool(marker) and marker.get("name") == path.name and marker.get("pid") == pid \
        and marker.get("host") == _HOST


def _left_as_recorded(path: Path) -> bool:
    """Whether the output renamed aside to ``path`` holds only what lmlab recorded there: all its
    manifest lists (a part of it, once its deletion began), or nothing but lmlab's bookkeeping (its
    manifest, its marker: a deletion nearly done, :func:`remove_temporary`)."""
    if not foreign_entries(path, None):  # nothing but lmlab's bookkeeping (a temporary renamed aside too)
        return True
    manifest = read_manifest(path)
    return bool(manifest) and manifest.get("state") == "complete" \
        and not foreign_entries(path, manifest, emptied=True)


def _read_marker(path: Path) -> dict | None:
    """The :data:`TEMPORARY_MARKER` of ``path`` when it is well formed, else None."""
    f = path / TEMPORARY_MARKER
    if f.is_symlink() or not f.is_file():
        return None
    try:
        data = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    ok = isinstance(data, dict) and data.get("lmlab_temporary") == FORMAT
    return data if ok and isinstance(data.get("token"), str) else None


def _own_nested(path: Path) -> bool:
    """Whether every output inside the temporary ``path`` (a folder holding its own manifest: a
    sealed model, an adapter) still holds only what that manifest records."""
    for root, dirs, _files in os.walk(path):
        for d in list(dirs):
            inner = Path(root) / d
            manifest = read_manifest(inner)
            if manifest is not None and manifest.get("state") == "complete" \
                    and foreign_entries(inner, manifest, emptied=True):
                return False
    return True


def remove_leftovers(directory: Path, name: str | None = None, locked: bool = False) -> list[Path]:
    """Remove what ended lmlab processes left in ``directory`` (for every output name, or just
    ``name``): their temporaries, and outputs they were replacing or pruning. An output caught
    between the two renames of a replacement (``.NAME.old-PID`` with no ``NAME``) is put back.
    ``locked``: the caller holds the folder's lock (see :func:`is_dead_leftover`)."""
    removed: list[Path] = []
    if not Path(directory).is_dir():
        return removed
    stem = None if name is None else _stem(name, Path(directory))
    for p in Path(directory).iterdir():
        m = _TEMPORARY.fullmatch(p.name)
        if not m or (stem is not None and m["name"] != stem) or not is_dead_leftover(p, locked):
            continue
        if m["what"] == "old" and not (_read_marker(p) or {}).get("deleting"):
            if name is None and _SHORTENED.fullmatch(m["name"]):
                continue  # its output's name was shortened: put back by the next run of that output
            final = p.with_name(name if name is not None else m["name"])
            if not (final.exists() or final.is_symlink()):
                settle(p, final)
                continue
        remove_temporary(p)
        removed.append(p)
    return removed


def make_temporary(parent: Path, name: str, kind: str, label: str = "") -> Path:
    """A new folder ``parent/.NAME.tmp-PID-LABEL...`` (:func:`derived_name`) marked as this
    process's work in progress (the caller removes it; if the process dies first, the next run of
    the same output does). ``parent`` exists (the caller made it: :func:`parents_made`)."""
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=derived_name(name, parent, f"tmp-{os.getpid()}-{label}"), dir=parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; give it the usual permissions
        start_temporary(tmp, kind)
    except BaseException:
        remove_temporary(tmp)
        raise
    return tmp


@contextlib.contextmanager
def live_dir(output: Path, kind: str):
    """A marked temporary beside the output folder ``output`` (``.NAME.tmp-PID-live-...``) for what
    a command writes while it runs and moves into the output at the end: its live metrics log (to
    tail), its loggers' files. Removed when the block ends, however it ends; first, whatever killed
    runs into the same output left is removed (:func:`remove_leftovers`: their processes ended)."""
    output = Path(output)
    with parents_made(output):  # the folders made for the output go too, unless it was written there
        remove_leftovers(output.parent, output.name)
        tmp = make_temporary(output.parent, output.name, kind, "live-")
        try:
            yield tmp
        finally:
            remove_temporary(tmp)


@contextlib.contextmanager
def temporary_dir(parent: Path, name: str, kind: str):
    """A new temporary folder ``parent/.NAME.tmp-PID-XXXX`` marked as this process's; removed if the
    block fails. The caller renames it into place."""
    tmp = make_temporary(parent, name, kind)
    try:
        yield tmp
    except BaseException:
        remove_temporary(tmp)
        raise


def current_umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

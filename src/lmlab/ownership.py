"""Who owns a file or folder: the one place that decides whether lmlab may replace or delete it.

lmlab replaces or deletes only what it can prove it wrote. The proof is a manifest,
``.lmlab-manifest.json``, that lmlab puts in every folder it writes:

* a **whole output** (a tokenizer, a model, token shards, a fine-tuned model...) is written under a
  temporary name and renamed into place (:func:`lmlab.fileio.atomic_dir`); its manifest names its
  kind and lists every file with its size and modification time, so a later run may replace it
  only while it still holds exactly those files. A file the user added, or a file the user edited,
  makes the folder theirs again: it is refused, never wiped.
* a **folder written over time** (a pretraining run, the demo's folder, a comparison grid) is
  claimed when it is new or empty (:func:`claim_dir`); its manifest names the entries the command
  writes there (``metrics.jsonl``, ``checkpoints``...). Entries the user adds are never touched.
  A command that ends having written nothing there gives the claim back (:func:`claimed_dir`), so
  a refused or stopped command leaves no trace.
* a **single file** written into a user's folder (``--predictions``, ``fit.json``) is recorded in
  that folder's manifest (:func:`record_file`), and replaced only while it is unchanged.
* a **temporary** (``.NAME.tmp-PID-*``, ``.NAME.old-PID``, ``.NAME.prune-PID``) is always a folder
  holding a manifest that names the process writing it; it is removed as a leftover only when that
  manifest is there and the process has ended. A user's file that merely looks like one is kept.
  What a command writes beside its output while it runs (a live metrics log) is one too
  (:func:`live_dir`).

A marker file (``config.json``, ``tokenizer.json``) says what a folder *is*, never who owns it.

Before any of this, every output of every command passes two checks here: it may not be, hold or lie
inside one of the command's inputs (:func:`check_output_spares_inputs`), and it must be somewhere
lmlab can write (:func:`check_destination`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from lmlab.errors import LmlabError

MANIFEST = ".lmlab-manifest.json"
FORMAT = 1
#: files lmlab keeps beside what it writes and that never make a folder the user's
BOOKKEEPING = frozenset({MANIFEST, ".lock"})
_TEMPORARY = re.compile(r"\.(?P<name>.+)\.(?P<what>tmp|old|prune)-(?P<pid>\d+)(?:-.*)?")
_HOST = socket.gethostname()


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


def _stamp(path: Path) -> dict:
    st = path.lstat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def list_files(directory: Path) -> dict[str, dict]:
    """Every file under ``directory`` (relative POSIX path -> size and mtime), bookkeeping aside."""
    found: dict[str, dict] = {}
    for root, dirs, files in os.walk(directory):
        base = Path(root)
        for name in files + [d for d in dirs if (base / d).is_symlink()]:
            rel = (base / name).relative_to(directory).as_posix()
            if rel not in BOOKKEEPING:
                found[rel] = _stamp(base / name)
    return found


def seal(directory: Path, kind: str) -> None:
    """Record ``directory``, just written by this process, as a complete ``kind`` output."""
    write_manifest(directory, {"kind": kind, "state": "complete", "entries": list_files(directory)})


def start_temporary(directory: Path, kind: str) -> None:
    """Mark the new temporary folder ``directory`` as this process's work in progress."""
    write_manifest(directory, {"kind": kind, "state": "writing", "pid": os.getpid(), "host": _HOST,
                               "entries": {}})


# ------------------------------------------------------------------------------------ decisions
@dataclass
class Verdict:
    """Whether a path may be replaced, and if not, why (one example of what would be lost)."""

    ok: bool
    reason: str = ""


def foreign_entries(directory: Path, manifest: dict | None) -> list[str]:
    """What in ``directory`` lmlab did not write, as far as ``manifest`` proves (first few)."""
    if manifest is None:
        return sorted(p.name for p in directory.iterdir() if p.name not in BOOKKEEPING)[:3]
    entries = manifest.get("entries", {})
    trees = {k for k, v in entries.items() if isinstance(v, dict) and v.get("tree")}
    foreign = []
    for rel, stamp in list_files(directory).items():
        top = rel.split("/", 1)[0]
        if top in trees:
            continue
        recorded = entries.get(rel)
        if not isinstance(recorded, dict) or recorded.get("tree") or (
                recorded.get("size"), recorded.get("mtime_ns")) != (stamp["size"], stamp["mtime_ns"]):
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
        return Verdict(False, f"is a {manifest.get('kind') or 'folder of other outputs'}, not a {kind}")
    foreign = foreign_entries(dest, manifest)
    if foreign:
        return Verdict(False, f"holds files lmlab did not write or that changed since ({', '.join(foreign)})")
    return Verdict(True)


def _output_folder(dest: str | os.PathLike) -> tuple[Path, Path]:
    """(as given, resolved) for a folder output, or a one-line error for the root, a file or a place
    that cannot be written (:func:`check_destination`)."""
    given = Path(dest)
    resolved = given.resolve()
    if resolved == resolved.parent:
        raise LmlabError(f"output {given} is the root of the file system", "choose a new folder for --out")
    if resolved.exists() and not resolved.is_dir():
        raise LmlabError(f"output {given} is a file", "pass a folder path to --out")
    check_destination(given)
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


def claim_dir(dest: str | os.PathLike, kind: str, entries: tuple[str, ...], create: bool = True) -> Path:
    """Take ``dest`` as a folder that this ``kind`` of command fills over time, writing the top-level
    ``entries`` (files or folders) there. A new or empty folder is claimed (its manifest records the
    entries as lmlab's); a folder claimed earlier by the same kind is reused as it is (a resumed
    run, a re-run demo); anything else is refused in one line. Returns the resolved path.
    ``create=False``: only check, before the work, that the claim will succeed (nothing is made)."""
    given, resolved = _output_folder(dest)
    manifest = read_manifest(resolved) if resolved.is_dir() else None
    if manifest is not None and manifest.get("kind") == kind and manifest.get("state") == "claimed":
        recorded = manifest.get("entries", {})
        missing = [e for e in entries if e not in recorded]
        if missing and create:  # a newer lmlab writes more entries: claim those not already there
            clash = [e for e in missing if (resolved / e).exists()]
            if clash:
                raise LmlabError(f"output folder {given} holds {clash[0]}, which lmlab did not write there",
                                 "choose a new --out, or move that file away")
            added = {e: {"tree": True} for e in missing}
            write_manifest(resolved, {**manifest, "entries": {**recorded, **added}})
        return resolved
    if resolved.is_dir() and any(p.name not in BOOKKEEPING for p in resolved.iterdir()):
        if manifest is None:
            what = f"was not written by lmlab (it holds {', '.join(foreign_entries(resolved, None))})"
        elif manifest.get("kind") == kind:  # a finished output of this kind, not a folder filled over time
            what = f"is a finished {kind} output, not a folder this command fills"
        else:
            what = f"is a {manifest.get('kind') or 'folder of other outputs'}, not a {kind}"
        raise LmlabError(f"output folder {given} exists and {what}; nothing was written",
                         "choose a new --out, or move or delete that folder yourself")
    if not create:
        return resolved
    made = not resolved.exists()
    resolved.mkdir(parents=True, exist_ok=True)
    owned = {e: {"tree": True} for e in entries}
    # "made": lmlab made the folder itself, so giving the claim back (release_claim) removes it too
    write_manifest(resolved, {"kind": kind, "state": "claimed", "entries": owned, "made": made})
    return resolved


def _holds_only_bookkeeping(directory: Path) -> bool:
    """Whether ``directory`` holds nothing but lmlab's bookkeeping files and empty folders."""
    for _root, dirs, files in os.walk(directory):
        if any(name not in BOOKKEEPING for name in files) or any(
                (Path(_root) / d).is_symlink() for d in dirs):
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
    holds only lmlab's bookkeeping (manifest, lock) and empty folders, and no process holds its lock.
    Those are removed, and the folder itself when lmlab made it; a folder the user had stays, empty.
    Returns whether the claim was given back."""
    d = Path(directory)
    manifest = read_manifest(d) if d.is_dir() and not d.is_symlink() else None
    if manifest is None or manifest.get("state") != "claimed" or not _holds_only_bookkeeping(d) \
            or not _lock_is_free(d):
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
def claimed_dir(dest: str | os.PathLike, kind: str, entries: tuple[str, ...]):
    """:func:`claim_dir` for a command that fills the folder: yields the resolved path. When the
    block ends having written nothing there (it failed or was stopped before its first file, or it
    moved what it wrote elsewhere), the claim is given back (:func:`release_claim`): a folder
    lmlab made disappears with the parent folders made for it, a folder the user had is left as
    it was. A command that fails before writing anything leaves no trace."""
    resolved = Path(dest).resolve()
    top = resolved  # the outermost folder that does not exist yet: made for this claim
    while not top.parent.exists() and top.parent != top:
        top = top.parent
    made_parents = not resolved.exists() and top != resolved
    path = claim_dir(dest, kind, entries)
    try:
        yield path
    finally:
        if release_claim(path) and made_parents and not path.exists():
            parent = path.parent
            while True:  # the parents made for it, while they are empty
                try:
                    parent.rmdir()
                except OSError:
                    break
                if parent == top:
                    break
                parent = parent.parent


def owns_entry(directory: Path, name: str) -> bool:
    """Whether the claimed folder ``directory`` records ``name`` as an entry lmlab writes."""
    manifest = read_manifest(directory)
    return bool(manifest and manifest.get("state") == "claimed" and name in manifest.get("entries", {}))


def remove_owned_tree(directory: Path, name: str) -> None:
    """Delete the entry ``name`` of the claimed folder ``directory`` (the demo's fresh start), only
    when the manifest records it as lmlab's."""
    path = directory / name
    if not (path.exists() or path.is_symlink()):
        return
    if not owns_entry(directory, name):
        raise LmlabError(f"{path} was not written by lmlab; nothing was deleted",
                         "choose a new --out, or move that file away")
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


# ------------------------------------------------------------------------- where an output may go
def check_destination(path: str | os.PathLike, flag: str = "--out") -> None:
    """One-line error, before any work, when nothing can be written at ``path``: a file stands where
    one of its folders would be, or the nearest existing folder refuses new entries (permissions, a
    read-only file system, a full disk). That folder is tried for real (an empty folder made and
    removed at once): permission bits do not tell, for root or on /sys, /proc and network disks."""
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
                         f"choose a {flag} path that does not go through a file")
    try:
        probe = tempfile.mkdtemp(prefix=f".{target.name}.tmp-{os.getpid()}-check", dir=base)
    except OSError as e:
        why = {errno.EROFS: "is on a read-only file system", errno.ENOSPC: "is on a full disk",
               errno.EDQUOT: "is on a disk over its quota"}.get(e.errno, "is not writable")
        if e.errno in (errno.EACCES, errno.EPERM):
            why = "does not let this user write in it (permission denied)"
        raise LmlabError(f"{flag} {given} cannot be written: the folder {base} {why}; nothing was written",
                         f"choose a {flag} path you may write to") from None
    os.rmdir(probe)


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
            path = Path(item).resolve()
            if path == target or target in path.parents:
                what = "would replace"
            elif path in target.parents and path.is_dir():
                what = "would be written inside"
            else:
                continue
            raise LmlabError(f"{flag} {out} {what} the input {in_flag} {item}; nothing was written",
                             f"write the output outside the command's inputs (another {flag} path)")


# ---------------------------------------------------------------------------------- single files
def may_replace_file(path: Path, kind: str) -> Verdict:
    """May lmlab write a ``kind`` file at ``path``? Yes when nothing is there, or when the folder's
    manifest records that lmlab wrote this very file (same size and time)."""
    if not path.exists() and not path.is_symlink():
        return Verdict(True)
    if path.is_symlink() or not path.is_file():
        return Verdict(False, "is not a regular file")
    manifest = read_manifest(path.parent)
    recorded = (manifest or {}).get("entries", {}).get(path.name)
    if not isinstance(recorded, dict) or recorded.get("tree"):
        if manifest and manifest.get("state") == "claimed" and path.name in manifest.get("entries", {}):
            # an entry of a folder a command fills (a run's metrics.jsonl): that command's, no other's
            if manifest.get("kind") == kind:
                return Verdict(True)
            return Verdict(False, f"belongs to the {manifest.get('kind')} in {path.parent}")
        return Verdict(False, "was not written by lmlab")
    if recorded.get("kind", kind) != kind:
        return Verdict(False, f"is a {recorded.get('kind')}, not a {kind}")
    stamp = _stamp(path)
    if (recorded.get("size"), recorded.get("mtime_ns")) != (stamp["size"], stamp["mtime_ns"]):
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
                         f"choose a new {flag} path, or move or delete that file yourself")
    return p


def record_file(path: str | os.PathLike, kind: str) -> None:
    """Record in its folder's manifest that lmlab wrote the file ``path`` (a ``kind``)."""
    p = Path(path)
    manifest = read_manifest(p.parent) or {"kind": None, "state": "files", "entries": {}}
    if manifest.get("state") == "claimed" and p.name in manifest.get("entries", {}):
        return  # already an entry of a folder lmlab fills
    entries = dict(manifest.get("entries", {}))
    entries[p.name] = {"kind": kind, **_stamp(p)}
    kept = {k: v for k, v in manifest.items() if k != "lmlab_manifest"}
    write_manifest(p.parent, kept | {"entries": entries})


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
    """Whether ``path`` is a temporary that an lmlab process made and that process has ended: a
    folder named like one, holding a manifest that names its process, on this host. ``locked``: the
    caller holds the lock of the folder ``path`` is in, so no lmlab process is writing there and
    the manifest's proof is enough."""
    m = _TEMPORARY.fullmatch(path.name)
    if not m or path.is_symlink() or not path.is_dir():
        return False
    manifest = read_manifest(path)
    if manifest is None:
        return False
    if locked:
        return True
    if m["what"] == "tmp" and manifest.get("state") == "writing":
        pid = manifest.get("pid")
        if pid != int(m["pid"]) or manifest.get("host") != _HOST:
            return False
        return not _alive(pid)
    # .old (being replaced) and .prune (being deleted): complete outputs; their pid is in the name
    return not _alive(int(m["pid"]))


def remove_leftovers(directory: Path, name: str | None = None, locked: bool = False) -> list[Path]:
    """Remove what ended lmlab processes left in ``directory`` (for every output name, or just
    ``name``): their temporaries, and outputs they were replacing or pruning. An output caught
    between the two renames of a replacement (``.NAME.old-PID`` with no ``NAME``) is put back.
    ``locked``: the caller holds the folder's lock (see :func:`is_dead_leftover`)."""
    removed: list[Path] = []
    if not Path(directory).is_dir():
        return removed
    for p in Path(directory).iterdir():
        m = _TEMPORARY.fullmatch(p.name)
        if not m or (name is not None and m["name"] != name) or not is_dead_leftover(p, locked):
            continue
        final = p.with_name(m["name"])
        if m["what"] == "old" and not (final.exists() or final.is_symlink()):
            os.replace(p, final)
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def make_temporary(parent: Path, name: str, kind: str, label: str = "") -> Path:
    """A new folder ``parent/.NAME.tmp-PID-LABEL...`` marked as this process's work in progress
    (the caller removes it; if the process dies first, the next run of the same output does)."""
    import tempfile

    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}.tmp-{os.getpid()}-{label}", dir=parent))
    try:
        os.chmod(tmp, 0o777 & ~current_umask())  # mkdtemp makes it private; give it the usual permissions
        start_temporary(tmp, kind)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return tmp


@contextlib.contextmanager
def live_dir(output: Path, kind: str):
    """A marked temporary beside the output folder ``output`` (``.NAME.tmp-PID-live-...``) for what
    a command writes while it runs and moves into the output at the end: its live metrics log (to
    tail), its loggers' files. Removed when the block ends, however it ends; first, whatever killed
    runs into the same output left is removed (:func:`remove_leftovers`: their processes ended)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    remove_leftovers(output.parent, output.name)
    tmp = make_temporary(output.parent, output.name, kind, "live-")
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def temporary_dir(parent: Path, name: str, kind: str):
    """A new temporary folder ``parent/.NAME.tmp-PID-XXXX`` marked as this process's; removed if the
    block fails. The caller renames it into place."""
    tmp = make_temporary(parent, name, kind)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def current_umask() -> int:
    """The process umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask

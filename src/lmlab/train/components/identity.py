"""What a ``--resume`` must find unchanged, by content: the inputs' fingerprints.

A resumed run continues the saved one only when it reads the same things: the same starting model,
the same training and evaluation data. Paths and modification times prove neither (another model
copied to the same path has the same path; the same file copied again has a new time), so every
input is recorded by the SHA-256 of its bytes:

* a file: its bytes;
* a folder (a checkpoint, a tokenizer, token shards, a ``datasets`` folder): each of its files,
  by relative path, hidden entries (``.git/``, lmlab's bookkeeping) aside;
* a model or examples held in memory (the Python API): the tensors' bytes, the examples' fields.

A fingerprint is JSON (``{"sha256": ..., "files": {rel: {"path", "size", "mtime_ns", "sha256"}}}``),
saved in the checkpoint's ``train_state.json``; two inputs are the same when their ``sha256`` are
(the paths and times are there only to spare hashing again). Hashing reads each file once, in
chunks (about 0.5 GB/s); on a resume a file at the recorded place whose size and modification time
(to the nanosecond) are the recorded ones is taken as read (its recorded digest reused), so only
what was touched since is hashed again.

Pretraining (:mod:`lmlab.train.pretrain_state`), fine-tuning and DPO (through
:mod:`lmlab.train.components.output_resume`) record and compare their inputs here; what each does
about a difference is its own policy.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lmlab.errors import LmlabError

CHUNK = 1 << 20


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of the bytes of ``path``, read in chunks."""
    h = hashlib.sha256()
    try:
        with open(path, "rb") as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    except OSError as e:
        raise LmlabError(f"cannot read {path} ({e.strerror or e})", "check that file and its permissions") \
            from None
    return h.hexdigest()


def _files(path: Path) -> dict[str, Path]:
    """The files that make ``path`` (relative POSIX path -> file): itself, or a folder's files."""
    if not path.is_dir():
        return {"": path}
    found = {}
    for root, dirs, names in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in names:
            f = Path(root) / name
            if not name.startswith(".") and f.is_file():
                found[f.relative_to(path).as_posix()] = f
    return dict(sorted(found.items()))


def fingerprint(paths, known: Any = None) -> dict[str, Any]:
    """The content fingerprint of the file or folder ``paths`` (or of a list of them, in order; see
    the module's text). ``known``: a fingerprint recorded earlier for the same input, whose digests
    are reused for the files at the same place with the same size and modification time. Each file
    is an entry of ``files``: its path relative to the folder given (``""`` for a file given), or
    ``"I/REL"`` for the I-th of a list."""
    one = isinstance(paths, (str, os.PathLike))
    given = [Path(paths)] if one else [Path(p) for p in paths]
    before = known.get("files") if isinstance(known, dict) else None
    before = before if isinstance(before, dict) else {}
    files: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(given):
        if not p.exists():
            files["" if one else str(i)] = {"path": str(p), "sha256": None, "missing": True}
            continue
        for rel, f in _files(p).items():
            key = rel if one else f"{i}/{rel}" if rel else str(i)
            where, st = str(f.absolute()), f.stat()
            old = before.get(key)
            untouched = isinstance(old, dict) and isinstance(old.get("sha256"), str) and \
                (old.get("path"), old.get("size"), old.get("mtime_ns")) == (where, st.st_size, st.st_mtime_ns)
            if untouched:
                digest = old["sha256"]
            else:
                digest = file_sha256(f)
            files[key] = {"path": where, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": digest}
    out = {"sha256": _combine((k, v["sha256"]) for k, v in files.items()), "files": files}
    return out if one else {**out, "listed": True}


def module_fingerprint(module) -> dict[str, Any]:
    """The fingerprint of a model held in memory: its state dict's names, shapes, types and bytes."""
    import torch

    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        t = t.detach().to("cpu").contiguous().reshape(-1)
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}\0".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    return {"sha256": h.hexdigest(), "in_memory": "model"}


def examples_fingerprint(examples) -> dict[str, Any]:
    """The fingerprint of examples held in memory (dataclasses or plain values), in order."""
    import dataclasses

    h = hashlib.sha256()
    for e in examples:
        value = dataclasses.asdict(e) if dataclasses.is_dataclass(e) else e
        h.update(json.dumps(value, sort_keys=True, default=str).encode() + b"\n")
    return {"sha256": h.hexdigest(), "in_memory": "examples", "count": len(examples)}


def input_fingerprint(source, known: Any = None) -> dict[str, Any] | None:
    """The fingerprint of an input as a command receives it: a path, a model, a tokenizer, examples,
    or None (not given)."""
    if source is None:
        return None
    if isinstance(source, (str, os.PathLike)):
        return fingerprint(source, known)
    if hasattr(source, "state_dict"):
        return module_fingerprint(source)
    if callable(getattr(source, "fingerprint", None)):  # a tokenizer: its own fingerprint of what it does
        digest = hashlib.sha256(str(source.fingerprint()).encode()).hexdigest()
        return {"sha256": digest, "in_memory": "tokenizer"}
    return examples_fingerprint(source)


def _combine(pairs) -> str:
    h = hashlib.sha256()
    for rel, digest in pairs:
        h.update(f"{rel}\0{digest}\n".encode())
    return h.hexdigest()


def same(saved: Any, now: Any) -> bool:
    """Whether two fingerprints (or None: no such input) say the same content."""
    if saved is None or now is None:
        return saved is None and now is None
    return isinstance(saved, dict) and saved.get("sha256") is not None \
        and saved.get("sha256") == now.get("sha256")


def how_it_differs(saved: Any, now: Any) -> str:
    """In words, how the input ``now`` differs from the ``saved`` one (they are not :func:`same`)."""
    if now is None:
        return "was given when the run started, not now"
    if saved is None:
        return "was not given when the run started"
    other = "holds other contents than when the run started"
    a, b = saved.get("files"), now.get("files")
    if now.get("in_memory") or not isinstance(a, dict) or not isinstance(b, dict):
        return other
    if any(v.get("missing") for v in b.values()):
        return "does not exist now"
    if set(a) == set(b) == {""}:
        return other
    changed = [k for k in sorted(set(a) | set(b))
               if (a.get(k) or {}).get("sha256") != (b.get(k) or {}).get("sha256")]
    words = []
    for k in changed[:3]:
        # a file of a folder by its path in it; of a list of inputs, by its name
        name = Path((b.get(k) or a.get(k) or {}).get("path", k)).name if now.get("listed") else k
        words.append(f"{name} {'is new' if k not in a else 'is gone' if k not in b else 'differs'}")
    more = f" and {len(changed) - 3} more" if len(changed) > 3 else ""
    return f"{other} ({', '.join(words)}{more})"


def differences(saved: dict[str, Any], now: dict[str, Any], names: dict[str, str]) -> list[str]:
    """The inputs of ``now`` (``{role: fingerprint}``) that differ from ``saved``, in words: each
    ``"{name} {how}"``, with ``names[role]`` saying what the role is (``"--train data/train.tsv"``)."""
    return [f"{names.get(role, role)} {how_it_differs(saved.get(role), now.get(role))}"
            for role in sorted(set(saved) | set(now)) if not same(saved.get(role), now.get(role))]

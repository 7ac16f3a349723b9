"""Stopping a fine-tuning run and continuing it exactly (``lmlab finetune ... --resume``).

While a run writes to ``OUT``, it keeps a *resume state* beside it, in ``.OUT.resume/``: every
``save_every`` steps (default: after each evaluation) and when it is asked to stop (Ctrl-C,
SIGTERM: the step in flight finishes, the state is written, the run ends), one file,
``state.pt``, holds all that the rest of the run depends on:

* the model's weights and the optimizer's moments;
* the step, the examples seen, the batches left in this epoch, the shuffling generator and the
  global RNG (dropout), so the remaining batches and masks are the ones the run would have drawn;
* the best dev score so far with its weights, and the metrics rows written so far.

``--resume`` loads it after building the model the usual way and continues; the result (weights,
``eval.json``, ``metrics.jsonl`` apart from timings) equals the uninterrupted run's. The state
records what the run was started with (settings, task, method, input files); a resume with other
values is refused, since the rest of the run would no longer be that run. When the run ends, its
output is in ``OUT`` and ``.OUT.resume/`` is removed. Without ``--resume``, a run refuses to start
over an interrupted one (the work would be lost); with ``--resume`` and nothing to resume, it
starts from the beginning.
"""

from __future__ import annotations

import io
import os
import shutil
from pathlib import Path
from typing import Any

import torch

from lmlab import ownership
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_write_bytes

STATE_FILE = "state.pt"
LOCK = ".lock"  # the file lmlab.fileio.directory_lock holds while a run writes OUT
LOGS = "logs"  # the loggers' files while the run goes (TensorBoard...), moved into OUT at the end

#: settings that may differ on --resume: they change neither the arithmetic nor the run's past
FREE_SETTINGS = ("progress", "threads", "save_every", "loggers", "device")


def resume_dir(out_dir: Path) -> Path:
    """Where the resume state of a run writing ``out_dir`` lives (a hidden sibling)."""
    return out_dir.with_name(f".{out_dir.name}.resume")


#: what a run writes in its resume folder
ENTRIES = (STATE_FILE, LOGS, "metrics.jsonl")
KIND = "fine-tuning resume state"


def claim(out_dir: Path) -> Path:
    """The resume folder of ``out_dir``, claimed for lmlab (:func:`lmlab.ownership.claim_dir`): a
    folder of that name that lmlab did not make is refused, never cleared."""
    return ownership.claim_dir(resume_dir(out_dir), KIND, ENTRIES)


def discard(out_dir: Path) -> None:
    """Remove the resume folder of ``out_dir``: what lmlab wrote there, then the folder itself if
    nothing else is left in it."""
    rdir = resume_dir(out_dir)
    _clear_owned(rdir)
    remove_if_only_lock(rdir)


def _clear_owned(rdir: Path) -> None:
    """Delete what lmlab wrote in the resume folder ``rdir``; anything else in it stays."""
    if rdir.is_dir() and ownership.read_manifest(rdir) is not None:
        for name in ENTRIES:
            ownership.remove_owned_tree(rdir, name)


def input_identity(data) -> Any:
    """A file input as (absolute path, size, modification time); in-memory examples by count."""
    if isinstance(data, (str, os.PathLike)):
        p = Path(data)
        st = p.stat() if p.exists() else None
        return [str(p.resolve()), st.st_size if st else None, st.st_mtime_ns if st else None]
    return ["examples", len(data)]


def run_identity(config: dict[str, Any], task: str, method: str, method_options: dict[str, Any],
                 checkpoint, train, dev) -> dict[str, Any]:
    """What a run was started with; a resume must match it (apart from :data:`FREE_SETTINGS`)."""
    settings = {k: v for k, v in config.items() if k not in FREE_SETTINGS}
    start = str(Path(checkpoint).resolve()) if isinstance(checkpoint, (str, os.PathLike)) else "model"
    return {"settings": _plain(settings), "task": task, "method": method,
            "method_options": _plain(method_options), "checkpoint": start,
            "train": input_identity(train), "dev": input_identity(dev)}


def _plain(obj):
    """Tuples as lists, so an identity compares equal after a round trip through torch.save."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def check_start(out_dir: Path, resume: bool, clear: bool = True) -> Path | None:
    """Before any work: the state file to resume from, or None to start from the beginning.

    An interrupted run's state is never discarded silently: starting again without ``--resume``
    is refused. A scratch directory with no state in it (a run that failed before its first save)
    holds nothing worth keeping and is cleared (by one process: ``clear``).
    """
    rdir = resume_dir(out_dir)
    state = rdir / STATE_FILE
    if state.is_file():
        if not resume:
            raise LmlabError(f"{out_dir} has an interrupted fine-tuning run (its state is in {rdir})",
                             "pass --resume to continue it, or delete that directory to start over")
        return state
    if clear:
        _clear_owned(rdir)
    return None


def remove_if_only_lock(rdir: Path) -> None:
    """Remove the resume directory when it holds nothing but lmlab's bookkeeping (its lock and
    manifest: a run that ended, or failed before writing anything there)."""
    if rdir.is_dir() and {p.name for p in rdir.iterdir()} <= ownership.BOOKKEEPING:
        shutil.rmtree(rdir, ignore_errors=True)


def save_state(out_dir: Path, state: dict[str, Any]) -> None:
    """Write ``state`` to ``.OUT.resume/state.pt`` (a temporary file, then a rename)."""
    buf = io.BytesIO()
    torch.save(state, buf)
    atomic_write_bytes(resume_dir(out_dir) / STATE_FILE, buf.getvalue())


def read_state(path: Path) -> dict[str, Any]:
    """``state.pt`` read (tensors, numbers and containers only: nothing in it can run code) and
    checked whole against :class:`lmlab.file_schemas.FinetuneStateFile`; an unreadable or damaged
    file is one line."""
    from lmlab import values
    from lmlab.file_schemas import FinetuneStateFile

    fix = f"delete {path.parent} to start the run over"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
        raise LmlabError(f"{path}: is not a readable resume state ({_load_failure(e)})", fix) from None
    values.check(FinetuneStateFile, state, where=str(path), fix=fix)
    return state


def _load_failure(error: Exception) -> str:
    """What ``torch.load`` could not read, in a few words (torch's own text runs to several lines,
    with advice to unpickle the file unsafely)."""
    text = str(error)
    if "Weights only load failed" in text:
        return "it holds Python objects besides tensors, numbers and containers, which lmlab does not load"
    first = text.strip().splitlines()[0] if text.strip() else type(error).__name__
    return first if len(first) <= 100 else first[:97] + "..."


def check_fits(state: dict[str, Any], path: Path, model, optimizer, examples: int) -> None:
    """The saved weights, optimizer state, generators and batch order fit the model, optimizer
    and training examples this run built (else loading them fails inside torch, mid-run)."""
    from lmlab.train.checkpoint import check_moments, check_param_groups, check_rng_state

    fix = f"resume with the same command, or delete {path.parent} to start over"
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    saved = {k: tuple(v.shape) for k, v in state["model"].items()}
    if set(own) != set(saved):
        missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        raise LmlabError(f"{path}: model: must hold this run's weights (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})", fix)
    for k, shape in saved.items():
        if shape != own[k]:
            raise LmlabError(f"{path}: model.{k}: must have shape {own[k]} (got {shape})", fix)
    groups = state["optimizer"]["param_groups"]
    check_param_groups(groups, optimizer, str(path), fix)
    check_moments(state["optimizer"]["state"], groups, optimizer, str(path), fix, key="optimizer.state")
    check_rng_state(state["generator"], f"{path}: generator", fix)
    if "rng.torch" in state["rng"]:
        check_rng_state(state["rng"]["rng.torch"], f"{path}: rng.rng.torch", fix)
    worst = max((i for batch in state["order"] for i in batch), default=-1)
    if worst >= examples:
        raise LmlabError(f"{path}: order: must number the {examples} training examples (got {worst})", fix)


def load_state(path: Path, identity: dict[str, Any], model=None, optimizer=None,
               examples: int | None = None) -> dict[str, Any]:
    """The saved state, after checking that this run is the one that saved it and, given the
    run's ``model``, ``optimizer`` and number of training ``examples``, that it fits them."""
    state = read_state(path)
    saved = state.get("identity", {})
    changed = sorted(k for k in set(saved) | set(identity) if saved.get(k) != identity.get(k))
    if changed:
        detail = []
        for k in changed:
            if k == "settings":
                a, b = saved.get(k, {}), identity.get(k, {})
                detail += [f"{s} {a.get(s)!r} -> {b.get(s)!r}" for s in sorted(set(a) | set(b))
                           if a.get(s) != b.get(s)]
            else:
                detail.append(f"{k} {saved.get(k)!r} -> {identity.get(k)!r}")
        raise LmlabError(f"--resume with other settings than the interrupted run: {'; '.join(detail)}",
                         "resume with the same command, or delete "
                         f"{path.parent} to start over")
    if model is not None and optimizer is not None and examples is not None:
        check_fits(state, path, model, optimizer, examples)
    return state


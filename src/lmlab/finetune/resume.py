"""Stopping a fine-tuning run and continuing it exactly (``lmlab finetune ... --resume``).

While a run writes to ``OUT``, it keeps a *resume state* beside it, in ``.OUT.resume/``: every
``save_every`` steps (default: after each evaluation) and when it is asked to stop (Ctrl-C,
SIGTERM: the step in flight finishes, the state is written, the run ends). The state is a
checkpoint in the one resume format of every lmlab loop (:mod:`lmlab.train.components.checkpointer`),
``.OUT.resume/checkpoints/step_N/``, the newest only:

* ``model.safetensors``: the weights being tuned (a bare state dict: adapters, task head);
* ``train_state.safetensors``: AdamW's moments, the global RNG (dropout) and the shuffling
  generator (``rng.shuffle``), the best-so-far weights (``best.*``);
* ``train_state.json``: the step, the examples seen (``data_position``), the batches left in this
  epoch, the best dev score so far, the metrics rows written so far and what the run was started
  with (``finetune``), checked whole against :class:`lmlab.file_schemas.TrainStateFile`.

``--resume`` loads it after building the model the usual way and continues; the result (weights,
``eval.json``, ``metrics.jsonl`` apart from timings) equals the uninterrupted run's. A resume with
other settings, task, method or inputs is refused before the model loads, since the rest of the
run would no longer be that run: the inputs (``--checkpoint``, ``--tokenizer``, ``--train``,
``--dev``) are recorded by content (:mod:`lmlab.train.components.identity`), not by path or time.
An ``OUT`` taken by something else while the run trained keeps the work: the state at the last
step stays here and the one line says to move the other thing away and ``--resume``
(:func:`output_fix`). When the run ends, its output is in ``OUT`` and ``.OUT.resume/`` is removed. Without
``--resume``, a run refuses to start over an interrupted one (the work would be lost); with
``--resume`` and nothing to resume, it starts from the beginning. A ``state.pt`` left by an lmlab
before this format is not read: the run says so in one line (delete the folder to start over).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import torch

from lmlab import ownership
from lmlab.errors import LmlabError
from lmlab.train.checkpoint import (
    CHECKPOINTS,
    STATE_JSON,
    STATE_TENSORS,
    check_moments,
    check_param_groups,
    check_rng_state,
    delete_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    read_train_state,
    set_aside_damaged,
)
from lmlab.train.components.checkpointer import Checkpointer, StateDictWeights, optimizer_state
from lmlab.train.components.identity import differences, input_fingerprint
from lmlab.train.components.resume_state import ResumeState, random_streams

OLD_STATE_FILE = "state.pt"  # the resume state of lmlab before the one resume format
LOGS = "logs"  # the loggers' files while the run goes (TensorBoard...), moved into OUT at the end

#: settings that may differ on --resume: they change neither the arithmetic nor the run's past
FREE_SETTINGS = ("progress", "threads", "save_every", "loggers", "device")


def resume_dir(out_dir: Path) -> Path:
    """Where the resume state of a run writing ``out_dir`` lives (a hidden sibling)."""
    return out_dir.with_name(ownership.derived_name(out_dir.name, out_dir.parent, "resume"))


#: what a run writes in its resume folder
ENTRIES = (CHECKPOINTS, LOGS, "metrics.jsonl")
KIND = "fine-tuning resume state"


def claim(out_dir: Path) -> Path:
    """The resume folder of ``out_dir``, claimed for lmlab (:func:`lmlab.ownership.claim_dir`): a
    folder of that name that lmlab did not make is refused, never cleared."""
    return ownership.claim_dir(resume_dir(out_dir), KIND, ENTRIES, keeps=_keeps(out_dir))


def claimed(out_dir: Path):
    """:func:`claim` for the run (:func:`lmlab.ownership.claimed_dir`): when the run ends with nothing
    left there (it finished, or failed before saving a state), the folder is removed."""
    return ownership.claimed_dir(resume_dir(out_dir), KIND, ENTRIES, keeps=_keeps(out_dir))


def _keeps(out_dir: Path) -> str:
    """What the resume folder of ``out_dir`` holds, as an error names it."""
    return f"the resume state of --out {out_dir}"


def checkpointer(out_dir: Path, save_every: int | None) -> Checkpointer:
    """The run's checkpointer: the newest state only, after each evaluation (or every
    ``save_every`` steps), never at the last step (the output is written then)."""
    return Checkpointer(resume_dir(out_dir), keep=1, every=save_every, at_end=False)


def discard(out_dir: Path) -> None:
    """Remove what lmlab wrote in the resume folder of ``out_dir``; the folder itself goes when the
    run gives back its claim (:func:`claimed`), if nothing else is left in it."""
    _clear_owned(resume_dir(out_dir))


def _clear_owned(rdir: Path) -> None:
    """Delete what lmlab wrote in the resume folder ``rdir``; anything else in it stays."""
    if rdir.is_dir() and ownership.read_manifest(rdir) is not None:
        for _, path in list_checkpoints(rdir):  # each one only if it holds nothing of yours
            delete_checkpoint(path)
        folder = rdir / CHECKPOINTS
        if folder.is_dir() and not {p.name for p in folder.iterdir()} - ownership.BOOKKEEPING:
            ownership.remove_owned_tree(rdir, CHECKPOINTS, refuse=False)
        for name in ENTRIES:  # each only if all in it is what lmlab wrote, unchanged: else it stays
            if name != CHECKPOINTS:
                ownership.remove_owned_tree(rdir, name, refuse=False)


def saved_state(out_dir: Path, say=None) -> Path | None:
    """The checkpoint an interrupted run writing ``out_dir`` left (None: there is none); a damaged
    newer one is skipped and named through ``say``."""
    return latest_checkpoint(resume_dir(out_dir), say)


#: a run's inputs (run_identity's ``inputs``), by the flag that names them
INPUT_FLAGS = {"checkpoint": "--checkpoint", "tokenizer": "--tokenizer", "train": "--train", "dev": "--dev"}
#: the identity recorded by this lmlab: inputs by content (an earlier one recorded paths and times)
IDENTITY_VERSION = 2


def run_identity(config: dict[str, Any], task: str, method: str, method_options: dict[str, Any],
                 inputs: dict[str, Any], known: dict[str, Any] | None = None) -> dict[str, Any]:
    """What a run was started with; a resume must match it: the settings (apart from
    :data:`FREE_SETTINGS`), task and method, and the contents of ``inputs`` (``{role: path, model,
    tokenizer or examples}``, roles of :data:`INPUT_FLAGS`), fingerprinted by
    :mod:`lmlab.train.components.identity`. ``known``: the identity saved by the interrupted run,
    whose digests are reused for the files untouched since."""
    settings = {k: v for k, v in config.items() if k not in FREE_SETTINGS}
    ours = isinstance(known, dict) and known.get("version") == IDENTITY_VERSION
    before = known.get("inputs", {}) if ours else {}
    return {"version": IDENTITY_VERSION, "settings": _plain(settings), "task": task, "method": method,
            "method_options": _plain(method_options),
            "inputs": {role: input_fingerprint(src, before.get(role)) for role, src in inputs.items()}}


def _plain(obj):
    """Tuples as lists, so an identity compares equal after a round trip through JSON."""
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def saved_identity(path: Path) -> dict[str, Any]:
    """The identity recorded in the checkpoint ``path`` (its ``train_state.json``, checked whole)."""
    fix = f"delete {path.parent.parent} to start the run over"
    try:
        meta = read_train_state(path)
    except LmlabError as e:
        raise LmlabError(e.problem, fix) from None
    if "finetune" not in meta:
        raise LmlabError(f"{path / STATE_JSON}: finetune: is missing (a pretraining checkpoint?)", fix)
    return meta["finetune"]["identity"]


def check_identity(saved: dict[str, Any], identity: dict[str, Any], inputs: dict[str, Any], path: Path,
                   say=None) -> None:
    """Before any work: the run resumed from the checkpoint ``path`` is the one that saved it (same
    settings, task, method and input contents), else one line naming what differs. A state written
    by an earlier lmlab (inputs by path and time) is checked as that lmlab did."""
    rdir = path.parent.parent
    detail = _setting_changes(saved, identity)
    if saved.get("version") != IDENTITY_VERSION:
        _check_earlier_identity(saved, inputs, detail, rdir, say)
        return
    names = {role: _input_name(role, src) for role, src in inputs.items()}
    detail += differences(saved.get("inputs", {}), identity["inputs"], names)
    if detail:
        raise LmlabError(f"--resume does not continue the interrupted run: {', '.join(detail)}",
                         f"resume with the run's own settings and files, or delete {rdir} to start the run "
                         "over")


def _setting_changes(saved: dict[str, Any], identity: dict[str, Any]) -> list[str]:
    """The settings, task, method and method options that differ, as ``"lr 0.0005 -> 0.001"``."""
    out = []
    a, b = saved.get("settings", {}), identity["settings"]
    out += [f"{k} {_shown(a.get(k))} -> {_shown(b.get(k))}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]
    for key, flag in (("task", "--task"), ("method", "--method")):
        if saved.get(key) != identity[key]:
            out.append(f"{flag} {_shown(saved.get(key))} -> {_shown(identity[key])}")
    a, b = saved.get("method_options", {}), identity["method_options"]
    out += [f"--method-option {k} {_shown(a.get(k))} -> {_shown(b.get(k))}" for k in sorted(set(a) | set(b))
            if a.get(k) != b.get(k)]
    return out


def _shown(value) -> str:
    """A setting's value in a message: as written on a command line, JSON for lists and tables."""
    if value is None:
        return "unset"
    return value if isinstance(value, str) else json.dumps(value)


def _input_name(role: str, source) -> str:
    """``--train data/train.tsv``, or what was given in memory (the Python API)."""
    if isinstance(source, (str, os.PathLike)):
        return f"{INPUT_FLAGS.get(role, role)} {source}"
    return {"checkpoint": "the model", "tokenizer": "the tokenizer"}.get(role, f"the {role} examples") + \
        " given in memory"


def _check_earlier_identity(saved: dict[str, Any], inputs: dict[str, Any], detail: list[str], rdir: Path,
                            say) -> None:
    """A state saved by an lmlab before content identities: its inputs were recorded by path (the
    checkpoint) and by path, size and modification time (the data files). Resumed when they match,
    as that lmlab did; else one line (an identical copy cannot be told from another file)."""
    def recorded(role, source):
        if role == "checkpoint":
            return str(Path(source).resolve()) if isinstance(source, (str, os.PathLike)) else "model"
        if isinstance(source, (str, os.PathLike)):
            p = Path(source)
            st = p.stat() if p.exists() else None
            return [str(p.resolve()), st.st_size if st else None, st.st_mtime_ns if st else None]
        return ["examples", len(source)]

    for role in ("checkpoint", "train", "dev"):
        if role in saved and saved[role] != recorded(role, inputs.get(role)):
            what = "path" if role == "checkpoint" else "file"
            detail.append(f"{_input_name(role, inputs.get(role))} is not the {what} the run started with, or "
                          "was modified since")
    if detail:
        raise LmlabError(f"--resume does not continue the interrupted run, whose state an earlier lmlab "
                         f"wrote (inputs recorded by path and time, not content): {', '.join(detail)}",
                         f"resume with the run's own settings and files as they were, or delete {rdir} to "
                         "start the run over")
    if say is not None:
        say(f"note: the resume state in {rdir} was written by an earlier lmlab, which recorded the inputs by "
            "path and time: resuming as it would (their contents cannot be checked)")


def output_fix(out_dir: str | os.PathLike, kept: bool = False) -> str | None:
    """What to do when the output ``out_dir`` is taken by something else: move it away and resume
    (:func:`lmlab.ownership.keep_work_fix`) when the work is kept in the resume folder (``kept``: it
    will be; else when an interrupted run left a state there), else None (the usual advice)."""
    out_dir = Path(out_dir)
    try:
        rdir = resume_dir(out_dir)
    except ValueError:  # "." or "/": no resume folder, and the usual checks refuse such an output
        return None
    if kept or list_checkpoints(rdir):
        return ownership.keep_work_fix(out_dir, rdir)
    return None


def holds_state(out_dir: Path) -> bool:
    """Whether the resume folder of ``out_dir`` holds a checkpoint, intact or not (never raises:
    asked while a run ends, to tell whether its resume folder is worth keeping)."""
    return bool(list_checkpoints(resume_dir(out_dir)))


def check_start(out_dir: Path, resume: bool, clear: bool = True, say=None) -> Path | None:
    """Before any work: the checkpoint to resume from, or None to start from the beginning.

    An interrupted run's state is never discarded silently: starting again without ``--resume``
    is refused. A scratch directory with no state in it (a run that failed before its first save)
    holds nothing worth keeping and is cleared (by one process: ``clear``). A ``state.pt`` of an
    earlier lmlab is refused in one line."""
    rdir = resume_dir(out_dir)
    if (rdir / OLD_STATE_FILE).is_file():
        raise LmlabError(f"{rdir / OLD_STATE_FILE} is the resume state of an earlier lmlab version, which "
                         "this version does not read", f"delete {rdir} to start the run over, or finish the "
                         "run with the lmlab version that started it")
    state = saved_state(out_dir, say)
    if state is not None:
        if not resume:
            raise LmlabError(f"{out_dir} has an interrupted fine-tuning run (its state is in {rdir})",
                             "pass --resume to continue it, or delete that directory to start over")
        if clear:  # one process renames; the resumed run writes those steps again
            set_aside_damaged(rdir, say)
        return state
    if clear:
        _clear_owned(rdir)
    return None


def save(saver: Checkpointer, run, identity: dict[str, Any], history: list | None = None) -> Path:
    """Checkpoint the fine-tuning ``run`` (:class:`lmlab.finetune.run.FinetuneRun`) at its step
    (``history``: the metrics rows so far, when not all of the run's log)."""
    tensors, opt_meta = optimizer_state(run.optimizer)
    tensors.update(random_streams({"shuffle": run.gen}))
    tensors.update({f"best.{k}": v.detach().cpu() for k, v in (run.best["snap"] or {}).items()})
    best = run.best
    score = None if best["score"] == -math.inf else best["score"]
    state = ResumeState(run.step, run.seen, 0, run.elapsed())
    meta = {**state.meta(), "epoch": run.seen / len(run.feats), "optimizer": opt_meta,
            "config": run.cfg.to_dict(),
            "machine": {"threads": run.machine.threads, "precision": run.machine.precision},
            "finetune": {"identity": identity, "order": run.order, "run_loss": run.run_loss,
                         "n_loss": run.n_loss, "best": {"score": score, "metrics": best["metrics"],
                                                        "step": best["step"]},
                         "history": run.log.history if history is None else history}}
    return saver.save(run.step, StateDictWeights(run.model.state_dict()), tensors, meta)


def load(path: Path, model, optimizer, examples: int):
    """``(tensors, meta, weights)`` of the checkpoint ``path`` (whose identity
    :func:`check_identity` accepted), after checking that it fits the run's ``model``, ``optimizer``
    and ``examples``."""
    fix = f"delete {path.parent.parent} to start the run over"
    try:
        tensors, meta, weights = Checkpointer.read(path)
    except LmlabError as e:
        raise LmlabError(e.problem, fix) from None
    if "finetune" not in meta:
        raise LmlabError(f"{path / STATE_JSON}: finetune: is missing (a pretraining checkpoint?)", fix)
    _check_fits(path, tensors, meta, weights, model, optimizer, examples)
    return tensors, meta, weights


def _check_fits(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                weights: dict[str, torch.Tensor], model, optimizer, examples: int) -> None:
    """The saved weights, optimizer state, generators and batch order fit the model, optimizer
    and training examples this run built (else loading them fails inside torch, mid-run)."""
    from lmlab.models.checkpoint import WEIGHTS_NAME

    fix = f"resume with the same command, or delete {path.parent.parent} to start over"
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    saved = {k: tuple(v.shape) for k, v in weights.items()}
    where = path / WEIGHTS_NAME
    if set(own) != set(saved):
        missing, unexpected = sorted(set(own) - set(saved)), sorted(set(saved) - set(own))
        raise LmlabError(f"{where}: must hold this run's weights (missing {missing[:3]}, unexpected "
                         f"{unexpected[:3]})", fix)
    for k, shape in saved.items():
        if shape != own[k]:
            raise LmlabError(f"{where}: {k}: must have shape {own[k]} (got {shape})", fix)
    groups = meta["optimizer"]["param_groups"]
    check_param_groups(groups, optimizer, str(path / STATE_JSON), fix)
    moments: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in tensors.items():
        if key.startswith("state."):
            _, idx, name = key.split(".", 2)
            moments.setdefault(int(idx), {})[name] = t
    check_moments(moments, groups, optimizer, str(path / STATE_TENSORS), fix)
    for name in ("rng.shuffle", "rng.torch"):
        if name not in tensors:
            raise LmlabError(f"{path / STATE_TENSORS}: {name}: is missing", fix)
        check_rng_state(tensors[name], f"{path / STATE_TENSORS}: {name}", fix)
    worst = max((i for batch in meta["finetune"]["order"] for i in batch), default=-1)
    if worst >= examples:
        raise LmlabError(f"{path / STATE_JSON}: finetune.order: must number the {examples} training examples "
                         f"(got {worst})", fix)

"""The resume folder beside a command's output (``.OUT.resume/``): stopping a run that writes
``OUT`` and continuing it exactly with ``--resume``. Fine-tuning (:mod:`lmlab.finetune.resume`) and
preference tuning (DPO, :mod:`lmlab.align.loop`) keep their resume state here alike; each is a
:class:`ResumeFolder` (its loop's ``section`` of ``train_state.json`` and what it is called).

While a run writes to ``OUT``, it keeps a *resume state* beside it, in ``.OUT.resume/``: a checkpoint
in the one resume format of every lmlab loop (:mod:`lmlab.train.components.checkpointer`),
``.OUT.resume/checkpoints/step_N/``, the newest only, with the loop's own JSON state under its
``section`` (``finetune``, ``align``) and, there, the run's *identity*: its settings (apart from
:data:`FREE_SETTINGS`), task, method and inputs by content (:mod:`lmlab.train.components.identity`).

* :meth:`ResumeFolder.check_start`, before any work: the state to resume from, or None; an
  interrupted run is never started over silently (without ``--resume`` the run is refused), a
  ``state.pt`` of an lmlab before this format is refused in one line;
* :meth:`ResumeFolder.check_identity`: a resume of another run (other settings, other files) is
  refused in one line naming what differs, before the model loads;
* :func:`output_fix`: an ``OUT`` taken by something else while the work is kept here: move it away
  and ``--resume`` (:func:`lmlab.ownership.keep_work_fix`);
* :meth:`ResumeFolder.discard`: what lmlab wrote here is removed when the run has finished (the
  folder goes when the run gives back its claim, :meth:`ResumeFolder.claimed`, if nothing of yours
  is left in it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
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
from lmlab.train.components.checkpointer import Checkpointer
from lmlab.train.components.identity import differences, input_fingerprint

OLD_STATE_FILE = "state.pt"  # the resume state of lmlab before the one resume format
LOGS = "logs"  # the loggers' files while the run goes (TensorBoard...), moved into OUT at the end

#: settings that may differ on --resume: they change neither the arithmetic nor the run's past
FREE_SETTINGS = ("progress", "threads", "save_every", "loggers", "device")

#: what a run writes in its resume folder
ENTRIES = (CHECKPOINTS, LOGS, "metrics.jsonl")

#: a run's inputs (run_identity's ``inputs``), by the flag that names them
INPUT_FLAGS = {"checkpoint": "--checkpoint", "tokenizer": "--tokenizer", "train": "--train", "dev": "--dev"}
#: the identity recorded by this lmlab: inputs by content (an earlier one recorded paths and times)
IDENTITY_VERSION = 2


def resume_dir(out_dir: Path) -> Path:
    """Where the resume state of a run writing ``out_dir`` lives (a hidden sibling)."""
    return out_dir.with_name(ownership.derived_name(out_dir.name, out_dir.parent, ownership.RESUME))


def _keeps(out_dir: Path) -> str:
    """What the resume folder of ``out_dir`` holds, as an error names it."""
    return f"the resume state of --out {out_dir}"


def _clear_owned(rdir: Path) -> None:
    """Delete what lmlab wrote in the resume folder ``rdir``; anything else in it stays."""
    if rdir.is_dir() and ownership.read_manifest(rdir) is not None:
        for _, path in list_checkpoints(rdir):  # each one only if it holds nothing of yours
            if not delete_checkpoint(path):
                _retire_state(path)
        folder = rdir / CHECKPOINTS
        if folder.is_dir() and not {p.name for p in folder.iterdir()} - ownership.BOOKKEEPING:
            ownership.remove_owned_tree(rdir, CHECKPOINTS, refuse=False)
        for name in ENTRIES:  # each only if all in it is what lmlab wrote, unchanged: else it stays
            if name != CHECKPOINTS:
                ownership.remove_owned_tree(rdir, name, refuse=False)


def _retire_state(path: Path) -> None:
    """A checkpoint kept for the files of yours in it (:func:`delete_checkpoint` refused) stops
    being a resume state: lmlab's train-state files in it go, each only while it is what lmlab wrote
    there (its manifest's stamp), and what is left is no longer a checkpoint (:func:`list_checkpoints`).
    Else a finished run whose resume folder held your notes was taken for an interrupted one, and
    ``--resume`` redid finished work from that old state."""
    manifest = ownership.read_manifest(path)
    if manifest is None:
        return
    for name in (STATE_TENSORS, STATE_JSON):  # the listing's test file last
        file = path / name
        if file.is_file() and not file.is_symlink() \
                and ownership.claimed_file_verdict(manifest, name, file).ok:
            file.unlink()


def saved_state(out_dir: Path, say=None) -> Path | None:
    """The checkpoint an interrupted run writing ``out_dir`` left (None: there is none); a damaged
    newer one is skipped and named through ``say``."""
    return latest_checkpoint(resume_dir(out_dir), say)


def holds_state(out_dir: Path) -> bool:
    """Whether the resume folder of ``out_dir`` holds a checkpoint, intact or not (never raises:
    asked while a run ends, to tell whether its resume folder is worth keeping)."""
    return bool(list_checkpoints(resume_dir(out_dir)))


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


def run_identity(config: dict[str, Any], task: str | None, method: str, method_options: dict[str, Any],
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


def check_identity(saved: dict[str, Any], identity: dict[str, Any], inputs: dict[str, Any], path: Path,
                   say=None, names=None) -> None:
    """Before any work: the run resumed from the checkpoint ``path`` is the one that saved it (same
    settings, task, method and input contents), else one line naming what differs, each setting as
    the caller names it (``names``, a :class:`~lmlab.config.rules.SettingNames`: ``--lr`` on the
    command line; default: its keyword). A state written by an earlier lmlab (inputs by path and
    time) is checked as that lmlab did."""
    rdir = path.parent.parent
    detail = _setting_changes(saved, identity, names)
    if saved.get("version") != IDENTITY_VERSION:
        _check_earlier_identity(saved, inputs, detail, rdir, say)
        return
    names = {role: _input_name(role, src) for role, src in inputs.items()}
    detail += differences(saved.get("inputs", {}), identity["inputs"], names)
    if detail:
        raise LmlabError(f"--resume does not continue the interrupted run: {', '.join(detail)}",
                         f"resume with the run's own settings and files, or delete {rdir} to start the run "
                         "over")


def _setting_changes(saved: dict[str, Any], identity: dict[str, Any], names=None) -> list[str]:
    """The settings, task, method and method options that differ, as ``"lr 0.0005 -> 0.001"``
    (``--lr 0.0005 -> 0.001`` when ``names`` are a command line's)."""
    out = []
    a, b = saved.get("settings", {}), identity["settings"]
    named = names.of if names is not None else str
    out += [f"{named(k)} {_shown(a.get(k))} -> {_shown(b.get(k))}" for k in sorted(set(a) | set(b))
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


@dataclass(frozen=True)
class ResumeFolder:
    """The resume folder of one kind of run: ``section``, the key of ``train_state.json`` that holds
    its loop's state (``finetune``, ``align``); ``what``, the run in words (``fine-tuning``)."""

    section: str
    what: str

    @property
    def kind(self) -> str:
        """The kind recorded in the folder's manifest (:func:`lmlab.ownership.claim_dir`)."""
        return ownership.resume_kind(self.what)

    def claim(self, out_dir: Path) -> Path:
        """The resume folder of ``out_dir``, claimed for lmlab (:func:`lmlab.ownership.claim_dir`): a
        folder of that name that lmlab did not make is refused, never cleared."""
        return ownership.claim_dir(resume_dir(out_dir), self.kind, ENTRIES, keeps=_keeps(out_dir))

    def claimed(self, out_dir: Path):
        """:meth:`claim` for the run (:func:`lmlab.ownership.claimed_dir`): when the run ends with
        nothing left there (it finished, or failed before saving a state), the folder is removed."""
        return ownership.claimed_dir(resume_dir(out_dir), self.kind, ENTRIES, keeps=_keeps(out_dir))

    @staticmethod
    def checkpointer(out_dir: Path, save_every: int | None) -> Checkpointer:
        """The run's checkpointer: the newest state only, after each evaluation (or every
        ``save_every`` steps), never at the last step (the output is written then)."""
        return Checkpointer(resume_dir(out_dir), keep=1, every=save_every, at_end=False)

    @staticmethod
    def discard(out_dir: Path) -> None:
        """Remove what lmlab wrote in the resume folder of ``out_dir``; the folder itself goes when
        the run gives back its claim (:meth:`claimed`), if nothing else is left in it."""
        _clear_owned(resume_dir(out_dir))

    def check_start(self, out_dir: Path, resume: bool, clear: bool = True, say=None,
                    resumable: bool = True) -> Path | None:
        """Before any work: the checkpoint to resume from, or None to start from the beginning.

        An interrupted run's state is never discarded silently: starting again without ``--resume``
        is refused. A scratch directory with no state in it (a run that failed before its first
        save) holds nothing worth keeping and is cleared (by one process: ``clear``). A ``state.pt``
        of an earlier lmlab is refused in one line. ``resumable`` False: this run cannot take
        ``--resume`` (another method); the refusal names how the interrupted run continues."""
        rdir = resume_dir(out_dir)
        if (rdir / OLD_STATE_FILE).is_file():
            raise LmlabError(f"{rdir / OLD_STATE_FILE} is the resume state of an earlier lmlab version, "
                             "which this version does not read",
                             f"delete {rdir} to start the run over, or finish the run with the lmlab version "
                             "that started it")
        state = saved_state(out_dir, say)
        if state is not None:
            if not resume:
                how = "pass --resume" if resumable else self._resumed_by(state)
                raise LmlabError(f"{out_dir} has an interrupted {self.what} run (its state is in {rdir})",
                                 f"{how} to continue it, or delete that directory to start over")
            if clear:  # one process renames; the resumed run writes those steps again
                set_aside_damaged(rdir, say)
            return state
        if clear:
            _clear_owned(rdir)
        return None

    def _resumed_by(self, state: Path) -> str:
        """How the interrupted run whose checkpoint is ``state`` continues, when this run cannot
        (another method): its own method's flag, with ``--resume``."""
        try:
            method = self.saved_identity(state).get("method")
        except LmlabError:
            method = None
        if not isinstance(method, str):
            return "run it again as it was started, with --resume,"
        return f"run it again as it was started (--method {method}), with --resume,"

    def _section_of(self, meta: dict[str, Any], path: Path, fix: str) -> dict[str, Any]:
        if self.section not in meta:
            raise LmlabError(f"{path / STATE_JSON}: {self.section}: is missing (not a {self.what} run's "
                             "state)", fix)
        return meta[self.section]

    def identity(self, config: dict[str, Any], task: str | None, method: str, method_options: dict[str, Any],
                 inputs: dict[str, Any], resume_from: Path | None, say=None, names=None) -> dict[str, Any]:
        """The run's identity (:func:`run_identity`); resuming from the checkpoint ``resume_from``,
        the saved state's must be the same: one line naming what differs (each setting as
        ``names`` name it), before the model loads."""
        known = None if resume_from is None else self.saved_identity(resume_from)
        identity = run_identity(config, task, method, method_options, inputs, known)
        if known is not None:
            check_identity(known, identity, inputs, resume_from, say, names)
        return identity

    def save(self, saver: Checkpointer, state, *, model, optimizer, epoch: float, config: dict[str, Any],
             machine, tensors: dict[str, torch.Tensor], loop: dict[str, Any]) -> Path:
        """Checkpoint a run at ``state`` (a :class:`~lmlab.train.components.resume_state.ResumeState`):
        the ``model``'s weights, the ``optimizer``'s moments and the global RNG, with this kind's own
        ``tensors`` (its random streams, ``rng.NAME``) and its loop state ``loop`` (the
        ``identity`` first) under :attr:`section` of ``train_state.json``."""
        from lmlab.train.components.checkpointer import StateDictWeights, optimizer_state

        saved, opt_meta = optimizer_state(optimizer)
        saved.update(tensors)
        meta = {**state.meta(), "epoch": epoch, "optimizer": opt_meta, "config": config,
                "machine": {"threads": machine.threads, "precision": machine.precision},
                self.section: loop}
        return saver.save(state.step, StateDictWeights(model.state_dict()), saved, meta)

    def saved_identity(self, path: Path) -> dict[str, Any]:
        """The identity recorded in the checkpoint ``path`` (its ``train_state.json``, checked whole)."""
        fix = f"delete {path.parent.parent} to start the run over"
        try:
            meta = read_train_state(path)
        except LmlabError as e:
            raise LmlabError(e.problem, fix) from None
        return self._section_of(meta, path, fix)["identity"]

    def read(self, path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
        """``(tensors, meta, weights)`` of the checkpoint ``path``, whose ``train_state.json`` holds
        this kind of run's section."""
        fix = f"delete {path.parent.parent} to start the run over"
        try:
            tensors, meta, weights = Checkpointer.read(path)
        except LmlabError as e:
            raise LmlabError(e.problem, fix) from None
        self._section_of(meta, path, fix)
        return tensors, meta, weights


def fix_of(path: Path) -> str:
    """The fix of a resume state that does not fit the run."""
    return f"resume with the same command, or delete {path.parent.parent} to start over"


def check_fits(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
               weights: dict[str, torch.Tensor], model, optimizer, streams: tuple[str, ...]) -> None:
    """The saved weights, optimizer state and random ``streams`` (``rng.NAME`` tensors) fit the
    ``model`` and ``optimizer`` this run built (else loading them fails inside torch, mid-run)."""
    from lmlab.models.checkpoint import WEIGHTS_NAME

    fix = fix_of(path)
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
    for name in ("rng.torch", *(f"rng.{s}" for s in streams)):
        if name not in tensors:
            raise LmlabError(f"{path / STATE_TENSORS}: {name}: is missing", fix)
        check_rng_state(tensors[name], f"{path / STATE_TENSORS}: {name}", fix)


def check_order(path: Path, order: list[list[int]], items: int, field: str, what: str) -> None:
    """The saved batches (lists of indices) number the run's ``items`` ``what``."""
    worst = max((i for batch in order for i in batch), default=-1)
    if worst >= items:
        raise LmlabError(f"{path / STATE_JSON}: {field}: must number the {items} {what} (got {worst})",
                         fix_of(path))

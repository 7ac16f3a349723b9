"""Training checkpoints: atomic, self-describing, safetensors + JSON (never pickle).

``RUN_DIR/checkpoints/step_N/`` holds

* the model as an lmlab model checkpoint (``config.json``, ``model.safetensors``, ``tokenizer/``),
  so ``lmlab.loading.load_model("RUN_DIR/checkpoints/step_N")`` loads it for generation or
  fine-tuning;
* ``train_state.safetensors``: optimizer moments (``state.{i}.exp_avg`` ...), the objective's own
  parameters (``objective.*``), RNG states (``rng.torch``, ``rng.cuda.{i}``, ``rng.{name}`` of a
  loop's own generator), fine-tuning's best-so-far weights (``best.*``);
* ``train_state.json``: step, tokens seen, the data position (windows consumed), the optimizer's
  hyper-parameters, the run config and the step-0 evaluation;
* under FSDP, ``sharded/``: each rank's shards of the weights and the optimizer state
  (``torch.distributed.checkpoint``), which ``--resume`` reads back into the sharded model; the
  optimizer moments are then not in ``train_state.safetensors``.

This is the one resume format of every loop (:mod:`lmlab.train.components.checkpointer`): a
fine-tuning run keeps the same folders in ``.OUT.resume/checkpoints/``, with the weights being
tuned as a bare state dict in ``model.safetensors`` and its loop state under ``finetune`` in
``train_state.json``.

The directory is built under a temporary name and renamed into place when complete
(:func:`lmlab.fileio.atomic_dir`): a crash or a full disk while writing leaves the previous
checkpoints untouched, and a directory named ``step_N`` is always complete. Older checkpoints
beyond ``keep`` are deleted only after the new one is in place.
"""

from __future__ import annotations

import errno
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, read_json, write_json
from lmlab.run_dirs import (  # noqa: F401  (the run layout's names, read here by the loops)
    _STEP_RE,
    CHECKPOINTS,
    STATE_FIX,
    STATE_JSON,
    STATE_TENSORS,
    _say_once,
    _stderr,
    _tensor_names,
    checkpoint_damage,
    latest_checkpoint,
    list_checkpoints,
    run_checkpoint,
)

SHARDED = "sharded"
FORMAT = "lmlab-train-state"
VERSION = 1


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step}"


def set_aside_damaged(run_dir: str | Path, say: Callable[[str], None] | None = None) -> list[Path]:
    """Before a resume: rename the damaged checkpoints newer than the newest intact one to
    ``step_N.damaged`` (kept, never deleted; no longer a checkpoint), so that the resumed run
    writes its own ``step_N`` again and its pruning counts only checkpoints it can read. Returns
    the new names."""
    newest = latest_checkpoint(run_dir, say)
    if newest is None:
        return []
    intact = int(_STEP_RE.fullmatch(newest.name).group(1))
    moved = []
    for step, path in list_checkpoints(run_dir):
        if step > intact:
            aside, k = path.with_name(f"{path.name}.damaged"), 1
            while aside.exists() or aside.is_symlink():
                aside, k = path.with_name(f"{path.name}.damaged-{k}"), k + 1
            os.replace(path, aside)
            (say or _stderr)(f"moved the damaged checkpoint {path.name} aside to {aside}")
            moved.append(aside)
    return moved


def check_checkpoint_names(run_dir: str | Path, after: int, upto: int) -> None:
    """One-line error, before any training, when something other than a checkpoint this run may
    replace stands where the run will write one: ``checkpoints/step_N`` for a step ``N`` it trains
    (``after < N <= upto``; a stop by a signal saves at any step). A file or folder of yours there,
    or another lmlab output (a model moved there), would otherwise stop the run only when it comes
    to save, losing the steps trained since the last checkpoint."""
    import shlex

    from lmlab import ownership

    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir() or root.is_symlink():
        return
    # the run's own (a damaged one newer than the checkpoint resumed from is moved aside: set_aside_damaged)
    own = {path for _, path in list_checkpoints(run_dir)}
    for path in sorted(root.iterdir()):
        m = _STEP_RE.fullmatch(path.name)
        if not m or not after < int(m.group(1)) <= upto or path in own:
            continue
        verdict = ownership.may_replace_dir(path, "checkpoint")
        if not verdict.ok:
            there, aside = shlex.quote(str(path)), shlex.quote(f"{path}.other")
            raise LmlabError(f"{path} {verdict.reason}, and the run writes its checkpoint of step "
                             f"{m.group(1)} there; nothing was trained",
                             f"move it away (mv {there} {aside}), then run the same command again")


def save_train_checkpoint(
    run_dir: str | Path,
    step: int,
    model,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    keep: int = 0,
    sharded: Path | None = None,
) -> Path:
    """Write ``checkpoints/step_{step}`` atomically; prune to the newest ``keep`` (0 = keep all).

    ``sharded``: a finished ``torch.distributed.checkpoint`` directory (FSDP: every rank's shards
    of the weights and optimizer state), moved in as ``sharded/`` before the checkpoint appears."""
    from lmlab.ownership import keep_work_fix

    dest = checkpoint_path(run_dir, step)
    # a folder that took its place meanwhile is moved away, not the run: the run folder holds its work
    try:
        with atomic_dir(dest, marker="model.safetensors", what="checkpoint",
                        fix=keep_work_fix(dest, run_dir)) as tmp:
            model.save(tmp)
            save_file(
                {k: v.contiguous() for k, v in tensors.items()},
                str(tmp / STATE_TENSORS),
                metadata={"format": FORMAT},
            )
            write_json(tmp / STATE_JSON, {"format": FORMAT, "version": VERSION, **meta})
            if sharded is not None:
                os.replace(sharded, tmp / SHARDED)
    except OSError as e:
        what = "the disk is full" if e.errno in (errno.ENOSPC, errno.EDQUOT) else (e.strerror or str(e))
        found = list_checkpoints(run_dir)  # only for the message: no work on the saving path
        kept = (f"the previous checkpoint {found[-1][1]} is intact" if found
                else "no earlier checkpoint exists")
        raise LmlabError(
            f"could not write checkpoint {dest} ({what}); {kept}",
            "free disk space and continue with --resume",
        ) from None
    if keep > 0:
        for _, old in list_checkpoints(run_dir)[:-keep]:
            delete_checkpoint(old)
    return dest


def delete_checkpoint(path: Path, say: Callable[[str], None] | None = None) -> bool:
    """Delete the checkpoint folder ``path`` (pruning, a finished fine-tuning's resume state) only
    when its manifest proves it is lmlab's and unchanged: a checkpoint holding a file lmlab did not
    write (your notes) or one changed since is kept, and named once. Returns whether it went.

    Renamed first (one atomic step), deleted after: a kill mid-way never leaves a ``step_N`` that
    looks complete but is not, and the next start removes the hidden leftover."""
    from lmlab import ownership

    verdict = ownership.may_replace_dir(path, "checkpoint")
    if not verdict.ok:
        _say_once(path, f"note: kept the old checkpoint {path}: it {verdict.reason}", say)
        return False
    doomed = ownership.move_aside(path, f"prune-{os.getpid()}")  # marked: a kill leaves a provable leftover
    ownership.remove_temporary(doomed)  # its marker last
    return True


#: what to do about a damaged train state
_MOMENT_RE = re.compile(r"state\.(\d+)\.(\w+)")
#: besides the moments: the objective's own parameters, fine-tuning's best-so-far weights, DPO's
#: reference log-probabilities (``align.train_ref``), and the random streams (torch's, CUDA's, and a
#: loop's own generators such as fine-tuning's shuffle)
_OTHER_TENSOR_RE = re.compile(r"objective\..+|best\..+|align\.train_ref|rng\.torch|rng\.cuda\.\d+"
                              r"|rng\.[a-z_]+")


def read_train_state(path: str | Path) -> dict[str, Any]:
    """``train_state.json`` of the checkpoint directory ``path``, checked whole against
    :class:`lmlab.file_schemas.TrainStateFile`, and the names of the tensors beside it against
    its optimizer groups (a hand-edited or crafted state is a one-line error before any work,
    not a traceback mid-run)."""
    from lmlab import values
    from lmlab.file_schemas import TrainStateFile

    path = Path(path)
    where = f"{path / STATE_JSON}"
    meta = read_json(path / STATE_JSON, "train state")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise LmlabError(
            f"{where} is not an lmlab train state (version {VERSION})",
            "resume from a checkpoint written by this lmlab version",
        )
    values.check(TrainStateFile, meta, where=where, fix=STATE_FIX)
    m = _STEP_RE.fullmatch(path.name)
    if m and int(m.group(1)) != meta["step"]:
        raise LmlabError(f"{where}: step: must be {m.group(1)}, the step of its directory "
                         f"(got {meta['step']})", STATE_FIX)
    groups = meta["optimizer"]["param_groups"]
    ids = [i for g in groups for i in g["params"]]
    if sorted(ids) != list(range(len(ids))):
        shown = f"{ids[:8]}{' ...' if len(ids) > 8 else ''}"
        raise LmlabError(f"{where}: optimizer.param_groups: the params lists must number the parameters "
                         f"0 to {len(ids) - 1}, each once (got {shown})", STATE_FIX)
    if (path / STATE_TENSORS).is_file():
        moments = _moment_names(_tensor_names(path / STATE_TENSORS), path / STATE_TENSORS)
        stray = sorted(set(moments) - set(ids))
        if stray:
            raise LmlabError(f"{path / STATE_TENSORS}: state.{stray[0]}: is the moment of no parameter in "
                             f"{STATE_JSON}'s optimizer groups (got ids up to {max(moments)}, the groups "
                             f"list {len(ids)})", STATE_FIX)
    return meta


def _moment_names(names: list[str], where: Path) -> dict[int, list[str]]:
    """Parameter id -> its moment names (``state.{id}.{name}``); any name lmlab does not write
    in a train state is an error."""
    moments: dict[int, list[str]] = {}
    for key in names:
        m = _MOMENT_RE.fullmatch(key)
        if m:
            moments.setdefault(int(m.group(1)), []).append(m.group(2))
        elif not _OTHER_TENSOR_RE.fullmatch(key):
            raise LmlabError(f"{where}: {key}: is not a tensor lmlab writes there (got that name)", STATE_FIX)
    return moments


def load_train_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict]:
    """``(train-state tensors, train-state JSON, model weights)`` of a checkpoint directory."""
    from lmlab.models.checkpoint import WEIGHTS_NAME, read_safetensors

    path = Path(path)
    meta = read_train_state(path)
    return read_safetensors(path / STATE_TENSORS), meta, read_safetensors(path / WEIGHTS_NAME)


def check_param_groups(groups: list[dict[str, Any]], optimizer: torch.optim.Optimizer, where: str,
                       fix: str) -> None:
    """The saved optimizer ``groups`` list as many parameters, group by group, as ``optimizer``
    (the one this run built): else loading them fails inside torch, or pairs moments with the
    wrong weights."""
    own = optimizer.param_groups
    if len(groups) != len(own):
        raise LmlabError(f"{where}: optimizer.param_groups: must hold {len(own)} groups, as this run's "
                         f"optimizer does (got {len(groups)})", fix)
    for i, (saved, mine) in enumerate(zip(groups, own)):
        if len(saved["params"]) != len(mine["params"]):
            raise LmlabError(f"{where}: optimizer.param_groups.{i}.params: must list {len(mine['params'])} "
                             f"parameters, as this run's group does (got {len(saved['params'])})", fix)


def check_moments(moments: dict[int, dict[str, torch.Tensor]], groups: list[dict[str, Any]],
                  optimizer: torch.optim.Optimizer, where: str, fix: str, key: str = "state") -> None:
    """Each saved moment (``{key}.{id}.{name}`` in the file ``where``) belongs to a parameter of
    ``groups`` and has that parameter's shape."""
    shapes = {i: tuple(p.shape) for saved, mine in zip(groups, optimizer.param_groups)
              for i, p in zip(saved["params"], mine["params"])}
    for idx, state in moments.items():
        if idx not in shapes:
            raise LmlabError(f"{where}: {key}.{idx}: is the moment of no parameter of this run's optimizer "
                             f"(got id {idx}, it has {len(shapes)} parameters)", fix)
        for name, t in state.items():
            if name != "step" and tuple(t.shape) != shapes[idx]:
                raise LmlabError(f"{where}: {key}.{idx}.{name}: must have the parameter's shape "
                                 f"{shapes[idx]} (got {tuple(t.shape)})", fix)


def check_rng_state(state: torch.Tensor, where: str, fix: str) -> None:
    """``state`` is a CPU random generator's state, as ``torch.get_rng_state()`` gives one."""
    own = torch.get_rng_state()
    if state.dtype != own.dtype or state.shape != own.shape:
        raise LmlabError(f"{where}: must be a random generator state, a {own.dtype} tensor of shape "
                         f"{tuple(own.shape)} (got {state.dtype}, shape {tuple(state.shape)})", fix)


def check_train_tensors(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
                        optimizer: torch.optim.Optimizer, objective: torch.nn.Module) -> None:
    """``train_state.safetensors`` (and the JSON's optimizer groups) fit the optimizer and
    objective this run built, before anything is loaded into them."""
    path = Path(path)
    where = str(path / STATE_TENSORS)
    groups = meta["optimizer"]["param_groups"]
    check_param_groups(groups, optimizer, str(path / STATE_JSON), STATE_FIX)
    moments: dict[int, dict[str, torch.Tensor]] = {}
    for idx, names in _moment_names(list(tensors), path / STATE_TENSORS).items():
        moments[idx] = {name: tensors[f"state.{idx}.{name}"] for name in names}
    check_moments(moments, groups, optimizer, where, STATE_FIX)
    if "rng.torch" in tensors:
        check_rng_state(tensors["rng.torch"], f"{where}: rng.torch", STATE_FIX)
    saved = {k[len("objective."):]: tuple(t.shape) for k, t in tensors.items() if k.startswith("objective.")}
    expected = {k: tuple(v.shape) for k, v in objective.state_dict().items()}
    if saved and saved != expected:
        raise LmlabError(f"{where}: objective.*: must be this run's objective state "
                         f"{sorted(expected)[:3]} (got {sorted(saved)[:3]})", STATE_FIX)


def rng_tensors() -> dict[str, torch.Tensor]:
    out = {"rng.torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        for i, s in enumerate(torch.cuda.get_rng_state_all()):
            out[f"rng.cuda.{i}"] = s
    return out


def restore_rng(tensors: dict[str, torch.Tensor]) -> None:
    if "rng.torch" in tensors:
        torch.set_rng_state(tensors["rng.torch"])
    cuda = sorted((k for k in tensors if k.startswith("rng.cuda.")), key=lambda k: int(k.rsplit(".", 1)[1]))
    if cuda and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all([tensors[k] for k in cuda])

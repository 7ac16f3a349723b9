"""Training checkpoints: atomic, self-describing, safetensors + JSON (never pickle).

``RUN_DIR/checkpoints/step_N/`` holds

* the model as an lmlab model checkpoint (``config.json``, ``model.safetensors``, ``tokenizer/``),
  so ``lmlab.loading.load_model("RUN_DIR/checkpoints/step_N")`` loads it for generation or
  fine-tuning;
* ``train_state.safetensors``: optimizer moments (``state.{i}.exp_avg`` ...), the objective's own
  parameters (``objective.*``), RNG states (``rng.torch``, ``rng.cuda.{i}``);
* ``train_state.json``: step, tokens seen, the data position (windows consumed), the optimizer's
  hyper-parameters, the run config and the step-0 evaluation;
* under FSDP, ``sharded/``: each rank's shards of the weights and the optimizer state
  (``torch.distributed.checkpoint``), which ``--resume`` reads back into the sharded model; the
  optimizer moments are then not in ``train_state.safetensors``.

The directory is built under a temporary name and renamed into place when complete
(:func:`lmlab.fileio.atomic_dir`): a crash or a full disk while writing leaves the previous
checkpoints untouched, and a directory named ``step_N`` is always complete. Older checkpoints
beyond ``keep`` are deleted only after the new one is in place.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, read_json, write_json

CHECKPOINTS = "checkpoints"
STATE_TENSORS = "train_state.safetensors"
STATE_JSON = "train_state.json"
SHARDED = "sharded"
FORMAT = "lmlab-train-state"
VERSION = 1
_STEP_RE = re.compile(r"step_(\d+)")


def checkpoint_path(run_dir: str | Path, step: int) -> Path:
    return Path(run_dir) / CHECKPOINTS / f"step_{step}"


def list_checkpoints(run_dir: str | Path) -> list[tuple[int, Path]]:
    """Complete checkpoints of a run, oldest first (temporary and partial directories are skipped)."""
    root = Path(run_dir) / CHECKPOINTS
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _STEP_RE.fullmatch(p.name)
        if m and p.is_dir() and (p / STATE_JSON).is_file() and (p / STATE_TENSORS).is_file():
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = list_checkpoints(run_dir)
    return found[-1][1] if found else None


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
    dest = checkpoint_path(run_dir, step)
    previous = latest_checkpoint(run_dir)
    try:
        with atomic_dir(dest, marker="model.safetensors", what="checkpoint") as tmp:
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
        kept = f"the previous checkpoint {previous} is intact" if previous else "no earlier checkpoint exists"
        raise LmlabError(
            f"could not write checkpoint {dest} ({what}); {kept}",
            "free disk space and continue with --resume",
        ) from None
    if keep > 0:
        for _, old in list_checkpoints(run_dir)[:-keep]:
            # renamed first (one atomic step), deleted after: a kill mid-way never leaves a step_N
            # that looks complete but is not, and the next start removes the hidden leftover
            doomed = old.with_name(f".{old.name}.prune-{os.getpid()}")
            os.replace(old, doomed)
            shutil.rmtree(doomed, ignore_errors=True)
    return dest


def load_train_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict]:
    """``(train-state tensors, train-state JSON, model weights)`` of a checkpoint directory."""
    from lmlab.models.checkpoint import WEIGHTS_NAME, read_safetensors

    path = Path(path)
    meta = read_json(path / STATE_JSON, "train state")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != VERSION:
        raise LmlabError(
            f"{path / STATE_JSON} is not an lmlab train state (version {VERSION})",
            "resume from a checkpoint written by this lmlab version",
        )
    _check_state(path, meta)
    return read_safetensors(path / STATE_TENSORS), meta, read_safetensors(path / WEIGHTS_NAME)


def _check_state(path: Path, meta: dict[str, Any]) -> None:
    """The fields resuming relies on have the types and ranges lmlab writes (a hand-edited or
    crafted train_state.json is a one-line error, not a traceback mid-run)."""
    def count(v) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= 0

    problems = [k for k in ("step", "tokens", "data_position") if not count(meta.get(k))]
    if not isinstance(meta.get("optimizer"), dict):
        problems.append("optimizer")
    if not isinstance(meta.get("elapsed_s", 0.0), (int, float)):
        problems.append("elapsed_s")
    m = _STEP_RE.fullmatch(path.name)
    if not problems and m and int(m.group(1)) != meta["step"]:
        problems.append(f"step ({meta['step']}, in directory {path.name})")
    if problems:
        raise LmlabError(f"{path / STATE_JSON} is damaged: bad {', '.join(problems)}",
                         "resume from an earlier checkpoint (delete this one) or start a new run")


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

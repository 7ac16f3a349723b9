"""Where a run keeps its checkpoints, and which of them can be read: the one reading of a pretraining
run directory (``RUN/checkpoints/step_N/``) that every command and the Python API share, from
``--checkpoint RUN`` to ``load_tokenizer(RUN)``.

It sits below the packages (it imports only lmlab's errors and file helpers, and safetensors when
a checkpoint is checked), so that the tokenizers and the models may read a run as the training
loops do; :mod:`lmlab.train.checkpoint` writes the checkpoints and re-exports these names.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable
from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.fileio import read_json

CHECKPOINTS = "checkpoints"
STATE_TENSORS = "train_state.safetensors"
STATE_JSON = "train_state.json"
#: a model checkpoint's weights file (:mod:`lmlab.models.checkpoint` writes it)
WEIGHTS_NAME = "model.safetensors"
STATE_FIX = "resume from an earlier checkpoint (move this one aside) or start a new run"
_STEP_RE = re.compile(r"step_(\d+)")


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


def checkpoint_damage(path: str | Path) -> str | None:
    """Why the checkpoint folder ``path`` cannot be read back whole (None: it can).

    A ``step_N`` folder appears only complete (:func:`save_train_checkpoint` renames it into
    place), so damage comes from outside lmlab: a copy cut short, a file deleted, a disk error.
    The check reads headers only: every JSON file parses, every safetensors file's header covers
    the whole file, and the weights and train state a resume or a load needs are there. What the
    files say is checked where they are read (:func:`read_train_state`, the model loader)."""
    path = Path(path)
    try:
        read_json(path / STATE_JSON, "train state")
    except LmlabError as e:
        return e.problem
    for name in (STATE_TENSORS, WEIGHTS_NAME):
        if not (path / name).is_file():
            return f"{path / name} is missing"
    for file in sorted(path.iterdir()):
        try:
            if file.suffix == ".safetensors":
                _tensor_names(file)
            elif file.suffix == ".json" and file.name != STATE_JSON:
                read_json(file, "checkpoint file")
        except LmlabError as e:
            return e.problem
    return None


_reported: set[Path] = set()  # damaged checkpoints already named in this process


def _stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def latest_checkpoint(run_dir: str | Path, say: Callable[[str], None] | None = None) -> Path | None:
    """The newest checkpoint of a run that can be read back whole (None: the run has none yet).

    A damaged newer checkpoint (:func:`checkpoint_damage`) is skipped, and named once through
    ``say`` (default: stderr); a run whose every checkpoint is damaged is a one-line error, so that
    a resume never starts over silently."""
    found = list_checkpoints(run_dir)
    damaged = []
    for _, path in reversed(found):
        problem = checkpoint_damage(path)
        if problem is None:
            if damaged:
                _name_damaged(damaged, f"using {path.name}", say)
            return path
        damaged.append((path, problem))
    if damaged:
        newest, problem = damaged[0]
        raise LmlabError(f"no checkpoint of {Path(run_dir)} can be read back: {problem}",
                         f"restore the run's checkpoints, or move {newest.parent} aside to start over")
    return None


def run_checkpoint(value: str | os.PathLike) -> Path:
    """The checkpoint a path names: a pretraining run directory (a ``checkpoints/`` folder and no
    ``config.json`` of its own, what ``lmlab pretrain --out RUN`` leaves) means its newest complete
    checkpoint (:func:`latest_checkpoint`); any other path is itself. The one reading of a run
    directory, for the command line's ``--checkpoint``/``--teacher``/``--base`` and the Python API's
    checkpoint arguments (``finetune``, ``run_harness``) alike."""
    p = Path(value)
    if (p / "config.json").is_file() or not (p / "checkpoints").is_dir():
        return p
    newest = latest_checkpoint(p)
    if newest is None:
        raise LmlabError(f"run directory {p} has no complete checkpoint yet",
                         "wait for the run's first checkpoint (train.checkpoint_every) or resume it")
    return newest


def _say_once(path: Path, msg: str, say) -> None:
    """Say ``msg`` about the checkpoint ``path`` unless this process already said something of it."""
    key = path.resolve()
    if key not in _reported:
        _reported.add(key)
        (say or _stderr)(msg)


def _name_damaged(damaged: list[tuple[Path, str]], instead: str, say) -> None:
    for path, problem in damaged:
        _say_once(path, f"warning: skipping the damaged checkpoint {path.name} ({problem}); {instead}", say)


def _tensor_names(path: Path) -> list[str]:
    """The tensor names of a safetensors file, from its header alone."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            return list(f.keys())
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        first = str(e).splitlines()[0] if str(e) else e.__class__.__name__
        raise LmlabError(f"{path}: is corrupt or truncated ({first})", STATE_FIX) from None

"""The one resume format, for every loop: ``ROOT/checkpoints/step_N/``.

Each checkpoint folder holds

* the weights: ``model.safetensors`` (pretraining: a whole lmlab model checkpoint that
  ``load_model`` opens; fine-tuning: the state dict of the model being tuned, adapters included);
* ``train_state.safetensors``: the optimizer's moments (``state.{i}.{name}``), the random streams
  (``rng.torch``, ``rng.cuda.{i}``, ``rng.{name}`` of the loop's own generators) and the loop's
  other tensors (``objective.*``, fine-tuning's best-so-far weights ``best.*``);
* ``train_state.json``: the :class:`~lmlab.train.components.resume_state.ResumeState`, the
  optimizer's groups, the run's config and machine, and the loop's own JSON state under its name
  (``finetune``, ``align``), checked whole against :class:`lmlab.file_schemas.TrainStateFile` when read back.

Written atomically (:func:`lmlab.train.checkpoint.save_train_checkpoint`), pruned to the newest
``keep``, never pickled. Pretraining's run folder and the ``.OUT.resume/`` of fine-tuning and DPO
use it alike.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from lmlab.train.checkpoint import latest_checkpoint, load_train_checkpoint, save_train_checkpoint
from lmlab.train.optim import load_optimizer_tensors, optimizer_tensors


class StateDictWeights:
    """Weights to checkpoint as a bare state dict (``model.safetensors``): a model being fine-tuned,
    whose adapters or task head make it no plain lmlab checkpoint. Tied tensors are stored once each
    (copied), as safetensors asks."""

    def __init__(self, state: dict[str, torch.Tensor]):
        self.state = state

    def save(self, directory: Path) -> None:
        from lmlab.models.checkpoint import WEIGHTS_NAME

        tensors = {k: v.detach().to("cpu", copy=True).contiguous() for k, v in self.state.items()}
        save_file(tensors, str(Path(directory) / WEIGHTS_NAME))


class Checkpointer:
    """Saves and reads back the checkpoints of one run under ``root`` (the folder that holds
    ``checkpoints/``). Due every ``every`` steps (None: whenever the run evaluated) and at the last
    step with ``at_end``; ``keep`` the newest checkpoints kept (0: all)."""

    def __init__(self, root: Path, *, keep: int = 0, every: int | None = None, at_end: bool = True):
        self.root, self.keep, self.every, self.at_end = Path(root), keep, every, at_end
        self.last: Path | None = latest_checkpoint(self.root)

    def due(self, step: int, evaluated: bool, final: bool) -> bool:
        if final:
            return self.at_end
        return evaluated if self.every is None else step % self.every == 0

    def latest(self) -> Path | None:
        return latest_checkpoint(self.root)

    def save(self, step: int, weights, tensors: dict[str, torch.Tensor], meta: dict[str, Any],
             sharded: Path | None = None) -> Path:
        """Write ``checkpoints/step_{step}``: ``weights`` (anything with ``save(directory)``), the
        state ``tensors`` and the JSON ``meta``; prune the older ones."""
        self.last = save_train_checkpoint(self.root, step, weights, tensors, meta, self.keep, sharded=sharded)
        return self.last

    @staticmethod
    def read(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any], dict[str, torch.Tensor]]:
        """``(state tensors, checked train_state.json, weights)`` of the checkpoint ``path``."""
        return load_train_checkpoint(path)


def optimizer_state(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The optimizer's moments as ``state.{i}.{name}`` tensors and its groups as JSON."""
    return optimizer_tensors(optimizer)


def restore_optimizer(optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor],
                      groups: dict[str, Any]) -> None:
    """Inverse of :func:`optimizer_state` (``tensors`` may hold other names too)."""
    load_optimizer_tensors(optimizer, {k: v for k, v in tensors.items() if k.startswith("state.")}, groups)

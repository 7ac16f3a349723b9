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

The folder, the start checks, the identity and the refusals are shared with preference tuning
(:mod:`lmlab.train.components.output_resume`); this module adds what fine-tuning saves.

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

import math
from pathlib import Path
from typing import Any

from lmlab.train.components.checkpointer import Checkpointer
from lmlab.train.components.output_resume import (  # noqa: F401  (fine-tuning's names of the shared parts)
    LOGS,
    ResumeFolder,
    check_fits,
    check_order,
    holds_state,
    output_fix,
    resume_dir,
    saved_state,
)
from lmlab.train.components.resume_state import ResumeState, random_streams

#: fine-tuning's resume folder: its loop state under ``finetune`` in ``train_state.json``
FOLDER = ResumeFolder("finetune", "fine-tuning")
claim, claimed, checkpointer, discard = FOLDER.claim, FOLDER.claimed, FOLDER.checkpointer, FOLDER.discard
check_start = FOLDER.check_start


def save(saver: Checkpointer, run, identity: dict[str, Any], history: list | None = None) -> Path:
    """Checkpoint the fine-tuning ``run`` (:class:`lmlab.finetune.run.FinetuneRun`) at its step
    (``history``: the metrics rows so far, when not all of the run's log)."""
    best = run.best
    score = None if best["score"] == -math.inf else best["score"]
    tensors = {**random_streams({"shuffle": run.gen}),
               **{f"best.{k}": v.detach().cpu() for k, v in (best["snap"] or {}).items()}}
    loop = {"identity": identity, "order": run.order, "run_loss": run.run_loss, "n_loss": run.n_loss,
            "best": {"score": score, "metrics": best["metrics"], "step": best["step"]},
            "history": run.log.history if history is None else history}
    return FOLDER.save(saver, ResumeState(run.step, run.seen, 0, run.elapsed()), model=run.model,
                       optimizer=run.optimizer, epoch=run.seen / len(run.feats), config=run.cfg.to_dict(),
                       machine=run.machine, tensors=tensors, loop=loop)


def load(path: Path, model, optimizer, examples: int):
    """``(tensors, meta, weights)`` of the checkpoint ``path`` (whose identity
    :meth:`ResumeFolder.identity` accepted), after checking that it fits the run's ``model``, ``optimizer``
    and ``examples``."""
    tensors, meta, weights = FOLDER.read(path)
    _check_fits(path, tensors, meta, weights, model, optimizer, examples)
    return tensors, meta, weights


def _check_fits(path: Path, tensors, meta: dict[str, Any], weights, model, optimizer, examples: int) -> None:
    """The saved weights, optimizer state, generators and batch order fit the model, optimizer
    and training examples this run built (else loading them fails inside torch, mid-run)."""
    check_fits(path, tensors, meta, weights, model, optimizer, ("shuffle",))
    check_order(path, meta["finetune"]["order"], examples, "finetune.order", "training examples")

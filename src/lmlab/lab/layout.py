"""Where a grid's runs live under ``--out``, and whether each is done (what ``lmlab compare``
resumes from):

    OUT/pretrain/<run dirname>/   summary.json (steps done), checkpoints/, or model/ for an
                                  arm without pretraining
    OUT/finetune/<run dirname>/   eval.json once the fine-tuning run has finished
"""

from __future__ import annotations

from pathlib import Path

from lmlab.errors import LmlabError
from lmlab.fileio import read_json
from lmlab.lab.grid import FinetuneRun, PretrainRun

__all__ = ["checkpoint_of", "finetune_dir", "finetune_done", "pretrain_dir", "pretrain_done"]


def pretrain_dir(out: Path, run: PretrainRun) -> Path:
    return out / "pretrain" / run.dirname


def finetune_dir(out: Path, run: FinetuneRun) -> Path:
    return out / "finetune" / run.dirname


def pretrain_done(out: Path, run: PretrainRun) -> bool:
    path = pretrain_dir(out, run) / "summary.json"
    if not path.is_file():
        return False
    try:
        return int(read_json(path).get("steps", -1)) >= run.steps
    except (LmlabError, TypeError, ValueError):
        return False


def finetune_done(out: Path, run: FinetuneRun) -> bool:
    return (finetune_dir(out, run) / "eval.json").is_file()


def checkpoint_of(out: Path, run: PretrainRun) -> Path:
    """The model a fine-tuning run starts from: the run's final checkpoint (or the random init)."""
    d = pretrain_dir(out, run)
    if not run.arm.pretrained:
        return d / "model"
    summary = read_json(d / "summary.json", "run summary")
    if summary.get("checkpoint"):
        return Path(summary["checkpoint"])
    from lmlab.train.checkpoint import checkpoint_path

    return checkpoint_path(d, run.steps)

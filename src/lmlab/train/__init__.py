"""Pretraining: the training loop behind ``lmlab pretrain``.

>>> from lmlab.train import pretrain
>>> summary = pretrain("configs/gpt-tiny-clm.toml", "runs/gpt",
...                    overrides=["train.max_steps=100"])  # doctest: +SKIP

One job per module (torchtitan-style): ``config`` (recipe TOML <-> dataclasses, ``--set``
overrides), ``data`` (text -> tokenizer -> shards for a run), ``device`` (device, threads,
precision), ``optim`` (AdamW groups, LR schedule), ``loop`` (the step, evaluation, the run),
``checkpoint`` (atomic save/resume), ``metrics`` (metrics.jsonl, loss.png, progress bar) and
``distributed`` (torchrun, DDP/FSDP). Packing lives in :mod:`lmlab.data.packing`.
"""

from lmlab.train.config import DataConfig, ModelConfig, ObjectiveConfig, RunConfig, TrainConfig, load_config
from lmlab.train.loop import pretrain

__all__ = [
    "DataConfig",
    "ModelConfig",
    "ObjectiveConfig",
    "RunConfig",
    "TrainConfig",
    "load_config",
    "pretrain",
]

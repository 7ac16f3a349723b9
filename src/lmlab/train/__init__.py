"""Pretraining: the training loop behind ``lmlab pretrain``.

>>> from lmlab.train import pretrain
>>> summary = pretrain("configs/gpt-tiny-clm.toml", "runs/gpt",
...                    overrides=["train.max_steps=100"])  # doctest: +SKIP

One job per module (torchtitan-style): ``config`` (recipe TOML <-> dataclasses, ``--set``
overrides), ``data`` (text -> tokenizer -> shards for a run), ``device`` (device, threads,
precision, the GPUs' peak for MFU), ``optim`` (AdamW and the one LR schedule, also used by
fine-tuning and distillation), ``progress`` (bar or progress lines, for every loop), ``loop``
(the step, evaluation, the run), ``checkpoint`` (atomic save/resume, FSDP shards), ``metrics``
(metrics.jsonl, loss.png) and ``distributed`` (torchrun, DDP/FSDP). Packing lives in
:mod:`lmlab.data.packing`, masks in :mod:`lmlab.models.attention_masks`. docs/engine.md walks
through one step.
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

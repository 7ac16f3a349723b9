"""One fine-tuning run as the fit loop's job (:class:`lmlab.train.components.FitLoop`).

:class:`FinetuneRun` holds what the run builds (the model with its task head and method, the
encoded training set, the optimizer, the shuffling generator, the best dev score so far) and gives
the loop its parts: the micro-batch of each step, the bookkeeping after it (running loss, examples
seen, the training row), the dev evaluation that keeps the best weights, and the stop check.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from lmlab.config.fits import batch_for_data
from lmlab.config.rules import KEYWORDS, SettingNames
from lmlab.finetune.config import FinetuneConfig
from lmlab.finetune.selection import ROW_PREFIX, carve_selection
from lmlab.runtime import Machine
from lmlab.tasks import Task, collate
from lmlab.tasks.base import pad_id_of
from lmlab.tasks.readers import Example
from lmlab.train import distributed as dist
from lmlab.train.components import Evaluator, FitLoop, RunLogger
from lmlab.train.components.checkpointer import restore_optimizer
from lmlab.train.components.resume_state import restore_random_streams
from lmlab.train.engine import Engine
from lmlab.train.optim import warmup_decay_lr

GROUP_BATCHES = 4


def epoch_batches(lengths, batch_size: int, gen: torch.Generator,
                  group_by_length: bool = True) -> list[list[int]]:
    """One epoch of batches (lists of feature indices) in a random order.

    With ``group_by_length`` the shuffled features are cut into pools of ``GROUP_BATCHES``
    batches, each pool sorted by length before being cut into batches, and the batches are
    shuffled again: batches still mix random examples, but each holds similar lengths, so
    padding to the longest member wastes less (SST-2, 500 sentences, batch 32: 10,340 padded
    tokens instead of 19,776). Small pools keep batches varied (with pools of 16 batches, a small
    run's batches were sorted almost perfectly by length, and results varied more).
    """
    order = torch.randperm(len(lengths), generator=gen).tolist()
    if group_by_length:
        pool = batch_size * GROUP_BATCHES
        order = [i for k in range(0, len(order), pool)
                 for i in sorted(order[k:k + pool], key=lambda j: -lengths[j])]
    out = [order[k:k + batch_size] for k in range(0, len(order), batch_size)]
    if group_by_length:
        out = [out[i] for i in torch.randperm(len(out), generator=gen).tolist()]
    return out


def share_of_batch(idx: list[int], info) -> tuple[list[int], float]:
    """This process's examples of the global batch ``idx`` and the weight of its mean loss.

    With N processes, process r takes ``idx[r::N]``; its per-example mean loss is weighted by
    ``len(share) * N / len(idx)``, so that the gradients averaged over processes equal the
    gradient of the mean over the whole batch, as on one process, also when the batch does not
    divide evenly. A process left without an example (a last batch smaller than N) runs the first
    one with weight 0: it must still join the gradient all-reduce.
    """
    if not info.enabled:
        return idx, 1.0
    mine = idx[info.rank::info.world_size]
    if not mine:
        return idx[:1], 0.0
    return mine, len(mine) * info.world_size / len(idx)


def selection_data(train_ex: list[Example], dev_ex: list[Example],
                   cfg: FinetuneConfig) -> tuple[list[Example], list[Example]]:
    """``(what is trained on, what chooses the step)``: all of train and the dev file, or train less a
    validation slice and that slice (:mod:`lmlab.finetune.selection`)."""
    if cfg.select_on == "dev":
        return train_ex, dev_ex
    return carve_selection(train_ex, cfg.select_fraction, cfg.seed)


@dataclass
class RunData:
    """The examples of a run: trained on, choosing the step, scoring (the dev file)."""

    train: list[Example]
    choose: list[Example]
    dev: list[Example]


class FinetuneRun:
    """The parts of one fine-tuning run that the fit loop drives."""

    def __init__(self, cfg: FinetuneConfig, task: Task, model: nn.Module, meth, data: RunData,
                 machine: Machine, info, say: Callable[[str], None] | None = None,
                 names: SettingNames = KEYWORDS):
        self.cfg, self.task, self.model, self.meth, self.data = cfg, task, model, meth, data
        self.machine, self.info, self.names = machine, info, names  # names: settings as the user wrote them
        self.feats = task.features(data.train, model.tokenizer)
        # a batch beyond the training data is one batch of all of it: the plan, the steps and the
        # logs count that batch
        cfg.batch_size = batch_for_data(cfg.batch_size, len(self.feats), "examples", names.of("batch_size"),
                                        say)
        self.pad = pad_id_of(model.tokenizer, model)
        self.optimizer = self._optimizer()
        self.steps_per_epoch = math.ceil(len(self.feats) / cfg.batch_size)
        self.total = cfg.max_steps if cfg.max_steps is not None else cfg.epochs * self.steps_per_epoch
        self.select = cfg.select_metric or task.main_metric
        self.prefix = ROW_PREFIX[cfg.select_on]
        self.best: dict[str, Any] = {"score": -math.inf, "metrics": None, "step": 0, "snap": None}
        self.step, self.seen, self.run_loss, self.n_loss = 0, 0, 0.0, 0
        self.order: list[list[int]] = []  # this epoch's batches, last first (pop() is O(1))
        self.gen = torch.Generator().manual_seed(cfg.seed)  # the shuffling of every epoch
        self.t0 = time.perf_counter()
        self.choose_baseline = None
        self.log: RunLogger | None = None

    def _optimizer(self) -> torch.optim.AdamW:
        """AdamW over the trainable parameters (:func:`lmlab.train.optim.adamw`: no decay on biases,
        norms, embeddings; the fused kernel where it exists)."""
        from lmlab.train.optim import adamw

        return adamw([self.model], lr=self.cfg.lr, betas=self.cfg.betas, weight_decay=self.cfg.weight_decay)

    def parameters(self) -> tuple[int, int]:
        """``(trainable, total)`` parameters."""
        return (sum(p.numel() for p in self.model.parameters() if p.requires_grad),
                sum(p.numel() for p in self.model.parameters()))

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    # ------------------------------------------------------------------ the loop's parts
    def fit_loop(self, stop, on_stop, checkpointer, save) -> FitLoop:
        cfg, info = self.cfg, self.info
        warmup = cfg.warmup_steps if cfg.warmup_steps is not None else round(cfg.warmup_ratio * self.total)
        schedule = lambda s: warmup_decay_lr(s, lr=cfg.lr, warmup=warmup, end=self.total)  # noqa: E731
        engine = Engine(self.optimizer, schedule, clip=cfg.grad_clip, autocast=self.machine.autocast,
                        reduce=(lambda ps: dist.average_gradients(ps, info)) if info.enabled else None,
                        fix="lower the learning rate (--lr)")
        self.lengths = [len(f["input_ids"]) for f in self.feats]
        self.step_loss = getattr(self.meth, "loss", None) or (lambda t, m, b: t.loss(m, b))
        evaluator = Evaluator(self.evaluate, cfg.eval_every or 0, also=lambda step: not self.order)
        return FitLoop(engine, self.total, micro_batches=self.micro_batches, after_step=self.after_step,
                       report=lambda *_: None, evaluator=evaluator, checkpointer=checkpointer, save=save,
                       stop=stop, on_stop=on_stop)

    def micro_batches(self, step: int) -> list:
        if not self.order:
            self.order = epoch_batches(self.lengths, self.cfg.batch_size, self.gen,
                                       self.cfg.group_by_length)[::-1]
        idx = self.order.pop()
        self.batch_examples = len(idx)
        mine, weight = share_of_batch(idx, self.info)
        batch = collate([self.feats[i] for i in mine], self.pad, self.machine.device)
        return [lambda b=batch, w=weight: self.step_loss(self.task, self.model, b) * w]

    def after_step(self, step: int, done, seconds: float) -> dict[str, Any]:
        """Count the step; every ``log_every`` steps (and at the last) a training row of the mean loss."""
        self.step = step
        self.seen += self.batch_examples
        self.run_loss, self.n_loss = self.run_loss + done.loss, self.n_loss + 1
        self.log.update(step, [f"loss {done.loss:.4f}"], loss=f"{done.loss:.4f}")
        row: dict[str, Any] = {}
        if step % self.cfg.log_every == 0 or step == self.total:
            elapsed = self.elapsed()
            row = {"step": step, "epoch": round(self.seen / len(self.feats), 3),
                   "loss": self.run_loss / self.n_loss, "lr": done.lr, "grad_norm": float(done.grad_norm),
                   "examples_per_s": self.seen / elapsed, "elapsed_s": elapsed}
            self.log.record(row)
            self.run_loss, self.n_loss = 0.0, 0
        return row

    def evaluate(self, step: int) -> dict[str, float]:
        """Score the selection data; keep the weights when they are the best so far."""
        task, select, prefix = self.task, self.select, self.prefix
        epoch = self.seen / len(self.feats)
        with self.machine.autocast():
            metrics = task.evaluate(self.model, self.data.choose, self.cfg.eval_batch_size)
        # a task that cannot tell its metrics before scoring: checked now, named as written
        self.cfg.check_select_metric(list(metrics), task.name, self.names)
        self.log.record({"step": step, "epoch": round(epoch, 3),
                         **{f"{prefix}_{k}": v for k, v in metrics.items()}})
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items())
        if self.choose_baseline and select in self.choose_baseline[1]:
            shown += f" (baseline {select} {self.choose_baseline[1][select]:.4f})"
        self.log.write(f"step {step} epoch {epoch:.2f}: {'' if prefix == 'dev' else prefix + ' '}{shown}")
        if metrics[select] > self.best["score"]:
            self.best.update(score=metrics[select], metrics=metrics, step=step,
                             snap=self.meth.snapshot(self.model))
        self.model.train()
        self.log.paused()
        return metrics

    def stop_requested(self, stop) -> str | None:
        """A stop asked for on this process (or, under torchrun, on any: all stop after the same step)."""
        requested = stop.requested
        if self.info.enabled and dist.any_across(requested is not None, self.info, self.machine.device):
            requested = requested or "a signal to another process"
        return requested

    # ------------------------------------------------------------------ resume
    def restore(self, tensors: dict[str, torch.Tensor], meta: dict[str, Any], weights: dict[str, torch.Tensor]
                ) -> None:
        """Continue where the saved state (:func:`lmlab.finetune.resume.load`) left the run."""
        self.model.load_state_dict(weights)
        restore_optimizer(self.optimizer, tensors, meta["optimizer"])
        restore_random_streams(tensors, {"shuffle": self.gen})
        loop = meta["finetune"]
        self.step, self.seen, self.order = meta["step"], meta["data_position"], loop["order"]
        self.run_loss, self.n_loss = loop["run_loss"], loop["n_loss"]
        self.t0 -= meta.get("elapsed_s", 0.0)
        best = loop["best"]
        snap = {k[len("best."):]: v for k, v in tensors.items() if k.startswith("best.")}
        self.best.update(score=-math.inf if best["score"] is None else best["score"], metrics=best["metrics"],
                         step=best["step"], snap=snap or None)

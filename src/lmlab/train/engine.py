"""The optimizer step that every lmlab training loop takes: pretraining, fine-tuning (every
PEFT method) and distillation.

>>> engine = Engine(optimizer, schedule=lambda step: 1e-3, clip=1.0)        # doctest: +SKIP
>>> result = engine.step(step, [lambda: model(**batch).loss, ...])          # doctest: +SKIP

One call = one update:

1. set the learning rate of ``step`` from ``schedule``;
2. for each micro-batch (a function returning its loss, or ``(loss, metrics)``): forward under
   ``autocast``, backward of ``loss / n`` (loss-scaled for float16), with the data-parallel
   gradient all-reduce only on the last one (``no_sync`` of the DDP wrapper);
3. refuse a non-finite loss before it reaches the weights (a one-line error naming the step);
4. clip the global gradient norm, step (unscaled for float16), clear the gradients.

The loops differ in what they read and how they evaluate, never in how they update: each of
them calls :meth:`Engine.step`. One host synchronisation per step (the loss and gradient norm
for the log), none per micro-batch beyond what an objective's own metrics ask for.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from lmlab.errors import LmlabError
from lmlab.train.distributed import no_sync
from lmlab.train.optim import set_lr

MicroBatch = Callable[[], "Tensor | tuple[Tensor, dict]"]


@dataclass
class StepResult:
    lr: float
    loss: float                      # mean over the micro-batches (this process)
    grad_norm: float                 # before clipping
    metrics: dict[str, float] = field(default_factory=dict)  # the micro-batches' numbers, averaged


class Engine:
    """``optimizer`` and its ``schedule`` (step -> learning rate); ``clip`` the max global gradient
    norm (0 = none); ``autocast`` a context-manager factory for the forward passes (None = fp32);
    ``scaler`` a GradScaler for float16; ``wrapped`` the DDP module whose all-reduce is deferred
    to the last micro-batch; ``reduce`` a function that averages the gradients over processes
    after the last backward (data parallelism without a wrapper:
    :func:`lmlab.train.distributed.average_gradients`); ``fix`` the advice when the loss stops
    being finite."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: Callable[[int], float], *,
                 clip: float = 1.0, autocast: Callable[[], contextlib.AbstractContextManager] | None = None,
                 scaler: torch.amp.GradScaler | None = None, wrapped: nn.Module | None = None,
                 reduce: Callable[[list[Tensor]], None] | None = None, fix: str = "lower the learning rate"):
        self.optimizer, self.schedule, self.clip = optimizer, schedule, clip
        self.autocast = autocast or contextlib.nullcontext
        self.scaler, self.wrapped, self.reduce, self.fix = scaler, wrapped, reduce, fix

    def params(self) -> list[Tensor]:
        return [p for g in self.optimizer.param_groups for p in g["params"]]

    def step(self, step: int, micro_batches: Sequence[MicroBatch]) -> StepResult:
        lr = self.schedule(step)
        set_lr(self.optimizer, lr)
        n = len(micro_batches)
        losses, sums = [], {}
        for i, run in enumerate(micro_batches):
            with no_sync(self.wrapped, last_micro_step=i == n - 1):
                with self.autocast():
                    out = run()
                loss, metrics = out if isinstance(out, tuple) else (out, {})
                scaled = loss / n
                (self.scaler.scale(scaled) if self.scaler else scaled).backward()
            losses.append(loss.detach())
            for k, v in metrics.items():
                if k != "targets" and isinstance(v, (int, float)):
                    sums[k] = sums.get(k, 0.0) + float(v) / n
        if self.reduce is not None:
            self.reduce(self.params())
        mean_t = torch.stack(losses).float().mean()
        finite = torch.isfinite(mean_t).float()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            # every process decides together: one rank's NaN has reached the others' gradients too
            torch.distributed.all_reduce(finite, op=torch.distributed.ReduceOp.MIN)
        mean = float(mean_t)
        if not bool(finite):
            self.optimizer.zero_grad(set_to_none=True)
            where = "" if math.isfinite(mean) else f" ({mean} here)"
            raise LmlabError(f"the training loss became non-finite at step {step + 1}{where}", self.fix)
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.params(), self.clip if self.clip > 0 else math.inf)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(lr, mean, float(norm), sums)

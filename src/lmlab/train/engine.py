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

The loss, the gradient norm and the objective's numbers (0-d tensors are welcome: they stay on
the device) are read from the device once per step, averaged over the processes in the same
single all-reduce that lets them agree on a non-finite loss.

The loops differ in what they read and how they evaluate, never in how they update: each of
them calls :meth:`Engine.step`. One host synchronisation per step (:func:`read_step_numbers`),
none per micro-batch beyond what an objective's own computation needs.
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
    loss: float                      # mean over the micro-batches (and over the processes)
    grad_norm: float                 # before clipping
    metrics: dict[str, float] = field(default_factory=dict)  # the micro-batches' numbers, averaged
    # (over micro-batches and processes)


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
                if k != "targets" and isinstance(v, (int, float, Tensor)):
                    v = v.detach().float() if isinstance(v, Tensor) else float(v)
                    sums[k] = sums.get(k, 0.0) + v / n
        if self.reduce is not None:
            self.reduce(self.params())
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = torch.nn.utils.clip_grad_norm_(self.params(), self.clip if self.clip > 0 else math.inf)
        names = sorted(sums)
        local, numbers = read_step_numbers(torch.stack(losses).float().mean(), norm, [sums[k] for k in names])
        nonfinite, mean, grad_norm, *values = numbers
        if nonfinite:
            self.optimizer.zero_grad(set_to_none=True)
            where = "" if math.isfinite(local) else f" ({local} here)"
            raise LmlabError(f"the training loss became non-finite at step {step + 1}{where}", self.fix)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(lr, mean, grad_norm, dict(zip(names, values)))


def read_step_numbers(loss: Tensor, norm: Tensor, metrics: list) -> tuple[float, list[float]]:
    """This process's loss, and ``[non-finite?, loss, gradient norm, *metrics]`` averaged over all
    processes, in one read from the device (and one all-reduce when there are several processes).

    The non-finite flag is a sum, so any process's NaN stops every one of them at the same step
    (it has reached the others' gradients too). The gradient norm, the same on every process
    after the gradient all-reduce, averages to itself.
    """
    if hasattr(norm, "full_tensor"):  # FSDP2: the norm is a DTensor
        norm = norm.full_tensor()
    device = loss.device
    parts = [(~torch.isfinite(loss)).float(), loss, norm.to(device).float()]
    parts += [m.to(device).float() if isinstance(m, Tensor) else torch.tensor(float(m), device=device)
              for m in metrics]
    vec = torch.stack([p.reshape(()) for p in parts])
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        world = torch.distributed.get_world_size()
        total = vec.clone()
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM)
        total[1:] /= world
        vec = torch.cat([vec[1:2], total])
    else:
        vec = torch.cat([vec[1:2], vec])
    local, *numbers = vec.tolist()  # the one wait for the device in a step
    return local, numbers

"""Running one training script on several processes with PyTorch's own distributed engine.

``torchrun --nproc_per_node=N -m lmlab.cli pretrain ...`` starts N copies of the same command
with ``RANK``/``WORLD_SIZE``/``LOCAL_RANK`` set; :func:`init` joins them into a process group
(NCCL on GPUs, gloo on CPUs). :func:`parallelize` is the one place where a module is wrapped:

* **DDP** (data parallel; Li et al. 2020): every process holds the whole model, computes
  gradients on its own slice of the global batch, and the gradients are averaged with an
  all-reduce during backward. The default.
* **FSDP** (fully sharded, PyTorch's ``fully_shard``/FSDP2; Zhao et al. 2023): parameters,
  gradients and optimizer state are sharded across processes and gathered layer by layer;
  ``train.distributed = "fsdp"``, or ``auto`` for models above ``FSDP_MIN_PARAMS`` parameters.

Model code never imports ``torch.distributed``: only this module does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
from torch import nn

FSDP_MIN_PARAMS = 1_000_000_000


@dataclass
class DistInfo:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    mode: str = "single"  # single | ddp | fsdp
    grouped: bool = False  # in a process group (torchrun started it), also when it has one process

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.grouped or self.world_size > 1


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def launched_by_torchrun() -> bool:
    """torchrun (``torch.distributed.run``) marks every process it starts with ``TORCHELASTIC_RUN_ID``."""
    return "TORCHELASTIC_RUN_ID" in os.environ


def init(device_type: str) -> DistInfo:
    """Join the process group when launched by torchrun (``WORLD_SIZE`` > 1, or any world size under
    torchrun itself: one process on the one GPU of a machine still runs DDP/FSDP, NCCL and sharded
    checkpoints for real); else a 1-process info without a group."""
    world = launched_world_size()
    if world <= 1 and not launched_by_torchrun():
        return DistInfo()
    import torch.distributed as dist

    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        dist.init_process_group(backend=backend)
    return DistInfo(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=int(os.environ.get("LOCAL_RANK", "0")),
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", str(world))),
        grouped=True,
    )


def shutdown(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def parallelize(module: nn.Module, info: DistInfo, mode: str, device: torch.device) -> nn.Module:
    """Wrap ``module`` for data-parallel training (no-op on one process); sets ``info.mode``."""
    if not info.enabled:
        info.mode = "single"
        return module
    n_params = sum(p.numel() for p in module.parameters())
    if mode == "auto":
        mode = "fsdp" if n_params >= FSDP_MIN_PARAMS else "ddp"
    info.mode = mode
    if mode == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for m in module.modules():  # shard block by block, then the rest (embeddings, heads)
            if type(m).__name__ == "TransformerBlock":
                fully_shard(m)
        fully_shard(module)
        return module
    from torch.nn.parallel import DistributedDataParallel as DDP

    ids = [device.index] if device.type == "cuda" else None
    return DDP(module, device_ids=ids)


def no_sync(module: nn.Module | None, last_micro_step: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of a gradient-accumulation step."""
    import contextlib

    if last_micro_step or module is None or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


def mean_across(values: list[float], info: DistInfo, device: torch.device) -> list[float]:
    """Average a few floats over all processes (for logging)."""
    if not info.enabled:
        return values
    import torch.distributed as dist

    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return (t / info.world_size).tolist()


def barrier(info: DistInfo) -> None:
    if info.enabled:
        import torch.distributed as dist

        dist.barrier()


def broadcast_flag(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """Rank 0's ``flag`` on every process (e.g. "rank 0 failed while preparing data")."""
    if not info.enabled:
        return flag
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def average_gradients(params: list[torch.Tensor], info: DistInfo) -> None:
    """Average the gradients of ``params`` over all processes, in one all-reduce of a flat buffer.

    Data parallelism without a wrapper: for loops whose loss reaches into the model (a task head,
    its helpers) rather than calling one ``forward``, which DDP needs to see. Every process must
    call it with the same parameters, and the same ones have gradients everywhere (the same code
    ran); one without a gradient keeps none, so the optimizer skips it as on one process.
    """
    if not info.enabled:
        return
    import torch.distributed as dist

    params = [p for p in params if p.grad is not None]
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    flat /= info.world_size
    offset = 0
    for p, g in zip(params, grads):
        n = g.numel()
        p.grad = flat[offset:offset + n].view_as(g).to(g.dtype)
        offset += n


def any_across(flag: bool, info: DistInfo, device: torch.device) -> bool:
    """True on every process when ``flag`` is true on any (e.g. "a stop was requested here")."""
    if not info.enabled:
        return flag
    import torch.distributed as dist

    t = torch.tensor([int(flag)], device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def full_state_dict(module: nn.Module, info: DistInfo) -> dict[str, torch.Tensor]:
    """The unsharded ``state_dict`` of ``module`` on CPU (gathered under FSDP; collective call)."""
    if info.mode == "fsdp":
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return {k: v.detach().cpu() for k, v in module.state_dict().items()}


def broadcast_int(value: int, info: DistInfo, device: torch.device) -> int:
    """Rank 0's ``value`` on every process."""
    if not info.enabled:
        return value
    import torch.distributed as dist

    t = torch.tensor([int(value)], dtype=torch.long, device=device)
    dist.broadcast(t, src=0)
    return int(t.item())


def save_sharded(module: nn.Module, optimizer: torch.optim.Optimizer, directory) -> None:
    """Every rank writes its shards of the weights and of the optimizer state into ``directory``
    (``torch.distributed.checkpoint``; collective call)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=str(directory))


def load_sharded(module: nn.Module, optimizer: torch.optim.Optimizer, directory) -> None:
    """Read what :func:`save_sharded` wrote back into the (already sharded) ``module`` and
    ``optimizer``; the world size may differ from the one that saved (collective call)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_state, optim_state = get_state_dict(module, optimizer)
    state = {"model": model_state, "optim": optim_state}
    dcp.load(state, checkpoint_id=str(directory))
    set_state_dict(module, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])

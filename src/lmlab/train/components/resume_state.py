"""Where a run stands: what a checkpoint saves besides weights and optimizer, and a resume restores.

A run's position is four numbers (:class:`ResumeState`) and its random streams: torch's global
generator (dropout), CUDA's, and any generator the run draws its data order from. Everything
else a loop needs to continue (fine-tuning's best-so-far weights, its batches left in the
epoch) travels beside them in the same checkpoint (:mod:`lmlab.train.components.checkpointer`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from lmlab.train.checkpoint import restore_rng, rng_tensors


@dataclass
class ResumeState:
    """``step`` optimizer steps taken; ``data_position`` the units of data consumed (windows for
    pretraining, examples for fine-tuning); ``tokens`` training tokens seen; ``elapsed_s`` the
    time spent before this process (a resumed run's clock continues)."""

    step: int = 0
    data_position: int = 0
    tokens: int = 0
    elapsed_s: float = 0.0

    def meta(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "data_position": self.data_position,
                "elapsed_s": self.elapsed_s}

    @classmethod
    def from_meta(cls, meta: dict[str, Any]) -> ResumeState:
        return cls(meta["step"], meta["data_position"], meta.get("tokens", 0), meta.get("elapsed_s", 0.0))


def random_streams(generators: dict[str, torch.Generator] | None = None) -> dict[str, torch.Tensor]:
    """The states of torch's generators (``rng.torch``, ``rng.cuda.N``) and of the run's own
    ``generators`` (``rng.NAME``), as tensors for ``train_state.safetensors``."""
    out = rng_tensors()
    for name, gen in (generators or {}).items():
        out[f"rng.{name}"] = gen.get_state()
    return out


def restore_random_streams(tensors: dict[str, torch.Tensor],
                           generators: dict[str, torch.Generator] | None = None) -> None:
    """Inverse of :func:`random_streams`."""
    restore_rng(tensors)
    for name, gen in (generators or {}).items():
        gen.set_state(tensors[f"rng.{name}"])

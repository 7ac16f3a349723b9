"""The prefetch thread on CUDA: the next step's micro-batches are read on the background thread
into pinned memory (so the copy to the GPU does not block), and the run's numbers are the same as
without prefetching."""

from __future__ import annotations

import threading

import pytest
import torch
from cuda_tier import QUIET, rows, run_config

from lmlab.train import pretrain
from lmlab.train.loop import Trainer

pytestmark = pytest.mark.cuda
KEYS = ("step", "loss", "grad_norm", "val_loss", "lr")


def _tensors(item):
    fields = item.items() if isinstance(item, dict) else vars(item).items()
    return [v for _, v in fields if isinstance(v, torch.Tensor)]


@pytest.mark.parametrize("objective", ["clm", "electra"])  # prepared on the device / on the host
def test_prefetched_batches_are_pinned_and_change_nothing(objective, corpus, tmp_path, monkeypatch):
    def cfg(prefetch):
        return run_config(objective, corpus, max_steps=4, grad_accum=2, prefetch=prefetch, precision="fp32")

    pretrain(cfg(False), tmp_path / "plain", log=QUIET)
    seen = []
    original = Trainer.host_inputs

    def host_inputs(self, batch, seed):
        item = original(self, batch, seed)
        seen.append((threading.current_thread().name, [t.is_pinned() for t in _tensors(item)]))
        return item

    monkeypatch.setattr(Trainer, "host_inputs", host_inputs)
    pretrain(cfg(True), tmp_path / "ahead", log=QUIET)
    plain, ahead = rows(tmp_path / "plain"), rows(tmp_path / "ahead")
    assert [{k: r.get(k) for k in KEYS} for r in ahead] == [{k: r.get(k) for k in KEYS} for r in plain]
    on_thread = [pinned for name, pinned in seen if name.startswith("lmlab-prefetch")]
    assert len(on_thread) == 3 * 2  # every micro-batch after the first step's, read a step ahead
    assert all(pinned and all(pinned) for _, pinned in seen)  # every host batch in pinned memory
    assert not any(t.name.startswith("lmlab-prefetch") for t in threading.enumerate())

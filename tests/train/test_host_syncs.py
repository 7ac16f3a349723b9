"""No host synchronisation in the hot path of a training step.

On a GPU, every read of a device value on the host (``.item()``, ``float(t)``, ``bool(t)``,
``.tolist()``, an op whose output shape depends on the data such as ``nonzero`` or boolean
indexing) makes the CPU wait for the queued kernels. These tests count such reads with a
dispatch mode on the CPU: what costs nothing here would stall a GPU step.
"""

from __future__ import annotations

import collections
import math
import threading

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from lmlab.arguments import eager_checks, trusted_inputs
from lmlab.models import build_model, get_preset
from lmlab.objectives import get_objective
from lmlab.train import pretrain
from lmlab.train.engine import Engine
from lmlab.train.optim import adamw
from tests.objectives.conftest import pack, paragraphs

#: ops that read a value on the host, or whose output shape depends on the data
READS = {"_local_scalar_dense", "nonzero", "masked_select", "bincount", "unique", "_unique2", "equal",
         "is_nonzero"}
#: indexing ops that read the device when an index is a boolean mask (it becomes ``nonzero``)
MASK_INDEXED = {"index", "index_put", "index_put_", "_index_put_impl_"}


class HostReads(TorchDispatchMode):
    """Counts host reads (by op name) while active, in the thread that entered it (dispatch modes
    are per thread; a prefetch thread's host work is not a read of the device). ``tolist``
    bypasses dispatch, so it is patched."""

    def __init__(self):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        boolean_index = name in MASK_INDEXED and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] if len(args) > 1 else ()))
        if name in READS or boolean_index:
            self.counts[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self._tolist = torch.Tensor.tolist
        counts, original, here = self.counts, self._tolist, threading.get_ident()

        def tolist(t):
            if threading.get_ident() == here:
                counts["tolist"] += 1
            return original(t)

        torch.Tensor.tolist = tolist
        return super().__enter__()

    def __exit__(self, *exc):
        torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


@pytest.fixture(scope="module")
def text(data_dir):
    from lmlab.tokenizers import train_tokenizer

    book = (data_dir / "pretrain/gutenberg/pg14263_katrine.txt").read_text(encoding="utf-8")
    paras = paragraphs(book[20_000:120_000])
    return train_tokenizer("bytelevel", paras[:200], vocab_size=600), paras


SYNC_FREE = [("clm", "gpt2-tiny"), ("clm", "llama-tiny"), ("prefix_lm", "gpt2-tiny"), ("t5", "t5-tiny"),
             ("bart", "bart-tiny")]


@pytest.mark.parametrize("objective,preset", SYNC_FREE)
def test_the_loss_and_its_signals_never_read_the_device(text, objective, preset):
    tok, paras = text
    obj = get_objective(objective)(tok)
    vocab = getattr(obj, "vocab_size", None) or tok.vocab_size + 128
    model = build_model(get_preset(preset, vocab_size=vocab, max_positions=128))
    inputs = obj.prepare(pack(tok, paras, rows=4, seq_len=64), torch.Generator().manual_seed(0))
    with HostReads() as reads, trusted_inputs():
        loss, metrics = obj.loss(model, inputs)
    assert not reads.counts, dict(reads.counts)
    assert all(isinstance(v, torch.Tensor) and v.dim() == 0 for v in metrics.values())
    # the same numbers as before, read once at the end
    with HostReads() as outside:
        obj.loss(model, inputs)
    assert outside.counts["_local_scalar_dense"] > 0  # the model's eager input checks, outside the block


def test_one_engine_step_reads_the_device_once(text):
    tok, paras = text
    obj = get_objective("clm")(tok)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size + 128, max_positions=128))
    inputs = obj.prepare(pack(tok, paras, rows=4, seq_len=64), torch.Generator().manual_seed(0))
    engine = Engine(adamw([model], lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1), lambda s: 1e-3)
    engine.step(0, [lambda: obj.loss(model, inputs)])  # the optimizer's state exists from here on
    with HostReads() as reads, trusted_inputs():
        done = engine.step(1, [lambda: obj.loss(model, inputs), lambda: obj.loss(model, inputs)])
    assert dict(reads.counts) == {"tolist": 1}
    assert {"next_acc", "next_acc_guess"} <= set(done.metrics)
    assert all(isinstance(v, float) for v in (done.loss, done.grad_norm, *done.metrics.values()))
    assert 0 < done.metrics["next_acc_guess"] < 1


def test_the_trainer_steps_without_the_models_host_checks(tiny_config, tmp_path, monkeypatch):
    from lmlab.objectives.clm import CausalLM

    seen = []
    original = CausalLM.loss

    def loss(self, model, inputs):
        seen.append((model.training, eager_checks()))
        return original(self, model, inputs)

    monkeypatch.setattr(CausalLM, "loss", loss)
    pretrain(tiny_config(max_steps=2, eval_every=2), tmp_path / "run", log=lambda m: None)
    training = [checks for is_training, checks in seen if is_training]
    assert training and not any(training)  # checked once up front, not at every step
    assert eager_checks()                  # and back on outside the steps


#: every objective whose step read the device before its preparation moved to the host's data path
#: (masking, span sampling, noising, sentence pairs) or whose loss selected positions by mask
#: (the MLM head, ELECTRA's generator, sampling and discriminator, SpanBERT's boundary head)
HOST_PREPARED = [("mlm", "bert-tiny", {}), ("mlm", "bert-tiny", {"masking": "static", "whole_word": True}),
                 ("electra", "electra-tiny", {}), ("spanbert", "bert-tiny", {}), ("nsp", "bert-tiny", {}),
                 ("t5", "t5-tiny", {}), ("t5", "t5-tiny", {"variant": "bert"}), ("bart", "bart-tiny", {})]


@pytest.mark.parametrize("objective,preset,params", HOST_PREPARED,
                         ids=[f"{o}-{'-'.join(map(str, p.values())) or 'default'}"
                              for o, _, p in HOST_PREPARED])
def test_a_training_step_reads_the_device_once(tiny_config, tmp_path, objective, preset, params):
    """The trainer's whole step (its micro-batch taken from the prefetch thread, moved to the
    device, forward, backward, clipping, optimizer step, the step's numbers) reads the device
    exactly once: the objective's preparation ran in the data path, a step ahead."""
    model = {"preset": preset, "d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64,
             "max_positions": 64, "dropout": 0.1, "attn_dropout": 0.0}
    assert_one_read_per_trainer_step(tiny_config, tmp_path, model, {"name": objective, **params})


def assert_one_read_per_trainer_step(tiny_config, tmp_path, model: dict, objective: dict) -> None:
    """Run a trainer's first step, let the prefetch thread prepare the second, then count the
    second step's host reads: exactly the one that fetches the step's numbers."""
    from lmlab.train import distributed as dist_
    from lmlab.train.config import load_config
    from lmlab.train.loop import Trainer

    cfg = tiny_config(max_steps=2, grad_accum=2, prefetch=True)
    cfg["model"], cfg["objective"] = model, objective
    trainer = Trainer(load_config(cfg), tmp_path / "run", False, lambda m: None)
    trainer.info = dist_.DistInfo()
    try:
        trainer.setup()
        trainer.train_step()  # the first step asks for the second one's micro-batches
        for future in trainer.prefetcher.pending.values():
            future.result()  # prepared on the prefetch thread before the step begins
        with HostReads() as reads:
            row = trainer.train_step()
        assert dict(reads.counts) == {"tolist": 1}
        assert all(isinstance(v, float) and math.isfinite(v) for v in row.values())
    finally:
        if trainer.prefetcher is not None:
            trainer.prefetcher.close()


def test_segment_id_checks_run_eagerly_but_not_in_the_trainers_steps():
    from lmlab.errors import LmlabError

    model = build_model(get_preset("bert-tiny", vocab_size=100, max_positions=16))
    ids = torch.randint(5, 100, (2, 8), generator=torch.Generator().manual_seed(0))
    with pytest.raises(LmlabError, match="token_type_ids must be below"):
        model(input_ids=ids, token_type_ids=torch.full_like(ids, 5))
    with HostReads() as reads, trusted_inputs():
        model(input_ids=ids, token_type_ids=torch.ones_like(ids))
    assert not reads.counts, dict(reads.counts)


#: objectives with their own attention patterns: UniLM (its metrics were device reads, its MLM head
#: selected by mask), XLNet (the targets were found with nonzero), Transformer-XL
PATTERN_OBJECTIVES = [("unilm", "bert-tiny"), ("xlnet", "xlnet-tiny"), ("transfo-xl", "transfo-xl-tiny")]


@pytest.mark.parametrize("objective,preset", PATTERN_OBJECTIVES)
def test_a_pattern_objectives_training_step_reads_the_device_once(tiny_config, tmp_path, objective, preset):
    assert_one_read_per_trainer_step(tiny_config, tmp_path, {"preset": preset}, {"name": objective})


def test_xlnet_targets_are_the_last_places_of_the_order_in_position_order(text):
    tok, paras = text
    obj = get_objective("xlnet")(tok)
    batch = pack(tok, paras, rows=5, seq_len=48)
    inputs = obj.prepare(batch, torch.Generator().manual_seed(3))
    from lmlab.objectives.xlnet import permutation_ranks

    ranks = permutation_ranks(5, 48, torch.Generator().manual_seed(3), "cpu")  # the same draws
    p = obj.num_targets(48)
    expect = (ranks >= 48 - p).nonzero()[:, 1].view(5, p)
    assert torch.equal(inputs["target_positions"], expect)

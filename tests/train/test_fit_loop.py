"""The one fit loop and its components (lmlab.train.components): the order of a step's parts,
the schedules, the stop, and the one resume format every loop writes."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from lmlab.train.components import Checkpointer, Evaluator, FitLoop, ResumeState, RunLogger
from lmlab.train.components.checkpointer import StateDictWeights, optimizer_state, restore_optimizer
from lmlab.train.components.resume_state import random_streams, restore_random_streams
from lmlab.train.engine import Engine
from lmlab.train.metrics import MetricsLog


def tiny_engine():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    x, y = torch.randn(8, 3), torch.randn(8, 1)
    return model, opt, Engine(opt, lambda step: 0.1), lambda step: [lambda: ((model(x) - y) ** 2).mean()]


class Stop:
    def __init__(self, at: int | None):
        self.at, self.step = at, 0

    def __call__(self):
        return "SIGTERM" if self.step == self.at else None


def test_each_step_is_update_bookkeeping_evaluation_report_save_stop(tmp_path):
    model, opt, engine, batches = tiny_engine()
    seen, stop = [], Stop(at=2)

    def after_step(step, done, seconds):
        stop.step = step
        seen.append(("step", step))
        return {"step": step, "loss": done.loss}

    loop = FitLoop(engine, 5, micro_batches=batches, after_step=after_step,
                   report=lambda step, row, ev, final: seen.append(("report", step, ev is not None)),
                   evaluator=Evaluator(lambda step: seen.append(("eval", step)) or {"x": 1.0}, every=2),
                   checkpointer=Checkpointer(tmp_path, every=None),
                   save=lambda step: seen.append(("save", step)),
                   stop=stop, on_stop=lambda why, step: seen.append((why, step)))
    with pytest.raises(KeyboardInterrupt):
        loop.run(0)
    assert seen == [("step", 1), ("report", 1, False),
                    ("step", 2), ("eval", 2), ("report", 2, True), ("save", 2), ("SIGTERM", 2)]  # saved once


def test_a_stop_between_saves_saves_before_it_ends_and_none_is_heard_at_the_last_step(tmp_path):
    model, opt, engine, batches = tiny_engine()
    saves, stop = [], Stop(at=1)
    loop = FitLoop(engine, 1, micro_batches=batches, after_step=lambda s, d, t: {}, report=lambda *a: None,
                   checkpointer=Checkpointer(tmp_path, every=10, at_end=False), save=saves.append, stop=stop)
    assert loop.run(0) == 1 and saves == []  # the last step: the run ends on its own, nothing to save
    stop.at, stop.step = 1, 1
    loop.total = 3
    with pytest.raises(KeyboardInterrupt):
        loop.run(0)
    assert saves == [1]


def test_the_schedules():
    ev = Evaluator(lambda s: {}, every=3, also=lambda s: s == 4)
    assert [s for s in range(1, 8) if ev.due(s, s == 7)] == [3, 4, 6, 7]
    assert not Evaluator(lambda s: {}, at_end=False).due(7, True)
    every, at_eval = Checkpointer("x", every=2), Checkpointer("x", every=None, at_end=False)
    assert [every.due(s, False, s == 5) for s in range(1, 6)] == [False, True, False, True, True]
    assert [at_eval.due(s, s == 2, s == 3) for s in range(1, 4)] == [False, True, False]


def test_the_one_resume_format_round_trips_weights_optimizer_and_random_streams(tmp_path):
    from lmlab.train.checkpoint import read_train_state

    model, opt, engine, batches = tiny_engine()
    model.extra = nn.Linear(3, 1)
    model.extra.weight = model.weight  # tied tensors are stored once each
    engine.step(0, batches(0))
    gen = torch.Generator().manual_seed(7)
    tensors, groups = optimizer_state(opt)
    tensors.update(random_streams({"shuffle": gen}))
    meta = {**ResumeState(1, 8, 0, 0.5).meta(), "optimizer": groups}
    path = Checkpointer(tmp_path, keep=1).save(1, StateDictWeights(model.state_dict()), tensors, meta)
    assert path == tmp_path / "checkpoints" / "step_1"
    assert json.loads((path / "train_state.json").read_text())["format"] == "lmlab-train-state"
    assert read_train_state(path)["data_position"] == 8  # checked against file_schemas.TrainStateFile
    expected_next = torch.randperm(10, generator=gen).tolist()
    want = {k: v.clone() for k, v in model.state_dict().items()}
    engine.step(1, batches(1))  # move on, then come back

    saved, meta, weights = Checkpointer.read(path)
    model.load_state_dict(weights)
    restore_optimizer(opt, saved, meta["optimizer"])
    restore_random_streams(saved, {"shuffle": gen})
    assert all(torch.equal(model.state_dict()[k], v) for k, v in want.items())
    assert torch.randperm(10, generator=gen).tolist() == expected_next
    assert ResumeState.from_meta(meta) == ResumeState(1, 8, 0, 0.5)


def test_the_logger_writes_rows_everywhere_once(tmp_path):
    class Sink:
        def __init__(self):
            self.rows = []

        def log(self, row, step):
            self.rows.append((step, row))

        def close(self):
            self.rows.append("closed")

    sink = Sink()
    log = RunLogger(MetricsLog(tmp_path / "metrics.jsonl"), lambda m: None, loggers=[sink])
    log.record({"step": 3, "loss": 1.5})
    log.close()
    log.close()
    assert log.history == [{"step": 3, "loss": 1.5}]
    assert sink.rows == [(3, {"step": 3, "loss": 1.5}), "closed"]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 3, "loss": 1.5}\n'


def test_pretraining_takes_every_step_through_the_fit_loop(tiny_config, tmp_path, monkeypatch):
    from lmlab.train import pretrain

    through_loop, engine_steps = [], []
    take, step = FitLoop.take_step, Engine.step
    monkeypatch.setattr(FitLoop, "take_step", lambda self, i: through_loop.append(i) or take(self, i))
    monkeypatch.setattr(Engine, "step", lambda self, i, mb: engine_steps.append(i) or step(self, i, mb))
    pretrain(tiny_config(max_steps=3, eval_every=3, checkpoint_every=3), tmp_path / "run", log=lambda m: None)
    assert through_loop == engine_steps == [0, 1, 2]

"""train.loggers / finetune loggers: the metrics rows also go to TensorBoard and W&B (offline), read
back here with TensorBoard's own event reader and wandb's own record schema."""

from __future__ import annotations

import json

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch.utils.tensorboard import SummaryWriter
from wandb_history import history

from lmlab.cli import main
from lmlab.train import pretrain

QUIET = lambda m: None  # noqa: E731


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path, monkeypatch):
    """No network, ever: W&B offline, its global files under tmp_path."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-global"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))


def _events(directory, tag):
    """Every ``(step, value)`` event of ``tag``, in file order (duplicates kept)."""
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)] if tag in acc.Tags()["scalars"] else []


def _scalars(directory, tag):
    return dict(_events(directory, tag))


def _rows(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_every_metrics_row_reaches_tensorboard_and_a_resume_drops_what_a_kill_left(tiny_config, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, loggers=["tensorboard"]), run, log=QUIET)
    # a kill after step 5 would have left events past the checkpoint at step 4
    stray = SummaryWriter(str(run / "tensorboard"))
    stray.add_scalar("loss", 123.0, 5)
    stray.close()
    pretrain(tiny_config(max_steps=8, loggers=["tensorboard"]), run, resume=True, log=QUIET)
    rows = _rows(run)
    assert [step for step, _ in _events(run / "tensorboard", "loss")] == list(range(1, 9))  # stray purged
    loss = _scalars(run / "tensorboard", "loss")
    assert sorted(loss) == [r["step"] for r in rows] == list(range(1, 9))
    for r in rows:
        assert loss[r["step"]] == pytest.approx(r["loss"], rel=1e-6)  # float32 in the event file
    val = _scalars(run / "tensorboard", "val_loss")
    assert 0 in val and 4 in val and 8 in val  # the step-0 evaluation and the later ones
    assert set(_scalars(run / "tensorboard", "next_acc")) == set(range(1, 9))  # the objective's signal


def test_unknown_logger_is_one_line_before_any_work(tiny_config, tmp_path, capsys):
    from lmlab.train.config import load_config, to_toml

    cfg = tmp_path / "run.toml"
    cfg.write_text(to_toml(load_config(tiny_config())))
    code = main(["pretrain", "--config", str(cfg), "--out", str(tmp_path / "r"), "--set",
                 'train.loggers=["neptune"]'])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: unknown logger 'neptune' in --set train.loggers")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("value", ["tensorboard", 1, [1]])
def test_loggers_that_are_no_list_of_names_are_one_line(value):
    from lmlab.errors import LmlabError
    from lmlab.finetune.config import FinetuneConfig

    with pytest.raises(LmlabError, match="must be a list of logger names"):
        FinetuneConfig.from_dict({"loggers": value})


def _finetune_tiny(out, minilm_dir, data_dir, loggers):
    """4 steps of SST-2 on a random bert-tiny, the metrics rows logged every step."""
    import torch

    from lmlab.finetune import finetune
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import load_tokenizer

    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",))
    model.tokenizer = tok
    sst2 = data_dir / "glue" / "sst2"
    finetune(model, "sst2", sst2 / "train.tsv", sst2 / "dev.tsv", out, epochs=1, batch_size=8,
             max_train_examples=32, max_eval_examples=16, log_every=1, loggers=loggers,
             progress=False, log=QUIET)


def test_finetuning_writes_its_rows_into_the_output(tmp_path, minilm_dir, data_dir):
    _finetune_tiny(tmp_path / "ft", minilm_dir, data_dir, ["tensorboard"])
    rows = _rows(tmp_path / "ft")
    loss = _scalars(tmp_path / "ft" / "tensorboard", "loss")
    assert sorted(loss) == [r["step"] for r in rows if "loss" in r] == [1, 2, 3, 4]
    assert set(_scalars(tmp_path / "ft" / "tensorboard", "dev_accuracy")) == {4}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left beside it


def test_a_failed_finetune_closes_its_loggers_and_leaves_nothing_beside_the_output(tmp_path, minilm_dir,
                                                                                    data_dir, monkeypatch):
    import torch

    from lmlab.errors import LmlabError
    from lmlab.finetune import finetune
    from lmlab.finetune import loop as ft_loop
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import load_tokenizer

    real = ft_loop.Engine.step

    def fail_on_third(self, step, micro_batches):
        if step == 2:
            raise LmlabError("the training loss became non-finite at step 3", "lower the learning rate")
        return real(self, step, micro_batches)

    monkeypatch.setattr(ft_loop.Engine, "step", fail_on_third)
    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=("mlm",))
    model.tokenizer = tok
    sst2 = data_dir / "glue" / "sst2"
    with pytest.raises(LmlabError, match="non-finite"):
        finetune(model, "sst2", sst2 / "train.tsv", sst2 / "dev.tsv", tmp_path / "ft", epochs=1,
                 batch_size=8, max_train_examples=32, max_eval_examples=16, loggers=["tensorboard"],
                 progress=False, log=QUIET)
    assert not list(tmp_path.glob(".ft.tmp-*"))  # the live TensorBoard folder is gone
    assert not (tmp_path / "ft").exists()


def test_every_metrics_row_reaches_wandb_and_a_resume_continues_the_run_without_duplicate_steps(
        tiny_config, tmp_path):
    from lmlab.train.loggers import WandbLogger

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, loggers=["wandb"]), run, log=QUIET)
    # a kill after step 5 would have left that step in the W&B run, past the checkpoint at step 4
    stray = WandbLogger(run, resume_after=4)
    stray.log({"loss": 123.0}, 5)
    stray.close()
    pretrain(tiny_config(max_steps=8, loggers=["wandb"]), run, resume=True, log=QUIET)
    segs, merged = history(run / "wandb")
    assert len(segs) == 3 and len({s["id"] for s in segs}) == 1  # one W&B run, continued twice
    assert segs[2]["rewind"] == 4  # the resume rewinds the run to its checkpoint
    assert segs[0]["config"]["train"]["max_steps"] == 4 and segs[2]["config"]["train"]["max_steps"] == 8
    assert [r["_step"] for r in segs[2]["rows"]] == [5, 6, 7, 8]
    rows = _rows(run)
    assert sorted(merged) == [0] + [r["step"] for r in rows] == list(range(9))  # stray gone, none twice
    for r in rows:
        numbers = {k: v for k, v in r.items() if k != "step"}
        assert merged[r["step"]] == numbers  # every scalar, exactly (JSON both sides)
    assert {"loss", "lr", "tokens_per_s", "next_acc"} <= set(merged[1])
    assert "val_loss" in merged[0] and "val_loss" in merged[4] and "val_loss" in merged[8]


def test_a_resume_after_a_clean_stop_continues_the_run_without_rewinding(tiny_config, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, loggers=["wandb", "tensorboard"]), run, log=QUIET)
    pretrain(tiny_config(max_steps=8, loggers=["wandb", "tensorboard"]), run, resume=True, log=QUIET)
    segs, merged = history(run / "wandb")
    assert [s["rewind"] for s in segs] == [None, None] and len({s["id"] for s in segs}) == 1
    assert sorted(merged) == list(range(9))
    assert sorted(_scalars(run / "tensorboard", "loss")) == list(range(1, 9))  # both loggers, side by side


def test_finetuning_writes_its_wandb_run_into_the_output(tmp_path, minilm_dir, data_dir):
    _finetune_tiny(tmp_path / "ft", minilm_dir, data_dir, ["wandb"])
    segs, merged = history(tmp_path / "ft" / "wandb")
    assert segs[0]["config"]["task"] == "sst2" and segs[0]["config"]["batch_size"] == 8
    expected: dict[int, dict] = {}
    for r in _rows(tmp_path / "ft"):  # a training row and an evaluation row can share a step
        expected.setdefault(r["step"], {}).update({k: v for k, v in r.items() if k != "step"})
    assert merged == expected and sorted(merged) == [1, 2, 3, 4] and "dev_accuracy" in merged[4]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing left beside it


def test_a_missing_wandb_is_one_line_naming_the_extra(monkeypatch):
    import importlib.util

    from lmlab.errors import LmlabError
    from lmlab.train.loggers import check_loggers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "wandb" else real(name, *a))
    one_line = r"^logger 'wandb' needs the wandb package; pip install 'lmlab\[logs\]'$"
    with pytest.raises(LmlabError, match=one_line):
        check_loggers(["tensorboard", "wandb"], "train.loggers")

"""Verdicts from data that chose nothing: with ``select_on = "train-slice"`` the step and the
--lr auto rate are chosen on a slice held out of the training file, and the dev file only scores
the chosen model (lmlab.finetune.selection)."""

from __future__ import annotations

import json

import pytest
import torch

from lmlab.errors import LmlabError
from lmlab.finetune import FinetuneConfig, finetune
from lmlab.finetune.selection import carve_selection
from lmlab.models import build_model, get_preset
from lmlab.tokenizers import load_tokenizer

QUIET = {"progress": False, "log": lambda m: None}
#: small enough for seconds on a CPU, with several evaluations that differ from each other
RUN = {"batch_size": 16, "lr": 3e-3, "epochs": 2, "eval_every": 5, "max_train_examples": 320,
       "select_fraction": 0.25, "max_eval_examples": 96, "max_length": 32, "threads": 1}
SWEEP = {**RUN, "lr": "auto", "lr_sweep": [1e-12, 3e-3], "epochs": 1, "max_train_examples": 160}


@pytest.fixture(scope="module")
def ckpt(minilm_dir, tmp_path_factory):
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=30522, n_layers=1))
    d = tmp_path_factory.mktemp("ck") / "bert-tiny"
    model.save(d, tokenizer=load_tokenizer(minilm_dir))
    return d


@pytest.fixture(scope="module")
def devs(data_dir, tmp_path_factory):
    """The SST-2 dev file and the same sentences with every label flipped: a dev file whose scores
    rank the steps in the opposite order (accuracy becomes 1 - accuracy)."""
    src = data_dir / "glue" / "sst2" / "dev.tsv"
    lines = src.read_text(encoding="utf-8").splitlines()
    rows = (line.rsplit("\t", 1) for line in lines[1:])
    flipped = [lines[0]] + [f"{text}\t{1 - int(label)}" for text, label in rows]
    d = tmp_path_factory.mktemp("dev")
    (d / "flipped.tsv").write_text("\n".join(flipped) + "\n", encoding="utf-8")
    return src, d / "flipped.tsv"


def train_file(data_dir):
    return data_dir / "glue" / "sst2" / "train.tsv"


def summary(out):
    return json.loads((out / "finetune.json").read_text())


# --------------------------------------------------------------------------- the slice


def test_the_slice_is_a_seeded_share_of_train_disjoint_from_what_is_trained_on():
    examples = list(range(50))
    train, held = carve_selection(examples, 0.1, seed=0)
    assert len(held) == 5 and len(train) == 45
    assert sorted(train + held) == examples and not set(train) & set(held)
    assert train == sorted(train) and held == sorted(held)  # the file's order is kept
    assert carve_selection(examples, 0.1, seed=0) == (train, held)  # deterministic
    assert carve_selection(examples, 0.1, seed=1)[1] != held  # another seed, another slice
    assert len(carve_selection(examples, 0.001, seed=0)[1]) == 1  # at least one example


def test_too_few_training_examples_to_hold_a_slice_out_is_one_error():
    with pytest.raises(LmlabError, match=r"1 example\(s\): too few .*; .*--select-on dev"):
        carve_selection(["only"], 0.1, seed=0)


def test_select_settings_are_checked():
    assert FinetuneConfig().select_on == "dev" and FinetuneConfig().select_fraction == 0.1
    with pytest.raises(LmlabError, match="select_on must be one of dev, train-slice"):
        FinetuneConfig.from_dict({"select_on": "test"})
    for bad in (0, 1, 1.5):
        with pytest.raises(LmlabError, match="select_fraction must be"):
            FinetuneConfig.from_dict({"select_fraction": bad})


# --------------------------------------------------------------------------- the chosen step


def test_the_step_is_chosen_without_reading_the_dev_file(ckpt, data_dir, devs, tmp_path):
    dev, flipped = devs
    runs = {}
    for name, dev_file in (("dev", dev), ("flipped", flipped)):
        out = tmp_path / name
        res = finetune(ckpt, "sst2", train_file(data_dir), dev_file, out, select_on="train-slice", **RUN,
                       **QUIET)
        runs[name] = (res, summary(out))
    (res, s), (res_f, _) = runs["dev"], runs["flipped"]
    slice_rows = [r for r in res.history if "slice_accuracy" in r]
    assert len(slice_rows) >= 3 and len({r["slice_accuracy"] for r in slice_rows}) > 1
    # the step with the best slice score is kept, whatever the dev file says
    best = max(slice_rows, key=lambda r: r["slice_accuracy"])  # the first of equal scores, as the loop
    assert res.best_step == res_f.best_step == best["step"] == s["best_step"]
    assert [r for r in res_f.history if "slice_accuracy" in r] == slice_rows
    assert not any(k.startswith("dev_") for r in slice_rows for k in r)  # dev scored nothing on the way
    # then the dev file scores the chosen model once
    assert res.metrics["accuracy"] + res_f.metrics["accuracy"] == pytest.approx(1.0)
    finals = [r for r in res.history if "dev_accuracy" in r]
    assert len(finals) == 1 and finals[0]["chosen_step"] == res.best_step
    assert json.loads((tmp_path / "dev" / "eval.json").read_text()) == res.metrics == s["dev"]
    assert res.selected_on == "train-slice" and res.selection["accuracy"] == best["slice_accuracy"]
    assert s["selection"] == {"data": "train-slice", "fraction": 0.25, "examples": 80, "metric": "accuracy",
                              "scores": res.selection, "scored_on": "dev"}
    assert s["train_examples"] == 240  # the slice is not trained on


def test_on_dev_the_same_two_dev_files_choose_different_steps(ckpt, data_dir, devs):
    """The check above means something: chosen on dev, the flipped file picks another step."""
    dev, flipped = devs
    on_dev = {k: v for k, v in RUN.items() if k != "select_fraction"}  # no slice: refused with select_on dev
    steps = [finetune(ckpt, "sst2", train_file(data_dir), f, None, select_on="dev", **on_dev, **QUIET)
             .best_step for f in (dev, flipped)]
    assert steps[0] != steps[1]


def test_lr_auto_chooses_the_rate_on_the_slice(ckpt, data_dir, devs, tmp_path):
    dev, flipped = devs
    chosen = []
    for name, dev_file in (("dev", dev), ("flipped", flipped)):
        out = tmp_path / name
        said: list[str] = []
        res = finetune(ckpt, "sst2", train_file(data_dir), dev_file, out, select_on="train-slice",
                       **SWEEP, progress=False, log=said.append)
        sweep = summary(out)["lr_sweep"]
        assert sweep["selected_on"] == "train-slice" and set(sweep["scores"]) == {"1e-12", "0.003"}
        best = max(sweep["scores"], key=lambda k: (sweep["scores"][k], -float(k)))
        assert sweep["chosen"] == float(best) and sweep["scores"][best] == res.selection["accuracy"]
        assert any(line.startswith("lr auto: slice accuracy") for line in said)
        chosen.append((sweep["chosen"], sweep["scores"]))
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []
    assert chosen[0] == chosen[1]  # the flipped dev file changes nothing that was chosen


# --------------------------------------------------------------------------- the command line


def test_cli_select_on_train_slice(ckpt, data_dir, tmp_path, capsys):
    from lmlab.cli import main

    g = data_dir / "glue" / "sst2"
    args = ["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(g / "train.tsv"),
            "--dev", str(g / "dev.tsv"), "--out", str(tmp_path / "ft"), "--max-steps", "2",
            "--batch-size", "8", "--max-train-examples", "40", "--max-eval-examples", "16", "--no-progress",
            "--threads", "1"]
    with pytest.raises(SystemExit) as stopped:  # argparse refuses it
        main([*args, "--select-fraction", "1"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "select-fraction" in err and "\n" not in err
    assert not (tmp_path / "ft").exists()
    assert main([*args, "--select-on", "train-slice", "--select-fraction", "0.2"]) == 0
    printed = json.loads(capsys.readouterr().out)
    s = summary(tmp_path / "ft")
    assert printed == s["dev"] and s["selection"]["data"] == "train-slice" and s["selection"]["examples"] == 8
    assert s["train_examples"] == 32 and s["config"]["select_on"] == "train-slice"


# --------------------------------------------------------------------------- stop and resume


def test_a_run_chosen_on_the_slice_resumes_exactly(ckpt, data_dir, devs, tmp_path, monkeypatch):
    from lmlab.finetune import loop as ft_loop
    from lmlab.train.engine import Engine

    dev = devs[0]
    hp = {**RUN, "epochs": 1, "select_on": "train-slice"}
    whole = finetune(ckpt, "sst2", train_file(data_dir), dev, tmp_path / "whole", **hp, **QUIET)

    class StopAfterStep7:  # stands in for the SIGTERM handler: a stop is requested once step 7 is done
        requested = None

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    stop = StopAfterStep7()
    original = Engine.step

    def step(engine, i, *a, **k):
        out = original(engine, i, *a, **k)
        stop.requested = "SIGTERM" if i + 1 == 7 else stop.requested
        return out

    with monkeypatch.context() as m:
        m.setattr(Engine, "step", step)
        m.setattr(ft_loop, "StopRequests", lambda: stop)
        with pytest.raises(KeyboardInterrupt):
            finetune(ckpt, "sst2", train_file(data_dir), dev, tmp_path / "part", **hp, **QUIET)
    resumed = finetune(ckpt, "sst2", train_file(data_dir), dev, tmp_path / "part", resume=True, **hp, **QUIET)
    assert resumed.best_step == whole.best_step and resumed.selection == whole.selection
    assert resumed.metrics == whole.metrics
    strip = ("elapsed_s", "examples_per_s")
    assert [{k: v for k, v in r.items() if k not in strip} for r in resumed.history] == \
        [{k: v for k, v in r.items() if k not in strip} for r in whole.history]

"""Stopping a DPO run and resuming it (``--resume``) gives the uninterrupted run's result, exactly;
a resume of another run is refused in one line before any work (docs/align.md, docs/safety.md)."""

from __future__ import annotations

import json

import pytest
import torch
from align_fixtures import synthetic_pairs, tiny_model, write_pairs
from safetensors.torch import load_file
from stop_at import StopAt

from lmlab.align import align
from lmlab.align import loop as align_loop
from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.stopping import Stopped
from lmlab.train.components.output_resume import resume_dir, saved_state

QUIET = {"progress": False, "log": lambda m: None}
#: dropout on, so that the global RNG's state matters; 24 pairs in batches of 8: 6 steps are 2 epochs
HP = {"method": "dpo", "max_steps": 6, "batch_size": 8, "lr": 1e-3, "eval_every": 2, "dropout": True,
      "warmup_ratio": 0.3}
FLAGS = ["--method", "dpo", "--max-steps", "6", "--batch-size", "8", "--lr", "1e-3", "--eval-every", "2",
         "--dropout", "--warmup-ratio", "0.3", "--no-progress"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("align-resume")
    model = tiny_model()
    model.save(d / "gpt", tokenizer=model.tokenizer)
    return d / "gpt", write_pairs(d / "train.jsonl", synthetic_pairs(24, 0)), \
        write_pairs(d / "dev.jsonl", synthetic_pairs(8, 1))


@pytest.fixture(scope="module")
def whole(files, tmp_path_factory):
    """The uninterrupted run's output."""
    out = tmp_path_factory.mktemp("whole") / "aligned"
    align(*files, out, **HP, **QUIET)
    return out


def rows(out):
    return [{k: v for k, v in json.loads(line).items() if k != "elapsed_s"}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


def interrupt(files, out, monkeypatch, at=3, crash=False):
    with monkeypatch.context() as m:
        StopAt(m, align_loop, at, crash)
        with pytest.raises(KeyboardInterrupt if crash else Stopped):
            align(*files, out, **HP, **QUIET)


@pytest.mark.parametrize("at, crash, saved", [(3, False, 3), (5, True, 4)])  # a signal; a kill mid-step
def test_a_stopped_and_resumed_dpo_run_equals_the_uninterrupted_one(files, whole, tmp_path, monkeypatch, at,
                                                                   crash, saved):
    out = tmp_path / "aligned"
    interrupt(files, out, monkeypatch, at, crash)
    assert not out.exists() and saved_state(out).name == f"step_{saved}"
    said = []
    res = align(*files, out, **HP, progress=False, log=said.append, resume=True)
    assert f"resumed from step {saved} of 6" in "\n".join(said)
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)  # bit for bit
    assert (out / "eval.json").read_text() == (whole / "eval.json").read_text()
    assert rows(out) == rows(whole) and res.steps == 6
    assert not resume_dir(out).exists()  # removed once the run completed


def test_an_interrupted_run_is_never_started_over_silently(files, tmp_path, monkeypatch, capsys):
    out = tmp_path / "aligned"
    interrupt(files, out, monkeypatch)
    ck, train, dev = files
    assert main(["align", "--checkpoint", str(ck), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), *FLAGS]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "pass --resume to continue it" in err
    assert saved_state(out).name == "step_3"  # the work is kept


def test_an_interrupted_dpo_run_tells_an_rlhf_run_how_it_continues(files, tmp_path, monkeypatch, capsys):
    """A stopped DPO run's output taken by ``--method rlhf``: the refusal said "pass --resume",
    which rlhf refuses (it saves no state). It names the method the run continues with."""
    out = tmp_path / "aligned"
    interrupt(files, out, monkeypatch)
    ck, train, dev = files
    assert main(["align", "--checkpoint", str(ck), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), "--method", "rlhf", "--max-steps", "1", "--batch-size", "2",
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "run it again as it was started (--method dpo), with --resume, to continue it" in err
    assert "pass --resume" not in err
    assert saved_state(out).name == "step_3"  # the work is kept


@pytest.mark.parametrize("change, words", [
    (["--beta", "0.2"], "beta 0.1 -> 0.2"),
    (["--seed", "1"], "seed 0 -> 1"),
    ("train", "holds other contents than when the run started"),
])
def test_a_resume_of_another_run_is_refused_before_any_work(files, tmp_path, monkeypatch, capsys, change,
                                                             words):
    ck, train, dev = files
    train = write_pairs(tmp_path / "train.jsonl", synthetic_pairs(24, 0))  # a copy the test may change
    out = tmp_path / "aligned"
    interrupt((ck, train, dev), out, monkeypatch)
    if change == "train":  # the same path, other pairs
        write_pairs(train, synthetic_pairs(24, 5))
        change = []

    def no_model(*a, **k):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(align_loop, "load_policy", no_model)
    before = sorted(p.name for p in resume_dir(out).rglob("*"))
    assert main(["align", "--checkpoint", str(ck), "--train", str(train), "--dev", str(dev),
                 "--out", str(out), *FLAGS, *change, "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume does not continue the interrupted run") and words in err
    assert err.count("\n") == 1 and sorted(p.name for p in resume_dir(out).rglob("*")) == before


def test_resume_rules(files, tmp_path, monkeypatch, capsys):
    ck, train, dev = files
    with pytest.raises(LmlabError, match="no output directory"):
        align(*files, None, **HP, **QUIET, resume=True)
    with pytest.raises(LmlabError, match="must be True or False"):
        align(*files, tmp_path / "o", **HP, **QUIET, resume="yes")
    assert main(["align", "--checkpoint", str(ck), "--train", str(train), "--dev", str(dev),
                 "--out", str(tmp_path / "r"), "--method", "rlhf", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --resume cannot continue a --method rlhf run") and err.count("\n") == 1
    assert not (tmp_path / "o").exists() and not (tmp_path / "r").exists()
    # with nothing to resume, --resume starts from the beginning
    out = tmp_path / "fresh"
    res = align(*files, out, **{**HP, "max_steps": 2}, **QUIET, resume=True)
    assert res.steps == 2 and (out / "align.json").is_file() and not resume_dir(out).exists()


def test_an_output_taken_while_the_run_trains_keeps_the_work_and_says_how_to_resume(files, whole, tmp_path,
                                                                                    monkeypatch):
    out = tmp_path / "aligned"
    real = align_loop.DpoSteps.evaluate

    def evaluate(self, step):  # someone makes --out while the run trains
        if step == 6:
            out.mkdir()
            (out / "notes.txt").write_text("mine")
        return real(self, step)

    with monkeypatch.context() as m:
        m.setattr(align_loop.DpoSteps, "evaluate", evaluate)
        with pytest.raises(LmlabError) as e:
            align(*files, out, **HP, **QUIET)
    assert "--resume" in e.value.fix and (out / "notes.txt").read_text() == "mine"
    assert saved_state(out).name == "step_6"  # the work is kept
    out.rename(tmp_path / "mine")
    align(*files, out, **HP, **QUIET, resume=True)  # only writes the output
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a) and rows(out) == rows(whole)
    assert (tmp_path / "mine" / "notes.txt").read_text() == "mine" and not resume_dir(out).exists()

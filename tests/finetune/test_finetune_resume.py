"""Stopping a fine-tuning run and resuming it gives the uninterrupted run's result, exactly."""

from __future__ import annotations

import json
import signal

import pytest
import torch
from safetensors.torch import load_file
from stop_at import StopAt

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.fileio import directory_lock
from lmlab.finetune import finetune
from lmlab.finetune import loop as ft_loop
from lmlab.finetune.resume import claim, resume_dir, saved_state
from lmlab.models import build_model, get_preset, save_checkpoint
from lmlab.tokenizers import load_tokenizer
from lmlab.train.engine import Engine

QUIET = {"progress": False, "log": lambda m: None}
TIMINGS = ("elapsed_s", "examples_per_s")


@pytest.fixture(scope="module")
def start(minilm_dir, tmp_path_factory):
    """A tiny BERT (dropout on, so the RNG state matters) saved with the real MiniLM vocabulary."""
    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=None)
    d = tmp_path_factory.mktemp("start") / "bert"
    save_checkpoint(model, d, tokenizer=tok)
    return d


@pytest.fixture()
def sst2(data_dir):
    g = data_dir / "glue" / "sst2"
    return g / "train.tsv", g / "dev.tsv"


HP = {"epochs": 2, "batch_size": 16, "lr": 5e-4, "eval_every": 4, "max_train_examples": 96,
      "max_eval_examples": 48, "warmup_ratio": 0.2}


def rows(out):
    return [{k: v for k, v in json.loads(line).items() if k not in TIMINGS}
            for line in (out / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("method", ["full", "lora", "adamix"])  # adamix: random routes resume too
def test_stopped_and_resumed_run_equals_the_uninterrupted_one(start, sst2, tmp_path, monkeypatch, method):
    hp = {**HP, "method": method}
    whole = tmp_path / "whole"
    finetune(start, "sst2", *sst2, whole, **hp, **QUIET)
    assert not resume_dir(whole).exists()          # a finished run leaves no state behind

    out = tmp_path / "stopped"
    with monkeypatch.context() as m:
        StopAt(m, ft_loop, at=5)                             # mid-epoch, between two evaluations
        with pytest.raises(KeyboardInterrupt):
            finetune(start, "sst2", *sst2, out, **hp, **QUIET)
    state = saved_state(out)  # the one resume format: .OUT.resume/checkpoints/step_N/
    assert not out.exists() and state == resume_dir(out) / "checkpoints" / "step_5"
    saved = json.loads((state / "train_state.json").read_text())
    assert saved["step"] == 5 and saved["finetune"]["best"]["step"] == 4

    res = finetune(start, "sst2", *sst2, out, resume=True, **hp, **QUIET)
    assert res.steps == 12 and not resume_dir(out).exists()
    weights = sorted(p.relative_to(whole) for p in whole.rglob("*.safetensors"))
    assert weights and weights == sorted(p.relative_to(out) for p in out.rglob("*.safetensors"))
    for name in weights:
        a, b = load_file(whole / name), load_file(out / name)
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (out / "eval.json").read_text() == (whole / "eval.json").read_text()
    assert rows(out) == rows(whole) and len(rows(out)) > 3
    assert json.loads((out / "finetune.json").read_text())["best_step"] == \
        json.loads((whole / "finetune.json").read_text())["best_step"]


def test_a_run_without_stops_installs_and_removes_its_signal_handlers(start, sst2, tmp_path):
    before = signal.getsignal(signal.SIGTERM)
    seen = []
    original = Engine.step

    def step(engine, i, *a, **k):
        seen.append(signal.getsignal(signal.SIGTERM))
        return original(engine, i, *a, **k)

    Engine.step = step
    try:
        finetune(start, "sst2", *sst2, tmp_path / "ft", **{**HP, "epochs": 1}, **QUIET)
    finally:
        Engine.step = original
    assert seen and all(h is not before for h in seen)   # the loop listens for a stop request
    assert signal.getsignal(signal.SIGTERM) is before    # and gives the handler back at the end


def test_an_interrupted_run_is_never_started_over_silently(start, sst2, tmp_path, monkeypatch, capsys):
    out = tmp_path / "ft"
    with monkeypatch.context() as m:
        StopAt(m, ft_loop, at=2)
        with pytest.raises(KeyboardInterrupt):
            finetune(start, "sst2", *sst2, out, **HP, **QUIET)
    with pytest.raises(LmlabError, match="interrupted fine-tuning run.*--resume"):
        finetune(start, "sst2", *sst2, out, **HP, **QUIET)
    # the CLI says the same in one line, exit 2
    code = main(["finetune", "--checkpoint", str(start), "--task", "sst2", "--train", str(sst2[0]),
                 "--dev", str(sst2[1]), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("error: ") and "--resume" in err[-1]
    # other settings than the interrupted run's: refused, naming what changed
    with pytest.raises(LmlabError, match=r"lr 0\.0005 -> 0\.001"):
        finetune(start, "sst2", *sst2, out, resume=True, **{**HP, "lr": 1e-3}, **QUIET)
    # on the command line the setting is named by its flag (it said max_train_examples)
    code = main(["finetune", "--checkpoint", str(start), "--task", "sst2", "--train", str(sst2[0]),
                 "--dev", str(sst2[1]), "--out", str(out), "--no-progress", "--resume",
                 *[f"--{k.replace('_', '-')}={v}" for k, v in HP.items() if k != "max_train_examples"],
                 "--max-train-examples", "8"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and "--max-train-examples " in err[-1] and "max_train_examples" not in err[-1], err
    assert saved_state(out) is not None  # still there after every refusal


def test_resume_with_nothing_to_resume_starts_from_the_beginning(start, sst2, tmp_path):
    res = finetune(start, "sst2", *sst2, tmp_path / "ft", resume=True, **{**HP, "epochs": 1}, **QUIET)
    assert res.steps == 6 and (tmp_path / "ft" / "eval.json").is_file()


def test_a_second_run_into_the_same_output_is_refused_and_keeps_the_first_ones_files(start, sst2, tmp_path):
    out = tmp_path / "ft"
    rdir = resume_dir(out)
    claim(out)  # a first run claims its resume folder (lmlab.ownership), then locks it
    with directory_lock(rdir, "fine-tuning output"):  # a first run, before its first resume state
        (rdir / "metrics.jsonl").write_text('{"step": 1}\n')
        with pytest.raises(LmlabError, match="in use"):
            finetune(start, "sst2", *sst2, out, **{**HP, "epochs": 1}, **QUIET)
        assert (rdir / "metrics.jsonl").read_text() == '{"step": 1}\n' and not out.exists()
    (rdir / "metrics.jsonl").unlink()
    with pytest.raises(LmlabError):  # a run that fails on its input leaves nothing beside the output
        finetune(start, "sst2", tmp_path / "missing.tsv", sst2[1], out, **HP, **QUIET)
    assert not rdir.exists() and not out.exists()


def test_lr_auto_cannot_be_resumed(start, sst2, tmp_path):
    with pytest.raises(LmlabError, match="lr auto"):
        finetune(start, "sst2", *sst2, tmp_path / "ft", resume=True, **{**HP, "lr": "auto"}, **QUIET)


WORKER = """
import json, sys
from lmlab.finetune import finetune
a = json.loads(sys.argv[1])
finetune(a["start"], "sst2", a["train"], a["dev"], a["out"], progress=False, log=lambda m: None, **a["hp"])
"""


def test_two_gloo_processes_fine_tune_like_one_with_the_same_global_batch(minilm_dir, sst2, tmp_path):
    """torchrun-style data parallelism: each process takes half of every batch (the last, odd-sized
    batch included) and the gradients are averaged; no dropout, so the arithmetic is the same."""
    import os
    import socket
    import subprocess
    import sys

    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(0)
    cfg = get_preset("bert-tiny", vocab_size=tok.vocab_size, dropout=0.0, attn_dropout=0.0)
    save_checkpoint(build_model(cfg, heads=None), tmp_path / "bert", tokenizer=tok)
    hp = {**HP, "max_train_examples": 91, "log_every": 1}      # 6 steps per epoch, the last has 11
    finetune(tmp_path / "bert", "sst2", *sst2, tmp_path / "one", **hp, **QUIET)

    args = json.dumps({"start": str(tmp_path / "bert"), "train": str(sst2[0]), "dev": str(sst2[1]),
                       "out": str(tmp_path / "two"), "hp": hp})
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, args], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              env=dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                       RANK=str(r), WORLD_SIZE="2", LOCAL_RANK=str(r),
                                       LOCAL_WORLD_SIZE="2", OMP_NUM_THREADS="1"))
             for r in range(2)]
    try:
        outs = [p.communicate(timeout=240)[0] for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail("the two processes did not finish within 240 s")
    assert all(p.returncode == 0 for p in procs), outs

    one, two = rows(tmp_path / "one"), rows(tmp_path / "two")
    assert [r["step"] for r in one] == [r["step"] for r in two] and len(one) > 12
    for a, b in zip(one, two):
        assert a.keys() == b.keys()
        for k in a:
            assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-5), (a["step"], k)
    losses = [r["loss"] for r in one if "loss" in r]
    assert len(losses) == 12 and losses[0] != losses[-1]
    w1 = load_file(tmp_path / "one" / "model.safetensors")
    w2 = load_file(tmp_path / "two" / "model.safetensors")
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-4
    assert not resume_dir(tmp_path / "two").exists()


def test_a_rank_other_than_0_never_clears_the_resume_folder(start, sst2, tmp_path, monkeypatch):
    """Under torchrun, rank 0 alone writes and clears ``.OUT.resume/``; another rank that finishes
    (or fails) first must not clear it: that raced rank 0's own clearing (FileNotFoundError in
    rmtree) and could delete the live metrics of a run still going."""
    from lmlab.train import distributed as dist

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(dist, "init", lambda device_type: dist.DistInfo(rank=1, world_size=2, grouped=True))
    monkeypatch.setattr(dist, "barrier", lambda info: None)
    monkeypatch.setattr(dist, "shutdown", lambda info: None)
    for collective in ("all_reduce", "broadcast"):  # rank 1 alone: its own sums
        monkeypatch.setattr(torch.distributed, collective, lambda *a, **k: None)
    out = tmp_path / "ft"
    rdir = claim(out)  # rank 0's resume folder, its live metrics log in it, no state saved yet
    (rdir / "metrics.jsonl").write_text('{"step": 1}\n')
    finetune(start, "sst2", *sst2, out, **{**HP, "epochs": 1}, **QUIET)
    assert (rdir / "metrics.jsonl").read_text() == '{"step": 1}\n' and not out.exists()


def test_a_run_that_fails_on_a_non_finite_loss_leaves_no_resume_folder(start, sst2, tmp_path, monkeypatch):
    original = Engine.step

    def nan_at_first_step(engine, i, *a, **k):
        original(engine, i, *a, **k)
        raise LmlabError("the training loss became non-finite at step 1", "lower the learning rate")

    monkeypatch.setattr(Engine, "step", nan_at_first_step)
    out = tmp_path / "ft"
    with pytest.raises(LmlabError, match="non-finite"):
        finetune(start, "sst2", *sst2, out, **{**HP, "epochs": 1}, **QUIET)
    assert not resume_dir(out).exists() and not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no live logs or temporaries beside it


def test_the_resume_state_is_in_pretrainings_format(start, sst2, tmp_path, monkeypatch):
    """Fine-tuning's resume state is a checkpoint folder as pretraining writes (train_state.json
    checked against the same schema, the tensors in safetensors, nothing pickled)."""
    from lmlab.train.checkpoint import list_checkpoints, load_train_checkpoint

    out = tmp_path / "ft"
    with monkeypatch.context() as m:
        StopAt(m, ft_loop, at=5)  # after the evaluation at step 4, which kept its weights as the best
        with pytest.raises(KeyboardInterrupt):
            finetune(start, "sst2", *sst2, out, **HP, **QUIET)
    (step, path), = list_checkpoints(resume_dir(out))  # the newest only
    tensors, meta, weights = load_train_checkpoint(path)  # pretraining's reader, its schema checks
    assert step == 5 and meta["data_position"] == 5 * HP["batch_size"]
    assert {"rng.torch", "rng.shuffle"} <= set(tensors) and any(k.startswith("state.") for k in tensors)
    assert any(k.startswith("best.") for k in tensors) and weights
    assert not list(resume_dir(out).rglob("*.pt"))


def test_a_resume_state_of_the_earlier_format_is_refused_in_one_line(start, sst2, tmp_path, capsys):
    out = tmp_path / "ft"
    rdir = claim(out)
    (rdir / "state.pt").write_bytes(b"an earlier lmlab's resume state")
    args = ["finetune", "--checkpoint", str(start), "--task", "sst2", "--train", str(sst2[0]),
            "--dev", str(sst2[1]), "--out", str(out), "--no-progress"]
    for extra in ([], ["--resume"]):
        assert main(args + extra) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err[-1].startswith("error: ") and "state.pt is the resume state of an earlier lmlab" in err[-1]
        assert f"delete {rdir} to start the run over" in err[-1]
    assert (rdir / "state.pt").read_bytes() == b"an earlier lmlab's resume state"  # kept for the user


def test_finishing_a_resumed_run_keeps_your_files_in_its_resume_folder(start, sst2, tmp_path, monkeypatch):
    out = tmp_path / "ft"
    with monkeypatch.context() as m:
        StopAt(m, ft_loop, at=5)
        with pytest.raises(KeyboardInterrupt):
            finetune(start, "sst2", *sst2, out, **HP, **QUIET)
    rdir = resume_dir(out)
    (rdir / "MINE.txt").write_text("mine")
    (rdir / "checkpoints" / "MINE2.txt").write_text("mine too")
    (saved_state(out) / "NOTES.md").write_text("notes inside the saved state")
    res = finetune(start, "sst2", *sst2, out, resume=True, **HP, **QUIET)
    assert res.steps == 12 and (out / "eval.json").is_file()
    assert (rdir / "MINE.txt").read_text() == "mine"
    assert (rdir / "checkpoints" / "MINE2.txt").read_text() == "mine too"
    assert (rdir / "checkpoints" / "step_5" / "NOTES.md").read_text() == "notes inside the saved state"
    # probe10b #3: the kept step_5 was still a resume state: the finished run was taken for an
    # interrupted one (a plain run refused, --resume redid finished work from step 5)
    assert saved_state(out) is None
    again = finetune(start, "sst2", *sst2, out, **{**HP, "epochs": 1}, **QUIET)  # replaces its own output
    assert again.steps == 6 and (rdir / "checkpoints" / "step_5" / "NOTES.md").is_file()


#: a shorter run for the identity and output tests: 2 steps an epoch, a state saved at each evaluation
SMALL = {**HP, "eval_every": 2, "max_train_examples": 32, "max_eval_examples": 16}


@pytest.fixture()
def small(sst2, tmp_path):
    """``(train, dev)``: copies of SST-2's first rows, the run's own files (read in no time)."""
    out = []
    for src, rows in zip(sst2, (32, 16)):
        dst = tmp_path / src.name
        dst.write_text("".join(src.read_text(encoding="utf-8").splitlines(keepends=True)[:rows + 1]),
                       encoding="utf-8")
        out.append(dst)
    return tuple(out)


def _interrupt(monkeypatch, *args, at: int = 3, **hp):
    """Fine-tune ``args`` (checkpoint, task, train, dev, out) until a stop after step ``at``."""
    with monkeypatch.context() as m:
        StopAt(m, ft_loop, at=at)
        with pytest.raises(KeyboardInterrupt):
            finetune(*args, **{**SMALL, **hp}, **QUIET)


def _one_readable_line(e: LmlabError) -> str:
    """The CLI's line of ``e``: one line, with words, not the internals of the identity."""
    line = f"error: {e.problem}; {e.fix}"
    assert "\n" not in line and not any(c in e.problem for c in "[]{}'"), line
    return line


def test_resume_checks_the_start_model_and_the_data_by_content_not_by_path_or_time(start, small, tmp_path,
                                                                                     monkeypatch, minilm_dir):
    """Another model copied to the --checkpoint path is refused (it was resumed on top of); the very
    same train file copied again (a new modification time) is the same run (it was refused, with
    the identity's lists in the message)."""
    import shutil

    ck, (train, dev), out = tmp_path / "ck", small, tmp_path / "ft"
    shutil.copytree(start, ck)
    _interrupt(monkeypatch, ck, "sst2", train, dev, out)
    shutil.rmtree(ck)  # another model of the same shape, at the same path
    tok = load_tokenizer(minilm_dir)
    torch.manual_seed(1)
    other = build_model(get_preset("bert-tiny", vocab_size=tok.vocab_size), heads=None)
    save_checkpoint(other, ck, tokenizer=tok)
    with pytest.raises(LmlabError) as e:
        finetune(ck, "sst2", train, dev, out, resume=True, **SMALL, **QUIET)
    line = _one_readable_line(e.value)
    assert f"--checkpoint {ck} holds other contents than when the run started (model.safetensors differs)" \
        in line and f"delete {resume_dir(out)} to start the run over" in line
    assert saved_state(out) is not None  # nothing lost
    shutil.rmtree(ck)
    shutil.copytree(start, ck)  # the run's own model and data, copied again: new times, same bytes
    train.write_bytes(train.read_bytes())
    res = finetune(ck, "sst2", train, dev, out, resume=True, **SMALL, **QUIET)
    assert res.steps == 4 and (out / "eval.json").is_file() and not resume_dir(out).exists()
    # a changed data file is named, in words
    _interrupt(monkeypatch, ck, "sst2", train, dev, tmp_path / "ft2")
    train.write_text(train.read_text(encoding="utf-8") + "a new sentence\t1\n", encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        finetune(ck, "sst2", train, dev, tmp_path / "ft2", resume=True, **SMALL, **QUIET)
    assert f"--train {train} holds other contents than when the run started" in _one_readable_line(e.value)


def test_a_resume_state_whose_identity_has_paths_and_times_still_resumes(start, small, tmp_path, monkeypatch):
    """A state saved by an lmlab before content identities (the checkpoint by path, the data files
    by path, size and modification time) resumes when they match, as it did; when a file changed,
    one line says how to start over."""
    import os

    from lmlab.ownership import seal

    (train, dev), out = small, tmp_path / "ft"
    _interrupt(monkeypatch, start, "sst2", train, dev, out)
    state = saved_state(out) / "train_state.json"
    meta = json.loads(state.read_text())

    def stamp(p):
        return [str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns]

    settings = meta["finetune"]["identity"]["settings"]
    meta["finetune"]["identity"] = {"settings": settings, "task": "sst2", "method": "full",
                                    "method_options": {}, "checkpoint": str(start.resolve()),
                                    "train": stamp(train), "dev": stamp(dev)}
    state.write_text(json.dumps(meta))
    seal(state.parent, "checkpoint")  # as that lmlab wrote it
    said = []
    mtime = dev.stat().st_mtime_ns
    os.utime(dev, ns=(mtime, mtime + 1))  # touched since: that lmlab could not tell, neither can this one
    with pytest.raises(LmlabError) as e:
        finetune(start, "sst2", train, dev, out, resume=True, **SMALL, progress=False, log=said.append)
    line = _one_readable_line(e.value)
    assert "an earlier lmlab" in line and f"--dev {dev}" in line and f"delete {resume_dir(out)}" in line
    os.utime(dev, ns=(mtime, mtime))
    res = finetune(start, "sst2", train, dev, out, resume=True, **SMALL, progress=False, log=said.append)
    assert res.steps == 4 and any("written by an earlier lmlab" in m for m in said)
    assert not resume_dir(out).exists()


def test_an_output_taken_while_the_run_trains_keeps_the_work_and_says_how_to_resume(start, small, tmp_path,
                                                                                   monkeypatch):
    """Something else made OUT while the run trained: the run keeps its last state (the advice used
    to be a new --out, which starts over and leaves the state behind); moved away, --resume writes
    the output the uninterrupted run writes."""
    import os

    whole = tmp_path / "whole"
    finetune(start, "sst2", *small, whole, **SMALL, **QUIET)
    out = tmp_path / "ft"
    original = Engine.step

    def step(engine, i, *a, **k):
        if i == 2:  # after the state saved at step 2: the steps since are kept too
            out.mkdir()
            (out / "theirs.txt").write_text("theirs")
        return original(engine, i, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Engine, "step", step)
        with pytest.raises(LmlabError) as e:
            finetune(start, "sst2", *small, out, **SMALL, **QUIET)
    line = _one_readable_line(e.value)
    assert f"mv {out} {out}.other" in e.value.fix and "--resume" in e.value.fix and "new --out" not in line
    assert (out / "theirs.txt").read_text() == "theirs" and saved_state(out).name == "step_4"
    os.replace(out, tmp_path / "ft.other")
    res = finetune(start, "sst2", *small, out, resume=True, **SMALL, **QUIET)
    assert res.steps == 4 and not resume_dir(out).exists()
    a, b = load_file(whole / "model.safetensors"), load_file(out / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert (out / "eval.json").read_text() == (whole / "eval.json").read_text() and rows(out) == rows(whole)
    assert (tmp_path / "ft.other" / "theirs.txt").read_text() == "theirs"


def test_an_output_taken_after_an_interrupted_run_says_to_move_it_not_to_start_over(start, small, tmp_path,
                                                                                    monkeypatch):
    out = tmp_path / "ft"
    _interrupt(monkeypatch, start, "sst2", *small, out)
    out.mkdir()
    (out / "theirs.txt").write_text("theirs")
    for resume in (True, False):
        with pytest.raises(LmlabError) as e:
            finetune(start, "sst2", *small, out, resume=resume, **SMALL, **QUIET)
        assert f"mv {out} {out}.other" in e.value.fix and "new --out" not in e.value.fix
        assert saved_state(out) is not None and (out / "theirs.txt").read_text() == "theirs"


def test_a_file_where_the_resume_state_goes_is_named_as_the_obstacle(start, sst2, tmp_path):
    out = tmp_path / "ft2"
    resume_dir(out).write_text("mine")  # .ft2.resume, a file of yours
    with pytest.raises(LmlabError) as e:
        finetune(start, "sst2", *sst2, out, **HP, **QUIET)
    assert str(resume_dir(out)) in e.value.problem and "resume state" in e.value.problem
    assert "--out" not in e.value.fix.replace(f"--out {out}", "") and "move" in e.value.fix
    assert resume_dir(out).read_text() == "mine" and not out.exists()

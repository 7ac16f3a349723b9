"""SIGTERM and SIGINT stop every command the same way (lmlab.stopping, docs/safety.md "Stopping"):
what it was writing is removed (the training loops first finish the step and save), then one line,
``error: stopped by SIGTERM; <fix>``, and exit 128 + the signal. Pretraining, the demo and
fine-tuning once ended with two lines and exit 130 ("interrupted") for either signal."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmlab.cli import main
from lmlab.finetune.resume import resume_dir
from lmlab.stopping import RESUME, START_AGAIN, Stopped, StopRequests
from lmlab.train.engine import Engine

STOP_SAID = re.compile(r"stopped (by|after)|^interrupted")  # the old second line: "SIGTERM: stopped after"
ROOT = Path(__file__).resolve().parents[1]
TEXT = "to be or not to be, that is the question; whether tis nobler in the mind to suffer\n\n" * 40
ROWS = [("a fine and moving film", 1), ("dull , lifeless and far too long", 0), ("a joy to watch", 1),
        ("nothing works here", 0)] * 4


def _signal_in_second_step(monkeypatch, signum: int) -> None:
    """The signal arrives while the command takes its second optimizer step (any training loop)."""
    real = Engine.step

    def step(engine, i, *a, **k):
        if i == 1:
            os.kill(os.getpid(), signum)
        return real(engine, i, *a, **k)

    monkeypatch.setattr(Engine, "step", step)


def _stopped_line(capsys, signum: int, fix: str) -> str:
    """stderr ends in the one ``error: stopped by ...; fix`` line, and says the stop nowhere else."""
    err = capsys.readouterr().err.strip().splitlines()
    name = signal.Signals(signum).name
    assert err and err[-1].startswith(f"error: stopped by {name}; {fix}"), err[-5:]
    assert not [line for line in err[:-1] if STOP_SAID.search(line)], err[-5:]
    return err[-1]


@pytest.fixture()
def files(tmp_path):
    """A tiny GPT-2 checkpoint, an SST-2-shaped TSV, preference pairs and a text corpus."""
    import torch

    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer("bytelevel", [TEXT], vocab_size=280)
    ck = tmp_path / "ck"
    build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, max_positions=64)).save(ck, tokenizer=tok)
    tsv = tmp_path / "sst2.tsv"
    tsv.write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in ROWS), encoding="utf-8")
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text("".join(json.dumps({"prompt": "Hi", "chosen": " good", "rejected": " bad"}) + "\n"
                             for _ in range(8)), encoding="utf-8")
    corpus = tmp_path / "corpus.txt"
    corpus.write_text(TEXT, encoding="utf-8")
    held_out = tmp_path / "held-out.txt"  # data.val may not be a file data.train reads
    held_out.write_text(TEXT, encoding="utf-8")
    tok.save(tmp_path / "tok")
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(f"""
[model]
preset = "gpt2-tiny"
d_model = 32
n_layers = 1
n_heads = 2
d_ff = 64
max_positions = 64
[objective]
name = "clm"
[data]
train = [{json.dumps(str(corpus))}]
tokenizer = {json.dumps(str(tmp_path / "tok"))}
val = [{json.dumps(str(held_out))}]
[train]
max_steps = 100000
batch_size = 2
seq_len = 32
eval_every = 100000
eval_batches = 1
checkpoint_every = 100000
threads = 1
progress = "off"
""", encoding="utf-8")
    return {"ck": ck, "tsv": tsv, "prefs": prefs, "corpus": corpus, "recipe": recipe, "root": tmp_path}


FINETUNE = ["--task", "sst2", "--max-steps", "100000", "--batch-size", "2", "--threads", "1", "--no-progress"]


def _command(name: str, f: dict, out: Path) -> list[str]:
    if name == "pretrain":
        return ["pretrain", "--config", str(f["recipe"]), "--out", str(out)]
    if name == "finetune":
        return ["finetune", "--checkpoint", str(f["ck"]), *FINETUNE, "--train", str(f["tsv"]),
                "--dev", str(f["tsv"]), "--out", str(out)]
    if name == "align":
        return ["align", "--method", "dpo", "--checkpoint", str(f["ck"]), "--max-steps", "100000",
                "--batch-size", "2", "--threads", "1", "--no-progress", "--train", str(f["prefs"]),
                "--dev", str(f["prefs"]), "--out", str(out)]
    raise AssertionError(name)


# ------------------------------------------------------------------------- every long command
@pytest.mark.parametrize(("command", "signum", "fix"), [
    ("pretrain", signal.SIGTERM, RESUME),
    ("pretrain", signal.SIGINT, RESUME),
    ("finetune", signal.SIGTERM, RESUME),
    ("align", signal.SIGINT, RESUME),  # DPO keeps its resume state too
])
def test_a_stopped_training_command_says_one_line_and_exits_128_plus_the_signal(
        command, signum, fix, files, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    _signal_in_second_step(monkeypatch, signum)
    assert main(_command(command, files, out)) == 128 + signum
    line = _stopped_line(capsys, signum, fix)
    if fix == RESUME:  # the step finished and was saved first: the same command and --resume go on
        assert "step 2" in line
        saved = out / "checkpoints" if command == "pretrain" else resume_dir(out) / "checkpoints"
        assert [p.name for p in saved.iterdir() if not p.name.startswith(".")] == ["step_2"]
    else:  # nothing half-written is left: not the output, not its live log beside it
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "ck", "corpus.txt", "held-out.txt", "prefs.jsonl", "sst2.tsv", "tiny.toml", "tok"]


def test_a_stopped_distillation_says_one_line_and_leaves_nothing(files, tmp_path, monkeypatch, capsys):
    teacher = tmp_path / "teacher"
    args = ["finetune", "--checkpoint", str(files["ck"]), *FINETUNE, "--train", str(files["tsv"]),
            "--dev", str(files["tsv"]), "--out", str(teacher)]
    args[args.index("100000")] = "1"
    assert main(args) == 0
    capsys.readouterr()
    _signal_in_second_step(monkeypatch, signal.SIGTERM)
    out = tmp_path / "small"
    assert main(["compress", "distill", "--teacher", str(teacher), "--train", str(files["tsv"]),
                 "--layers", "1", "--steps", "100000", "--batch-size", "2", "--threads", "1",
                 "--out", str(out)]) == 143
    _stopped_line(capsys, signal.SIGTERM, START_AGAIN)
    assert not out.exists() and not list(tmp_path.glob(".small*"))


def test_a_stopped_demo_says_one_line_and_how_to_start_over(tmp_path, monkeypatch, capsys):
    _signal_in_second_step(monkeypatch, signal.SIGTERM)
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--steps", "100000", "--vocab-size", "300",
                 "--device", "cpu"]) == 143
    _stopped_line(capsys, signal.SIGTERM, "run the same command again (the demo starts over)")


def test_a_stopped_tokenizer_training_says_one_line(files, tmp_path, monkeypatch, capsys):
    import lmlab.cli.tokenizer as cli_tokenizer

    real = cli_tokenizer.iter_text_lines

    def lines_then_terminated(*a, **k):
        for i, line in enumerate(real(*a, **k)):
            if i == 5:
                os.kill(os.getpid(), signal.SIGTERM)
            yield line

    monkeypatch.setattr(cli_tokenizer, "iter_text_lines", lines_then_terminated)
    out = tmp_path / "newtok"
    assert main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "300", "--input",
                 str(files["corpus"]), "--out", str(out)]) == 143
    _stopped_line(capsys, signal.SIGTERM, START_AGAIN)
    assert not out.exists() and not list(tmp_path.glob(".newtok*"))


def test_a_stopped_comparison_says_one_line_and_how_to_resume(data_dir, tmp_path, monkeypatch, capsys):
    from lmlab.train.config import to_toml

    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20_000]
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    grid = {"name": "stop", "seeds": [0], "budget": {"tokens": 256_000},
            "pretrain": {"data": {"train": [str(tmp_path / "train.txt")], "val_fraction": 0.1,
                                  "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                         "train": {"batch_size": 8, "seq_len": 32, "eval_batches": 1, "threads": 1},
                         "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ff": 64,
                                   "max_positions": 64}},
            "arms": [{"name": "clm", "preset": "gpt2-tiny", "objective": "clm"}],
            "finetune": {"epochs": 1, "batch_size": 16, "lr": 1e-3, "max_length": 32, "threads": 1},
            "tasks": [{"task": "sst2", "train": str(data_dir / "glue/sst2/train.tsv"),
                       "dev": str(data_dir / "glue/sst2/dev.tsv"), "max_train_examples": 16,
                       "max_eval_examples": 16}]}
    (tmp_path / "grid.toml").write_text(to_toml(grid), encoding="utf-8")
    _signal_in_second_step(monkeypatch, signal.SIGTERM)
    assert main(["compare", "--config", str(tmp_path / "grid.toml"), "--out", str(tmp_path / "out"),
                 "--progress", "off"]) == 143
    _stopped_line(capsys, signal.SIGTERM, "run the same command again to resume; finished runs are kept")


# ------------------------------------------------------------------------- a real process, a real kill
def test_sigterm_to_a_running_pretraining_process(files, tmp_path):
    signum = signal.SIGTERM
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "lmlab.cli", "pretrain", "--config", str(files["recipe"]),
                             "--out", str(out), "--set", "train.log_every=1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    deadline = time.time() + 60
    while time.time() < deadline and not (out / "metrics.jsonl").is_file():  # training has started
        time.sleep(0.1)
    time.sleep(0.5)
    proc.send_signal(signum)
    err = proc.communicate(timeout=60)[1].strip().splitlines()
    assert proc.returncode == 128 + signum, err[-5:]
    name = signal.Signals(signum).name
    assert err[-1].startswith(f"error: stopped by {name}; {RESUME} (step "), err[-5:]
    assert not [line for line in err[:-1] if STOP_SAID.search(line)], err[-5:]


# ------------------------------------------------------------------------- the pieces
def test_a_second_signal_stops_at_once_with_the_same_one_line():
    with StopRequests() as stop:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == "SIGTERM"
        with pytest.raises(Stopped) as e:
            os.kill(os.getpid(), signal.SIGTERM)
    assert e.value.exit_code == 143 and e.value.message == f"stopped by SIGTERM; {RESUME}"


def test_a_bare_keyboard_interrupt_is_a_sigint(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("lmlab.cli.demo.run", interrupted)
    assert main(["demo"]) == 130
    _stopped_line(capsys, signal.SIGINT, START_AGAIN)

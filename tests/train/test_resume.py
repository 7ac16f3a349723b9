"""Checkpoints: exact resume, atomic writes, loadable models, run-directory outputs."""

from __future__ import annotations

import errno
import json
import math

import pytest

from lmlab.errors import LmlabError
from lmlab.train import pretrain
from lmlab.train.checkpoint import list_checkpoints


def _losses(run_dir):
    return {r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines())}


def test_interrupted_and_resumed_run_repeats_the_uninterrupted_one(tiny_config, tmp_path):
    quiet = lambda m: None  # noqa: E731
    full = pretrain(tiny_config(max_steps=8), tmp_path / "full", log=quiet)
    # "killed" after step 4: the run stops there (its checkpoint at 4 is the newest one)
    pretrain(tiny_config(max_steps=4), tmp_path / "part", log=quiet)
    # pretend it died after logging steps it never checkpointed: resume must drop them
    with open(tmp_path / "part" / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"step": 5, "tokens": 0, "loss": 123.0, "lr": 0.0}) + "\n")
    resumed = pretrain(tiny_config(max_steps=8), tmp_path / "part", resume=True, log=quiet)
    a, b = _losses(tmp_path / "full"), _losses(tmp_path / "part")
    assert sorted(a) == sorted(b) == list(range(1, 9))
    for step in a:
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], abs=1e-6), step
        assert b[step]["lr"] == a[step]["lr"]
        assert b[step]["tokens"] == a[step]["tokens"]
    assert b[8]["val_loss"] == pytest.approx(a[8]["val_loss"], abs=1e-6)
    assert resumed["val_loss"] == pytest.approx(full["val_loss"], abs=1e-6)
    # the learning rate really changed over the run and the loss really moved (the check can fail)
    assert a[1]["lr"] != a[8]["lr"] and a[1]["loss"] != a[8]["loss"]


def test_run_directory_contents_and_loadable_checkpoint(tiny_config, tmp_path):
    from lmlab.loading import load_model

    run = tmp_path / "run"
    s = pretrain(tiny_config(max_steps=4, checkpoint_every=2, keep_checkpoints=1), run, log=lambda m: None)
    assert (run / "config.toml").is_file() and (run / "loss.png").stat().st_size > 1000
    assert (run / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all({"step", "tokens", "loss", "lr", "grad_norm"} <= set(r) for r in rows)
    assert {"val_loss", "val_ppl", "val_bpb"} <= set(rows[3])
    assert rows[3]["val_ppl"] == pytest.approx(math.exp(rows[3]["val_loss"]), rel=1e-12)
    assert [step for step, _ in list_checkpoints(run)] == [4]  # keep_checkpoints=1 pruned step 2
    model = load_model(run / "checkpoints" / "step_4")
    assert model.tokenizer is not None and model.config.n_layers == 1
    assert not any(p.name.startswith(".") for p in (run / "checkpoints").iterdir())
    assert s["steps"] == 4 and s["tokens"] == 4 * 4 * 32


def test_failed_checkpoint_write_keeps_the_previous_one(tiny_config, tmp_path, monkeypatch):
    import lmlab.train.checkpoint as ck

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    before = {p.name: p.read_bytes() for p in (run / "checkpoints" / "step_2").rglob("*") if p.is_file()}
    real = ck.save_file

    def disk_full(tensors, path, metadata=None):
        real(tensors, path, metadata=metadata)  # a partial file exists when the disk fills up
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ck, "save_file", disk_full)
    with pytest.raises(LmlabError) as e:
        pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, resume=True, log=lambda m: None)
    msg = str(e.value)
    assert "disk is full" in msg and "step_2" in msg and "--resume" in msg and "\n" not in msg
    assert [s for s, _ in list_checkpoints(run)] == [2]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]  # no temporary leftovers
    after = {p.name: p.read_bytes() for p in (run / "checkpoints" / "step_2").rglob("*") if p.is_file()}
    assert after == before
    monkeypatch.setattr(ck, "save_file", real)
    s = pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, resume=True, log=lambda m: None)
    assert s["steps"] == 4


def test_new_run_refuses_a_directory_with_checkpoints(tiny_config, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=1), run, log=lambda m: None)
    with pytest.raises(LmlabError, match="--resume"):
        pretrain(tiny_config(max_steps=2), run, log=lambda m: None)
    with pytest.raises(LmlabError, match="model.d_model"):
        bad = tiny_config(max_steps=2)
        bad["model"]["d_model"] = 64
        pretrain(bad, run, resume=True, log=lambda m: None)


def test_two_runs_into_one_directory_are_refused_and_a_dead_holder_frees_it(tiny_config, tmp_path):
    import subprocess
    import sys

    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time\nfrom lmlab.fileio import directory_lock\n"
         f"with directory_lock({str(run)!r}):\n    print('held', flush=True)\n    time.sleep(60)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LmlabError, match=f"run directory {run} is in use by lmlab process {holder.pid}"):
            pretrain(tiny_config(max_steps=2), run, log=lambda m: None)
        assert not (run / "metrics.jsonl").exists()
    finally:
        holder.kill()  # like kill -9: the lock dies with its process
        holder.wait()
    s = pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    assert s["steps"] == 2


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_what_a_killed_run_left_is_cleaned_at_the_next_start(tiny_config, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    pid = _dead_pid()
    junk = [run / "checkpoints" / f".step_4.tmp-{pid}-abc", run / "data" / f".train.tmp-{pid}-xyz"]
    import json

    from lmlab.ownership import TEMPORARY_MARKER, mark_aside, seal, start_temporary

    for d in junk:  # lmlab's temporaries carry a manifest naming them and their process
        d.mkdir(parents=True)
        start_temporary(d, "checkpoint", pid=pid)
        (d / "model.safetensors").write_bytes(b"\0" * 1000)
    pruned = run / "checkpoints" / f".step_2.prune-{pid}"  # a checkpoint being deleted, marked
    pruned.mkdir()
    (pruned / "model.safetensors").write_bytes(b"\0" * 1000)
    seal(pruned, "checkpoint")
    mark_aside(pruned, pruned.name)
    marker = pruned / TEMPORARY_MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": pid}))
    config_tmp = run / f".config.toml.tmp-{pid}-q"
    config_tmp.mkdir()
    start_temporary(config_tmp, "file", pid=pid)
    (config_tmp / "config.toml").write_text("half")
    s = pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, resume=True, log=lambda m: None)
    assert s["steps"] == 4
    assert not [p for p in run.rglob(".*") if p.name not in (".lock", ".lmlab-manifest.json")]


def test_pruning_never_leaves_a_checkpoint_that_looks_complete(tiny_config, tmp_path, monkeypatch):
    from lmlab import ownership

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    real = ownership.remove_temporary

    def killed(path, *a, **k):  # the process dies right after the rename, before deleting anything
        if ".prune-" in str(path):
            raise KeyboardInterrupt
        return real(path, *a, **k)

    monkeypatch.setattr(ownership, "remove_temporary", killed)
    with pytest.raises(KeyboardInterrupt):
        pretrain(tiny_config(max_steps=4, checkpoint_every=2, keep_checkpoints=1), run, resume=True,
                 log=lambda m: None)
    monkeypatch.setattr(ownership, "remove_temporary", real)
    assert [s for s, _ in list_checkpoints(run)] == [4]  # step_2 is gone as a whole, not half
    s = pretrain(tiny_config(max_steps=6, checkpoint_every=2, keep_checkpoints=1), run, resume=True,
                 log=lambda m: None)
    hidden = [p for p in (run / "checkpoints").glob(".*") if p.name != ".lmlab-manifest.json"]
    assert s["steps"] == 6 and not hidden


def test_sigterm_writes_a_checkpoint_and_resume_loses_no_step(tiny_config, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    run = tmp_path / "run"
    cfg = tiny_config(max_steps=100000, checkpoint_every=100000, log_every=1)
    code = ("import sys, json; from lmlab.train import pretrain\n"
            f"pretrain(json.loads(sys.argv[1]), {str(run)!r})")
    proc = subprocess.Popen([sys.executable, "-c", code, json.dumps(cfg)], stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and not (run / "metrics.jsonl").is_file():
        time.sleep(0.2)
    while time.time() < deadline and len((run / "metrics.jsonl").read_text().splitlines()) < 2:
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    err = proc.communicate(timeout=120)[1]
    last = err.strip().splitlines()[-1]
    assert proc.returncode != 0, err[-2000:]
    assert "stopped by SIGTERM; continue with the same command and --resume" in last, err[-2000:]
    (step, _), = list_checkpoints(run)
    assert step >= 2
    s = pretrain(tiny_config(max_steps=step + 1, checkpoint_every=100000), run, resume=True,
                 log=lambda m: None)
    assert s["steps"] == step + 1
    assert not [p for p in run.rglob(".*") if p.name not in (".lock", ".lmlab-manifest.json")]


def test_overriding_the_training_text_warns_that_validation_is_the_recipes(tiny_config, tiny_data, tmp_path):
    said: list[str] = []
    pretrain(tiny_config(max_steps=1, checkpoint_every=1), tmp_path / "run", log=said.append,
             overrides=[f"data.train=[{str(tiny_data['train'])!r}]"])
    warning = [m for m in said if m.startswith("warning: data.train was set")]
    assert len(warning) == 1 and str(tiny_data["val"]) in warning[0]
    said.clear()
    pretrain(tiny_config(max_steps=1, checkpoint_every=1), tmp_path / "run2", log=said.append,
             overrides=[f"data.train=[{str(tiny_data['train'])!r}]", f"data.val=[{str(tiny_data['val'])!r}]"])
    assert not [m for m in said if m.startswith("warning")]


def test_without_a_terminal_progress_is_a_line_every_few_steps_not_a_bar(tiny_config, tmp_path, capsys):
    said: list[str] = []
    cfg = tiny_config(max_steps=40, checkpoint_every=40)
    cfg["train"]["progress"] = "auto"
    pretrain(cfg, tmp_path / "run", log=said.append)
    lines = [m for m in said if m.startswith("step ") and "/40: loss" in m and "s left" in m]
    assert [m.split("/")[0] for m in lines] == [f"step {s}" for s in range(2, 40, 2)]
    assert "\r" not in capsys.readouterr().err  # no bar frames in a log file


def test_resuming_on_shards_of_another_tokenizer_of_the_same_size_is_refused(tiny_config, tiny_data, tmp_path,
                                                                             shakespeare):
    from lmlab.data import prepare_shards
    from lmlab.tokenizers import train_tokenizer

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    other = train_tokenizer("bytelevel", shakespeare[-60_000:].splitlines(keepends=True), vocab_size=320)
    other.save(tmp_path / "tok")
    prepare_shards(tmp_path / "tok", [tiny_data["root"] / "train.txt"], tmp_path / "shards", workers=1,
                   progress=False)
    prepare_shards(tmp_path / "tok", [tiny_data["root"] / "val.txt"], tmp_path / "val_shards", workers=1,
                   progress=False)
    cfg = tiny_config(max_steps=4, checkpoint_every=2)
    cfg["data"] = {"train": [str(tmp_path / "shards")], "val": [str(tmp_path / "val_shards")]}
    with pytest.raises(LmlabError, match="trained with another tokenizer"):
        pretrain(cfg, run, resume=True, log=lambda m: None)


@pytest.mark.parametrize("field, value", [("step", "two"), ("data_position", -5), ("tokens", 1.5),
                                          ("optimizer", []), ("step", 3)])
def test_a_crafted_train_state_is_one_line_not_a_traceback(tiny_config, tmp_path, field, value):
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    state = run / "checkpoints" / "step_2" / "train_state.json"
    data = json.loads(state.read_text())
    data[field] = value
    state.write_text(json.dumps(data))
    with pytest.raises(LmlabError, match=f"train_state.json: {field}: "):
        pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, resume=True, log=lambda m: None)


def test_a_file_name_that_is_not_utf8_is_kept_in_the_shards_index(tmp_path, tiny_data):
    import os

    from lmlab.data import TokenShards, prepare_shards

    name = os.fsdecode(b"caf\xe9.txt")  # Latin-1 bytes in a name: a lone surrogate in Python
    (tmp_path / name).write_text("some text to tokenise\n" * 20)
    prepare_shards(tiny_data["tokenizer"], [tmp_path / name], tmp_path / "shards", workers=1, progress=False)
    assert TokenShards(tmp_path / "shards", "train").num_tokens > 0
    index = json.loads((tmp_path / "shards" / "index.json").read_text())
    assert os.fsencode(index["inputs"][0]["path"]).endswith(b"caf\xe9.txt")


def _cut_in_half(path) -> bytes:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return data[: len(data) // 2]


def test_a_damaged_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(
    tiny_config, tmp_path):
    quiet = lambda m: None  # noqa: E731
    full = pretrain(tiny_config(max_steps=6, checkpoint_every=2), tmp_path / "full", log=quiet)
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, log=quiet)
    kept = _cut_in_half(run / "checkpoints" / "step_4" / "model.safetensors")  # a copy cut short
    said: list[str] = []
    resumed = pretrain(tiny_config(max_steps=6, checkpoint_every=2), run, resume=True, log=said.append)
    assert any("skipping the damaged checkpoint step_4" in m and "using step_2" in m for m in said), said
    # the damaged folder is kept, renamed (no longer a checkpoint), its files as they were
    aside = run / "checkpoints" / "step_4.damaged"
    assert (aside / "model.safetensors").read_bytes() == kept
    assert [s for s, _ in list_checkpoints(run)] == [2, 4, 6]
    # steps 3-6 were trained again from step 2: the run equals the uninterrupted one
    a, b = _losses(tmp_path / "full"), _losses(run)
    assert sorted(a) == sorted(b) == list(range(1, 7))
    for step in a:
        assert b[step]["loss"] == pytest.approx(a[step]["loss"], abs=1e-6), step
    assert resumed["val_loss"] == pytest.approx(full["val_loss"], abs=1e-6)


@pytest.mark.parametrize("damage", ["truncated weights", "missing weights", "broken config", "broken state"])
def test_a_run_directory_stands_for_its_newest_intact_checkpoint(tiny_config, tmp_path, damage):
    from lmlab.train.checkpoint import checkpoint_damage, latest_checkpoint

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, log=lambda m: None)
    newest = run / "checkpoints" / "step_4"
    assert checkpoint_damage(newest) is None
    if damage == "truncated weights":
        _cut_in_half(newest / "model.safetensors")
    elif damage == "missing weights":
        (newest / "model.safetensors").unlink()
    elif damage == "broken config":
        (newest / "config.json").write_bytes(b"\xff\xfe not JSON")
    else:
        (newest / "train_state.json").write_text('{"step": 4, "tok', encoding="utf-8")
    said: list[str] = []
    assert checkpoint_damage(newest) is not None
    assert latest_checkpoint(run, said.append) == run / "checkpoints" / "step_2"
    assert len(said) == 1 and "step_4" in said[0], said
    assert latest_checkpoint(run, said.append) == run / "checkpoints" / "step_2"
    assert len(said) == 1  # named once


def test_loading_a_run_directory_skips_a_damaged_newest_checkpoint(tiny_config, tmp_path, capsys):
    from lmlab.cli import main

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, log=lambda m: None)
    (run / "checkpoints" / "step_4" / "model.safetensors").unlink()
    capsys.readouterr()
    assert main(["generate", "--checkpoint", str(run), "--prompt", "To be", "--max-new-tokens", "3"]) == 0
    err = capsys.readouterr().err
    assert "skipping the damaged checkpoint step_4" in err and "step_2" in err, err


def test_a_run_whose_every_checkpoint_is_damaged_is_one_line_on_resume(tiny_config, tmp_path, capsys):
    from assertions import assert_one_line_error

    from lmlab.cli import main

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, log=lambda m: None)
    for step in (2, 4):
        _cut_in_half(run / "checkpoints" / f"step_{step}" / "train_state.safetensors")
    capsys.readouterr()
    config = run / "config.toml"
    assert main(["pretrain", "--config", str(config), "--out", str(run), "--resume"]) == 2
    assert_one_line_error(capsys, "no checkpoint of", "can be read back", "corrupt or truncated",
                          "move", "aside to start over")
    assert [s for s, _ in list_checkpoints(run)] == [2, 4]  # nothing renamed, nothing deleted


def test_pruning_keeps_a_checkpoint_that_holds_your_file(tiny_config, tmp_path):
    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=4, checkpoint_every=2, keep_checkpoints=2), run, log=lambda m: None)
    (run / "checkpoints" / "step_2" / "NOTES.md").write_text("mine", encoding="utf-8")
    pretrain(tiny_config(max_steps=8, checkpoint_every=2, keep_checkpoints=2), run, resume=True,
             log=lambda m: None)
    assert (run / "checkpoints" / "step_2" / "NOTES.md").read_text(encoding="utf-8") == "mine"
    assert [s for s, _ in list_checkpoints(run)] == [2, 6, 8]  # step_4 (lmlab's alone) was pruned


def test_resume_compares_the_data_and_the_tokenizer_by_content(tiny_config, tiny_data, tmp_path, shakespeare):
    """The text written again (a new time) is the same data: no word; other text at the same path
    is said (it was resumed on silently); another tokenizer in the same folder is refused before
    anything is tokenised."""
    import shutil

    from lmlab.tokenizers import train_tokenizer

    train, tok, run = tmp_path / "train.txt", tmp_path / "tok", tmp_path / "run"
    train.write_text(shakespeare[:30_000], encoding="utf-8")
    shutil.copytree(tiny_data["tokenizer"], tok)

    def go(steps: int) -> list[str]:
        cfg = tiny_config(max_steps=steps, checkpoint_every=2)
        cfg["data"] = {"train": [str(train)], "val": [str(tiny_data["val"])], "tokenizer": str(tok)}
        said: list[str] = []
        pretrain(cfg, run, resume=steps > 2, log=said.append)
        return said

    go(2)
    train.write_text(shakespeare[:30_000], encoding="utf-8")  # the same text, written again
    assert not [m for m in go(4) if m.startswith("warning")]
    train.write_text(shakespeare[30_000:60_000], encoding="utf-8")
    warned = [m for m in go(6) if m.startswith("warning")]
    assert warned == ["warning: resuming on changed data: data.train holds other contents than when the run "
                      "started (train.txt differs): the continued run will differ from an uninterrupted one"]
    shutil.rmtree(tok)
    train_tokenizer("bytelevel", shakespeare[-60_000:].splitlines(keepends=True), vocab_size=320).save(tok)
    with pytest.raises(LmlabError) as e:
        go(8)
    assert str(e.value).startswith("--resume on another tokenizer than the run was started with: "
                                   "data.tokenizer holds other contents than when the run started (")
    assert list_checkpoints(run)[-1][0] == 6  # nothing was resumed


def test_a_checkpoint_folder_taken_while_the_run_trains_says_to_move_it_and_resume(tiny_config, tmp_path,
                                                                                  monkeypatch):
    """The advice kept the run's work: a new --out (what it used to say) would start over."""
    import os

    from lmlab.train.engine import Engine

    run = tmp_path / "run"
    taken = run / "checkpoints" / "step_4"
    original = Engine.step

    def step(engine, i, *a, **k):
        if i == 2:  # after the checkpoint at step 2, something else takes step_4's place
            taken.mkdir()
            (taken / "theirs.txt").write_text("theirs")
        return original(engine, i, *a, **k)

    with monkeypatch.context() as m:
        m.setattr(Engine, "step", step)
        with pytest.raises(LmlabError) as e:
            pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, log=lambda m: None)
    assert f"mv {taken} {taken}.other" in e.value.fix and "--resume" in e.value.fix
    assert "new --out" not in e.value.fix and (taken / "theirs.txt").read_text() == "theirs"
    os.replace(taken, tmp_path / "theirs")
    s = pretrain(tiny_config(max_steps=4, checkpoint_every=2), run, resume=True, log=lambda m: None)
    assert s["steps"] == 4 and [step for step, _ in list_checkpoints(run)] == [2, 4]


def test_a_run_copied_with_cp_r_resumes(tiny_config, tmp_path):
    import shutil

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    copy = tmp_path / "copy"
    shutil.copytree(run, copy, copy_function=shutil.copyfile)  # cp -r: the same bytes, new times
    s = pretrain(tiny_config(max_steps=4, checkpoint_every=2), copy, resume=True, log=lambda m: None)
    assert s["steps"] == 4
    with open(copy / "config.toml", "a") as f:
        f.write("# my note\n")  # edited since: the user's, named, and the fix keeps the run's work
    with pytest.raises(LmlabError) as e:
        pretrain(tiny_config(max_steps=6, checkpoint_every=2), copy, resume=True, log=lambda m: None)
    assert "config.toml" in e.value.problem
    assert "new --out" not in e.value.fix and "same command" in e.value.fix


def test_a_resume_with_max_steps_below_the_runs_step_is_refused_before_any_work(tiny_config, tmp_path,
                                                                                capsys):
    """It trained nothing, said "trained 2 steps" and rewrote config.toml to a max_steps the run was
    already past; now one line says to raise train.max_steps. Equal to the step, a finished run is
    resumed (nothing to train, as a grid's re-run does)."""
    from assertions import assert_one_line_error

    from lmlab.cli import main

    run = tmp_path / "run"
    pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, log=lambda m: None)
    before = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"}
    capsys.readouterr()
    assert main(["pretrain", "--out", str(run), "--resume", "--set", "train.max_steps=1"]) == 2
    assert_one_line_error(capsys, "train.max_steps 1 is below step 2", "nothing was trained",
                          "set train.max_steps to 2 or more")
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file() and p.name != ".lock"} == before
    again = pretrain(tiny_config(max_steps=2, checkpoint_every=2), run, resume=True, log=lambda m: None)
    assert again["steps"] == 2  # resumed at its last step: nothing to train, not refused

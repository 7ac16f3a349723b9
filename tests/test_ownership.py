"""Nothing lost, by construction (lmlab.ownership): every command replaces or deletes only what its
manifest proves lmlab wrote. Each case here deleted or overwrote a user's files before the manifest
(a marker file such as ``config.json`` was taken as proof of ownership)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lmlab import ownership
from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir
from lmlab.tokenizers import train_tokenizer


def _one_line_error(capsys, *needles):
    from assertions import assert_one_line_error

    return assert_one_line_error(capsys, *needles)


def _snapshot(folder: Path) -> dict[str, bytes]:
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in files}


@pytest.fixture()
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text("to be or not to be, that is the question\n\n" * 60, encoding="utf-8")
    return p


def _user_folder(path: Path, files: dict[str, str]) -> dict[str, bytes]:
    for name, text in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_text(text)
    return _snapshot(path)


# ------------------------------------------------------------------- folders that merely look like ours
def test_export_refuses_a_project_folder_that_holds_a_config_json(ckpt, tmp_path, capsys):
    project = tmp_path / "project"
    before = _user_folder(project, {"config.json": "{}", "main.py": "print(1)", "src/app.py": "x = 1"})
    assert main(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(project)]) == 2
    _one_line_error(capsys, "was not written by lmlab", "nothing was written")
    assert _snapshot(project) == before


def test_tokenizer_train_refuses_a_hugging_face_model_folder(corpus, tmp_path, capsys):
    hf = tmp_path / "hf-model"
    before = _user_folder(hf, {"tokenizer.json": "{}", "model.safetensors": "weights", "config.json": "{}",
                               "README.md": "# my model"})
    assert main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input", str(corpus),
                 "--out", str(hf)]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    assert _snapshot(hf) == before


def test_data_prepare_refuses_a_folder_with_an_index_json(corpus, tmp_path, capsys):
    tok = tmp_path / "tok"
    train_tokenizer("bytelevel", [corpus.read_text()], vocab_size=280).save(tok)
    site = tmp_path / "site"
    before = _user_folder(site, {"index.json": "[]", "page.html": "<html></html>"})
    assert main(["data", "prepare", "--tokenizer", str(tok), "--input", str(corpus), "--out", str(site)]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    assert _snapshot(site) == before


def test_pretrain_refuses_an_unrelated_folder_with_a_config_toml(tmp_path, capsys):
    folder = tmp_path / "experiment"
    before = _user_folder(folder, {"config.toml": "[mine]\nx = 1\n", "metrics.jsonl": '{"acc": 0.9}\n'})
    assert main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(folder),
                 "--set", "train.max_steps=1"]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    assert _snapshot(folder) == before


def test_demo_refuses_a_folder_that_is_not_a_demo(tmp_path, capsys):
    folder = tmp_path / "work"
    before = _user_folder(folder, {"run/thesis.txt": "three years", "train.txt": "my data"})
    assert main(["demo", "--out", str(folder), "--steps", "2", "--vocab-size", "300"]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    assert _snapshot(folder) == before


def test_scale_fit_refuses_a_users_fit_json_and_an_input_run_as_out(tmp_path, capsys):
    folder = tmp_path / "analysis"
    before = _user_folder(folder, {"fit.json": '{"mine": true}'})
    run = tmp_path / "run"
    run.mkdir()
    assert main(["scale", "fit", str(run), "--out", str(folder)]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    assert _snapshot(folder) == before
    assert main(["scale", "fit", str(run), "--out", str(run)]) == 2
    _one_line_error(capsys, "would replace the input")


def test_compare_refuses_a_folder_with_a_users_plan_json(tmp_path, capsys):
    from lmlab.lab import runner
    from lmlab.lab.grid_records import GRID_KIND

    folder = tmp_path / "plans"
    before = _user_folder(folder, {"plan.json": '{"mine": true}'})
    with pytest.raises(LmlabError, match="was not written by lmlab"):
        ownership.claim_dir(folder, GRID_KIND, runner.GRID_ENTRIES)
    assert _snapshot(folder) == before


def test_predictions_replace_only_a_file_lmlab_wrote(tmp_path):
    from lmlab.fileio import write_output_file
    from lmlab.finetune.loop import PREDICTIONS_KIND, check_predictions_file

    theirs = tmp_path / "theirs.jsonl"
    theirs.write_text('{"prediction": "my own annotations"}\n')
    with pytest.raises(LmlabError, match="was not written by lmlab"):
        check_predictions_file(theirs, {})
    ours = tmp_path / "ours.jsonl"
    write_output_file(ours, '{"prediction": 1}\n', PREDICTIONS_KIND, "--predictions")
    check_predictions_file(ours, {})  # an earlier predictions file of lmlab's may be replaced
    write_output_file(ours, '{"prediction": 2}\n', PREDICTIONS_KIND, "--predictions")
    ours.write_text('{"prediction": "edited by hand"}\n')  # ... until the user edits it
    os.utime(ours, ns=(1, 1))
    with pytest.raises(LmlabError, match="changed since lmlab wrote it"):
        check_predictions_file(ours, {})


def test_a_file_output_named_like_a_folder_is_refused_before_anything_is_written(tmp_path):
    from lmlab.fileio import write_output_file
    from lmlab.finetune.loop import check_predictions_file

    with pytest.raises(LmlabError, match="names a folder, but it takes a file path"):
        check_predictions_file(f"{tmp_path / 'preds'}/", {})
    with pytest.raises(LmlabError, match="names a folder"):
        write_output_file(f"{tmp_path / 'fit'}/", "{}", "scaling fit", "--out")
    assert list(tmp_path.iterdir()) == []  # no file named preds or fit


def test_a_single_file_output_never_replaces_an_entry_of_a_folder_another_command_fills(tmp_path):
    """A pretraining run's metrics.jsonl is lmlab's, but the run's: --predictions (or a harness
    results file) named after it is refused, while the run itself may still rewrite it."""
    from lmlab.fileio import append_line
    from lmlab.finetune.loop import PREDICTIONS_KIND

    run = ownership.claim_dir(tmp_path / "run", "pretraining run", ("metrics.jsonl", "checkpoints"))
    append_line(run / "metrics.jsonl", '{"step": 1, "loss": 5.0}')  # as the run writes it: stamped
    with pytest.raises(LmlabError, match="is inside the pretraining run .*its metrics.jsonl"):
        ownership.check_replaceable_file(run / "metrics.jsonl", PREDICTIONS_KIND, "--predictions")
    assert ownership.may_replace_file(run / "metrics.jsonl", "pretraining run").ok
    assert (run / "metrics.jsonl").read_text() == '{"step": 1, "loss": 5.0}\n'


# ------------------------------------------------------------------- outputs lmlab wrote, then the user
def test_an_lmlab_output_with_a_file_the_user_added_or_edited_is_refused(corpus, tmp_path, capsys):
    args = ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input", str(corpus)]
    tok = tmp_path / "tok"
    assert main(args + ["--out", str(tok)]) == 0
    assert main(args + ["--out", str(tok)]) == 0  # lmlab's own earlier output: replaced
    capsys.readouterr()
    (tok / "NOTES.md").write_text("what I learned")
    assert main(args + ["--out", str(tok)]) == 2
    _one_line_error(capsys, "NOTES.md")
    assert (tok / "NOTES.md").read_text() == "what I learned"
    (tok / "NOTES.md").unlink()
    with open(tok / "tokenizer.json", "a") as f:
        f.write(" ")  # edited by hand: the user's now
    assert main(args + ["--out", str(tok)]) == 2
    _one_line_error(capsys, "tokenizer.json")


def test_a_file_added_while_lmlab_writes_survives_the_final_rename(tmp_path):
    out = tmp_path / "out"
    with atomic_dir(out, marker="a.txt", what="thing") as tmp:
        (tmp / "a.txt").write_text("first")
    with pytest.raises(LmlabError, match="changed while lmlab was writing"):
        with atomic_dir(out, marker="a.txt", what="thing") as tmp:
            (tmp / "a.txt").write_text("second")
            (out / "draft.txt").write_text("written by the user meanwhile")
    assert (out / "draft.txt").read_text() == "written by the user meanwhile"
    assert (out / "a.txt").read_text() == "first"
    assert not list(tmp_path.glob(".out.*"))


def test_pretraining_keeps_a_user_file_named_like_a_leftover(tmp_path):
    from lmlab.train import pretrain

    run = tmp_path / "run"
    overrides = {"train.max_steps": 1, "train.eval_every": 1, "train.checkpoint_every": 1,
                 "train.eval_batches": 1, "train.batch_size": 2, "train.seq_len": 16,
                 "data.train": [str(Path(os.environ.get("LMLAB_DATA", "../shared/data")) / "pretrain" /
                                    "tinyshakespeare" / "input.txt")],
                 "data.val": [], "data.val_fraction": 0.05, "data.max_tokens": 20000}
    pretrain("configs/gpt-tiny-clm.toml", run, overrides=overrides, log=lambda m: None)
    draft = run / ".draft.tmp-1-a"
    draft.write_text("my draft")
    (run / "checkpoints" / ".notes.tmp-1-b").write_text("mine too")
    pretrain(None, run, overrides={**overrides, "train.max_steps": 2}, resume=True, log=lambda m: None)
    assert draft.read_text() == "my draft"
    assert (run / "checkpoints" / ".notes.tmp-1-b").read_text() == "mine too"


# ------------------------------------------------------------------- leftovers and signals
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _dead_temporary(parent: Path, name: str, label: str) -> Path:
    tmp = ownership.make_temporary(parent, name, "fine-tuned model", label)
    pid = _dead_pid()
    moved = tmp.rename(parent / f".{name}.tmp-{pid}-{label}x")
    ownership.start_temporary(moved, "fine-tuned model", pid=pid)  # its marker names it
    (moved / "model.safetensors").write_bytes(b"\0" * 10)
    return moved


def test_a_killed_lr_sweeps_folders_are_removed_by_the_next_run_into_out(tmp_path):
    from lmlab.fileio import remove_leftovers

    arm = _dead_temporary(tmp_path, "ft", "lr-0.001-")
    live = _dead_temporary(tmp_path, "ft", "live-")
    other = _dead_temporary(tmp_path, "other", "lr-0.01-")
    removed = remove_leftovers(tmp_path, "ft")
    assert set(removed) == {arm, live} and not arm.exists() and not live.exists()
    assert other.exists()  # another output's: only its own next run clears it


def test_sigterm_in_any_command_is_one_line_and_leaves_no_temporary(corpus, tmp_path, capsys, monkeypatch):
    import lmlab.data.prepare as prepare

    tok = tmp_path / "tok"
    train_tokenizer("bytelevel", [corpus.read_text()], vocab_size=280).save(tok)
    real = prepare.ShardWriter.add

    def add_then_terminated(self, *a, **k):
        os.kill(os.getpid(), signal.SIGTERM)  # SLURM's notice, mid-write
        return real(self, *a, **k)

    monkeypatch.setattr(prepare.ShardWriter, "add", add_then_terminated)
    out = tmp_path / "shards"
    code = main(["data", "prepare", "--tokenizer", str(tok), "--input", str(corpus), "--out", str(out)])
    assert code == 128 + signal.SIGTERM
    _one_line_error(capsys, "stopped by SIGTERM")
    assert not out.exists() and not list(tmp_path.glob(".shards.*"))


def test_a_manifest_that_is_not_lmlabs_proves_nothing(tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / ownership.MANIFEST).write_text(json.dumps({"kind": "tokenizer", "entries": {}}))
    (folder / "paper.pdf").write_text("x")
    assert not ownership.may_replace_dir(folder, "tokenizer").ok


# ------------------------------------------------------------------- a failed command leaves no trace
@pytest.mark.parametrize("bad", ["objective.name=mlm", "data.train=nonexist", "model.n_heads=3",
                                 "model.dropout=1.5"])
def test_a_pretraining_refused_after_claiming_its_folder_leaves_no_trace(bad, tmp_path, capsys):
    out = tmp_path / "new" / "runs" / "rx"  # its parents are made for it too
    assert main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(out), "--set", bad]) == 2
    _one_line_error(capsys)
    assert list(tmp_path.iterdir()) == []
    mine = tmp_path / "mine"  # a folder the user made for the run stays, as it was: empty
    mine.mkdir()
    assert main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(mine), "--set", bad]) == 2
    _one_line_error(capsys)
    assert [p.name for p in tmp_path.iterdir()] == ["mine"] and list(mine.iterdir()) == []


def test_a_demo_refused_after_claiming_its_folder_leaves_no_trace(tmp_path, capsys):
    out = tmp_path / "demo"
    assert main(["demo", "--out", str(out), "--vocab-size", "10", "--steps", "1"]) == 2
    _one_line_error(capsys, "--vocab-size 10 is too small")
    assert list(tmp_path.iterdir()) == []


def test_a_claim_is_given_back_only_when_nothing_was_written_and_nobody_holds_it(tmp_path):
    from lmlab.fileio import directory_lock

    kind, entries = "pretraining run", ("metrics.jsonl", "checkpoints")
    with pytest.raises(LmlabError), ownership.claimed_dir(tmp_path / "a" / "b", kind, entries) as d:
        (d / "checkpoints").mkdir()  # an empty folder is nothing written
        raise LmlabError("refused", "fix")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(LmlabError), ownership.claimed_dir(tmp_path / "c", kind, entries) as d:
        (d / "metrics.jsonl").write_text("{}\n")  # something written: the claim stays, with the file
        raise LmlabError("refused", "fix")
    assert ownership.owns_entry(tmp_path / "c", "metrics.jsonl")
    with ownership.claimed_dir(tmp_path / "d", kind, entries) as d, directory_lock(d):
        with ownership.claimed_dir(d, kind, entries):  # a second command into a folder in use by the first
            pass
        assert ownership.read_manifest(d) is not None  # not taken from the one holding it
    assert not (tmp_path / "d").exists()


# ------------------------------------------------------------------- live files beside an output
def test_a_killed_alignments_live_log_is_removed_at_the_next_start(ckpt, tmp_path, capsys, monkeypatch):
    import lmlab.align.loop as align_loop

    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(json.dumps({"prompt": "Hi", "chosen": " good", "rejected": " bad"}) + "\n")
    args = ["align", "--method", "dpo", "--checkpoint", str(ckpt), "--max-steps", "1", "--batch-size", "1",
            "--threads", "1", "--no-progress", "--train", str(prefs), "--dev", str(prefs), "--out"]
    live = _dead_temporary(tmp_path, "al", "live-")  # what an align killed by SIGKILL left
    real = align_loop.dpo_loss

    def looks(*a, **k):  # the next run, as it trains: the dead run's live folder is gone already
        assert not live.exists()
        return real(*a, **k)

    monkeypatch.setattr(align_loop, "dpo_loss", looks)
    assert main([*args, str(tmp_path / "al")]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["al", "ck", "prefs.jsonl"]


def test_a_failed_alignment_leaves_nothing_beside_its_output(ckpt, tmp_path, capsys):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(json.dumps({"prompt": "Hi", "chosen": " good", "rejected": " bad"}) + "\n")
    base = ["align", "--checkpoint", str(ckpt), "--threads", "1", "--no-progress", "--train", str(prefs),
            "--dev", str(prefs), "--out", str(tmp_path / "al")]
    # refused once the model is loaded (too big for this machine), and a failure mid-run
    assert main([*base, "--method", "rlhf", "--batch-size", "100000", "--samples", "100000"]) == 2
    _one_line_error(capsys, "would need about")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "prefs.jsonl"]
    import lmlab.align.loop as align_loop

    def broken(*a, **k):
        raise ValueError("mid-way")

    with pytest.MonkeyPatch.context() as m:
        m.setattr(align_loop, "dpo_loss", broken)
        assert main([*base, "--method", "dpo", "--max-steps", "2", "--batch-size", "1"]) == 2
    assert "mid-way" in capsys.readouterr().err.splitlines()[-1]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "prefs.jsonl"]

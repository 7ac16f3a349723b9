"""A leftover is removed only when lmlab provably made it (lmlab.ownership.is_dead_leftover): a
marker written when it was made names that very temporary, its process has ended, and all in it
is still lmlab's. A name that looks like a temporary proves nothing. Each test failed before."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lmlab import ownership
from lmlab.cli import main


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _tokenizer(corpus: Path, out: Path) -> int:
    return main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input", str(corpus),
                 "--out", str(out)])


def _dead_aside(out: Path, what: str) -> Path:
    """``out`` renamed aside as a killed lmlab process leaves it (marked, then renamed)."""
    pid = _dead_pid()
    aside = ownership.move_aside(out, f"{what}-{pid}")
    marker = aside / ownership.TEMPORARY_MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": pid}))
    return aside


def test_user_folders_named_like_temporaries_are_kept(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be\n\n" * 40)
    tok = tmp_path / "tok"
    assert _tokenizer(corpus, tok) == 0
    old = tmp_path / ".tok.old-20241129"  # a copy of lmlab's output, with the user's notes
    shutil.copytree(tok, old)
    (old / "NOTES.md").write_text("n")
    bak = tmp_path / ".tok.tmp-20241129-bak"
    shutil.copytree(tok, bak)
    prune = tmp_path / ".tok.prune-999998"
    shutil.copytree(tok, prune)  # a copy, unchanged, but no marker naming it
    assert _tokenizer(corpus, tok) == 0
    assert (old / "NOTES.md").read_text() == "n" and bak.is_dir() and prune.is_dir()


def test_a_marked_aside_output_is_removed_only_while_unchanged(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be\n\n" * 40)
    for what in ("old", "prune"):
        tok = tmp_path / f"tok{what}"
        assert _tokenizer(corpus, tok) == 0
        assert _tokenizer(corpus, tok) == 0
        aside = _dead_aside(tok, what)
        (aside / "NOTES.md").write_text("mine")  # added since: the user's now
        assert ownership.remove_leftovers(tmp_path, tok.name) == [] and (aside / "NOTES.md").exists()
        (aside / "NOTES.md").unlink()
        copy = aside.with_name(aside.name + "-copy")
        shutil.copytree(aside, copy)  # names another folder: not this one's marker
        ownership.remove_leftovers(tmp_path, tok.name)
        assert copy.is_dir() and not aside.exists()
        if what == "old":  # caught between the two renames: put back, unmarked
            assert (tok / "tokenizer.json").is_file() and not (tok / ownership.TEMPORARY_MARKER).exists()


def test_a_temporary_copied_or_renamed_is_kept(tmp_path):
    tmp = ownership.make_temporary(tmp_path, "ft", "fine-tuned model", "x-")
    pid = _dead_pid()
    ownership.write_manifest(tmp, {**ownership.read_manifest(tmp), "pid": pid})
    moved = tmp.rename(tmp_path / f".ft.tmp-{pid}-mine")  # the name no longer the one its marker names
    assert ownership.remove_leftovers(tmp_path, "ft", locked=True) == [] and moved.is_dir()
    ownership.start_temporary(moved, "fine-tuned model", pid=pid)
    assert ownership.remove_leftovers(tmp_path, "ft") == [moved]


# ------------------------------------------------------------------------ the folder you are in
def test_the_current_folder_or_one_above_it_is_refused_as_an_output(tmp_path, monkeypatch, capsys):
    from assertions import assert_one_line_error

    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be\n\n" * 40)
    here = tmp_path / "a" / "here"
    here.mkdir(parents=True)
    monkeypatch.chdir(here)
    for out in (".", "./", str(here), "../here", str(tmp_path / "a")):
        assert _tokenizer(corpus, Path(out)) == 2
        assert_one_line_error(capsys, f"--out {Path(out)} is", "current folder", "nothing was written")
        assert here.is_dir() and not any(here.iterdir())
    assert main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", "."]) == 2
    assert_one_line_error(capsys, "--out . is the current folder")


def test_a_missing_current_folder_is_named(tmp_path, monkeypatch, capsys):
    from assertions import assert_one_line_error

    (tmp_path / "c.txt").write_text("to be or not to be\n\n" * 40)
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    assert _tokenizer(tmp_path / "c.txt", Path("tok")) == 2  # a relative path in a folder that is gone
    assert_one_line_error(capsys, "the current folder no longer exists")


# ------------------------------------------------------------- names derived from a temporary's
def test_what_is_written_beside_a_temporary_is_named_after_its_output(tmp_path):
    arm = ownership.make_temporary(tmp_path, "ft", "fine-tuned model", "lr-0.001-")  # an --lr auto arm
    assert ownership.derived_name(arm.name, tmp_path, "tmp-1-live-").startswith(".ft.tmp-1-live-")
    with ownership.live_dir(arm, "fine-tuning logs") as live:  # the arm's live log, as a kill leaves it
        pid = _dead_pid()
        left = live.rename(tmp_path / live.name.replace(f".tmp-{os.getpid()}-", f".tmp-{pid}-"))
        ownership.start_temporary(left, "fine-tuning logs", pid=pid)
        live.mkdir()
    assert left.name.startswith(".ft.tmp-")
    assert ownership.remove_leftovers(tmp_path, "ft") == [left]  # the next run into ft removes it


# ------------------------------------------------------------------ a refused run leaves no trace
def test_a_run_refused_while_preparing_its_data_leaves_no_folder(tmp_path, capsys):
    one = tmp_path / "one.txt"  # long enough for a window of 8 (so the settings' own check passes),
    one.write_text("the first paragraph of it\n\nthe second paragraph of it\n")  # both docs hashed to train
    two = tmp_path / "two.txt"
    two.write_text("a first paragraph, long enough to pass the check\n\n"
                   "a second paragraph, long enough too\n")
    for text, fraction, needle in ((one, 0.05, "val split"), (two, 0.9, "train split")):
        out = tmp_path / "new" / "e3"
        assert main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(out),
                     "--set", f'data.train=["{text}"]', "--set", "data.val=[]",
                     "--set", f"data.val_fraction={fraction}", "--set", "train.seq_len=8"]) == 2
        last = capsys.readouterr().err.strip().splitlines()[-1]  # after the lines saying what it did
        assert last.startswith(f"error: no document went to the {needle}") and "data.val_fraction" in last
        assert not (tmp_path / "new").exists()  # not the run, its tokenizer, nor the folder made for it


# ------------------------------------------------------------- a copy with other times is lmlab's
def test_a_copy_with_new_times_is_still_lmlabs_but_an_edit_is_not(tmp_path):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be\n\n" * 40)
    tok = tmp_path / "tok"
    assert _tokenizer(corpus, tok) == 0
    copy = tmp_path / "copy"
    shutil.copytree(tok, copy, copy_function=shutil.copyfile)  # cp -r: the same bytes, new times
    os.utime(copy / "tokenizer.json", ns=(1, 1))
    assert ownership.may_replace_dir(copy, "tokenizer").ok
    data = (copy / "tokenizer.json").read_bytes()
    (copy / "tokenizer.json").write_bytes(data[:-1] + (b"x" if data[-1:] != b"x" else b"y"))  # same size
    assert not ownership.may_replace_dir(copy, "tokenizer").ok


# ------------------------------------------- killed mid-write: what it leaves, the next run removes
def _killed(work) -> int:
    """Run ``work`` in a child process that ends at once where ``work`` calls :func:`_die` (as a
    SIGKILL would: nothing cleaned up); the child's pid, once it has ended."""
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            work()
        except BaseException:
            import traceback

            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 9, "the child did not die where it should"
    return pid


def _die(*_args, **_kwargs):
    os._exit(9)


def _hidden(folder: Path, name: str) -> list[str]:
    """The temporaries in ``folder`` named after the output ``name``."""
    return sorted(p.name for p in folder.iterdir() if p.name.startswith(f".{name}."))


def test_a_temporary_an_output_was_saved_into_is_removed_after_a_kill(ckpt, tmp_path, monkeypatch):
    """What is saved into a temporary (a tokenizer moved into an export, a model saved into the
    temporary of `compress`'s output, a sealed `--lr auto` arm) writes its own manifest there: the
    temporary stays provably lmlab's all the same, and the next run into that output removes it."""
    from lmlab import fileio
    from lmlab.interop import hf_export
    from lmlab.models import load_checkpoint, save_checkpoint

    model = load_checkpoint(ckpt)
    out = tmp_path / "o"
    out.mkdir()

    def killed_in(patch, work):
        def child():
            patch()
            work()
        return _killed(child)

    def compress_like(name):  # lmlab compress: a model saved into the temporary of its output
        with fileio.atomic_dir(out / name, "model.safetensors", "model") as tmp:
            save_checkpoint(model, tmp, tokenizer=model.tokenizer)
            _die()

    def arm(name):  # finetune --lr auto: one rate's run, sealed in its temporary
        tmp = ownership.make_temporary(out, name, "fine-tuned model", "lr-0.001-")
        save_checkpoint(model, tmp, tokenizer=model.tokenizer)
        ownership.seal(tmp, "fine-tuned model")
        _die()

    import lmlab.interop as interop

    def sealed(into):  # dies once the folder that goes to ``into`` is sealed, before it is renamed
        replace = fileio.replace_dir

        def replace_dir(src, dest, *args, **kwargs):
            if dest.name.startswith(into):
                _die()
            return replace(src, dest, *args, **kwargs)
        return lambda: monkeypatch.setattr(fileio, "replace_dir", replace_dir)

    def tokenizer_moved_in():  # dies once the tokenizer's files (its manifest too) are moved in
        monkeypatch.setattr(interop, "_plain_prompts", _die)

    cases = {  # name: (where the process dies, what it was doing)
        "hf-sealed": (sealed("hf-sealed"), lambda: hf_export(model, out / "hf-sealed")),
        "hf-tok": (tokenizer_moved_in, lambda: hf_export(model, out / "hf-tok")),
        "q": (lambda: None, lambda: compress_like("q")),
        "q-inner": (sealed(".q-inner.tmp-"), lambda: compress_like("q-inner")),  # the model saved in it
        "fa": (lambda: None, lambda: arm("fa")),
    }
    for name, (patch, work) in cases.items():
        killed_in(patch, work)
        left = _hidden(out, name)
        assert left, name  # the kill left a temporary
        assert name != "q-inner" or len(left) == 2  # and the model's, beside it
        if name.startswith("hf"):
            hf_export(model, out / name)  # the next run into the same output
        elif name.startswith("q"):
            save_checkpoint(model, out / name)
        else:
            ownership.remove_leftovers(out, name)  # what the next --lr auto run into fa does first
        assert _hidden(out, name) == [], name


@pytest.mark.parametrize("what", ["tokenizer", "model"])
def test_an_old_copy_whose_deletion_was_cut_short_is_removed_at_the_next_start(what, ckpt, tmp_path):
    """A replaced output is renamed aside (``.NAME.old-PID``) and deleted, its proof last: wherever
    a kill cuts the deletion short (after any file or folder in it, a model's tokenizer folder
    emptied too), what is left is still provably lmlab's, and the next run into that output removes
    it (the new output, already in place, is kept)."""
    from lmlab.models import load_checkpoint, save_checkpoint

    model = load_checkpoint(ckpt)
    out = tmp_path / "out"

    def save():
        return model.tokenizer.save(out) if what == "tokenizer" else \
            save_checkpoint(model, out, tokenizer=model.tokenizer)

    save()
    inside = list(out.rglob("*"))
    n = len(inside) + 1  # its files and folders, and the marker written as it goes aside
    assert what == "tokenizer" or any(p.is_dir() for p in inside)
    for k in range(1, n + 1):
        def child(k=k):  # replace ``out``, dying at the k-th file or folder deleted from the old copy
            real, real_aside, seen = {"unlink": os.unlink, "rmdir": os.rmdir}, ownership.move_aside, []

            def deleting(op):
                def delete(path, *args, dir_fd=None, **kwargs):
                    if seen and (dir_fd is not None or str(path).startswith(str(seen[0]) + os.sep)):
                        seen.append(path)
                        if len(seen) > k:
                            _die()
                    return real[op](path, *args, dir_fd=dir_fd, **kwargs)
                return delete

            def move_aside(directory, what):
                seen.append(real_aside(directory, what))
                return seen[0]

            os.unlink, os.rmdir = deleting("unlink"), deleting("rmdir")
            ownership.move_aside = move_aside
            save()
        _killed(child)
        left = _hidden(tmp_path, "out")
        assert len(left) == 1 and left[0].startswith(".out.old-"), (k, left)
        save()  # the next run
        assert _hidden(tmp_path, "out") == [], (k, left, sorted(os.listdir(tmp_path / left[0])))
        assert not ownership.may_replace_dir(out, what).reason


def test_an_old_copy_caught_between_the_renames_is_put_back_even_if_a_file_of_it_was_deleted(tmp_path):
    """Review: a replacement killed between its two renames left ``.NAME.old-PID``; one whose
    output lacked a listed file (the user deleted one: replacing it is allowed) was deleted at the
    next start instead of put back. Only an old copy whose deletion had begun (its marker says
    so) is removed."""
    from lmlab import fileio

    out = tmp_path / "exp"
    with fileio.atomic_dir(out, "a.txt", "model") as tmp:
        (tmp / "a.txt").write_text("a")
        (tmp / "b.txt").write_text("b")
    (out / "b.txt").unlink()

    def child():
        ownership.move_aside(out, f"old-{os.getpid()}")
        _die()

    _killed(child)
    assert not out.exists() and len(_hidden(tmp_path, "exp")) == 1
    ownership.remove_leftovers(tmp_path, "exp")
    assert (out / "a.txt").read_text() == "a" and _hidden(tmp_path, "exp") == []

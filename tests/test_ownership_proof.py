"""Nothing lost, no trace (lmlab.ownership), the cases a manifest of files alone missed: an empty
folder of yours inside an output, an output name near the file system's limit, a file that a
command filling a folder wrote and you replaced since, and the folders made above an output when
the command then fails. Each test here failed before the fix."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from assertions import assert_one_line_error

from lmlab import ownership
from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.fileio import atomic_dir, atomic_write_text, write_output_file


@pytest.fixture()
def corpus(tmp_path):
    p = tmp_path / "corpus.txt"
    p.write_text("to be or not to be, that is the question\n\n" * 60, encoding="utf-8")
    return p


def _tokenizer_args(corpus: Path, out) -> list[str]:
    return ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input", str(corpus),
            "--out", str(out)]


# ------------------------------------------------------------------- an empty folder is something
def test_an_empty_folder_of_yours_inside_an_output_keeps_it_from_being_replaced(corpus, tmp_path, capsys):
    tok = tmp_path / "tok"
    assert main(_tokenizer_args(corpus, tok)) == 0
    (tok / "mine").mkdir()  # made by you, empty: the manifest lists files only, so it was deleted
    capsys.readouterr()
    assert main(_tokenizer_args(corpus, tok)) == 2
    assert_one_line_error(capsys, "lmlab did not write", "mine", "nothing was written")
    assert (tok / "mine").is_dir()
    (tok / "mine").rmdir()
    assert main(_tokenizer_args(corpus, tok)) == 0  # lmlab's own output alone: replaced as before


def test_an_output_that_holds_an_empty_folder_lmlab_wrote_may_be_replaced(tmp_path):
    out = tmp_path / "out"
    for _ in range(2):
        with atomic_dir(out, marker="a.txt", what="thing") as tmp:
            (tmp / "a.txt").write_text("x")
            (tmp / "empty").mkdir()  # recorded as lmlab's (ownership.list_files: empty folders too)
    assert ownership.read_manifest(out)["entries"]["empty"] == ownership.FOLDER
    (out / "empty" / "deeper").mkdir()  # ... but one made in it since is not
    assert not ownership.may_replace_dir(out, "thing").ok


def test_a_claim_holding_an_empty_folder_of_yours_is_not_given_back(tmp_path):
    kind, entries = "pretraining run", ("metrics.jsonl", "checkpoints")
    with pytest.raises(LmlabError), ownership.claimed_dir(tmp_path / "run", kind, entries) as d:
        (d / "mine").mkdir()  # yours, made while the run started: it was removed with the claim
        raise LmlabError("refused", "fix")
    assert (tmp_path / "run" / "mine").is_dir()


# ------------------------------------------------------------------- names near the limit
def test_an_output_name_near_the_limit_gets_derived_names_that_fit(corpus, tmp_path, capsys):
    long = tmp_path / ("t" * 250)  # 250 bytes: ".NAME.tmp-PID-..." went past 255 ("not writable")
    assert main(_tokenizer_args(corpus, long)) == 0
    assert main(_tokenizer_args(corpus, long)) == 0  # replaced: ".NAME.old-PID" fits too
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["corpus.txt", long.name])
    assert (long / "tokenizer.json").is_file()


def test_every_name_derived_from_a_long_output_name_fits_and_names_that_output(tmp_path):
    limit = ownership.name_max(tmp_path)
    name = "é" * (limit // 2)  # 254 bytes in UTF-8
    names = [ownership.derived_name(name, tmp_path, what) for what in
             (f"tmp-{2 ** 22}-lr-1.23457e-05-", f"old-{2 ** 22}", f"prune-{2 ** 22}", "resume")]
    assert all(ownership.name_bytes(n) + 8 <= limit for n in names)  # + mkdtemp's 8 characters
    stem = names[-1][1:-len(".resume")]
    assert stem != name and all(n.startswith(f".{stem}.") for n in names)  # one stem: start + hash of all
    assert ownership.derived_name("other" + name[5:], tmp_path, "resume") != names[-1]
    assert ownership.derived_name("ft", tmp_path, "resume") == ".ft.resume"  # short names as before
    # an output caught between the two renames of a replacement is put back under its own name
    out = tmp_path / name
    with atomic_dir(out, marker="a.txt", what="thing") as tmp:
        (tmp / "a.txt").write_text("x")
    pid = 2 ** 22 + 7  # no such process
    old = ownership.move_aside(out, f"old-{pid}")  # marked as this very temporary, by a process that ended
    marker = old / ownership.TEMPORARY_MARKER
    marker.write_text(json.dumps({**json.loads(marker.read_text()), "pid": pid}))
    assert ownership.remove_leftovers(tmp_path) == [] and old.exists()  # whose, it cannot tell alone
    ownership.remove_leftovers(tmp_path, name)
    assert (out / "a.txt").read_text() == "x" and not old.exists()


def test_an_output_name_over_the_limit_is_refused_in_one_line_stating_the_limit(corpus, tmp_path, capsys):
    limit = ownership.name_max(tmp_path)
    out = tmp_path / "new" / ("t" * (limit + 1))
    assert main(_tokenizer_args(corpus, out)) == 2
    assert_one_line_error(capsys, f"is {limit + 1} bytes long", f"at most {limit} bytes per name",
                          "nothing was written")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


# ------------------------------------------------------------------- every file lmlab writes is stamped
def _runs(root: Path) -> Path:
    """Four finished runs as ``scale fit`` reads them (summary.json: tokens, val_loss, parameters)."""
    for i, n in enumerate((1e5, 3e5, 1e6, 3e6)):
        run = root / f"r{i}"
        run.mkdir(parents=True)
        (run / "summary.json").write_text(json.dumps({"tokens": 10 ** 7, "parameters": int(n),
                                                      "val_loss": 2.0 + 40 * n ** -0.3}))
    return root


def test_scale_fit_never_writes_over_a_fit_json_you_replaced(tmp_path, capsys):
    runs, out = _runs(tmp_path / "runs"), tmp_path / "fit"
    args = ["scale", "fit", str(runs), "--out", str(out), "--bootstrap", "0"]
    assert main(args) == 0
    assert main(args) == 0  # its own fit.json, unchanged: written again
    capsys.readouterr()
    (out / "fit.json").write_text('{"my": "own fit"}\n')  # an entry of the folder: it was overwritten
    assert main(args) == 2
    assert_one_line_error(capsys, "holds fit.json, which changed since lmlab wrote it", "nothing was written")
    assert (out / "fit.json").read_text() == '{"my": "own fit"}\n'


def test_a_resumed_pretraining_never_writes_over_a_summary_you_replaced(tmp_path, capsys):
    from lmlab.train import pretrain

    run = tmp_path / "run"
    data = Path(os.environ.get("LMLAB_DATA", "../shared/data")) / "pretrain" / "tinyshakespeare" / "input.txt"
    overrides = {"train.max_steps": 1, "train.eval_every": 1, "train.checkpoint_every": 1,
                 "train.eval_batches": 1, "train.batch_size": 2, "train.seq_len": 16,
                 "data.train": [str(data)], "data.val": [], "data.val_fraction": 0.05,
                 "data.max_tokens": 20000}
    pretrain("configs/gpt-tiny-clm.toml", run, overrides=overrides, log=lambda m: None)
    (run / "summary.json").write_text("my notes on this run\n")
    with pytest.raises(LmlabError, match="holds summary.json, which changed since lmlab wrote it"):
        pretrain(None, run, overrides={**overrides, "train.max_steps": 2}, resume=True, log=lambda m: None)
    assert (run / "summary.json").read_text() == "my notes on this run\n"


def test_a_file_written_over_while_a_command_fills_its_folder_is_left_as_it_is(tmp_path):
    kind, entries = "scaling fit", ("fit.json", "fit.png")
    with ownership.claimed_dir(tmp_path / "fit", kind, entries) as d:
        atomic_write_text(d / "fit.json", "{}\n")
        stamp = ownership.read_manifest(d)["files"]["fit.json"]
        assert stamp["size"] == 3
        (d / "fit.json").write_text("yours, written meanwhile\n")
        with pytest.raises(LmlabError, match="changed since lmlab wrote it; it was left as it is"):
            atomic_write_text(d / "fit.json", "{}\n")
    assert (tmp_path / "fit" / "fit.json").read_text() == "yours, written meanwhile\n"
    # a single-file output never replaces it either, whatever its kind
    with pytest.raises(LmlabError, match="is inside the scaling fit .*its fit.json"):
        write_output_file(tmp_path / "fit" / "fit.json", "{}", "predictions", "--predictions")


def test_a_folder_filled_over_time_is_deleted_only_when_all_in_it_is_lmlabs(tmp_path):
    """The demo's fresh start deletes its earlier run: every file in it must be stamped and unchanged
    (it deleted the whole run, your file in it too)."""
    demo = ownership.claim_dir(tmp_path / "demo", "demo", ("run", "train.txt"))
    with ownership.filling(demo):  # as the demo makes its run
        run = ownership.claim_dir(demo / "run", "pretraining run", ("summary.json", "checkpoints"))
    atomic_write_text(run / "summary.json", "{}\n")
    (run / "checkpoints" / "notes").mkdir(parents=True)
    (run / "checkpoints" / "notes" / "todo.txt").write_text("mine")
    with pytest.raises(LmlabError, match=r"holds checkpoints/notes/todo.txt, which lmlab did not write"):
        ownership.remove_owned_tree(demo, "run")
    assert (run / "checkpoints" / "notes" / "todo.txt").read_text() == "mine"
    (run / "checkpoints" / "notes" / "todo.txt").unlink()
    with pytest.raises(LmlabError, match="checkpoints/notes"):  # an empty folder nothing records
        ownership.remove_owned_tree(demo, "run")
    (run / "checkpoints" / "notes").rmdir()
    ownership.remove_owned_tree(demo, "run")
    assert not run.exists()


# ------------------------------------------------------------------- folders made above an output
def test_folders_made_for_an_output_go_when_the_command_fails(tmp_path):
    with pytest.raises(ValueError), atomic_dir(tmp_path / "a" / "b" / "out", marker="x", what="thing"):
        raise ValueError("failed mid-write")
    with pytest.raises(ValueError), ownership.live_dir(tmp_path / "c" / "out", "log"):
        raise ValueError("failed mid-run")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "yours").mkdir()  # a folder that was there stays, empty or not
    with pytest.raises(ValueError), atomic_dir(tmp_path / "yours" / "f" / "out", marker="x", what="thing"):
        raise ValueError("failed")
    assert [p.name for p in tmp_path.iterdir()] == ["yours"] and list((tmp_path / "yours").iterdir()) == []
    with atomic_dir(tmp_path / "g" / "out", marker="x", what="thing") as tmp:  # kept with the output
        (tmp / "x").write_text("1")
    assert (tmp_path / "g" / "out" / "x").is_file()


def test_a_failed_alignment_leaves_no_folder_above_its_output(ckpt, tmp_path, capsys):
    prefs = tmp_path / "prefs.jsonl"
    prefs.write_text(json.dumps({"prompt": "Hi", "chosen": " good", "rejected": " bad"}) + "\n")
    out = tmp_path / "new" / "runs" / "al"
    # refused once the model is loaded (too big for this machine), after its live log was made
    assert main(["align", "--checkpoint", str(ckpt), "--threads", "1", "--no-progress", "--train", str(prefs),
                 "--dev", str(prefs), "--out", str(out), "--method", "rlhf", "--batch-size", "100000",
                 "--samples", "100000"]) == 2
    assert_one_line_error(capsys, "would need about")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "prefs.jsonl"]


def test_a_failed_lr_sweep_leaves_no_folder_above_its_output(ckpt, tmp_path, capsys):
    bad = tmp_path / "train.tsv"  # a label outside the task's: found by the first run, past the checks
    bad.write_text("sentence\tlabel\ngood movie\t1\nbad movie\tmaybe\n", encoding="utf-8")
    out = tmp_path / "new" / "runs" / "ft"
    assert main(["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(bad), "--dev",
                 str(bad), "--lr", "auto", "--threads", "1", "--no-progress", "--out", str(out)]) == 2
    assert capsys.readouterr().err.splitlines()[-1].startswith(f"error: {bad} line 3: label 'maybe'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ck", "train.tsv"]


def test_a_folder_where_lmlab_writes_a_file_is_called_a_folder_not_a_changed_file(tmp_path):
    """A folder made where a command filling its folder writes a file (lmlab's file replaced by it,
    or made before lmlab wrote one): the claim and the write both say it is a folder (probe8 #9)."""
    kind, entries = "scaling fit", ("fit.json", "fit.png")
    with ownership.claimed_dir(tmp_path / "fit", kind, entries) as d:
        atomic_write_text(d / "fit.json", "{}\n")
    (d / "fit.json").unlink()
    (d / "fit.json").mkdir()  # lmlab's file replaced by a folder: refused when claimed again
    with pytest.raises(LmlabError, match="holds fit.json, which is a folder that lmlab did not make, "
                                         "where lmlab writes a file; nothing was written"):
        ownership.claim_dir(d, kind, entries, create=False)
    (d / "fit.png").mkdir()  # never written by lmlab: refused when written, as a folder too
    with pytest.raises(LmlabError, match=r"fit.png is a folder that lmlab did not make, where lmlab writes "
                                         r"a file; .* move that folder away"):
        ownership.check_overwrite(d / "fit.png")
    assert (d / "fit.json").is_dir() and (d / "fit.png").is_dir()

"""Nothing lost: no command writes an output inside another lmlab output (lmlab.ownership.
check_not_inside_output). Only the command that fills a folder (a pretraining run's own checkpoints,
shards and tokenizer) writes inside it, and nothing is written into a whole output once it is sealed.
Each case here overwrote or deleted lmlab's files before: a predictions file over a model's weights,
a ``data prepare`` over a run's shards, a model at a run's next checkpoint name, predictions recorded
into a tokenizer's manifest and deleted with it. The outputs are built once for the module."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from lmlab import ownership
from lmlab.cli import main
from lmlab.errors import LmlabError


def _one_line_error(capsys, *needles):
    from assertions import assert_one_line_error

    return assert_one_line_error(capsys, *needles)


def _state(folder: Path) -> dict[str, tuple]:
    """Every path under ``folder`` with its size and modification time (a change of any shows),
    the lock file aside."""
    found = {}
    for p in sorted(folder.rglob("*")):
        if p.name == ".lock":  # rewritten by every command that takes the folder's lock
            continue
        st = p.lstat()
        found[p.relative_to(folder).as_posix()] = (p.is_dir(), st.st_size, st.st_mtime_ns)
    return found


RUN_SETTINGS = {
    "model": {"preset": "gpt2-tiny"}, "objective": {"name": "clm"},
    "data": {"val": [], "val_fraction": 0.1, "tokenizer": {"algo": "bytelevel", "vocab_size": 280},
             "doc_separator": "blank-line"},
    "train": {"max_steps": 2, "batch_size": 2, "seq_len": 16, "eval_every": 2, "eval_batches": 1,
              "checkpoint_every": 1, "log_every": 1, "threads": 1, "progress": "off", "warmup_steps": 1},
}


@pytest.fixture(scope="module")
def outs(tmp_path_factory, data_dir):
    """One of each kind of lmlab output, in one folder: a pretraining run (``run``, checkpoints at
    steps 1 and 2), a tokenizer (``tok``), token shards (``shards``), an exported Hugging Face
    model (``hf``), a quantized model (``q``) and a fine-tuned classifier (``ft``); and the inputs
    the commands below read (``src``, a model; ``tokin``, a tokenizer; text and SST-2 files)."""
    import torch

    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer
    from lmlab.train import pretrain

    root = tmp_path_factory.mktemp("outs")
    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:20000]
    (root / "tiny.txt").write_text(text, encoding="utf-8")
    for split, n in (("train", 17), ("dev", 9)):
        lines = (data_dir / "glue" / "sst2" / f"{split}.tsv").read_text(encoding="utf-8").splitlines()[:n]
        (root / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    settings = json.loads(json.dumps(RUN_SETTINGS))
    settings["data"]["train"] = [str(root / "tiny.txt")]
    pretrain(settings, root / "run", log=lambda m: None)
    tok = train_tokenizer("bytelevel", [text], vocab_size=280)
    tok.save(root / "tok")
    tok.save(root / "tokin")
    torch.manual_seed(0)
    build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size)).save(root / "src", tokenizer=tok)
    quiet = ["--threads", "1", "--no-progress"]
    for argv in (["data", "prepare", "--tokenizer", "tokin", "--input", "tiny.txt", "--out", "shards",
                  "--val-fraction", "0.1"],
                 ["export", "--checkpoint", "src", "--out", "hf"],
                 ["compress", "quantize", "--checkpoint", "src", "--out", "q"],
                 ["finetune", "--checkpoint", "src", "--task", "sst2", "--train", "train.tsv", "--dev",
                  "dev.tsv", "--out", "ft", "--max-steps", "1", "--batch-size", "8", *quiet]):
        cwd = os.getcwd()
        os.chdir(root)
        try:
            assert main(argv) == 0, argv
        finally:
            os.chdir(cwd)
    return root


#: each command with one output flag, its other arguments reading the inputs of ``outs``
COMMANDS = {
    "evaluate --predictions": ["evaluate", "--checkpoint", "ft", "--data", "dev.tsv", "--predictions"],
    "tokenizer train --out": ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input",
                              "tiny.txt", "--out"],
    "data prepare --out": ["data", "prepare", "--tokenizer", "tokin", "--input", "tiny.txt", "--out"],
    "export --out": ["export", "--checkpoint", "src", "--out"],
    "compress quantize --out": ["compress", "quantize", "--checkpoint", "src", "--out"],
    "finetune --out": ["finetune", "--checkpoint", "src", "--task", "sst2", "--train", "train.tsv", "--dev",
                       "dev.tsv", "--max-steps", "1", "--out"],
    "pretrain --out": ["pretrain", "--config", "run/config.toml", "--set", "train.max_steps=1", "--out"],
}
#: where each output goes: inside an output of another kind (what it is, and the words of the refusal)
PLACES = {
    "a tokenizer's file": ("tok/tokenizer.json", "inside the tokenizer tok (its tokenizer.json)"),
    "a new name in a tokenizer": ("tok/extra", "inside the tokenizer tok,"),
    "an exported model's weights": ("hf/model.safetensors", "inside the Hugging Face model hf (its model"),
    "a quantized model's config": ("q/config.json", "inside the model q (its config.json)"),
    "a new name in token shards": ("shards/more", "inside the token-shards shards,"),
    "a run's newest checkpoint's weights": ("run/checkpoints/step_2/model.safetensors",
                                            "inside the checkpoint run/checkpoints/step_2 (its model"),
    "a run's newest checkpoint": ("run/checkpoints/step_2",
                                  "inside the pretraining run run (its checkpoints)"),
    "a run's next checkpoint name": ("run/checkpoints/step_10",
                                     "inside the pretraining run run (its checkpoints)"),
    "a run's shards": ("run/data/train", "inside the pretraining run run (its data)"),
    "a run's tokenizer": ("run/data/tokenizer", "inside the pretraining run run (its data)"),
    "a run's metrics log": ("run/metrics.jsonl", "inside the pretraining run run (its metrics.jsonl)"),
}


@pytest.mark.parametrize("place", list(PLACES))
@pytest.mark.parametrize("command", list(COMMANDS))
def test_no_output_is_written_inside_another_lmlab_output(outs, command, place, capsys, monkeypatch):
    monkeypatch.chdir(outs)
    path, words = PLACES[place]
    before = _state(outs)
    assert main([*COMMANDS[command], path]) == 2
    _one_line_error(capsys, words, "nothing was written", "outside it")
    assert _state(outs) == before  # refused before any work: nothing made, nothing changed


@pytest.mark.parametrize("place", ["run/checkpoints/mine", "run/data/mine"])
@pytest.mark.parametrize("command", [c for c in COMMANDS if c.endswith("--out")])
def test_a_folder_output_with_a_new_name_inside_a_runs_entry_is_refused_before_any_work(outs, command, place,
                                                                                     capsys, monkeypatch):
    """A folder output is made and then filled, so inside another command's entry (a run's
    checkpoints or data) even a new name is refused, up front: it used to pass the first check,
    do all its work, and be refused at the end naming its temporary (or, for a tokenizer, be
    written into the run's data/)."""
    monkeypatch.chdir(outs)
    before = _state(outs)
    assert main([*COMMANDS[command], place]) == 2
    entry = place.split("/")[1]
    _one_line_error(capsys, f"--out {place} is inside the pretraining run run (its {entry})",
                    "nothing was written", "outside it")
    assert _state(outs) == before


def test_a_grid_dry_run_refuses_an_out_inside_another_output(outs, capsys, monkeypatch):
    monkeypatch.chdir(outs)
    assert main(["compare", "--config", str(Path(__file__).parents[1] / "configs/grids/objectives-tiny.toml"),
                 "--dry-run",
                 "--out", "run/checkpoints/grid"]) == 2
    _one_line_error(capsys, "--out run/checkpoints/grid is inside the pretraining run run (its checkpoints)")


# ------------------------------------------------------------------- 1. a file of a whole output
def test_predictions_never_overwrite_a_file_of_a_whole_output(outs, capsys, monkeypatch):
    monkeypatch.chdir(outs)
    weights = (outs / "hf" / "model.safetensors").read_bytes()
    assert main(["evaluate", "--checkpoint", "ft", "--data", "dev.tsv", "--predictions",
                 "hf/model.safetensors"]) == 2
    _one_line_error(capsys, "--predictions hf/model.safetensors is inside the Hugging Face model hf",
                    "choose a --predictions path outside it")
    assert (outs / "hf" / "model.safetensors").read_bytes() == weights
    # the decision itself: a file lmlab wrote as part of a whole output records no kind, and is
    # no single-file output's to replace, whatever kind that is
    for name in ("model.safetensors", "config.json"):
        verdict = ownership.may_replace_file(outs / "hf" / name, "predictions")
        assert not verdict.ok and "file of the Hugging Face model" in verdict.reason


# ------------------------------------------------------------------- 2. a run's data
def test_no_other_command_replaces_a_runs_shards_or_tokenizer(outs, capsys, monkeypatch):
    from lmlab.data.prepare import prepare_shards
    from lmlab.tokenizers import load_tokenizer

    monkeypatch.chdir(outs)
    before = _state(outs / "run")
    assert main(["data", "prepare", "--tokenizer", "run/data/tokenizer", "--input", "dev.tsv",
                 "--out", "run/data/train"]) == 2
    _one_line_error(capsys, "--out run/data/train is inside the pretraining run run (its data)")
    assert main(["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280", "--input", "dev.tsv",
                 "--out", "run/data/tokenizer"]) == 2
    _one_line_error(capsys, "--out run/data/tokenizer is inside the pretraining run run (its data)")
    # from Python too: the same check guards every output
    with pytest.raises(LmlabError, match="is inside the pretraining run"):
        prepare_shards(outs / "tokin", [outs / "dev.tsv"], outs / "run" / "data" / "train", workers=1,
                       progress=False)
    with pytest.raises(LmlabError, match="is inside the pretraining run"):
        load_tokenizer(outs / "tokin").save(outs / "run" / "data" / "tokenizer")
    assert _state(outs / "run") == before


# ------------------------------------------------------------------- 3. a run's checkpoint names
@pytest.mark.parametrize("command", ["compress quantize --out", "export --out", "finetune --out"])
def test_no_output_takes_a_runs_checkpoint_name(outs, command, capsys, monkeypatch):
    monkeypatch.chdir(outs)
    assert main([*COMMANDS[command], "run/checkpoints/step_6"]) == 2
    _one_line_error(capsys, "--out run/checkpoints/step_6 is inside the pretraining run run",
                    "(its checkpoints)")
    assert not (outs / "run" / "checkpoints" / "step_6").exists()


@pytest.mark.parametrize("what", ["a file", "a folder of yours", "a model moved there"])
def test_pretrain_checks_its_checkpoint_names_before_training(outs, what, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(outs / "run", run)
    name = run / "checkpoints" / "step_3"
    if what == "a file":
        name.write_text("mine")
    elif what == "a folder of yours":
        name.mkdir()
        (name / "notes.txt").write_text("mine")
    else:
        shutil.copytree(outs / "q", name)
    before = _state(run)
    resume = ["pretrain", "--out", str(run), "--resume", "--set", "train.max_steps=3"]
    assert main(resume) == 2
    _one_line_error(capsys, f"{name} ", "the run writes its checkpoint of step 3 there; nothing was trained",
                    f"move it away (mv {name} {name}.other)")
    assert _state(run) == before  # no step trained, no metrics row written
    if what == "a file":  # moved away as told: the same command continues the run
        name.rename(name.with_name("step_3.other"))
        assert main(resume) == 0
        assert (run / "checkpoints" / "step_3" / "train_state.json").is_file()


def test_a_fresh_pretraining_checks_its_checkpoint_names_too(outs, tmp_path):
    from lmlab.train import pretrain

    run = tmp_path / "run"
    ownership.claim_dir(run, "pretraining run", ("checkpoints",))  # as a run that stopped before step 1
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "step_2").write_text("mine")
    settings = json.loads(json.dumps(RUN_SETTINGS))
    settings["data"]["train"] = [str(outs / "tiny.txt")]
    with pytest.raises(LmlabError, match="checkpoint of step 2 there; nothing was trained"):
        pretrain(settings, run, log=lambda m: None)
    assert (run / "checkpoints" / "step_2").read_text() == "mine"
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_2"]


# ------------------------------------------------------------------- 4. files inside a whole output
def test_predictions_inside_a_whole_output_are_refused_so_rebuilding_it_loses_nothing(outs, tmp_path, capsys,
                                                                                         monkeypatch):
    from lmlab.fileio import write_output_file

    monkeypatch.chdir(outs)
    manifest = (outs / "tok" / ownership.MANIFEST).read_bytes()
    for target in ("tok/pred.jsonl", "q/pred.jsonl"):
        assert main(["evaluate", "--checkpoint", "ft", "--data", "dev.tsv", "--predictions", target]) == 2
        _one_line_error(capsys, f"--predictions {target} is inside the", "which lmlab replaces whole")
        assert not (outs / target).exists()
    # it was recorded in the tokenizer's own manifest (as one of its files, deleted with it): never again
    assert (outs / "tok" / ownership.MANIFEST).read_bytes() == manifest
    with pytest.raises(LmlabError, match="is inside the tokenizer"):
        write_output_file(outs / "tok" / "pred.jsonl", "{}\n", "predictions", "--predictions")
    # a user's folder still takes predictions, and a later run replaces its own
    for _ in range(2):
        assert main(["evaluate", "--checkpoint", "ft", "--data", "dev.tsv", "--predictions",
                     str(tmp_path / "pred.jsonl")]) == 0
    capsys.readouterr()


def test_only_the_command_filling_a_folder_writes_inside_it(tmp_path):
    """The process that holds a claim (``claimed_dir``) writes its entries; another command may
    not, even of the same kind; an output a process assembles in its own temporary is its own."""
    from lmlab.fileio import atomic_dir

    kind, entries = "pretraining run", ("checkpoints", "data")
    with ownership.claimed_dir(tmp_path / "run", kind, entries) as run:
        with atomic_dir(run / "checkpoints" / "step_1", marker="x", what="checkpoint") as tmp:
            (tmp / "x").write_text("1")
            with atomic_dir(tmp / "tokenizer", marker="t", what="tokenizer") as inner:  # own temporary
                (inner / "t").write_text("t")
    assert (run / "checkpoints" / "step_1" / "tokenizer" / "t").is_file()
    with pytest.raises(LmlabError, match="inside the pretraining run .* \\(its checkpoints\\)"):
        ownership.check_replaceable_dir(run / "checkpoints" / "step_1", "checkpoint")
    with pytest.raises(LmlabError, match="inside the checkpoint"):
        ownership.check_replaceable_dir(run / "checkpoints" / "step_1" / "tokenizer", "tokenizer")
    with pytest.raises(LmlabError, match="inside the pretraining run"):
        ownership.claim_dir(run / "data", kind, entries)


#: a new name of the user's inside a folder another command fills, meeting none of its entries:
#: results beside a checkpoint (evaluate --harness's default place), a folder of one's own in a run
NEW_NAMES = {
    "evaluate --predictions": "run/checkpoints/step_2.predictions.jsonl",
    "export --out": "run/exported",
}


@pytest.mark.parametrize("command", list(NEW_NAMES))
def test_a_new_name_of_yours_in_a_run_folder_is_written_and_the_run_is_untouched(outs, command, monkeypatch):
    """The docs' own layouts: ``evaluate --harness`` writes ``run/checkpoints/step_N.harness.json``
    by default, ``scale fit`` a grid's ``fit/`` inside the comparison. Nothing of the run changes:
    a single file written there is recorded in the run's manifest beside the run's own files
    (``ownership.BESIDE``), which stay as they were."""
    monkeypatch.chdir(outs)
    path = NEW_NAMES[command]
    before = _state(outs / "run")
    manifest = ownership.read_manifest(outs / "run")
    try:
        assert main([*COMMANDS[command], path]) == 0
        after = _state(outs / "run")
        added = {k for k in after if k == path[4:] or k.startswith(path[4:] + "/")}
        files = {k: v for k, v in after.items() if k not in added and not v[0]}  # folders' times change
        old = {k: v for k, v in before.items() if not v[0]}
        assert added and {k: v for k, v in files.items() if k != ownership.MANIFEST} \
            == {k: v for k, v in old.items() if k != ownership.MANIFEST}
        now = ownership.read_manifest(outs / "run")
        beside = now.pop(ownership.BESIDE, {})
        assert now == {**manifest, ownership.BESIDE: {}} or now == manifest
        assert set(beside) <= {path[4:]}
    finally:
        target = outs / path
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        ownership.write_manifest(outs / "run", {k: v for k, v in manifest.items() if k != "lmlab_manifest"})


def test_predictions_lmlab_wrote_beside_a_checkpoint_are_replaced_and_no_other_file_is(outs, capsys,
                                                                                      monkeypatch):
    """probe8 #1's class: a single file lmlab wrote inside a folder another command fills (predictions
    beside a run's checkpoint) could not be written again: once there, its name was taken for one of
    the run's ("inside the pretraining run ..., where only that pretraining run writes"). It is
    recorded beside the run's own files and replaced while unchanged; edited, or a file of the
    user's, it is refused as such, and the run's own files are never replaceable by it."""
    monkeypatch.chdir(outs)
    path = "run/checkpoints/step_2.predictions.jsonl"
    manifest = ownership.read_manifest(outs / "run")
    argv = COMMANDS["evaluate --predictions"]
    try:
        assert main([*argv, path]) == 0
        assert main([*argv, path]) == 0, capsys.readouterr().err  # lmlab's, unchanged: replaced
        capsys.readouterr()
        (outs / path).write_text("edited\n", encoding="utf-8")
        assert main([*argv, path]) == 2
        _one_line_error(capsys, f"--predictions {path} exists and changed since lmlab wrote it")
        assert (outs / path).read_text(encoding="utf-8") == "edited\n"
        mine = "run/checkpoints/mine.jsonl"
        (outs / mine).write_text("mine\n", encoding="utf-8")
        assert main([*argv, mine]) == 2
        _one_line_error(capsys, f"--predictions {mine} exists and was not written by lmlab")
        assert (outs / mine).read_text(encoding="utf-8") == "mine\n"
        assert main([*argv, "run/config.toml"]) == 2  # the run's own file: never a predictions file
        _one_line_error(capsys, "inside the pretraining run run (its config.toml)")
    finally:
        for name in (path, "run/checkpoints/mine.jsonl"):
            (outs / name).unlink(missing_ok=True)
        ownership.write_manifest(outs / "run", {k: v for k, v in manifest.items() if k != "lmlab_manifest"})


def test_inside_a_folder_a_command_fills_only_its_entries_are_refused(outs):
    """Inside a pretraining run: its entries and what it writes in them (a checkpoint name, even one
    not there yet) are refused; a new name of the user's meets none of them."""
    for taken in ("run/data", "run/data/train", "run/metrics.jsonl", "run/checkpoints/step_9"):
        with pytest.raises(LmlabError, match="inside the pretraining run"):
            ownership.check_destination(outs / taken)
    for free in ("run/notes.md", "run/mine", "run/checkpoints/step_2.harness.json"):
        ownership.check_destination(outs / free)  # no error


@pytest.mark.parametrize("cache", ["run/data", "run/data/train", "ft", "tok"])
def test_a_cache_dir_inside_another_output_is_refused_before_any_work(outs, cache, tmp_path, capsys,
                                                                      monkeypatch):
    """``data.cache_dir`` is an output too (the tokenizer and shards cached there): inside another
    lmlab output it is refused in one line naming the setting, before a tokenizer is trained, and
    nothing is written there or at --out (it was refused only after the tokenizer was trained,
    blaming --out, with the tokenizer left inside the other run's data)."""
    monkeypatch.chdir(outs)
    monkeypatch.delenv("LMLAB_CACHE_DIR", raising=False)
    before = _state(outs)
    out = tmp_path / "new"
    assert main(["pretrain", "--config", "run/config.toml", "--out", str(out), "--set", "train.max_steps=1",
                 "--set", f"data.cache_dir={cache}"]) == 2
    err = _one_line_error(capsys, f"data.cache_dir {cache}/data-", "nothing was written",
                          "choose a data.cache_dir path outside it")
    assert "--out" not in err
    assert _state(outs) == before and not out.exists()


def test_the_env_cache_dir_inside_another_output_is_refused_naming_it(outs, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(outs)
    monkeypatch.setenv("LMLAB_CACHE_DIR", str(outs / "run" / "data"))
    before = _state(outs)
    assert main(["pretrain", "--config", "run/config.toml", "--out", str(tmp_path / "new")]) == 2
    _one_line_error(capsys, "$LMLAB_CACHE_DIR ", "inside the pretraining run", "(its data)")
    assert _state(outs) == before


@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_dangling_link_is_refused_as_every_output(outs, command, tmp_path, capsys, monkeypatch):
    """A link to nothing given as an output is refused, a folder (--out) as a file (--predictions):
    followed, it made its target, somewhere the user never named."""
    monkeypatch.chdir(outs)
    target, link = tmp_path / "nowhere", tmp_path / "dang"
    link.symlink_to(target)
    before = _state(outs)
    assert main([*COMMANDS[command], str(link)]) == 2
    flag = command.split()[-1]
    _one_line_error(capsys, f"{flag} {link} is a link to {target}, which does not exist", "remove the link")
    assert not target.exists() and link.is_symlink() and _state(outs) == before


def test_a_dangling_link_is_refused_by_the_python_api_too(tmp_path):
    link = tmp_path / "dang"
    link.symlink_to(tmp_path / "nowhere")
    with pytest.raises(LmlabError, match="is a link to .*which does not exist"):
        ownership.check_replaceable_dir(link, "tokenizer")
    with pytest.raises(LmlabError, match="is a link to .*which does not exist"):
        ownership.check_replaceable_file(link, "predictions", "--predictions")
    assert not (tmp_path / "nowhere").exists()


# ------------------------------------------------------------- another run's resume folder
def _resume_commands(prefs: Path) -> dict[str, list[str]]:
    """:data:`COMMANDS` and ``align``, whose DPO runs keep a resume folder too."""
    align = ["align", "--checkpoint", "src", "--train", str(prefs), "--dev", str(prefs), "--max-steps", "1",
             "--batch-size", "2", "--out"]
    return {**COMMANDS, "align --out": align}


def _prefs(folder: Path) -> Path:
    row = {"prompt": "Review: good.\nSentiment:", "chosen": " positive", "rejected": " negative"}
    path = folder / "p.jsonl"
    path.write_text((json.dumps(row) + "\n") * 4, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", list(_resume_commands(Path("p.jsonl"))))
def test_no_output_is_written_inside_another_runs_resume_folder(outs, command, tmp_path, capsys, monkeypatch):
    """A fine-tuning or DPO run keeps ``.OUT.resume/`` beside its output while it runs, and clears
    and removes it when it ends. Every command wrote its output there (a new name beside the resume
    state's entries was taken for a name of the user's, as in a pretraining run's folder): the
    folder was then never removed, and it kept the intruder. Now it is refused up front, naming
    whose resume folder it is."""
    from lmlab.finetune.resume import FOLDER, resume_dir

    monkeypatch.chdir(outs)
    rdir = FOLDER.claim(tmp_path / "ftr")  # the resume folder of a fine-tuning run writing ftr
    assert rdir == resume_dir(tmp_path / "ftr")
    (rdir / "metrics.jsonl").write_text("")
    argv = _resume_commands(_prefs(tmp_path))[command]
    before, ours = _state(outs), _state(tmp_path)
    flag = command.split()[-1]
    assert main([*argv, str(rdir / "sub")]) == 2
    _one_line_error(capsys, f"{flag} {rdir / 'sub'} is inside {rdir}, the resume folder of the fine-tuning "
                    f"run writing {tmp_path / 'ftr'}", "nothing was written", "outside it")
    assert _state(outs) == before and _state(tmp_path) == ours


@pytest.mark.parametrize("command", ["export --out", "evaluate --predictions", "align --out"])
def test_an_output_never_makes_the_resume_folder_of_another_output(outs, command, tmp_path, capsys,
                                                                   monkeypatch):
    """With no resume folder there yet, an output inside ``.al5.resume/`` made it: the next run
    writing ``al5`` was refused, its resume folder "not written by lmlab". The name is lmlab's."""
    monkeypatch.chdir(outs)
    argv = _resume_commands(_prefs(tmp_path))[command]
    flag = command.split()[-1]
    assert main([*argv, str(tmp_path / ".al5.resume" / "sub")]) == 2
    rdir = tmp_path / ".al5.resume"
    _one_line_error(capsys, f"{flag} {rdir / 'sub'} is inside {rdir}, where lmlab keeps the resume state of "
                    f"a fine-tuning or DPO run writing {tmp_path / 'al5'}", "nothing was written")
    assert not (tmp_path / ".al5.resume").exists()


@pytest.mark.parametrize("command", ["export --out", "evaluate --predictions", "align --out"])
def test_an_output_never_takes_the_name_of_another_outputs_resume_folder(outs, command, tmp_path, capsys,
                                                                        monkeypatch):
    """``--out .al5.resume`` itself was accepted: the output took the name where a run writing
    ``al5`` keeps its resume state, and that run, once stopped, could not keep one there (the
    folder was not its own). Refused up front, like any path inside that name."""
    monkeypatch.chdir(outs)
    argv = _resume_commands(_prefs(tmp_path))[command]
    flag = command.split()[-1]
    rdir = tmp_path / ".al5.resume"
    assert main([*argv, str(rdir)]) == 2
    _one_line_error(capsys, f"{flag} {rdir} is the name where lmlab keeps the resume state of a fine-tuning "
                    f"or DPO run writing {tmp_path / 'al5'}", "nothing was written", "another name")
    assert not rdir.exists()


def test_only_the_run_owning_a_resume_folder_writes_inside_it(tmp_path):
    """The run filling its resume folder writes its checkpoints there; relative paths are named as
    given; a folder of that name lmlab did not claim is the user's, as any folder."""
    from lmlab.fileio import atomic_dir
    from lmlab.finetune.resume import FOLDER, resume_dir
    from lmlab.tokenizers import train_tokenizer

    with FOLDER.claimed(tmp_path / "ft") as rdir:
        with atomic_dir(rdir / "checkpoints" / "step_1", marker="x", what="checkpoint") as tmp:
            (tmp / "x").write_text("1")
        # its own checkpoint, once sealed, stays whole
        with pytest.raises(LmlabError, match="inside the checkpoint"):
            ownership.check_replaceable_dir(rdir / "checkpoints" / "step_1" / "tok", "tokenizer")
    assert (resume_dir(tmp_path / "ft") / "checkpoints" / "step_1" / "x").is_file()
    tok = train_tokenizer("bytelevel", ["a b c"] * 10, vocab_size=270)
    with pytest.raises(LmlabError, match="is inside .*the resume folder of the fine-tuning run writing"):
        tok.save(resume_dir(tmp_path / "ft") / "tok")
    cwd = os.getcwd()
    os.chdir(tmp_path)
    try:
        with pytest.raises(LmlabError) as e:
            ownership.check_destination(".ft.resume/a/b")
    finally:
        os.chdir(cwd)
    assert e.value.problem.startswith("--out .ft.resume/a/b is inside .ft.resume, the resume folder of the "
                                      "fine-tuning run writing ft,")
    (tmp_path / ".mine.resume").mkdir()  # yours: not a resume folder lmlab claimed
    ownership.check_destination(tmp_path / ".mine.resume" / "x")

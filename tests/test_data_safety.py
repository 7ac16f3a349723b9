"""Nothing the user had is lost: ``--out`` never wipes an unrelated directory, never replaces an input."""

from __future__ import annotations

import os
import shutil

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.loading import load_model
from lmlab.tokenizers import train_tokenizer


def _one_line_error(capsys, *needles):
    from assertions import assert_one_line_error

    assert_one_line_error(capsys, *needles)


@pytest.fixture()
def thesis(tmp_path):
    d = tmp_path / "thesis"
    d.mkdir()
    (d / "thesis.tex").write_text("\\chapter{Three years of work}")
    return d


def _intact(thesis):
    assert sorted(os.listdir(thesis)) == ["thesis.tex"]
    assert (thesis / "thesis.tex").read_text() == "\\chapter{Three years of work}"


def test_model_save_refuses_an_unrelated_non_empty_directory(thesis, ckpt):
    model = load_model(ckpt)
    with pytest.raises(LmlabError, match="was not written by lmlab"):
        model.save(thesis)
    _intact(thesis)
    model.save(ckpt)  # an earlier model is replaced
    assert load_model(ckpt).num_parameters() == model.num_parameters()


def test_export_refuses_an_unrelated_directory(thesis, ckpt, capsys):
    assert main(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(thesis)]) == 2
    _one_line_error(capsys, str(thesis), "choose a new --out")
    _intact(thesis)


def test_import_refuses_an_unrelated_directory(thesis, ckpt, tmp_path, capsys):
    hf = tmp_path / "hf"
    assert main(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(hf)]) == 0
    capsys.readouterr()
    assert main(["import", "--hf", str(hf), "--out", str(thesis)]) == 2
    _one_line_error(capsys, "was not written by lmlab", "thesis.tex")
    _intact(thesis)


def test_output_equal_to_or_holding_an_input_is_refused(ckpt, tmp_path, capsys):
    before = {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()}
    assert main(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(ckpt)]) == 2
    _one_line_error(capsys, "would replace the input --checkpoint")
    assert main(["import", "--hf", str(ckpt), "--out", str(ckpt)]) == 2
    _one_line_error(capsys, "would replace the input --hf")
    assert {p: p.read_bytes() for p in ckpt.rglob("*") if p.is_file()} == before
    hf = tmp_path / "hf"  # an earlier export that now holds the checkpoint being exported
    assert main(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", str(hf)]) == 0
    shutil.copytree(ckpt, hf / "ck")
    assert main(["export", "--checkpoint", str(hf / "ck" / "."), "--format", "hf", "--out", str(hf)]) == 2
    _one_line_error(capsys, "would replace the input --checkpoint")
    assert (hf / "ck" / "model.safetensors").is_file()
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a corpus to learn a tokenizer from\n" * 30)
    train = ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "280"]
    tok = tmp_path / "tok"
    assert main(train + ["--input", str(corpus), "--out", str(tok)]) == 0
    capsys.readouterr()
    saved = (tok / "tokenizer.json").read_bytes()
    assert main(train + ["--input", str(tok / "tokenizer.json"), "--out", str(tok)]) == 2
    _one_line_error(capsys, "would replace the input --input")
    assert (tok / "tokenizer.json").read_bytes() == saved


def test_out_dot_is_refused_not_wiped(ckpt, tmp_path, capsys, monkeypatch):
    work = tmp_path / "work"
    work.mkdir()
    (work / "data.csv").write_text("a,b\n")
    monkeypatch.chdir(work)
    assert main(["export", "--checkpoint", str(ckpt), "--format", "hf", "--out", "."]) == 2
    _one_line_error(capsys, "choose a new --out")
    assert os.listdir(work) == ["data.csv"]


def test_finetune_and_compress_refuse_an_unrelated_directory(thesis, ckpt, data_dir, capsys):
    sst2 = data_dir / "glue" / "sst2" / "dev.tsv"
    assert main(["finetune", "--checkpoint", str(ckpt), "--task", "sst2", "--train", str(sst2),
                 "--dev", str(sst2), "--out", str(thesis), "--max-steps", "1", "--max-train-examples", "8",
                 "--max-eval-examples", "8", "--no-progress"]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    _intact(thesis)
    assert main(["compress", "quantize", "--checkpoint", str(ckpt), "--out", str(thesis)]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    _intact(thesis)


def test_a_new_output_cleans_what_dead_writers_left_beside_it(ckpt, tmp_path):
    import subprocess
    import sys

    from lmlab import ownership

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    out = tmp_path / "model"
    left = ownership.make_temporary(tmp_path, "model", "model")  # marked as lmlab's, by a process...
    left = left.rename(tmp_path / f".model.tmp-{dead.pid}-abcd")
    ownership.start_temporary(left, "model", pid=dead.pid)  # ...that has ended
    live = ownership.make_temporary(tmp_path, "model", "model")  # a writer still running: never touched
    lookalike = tmp_path / f".model.tmp-{dead.pid}-draft"  # the user's, only named like one: kept
    lookalike.mkdir()
    for d in (left, live, lookalike):
        (d / "model.safetensors").write_bytes(b"\0" * 100)
    load_model(ckpt).save(out)
    assert not left.exists() and live.is_dir() and (out / "model.safetensors").is_file()
    assert (lookalike / "model.safetensors").read_bytes() == b"\0" * 100


@pytest.mark.parametrize("code, needle", [("ENOSPC", "the disk is full while writing"),
                                          ("EROFS", "read-only file system"),
                                          ("EACCES", "permission denied")])
def test_disk_full_read_only_or_forbidden_is_one_line(ckpt, tmp_path, capsys, monkeypatch, code, needle):
    import errno

    import safetensors.torch

    hf = tmp_path / "hf"  # an earlier export, which must survive
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(hf)]) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in hf.iterdir()}

    def fail(*a, **k):
        raise OSError(getattr(errno, code), "simulated", str(hf / "model.safetensors"))

    monkeypatch.setattr(safetensors.torch, "save_file", fail)
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(hf)]) == 2
    _one_line_error(capsys, needle)
    assert {p.name: p.read_bytes() for p in hf.iterdir()} == before and not list(tmp_path.glob(".hf.*"))


def test_written_model_files_are_readable_by_the_group_like_the_rest(ckpt, tmp_path):
    old = os.umask(0o022)
    try:
        load_model(ckpt).save(tmp_path / "m")
    finally:
        os.umask(old)
    modes = {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / "m").rglob("*")}
    assert modes["model.safetensors"] == 0o644 and modes["config.json"] == 0o644  # safetensors wrote 0600


def test_a_checkpoint_whose_tokenizer_was_swapped_is_refused(ckpt, tmp_path, capsys):
    other = train_tokenizer("bytelevel", ["a different corpus gives other merges entirely\n" * 40],
                            vocab_size=280)
    other.save(ckpt.parent / "other")
    shutil.rmtree(ckpt / "tokenizer")
    shutil.copytree(ckpt.parent / "other", ckpt / "tokenizer")  # same vocabulary size, other tokens
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "to be"]) == 2
    _one_line_error(capsys, "is not the tokenizer this model was saved with")


def test_a_safetensors_disk_error_is_one_line(ckpt, tmp_path, capsys, monkeypatch):
    import safetensors.torch
    from safetensors import SafetensorError

    def full(*a, **k):
        raise SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                              'message: "No space left on device" })')

    monkeypatch.setattr(safetensors.torch, "save_file", full)
    assert main(["export", "--checkpoint", str(ckpt), "--out", str(tmp_path / "hf")]) == 2
    _one_line_error(capsys, "the disk is full")
    assert not (tmp_path / "hf").exists()


def test_a_json_schema_nested_too_deeply_is_one_line(ckpt, tmp_path, capsys):
    deep = tmp_path / "schema.json"
    deep.write_text('{"type": "object", "properties": {"a": ' * 3000 + "{}" + "}}" * 3000)
    assert main(["generate", "--checkpoint", str(ckpt), "--prompt", "to", "--json-schema", str(deep)]) == 2
    _one_line_error(capsys, "nested too deeply")

"""A tokenizer path may name a model, a checkpoint or a pretraining run: every ``--tokenizer`` and
``load_tokenizer`` read it as ``--checkpoint`` does (a run means its newest checkpoint), and use the
tokenizer in its ``tokenizer/`` folder."""

from __future__ import annotations

import json
import shutil

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.tokenizers import load_tokenizer


@pytest.fixture()
def run_dir(ckpt, tmp_path):
    """A pretraining run's layout around the tiny checkpoint: ``run/checkpoints/step_2``."""
    import torch
    from safetensors.torch import save_file

    step = tmp_path / "run" / "checkpoints" / "step_2"
    shutil.copytree(ckpt, step)
    (step / "train_state.json").write_text(json.dumps({"step": 2}), encoding="utf-8")
    save_file({"x": torch.zeros(1)}, str(step / "train_state.safetensors"))
    return tmp_path / "run"


def test_load_tokenizer_reads_a_model_a_checkpoint_and_a_run(ckpt, run_dir):
    want = load_tokenizer(ckpt / "tokenizer").encode("to be or not")
    for path in (ckpt, run_dir / "checkpoints" / "step_2", run_dir):
        assert load_tokenizer(path).encode("to be or not") == want, path


def test_every_tokenizer_flag_takes_a_run(ckpt, run_dir, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("to be or not to be\n" * 50, encoding="utf-8")
    for path in (run_dir, run_dir / "checkpoints" / "step_2"):
        for argv in (["tokenizer", "encode", "--tokenizer", path, "--text", "to be"],
                     ["tokenizer", "inspect", path],
                     ["generate", "--checkpoint", run_dir, "--tokenizer", path, "--prompt", "to",
                      "--max-new-tokens", "2", "--temperature", "0"],
                     ["data", "prepare", "--tokenizer", path, "--input", text, "--out",
                      tmp_path / f"shards-{path.name}", "--workers", "1"]):
            code = main([str(a) for a in argv])
            err = capsys.readouterr().err
            assert code == 0, (argv, err)


def test_a_folder_without_a_tokenizer_says_what_it_may_be(tmp_path):
    with pytest.raises(LmlabError) as e:
        load_tokenizer(tmp_path)
    assert "neither tokenizer.json nor vocab.txt" in e.value.problem and "pretraining run" in e.value.fix

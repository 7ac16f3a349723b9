"""A pretraining run directory (what `lmlab pretrain --out RUN` leaves) stands for its newest complete
checkpoint wherever a checkpoint is read, by one rule (lmlab.run_dirs.run_checkpoint): the
command line's --checkpoint/--teacher/--base and the Python API's finetune and load_model alike; the
CLI's note that says so comes only once the command proceeds, so a refusal stays one line."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from lmlab.cli import main
from lmlab.errors import LmlabError
from tests.assertions import assert_one_line_error


@pytest.fixture()
def run(tmp_path):
    """RUN/checkpoints/step_4: a tiny GPT-2 with its tokenizer, as a pretraining run leaves it."""
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer("bytelevel", ["to be or not to be, that is the question\n" * 40], vocab_size=280)
    step = tmp_path / "run" / "checkpoints" / "step_4"
    build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size, eos_token_id=tok.eos_id,
                           bos_token_id=tok.bos_id)).save(step, tokenizer=tok)
    (step / "train_state.json").write_text("{}")
    save_file({"rng.torch": torch.zeros(1)}, step / "train_state.safetensors")
    return tmp_path / "run"


@pytest.fixture()
def two_columns(tmp_path):
    f = tmp_path / "two.tsv"
    f.write_text("sentence\tlabel\n" + "a fine film\t1\na dull one\t0\n" * 4, encoding="utf-8")
    return f


def test_the_python_finetune_reads_a_run_directory_as_the_cli_does(run, two_columns, tmp_path):
    """It said "RUN/config.json does not exist; check the path" where the CLI used the newest checkpoint."""
    from lmlab.finetune import finetune

    with pytest.raises(LmlabError) as e:  # the run is read: the next problem is the data's
        finetune(str(run), "rte", two_columns, two_columns, tmp_path / "ft")
    assert "config.json" not in str(e.value) and f"{two_columns} line 1: header" in str(e.value)
    result = finetune(run, "sst2", two_columns, two_columns, None, max_steps=1, batch_size=2, progress=False)
    assert result.model is not None


def test_a_refusal_after_the_run_directory_is_one_line(run, two_columns, tmp_path, capsys):
    """The "RUN: using its newest checkpoint" note used to come before the error line: two lines."""
    argv = ["finetune", "--checkpoint", str(run), "--task", "rte", "--train", str(two_columns),
            "--dev", str(two_columns), "--out", str(tmp_path / "ft"), "--no-progress"]
    assert main(argv) == 2
    assert_one_line_error(capsys, f"{two_columns} line 1: header ['sentence', 'label'] does not name")


def test_the_note_comes_once_the_command_proceeds(run, capsys):
    assert main(["generate", "--checkpoint", str(run), "--prompt", "to be", "--max-new-tokens", "2"]) == 0
    err = capsys.readouterr().err
    assert err.count(f"{run}: using its newest checkpoint, {run / 'checkpoints' / 'step_4'}") == 1


def test_python_load_model_reads_a_run_directory_as_the_cli_does(run):
    """load_model(RUN) said "RUN is an lmlab pretraining run ...: it needs no import", while
    generate()'s own fix tells users to call load_model('runs/gpt')."""
    from lmlab.generate import generate
    from lmlab.loading import load_model, model_facts

    with pytest.raises(LmlabError, match=rf"load it first: model = load_model\('{run}'\)"):
        generate(str(run), torch.tensor([[1, 2]]))
    model = load_model(str(run))  # the fix that error gives works
    assert model.architecture == "decoder" and model.tokenizer is not None
    assert model_facts(run).architecture == "decoder"
    assert generate(model, torch.tensor([[1, 2]]), max_new_tokens=2).shape[-1] >= 2


def test_export_reads_a_hugging_face_directory_as_the_other_commands_do(run, tmp_path, capsys):
    """export --checkpoint HF_DIR said "format version None ...; re-save it with a matching lmlab
    version" (a false cause) while generate, finetune, evaluate and quantize read the same folder."""
    from lmlab.loading import load_model

    hf, again = tmp_path / "hf", tmp_path / "hf-again"
    assert main(["export", "--checkpoint", str(run), "--format", "hf", "--out", str(hf)]) == 0
    assert main(["generate", "--checkpoint", str(hf), "--prompt", "to be", "--max-new-tokens", "2"]) == 0
    capsys.readouterr()
    assert main(["export", "--checkpoint", str(hf), "--format", "hf", "--out", str(again)]) == 0
    assert "wrote gpt2 model" in capsys.readouterr().out
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(load_model(hf)(ids).logits, load_model(again)(ids).logits)

"""What lmlab.interop refuses in a Hugging Face folder (the one place such folders are read, so
`import`, `evaluate/generate --checkpoint HFDIR` and the Python API all refuse it): a corrupt
tokenizer, integer weights, NaN or infinite weights; each in one line, before a model is built."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from lmlab.cli import main
from lmlab.interop import hf_export, hf_import
from lmlab.models import build_model, get_preset


@pytest.fixture(scope="module")
def hf_gpt(tmp_path_factory, shakespeare):
    """A gpt2-tiny exported as a Hugging Face folder with its byte-level tokenizer."""
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", [shakespeare[:5000]], vocab_size=300)
    torch.manual_seed(0)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size))
    return hf_export(model, tmp_path_factory.mktemp("hf") / "gpt", tokenizer=tok)


def copy_of(src, dst):
    dst.mkdir()
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


def one_line_error(capsys, *args):
    code = main([str(a) for a in args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and err.startswith("error: ") and "\n" not in err, err
    return err


def test_a_good_folder_imports_with_its_tokenizer(hf_gpt):
    model = hf_import(hf_gpt)
    assert model.tokenizer is not None and model.tokenizer.vocab_size == model.config.vocab_size


def test_a_corrupt_tokenizer_is_refused_not_dropped(hf_gpt, tmp_path, capsys):
    d = copy_of(hf_gpt, tmp_path / "badtok")
    (d / "tokenizer.json").write_text('{"broken": ')
    err = one_line_error(capsys, "import", "--hf", d, "--out", tmp_path / "imp")
    assert "the tokenizer of Hugging Face model" in err and "tokenizer.json is corrupt" in err
    assert not (tmp_path / "imp").exists()
    err = one_line_error(capsys, "generate", "--checkpoint", d, "--prompt", "hi", "--max-new-tokens", 1)
    assert "tokenizer.json is corrupt" in err


def test_a_tokenizer_of_a_kind_lmlab_does_not_read_is_still_left_out(hf_gpt, tmp_path):
    d = copy_of(hf_gpt, tmp_path / "wordlevel")
    data = json.loads((d / "tokenizer.json").read_text())
    data["model"]["type"] = "WordLevel"  # a valid tokenizer.json of a model type lmlab does not implement
    (d / "tokenizer.json").write_text(json.dumps(data))
    (d / "tokenizer_config.json").unlink()  # as a foreign folder: no lmlab_algo
    assert hf_import(d).tokenizer is None


@pytest.mark.parametrize("kind,message", [
    ("int32", "holds int32 values, not floating point"),
    ("nan", "holds NaN or infinite values"),
    ("inf", "holds NaN or infinite values"),
])
def test_integer_or_non_finite_weights_are_refused(hf_gpt, tmp_path, capsys, kind, message):
    d = copy_of(hf_gpt, tmp_path / kind)
    state = load_file(str(d / "model.safetensors"))
    name = "transformer.h.1.mlp.c_fc.weight"
    if kind == "int32":
        state[name] = (state[name] * 100).to(torch.int32)
    else:
        state[name][3, 5] = float(kind)
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    err = one_line_error(capsys, "import", "--hf", d, "--out", tmp_path / "imp")
    assert f"weight {name} of Hugging Face model" in err and message in err
    assert not (tmp_path / "imp").exists()
    err = one_line_error(capsys, "generate", "--checkpoint", d, "--prompt", "hi", "--max-new-tokens", 1)
    assert message in err


def test_importing_an_lmlab_output_says_it_needs_no_import(ckpt, tmp_path, capsys):
    """import --hf on an lmlab checkpoint or pretraining run: one line saying what it is (it needs no
    import), not "config.json does not exist" or "has no model_type"."""
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "step_1").symlink_to(ckpt, target_is_directory=True)
    for given, what in ((ckpt, "an lmlab checkpoint"), (run, "an lmlab pretraining run")):
        capsys.readouterr()
        assert main(["import", "--hf", str(given), "--out", str(tmp_path / "im")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith(f"error: {given} is {what}, not a Hugging Face model "
                                                      "directory: it needs no import"), err
        assert not (tmp_path / "im").exists()

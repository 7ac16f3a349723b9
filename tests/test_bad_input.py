"""Bad input across commands: one line on stderr, exit code 2, nothing lost."""

from __future__ import annotations

import json

import pytest

from lmlab.cli import main


def _one_line_error(capsys, *needles):
    from assertions import assert_one_line_error

    assert_one_line_error(capsys, *needles)


@pytest.fixture()
def corpus(tmp_path):
    f = tmp_path / "c.txt"
    f.write_text("low lower lowest newer wider\n" * 20)
    return f


def test_tokenizer_train_never_wipes_an_unrelated_directory_or_file(corpus, tmp_path, capsys):
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.md").write_text("keep me")
    args = ["tokenizer", "train", "--algo", "bytelevel", "--vocab-size", "300", "--input", str(corpus)]
    assert main(args + ["--out", str(project)]) == 2
    _one_line_error(capsys, "was not written by lmlab")
    assert (project / "notes.md").read_text() == "keep me"
    assert main(args + ["--out", str(corpus)]) == 2  # the input itself
    _one_line_error(capsys, "would replace the input --input")
    other = tmp_path / "other.txt"
    other.write_text("a file of mine")
    assert main(args + ["--out", str(other)]) == 2  # a file that is not an input
    _one_line_error(capsys, "is a file")
    assert other.read_text() == "a file of mine"
    assert corpus.read_text().startswith("low lower")
    assert main(args + ["--out", str(tmp_path / "tok")]) == 0
    assert main(args + ["--out", str(tmp_path / "tok")]) == 0  # re-training over a tokenizer is fine


def test_unknown_encoding_is_one_line(corpus, tmp_path, capsys):
    from assertions import exit_code

    assert exit_code(["tokenizer", "train", "--algo", "bpe", "--vocab-size", "100", "--input", str(corpus),
                      "--encoding", "nope", "--out", str(tmp_path / "t")]) == 2  # refused as it is parsed
    _one_line_error(capsys, "argument --encoding: is not a text encoding Python knows (got 'nope')")


def test_damaged_tokenizer_json_is_one_line_everywhere(corpus, tmp_path, capsys):
    assert main(["tokenizer", "train", "--algo", "bpe", "--vocab-size", "100", "--input", str(corpus),
                 "--out", str(tmp_path / "t")]) == 0
    capsys.readouterr()
    path = tmp_path / "t" / "tokenizer.json"
    data = json.loads(path.read_text())
    data["model"]["merges"] = [["a"]]
    path.write_text(json.dumps(data))
    for cmd in (["tokenizer", "encode", "--tokenizer", str(tmp_path / "t"), "--text", "low"],
                ["tokenizer", "inspect", str(tmp_path / "t")]):
        assert main(cmd) == 2
        _one_line_error(capsys, "is corrupt")


def test_incomplete_hf_config_is_one_line(tmp_path, capsys):
    import torch
    from safetensors.torch import save_file

    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2"}')
    save_file({"x": torch.zeros(1)}, tmp_path / "hf" / "model.safetensors")
    assert main(["import", "--hf", str(tmp_path / "hf"), "--out", str(tmp_path / "out")]) == 2
    _one_line_error(capsys, "lacks 'vocab_size'")


def test_unknown_head_is_one_line():
    from lmlab.errors import LmlabError
    from lmlab.models import build_model, get_preset

    model = build_model(get_preset("gpt2-tiny"))
    with pytest.raises(LmlabError, match="no head 'cls'; pick from its heads: lm"):
        model.selected_heads(("cls",))  # what a forward or objective naming a head checks


def test_generate_rejects_a_bad_device_and_beam_count(tmp_path, capsys):
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", ["to be or not to be " * 50], vocab_size=280)
    build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size)).save(tmp_path / "ck", tokenizer=tok)
    base = ["generate", "--checkpoint", str(tmp_path / "ck"), "--prompt", "to", "--max-new-tokens", "3"]
    from assertions import exit_code

    assert exit_code(base + ["--device", "bogus"]) == 2  # refused as the flags are parsed (lmlab.values)
    _one_line_error(capsys, "argument --device: is not a device lmlab runs on (got 'bogus')")
    assert exit_code(base + ["--num-beams", "0"]) == 2
    _one_line_error(capsys, "argument --num-beams: must be at least 1 (got '0')")


def test_generate_on_a_classifier_checkpoint_is_one_line(tmp_path, capsys):
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", ["to be or not to be " * 50], vocab_size=280)
    model = build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size), heads=("cls",))
    model.save(tmp_path / "c", tokenizer=tok)
    assert main(["generate", "--checkpoint", str(tmp_path / "c"), "--prompt", "to"]) == 2  # was an IndexError
    _one_line_error(capsys, "first head is 'cls'", "lmlab evaluate")


def test_example_limits_and_batch_size_must_be_positive():
    from lmlab.errors import LmlabError
    from lmlab.finetune import evaluate
    from lmlab.tasks.readers import limit

    with pytest.raises(LmlabError, match="example limit must be at least 1, got -1"):
        limit([1, 2, 3], -1)  # used to drop the last example silently
    assert limit([1, 2, 3], 2) == [1, 2]
    with pytest.raises(LmlabError, match="evaluate's batch_size must be at least 1"):
        evaluate("no-such-dir", "x.tsv", batch_size=0)


def test_pretrain_rejects_an_unknown_encoding_before_any_work():
    from lmlab.errors import LmlabError
    from lmlab.train import load_config

    with pytest.raises(LmlabError, match=r"data.encoding is not a text encoding Python knows \(got 'nope'\)"):
        load_config("configs/gpt-tiny-clm.toml", ["data.encoding=nope"])


def test_hf_weight_map_pointing_outside_the_model_directory_is_refused(tmp_path, capsys):
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    tok = train_tokenizer("bytelevel", ["to be or not to be " * 50], vocab_size=280)
    build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size)).save(tmp_path / "ck", tokenizer=tok)
    assert main(["export", "--checkpoint", str(tmp_path / "ck"), "--out", str(tmp_path / "hf")]) == 0
    capsys.readouterr()
    hf = tmp_path / "hf"
    (hf / "model.safetensors").rename(tmp_path / "elsewhere.safetensors")
    (hf / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"transformer.wte.weight": "../elsewhere.safetensors"}}))
    assert main(["import", "--hf", str(hf), "--out", str(tmp_path / "back")]) == 2
    _one_line_error(capsys, "weight_map names '../elsewhere.safetensors'")


def test_a_label_outside_the_task_label_set_is_refused_with_its_line(tmp_path, capsys, minilm_dir):
    from lmlab.finetune import finetune

    train = tmp_path / "train.tsv"
    train.write_text("sentence\tlabel\ngood movie\t1\nbad movie\t0\nfine\tpositive\n")
    with pytest.raises(Exception, match="train.tsv line 4: label 'positive' is not one of sst2's labels"):
        finetune(minilm_dir, "sst2", train, train, None, max_steps=1, progress=False, log=lambda m: None)


@pytest.mark.parametrize("setting, needle", [
    ("model.d_model=1000000", "parameters"), ("model.vocab_size=1000000000000", "parameters"),
    ("train.batch_size=1000000000", "lower train.batch_size and raise train.grad_accum"),
    ("train.eps=-1", "train.eps must be a small positive number"),
    ("model.n_heads=0", "model.n_heads must be at least 1"),  # was a ZeroDivisionError
    ("train.grad_accum=1000000000", "train.grad_accum must be at most 65536"),  # was eaten memory
])
def test_sizes_that_cannot_fit_and_bad_numbers_fail_before_any_work(tmp_path, capsys, setting, needle):
    import time

    t0 = time.perf_counter()
    rc = main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(tmp_path / "r"),
               "--set", setting])
    assert rc == 2 and time.perf_counter() - t0 < 30
    _one_line_error(capsys, needle)
    assert not (tmp_path / "r" / "data").exists()  # nothing was tokenised


@pytest.mark.parametrize("setting, needle, not_said", [
    ("model.n_layers=100000", "the model (n_layers 100,000, d_model 64, vocabulary 4,096) is too large to "
     "train here even one sequence at a time: choose a smaller model (model.n_layers", "train.batch_size"),
    ("train.batch_size=100000", "lower train.batch_size and raise train.grad_accum", "smaller model"),
])
def test_a_micro_batch_that_cannot_fit_names_what_to_shrink(tmp_path, capsys, monkeypatch, setting, needle,
                                                            not_said):
    """A model too deep for even one sequence was told to lower train.batch_size: the fix names the
    model's size when a micro-batch of one sequence (beside the weights) cannot fit either."""
    from lmlab import budget

    monkeypatch.setattr(budget, "physical_memory_bytes", lambda: 25 * 10**9)
    assert main(["pretrain", "--config", "configs/gpt-tiny-clm.toml", "--out", str(tmp_path / "r"),
                 "--set", setting]) == 2
    from assertions import assert_one_line_error

    err = assert_one_line_error(capsys, "the activations of a micro-batch", needle)
    assert not_said not in err.partition("memory; ")[2]


@pytest.mark.parametrize("objective, vocab", [("clm", "300"), ("t5", "400")])  # t5 adds 100 sentinels
def test_a_special_id_outside_the_vocabulary_cites_the_runs_vocabulary(tmp_path, capsys, objective, vocab):
    """It cited GPT-2's 50257, the preset's, for a run whose tokenizer will have 300 tokens
    (config.fits.planned_vocab_size: one answer for the checks made before the tokenizer exists)."""
    preset = "t5-tiny" if objective == "t5" else "gpt2-tiny"
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(f'[model]\npreset = "{preset}"\n[objective]\nname = "{objective}"\n[data]\n'
                      'train = "$LMLAB_DATA/pretrain/tinyshakespeare/input.txt"\nval_fraction = 0.1\n'
                      'tokenizer = { algo = "bytelevel", vocab_size = 300 }\n[train]\nmax_steps = 4\n'
                      "batch_size = 4\nseq_len = 32\n")
    argv = ["pretrain", "--config", str(recipe), "--out", str(tmp_path / "r")]
    assert main([*argv, "--set", "model.pad_token_id=99999"]) == 2
    _one_line_error(capsys, f"pad_token_id 99999 is outside the vocabulary of {vocab};")
    assert not (tmp_path / "r" / "data").exists()  # before any tokenizer is trained


def test_non_utf8_toml_and_deeply_nested_json_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_bytes(b'x = "\xff"\n')
    assert main(["pretrain", "--config", str(bad), "--out", str(tmp_path / "r")]) == 2
    _one_line_error(capsys, "is not UTF-8")
    deep = tmp_path / "ck"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    (deep / "model.safetensors").write_bytes(b"")
    assert main(["generate", "--checkpoint", str(deep), "--prompt", "hi"]) == 2
    _one_line_error(capsys, "nested too deeply")


def test_a_folder_given_for_an_input_file_is_called_a_directory_by_every_reader(ckpt, tmp_path, capsys):
    """One check of a file read by name (lmlab.fileio.existing_file): a folder passed for a recipe, a JSON
    Schema or a text file says so, not "does not exist" (the recipe and schema readers said that)."""
    folder = tmp_path / "adir"
    folder.mkdir()
    cases = ((["pretrain", "--config", str(folder), "--out", str(tmp_path / "r")], "config file"),
             (["generate", "--checkpoint", str(ckpt), "--prompt", "hi", "--json-schema", str(folder)],
              "JSON Schema file"),
             (["tokenizer", "encode", "--tokenizer", str(ckpt / "tokenizer"), "--input", str(folder)],
              "input file"))
    for argv, what in cases:
        assert main(argv) == 2
        _one_line_error(capsys, f"{what} {folder} is a directory; pass a file, not a folder")
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("section, key, value, needle", [
    ("model", "n_heads", 0, "model.n_heads must be at least 1"),
    ("train", "grad_accum", 10**9, "train.grad_accum must be at most 65536"),
])
def test_pretrain_dict_refuses_zero_heads_and_a_huge_global_batch_before_writing(tmp_path, section, key,
                                                                                value, needle):
    """A recipe's model fields get the typed ranges of the model config (as get_preset does), and
    train.grad_accum is bounded, so both are refused before the tokenizer or the data are made."""
    from lmlab.errors import LmlabError
    from lmlab.train import pretrain

    (tmp_path / "train.txt").write_text("".join(f"line {i} of the text\n\n" for i in range(200)))
    cfg = {"model": {"preset": "gpt2-tiny", "d_model": 16, "n_layers": 1, "n_heads": 2, "d_ff": 32,
                     "max_positions": 32},
           "data": {"train": [str(tmp_path / "train.txt")], "val": [], "val_fraction": 0.2,
                    "tokenizer": {"algo": "bytelevel", "vocab_size": 280}},
           "train": {"max_steps": 1, "batch_size": 2, "seq_len": 16, "threads": 1, "precision": "fp32",
                     "progress": "off"}}
    cfg[section][key] = value
    with pytest.raises(LmlabError, match=needle):
        pretrain(cfg, tmp_path / "run", log=lambda m: None)
    assert not (tmp_path / "run").exists()

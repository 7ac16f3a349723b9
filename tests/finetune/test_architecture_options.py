"""A fine-tuning setting that only one formulation of a task reads (lm_weight and decoder_style for a
decoder classifier, max_target_length and prefix for an encoder-decoder's text-to-text) is refused on
a checkpoint of another architecture, as the per-task settings are refused on another task: by one
table (lmlab.config.finetune.ARCHITECTURE_RULES, the rule kind of PEFT's MODEL_RULES), checked from
the checkpoint's config before any weight is read, for `lmlab finetune`, Python's finetune() and a
grid's arms alike. Only a setting the user gave counts; a default never does."""

from __future__ import annotations

import copy

import pytest
import torch
from assertions import assert_one_line_error

from lmlab.cli import main
from lmlab.config.finetune import FinetuneConfig
from lmlab.errors import LmlabError

SST2 = "sentence\tlabel\ngood film\t1\nbad film\t0\nfine film\t1\nawful film\t0\n"


@pytest.fixture()
def files(tmp_path):
    f = tmp_path / "sst2.tsv"
    f.write_text(SST2, encoding="utf-8")
    return f


@pytest.fixture()
def models(tmp_path):
    """A tiny encoder and a tiny decoder (random weights, a byte-level tokenizer)."""
    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer("bytelevel", ["a good film, a bad film\n" * 40], vocab_size=280)
    out = {}
    for arch, preset in (("encoder", "bert-tiny"), ("decoder", "gpt2-tiny")):
        out[arch] = tmp_path / arch
        build_model(get_preset(preset, vocab_size=tok.vocab_size)).save(out[arch], tokenizer=tok)
    return out


@pytest.fixture()
def no_weights(monkeypatch):
    """Reading any weight fails the test: the refusal must come from the config alone."""
    import lmlab.loading

    def read(*a, **k):
        raise AssertionError("a weight was read")

    monkeypatch.setattr(lmlab.loading, "_load", read)


#: setting -> (its flag and value, the architecture that ignores it)
CASES = {
    "lm_weight": (["--lm-weight", "0.3"], "encoder"),
    "decoder_style": (["--decoder-style", "last"], "encoder"),
    "max_target_length": (["--max-target-length", "4"], "decoder"),
    "prefix": (["--prefix", "summ: "], "decoder"),
}


def test_every_rule_of_the_table_is_tried_here():
    from lmlab.config.finetune import ARCHITECTURE_RULES

    assert {r.flag for r in ARCHITECTURE_RULES} == set(CASES)


@pytest.mark.parametrize("field", sorted(CASES))
def test_cli_refuses_a_setting_the_architecture_ignores(tmp_path, capsys, files, models, no_weights, field):
    flag_value, arch = CASES[field]
    argv = ["finetune", "--checkpoint", str(models[arch]), "--task", "sst2", "--train", str(files),
            "--dev", str(files), "--out", str(tmp_path / "out"), "--max-steps", "1", *flag_value]
    assert main(argv) == 2
    flag = flag_value[0]
    article = "an" if arch == "encoder" else "a"
    assert_one_line_error(capsys, f"{flag} has no effect on {models[arch]}, {article} {arch} model")
    assert not (tmp_path / "out").exists()


def test_python_refuses_it_naming_the_keyword(tmp_path, files, models, no_weights):
    from lmlab.finetune import finetune

    with pytest.raises(LmlabError) as e:
        finetune(models["encoder"], "sst2", files, files, tmp_path / "out", lm_weight=0.2)
    words = f"lm_weight has no effect on {models['encoder']}, an encoder model"
    assert str(e.value).startswith(words), e.value
    assert "drop lm_weight, or use a decoder model" in str(e.value)
    with pytest.raises(LmlabError, match="^prefix has no effect on .*a decoder model"):
        finetune(models["decoder"], "sst2", files, files, None, prefix="x: ")


def test_the_architecture_that_reads_a_setting_passes(tmp_path, files, models, no_weights):
    """Past the check, the (refused) weight read is what stops it."""
    from lmlab.finetune import finetune

    with pytest.raises(AssertionError, match="a weight was read"):
        finetune(models["decoder"], "sst2", files, files, None, lm_weight=0.2, decoder_style="last")


def test_only_settings_given_count():
    cfg = FinetuneConfig.from_dict({"lm_weight": 0.2, "max_target_length": 8})
    cfg.check_architecture("encoder", "sst2", given=())  # values, but nobody gave them: nothing
    FinetuneConfig().check_architecture("encoder", "sst2", given={"lr"})
    cfg.check_architecture("decoder", "instruct", given={"max_target_length"})  # instruct reads it anywhere
    cfg.check_architecture("seq2seq", "sst2", given={"max_target_length"})
    with pytest.raises(LmlabError, match="max_target_length has no effect on an encoder model"):
        cfg.check_architecture("encoder", "sst2", given={"max_target_length"})


@pytest.fixture()
def grid(tmp_path, data_dir, files):
    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "corpus.txt").write_text(text[:20_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(text[-5_000:], encoding="utf-8")
    return {"name": "t", "seeds": [0], "budget": {"tokens": 2560},
            "pretrain": {"data": {"train": [str(tmp_path / "corpus.txt")], "val": [str(tmp_path / "val.txt")],
                                  "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
                         "train": {"batch_size": 8, "seq_len": 32, "lr": 1e-3},
                         "model": {"max_positions": 64}},
            "arms": [{"name": "gpt", "preset": "gpt2-tiny", "objective": "clm"}],
            "finetune": {"epochs": 1, "lr": 1e-3},
            "tasks": [{"task": "sst2", "train": str(files), "dev": str(files)}]}


@pytest.mark.parametrize(("override", "key"), [
    ('finetune.prefix="x: "', "finetune.prefix"),
    ("finetune.max_target_length=4", "finetune.max_target_length"),
])
def test_a_grid_refuses_it_for_the_arm_before_any_pretraining(grid, override, key):
    from lmlab.lab import load_grid

    with pytest.raises(LmlabError) as e:
        load_grid(copy.deepcopy(grid), [override])
    assert f"arm 'gpt', task 'sst2': --set {key} has no effect on a decoder model" in str(e.value), e.value
    grid["finetune"]["lm_weight"] = 0.2  # a decoder reads it
    assert len(load_grid(grid).finetune_runs) == 1

"""A tokenizer from elsewhere (--tokenizer) meets a model in one place, lmlab.loading.attach_tokenizer,
checked once by lmlab.models.checkpoint.check_given_tokenizer before anything is encoded or generated:
no id without an embedding row, the checkpoint's own tokenizer when it has one, and no id the model
can produce that the tokenizer cannot decode (the table may exceed the tokenizer by padding only)."""

from __future__ import annotations

import pytest
import torch
from assertions import assert_one_line_error

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.models import build_model, get_preset
from lmlab.models.checkpoint import padded_sizes
from lmlab.tokenizers import train_tokenizer

TEXT = ["to be or not to be, that is the question\n" * 40]


@pytest.fixture(scope="module")
def toks():
    return {"byte": train_tokenizer("bytelevel", TEXT, vocab_size=280),  # 280 ids
            "tiny": train_tokenizer("bpe", ["ab ba\n" * 20], vocab_size=10)}  # 7 specials, a, b, end


@pytest.fixture(scope="module")
def models(tmp_path_factory, toks):
    """Saved GPT-2s: with their own tokenizer (280 rows), and without one (280, 288 = 280 padded to a
    multiple of 16, 300, 200 rows)."""
    root = tmp_path_factory.mktemp("pairing")
    torch.manual_seed(0)
    build_model(get_preset("gpt2-tiny", vocab_size=280)).save(root / "own", tokenizer=toks["byte"])
    for rows in (280, 288, 300, 200):
        build_model(get_preset("gpt2-tiny", vocab_size=rows)).save(root / f"bare{rows}")
    return root


def _generate(path, tokenizer) -> list[str]:
    return ["generate", "--checkpoint", str(path), "--prompt", "to be", "--tokenizer", str(tokenizer),
            "--max-new-tokens", "4", "--temperature", "0"]


def test_padded_sizes_are_the_tokenizer_rounded_up_to_a_power_of_two_multiple():
    assert padded_sizes(32100) >= {32100, 32128}  # T5
    assert padded_sizes(50277) >= {50304, 50432}  # Pythia, GPT-NeoX-20B
    assert 51200 in padded_sizes(50295)  # Phi-2
    assert padded_sizes(10) == {10, 16}
    assert 300 not in padded_sizes(280) and 288 in padded_sizes(280)


def test_generate_refuses_a_smaller_tokenizer_before_generating(models, toks, tmp_path, capsys):
    """The probe's case: a 10-token tokenizer for a model of 280 ids generated, then failed decoding."""
    toks["tiny"].save(tmp_path / "t_one")
    assert main(_generate(models / "own", tmp_path / "t_one")) == 2
    assert_one_line_error(capsys, f"tokenizer {tmp_path / 't_one'} is not the tokenizer this model was "
                                  "trained with (10 tokens, the model's own 280)", "drop --tokenizer")
    assert capsys.readouterr().out == ""  # nothing generated
    assert main(_generate(models / "bare300", tmp_path / "t_one")) == 2
    assert_one_line_error(capsys, "has 10 tokens but the model's embedding table has 300 rows, more than "
                                  "padding explains: the model can produce ids 10..299")


def test_a_tokenizer_with_more_ids_than_the_table_or_another_of_the_same_size_is_refused(
        models, toks, tmp_path, capsys):
    toks["byte"].save(tmp_path / "byte")
    assert main(_generate(models / "bare200", tmp_path / "byte")) == 2
    assert_one_line_error(capsys, "has 280 token ids but the model's embedding table has 200 rows: "
                                  "ids 200..279")
    other = train_tokenizer("bytelevel", ["a different corpus altogether, with other merges\n" * 40],
                            vocab_size=280)
    other.save(tmp_path / "other")
    assert main(_generate(models / "own", tmp_path / "other")) == 2
    assert_one_line_error(capsys, "is not the tokenizer this model was trained with "
                                  "(the same size, other tokens)")


@pytest.mark.parametrize("model", ["own", "bare280", "bare288"])
def test_the_models_own_tokenizer_or_one_its_table_only_pads_is_accepted(model, models, toks, tmp_path,
                                                                         capsys):
    toks["byte"].save(tmp_path / "byte")
    assert main(_generate(models / model, tmp_path / "byte")) == 0
    assert capsys.readouterr().out.strip()


def test_fine_tuning_and_alignment_pair_the_tokenizer_the_same_way(models, toks, tmp_path):
    from lmlab.finetune.loop import load_trainable_model

    toks["tiny"].save(tmp_path / "t_one")
    with pytest.raises(LmlabError, match="is not the tokenizer this model was trained with"):
        load_trainable_model(models / "own", tmp_path / "t_one")
    with pytest.raises(LmlabError, match="more than padding explains"):
        load_trainable_model(models / "bare300", toks["tiny"])
    assert load_trainable_model(models / "bare288", toks["byte"]).tokenizer is toks["byte"]

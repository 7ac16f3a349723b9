"""One rule per decision a config makes, whatever the way the value came (``--set`` text, a recipe
file, a Python dict, a grid): truth values, the tokenizer table's rules, what the objective needs of
the table's special tokens, settings that apply only with another one, and where an error says a
value came from."""

from __future__ import annotations

import copy

import pytest

from lmlab.config import load_config
from lmlab.errors import LmlabError


@pytest.fixture()
def recipe(tmp_path):
    (tmp_path / "train.txt").write_text("the cat sat on the mat.\n\n" * 40, encoding="utf-8")
    return {"model": {"preset": "gpt2-tiny"}, "objective": {"name": "clm"},
            "data": {"train": [str(tmp_path / "train.txt")], "val_fraction": 0.1,
                     "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
            "train": {"max_steps": 4, "batch_size": 4, "seq_len": 32, "threads": 1, "progress": "off"}}


def refused(recipe, overrides=None) -> str:
    with pytest.raises(LmlabError) as e:
        load_config(copy.deepcopy(recipe), overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


BERT = ["model.preset=bert-tiny", "objective.name=mlm"]


# --------------------------------------------------------------------------- truth values
@pytest.mark.parametrize("overrides", [
    BERT + ["objective.whole_word=yes"],
    BERT + ["objective.whole_word=1"],
    BERT + ["objective.whole_word=on"],
    ["model.preset=bert-tiny", "objective.name=unilm", "objective.segment_ids=1"],
    ["model.preset=transfo-xl-tiny", "objective.name=transfo-xl", "objective.carry_memory=yes"],
    ["data.append_eos=0"],
])
def test_command_line_truth_values_are_true_or_false_only(recipe, overrides):
    assert "must be true or false" in refused(recipe, overrides)


def test_command_line_true_and_false_are_read(recipe):
    cfg = load_config(copy.deepcopy(recipe), BERT + ["objective.whole_word=true"])
    assert cfg.objective.params["whole_word"] is True


def test_a_file_or_dict_truth_value_must_be_a_boolean(recipe):
    r = copy.deepcopy(recipe)
    r["model"], r["objective"] = {"preset": "bert-tiny"}, {"name": "mlm", "whole_word": 0}
    assert "objective.whole_word must be true or false" in refused(r)


def test_finetune_truth_values_follow_the_same_rule():
    from lmlab.config.fields import build_section
    from lmlab.config.finetune import FinetuneConfig

    with pytest.raises(LmlabError, match="true or false"):
        build_section(FinetuneConfig, {"group_by_length": 1}, "finetune")
    with pytest.raises(LmlabError, match="true or false"):
        build_section(FinetuneConfig, {"progress": "yes"}, "finetune")
    assert build_section(FinetuneConfig, {"group_by_length": False}, "finetune").group_by_length is False


# --------------------------------------------------------------------------- the tokenizer table
@pytest.mark.parametrize("table, says", [
    ({"algo": "bpe", "vocab_size": 300, "num_merges": 10}, "num_merges cannot be combined with"),
    ({"algo": "bytelevel", "vocab_size": 300, "special_tokens": ["[PAD]", "[MASK]", "[PAD]"]},
     "'[PAD]' more than once"),
])
def test_a_tokenizer_table_follows_the_trainers_rules(recipe, table, says):
    assert says in refused(recipe, [f"data.tokenizer={_inline(table)}"])


def test_the_trainer_refuses_what_the_table_refuses():
    from lmlab.tokenizers import train_tokenizer

    with pytest.raises(LmlabError, match="num_merges cannot be combined"):
        train_tokenizer("bpe", ["low lower"], vocab_size=300, num_merges=10)
    with pytest.raises(LmlabError, match="more than once"):
        train_tokenizer("wordpiece", ["low lower"], vocab_size=300, special_tokens=["[UNK]", "[UNK]"])


def _inline(table: dict) -> str:
    import json

    return "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in table.items()) + "}"


# --------------------------------------------------------------------------- the objective's tokens
@pytest.mark.parametrize("overrides, token", [
    (BERT + ['data.tokenizer={algo="bytelevel", vocab_size=300, special_tokens=["[PAD]"]}'], "[MASK]"),
    (["model.preset=bert-tiny", "objective.name=nsp",
      'data.tokenizer={algo="wordpiece", vocab_size=300, special_tokens=["[UNK]", "[MASK]", "[SEP]"]}'],
     "[CLS]"),
    (["model.preset=t5-tiny", "objective.name=t5",
      'data.tokenizer={algo="bytelevel", vocab_size=300, special_tokens=["</s>"]}'], "[PAD]"),
    (["model.preset=bart-tiny", "objective.name=bart",
      'data.tokenizer={algo="bytelevel", vocab_size=300, special_tokens=["[PAD]", "</s>"]}'], "[MASK]"),
])
def test_a_tokenizer_table_missing_a_token_the_objective_needs_is_refused_at_load(recipe, overrides, token):
    assert f"needs a {token} token" in refused(recipe, overrides)


def test_the_objective_tokens_table_check_is_the_objectives_own_declaration(recipe):
    from lmlab.objectives.mlm import MaskedLM
    from lmlab.objectives.t5 import SpanCorruption
    from lmlab.tokenizers import train_tokenizer

    assert SpanCorruption.needed_roles(SpanCorruption.with_defaults({"variant": "bert"})) == ("pad", "mask")
    load_config(copy.deepcopy(recipe), ["model.preset=t5-tiny", "objective.name=t5",  # spans: no [MASK]
                                        'data.tokenizer={algo="bytelevel", vocab_size=300, '
                                        'special_tokens=["[PAD]", "</s>"]}'])
    tok = train_tokenizer("bytelevel", ["the cat sat"], vocab_size=270, special_tokens=["[PAD]"])
    with pytest.raises(LmlabError, match=r"needs a \[MASK\] token"):
        MaskedLM(tok)


# --------------------------------------------------------------------------- objective options
@pytest.mark.parametrize("overrides, says", [
    (["model.preset=bert-tiny", "objective.name=nsp", "objective.mlm=false", "objective.mask_prob=0.5"],
     "objective.mask_prob has no effect unless objective.mlm is true"),
    (["model.preset=t5-tiny", "objective.name=t5", "objective.variant=bert", "objective.num_sentinels=10"],
     "objective.num_sentinels has no effect unless objective.variant is spans"),
    (["model.preset=bart-tiny", "objective.name=bart",
      'objective.noise=["text_infilling", "text_infilling"]'],
     "'text_infilling' more than once"),
])
def test_an_objective_option_that_would_be_ignored_is_refused(recipe, overrides, says):
    assert says in refused(recipe, overrides)


def test_the_objective_rules_hold_in_python_and_leave_defaults_alone(recipe):
    from lmlab.objectives.nsp import NextSentencePrediction

    with pytest.raises(LmlabError, match="has no effect unless objective.mlm is true"):
        NextSentencePrediction.checked({"mlm": False, "whole_word": True})
    NextSentencePrediction.checked({"mlm": False, "mask_prob": 0.15})  # the default: nothing ignored
    load_config(copy.deepcopy(recipe), ["model.preset=bert-tiny", "objective.name=nsp",
                                        "objective.mlm=false"])

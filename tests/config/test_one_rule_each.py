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
     "objective.mask_prob applies only with objective.mlm = true"),
    (["model.preset=t5-tiny", "objective.name=t5", "objective.variant=bert", "objective.num_sentinels=10"],
     'objective.num_sentinels applies only with objective.variant = "spans"'),
    (["model.preset=bart-tiny", "objective.name=bart",
      'objective.noise=["text_infilling", "text_infilling"]'],
     "'text_infilling' more than once"),
])
def test_an_objective_option_that_would_be_ignored_is_refused(recipe, overrides, says):
    assert says in refused(recipe, overrides)


def test_the_objective_rules_hold_in_python_and_leave_defaults_alone(recipe):
    from lmlab.objectives.nsp import NextSentencePrediction

    with pytest.raises(LmlabError, match="^objective.whole_word applies only with objective.mlm = true; "
                                         "set objective.mlm = true, or drop objective.whole_word$"):
        NextSentencePrediction.checked({"mlm": False, "whole_word": True})
    NextSentencePrediction.checked({"mlm": False, "mask_prob": 0.15})  # the default: nothing ignored
    load_config(copy.deepcopy(recipe), ["model.preset=bert-tiny", "objective.name=nsp",
                                        "objective.mlm=false"])


# --------------------------------------------------------------------------- what a message names
@pytest.mark.parametrize("table, says", [
    ('{algo="wordpiece", vocab_size=300, score="bogus"}', "--set data.tokenizer.score must be one of"),
    ('{algo="wordpiece", vocab_size=300, lowercase="no"}', "--set data.tokenizer.lowercase must be true"),
    ('{algo="wordpiece", vocab_size=300, sentinels=3}', "unknown key --set data.tokenizer.sentinels"),
])
def test_a_tokenizer_table_from_set_is_named_as_the_set_not_the_file(recipe, tmp_path, table, says):
    from lmlab.config import to_toml

    path = tmp_path / "r.toml"
    path.write_text(to_toml(load_config(copy.deepcopy(recipe))), encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        load_config(path, [f"data.tokenizer={table}"])
    assert says in str(e.value) and "r.toml" not in str(e.value), str(e.value)


def test_a_pair_of_numbers_given_one_says_it_needs_two():
    from lmlab.config.fields import build_section
    from lmlab.config.finetune import FinetuneConfig
    from lmlab.config.overrides import Origin

    with pytest.raises(LmlabError) as e:
        build_section(FinetuneConfig, {"betas": [0.9]}, "finetune",
                      Origin(set_keys=frozenset({"finetune.betas"})))
    assert "--set finetune.betas must hold 2 values, got 1 ([0.9])" in str(e.value)
    assert "is missing" not in str(e.value)


def test_a_grid_task_without_a_task_key_says_so(recipe):
    from lmlab.lab import load_grid

    grid = {"name": "g", "seeds": [0], "budget": {"tokens": 20_480},
            "pretrain": {"data": dict(recipe["data"]), "train": {"batch_size": 4, "seq_len": 32}},
            "arms": [{"name": "gpt", "preset": "gpt2-tiny", "objective": "clm"}],
            "finetune": {"max_steps": 1},
            "tasks": [{"name": "sst2", "train": "tr.tsv", "dev": "dv.tsv"}]}
    with pytest.raises(LmlabError) as e:
        load_grid(grid)
    assert "tasks[0] has no task key" in str(e.value) and "None" not in str(e.value), str(e.value)


def test_python_method_option_messages_name_python_words(tmp_path):
    from lmlab.finetune import finetune

    with pytest.raises(LmlabError) as e:
        finetune(tmp_path / "no-model", "sst2", tmp_path / "t.tsv", tmp_path / "d.tsv", tmp_path / "o",
                 method="lora", method_options="rank=4")
    assert 'e.g. {"rank": 8}' in str(e.value), str(e.value)
    with pytest.raises(LmlabError) as e:
        finetune(tmp_path / "no-model", "sst2", tmp_path / "t.tsv", tmp_path / "d.tsv", tmp_path / "o",
                 method="full", method_options={"rank": 4})
    assert "method_options" in e.value.fix and "--" not in str(e.value), str(e.value)

"""A pretraining run's settings are checked completely when the recipe is read (``load_config``),
before any tokenizer is trained or text tokenised: the same checks reach ``lmlab pretrain``, the
Python ``pretrain(...)``, ``--set``, recipe files and a grid's planning (``load_grid``, what
``lmlab compare --dry-run`` runs)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from recipe_checks import refused, tiny_recipe

from lmlab.config import load_config
from lmlab.errors import LmlabError
from lmlab.lab import load_grid


@pytest.fixture()
def recipe(tmp_path):
    return tiny_recipe(tmp_path)


BERT = ["model.preset=bert-tiny", "objective.name=mlm"]
T5 = ["model.preset=t5-tiny", "objective.name=t5"]


@pytest.mark.parametrize("overrides, says", [
    (BERT + ["objective.mask_prob=0"], "objective.mask_prob"),
    (BERT + ["objective.mask_token_prob=0.95"], "mask_token_prob + objective.random_token_prob"),
    (["model.preset=bert-tiny", "objective.name=spanbert", "objective.geometric_p=0"],
     "objective.geometric_p"),
    (["model.preset=bert-tiny", "objective.name=electra", "objective.generator_size=0"],
     "objective.generator_size"),
    (["model.preset=bert-tiny", "objective.name=unilm", "objective.bidirectional=0",
      "objective.unidirectional=0", "objective.seq2seq=0"], "UniLM proportions"),
    (T5 + ["objective.noise_density=0"], "objective.noise_density"),
    (T5 + ["objective.mean_span_length=0.5"], "objective.mean_span_length"),
    (["model.preset=bart-tiny", "objective.name=bart", "objective.noise=[]"], "objective.noise"),
    (["model.preset=xlnet-tiny", "objective.name=xlnet", "objective.predict_fraction=0"],
     "objective.predict_fraction"),
    # probe10a #7: named as the --set that gave it (was "got train.batch_size=1")
    (["model.preset=bert-tiny", "objective.name=nsp", "train.batch_size=1"],
     "--set train.batch_size 1 is too few rows for the nsp objective"),
])
def test_objective_parameters_are_refused_at_config_load(recipe, overrides, says):
    assert says in refused(recipe, overrides)


def test_the_objective_refuses_what_the_config_refuses_with_the_same_rule():
    from lmlab.objectives.mlm import MaskedLM

    with pytest.raises(LmlabError, match="random_token_prob") as e:
        MaskedLM.check_params(MaskedLM.with_defaults({"mask_token_prob": 0.95}))
    assert "exceeds 1" in str(e.value)


@pytest.mark.parametrize("overrides, says", [
    # an option the other one turns off, given at its default value, is still given (was accepted)
    (["model.preset=bert-tiny", "objective.name=nsp", "objective.mlm=false", "objective.mask_prob=0.15"],
     "--set objective.mask_prob applies only with objective.mlm = true; set objective.mlm = true, or drop "
     "objective.mask_prob"),
    (T5 + ["objective.variant=bert", "objective.num_sentinels=100"],
     '--set objective.num_sentinels applies only with objective.variant = "spans"'),
    # a rule between two parameters is named by the one given (the other at its default)
    (BERT + ["objective.random_token_prob=0.5"],
     "--set objective.random_token_prob: objective.mask_token_prob"),
    (["model.preset=bert-tiny", "objective.name=unilm", "objective.seq2seq=0", "objective.unidirectional=0",
      "objective.bidirectional=0"], "--set objective.bidirectional: UniLM proportions"),
])
def test_an_objective_rule_names_the_parameter_given(recipe, overrides, says):
    assert refused(recipe, overrides).startswith(says)


def test_an_objective_rule_names_the_recipe_line(recipe, tmp_path):
    from lmlab.config import to_toml

    recipe["model"]["preset"], recipe["objective"] = "bert-tiny", {"name": "mlm", "random_token_prob": 0.5}
    path = tmp_path / "r.toml"
    path.write_text(to_toml(recipe), encoding="utf-8")
    line = next(i for i, text in enumerate(path.read_text().splitlines(), 1) if "random_token_prob" in text)
    with pytest.raises(LmlabError, match=rf"^{path}:{line}: objective.random_token_prob: objective.mask"):
        load_config(path)


@pytest.mark.parametrize("table, says", [
    ({"algo": "bytelevel", "vocab_size": 0}, "data.tokenizer.vocab_size"),
    ({"algo": "bytelevel", "vocab_size": 3}, "data.tokenizer.vocab_size >= 263"),
    ({"algo": "bytelevel"}, "data.tokenizer.vocab_size is missing"),
    ({"algo": "bytelevel", "vocab_size": 300, "bogus": 1}, "data.tokenizer.bogus"),
    ({"algo": "bytelevel", "vocab_size": "300"}, "data.tokenizer.vocab_size must be a whole number"),
    ({"algo": "unigram", "vocab_size": 300, "shrinking_factor": 1.0}, "data.tokenizer.shrinking_factor"),
    ({"algo": "wordpiece", "vocab_size": 300, "score": "best"}, "data.tokenizer.score"),
    ({"algo": "bpe"}, "vocab_size or num_merges"),
])
def test_the_tokenizer_table_is_checked_against_its_trainer_at_config_load(recipe, table, says):
    recipe["data"]["tokenizer"] = table
    assert says in refused(recipe, [])


def test_the_bytelevel_minimum_is_the_trainers():
    from lmlab.tokenizers import DEFAULT_SPECIAL_TOKENS, tokenizer_class, train_tokenizer

    need = tokenizer_class("bytelevel").min_vocab_size(DEFAULT_SPECIAL_TOKENS, {})
    assert need == 256 + len(DEFAULT_SPECIAL_TOKENS)
    train_tokenizer("bytelevel", ["abc"], vocab_size=need)  # the smallest it takes
    with pytest.raises(LmlabError, match=f">= {need}"):
        train_tokenizer("bytelevel", iter(()), vocab_size=need - 1)


def test_train_tokenizer_names_an_unknown_option_before_reading_text():
    from lmlab.tokenizers import train_tokenizer

    def texts():
        raise AssertionError("no text is read for bad settings")
        yield ""

    with pytest.raises(LmlabError, match="unknown option bogus"):
        train_tokenizer("bytelevel", texts(), vocab_size=300, bogus=1)


def test_a_val_fraction_leaving_no_training_window_is_refused_before_a_tokenizer(recipe, tmp_path, capsys):
    from lmlab.config import to_toml
    from tests.assertions import assert_one_line_error, exit_code

    path = tmp_path / "tiny.toml"
    path.write_text(to_toml(load_config(recipe)), encoding="utf-8")
    out = tmp_path / "run"
    argv = ["pretrain", "--config", str(path), "--out", str(out), "--set", "data.val=[]",
            "data.val_fraction=0.99999"]
    assert exit_code(argv) == 2
    assert_one_line_error(capsys, "data.val_fraction 0.99999")
    assert not out.exists()
    from lmlab.train.data import check_data

    check_data(load_config(recipe, ["data.val=[]", "data.val_fraction=0.1"]).data, seq_len=32)  # windows left


@pytest.mark.parametrize("overrides, says", [
    (["model.vocab_size=10"], "model.vocab_size 10 is smaller than the 300"),
    (["data.max_tokens=1"], "data.max_tokens"),
    (["train.warmup_steps=50", "train.decay_steps=20"], "train.decay_steps 20"),
])
def test_settings_that_guarantee_a_failure_later_are_refused_now(recipe, overrides, says):
    assert says in refused(recipe, overrides)


def test_a_warmup_longer_than_the_run_is_a_note_not_a_refusal(recipe):
    """`--set train.max_steps=2` on a recipe that warms up for 50 steps (the acceptance checks'
    own smoke runs) runs the first steps of that schedule; the log says how far the rate gets."""
    from lmlab.config.run import schedule_note

    assert load_config(recipe).train.warmup_steps == 100  # the default, in a 4-step run: kept
    cfg = load_config(recipe, ["train.warmup_steps=10"])
    assert schedule_note(cfg.train) == ("note: train.warmup_steps 10 is longer than the run (train.max_steps "
                                        "4): the learning rate reaches 40% of train.lr; set "
                                        "train.warmup_steps <= 4 for the whole schedule")
    cfg = load_config(recipe, ["train.warmup_steps=10", "train.decay_steps=600"])  # first steps of a schedule
    assert cfg.train.max_steps == 4
    assert schedule_note(load_config(recipe, ["train.warmup_steps=4"]).train) is None
    repo = Path(__file__).parents[2]
    load_config(repo / "configs/gpt-imdb-clm.toml", ["train.max_steps=2"])  # warmup 50, no decay_steps


def test_a_recipe_file_error_names_the_file(recipe, tmp_path):
    from lmlab.config import to_toml

    path = tmp_path / "r.toml"
    text = to_toml(load_config(recipe)).replace("vocab_size = 300", "vocab_size = 3")
    path.write_text(text, encoding="utf-8")
    with pytest.raises(LmlabError, match=r"r\.toml"):
        load_config(path)


# --------------------------------------------------------------------------- grids (compare --dry-run)


@pytest.fixture()
def grid(recipe):
    return {"name": "g", "seeds": [0], "budget": {"tokens": 20_480},
            "pretrain": {"data": dict(recipe["data"]), "train": {"batch_size": 4, "seq_len": 32}},
            "arms": [{"name": "gpt", "preset": "gpt2-tiny", "objective": "clm"},
                     {"name": "bert", "preset": "bert-tiny", "objective": "mlm"}]}


def grid_refused(grid, overrides) -> str:
    with pytest.raises(LmlabError) as e:
        load_grid(copy.deepcopy(grid), overrides)
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_good_grid_plans(grid):
    assert len(load_grid(grid).pretrain_runs) == 2


@pytest.mark.parametrize("overrides, says", [
    (['pretrain.data.tokenizer={algo="bytelevel",vocab_size=3}'],
     "pretrain.data.tokenizer.vocab_size >= 263"),
    (['pretrain.data.tokenizer={algo="bytelevel",vocab_size=300,bogus=1}'], "pretrain.data.tokenizer.bogus"),
    (["pretrain.data.max_tokens=1"], "data.max_tokens"),
    (["pretrain.model.vocab_size=10"], "model.vocab_size 10"),
    (["pretrain.data.val=[]", "pretrain.data.val_fraction=0.99999"], "pretrain.data.val_fraction 0.99999"),
    (["pretrain.train.warmup_steps=500"], "pretrain.train.warmup_steps 500"),
    (['pretrain.data.tokenizer={algo="bytelevel",vocab_size=300,special_tokens=["[PAD]"]}'],
     "mlm objective needs a [MASK] token"),
])
def test_a_grid_with_a_bad_value_is_refused_at_planning(grid, overrides, says):
    assert says in grid_refused(grid, overrides)


def test_a_grid_arm_with_a_bad_objective_parameter_is_refused_at_planning(grid):
    grid["arms"][1]["params"] = {"mask_prob": 0}
    msg = grid_refused(grid, [])
    assert "arm 'bert'" in msg and "arms[1].params.mask_prob" in msg, msg


@pytest.mark.parametrize("overrides, says", [
    (BERT + ["objective.mask_prob=0"], "objective.mask_prob"),
    (['data.tokenizer={algo="bytelevel",vocab_size="300"}'], "data.tokenizer.vocab_size"),
])
def test_pretrain_refuses_before_training_a_tokenizer(recipe, tmp_path, capsys, overrides, says):
    from lmlab.config import to_toml
    from tests.assertions import assert_one_line_error, exit_code

    path = tmp_path / "tiny.toml"
    path.write_text(to_toml(load_config(recipe)), encoding="utf-8")
    out = tmp_path / "run"
    argv = ["pretrain", "--config", str(path), "--out", str(out)]
    for item in overrides:
        argv += ["--set", item]
    assert exit_code(argv) == 2
    assert_one_line_error(capsys, says)
    assert not out.exists()  # nothing trained, nothing tokenised


@pytest.mark.parametrize("overrides, says", [
    (["train.min_lr=1", "train.lr=1e-3"], "--set train.min_lr 1 is more than --set train.lr 0.001"),
    (["train.seq_len=100000"], "--set train.seq_len 100000 is longer than the model's "),
    (['train.loggers=["tb"]'], "unknown logger 'tb' in --set train.loggers"),
])
def test_a_train_setting_is_named_where_it_was_written(recipe, overrides, says):
    """probe10a #7: these named ``train.min_lr``/``train.seq_len``/``train.loggers`` (or ``lr=``)
    as the code spells them, whatever --set gave them."""
    assert says in refused(recipe, overrides)


def test_align_label_smoothing_with_ipo_is_named_as_given(tmp_path, capsys):
    """probe10a #7: ``--set align.loss=ipo align.label_smoothing=0.1`` said "drop --label-smoothing",
    a flag never given; it is a flag rule now, named where each was written."""
    from lmlab.cli import main

    argv = ["align", "--checkpoint", str(tmp_path / "none"), "--train", "p.jsonl", "--dev", "p.jsonl",
            "--out", str(tmp_path / "o"), "--set", "align.loss=ipo", "align.label_smoothing=0.1"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--set align.label_smoothing applies only with " in err, err
    assert "--label-smoothing" not in err


@pytest.mark.parametrize("overrides, fix", [
    (["model.n_layers=10000000"], "lower --set model.n_layers"),
    (['data.tokenizer={algo="bytelevel", vocab_size=1000000000}'], "lower --set data.tokenizer.vocab_size"),
])
def test_a_model_too_large_names_the_settings_that_sized_it(recipe, overrides, fix):
    """probe10a #7: the memory check's fix was "choose a smaller vocab_size, d_model, d_ff, n_layers
    or max_positions", the config's field names, whatever the user had written."""
    message = refused(recipe, overrides)
    assert "would need about" in message and message.endswith(fix), message

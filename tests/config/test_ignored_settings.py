"""probe10a #2, #3, #4 and M1: settings their mode ignores, an objective's own network in the
memory check, and the Python objective API applying the recipe's rules.

* An objective parameter or a ``[train]`` setting that does nothing in the mode chosen is refused
  in one line when the recipe is read (``load_config``: ``lmlab pretrain``, ``--set``, files, a
  grid), as an objective's ``__init__`` refuses it from Python; a default never is (a saved
  ``config.toml`` lists every ``[train]`` key).
* The up-front memory check counts the network an objective owns (ELECTRA's generator).
* Making an objective from Python (the class, ``get_objective(...)``) checks every parameter at
  once, in the recipe's words: an unknown name, a type, the rules between them.
"""

from __future__ import annotations

import copy

import pytest
from recipe_checks import refused, tiny_recipe

from lmlab.config import load_config, to_toml
from lmlab.errors import LmlabError
from lmlab.lab import load_grid


@pytest.fixture()
def recipe(tmp_path):
    return tiny_recipe(tmp_path)


@pytest.fixture(scope="module")
def tok():
    from lmlab.tokenizers import train_tokenizer

    words = "the cat sat on a mat while one dog ran to its log and every bird sang".split()
    text = [" ".join(words[i:] + words[:i]) + "." for i in range(len(words))]
    return train_tokenizer("wordpiece", text, vocab_size=120)


MLM = ["model.preset=bert-tiny", "objective.name=mlm"]
BART = ["model.preset=bart-tiny", "objective.name=bart"]
T5 = ["model.preset=t5-tiny", "objective.name=t5"]
SPANBERT = ["model.preset=bert-tiny", "objective.name=spanbert"]


# --------------------------------------------------------------------------- objective parameters
@pytest.mark.parametrize("overrides, says", [
    (MLM + ["objective.seed=5"],
     '--set objective.seed applies only with objective.masking = "static" (it keys the static masks)'),
    (BART + ['objective.noise=["sentence_permutation"]', "objective.mask_ratio=0.5"],
     '--set objective.mask_ratio applies only with objective.noise holding "text_infilling" or '
     '"token_masking"'),
    (BART + ['objective.noise=["text_infilling"]', "objective.delete_ratio=0.5"],
     '--set objective.delete_ratio applies only with objective.noise holding "token_deletion"'),
    (BART + ['objective.noise=["token_masking"]', "objective.poisson_lambda=4"],
     '--set objective.poisson_lambda applies only with objective.noise holding "text_infilling"'),
    (T5 + ["objective.variant=prefix_lm", "objective.mean_span_length=5"],
     '--set objective.mean_span_length applies only with objective.variant = "spans" or "drop"'),
    (T5 + ["objective.variant=prefix_lm", "objective.noise_density=0.3"],
     '--set objective.noise_density applies only with objective.variant = "spans" or "drop" or "bert"'),
    (T5 + ["objective.variant=bert", "objective.mean_span_length=5"],
     '--set objective.mean_span_length applies only with objective.variant = "spans" or "drop"'),
    (SPANBERT + ["objective.sbo=false", "objective.max_span_tokens=5"],
     "--set objective.max_span_tokens applies only with objective.sbo = true"),
    # NSP takes MLM's rule too, after its own
    (["model.preset=bert-tiny", "objective.name=nsp", "objective.seed=3"],
     '--set objective.seed applies only with objective.masking = "static"'),
])
def test_an_objective_parameter_its_mode_ignores_is_refused(recipe, overrides, says):
    assert refused(recipe, overrides).startswith(says)


@pytest.mark.parametrize("overrides", [
    MLM + ["objective.seed=5", "objective.masking=static"],
    BART + ['objective.noise=["token_masking"]', "objective.mask_ratio=0.5"],
    BART + ['objective.noise=["text_infilling", "token_deletion"]', "objective.delete_ratio=0.2",
            "objective.poisson_lambda=2", "objective.mask_ratio=0.2"],
    T5 + ["objective.variant=bert", "objective.noise_density=0.2"],
    T5 + ["objective.variant=drop", "objective.mean_span_length=4"],
    SPANBERT + ["objective.max_span_tokens=5"],
    SPANBERT + ["objective.sbo=false"],
])
def test_the_same_parameters_in_the_mode_that_reads_them_are_accepted(recipe, overrides):
    load_config(copy.deepcopy(recipe), overrides)


def test_an_empty_bart_noise_list_is_called_empty_and_named_once(recipe):
    msg = refused(recipe, BART + ["objective.noise=[]"])
    assert msg.startswith("--set objective.noise is empty: BART needs at least one noise; choose one or more "
                          "of: sentence_permutation,"), msg
    assert msg.count("objective.noise") == 1 and "unknown" not in msg


# --------------------------------------------------------------------------- [train]
@pytest.mark.parametrize("overrides, says", [
    (["train.compile_backend=aot_eager"],
     "--set train.compile_backend applies only with train.compile = true (the backend torch.compile runs); "
     "set train.compile = true, or drop train.compile_backend"),
    (["train.schedule=constant", "train.decay_steps=5"],
     '--set train.decay_steps applies only with train.schedule = "cosine" or "linear"'),
    (["train.schedule=constant", "train.min_lr=1e-5"],
     '--set train.min_lr applies only with train.schedule = "cosine" or "linear"'),
])
def test_a_train_setting_its_mode_ignores_is_refused(recipe, overrides, says):
    assert refused(recipe, overrides).startswith(says)


def test_a_train_rule_names_the_recipe_line(recipe, tmp_path):
    recipe["train"].update(schedule="constant", decay_steps=5)
    path = tmp_path / "r.toml"
    path.write_text(to_toml(recipe), encoding="utf-8")
    lines = path.read_text().splitlines()
    line = next(i for i, text in enumerate(lines, 1) if text.startswith("decay_steps"))
    with pytest.raises(LmlabError, match=rf"^{path}:{line}: train.decay_steps applies only with "):
        load_config(path)


def test_train_defaults_and_a_saved_config_trip_no_rule(recipe, tmp_path):
    """A saved config writes every [train] key, defaults included: compile_backend with compile off,
    min_lr with a constant schedule."""
    load_config(copy.deepcopy(recipe), ["train.compile=true", "train.compile_backend=eager"])
    cfg = load_config(copy.deepcopy(recipe), ["train.schedule=constant"])
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg), encoding="utf-8")
    assert "compile_backend" in path.read_text() and "min_lr" in path.read_text()
    assert load_config(path).train.schedule == "constant"


def test_a_grid_refuses_the_same_train_settings(recipe):
    grid = {"name": "g", "seeds": [0], "budget": {"tokens": 20_480},
            "pretrain": {"data": dict(recipe["data"]), "train": {"batch_size": 4, "seq_len": 32}},
            "arms": [{"name": "gpt", "preset": "gpt2-tiny", "objective": "clm"}]}
    load_grid(copy.deepcopy(grid))
    for overrides, says in ((["pretrain.train.compile_backend=eager"],
                             "--set pretrain.train.compile_backend applies only with pretrain.train.compile"),
                            (["pretrain.train.schedule=constant", "pretrain.train.decay_steps=5"],
                             "--set pretrain.train.decay_steps applies only with pretrain.train.schedule")):
        with pytest.raises(LmlabError, match="^arm 'gpt', size .*: " + says.replace(".", r"\.")):
            load_grid(copy.deepcopy(grid), overrides)


# --------------------------------------------------------------------------- an objective's own network
def test_a_huge_electra_generator_is_refused_before_any_data_is_read(recipe):
    import time

    start = time.perf_counter()
    msg = refused(recipe, ["model.preset=electra-tiny", "objective.name=electra",
                           "objective.generator_layers=10000000"])
    assert "electra objective's own network" in msg and "more than this machine's" in msg, msg
    assert msg.endswith("lower objective.generator_layers or objective.generator_size"), msg
    assert time.perf_counter() - start < 30


def test_the_own_network_estimate_is_close_to_what_is_built(tok):
    from lmlab.models import build_model, get_preset
    from lmlab.objectives.electra import Electra
    from lmlab.objectives.spans import SpanBERT

    for preset, cls, params in (("electra-tiny", Electra, {"generator_layers": 4, "generator_size": 0.5}),
                                ("bert-tiny", SpanBERT, {})):
        config = get_preset(preset).replace(vocab_size=tok.vocab_size)
        objective = cls(tok, **params)
        objective.setup(build_model(config))
        built = sum(p.numel() for p in objective.parameters())
        estimate, _ = cls.own_parameters(cls.with_defaults(params), config)
        assert abs(estimate - built) < 0.2 * built, (preset, estimate, built)


# --------------------------------------------------------------------------- the Python API
@pytest.mark.parametrize("name, params, says", [
    ("mlm", {"mask_rate": 0.2}, "unknown parameter mask_rate= of objective 'mlm'; did you mean mask_prob?"),
    ("clm", {"foo": 1}, "unknown parameter foo= of objective 'clm'; it takes no parameters"),
    ("nsp", {"mlm": False, "mask_prob": 0.3},
     "objective.mask_prob applies only with objective.mlm = true; set objective.mlm = true, or drop "
     "objective.mask_prob"),
    ("mlm", {"seed": 5}, 'objective.seed applies only with objective.masking = "static"'),
    ("bart", {"noise": ["sentence_permutation"], "mask_ratio": 0.5},
     "objective.mask_ratio applies only with"),
    ("bart", {"noise": []}, "objective.noise is empty"),
    ("t5", {"variant": "prefix_lm", "noise_density": 0.3}, "objective.noise_density applies only with"),
    ("spanbert", {"sbo": False, "max_span_tokens": 5}, "objective.max_span_tokens applies only with"),
])
def test_making_an_objective_in_python_applies_the_recipe_rules(tok, name, params, says):
    from lmlab.objectives import get_objective

    with pytest.raises(LmlabError) as e:
        get_objective(name)(tok, **params)
    assert str(e.value).startswith(says), str(e.value)


def test_the_class_itself_checks_positional_and_keyword_parameters(tok):
    from lmlab.objectives.mlm import MaskedLM
    from lmlab.objectives.nsp import NextSentencePrediction

    with pytest.raises(LmlabError, match="^unknown parameter mask_rate= of objective 'mlm'"):
        MaskedLM(tok, mask_rate=0.2)
    with pytest.raises(LmlabError, match="takes 6 positional parameters after the tokenizer, got 7"):
        MaskedLM(tok, 0.2, 0.8, 0.1, "dynamic", False, 0, 9)
    with pytest.raises(LmlabError, match="got mask_prob= twice"):
        MaskedLM(tok, 0.2, mask_prob=0.3)
    assert MaskedLM(tok, 0.2).mask_prob == 0.2
    assert NextSentencePrediction(tok, mlm=False, mask_prob=0.15).mlm is False  # a default is not given


def test_prepare_shards_takes_true_or_false_for_append_eos(tmp_path, tok):
    from lmlab.data import prepare_shards

    tok_dir = tmp_path / "tok"
    tok.save(tok_dir)
    text = tmp_path / "a.txt"
    text.write_text("the cat sat.\n\nthe dog ran.\n", encoding="utf-8")
    with pytest.raises(LmlabError, match="append_eos must be True or False, got"):
        prepare_shards(tok_dir, [text], tmp_path / "out", append_eos="yes")
    assert not (tmp_path / "out").exists()


def test_a_set_schedule_over_a_recipes_decay_wins_and_its_saved_config_reads_back(tmp_path):
    """``--set train.schedule=constant`` on a shipped recipe that sets ``min_lr``/``decay_steps``
    was refused ("drop train.min_lr", which --set cannot do); now the command line wins, the
    setting it turns off is its default again, and the saved config (every key) loads back."""
    from pathlib import Path

    from lmlab.config.train import TrainConfig

    recipe = Path(__file__).resolve().parents[2] / "configs" / "gpt-tiny-clm.toml"
    assert load_config(recipe).train.min_lr != TrainConfig().min_lr  # the recipe sets it
    cfg = load_config(recipe, ["train.schedule=constant"])
    assert cfg.train.schedule == "constant" and cfg.train.min_lr == TrainConfig().min_lr
    path = tmp_path / "config.toml"
    path.write_text(to_toml(cfg), encoding="utf-8")
    assert load_config(path).train.schedule == "constant"


@pytest.mark.parametrize("recipe_file, override", [
    ("t5-tiny-spans.toml", "objective.variant=prefix_lm"),  # writes noise_density, mean_span_length
    ("bert-tiny-wwm.toml", "objective.masking=dynamic"),     # ... seed = 0
    ("bart-tiny.toml", 'objective.noise=["token_deletion"]'),  # ... mask_ratio, poisson_lambda
])
def test_a_set_partner_over_a_recipes_objective_parameter_wins(recipe_file, override, tmp_path):
    """Review: a recipe's parameter at its default (or one a --set partner turns off) was refused,
    and --set cannot drop a recipe's key; the run claims.md describes (t5-tiny-spans with
    variant=prefix_lm) could not start, nor an older run with ``seed = 0`` resume."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "configs" / recipe_file
    cfg = load_config(path, [override])
    saved = tmp_path / "config.toml"
    saved.write_text(to_toml(cfg), encoding="utf-8")
    assert load_config(saved).objective.params == cfg.objective.params  # what --resume reads back

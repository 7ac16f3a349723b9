"""Recipes and overrides: types, one-line errors with suggestions, checks before training."""

from __future__ import annotations

import pytest

from lmlab.cli import main
from lmlab.errors import LmlabError
from lmlab.train import load_config, pretrain
from lmlab.train.config import to_toml
from lmlab.train.optim import lr_at, param_groups


def test_overrides_are_coerced_to_the_field_types(tmp_path):
    cfg = load_config(
        "configs/gpt-tiny-clm.toml",
        [
            "train.lr=5e-4",
            "train.max_steps=12",
            "train.betas=[0.8, 0.9]",
            "train.eval_at_start=false",
            "model.d_model=32",
            "data.train=a.txt,b.txt",
            "train.precision=fp32",
        ],
    )
    assert cfg.train.lr == 5e-4 and cfg.train.max_steps == 12 and cfg.train.betas == [0.8, 0.9]
    assert cfg.train.eval_at_start is False and cfg.model.overrides["d_model"] == 32
    assert cfg.data.train == ["a.txt", "b.txt"] and cfg.data.tokenizer == {
        "algo": "bytelevel",
        "vocab_size": 4096,
    }
    again = tmp_path / "c.toml"
    again.write_text(to_toml(cfg))
    assert load_config(again) == cfg


@pytest.mark.parametrize(
    "override, words",
    [
        ("train.max_step=3", ["train.max_steps"]),
        ("trian.lr=1", ["section", "train"]),
        ("model.d_modle=3", ["model.d_model"]),
        ("train.lr=fast", ["train.lr", "number"]),
        ("train.schedule=cosin", ["cosine"]),
        ("objective.name=cml", ["'cml'", "clm"]),
        ("train.batch_size=0", ["train.batch_size", "at least 1"]),
        ("data.max_tokens=-5", ["--set data.max_tokens", "at least 0", "(got -5)"]),
    ],
)
def test_bad_keys_and_values_are_one_line_errors_with_a_suggestion(override, words):
    with pytest.raises(LmlabError) as e:
        load_config("configs/gpt-tiny-clm.toml", [override])
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_impossible_runs_fail_before_any_work(tmp_path, tiny_config):
    cases = [
        (
            {"model": {"preset": "bert-tiny"}},
            "objective 'clm' trains decoder models, but preset bert-tiny is an encoder",
        ),
        ({"train": {"seq_len": 100}}, "train.seq_len 100 is longer than the model's 64 positions"),
        ({"data": {"train": [str(tmp_path / "nope")]}}, "does not exist"),
    ]
    for change, words in cases:
        cfg = tiny_config()
        for section, values in change.items():
            cfg[section].update(values)
        if section == "model":
            cfg["model"] = {"preset": "bert-tiny"}
        with pytest.raises(LmlabError) as e:
            pretrain(cfg, tmp_path / "run", log=lambda m: None)
        assert words in str(e.value) and "\n" not in str(e.value)
        assert not (tmp_path / "run" / "checkpoints").exists()


def test_cli_reports_bad_input_in_one_line(capsys, tmp_path):
    code = main(
        [
            "pretrain",
            "--config",
            "configs/gpt-tiny-clm.toml",
            "--out",
            str(tmp_path / "r"),
            "--set",
            "train.warmup=10",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and "train.warmup_steps" in err
    code = main(["pretrain", "--config", str(tmp_path / "missing.toml"), "--out", str(tmp_path / "r")])
    assert code == 2 and "does not exist" in capsys.readouterr().err


def test_schedule_warmup_then_cosine_or_linear_to_min_lr():
    cfg = load_config(
        "configs/gpt-tiny-clm.toml",
        ["train.warmup_steps=10", "train.decay_steps=110", "train.lr=1.0", "train.min_lr=0.1"],
    ).train
    assert [lr_at(s, cfg) for s in (0, 4, 9)] == [0.1, 0.5, 1.0]
    assert lr_at(60, cfg) == pytest.approx(0.55) and lr_at(110, cfg) == 0.1 and lr_at(500, cfg) == 0.1
    assert lr_at(35, cfg) > 0.55 + (1 - 0.55) / 2 - 0.2  # cosine stays high early
    cfg.schedule = "linear"
    assert lr_at(35, cfg) == pytest.approx(1.0 - 0.25 * 0.9)


def test_no_weight_decay_on_biases_norms_and_embeddings():
    from lmlab.models import build_model, get_preset

    model = build_model(get_preset("gpt2-tiny", vocab_size=100))
    decay, plain = param_groups([model], 0.1)
    names = {id(p): n for n, p in model.named_parameters()}
    assert all(p.dim() == 2 and "embed" not in names[id(p)] for p in decay["params"])
    plain_names = {names[id(p)] for p in plain["params"]}
    assert "tok_embed.weight" in plain_names and "pos_embed.weight" in plain_names
    assert any("norm" in n for n in plain_names) and any(n.endswith("bias") for n in plain_names)
    assert decay["weight_decay"] == 0.1 and plain["weight_decay"] == 0.0
    assert len(decay["params"]) + len(plain["params"]) == len(list(model.parameters()))


def test_objective_options_are_typed_and_include_inherited_ones():
    """`--set objective.x=...` is coerced to the option's type (one-line error otherwise), and
    objectives built on MLM (NSP, UniLM) accept MLM's options too."""
    import pytest

    from lmlab.errors import LmlabError
    from lmlab.train import load_config

    with pytest.raises(LmlabError, match=r"--set objective.poisson_lambda must be a number \(got 'abc'\)"):
        load_config("configs/bart-tiny.toml", ["objective.poisson_lambda=abc"])
    with pytest.raises(LmlabError, match="objective.mlm must be true or false"):
        load_config("configs/bert-tiny-nsp.toml", ["objective.mlm=maybe"])
    cfg = load_config("configs/bert-tiny-nsp.toml", ["objective.mask_prob=0.2"])
    assert cfg.objective.params["mask_prob"] == 0.2

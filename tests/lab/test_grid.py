"""Grid parsing and validation: bad input is refused before anything trains; budgets become steps."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from lmlab.config.toml import read_toml
from lmlab.errors import LmlabError
from lmlab.lab import MIN_STEPS, Budget, flops_per_step, load_grid, steps_for_budget
from lmlab.models import get_preset

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def grid_dict(tmp_path, data_dir):
    """A small valid grid on real text (nothing is read but the file names)."""
    shakespeare = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    (tmp_path / "train.txt").write_text(shakespeare[:20_000], encoding="utf-8")
    (tmp_path / "val.txt").write_text(shakespeare[-5_000:], encoding="utf-8")
    return {
        "name": "t",
        "seeds": [0, 1],
        "budget": {"tokens": 40_960},
        "pretrain": {
            "data": {
                "train": [str(tmp_path / "train.txt")],
                "val": [str(tmp_path / "val.txt")],
                "tokenizer": {"algo": "bytelevel", "vocab_size": 300},
            },
            "train": {"batch_size": 8, "seq_len": 32, "lr": 1e-3},
            "model": {"max_positions": 64},
        },
        "arms": [
            {"name": "bert", "preset": "bert-tiny", "objective": "mlm"},
            {"name": "gpt", "preset": "gpt2-tiny", "objective": "clm"},
            {"name": "scratch", "preset": "bert-tiny", "objective": "none"},
        ],
        "finetune": {"epochs": 1, "lr": 1e-3},
        "tasks": [
            {
                "task": "sst2",
                "train": str(data_dir / "glue/sst2/train.tsv"),
                "dev": str(data_dir / "glue/sst2/dev.tsv"),
                "max_train_examples": 100,
            }
        ],
    }


def one_line_error(raw) -> str:
    with pytest.raises(LmlabError) as e:
        load_grid(raw)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


# --------------------------------------------------------------------------- planning


def test_grid_plans_arms_times_seeds(grid_dict):
    grid = load_grid(grid_dict)
    assert [(r.arm.name, r.seed) for r in grid.pretrain_runs] == [
        ("bert", 0),
        ("bert", 1),
        ("gpt", 0),
        ("gpt", 1),
        ("scratch", 0),
        ("scratch", 1),
    ]
    assert len(grid.finetune_runs) == 6
    bert = grid.pretrain_runs[0]
    assert bert.steps == 40_960 // (8 * 32) == 160
    assert bert.config["train"]["max_steps"] == 160 and bert.config["train"]["seed"] == 0
    assert bert.config["train"]["warmup_steps"] == 16  # scaled to the run, not the recipe's 100
    scratch = grid.pretrain_runs[4]
    assert scratch.steps == 0 and scratch.flops == 0 and scratch.config["objective"] == {"name": "none"}
    # the scratch model is the MLM arm's model: same parameter count
    assert scratch.parameters == bert.parameters
    # each fine-tuning run starts from the pretraining run of its own seed
    assert all(f.pretrain.seed == f.seed for f in grid.finetune_runs)


def test_share_pretraining_uses_one_run_per_arm(grid_dict):
    grid = load_grid({**grid_dict, "share_pretraining": True, "seeds": [0, 1, 2]})
    assert len(grid.pretrain_runs) == 3
    assert len(grid.finetune_runs) == 9
    assert {f.seed for f in grid.finetune_runs} == {0, 1, 2}


def test_sizes_multiply_the_grid(grid_dict):
    raw = {**grid_dict, "sizes": {"d32": {"d_model": 32, "n_heads": 2, "d_ff": 64}, "d64": {}}}
    grid = load_grid(raw)
    assert len(grid.pretrain_runs) == 3 * 2 * 2
    small = next(r for r in grid.pretrain_runs if r.size == "d32" and r.arm.name == "bert")
    big = next(r for r in grid.pretrain_runs if r.size == "d64" and r.arm.name == "bert")
    assert small.parameters < big.parameters
    assert small.config["model"]["d_model"] == 32


def test_run_keys_follow_the_settings_that_matter(grid_dict):
    base = {r.label: r.key for r in load_grid(grid_dict).pretrain_runs}
    assert len(set(base.values())) == len(base)
    threads = copy.deepcopy(grid_dict)
    threads["pretrain"]["train"]["threads"] = 1  # speed only: same runs
    assert {r.label: r.key for r in load_grid(threads).pretrain_runs} == base
    lr = copy.deepcopy(grid_dict)
    lr["pretrain"]["train"]["lr"] = 2e-3  # changes every pretrained run
    changed = {r.label: r.key for r in load_grid(lr).pretrain_runs}
    assert all(changed[k] != base[k] for k in base if not k.startswith("scratch"))
    assert all(changed[k] == base[k] for k in base if k.startswith("scratch"))


def test_overrides_change_the_budget(grid_dict, tmp_path):
    import tomllib  # noqa: F401  (the grid file is TOML)

    from lmlab.train.config import to_toml

    path = tmp_path / "grid.toml"
    raw = copy.deepcopy(grid_dict)
    arms, tasks = raw.pop("arms"), raw.pop("tasks")
    text = to_toml(raw)
    for arm in arms:
        text += "\n[[arms]]\n" + "".join(f'{k} = "{v}"\n' for k, v in arm.items())
    for task in tasks:
        text += "\n[[tasks]]\n" + "".join(f"{k} = {v!r}\n".replace("'", '"') for k, v in task.items())
    path.write_text(text, encoding="utf-8")
    assert load_grid(path).pretrain_runs[0].steps == 160
    grid = load_grid(path, ["budget.tokens=81920", "seeds=[3]"])
    assert grid.pretrain_runs[0].steps == 320 and grid.seeds == [3]


def test_shipped_grids_load():
    for name, runs in (("objectives-tiny", 8), ("sst2-pretraining", 6)):
        grid = load_grid(ROOT / "configs" / "grids" / f"{name}.toml")
        assert len(grid.pretrain_runs) == runs
        assert all(r.steps >= MIN_STEPS for r in grid.pretrain_runs if r.arm.pretrained)
    objectives = load_grid(ROOT / "configs" / "grids" / "objectives-tiny.toml")
    assert {r.arm.objective for r in objectives.pretrain_runs} == {"mlm", "clm", "electra", "t5"}
    # one FLOPs budget: every arm spends (almost) all of it, in different numbers of steps
    for r in objectives.pretrain_runs:
        assert objectives.budget.amount - r.flops_per_step < r.flops <= objectives.budget.amount
    assert len({r.steps for r in objectives.pretrain_runs}) == 4


# --------------------------------------------------------------------------- FLOPs -> steps


def test_flops_per_step_of_a_decoder_is_6n_plus_attention():
    """gpt2-tiny, rows x T tokens: 6 * (matmul weights) + 12 * L * T * d per token (Kaplan, Table 1)."""
    cfg = get_preset("gpt2-tiny", vocab_size=1000)
    d, L, T, rows, ff, V = cfg.d_model, cfg.n_layers, 32, 4, cfg.d_ff, 1000
    n_matmul = L * (4 * d * d + 2 * d * ff) + d * V
    expected = rows * T * (6 * n_matmul + 12 * L * T * d)
    assert flops_per_step(cfg, "clm", {}, T, rows) == expected
    assert steps_for_budget(Budget("flops", 10.5 * expected), rows * T, expected) == 10


def test_masked_lm_counts_logits_only_at_masked_positions():
    enc = get_preset("bert-tiny", vocab_size=4096)
    full = flops_per_step(enc, "mlm", {"mask_prob": 1.0}, 128, 16)
    part = flops_per_step(enc, "mlm", {"mask_prob": 0.15}, 128, 16)
    head = 3 * 2 * 16 * (128 - round(0.15 * 128)) * (enc.d_model * enc.embed_dim + enc.embed_dim * 4096)
    assert full - part == head
    electra = flops_per_step(get_preset("electra-tiny", vocab_size=4096), "electra", {}, 128, 16)
    assert electra > flops_per_step(get_preset("electra-tiny", vocab_size=4096), "mlm", {}, 128, 16) * 0.5


def test_t5_budget_counts_source_and_target_lengths():
    cfg = get_preset("t5-tiny", vocab_size=4196)
    from lmlab.models.flops import training_flops

    # 128 tokens, 15% noise (19 tokens) in spans of 3 (6 spans): source 128-19+6+1, target 19+6+1
    assert flops_per_step(cfg, "t5", {}, 128, 2) == training_flops(cfg, 116, 2, decoder_len=26)


def test_token_budget_steps():
    assert steps_for_budget(Budget("tokens", 1_000_000), 2048, 0.0) == 488


# --------------------------------------------------------------------------- bad input


def test_unknown_objective_lists_the_valid_ones(grid_dict):
    grid_dict["arms"][0]["objective"] = "mlmm"
    msg = one_line_error(grid_dict)
    assert "unknown objective 'mlmm'" in msg and "did you mean 'mlm'" in msg
    assert "none, clm, mlm" in msg


def test_impossible_pairing_lists_what_the_preset_can_train(grid_dict):
    grid_dict["arms"][1]["objective"] = "mlm"  # gpt2-tiny is a decoder
    msg = one_line_error(grid_dict)
    assert "objective 'mlm' cannot train preset gpt2-tiny, a decoder" in msg
    assert "valid objectives for gpt2-tiny: none, clm, prefix_lm" in msg


def test_budget_too_small_is_one_line(grid_dict):
    grid_dict["budget"] = {"tokens": 2000}  # 7 steps of 8 x 32
    msg = one_line_error(grid_dict)
    assert "buys only 7 step(s)" in msg and f"at least {MIN_STEPS}" in msg
    assert "raise budget.tokens to at least 2.56e+03" in msg
    grid_dict["budget"] = {"flops": 1e6}
    assert "buys only 0 step(s)" in one_line_error(grid_dict)


@pytest.mark.parametrize(
    "budget, words",
    [
        ({"steps": 10}, "unknown budget kind 'steps'"),
        ({"tokens": -5}, "budget.tokens must be at least 1 (got -5)"),
        ({"tokens": 10, "flops": 1e9}, "one key"),
    ],
)
def test_bad_budgets(grid_dict, budget, words):
    grid_dict["budget"] = budget
    assert words in one_line_error(grid_dict)


def test_other_bad_grids(grid_dict):
    cases = [
        (lambda g: g.update(arms=[]), "no [[arms]]"),
        (lambda g: g.update(seed=[0]), "did you mean seeds?"),
        (lambda g: g["arms"][0].update(preset="bert-tiyn"), "unknown model preset 'bert-tiyn'"),
        (lambda g: g["arms"][0].update(params={"mask_prb": 0.2}),
         "unknown config key arms[0].params.mask_prb"),
        (lambda g: g["pretrain"]["train"].update(max_steps=5), "set by the budget"),
        (lambda g: g["pretrain"]["train"].update(seq_len=128), "longer than the model's 64 positions"),
        (lambda g: g["tasks"][0].update(task="sst3"), "unknown task 'sst3'"),
        (lambda g: g["tasks"][0].update(dev="/nonexistent/dev.tsv"), "does not exist"),
        (lambda g: g["finetune"].update(epoch=2), "unknown fine-tuning settings ['finetune.epoch']"),
        (lambda g: g["tasks"][0].update(task="conll"), "not offered for decoder-only models"),
        (
            lambda g: g["arms"].append({"name": "bert", "preset": "bert-tiny", "objective": "mlm"}),
            "two arms are named 'bert'",
        ),
    ]
    for edit, words in cases:
        raw = copy.deepcopy(grid_dict)
        edit(raw)
        assert words in one_line_error(raw), words


def test_cli_rejects_a_bad_grid_before_training(tmp_path, capsys):
    from lmlab.cli import main

    path = tmp_path / "bad.toml"
    path.write_text(
        'budget = {tokens = 100000}\n[pretrain.data]\ntrain = ["x.txt"]\n'
        '[[arms]]\npreset = "gpt2-tiny"\nobjective = "electra"\n',
        encoding="utf-8",
    )
    assert main(["compare", "--config", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {path}: arm 'gpt2-tiny-electra': objective 'electra' cannot train preset "
                          "gpt2-tiny")  # the file, then the key
    assert len(err.splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_an_arm_can_have_its_own_budget(grid_dict):
    grid_dict["arms"].append(
        {"name": "bert-half", "preset": "bert-tiny", "objective": "mlm", "budget": {"tokens": 20_480}}
    )
    grid = load_grid(grid_dict)
    steps = {(r.arm.name, r.seed): r.steps for r in grid.pretrain_runs}
    assert steps[("bert", 0)] == 160 and steps[("bert-half", 0)] == 80
    half = next(r for r in grid.pretrain_runs if r.arm.name == "bert-half")
    full = next(r for r in grid.pretrain_runs if r.arm.name == "bert")
    assert half.key != full.key and half.tokens == full.tokens // 2
    assert "bert-half: {tokens = 20,480}" in grid.budget_text()
    grid_dict["arms"][-1]["budget"] = {"tokens": 100}
    assert "arms.bert-half.budget.tokens" in one_line_error(grid_dict)
    grid_dict["arms"][-1]["budget"] = {"steps": 100}
    assert "bert-half" in one_line_error(grid_dict)
    grid_dict["arms"][-1] = {"name": "s", "preset": "bert-tiny", "objective": "none"}
    grid_dict["arms"][-1]["budget"] = {"tokens": 1e5}
    assert "takes no budget" in one_line_error(grid_dict)


def test_t5_prefix_lm_budget_counts_half_the_row_each_side():
    cfg = get_preset("t5-tiny", vocab_size=300)
    both = flops_per_step(cfg, "t5", {"variant": "prefix_lm"}, 64, 2)
    from lmlab.models.flops import training_flops

    assert both == training_flops(cfg, 33, 2, decoder_len=33)


def test_contrasts_name_arms_of_the_grid(grid_dict):
    grid_dict["contrasts"] = [{"name": "pretraining helps", "better": "bert", "than": "scratch"}]
    grid = load_grid(grid_dict)
    assert [(c.name, c.better, c.than, c.kind) for c in grid.contrasts] == [
        ("pretraining helps", "bert", "scratch", "better")
    ]
    grid_dict["contrasts"] = [{"better": "bertt", "than": "scratch"}]
    assert "did you mean bert?" in one_line_error(grid_dict)
    grid_dict["contrasts"] = [{"better": "bert", "than": "bert"}]
    assert "itself" in one_line_error(grid_dict)
    grid_dict["contrasts"] = [{"better": "bert", "than": "gpt", "kind": "worse"}]
    assert "at-least" in one_line_error(grid_dict)
    grid_dict["contrasts"] = [{"better": "bert", "than": "gpt", "by": 2}]
    assert "unknown key 'by'" in one_line_error(grid_dict)


@pytest.mark.parametrize("name", ["../escape", "a/b", ".hidden", ".."])
def test_names_that_would_leave_the_output_directory_are_refused(grid_dict, name):
    raw = copy.deepcopy(grid_dict)
    raw["arms"][0]["name"] = name
    assert "cannot be part of a file name" in one_line_error(raw)


def _no_tasks(g):
    g.pop("tasks")


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        # a cap of 0 is not "all" (as --max-train-examples 0 is refused): leave the key out for all
        (lambda g: g["tasks"][0].update(max_train_examples=0), "max_train_examples must be at least 1"),
        (lambda g: g["tasks"][0].update(max_eval_examples=-1), "max_eval_examples must be at least 1"),
        # keys the grid sets itself would be ignored
        (lambda g: g["arms"][1].update(train={"max_steps": 999}), "arms[1].train.max_steps is set by"),
        (lambda g: g["arms"][0].update(train={"seed": 3}), "arms[0].train.seed is set by the grid's seeds"),
        (lambda g: g["pretrain"]["train"].update(seed=3), "pretrain.train.seed is set by the grid's seeds"),
        (lambda g: g["finetune"].update(seed=3), "finetune.seed is set by the grid's seeds"),
        (lambda g: g["tasks"][0].update(finetune={"seed": 3}), "tasks[0].finetune.seed is set by the grid's"),
        (lambda g: g["finetune"].update(progress=True), "finetune.progress is set by lmlab compare"),
        (lambda g: g["arms"][2].update(train={"lr": 1e-2}), "arms[2].train: arm 'scratch'"),
        # [finetune] is checked as the typed section even when no [[tasks]] uses it
        (lambda g: (_no_tasks(g), g["finetune"].update(epochs=-7)), "finetune.epochs must be at least 1"),
        (lambda g: (_no_tasks(g), g["finetune"].update(bogus=1)), "settings ['finetune.bogus']"),
        (lambda g: (_no_tasks(g), g.update(finetune=5)), "finetune must be a table"),
    ],
)
def test_every_grid_table_is_checked_and_ignored_keys_are_refused(grid_dict, edit, words):
    edit(grid_dict)
    assert words in one_line_error(grid_dict)


def test_a_grid_file_error_names_the_file_and_key(grid_dict, tmp_path):
    from lmlab.config.toml import to_toml

    grid_dict.pop("tasks")
    grid_dict["finetune"]["epochs"] = -7
    path = tmp_path / "g.toml"
    path.write_text(to_toml(grid_dict), encoding="utf-8")
    with pytest.raises(LmlabError) as e:
        load_grid(path)
    assert str(e.value).startswith(f"{path}: finetune.epochs must be at least 1")


def test_a_task_file_a_fine_tuning_would_refuse_is_refused_as_the_grid_is_planned(grid_dict, tmp_path):
    """A label that is not the task's, on line 3 of the train file, used to stop the first
    fine-tuning only after an arm had pretrained; --dry-run passed the grid."""
    train = tmp_path / "sst2-train.tsv"
    train.write_text("sentence\tlabel\ngood film\t1\nbad film\t7\nfine film\t0\n", encoding="utf-8")
    raw = copy.deepcopy(grid_dict)
    raw["tasks"][0]["train"] = str(train)
    msg = one_line_error(raw)
    assert msg.startswith("task 'sst2': ") and "label '7'" in msg and "line 3" in msg, msg


def test_a_missing_task_file_under_an_unset_lmlab_data_says_to_check_it(grid_dict, tmp_path, monkeypatch):
    """pretrain's "(is $LMLAB_DATA set?)" hint, shared by a grid's task files (expand_input_file)."""
    monkeypatch.delenv("LMLAB_DATA", raising=False)
    monkeypatch.chdir(tmp_path)  # ../shared/data, the default, is not there
    grid_dict["tasks"][0]["train"] = "$LMLAB_DATA/glue/sst2/train.tsv"
    msg = one_line_error(grid_dict)
    assert "glue/sst2/train.tsv does not exist (is $LMLAB_DATA set?)" in msg
    assert msg.endswith("check the path")


def test_a_cache_dir_inside_another_output_is_refused_as_the_grid_is_planned(grid_dict, tmp_path):
    """The grid's data cache is checked by the trainer's rule (lmlab.train.data.cache_entry) when the
    grid is planned (and so by --dry-run), naming the grid's key: it was refused only once an arm
    had trained a tokenizer, blaming --out."""
    from lmlab import ownership

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}", encoding="utf-8")
    ownership.seal(model, "model")
    grid_dict["pretrain"]["data"]["cache_dir"] = str(model)
    msg = one_line_error(grid_dict)
    assert msg.startswith(f"pretrain.data.cache_dir {model}/data-") and "inside the model" in msg
    assert sorted(p.name for p in model.iterdir()) == [".lmlab-manifest.json", "config.json"]


def test_a_grid_may_name_its_own_cache_but_not_another_comparisons(grid_dict, tmp_path, capsys):
    """``pretrain.data.cache_dir = OUT/cache`` (the default, named) is the grid's own when it runs in
    OUT again: it was refused as 'inside the comparison OUT (its cache), where only that comparison
    writes'. Another comparison's cache stays refused, by load_grid and by lmlab compare alike."""
    from lmlab.cli import main
    from lmlab.config.toml import to_toml
    from lmlab.lab.grid_records import GRID_KIND
    from lmlab.lab.runner import GRID_ENTRIES
    from lmlab.ownership import claim_dir

    out, other = tmp_path / "cmp", tmp_path / "other"
    for folder in (out, other):  # comparisons run before: their cache holds a data entry
        claim_dir(folder, GRID_KIND, GRID_ENTRIES)
        (folder / "cache").mkdir()
    grid_dict["pretrain"]["data"]["cache_dir"] = str(out / "cache")
    assert load_grid(copy.deepcopy(grid_dict), out=out).cache_dir == str(out / "cache")
    with pytest.raises(LmlabError, match=r"inside the comparison .*cmp \(its cache\)"):
        load_grid(copy.deepcopy(grid_dict), out=other)
    path = tmp_path / "g.toml"
    path.write_text(to_toml(grid_dict), encoding="utf-8")
    assert main(["compare", "--config", str(path), "--out", str(out), "--dry-run"]) == 0
    capsys.readouterr()
    assert main(["compare", "--config", str(path), "--out", str(other), "--dry-run"]) == 2
    assert "inside the comparison" in capsys.readouterr().err
    assert sorted(p.name for p in (out / "cache").iterdir()) == []  # a dry run writes nothing


def test_a_set_value_is_named_as_the_set_and_read_as_command_line_text(capsys):
    """A grid's --set is named ``--set KEY`` (not the grid file, which does not hold it) and its
    value is command-line text, as pretrain's and finetune's --set are."""
    from lmlab.cli import main

    path = ROOT / "configs" / "grids" / "objectives-tiny.toml"
    with pytest.raises(LmlabError) as e:
        load_grid(path, ["finetune.max_steps=1", "finetune.warmup_steps=5"])
    assert str(path) not in str(e.value)
    assert "--set finetune.warmup_steps 5 is more than --set finetune.max_steps 1" in str(e.value)
    grid = load_grid(path, ['finetune.group_by_length="true"'])  # text, as `lmlab finetune --set` reads it
    assert all(t.settings["group_by_length"] is True for t in grid.tasks)
    assert main(["compare", "--config", str(path), "--dry-run", "--set", "finetune.warmup_steps=5",
                 "finetune.max_steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: task 'sst2': --set finetune.warmup_steps 5 is more than"), err


@pytest.mark.parametrize(("override", "named"), [
    ("pretrain.train.lr=-1", "arm 'bert-mlm', size 'base': --set pretrain.train.lr must be greater than 0"),
    ("pretrain.model.d_model=0",
     "arm 'bert-mlm', size 'base': --set pretrain.model.d_model must be at least 1"),
    ("sizes.base.d_model=-1", "arm 'bert-mlm', size 'base': --set sizes.base.d_model must be at least 1"),
    ("budget.tokens=-5", "--set budget.tokens must be at least 1"),
    ("pretrain.data.val_fraction=2", "--set pretrain.data.val_fraction must be less than 1"),
    ("seeds=[-1]", "--set seeds: 0: must be at least 0"),  # probe10a #7: was named at the grid file
    ("seeds=[0,0]", "--set seeds lists 0 twice"),
])
def test_a_set_pretraining_value_is_named_as_the_set(override, named):
    """Each run a grid plans is checked as a recipe; a value --set gave is named as that --set
    (before: the recipe's ``train.lr``, prefixed with the grid file, which does not hold it)."""
    path = ROOT / "configs" / "grids" / "objectives-tiny.toml"
    with pytest.raises(LmlabError) as e:
        load_grid(path, [override])
    assert str(e.value).startswith(named) and str(path) not in str(e.value), str(e.value)


def test_a_pretraining_value_is_named_where_the_grid_wrote_it(grid_dict):
    """A run's setting is named by the grid key that gave it: its arm's table or [pretrain]'s."""
    grid_dict["arms"][0]["train"] = {"lr": -1.0}
    with pytest.raises(LmlabError, match=r"arms\[0\]\.train\.lr must be greater than 0"):
        load_grid(copy.deepcopy(grid_dict))
    grid_dict["arms"][0]["train"] = {}
    grid_dict["pretrain"]["train"]["lr"] = -1.0
    with pytest.raises(LmlabError, match=r"^arm '[^']+', size 'base': pretrain\.train\.lr must be"):
        load_grid(grid_dict)


def test_a_set_pretraining_text_is_read_as_pretrain_set_reads_it():
    """``--set 'pretrain.data.max_tokens="100000"'`` is the number, as ``lmlab pretrain --set``
    reads it: the same runs (and run keys) as the unquoted value."""
    path = ROOT / "configs" / "grids" / "objectives-tiny.toml"
    quoted = load_grid(path, ['pretrain.data.max_tokens="100000"', 'pretrain.train.prefetch="false"'])
    plain = load_grid(path, ["pretrain.data.max_tokens=100000", "pretrain.train.prefetch=false"])
    assert [r.key for r in quoted.pretrain_runs] == [r.key for r in plain.pretrain_runs]
    assert all(r.config["data"]["max_tokens"] == 100000 for r in quoted.pretrain_runs)
    assert all(r.config["train"]["prefetch"] is False for r in quoted.pretrain_runs)


@pytest.mark.parametrize("override", ["budget.tokens=1280.5", "budget.tokens=1.28e3", "budget.tokens=1280.0"])
def test_a_token_budget_is_a_whole_number_by_every_route(override):
    """probe10a #8: a fractional or float token budget was accepted and cut down to a whole number
    (1280.5 -> 1,280), where every other count refuses 1.0 and 1e3; FLOPs stay any number."""
    path = ROOT / "configs" / "grids" / "objectives-tiny.toml"
    with pytest.raises(LmlabError, match=r"--set budget.tokens .*whole number"):
        load_grid(path, [override])
    raw = read_toml(path)
    raw["budget"] = {"tokens": 1280.0}
    with pytest.raises(LmlabError, match=r"budget.tokens .*whole number"):
        load_grid(raw)
    raw["budget"] = {"flops": 1.5e12}
    assert load_grid(raw).budget.amount == 1.5e12

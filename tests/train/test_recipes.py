"""Every recipe in configs/ is valid, and every golden loss curve in configs/golden/ is reproduced."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmlab.train import load_config
from lmlab.train.golden import check, compare

ROOT = Path(__file__).resolve().parents[2]
RECIPES = sorted((ROOT / "configs").glob("*.toml"))
GOLDEN = sorted((ROOT / "configs" / "golden").glob("*.json"))


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_and_accepts_the_common_overrides(recipe):
    cfg = load_config(
        recipe,
        [
            "train.max_steps=60",
            "train.batch_size=4",
            "train.seq_len=64",
            "train.lr=1e-3",
            "train.eval_every=30",
            "train.checkpoint_every=30",
            "train.seed=1",
            "data.train=a.txt",
            "data.val=b.txt",
        ],
    )
    assert cfg.train.max_steps == 60 and cfg.data.train == ["a.txt"] and cfg.data.val == ["b.txt"]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_validates_on_held_out_text_of_its_own_corpus(recipe):
    """Validation text from another corpus measures the gap between the corpora, not learning: the
    books recipes validated on WikiText-2, whose loss rose from step 200 while the training loss
    fell, and whose next-token accuracy stayed below the most-frequent-token guess. Every recipe
    holds out a part of its own training documents instead, and its comments say so."""
    data = load_config(recipe).data
    assert data.val == [] and 0 < data.val_fraction <= 0.1, (
        f"{recipe.name} validates on {data.val or 'nothing'}, not on a held-out part of {data.train}")
    assert "held out" in recipe.read_text(encoding="utf-8")


def test_there_is_a_golden_curve_for_the_gpt_recipe():
    assert ROOT / "configs" / "golden" / "gpt-tiny-clm.json" in GOLDEN


@pytest.fixture(scope="session")
def shared_data_cache(tmp_path_factory):
    """One tokenizer + tokenisation shared by every recipe with the same [data] table."""
    return tmp_path_factory.mktemp("lmlab-data-cache")


@pytest.mark.slow
@pytest.mark.parametrize("golden", GOLDEN, ids=lambda p: p.stem)
def test_recipe_reproduces_its_golden_curve(golden, tmp_path, monkeypatch, shared_data_cache):
    monkeypatch.chdir(ROOT)  # recipes name paths relative to the repository root
    monkeypatch.setenv("LMLAB_CACHE_DIR", str(shared_data_cache))
    problems = check(golden, tmp_path / "run")
    assert not problems, f"{golden.name}: " + "; ".join(problems[:5])


def test_compare_flags_a_changed_curve():
    golden = {"loss": [8.0, 7.5], "val_loss": {"0": 8.1, "2": 7.6}, "tolerance": 5e-4}
    assert compare(golden, {"loss": [8.0, 7.5], "val_loss": {"0": 8.1, "2": 7.6}}) == []
    assert compare(golden, {"loss": [8.0, 7.51], "val_loss": {"0": 8.1, "2": 7.6}}) == [
        "step 2: train loss 7.510000, golden 7.500000"
    ]


#: (recipe, steps, signal, how many times its trivial baseline the signal must reach on the
#: validation text at that step): the steps the README names for each recipe. Measured on the shared
#: 2-core development machine, on each recipe's held-out validation paragraphs (val signal vs the
#: most-frequent-token guess, or chance for the AUC): CLM next-token accuracy 0.081 vs 0.053 at step
#: 150; MLM masked-token accuracy 0.096 vs 0.054 at step 300 (tokens the input still shows are not
#: scored); ELECTRA discriminator AUC 0.584 vs 0.5 at step 400 (0.54-0.59 over steps 210-400: the
#: discriminator's task hardens as its generator learns); BART target-token accuracy 0.074 vs 0.052
#: at step 300; T5 span-token accuracy 0.082 vs 0.071 at step 600.
SIGNALS = [("gpt-tiny-clm", 150, "next_acc", 1.4),
           ("bert-tiny-mlm", 300, "mlm_acc", 1.4),
           ("electra-tiny", 400, "disc_auc", 1.05),
           ("bart-tiny", 300, "target_acc", 1.25),
           ("bert-tiny-wwm", 300, "mlm_acc", 1.5),     # measured 0.112 vs 0.054
           ("bert-tiny-nsp", 300, "mlm_acc", 1.3),     # 0.080 vs 0.053
           ("spanbert-tiny", 300, "mlm_acc", 1.15),    # 0.063 vs 0.049
           ("unilm-tiny", 300, "mlm_acc", 1.2),        # 0.076 vs 0.055
           ("prefix-lm-tiny", 300, "next_acc", 1.3),   # 0.084 vs 0.052
           ("llama-tiny-clm", 300, "next_acc", 1.8),   # 0.139 vs 0.053
           ("xlnet-tiny", 300, "target_acc", 1.15),    # 0.070 vs 0.053
           ("transfo-xl-tiny", 300, "next_acc", 1.8),  # 0.124 vs 0.053
           ("elmo-tiny", 300, "next_acc", 1.3),        # 0.082 vs 0.053
           ("t5-tiny-spans", 600, "target_acc", 1.07)]


@pytest.mark.slow
@pytest.mark.parametrize("recipe,steps,signal,factor", SIGNALS, ids=[s[0] for s in SIGNALS])
def test_recipe_beats_its_trivial_baseline(recipe, steps, signal, factor, tmp_path, monkeypatch,
                                           shared_data_cache):
    """The recipe learns within the steps its docs name, measured where it counts: on its held-out
    validation text the loss is below its start and the objective's own signal clearly above the
    trivial answer (scored on the same targets). The signal on the training batches is no evidence:
    the recipes once reached 0.088 vs 0.052 there while validation stayed below the guess."""
    from lmlab.train import pretrain

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("LMLAB_CACHE_DIR", str(shared_data_cache))
    summary = pretrain(f"configs/{recipe}.toml", tmp_path / "run", log=lambda m: None,
                       overrides=[f"train.max_steps={steps}", f"train.eval_every={steps}",
                                  f"train.checkpoint_every={steps}", "train.progress=off"])
    assert summary["val_loss"] < summary["initial_val_loss"], summary["val"]
    val = summary["val_signals"]
    assert val[f"val_{signal}"] > factor * val[f"val_{signal}_guess"], summary["val"]

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


#: (recipe, steps, signal, how many times its trivial baseline it must reach on the last 20 steps);
#: each within about a CPU minute. Measured on the 2-core development machine: CLM next-token
#: accuracy 0.088 vs 0.052 (most frequent token) at step 150; MLM masked-token accuracy 0.086 vs
#: 0.052 at step 300 (tokens the input still shows are not scored); ELECTRA discriminator AUC 0.600
#: vs 0.5 (chance) at step 400; BART target-token accuracy 0.074 vs 0.050 at step 300.
SIGNALS = [("gpt-tiny-clm", 150, "next_acc", 1.4),
           ("bert-tiny-mlm", 300, "mlm_acc", 1.4),
           ("electra-tiny", 400, "disc_auc", 1.1),
           ("bart-tiny", 300, "target_acc", 1.25),
           ("bert-tiny-wwm", 300, "mlm_acc", 1.3),     # measured 0.091 vs 0.051
           ("bert-tiny-nsp", 300, "mlm_acc", 1.3),     # 0.081 vs 0.051
           ("spanbert-tiny", 300, "mlm_acc", 1.2),     # 0.066 vs 0.048
           ("unilm-tiny", 300, "mlm_acc", 1.2)]        # 0.075 vs 0.052


@pytest.mark.slow
@pytest.mark.parametrize("recipe,steps,signal,factor", SIGNALS, ids=[s[0] for s in SIGNALS])
def test_recipe_beats_its_trivial_baseline(recipe, steps, signal, factor, tmp_path, monkeypatch,
                                           shared_data_cache):
    """The recipe learns within a CPU minute: its objective's own signal, on its own training text,
    clearly above the trivial answer (measured on the same batches)."""
    import json

    from lmlab.train import pretrain

    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("LMLAB_CACHE_DIR", str(shared_data_cache))
    pretrain(f"configs/{recipe}.toml", tmp_path / "run", log=lambda m: None,
             overrides=[f"train.max_steps={steps}", f"train.eval_every={steps}",
                        f"train.checkpoint_every={steps}", "train.progress=off"])
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    last = [r for r in rows if signal in r][-20:]
    value = sum(r[signal] for r in last) / len(last)
    guess = sum(r[f"{signal}_guess"] for r in last) / len(last)
    assert value > factor * guess, (value, guess)

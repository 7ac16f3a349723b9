"""docs/extending.md's worked examples, run: a new objective and a new model family."""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def pretrain_losses(run_dir: Path, run: dict, steps: int) -> list[float]:
    """The training loss of each step of ``lmlab pretrain`` on ``run`` (model, objective and data
    sections) for ``steps`` steps: batches of 8 rows of 32 tokens, one thread, seed 0."""
    from lmlab.train.loop import pretrain

    train = {"max_steps": steps, "batch_size": 8, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
             "eval_every": steps, "checkpoint_every": steps, "threads": 1, "precision": "fp32",
             "progress": "off", "seed": 0}
    pretrain({**run, "train": train}, run_dir, log=lambda msg: None)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [r["loss"] for r in rows if "loss" in r and "step" in r]


def test_new_family(tmp_path, monkeypatch, data_dir):
    """The parallel-block LM of docs/extending.md (tests/fixtures/parallel_lm/, one folder) joins
    lmlab with one registry line: its preset builds, its FLOPs are counted through its spec, the
    normal trainer trains it with the decoder objective (loss going down), and its checkpoint
    loads back as the same model."""
    from lmlab.data import prepare_shards
    from lmlab.models import build_model, get_preset, load_checkpoint
    from lmlab.models.flops import count_parameters, training_flops
    from lmlab.models.registry import FAMILIES
    from lmlab.tokenizers import train_tokenizer

    guide = (Path(__file__).parents[1] / "docs" / "extending.md").read_text(encoding="utf-8")
    for source in sorted((FIXTURES / "parallel_lm").glob("*.py")):  # the guide shows the folder as it is
        assert source.read_text(encoding="utf-8").rstrip() in guide, source.name

    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setitem(FAMILIES, "parallel", "parallel_lm")  # the one registry line

    config = get_preset("gptj-tiny", vocab_size=320, max_positions=64)
    model = build_model(config)
    assert type(model).__name__ == "ParallelLM"
    assert count_parameters(config).total == model.num_parameters()
    # 6 x matmul parameters per token (blocks + tied output projection) + attention's q.k and p.v
    n_matmul = 2 * (4 * 64 * 64 + 2 * 64 * 256) + 64 * 320
    assert training_flops(config, 32, attention=False) == 6 * n_matmul * 32
    assert training_flops(config, 32) > training_flops(config, 32, attention=False)

    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:40_000]
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    train_tokenizer("bytelevel", text.splitlines(keepends=True), vocab_size=320).save(tmp_path / "tok")
    prepare_shards(tmp_path / "tok", [tmp_path / "train.txt"], tmp_path / "shards", val_fraction=0.1,
                   workers=1, progress=False)
    losses = pretrain_losses(tmp_path / "run", {"model": {"preset": "gptj-tiny", "max_positions": 64},
                                                "objective": {"name": "clm"},
                                                "data": {"train": [str(tmp_path / "shards")]}}, steps=20)
    assert len(losses) == 20
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.5
    checkpoint = sorted((tmp_path / "run").glob("checkpoints/*/config.json"))[-1].parent
    assert json.loads((checkpoint / "config.json").read_text())["architecture"] == "parallel"
    assert type(load_checkpoint(checkpoint)).__name__ == "ParallelLM"


def test_new_objective(tmp_path, monkeypatch, data_dir):
    """The shuffled-token detection objective of docs/extending.md (tests/fixtures/shuffled.py,
    one file, shown whole in the guide) joins lmlab with one registry line, touches nothing in
    lmlab.models, and the normal trainer trains a tiny BERT with it: the loss goes down."""
    import torch

    from lmlab.objectives import OBJECTIVES, get_objective
    from lmlab.train.loop import pretrain

    guide = (Path(__file__).parents[1] / "docs" / "extending.md").read_text(encoding="utf-8")
    source = (FIXTURES / "shuffled.py").read_text(encoding="utf-8")
    assert source.rstrip() in guide
    monkeypatch.syspath_prepend(str(FIXTURES))
    monkeypatch.setitem(OBJECTIVES, "shuffled", "shuffled:ShuffledTokenDetection")  # the one registry line

    # its corruption: the picked tokens change places, nothing else changes, labels say which moved
    shuffle_selected = __import__("shuffled").shuffle_selected
    ids = torch.arange(100, 140).view(2, 20)
    picked = torch.zeros_like(ids, dtype=torch.bool)
    picked[:, ::3] = True
    out = shuffle_selected(ids, picked, torch.Generator().manual_seed(0))
    assert torch.equal(out[~picked], ids[~picked])
    for row in range(2):
        assert sorted(out[row][picked[row]].tolist()) == ids[row][picked[row]].tolist()
    assert bool((out != ids).any())
    assert get_objective("shuffled").heads == ("discriminator",)

    text = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")[:40_000]
    (tmp_path / "train.txt").write_text(text, encoding="utf-8")
    run = {
        "model": {"preset": "bert-tiny", "max_positions": 64, "d_model": 32, "n_heads": 2, "d_ff": 64,
                  "dropout": 0.0, "attn_dropout": 0.0},
        "objective": {"name": "shuffled", "shuffle_prob": 0.3},
        "data": {"train": [str(tmp_path / "train.txt")], "val_fraction": 0.1,
                 "tokenizer": {"algo": "bytelevel", "vocab_size": 320}},
        "train": {"max_steps": 30, "batch_size": 8, "seq_len": 32, "lr": 3e-3, "warmup_steps": 2,
                  "eval_every": 30, "checkpoint_every": 30, "threads": 1, "precision": "fp32",
                  "progress": "off", "seed": 0},
    }
    pretrain(run, tmp_path / "run", log=lambda msg: None)
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r and "step" in r]
    assert len(losses) == 30
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.05, losses

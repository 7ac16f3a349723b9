"""Fixtures for the trainer tests: small token shards built from real text (seconds, once per session)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory, data_dir):
    """{"tokenizer", "train", "val"}: a 320-token byte-level BPE and shards of real text.

    train: the first 120 KB of tiny Shakespeare (paragraph documents); val: the first 40 KB of
    WikiText-2 valid, each prepared with `lmlab.data.prepare_shards`.
    """
    from lmlab.data import prepare_shards
    from lmlab.tokenizers import train_tokenizer

    root = tmp_path_factory.mktemp("tiny_data")
    shakespeare = (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")
    wiki = (data_dir / "pretrain" / "wikitext-2" / "wiki.valid.tokens").read_text(encoding="utf-8")
    (root / "train.txt").write_text(shakespeare[:120_000], encoding="utf-8")
    (root / "val.txt").write_text(wiki[:40_000], encoding="utf-8")
    tok = train_tokenizer("bytelevel", shakespeare[:60_000].splitlines(keepends=True), vocab_size=320)
    tok.save(root / "tok")
    prepare_shards(root / "tok", [root / "train.txt"], root / "train", workers=1, progress=False)
    prepare_shards(root / "tok", [root / "val.txt"], root / "val", workers=1, progress=False)
    return {"root": root, "tokenizer": root / "tok", "train": root / "train", "val": root / "val"}


@pytest.fixture(scope="session")
def tiny_config(tiny_data):
    """``tiny_config(**train_overrides)``: a TOML-shaped run config on the tiny shards."""
    return lambda **train: make_tiny_config(tiny_data, **train)


def make_tiny_config(tiny_data, **train) -> dict:
    """A 1-layer GPT-2 on the tiny shards (dropout on, to exercise the RNG)."""
    cfg = {
        "model": {
            "preset": "gpt2-tiny",
            "d_model": 32,
            "n_layers": 1,
            "n_heads": 2,
            "d_ff": 64,
            "max_positions": 64,
            "dropout": 0.1,
            "attn_dropout": 0.1,
        },
        "objective": {"name": "clm"},
        "data": {"train": [str(tiny_data["train"])], "val": [str(tiny_data["val"])]},
        "train": {
            "max_steps": 8,
            "batch_size": 4,
            "seq_len": 32,
            "lr": 3e-3,
            "min_lr": 3e-4,
            "warmup_steps": 2,
            "decay_steps": 20,
            "eval_every": 4,
            "eval_batches": 2,
            "checkpoint_every": 4,
            "threads": 1,
            "precision": "fp32",
            "progress": "off",
            "seed": 7,
        },
    }
    cfg["train"].update(train)
    return cfg

"""A tiny text recipe, and the one line a recipe refused with: shared by the config tests."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from lmlab.config import load_config
from lmlab.errors import LmlabError


def tiny_recipe(folder: Path) -> dict:
    """A gpt2-tiny causal LM on two small text files of ``folder``, a byte-level tokenizer."""
    (folder / "train.txt").write_text("the cat sat on the mat.\n\n" * 40, encoding="utf-8")
    (folder / "val.txt").write_text("a dog sat on a log.\n\n" * 10, encoding="utf-8")
    return {"model": {"preset": "gpt2-tiny"}, "objective": {"name": "clm"},
            "data": {"train": [str(folder / "train.txt")], "val": [str(folder / "val.txt")],
                     "tokenizer": {"algo": "bytelevel", "vocab_size": 300}},
            "train": {"max_steps": 4, "batch_size": 4, "seq_len": 32, "threads": 1, "progress": "off"}}


def refused(recipe: dict, overrides) -> str:
    """The one-line error ``load_config(recipe, overrides)`` raises."""
    with pytest.raises(LmlabError) as e:
        load_config(copy.deepcopy(recipe), overrides)
    assert "\n" not in str(e.value)
    return str(e.value)

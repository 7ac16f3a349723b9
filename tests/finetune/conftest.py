"""Fixtures shared by the fine-tuning tests."""

from __future__ import annotations

import pytest
import torch

from lmlab.models import build_model, get_preset
from lmlab.tokenizers import load_tokenizer


@pytest.fixture(scope="module")
def ckpt(minilm_dir, tmp_path_factory):
    """A random bert-tiny saved with the real MiniLM WordPiece vocabulary."""
    torch.manual_seed(0)
    model = build_model(get_preset("bert-tiny", vocab_size=30522))
    d = tmp_path_factory.mktemp("ck") / "bert-tiny"
    model.save(d, tokenizer=load_tokenizer(minilm_dir))
    return d

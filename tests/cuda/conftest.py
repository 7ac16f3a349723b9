"""The CUDA tier: tests that need an NVIDIA GPU, marked ``cuda`` and skipped (counted as skipped)
where ``torch.cuda.is_available()`` is False, so a CPU run (CI) reports them and never runs them.

Everything here reads only what travels with the repository (the built-in corpus under
``src/lmlab/assets``), never ``$LMLAB_DATA``: a GPU machine lent for a check has the checkout
and nothing beside it. ``benchmarks/gpu_check.sh`` runs this folder (docs/gpu.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

HERE = Path(__file__).resolve().parent
REASON = "CUDA tier: no CUDA device here (torch.cuda.is_available() is False); see docs/gpu.md"


def pytest_collection_modifyitems(config, items):
    """Every test of this folder is marked ``cuda``; without a GPU each is skipped, with the reason."""
    has_cuda = torch.cuda.is_available()
    for item in items:
        if HERE not in Path(item.path).resolve().parents:
            continue
        item.add_marker(pytest.mark.cuda)
        if not has_cuda:
            item.add_marker(pytest.mark.skip(reason=REASON))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> dict[str, Path]:
    """Train and validation text cut from the built-in corpus, and a cache folder the runs share
    (the tokenizer and token shards are made once)."""
    from lmlab.demo import builtin_corpus_path

    text = builtin_corpus_path().read_text(encoding="utf-8")
    root = tmp_path_factory.mktemp("cuda_corpus")
    (root / "train.txt").write_text(text[:120_000], encoding="utf-8")
    (root / "val.txt").write_text(text[-30_000:], encoding="utf-8")
    return {"train": root / "train.txt", "val": root / "val.txt", "cache": root / "cache"}

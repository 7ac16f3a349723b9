"""Configs and helpers of the CUDA tier (tests/cuda): tiny runs of every objective, as its recipe
in configs/ builds the model and the objective, on the built-in corpus."""

from __future__ import annotations

import json
import math
import tomllib
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]

#: objective -> its recipe (the model preset and objective settings come from there)
RECIPES = {
    "clm": "gpt-tiny-clm.toml",
    "mlm": "bert-tiny-mlm.toml",
    "nsp": "bert-tiny-nsp.toml",
    "spanbert": "spanbert-tiny.toml",
    "electra": "electra-tiny.toml",
    "t5": "t5-tiny-spans.toml",
    "bart": "bart-tiny.toml",
    "prefix_lm": "prefix-lm-tiny.toml",
    "unilm": "unilm-tiny.toml",
    "xlnet": "xlnet-tiny.toml",
    "transfo-xl": "transfo-xl-tiny.toml",
    "elmo": "elmo-tiny.toml",
}


def run_config(objective: str, corpus: dict[str, Path], device: str = "cuda", **train: Any) -> dict[str, Any]:
    """A few steps of ``objective`` with its recipe's model and objective tables, shrunk (width 64
    stays, sequences of 64 tokens, 4 rows) on the built-in corpus with a 320-token byte-level BPE."""
    recipe = tomllib.loads((ROOT / "configs" / RECIPES[objective]).read_text(encoding="utf-8"))
    model = dict(recipe["model"])
    if "vocab_size" in model:  # T5: the recipe's vocabulary plus its sentinels; here the small one's
        del model["vocab_size"]
    cfg = {
        "model": model,
        "objective": dict(recipe["objective"]),
        "data": {
            "train": [str(corpus["train"])],
            "val": [str(corpus["val"])],
            "tokenizer": {"algo": "bytelevel", "vocab_size": 320},
            "cache_dir": str(corpus["cache"]),
        },
        "train": {
            "max_steps": 3,
            "batch_size": 4,
            "seq_len": 64,
            "lr": 1e-3,
            "min_lr": 1e-4,
            "warmup_steps": 1,
            "decay_steps": 10,
            "eval_every": 3,
            "eval_batches": 2,
            "eval_at_start": False,
            "checkpoint_every": 3,
            "threads": 2,
            "device": device,
            "precision": "bf16" if device == "cuda" else "fp32",
            "progress": "off",
            "seed": 3,
        },
    }
    if objective == "transfo-xl":  # segments of the recipe's 32 tokens need whole multiples
        cfg["train"]["seq_len"] = 64
    cfg["train"].update(train)
    return cfg


def rows(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def finite(x) -> bool:
    return x is not None and math.isfinite(float(x))


QUIET = lambda m: None  # noqa: E731


def tiny_tokenizer(corpus: dict[str, Path], vocab_size: int = 320):
    """A byte-level BPE trained on the start of the built-in corpus (a second or two)."""
    from lmlab.tokenizers import train_tokenizer

    text = corpus["train"].read_text(encoding="utf-8")[:40_000]
    return train_tokenizer("bytelevel", text.splitlines(keepends=True), vocab_size=vocab_size)


def tiny_model(preset: str, tok, seed: int = 0, **overrides):
    """A small random model of ``preset`` with ``tok`` attached (what a checkpoint would hold)."""
    import torch

    from lmlab.models import build_model, get_preset

    torch.manual_seed(seed)
    extra = {"max_positions": 128} if preset.startswith(("gpt2", "bert")) else {}
    model = build_model(get_preset(preset, vocab_size=tok.vocab_size, **{**extra, **overrides}), heads=None)
    model.tokenizer = tok
    return model


#: the words whose lines are labelled "1" in the synthetic classification task
MARKERS = ("love", "king", "good", "lord", "sweet")


def labelled_lines(corpus: dict[str, Path], n: int, offset: int = 0):
    """``n`` lines of the built-in corpus as classification examples: "1" when the line holds one of
    :data:`MARKERS`, else "0" (a task a tiny model learns in a few dozen steps)."""
    from lmlab.tasks.readers import Example

    text = corpus["train"].read_text(encoding="utf-8")
    lines = [ln.strip() for ln in text.splitlines() if len(ln.strip()) > 20]
    chosen = lines[offset:offset + n]
    return [Example(line, label="1" if any(w in line.lower().split() for w in MARKERS) else "0",
                    where=f"line {offset + i}") for i, line in enumerate(chosen)]

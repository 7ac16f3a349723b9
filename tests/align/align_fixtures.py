"""Tiny models and a learnable synthetic preference set for the preference-tuning tests."""

from __future__ import annotations

import functools
import json
import random

import torch

from lmlab.align import PreferencePair
from lmlab.models import build_model, get_preset
from lmlab.tokenizers import train_tokenizer

WORDS = ["cat", "mat", "red", "blue", "sat", "the", "dog", "sun"]
GOOD = {"cat", "red", "sat", "dog"}


@functools.cache
def _tokenizer_json():
    tok = train_tokenizer("bytelevel", ["the cat sat on the mat. the dog saw the red sun, yes or no? " * 30],
                          vocab_size=300)
    return tok.to_hf_json(), tok.tokenizer_config()


def tiny_tokenizer():
    """A fresh copy of one small byte-level BPE tokenizer (trained once per session)."""
    from lmlab.tokenizers.bytelevel import ByteLevelBPETokenizer

    return ByteLevelBPETokenizer._from_hf(*_tokenizer_json())


def tiny_model(preset: str = "gpt2-tiny", seed: int = 0, **overrides):
    tok = tiny_tokenizer()
    torch.manual_seed(seed)
    extra = {"max_positions": 64} if preset.startswith("gpt2") else {}
    model = build_model(get_preset(preset, vocab_size=tok.vocab_size, **{**extra, **overrides}), heads=None)
    model.tokenizer = tok
    return model.eval()


def synthetic_pairs(n: int, seed: int) -> list[PreferencePair]:
    """``"<word>:"`` answered " yes" for four words and " no" for the other four."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        w = rng.choice(WORDS)
        good, bad = (" yes", " no") if w in GOOD else (" no", " yes")
        out.append(PreferencePair(f"{w}:", good, bad))
    return out


def write_pairs(path, pairs):
    """``pairs`` as a JSON Lines file of prompt, chosen and rejected, as lmlab align reads them."""
    lines = [json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected}) for p in pairs]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path

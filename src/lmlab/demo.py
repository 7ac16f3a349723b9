"""`lmlab demo`: the main job on built-in data.

Stage 1 (now): train a byte-level BPE tokenizer on the built-in Shakespeare corpus and show what
it learned. Later stages add a short GPT pretraining run and a sample generation.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path


def builtin_corpus_path() -> Path:
    """Path of the built-in corpus (tiny Shakespeare, public domain; see assets/ATTRIBUTION.md)."""
    return Path(str(resources.files("lmlab") / "assets" / "tinyshakespeare.txt"))


def run_demo(out: str | Path = "runs/demo", vocab_size: int = 2000, algo: str = "bytelevel") -> dict:
    from lmlab.fileio import read_text
    from lmlab.tokenizers import train_tokenizer

    corpus_path = builtin_corpus_path()
    text = read_text(corpus_path)
    lines = text.splitlines(keepends=True)
    held_out = "".join(lines[-2000:])
    train = lines[:-2000]
    print(f"[1/1] training a {algo} tokenizer ({vocab_size} tokens) on {corpus_path.name} "
          f"({len(text) / 1e6:.2f} MB, {len(lines)} lines)")
    t0 = time.perf_counter()
    tok = train_tokenizer(algo, train, vocab_size=vocab_size, progress=True)
    secs = time.perf_counter() - t0
    out = Path(out)
    tok.save(out / "tokenizer")
    ids = tok.encode(held_out)
    bpt = len(held_out.encode("utf-8")) / max(1, len(ids))
    example = "To be, or not to be, that is the question."
    pieces = tok.tokenize(example)
    print(f"  learned {tok.vocab_size} tokens in {secs:.1f}s; saved to {out / 'tokenizer'}/")
    print(f"  held-out compression: {bpt:.2f} bytes per token ({len(ids)} tokens for "
          f"{len(held_out.encode('utf-8'))} bytes)")
    print(f"  example: {example!r}")
    print(f"        -> {' | '.join(pieces)}")
    assert tok.decode(tok.encode(example)) == example
    return {"vocab_size": tok.vocab_size, "bytes_per_token": bpt, "example": pieces}

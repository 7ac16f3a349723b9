"""`lmlab demo`: the whole job on built-in data, in a few minutes on a laptop CPU.

1. train a byte-level BPE tokenizer on the built-in Shakespeare corpus (all but the last 2,000
   lines) and show what it learned;
2. pretrain a tiny GPT-2 (causal LM, :func:`lmlab.train.pretrain`) on the same text, validated on
   the held-out last 2,000 lines, with a progress bar;
3. load the final checkpoint and sample a continuation of a prompt (:func:`lmlab.generate.generate`).
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path

from lmlab.ownership import check_replaceable_dir, claimed_dir, remove_owned_tree
from lmlab.stopping import Stopped

#: what the demo writes in its folder; nothing else there is ever touched
DEMO_ENTRIES = ("tokenizer", "train.txt", "val.txt", "run")

def builtin_corpus_path() -> Path:
    """Path of the built-in corpus (tiny Shakespeare, public domain; see assets/ATTRIBUTION.md)."""
    return Path(str(resources.files("lmlab") / "assets" / "tinyshakespeare.txt"))


def demo_config(out: Path, steps: int, device: str = "auto") -> dict:
    """The demo's run: gpt2-tiny on the built-in text, its own tokenizer, ~1,000 tokens per step."""
    return {
        "model": {"preset": "gpt2-tiny", "dropout": 0.0, "attn_dropout": 0.0},
        "objective": {"name": "clm"},
        "data": {
            "train": [str(out / "train.txt")],
            "val": [str(out / "val.txt")],
            "tokenizer": str(out / "tokenizer"),
        },
        "train": {
            "max_steps": steps,
            "batch_size": 8,
            "seq_len": 128,
            "lr": 3e-3,
            "min_lr": 3e-4,
            "warmup_steps": max(1, steps // 10),
            "eval_every": max(1, steps // 4),
            "eval_batches": 8,
            "checkpoint_every": steps,
            "keep_checkpoints": 1,
            "seed": 0,
            "progress": "auto",
            "device": device,
        },
    }


def run_demo(
    out: str | Path = "runs/demo",
    vocab_size: int = 2000,
    algo: str = "bytelevel",
    steps: int = 300,
    prompt: str = "ROMEO:",
    sample_tokens: int = 60,
    device: str = "auto",
) -> dict:
    from lmlab.fileio import read_text
    from lmlab.runtime import check_device
    from lmlab.text_input import check_text
    from lmlab.tokenizers import check_training

    check_text(prompt, "the prompt (--prompt)")  # before minutes of training, not after
    check_device(device)  # before the tokenizer is trained and the folder filled
    check_training(algo, vocab_size, None, {})  # a vocabulary too small: before the folder and "[1/3]"
    t_all = time.perf_counter()
    corpus_path = builtin_corpus_path()
    text = read_text(corpus_path)
    lines = text.splitlines(keepends=True)
    # the demo's folder: new or an earlier demo's (lmlab.ownership); a folder of other files is refused;
    # given back if the demo stops before writing anything there
    with claimed_dir(out, "demo", DEMO_ENTRIES) as folder:
        return _run_in(folder, text, lines, corpus_path, vocab_size, algo, steps, prompt, sample_tokens,
                       device, t_all)


def _run_in(out: Path, text: str, lines: list[str], corpus_path: Path, vocab_size: int, algo: str,
            steps: int, prompt: str, sample_tokens: int, device: str, t_all: float) -> dict:
    """The demo's three stages, in its claimed folder ``out``."""
    from lmlab.fileio import atomic_write_text
    from lmlab.tokenizers import train_tokenizer
    from lmlab.train import pretrain

    held_out = "".join(lines[-2000:])
    train = lines[:-2000]
    # the demo always starts fresh: an earlier demo's run goes first (only when all in it is what
    # lmlab wrote there, unchanged; else one line, before any work), once every entry the demo
    # replaces is known to be replaceable: a refusal deletes nothing
    check_replaceable_dir(out / "tokenizer", "tokenizer")
    remove_owned_tree(out, "run")
    print(
        f"[1/3] training a {algo} tokenizer ({vocab_size} tokens) on {corpus_path.name} "
        f"({len(text) / 1e6:.2f} MB, {len(lines)} lines)"
    )
    t0 = time.perf_counter()
    tok = train_tokenizer(algo, train, vocab_size=vocab_size, progress=True)
    secs = time.perf_counter() - t0
    tok.save(out / "tokenizer")
    ids = tok.encode(held_out)
    bpt = len(held_out.encode("utf-8")) / max(1, len(ids))
    example = "To be, or not to be, that is the question."
    pieces = tok.tokenize(example)
    print(f"  learned {tok.vocab_size} tokens in {secs:.1f}s; saved to {out / 'tokenizer'}/")
    print(
        f"  held-out compression: {bpt:.2f} bytes per token ({len(ids)} tokens for "
        f"{len(held_out.encode('utf-8'))} bytes)"
    )
    print(f"  example: {example!r}")
    print(f"        -> {' | '.join(pieces)}")
    assert tok.decode(tok.encode(example)) == example

    print(
        f"[2/3] pretraining gpt2-tiny (causal LM) for {steps} steps on the other {len(train)} lines, "
        f"validating on the last 2000"
    )
    atomic_write_text(out / "train.txt", "".join(train))
    atomic_write_text(out / "val.txt", held_out)
    run_dir = out / "run"
    try:
        summary = pretrain(demo_config(out, steps, device), run_dir,
                           log=lambda m: print(f"  {m}", flush=True))
    except Stopped as e:  # the demo has no --resume: it starts over
        raise e.with_fix("run the same command again (the demo starts over)") from None
    print(
        f"  val loss {summary['initial_val_loss']:.3f} -> {summary['val_loss']:.3f} "
        f"(perplexity {summary['val_ppl']:.1f}, {summary['val_bpb']:.3f} bits/byte) after "
        f"{summary['tokens']:,} tokens at {summary['tokens_per_s']:,.0f} tokens/s"
    )
    print(
        f"  metrics: {run_dir / 'metrics.jsonl'}, curve: {run_dir / 'loss.png'}, "
        f"model: {summary['checkpoint']}"
    )

    print(f"[3/3] sampling {sample_tokens} tokens after {prompt!r}")
    sample = generate_sample(summary["checkpoint"], prompt, sample_tokens, device=device)
    print("  " + "\n  ".join((prompt + sample).splitlines()))
    total = time.perf_counter() - t_all
    print(f"done in {total:.0f}s")
    return {
        "vocab_size": tok.vocab_size,
        "bytes_per_token": bpt,
        "example": pieces,
        "initial_val_loss": summary["initial_val_loss"],
        "val_loss": summary["val_loss"],
        "sample": sample,
        "seconds": total,
        "run_dir": str(run_dir),
    }


def generate_sample(checkpoint: str | Path, prompt: str, max_new_tokens: int = 60, seed: int = 0,
                    device: str = "auto") -> str:
    """Sample a continuation (top-k 40, temperature 0.8) from a trained checkpoint on ``device``."""
    import torch

    from lmlab.loading import load_model
    from lmlab.runtime import pick_device

    dev = pick_device(device)
    model = load_model(checkpoint).to(dev)
    tok = model.tokenizer
    ids = torch.tensor([tok.encode(prompt)], device=dev)
    try:
        from lmlab.generate import generate
    except ImportError:  # pragma: no cover - generation package missing: greedy decoding inline
        generate = None
    with torch.no_grad():
        if generate is not None:
            out = generate(
                model,
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=True,
                top_k=40,
                temperature=0.8,
                seed=seed,
                eos_token_id=[],
            )
        else:
            out = ids
            for _ in range(max_new_tokens):
                nxt = model(out[:, -model.config.max_positions :]).logits[:, -1].argmax(-1, keepdim=True)
                out = torch.cat([out, nxt], 1)
    return continuation_text(tok, ids[0].tolist(), out[0, ids.shape[1] :].tolist())


def continuation_text(tok, prompt_ids: list[int], new_ids: list[int]) -> str:
    """The text ``new_ids`` add after the prompt, as the tokenizer writes the whole: decoded together
    with the prompt, so a WordPiece ``##`` piece joins the word before it (decoded alone it keeps
    its ``##``), special tokens dropped first (each would cut the text into runs decoded apart)."""
    special = tok.special_ids
    prompt = [i for i in prompt_ids if i not in special]
    whole = tok.decode(prompt + [i for i in new_ids if i not in special])
    before = tok.decode(prompt)
    if whole.startswith(before):
        return whole[len(before):]
    return tok.decode([i for i in new_ids if i not in special])  # a decoding that rewrote the prompt's end

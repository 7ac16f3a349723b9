"""Quality per compute: lmlab's GPT trained by ``pretrain()`` vs Hugging Face ``GPT2LMHeadModel``.

Both models are trained on the **same token windows** for the same token budget with the same
settings, then evaluated on the same validation windows; the report gives both validation losses
(nats/token) and bits per byte. Target (issue 4): lmlab's loss equals or beats transformers'.

* **Data.** ``shakespeare-char``: tiny Shakespeare at character level (the byte-level tokenizer
  with no merges, vocabulary 256 bytes + 7 specials; the text is ASCII, so 1 token = 1 character),
  first 90% train / last 10% validation as in nanoGPT's ``shakespeare_char``. ``english-mix``:
  a byte-level BPE of 8,192 tokens trained on ``$LMLAB_DATA/pretrain/english-mix`` (the two
  latin-1 files are decoded as latin-1 and re-saved as UTF-8 in the cache first), trained on
  that text and validated on WikiText-2 valid. Text is tokenised once with
  ``lmlab.data.prepare_shards`` into a cache directory (reused while the inputs are unchanged).
* **lmlab side**: ``lmlab.train.pretrain`` on the shards (its real path: packing, the CLM
  objective, AdamW groups, warmup + cosine schedule, clipping).
* **transformers side**: ``GPT2LMHeadModel`` of the same shape (gelu_new, LayerNorm eps 1e-5,
  tied head) starting from the very weights ``pretrain()`` starts from (``--init same``, the
  default: exported with ``lmlab.interop.hf_export``; both losses at step 0 are then equal), or
  from transformers' own draw of the same GPT-2 init (``--init own``: N(0, 0.02), residual
  projections scaled by 1/sqrt(2 L), as lmlab's), trained by a
  plain loop on the batches of lmlab's own :class:`~lmlab.data.packing.PackedWindows` with the
  same seed (so step ``k`` of both runs sees identical rows), the same AdamW parameter groups
  (``lmlab.train.optim.param_groups``: no decay on biases, norms and embeddings), the same
  learning rate at every step (``lr_at``) and the same clipping. ``input_ids = labels =`` the
  window, as ``run_clm.py`` does.
* **Evaluation**: the same validation windows (``eval_starts``: evenly spread, non-overlapping)
  for both models, ``model(input_ids=w, labels=w).loss`` averaged over windows (every window
  predicts ``seq_len - 1`` tokens); bits per byte from the validation split's tokens per byte.
  The trainer's own validation loss of the lmlab run is shown as a cross-check.

``--doc-separator file`` (default) treats every file as one document, so both sides see exactly
the same attention pattern (one stream, as nanoGPT and ``run_clm.py``'s ``group_texts``).
``--doc-separator blank-line`` makes paragraphs documents: lmlab then masks attention between
them and restarts positions (its packing), while transformers sees the same windows unmasked.

    python benchmarks/pretrain_quality.py --threads 1                     # default budgets
    python benchmarks/pretrain_quality.py --budget-tokens 600000 --datasets english-mix
    python benchmarks/pretrain_quality.py --quick --no-write              # smoke run, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

SECTION = "pretrain_quality"
DATASETS = ("shakespeare-char", "english-mix")
#: "equal" = within this many nats/token (well below the seed-to-seed spread of such short runs)
TOLERANCE = 0.01
CACHE_ENV = "LMLAB_BENCH_CACHE"


# ------------------------------------------------------------- data (shared with pretrain_throughput)
@dataclass
class Corpus:
    """Token shards of one benchmark dataset (train and validation) and their tokenizer."""

    name: str
    train: Path            # shards directory (split "train")
    val: Path              # shards directory (split "train" holds the validation text)
    vocab_size: int
    description: str


def cache_root(cache: Path | None = None) -> Path:
    """Where tokenizers and shards are kept between runs: ``--cache``, ``$LMLAB_BENCH_CACHE`` or
    ``<tmp>/lmlab-pretrain-bench``."""
    return Path(cache or os.environ.get(CACHE_ENV) or Path(tempfile.gettempdir()) / "lmlab-pretrain-bench")


def _key(spec: dict) -> str:
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def _fingerprint(files: list[Path]) -> list:
    return [[str(f), f.stat().st_size, int(f.stat().st_mtime)] for f in files]


DESCRIPTIONS = {"shakespeare-char": "tiny Shakespeare, first 90% / last 10% (nanoGPT split)",
                "english-mix": "english-mix (14 files) / WikiText-2 valid"}


def _texts(name: str, quick: bool) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """``(train [(file name, text)], val [(file name, text)])`` of a dataset (slices with ``quick``)."""
    root = common.DATA / "pretrain"
    cut = (lambda t, n: t[:n].rsplit("\n", 1)[0] + "\n") if quick else (lambda t, n: t)
    if name == "shakespeare-char":
        text = common.read_corpus_file(root / "tinyshakespeare" / "input.txt")
        split = int(0.9 * len(text))
        return [("train.txt", cut(text[:split], 60_000))], [("val.txt", cut(text[split:], 12_000))]
    if name == "english-mix":
        files = sorted(f for f in (root / "english-mix").iterdir() if f.is_file())
        train = [(f.stem + ".txt", cut(common.read_corpus_file(f), 12_000)) for f in files]
        wiki = common.read_corpus_file(root / "wikitext-2" / "wiki.valid.tokens")
        val = [("wiki.valid.txt", cut(wiki, 40_000))]
        return train, val
    raise SystemExit(f"error: unknown dataset {name!r}; choose from {', '.join(DATASETS)}")


def prepare_corpus(name: str, quick: bool = False, doc_separator: str = "file",
                   cache: Path | None = None, log=print) -> Corpus:
    """Tokenizer + train/val shards of dataset ``name``, built once into the cache.

    ``shakespeare-char``: byte-level tokenizer with no merges (263 = 256 bytes + 7 specials).
    ``english-mix``: byte-level BPE, 8,192 tokens (512 with ``quick``), trained on the train text.
    """
    from lmlab.data.prepare import prepare_shards
    from lmlab.tokenizers import train_tokenizer
    from lmlab.tokenizers.base import DEFAULT_SPECIAL_TOKENS

    root = common.DATA / "pretrain"
    sources = sorted(p for p in root.rglob("*") if p.is_file())
    vocab = 256 + len(DEFAULT_SPECIAL_TOKENS) if name == "shakespeare-char" else (512 if quick else 8192)
    spec = {"name": name, "quick": quick, "sep": doc_separator, "vocab": vocab, "src": _fingerprint(sources),
            "v": 1}
    out = cache_root(cache) / f"{name}-{_key(spec)}"
    done = out / "corpus.json"
    if not done.is_file():
        t0 = time.perf_counter()
        train_texts, val_texts = _texts(name, quick)
        text_dir = out / "text"
        for sub, items in (("train", train_texts), ("val", val_texts)):
            (text_dir / sub).mkdir(parents=True, exist_ok=True)
            for fname, text in items:
                (text_dir / sub / fname).write_text(text, encoding="utf-8")
        docs = [t for _, t in train_texts]
        tok = train_tokenizer("bytelevel", (line for d in docs for line in d.split("\n")), vocab_size=vocab)
        tok.save(out / "tokenizer")
        for sub in ("train", "val"):
            files = sorted((text_dir / sub).iterdir())
            prepare_shards(out / "tokenizer", [str(f) for f in files], out / sub, workers=1,
                           doc_separator=doc_separator, progress=False)
        common_json = {"vocab_size": tok.vocab_size, "spec": spec}
        from lmlab.fileio import write_json

        write_json(done, common_json)
        log(f"{name}: tokenizer ({tok.vocab_size} tokens) and shards built in "
            f"{time.perf_counter() - t0:.0f} s under {out}")
    info = json.loads(done.read_text())
    return Corpus(name, out / "train", out / "val", info["vocab_size"], DESCRIPTIONS[name])


# --------------------------------------------------------------------------- settings
@dataclass
class Settings:
    """Model shape and training settings shared by both sides."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    d_ff: int = 512
    seq_len: int = 128
    batch: int = 16
    lr: float = 3e-3
    min_lr: float = 3e-4
    warmup_steps: int = 20
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    clip: float = 1.0
    eval_batches: int = 16
    seed: int = 1337
    threads: int = 1


QUICK = Settings(d_model=32, n_layers=1, n_heads=2, d_ff=64, seq_len=32, batch=4, warmup_steps=2,
                 eval_batches=2)
#: default token budget per dataset (a few minutes per model with 1 thread on a loaded 2-core machine)
BUDGETS = {"shakespeare-char": 300_000, "english-mix": 250_000}
QUICK_BUDGET = 4 * 32 * 6  # 6 steps


def model_overrides(s: Settings) -> dict[str, Any]:
    """The ``[model]`` table (without ``preset = "gpt2-tiny"``) at the benchmark shape."""
    return {"d_model": s.d_model, "n_layers": s.n_layers, "n_heads": s.n_heads, "d_ff": s.d_ff,
            "max_positions": s.seq_len, "dropout": 0.0, "attn_dropout": 0.0}


def lmlab_config(s: Settings, corpus: Corpus, steps: int, doc_separator: str) -> dict[str, Any]:
    """The recipe (TOML-shaped dict) ``pretrain()`` runs: gpt2 preset at the benchmark shape."""
    return {
        "model": {"preset": "gpt2-tiny", **model_overrides(s)},
        "objective": {"name": "clm"},
        "data": {"train": [str(corpus.train)], "val": [str(corpus.val)]},  # shards: cut by doc_separator
        "train": {"max_steps": steps, "batch_size": s.batch, "seq_len": s.seq_len, "lr": s.lr,
                  "min_lr": s.min_lr, "warmup_steps": s.warmup_steps, "decay_steps": steps,
                  "schedule": "cosine", "weight_decay": s.weight_decay, "betas": list(s.betas), "eps": s.eps,
                  "clip": s.clip, "grad_accum": 1, "eval_every": steps, "eval_batches": s.eval_batches,
                  "eval_at_start": True, "checkpoint_every": steps, "keep_checkpoints": 1, "log_every": 1,
                  "seed": s.seed, "threads": s.threads, "precision": "fp32", "device": "cpu",
                  "progress": "off"},
    }


def hf_gpt2(s: Settings, vocab_size: int, init: str = "same"):
    """``GPT2LMHeadModel`` with lmlab's gpt2 settings at shape ``s`` (no dropout).

    ``init="same"``: the very weights ``pretrain()`` starts from (the trainer seeds torch with the
    run's seed and builds the model; the same here, then ``lmlab.interop.hf_export``), so the two
    runs differ only in the training code. ``init="own"``: transformers' own GPT-2 init drawn
    from the same seed.
    """
    import transformers as tf

    if init == "same":
        from lmlab.interop import hf_export
        from lmlab.models import build_model, get_preset

        torch.manual_seed(s.seed)
        lm = build_model(get_preset("gpt2-tiny", **model_overrides(s),
                                    vocab_size=vocab_size), heads=("lm",))
        with tempfile.TemporaryDirectory() as tmp:
            hf_export(lm, tmp)
            return tf.GPT2LMHeadModel.from_pretrained(tmp)
    cfg = tf.GPT2Config(vocab_size=vocab_size, n_positions=s.seq_len, n_embd=s.d_model, n_layer=s.n_layers,
                        n_head=s.n_heads, n_inner=s.d_ff, activation_function="gelu_new", resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=1e-5, initializer_range=0.02,
                        tie_word_embeddings=True)
    torch.manual_seed(s.seed)
    return tf.GPT2LMHeadModel(cfg)


# --------------------------------------------------------------------------- evaluation and the HF loop
@torch.no_grad()
def evaluate(model, corpus: Corpus, s: Settings) -> float:
    """Mean next-token loss of ``model(input_ids=w).logits`` over the trainer's validation windows
    (:func:`lmlab.losses.causal_lm_loss`, for lmlab's model and transformers' alike)."""
    from lmlab.data.packing import eval_starts, read_windows
    from lmlab.data.shards import TokenShards
    from lmlab.losses import causal_lm_loss

    val = TokenShards(corpus.val, "train")
    starts = eval_starts(val, s.seq_len, s.eval_batches * s.batch)
    was_training = model.training
    model.eval()
    total = 0.0
    for i in range(0, len(starts), s.batch):
        ids = read_windows(val, starts[i:i + s.batch], s.seq_len).input_ids
        total += float(causal_lm_loss(model(input_ids=ids).logits, ids)) * len(ids)
    model.train(was_training)
    return total / len(starts)


def train_hf(s: Settings, corpus: Corpus, steps: int, vocab_size: int, init: str = "same") -> dict[str, Any]:
    """Train ``GPT2LMHeadModel`` on lmlab's windows with lmlab's optimizer settings; evaluate."""
    from lmlab.data.packing import PackedWindows
    from lmlab.data.shards import TokenShards
    from lmlab.runtime import set_threads
    from lmlab.train.config import TrainConfig
    from lmlab.train.loop import micro_seed
    from lmlab.train.optim import build_optimizer, lr_at, set_lr

    set_threads(s.threads)
    model = hf_gpt2(s, vocab_size, init)
    tc = TrainConfig(max_steps=steps, batch_size=s.batch, seq_len=s.seq_len, lr=s.lr, min_lr=s.min_lr,
                     warmup_steps=s.warmup_steps, decay_steps=steps, schedule="cosine",
                     weight_decay=s.weight_decay, betas=list(s.betas), eps=s.eps, clip=s.clip, seed=s.seed)
    initial = evaluate(model, corpus, s)
    optimizer = build_optimizer([model], tc)
    params = [p for g in optimizer.param_groups for p in g["params"]]
    windows = PackedWindows(TokenShards(corpus.train, "train"), s.seq_len, s.seed)
    model.train()
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        set_lr(optimizer, lr_at(step, tc))
        ids = windows.batch(step * s.batch, s.batch).input_ids   # the trainer's rows of this step
        torch.manual_seed(micro_seed(s.seed, step, 0))
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, s.clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
    seconds = time.perf_counter() - t0
    return {"val_loss": evaluate(model, corpus, s), "initial_val_loss": initial, "train_losses": losses,
            "seconds": seconds, "parameters": sum(p.numel() for p in model.parameters()),
            "tokens": steps * s.batch * s.seq_len}


def train_lmlab(s: Settings, corpus: Corpus, steps: int, doc_separator: str, run_dir: Path) -> dict[str, Any]:
    """``pretrain()`` on the corpus; the final model re-evaluated with :func:`evaluate`."""
    from lmlab.loading import load_model
    from lmlab.train import pretrain

    t0 = time.perf_counter()
    summary = pretrain(lmlab_config(s, corpus, steps, doc_separator), run_dir, log=lambda m: None)
    seconds = time.perf_counter() - t0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line]
    model = load_model(summary["checkpoint"])
    return {"val_loss": evaluate(model, corpus, s), "trainer_val_loss": summary["val_loss"],
            "initial_val_loss": summary["initial_val_loss"], "train_losses": [r["loss"] for r in rows],
            "seconds": seconds, "parameters": summary["parameters"], "tokens": summary["tokens"],
            "vocab_size": model.config.vocab_size}


def run_dataset(name: str, s: Settings, budget: int, args, log=print) -> dict[str, Any]:
    from lmlab.data.shards import TokenShards

    corpus = prepare_corpus(name, args.quick, args.doc_separator, args.cache, log)
    steps = max(1, budget // (s.batch * s.seq_len))
    with tempfile.TemporaryDirectory() as tmp:
        lm = train_lmlab(s, corpus, steps, args.doc_separator, Path(tmp) / "run")
    log(f"{name}: lmlab val loss {lm['val_loss']:.4f} ({lm['seconds']:.0f} s)")
    hf = train_hf(s, corpus, steps, lm["vocab_size"], args.init)
    log(f"{name}: transformers val loss {hf['val_loss']:.4f} ({hf['seconds']:.0f} s)")
    val = TokenShards(corpus.val, "train")
    for side in (lm, hf):
        side["val_bpb"] = val.bits_per_byte(side["val_loss"])
    train = TokenShards(corpus.train, "train")
    return {"dataset": name, "description": corpus.description, "vocab_size": lm["vocab_size"],
            "steps": steps, "train_tokens": train.num_tokens, "val_tokens": val.num_tokens,
            "lmlab": lm, "transformers": hf}


# --------------------------------------------------------------------------- report
def report(results: list[dict], s: Settings, header: str) -> str:
    headers = ["dataset", "tokenizer", "params lmlab / HF", "budget (tokens)", "val loss lmlab",
               "val loss HF", "lmlab − HF", "bits/byte lmlab / HF", "val loss at init lmlab / HF",
               "train s lmlab / HF",
               f"lmlab ≤ HF (+{TOLERANCE})"]
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r["dataset"], "failed", *["—"] * 8, "n/a"])
            continue
        lm, hf = r["lmlab"], r["transformers"]
        delta = lm["val_loss"] - hf["val_loss"]
        tok = "bytes (char level)" if r["dataset"] == "shakespeare-char" else "byte-level BPE"
        rows.append([
            r["dataset"], f"{tok}, {r['vocab_size']:,}", f"{lm['parameters']:,} / {hf['parameters']:,}",
            f"{lm['tokens']:,} ({r['steps']} steps)", f"{lm['val_loss']:.4f}", f"{hf['val_loss']:.4f}",
            f"{delta:+.4f}", f"{lm['val_bpb']:.3f} / {hf['val_bpb']:.3f}",
            f"{lm['initial_val_loss']:.4f} / {hf['initial_val_loss']:.4f}",
            f"{lm['seconds']:.0f} / {hf['seconds']:.0f}",
            "met" if delta <= TOLERANCE else "**missed**",
        ])
    notes = [f"- {r['dataset']}: failed: {r['error']}" for r in results if "error" in r]
    notes += [f"- {r['dataset']}: trainer's own validation loss {r['lmlab']['trainer_val_loss']:.4f} "
              f"(re-evaluated here: {r['lmlab']['val_loss']:.4f}); {r['train_tokens']:,} train / "
              f"{r['val_tokens']:,} validation tokens ({r['description']})"
              for r in results if "error" not in r]
    return "\n".join(["## Pretraining quality per compute (`benchmarks/pretrain_quality.py`)", "", header, "",
                      common.markdown_table(headers, rows), "", *notes, "", LEGEND.strip(), ""])


LEGEND = """
Both sides train the same GPT-2-shaped model on the **same windows in the same order** (the
transformers loop reads lmlab's `PackedWindows` with the run's seed) with the same AdamW groups,
learning rate at every step and clipping, from the same initial weights (`--init same`; with
`--init own` each library draws its own, and differences of a few hundredths can be init noise),
and are evaluated on the same validation windows: **val loss** = mean next-token NLL
(nats/token), **bits/byte** = val loss x tokens / (ln 2 x UTF-8 bytes) of the validation split.
The verdict counts lmlab as "equal" within +0.01 nats. **train s** = wall time of the whole
`pretrain()` call (setup, evaluations at step 0 and at the end, checkpoint and loss plot
included; tokenizer and shards are cached) and of the transformers training loop alone: not a
speed comparison (that is `pretrain_throughput.py`).
"""


def header_lines(s: Settings, args, load_start: tuple, started: float) -> str:
    import importlib.metadata as md

    busy = max(load_start[0], os.getloadavg()[0]) > (os.cpu_count() or 1)
    lines = [
        ("**Measured under load** (load average above the core count; other jobs shared the cores): "
         "wall times are rough, losses are not affected. " if busy else "")
        + f"Machine: {common.machine_line().split('; Python')[0]}, load {os.getloadavg()[0]:.2f} at the end; "
        f"torch {torch.__version__}, transformers {md.version('transformers')}.",
        f"Model: GPT-2 shape, d_model {s.d_model}, {s.n_layers} layers, {s.n_heads} heads, d_ff {s.d_ff}, "
        f"context {s.seq_len}, tied head, no dropout. Training: batch {s.batch} x {s.seq_len}, "
        f"AdamW lr {s.lr:g} (warmup {s.warmup_steps} steps, cosine to {s.min_lr:g}), "
        f"betas {tuple(s.betas)}, weight decay "
        f"{s.weight_decay}, clip {s.clip}, seed {s.seed}, fp32, {s.threads} thread(s); init `{args.init}`; "
        f"documents: `{args.doc_separator}`; evaluation on {s.eval_batches * s.batch} validation windows.",
        f"Run took {time.time() - started:.0f} s. Re-run: `{args.command}`",
    ]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny model, slices of text, 6 steps: a smoke run")
    ap.add_argument("--datasets", default=",".join(DATASETS), help="comma-separated subset")
    ap.add_argument("--budget-tokens", type=int, default=None,
                    help="training tokens per run (default: 300,000 shakespeare-char, 250,000 "
                         "english-mix; quick: 6 steps)")
    ap.add_argument("--threads", type=int, default=1, help="intra-op threads for both sides (default 1)")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--doc-separator", default="file", choices=("file", "blank-line", "line"),
                    help="what a document is when tokenising (default: each file one stream)")
    ap.add_argument("--init", default="same", choices=("same", "own"),
                    help="same: HF starts from lmlab's initial weights (default); own: its own draw")
    ap.add_argument("--cache", type=Path, default=None,
                    help=f"tokenizer/shard cache (default ${CACHE_ENV} or <tmp>/lmlab-pretrain-bench)")
    ap.add_argument("--markdown", type=Path, default=common.BENCHMARKS_MD, help="report file")
    ap.add_argument("--no-write", action="store_true", help="print the report only")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    args.command = " ".join(["python benchmarks/pretrain_quality.py", *given])
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    started, load_start = time.time(), os.getloadavg()
    s = dataclasses.replace(QUICK if args.quick else Settings(), threads=args.threads)
    if args.seed is not None:
        s.seed = args.seed
    results = []
    for name in [d.strip() for d in args.datasets.split(",") if d.strip()]:
        budget = args.budget_tokens or (QUICK_BUDGET if args.quick else BUDGETS.get(name, 250_000))
        try:
            results.append(run_dataset(name, s, budget, args))
        except Exception as err:  # one failed dataset costs its row, not the run
            results.append({"dataset": name, "error": f"{type(err).__name__}: {err}"[:300]})
            print(f"{name}: failed: {results[-1]['error']}", flush=True)
    text = report(results, s, header_lines(s, args, load_start, started))
    print(text)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    if not args.no_write:
        common.update_section(SECTION, text, args.markdown)
        print(f"wrote section {SECTION} of {args.markdown}")
    return results


if __name__ == "__main__":
    main()

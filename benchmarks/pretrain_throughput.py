"""Whole-step pretraining throughput: lmlab's trainer vs transformers vs a nanoGPT-style loop.

``model_throughput.py`` times the model alone on a fixed batch. This benchmark times the **whole
training step** the way each side really trains, all in one process, on the same real text
(english-mix, byte-level BPE 8,192, paragraphs as documents):

* **lmlab**: the trainer's own step (``lmlab.train.loop.Trainer.train_step``, after
  ``Trainer.setup`` on token shards): read packed windows (documents back to back, block-diagonal
  attention, positions reset), ``objective.prepare`` (MLM masking / T5 span corruption / CLM
  labels), forward + loss, backward, gradient clipping, AdamW with parameter groups, zero_grad.
* **transformers** with its own data path on the same windows: ``BertForMaskedLM`` fed by
  ``DataCollatorForLanguageModeling`` (15%, 80/10/10; as ``run_mlm.py``), ``GPT2LMHeadModel``
  with ``labels = input_ids`` (shifted inside, as ``run_clm.py``), ``T5ForConditionalGeneration``
  with span-corruption inputs made by a vectorised NumPy corruption (T5's
  ``random_spans_noise_mask``, as the span-corruption collator of transformers' Flax T5 example);
  then backward, clipping, AdamW, zero_grad.
* **plain PyTorch** (GPT only): a ~60-line nanoGPT-style GPT written below (token + position
  embedding, pre-norm blocks with ``F.scaled_dot_product_attention(is_causal=True)``, tied head,
  AdamW with nanoGPT's groups), same shape, same windows.

Steps run in interleaved rounds (every side once per round, order reversed every other round),
so load drift on a shared machine hits every side alike. Reported: **text tokens per second**
(batch x context tokens of text consumed per step, the same for every side), ratios, and
whole-step **MFU** = model FLOPs per step (``lmlab.models.flops.training_flops``: MLM head at
the 15% labelled positions, T5 at its nominal corrupted lengths) / step time / the fp32 matmul
rate measured in the same process (``matmul_peak.py``) before, after and between the timed
rounds, the best of all probes (load only ever slows a probe down).

    python benchmarks/pretrain_throughput.py                      # ~14M-parameter shapes
    python benchmarks/pretrain_throughput.py --threads 1 --steps 8 --objectives clm
    python benchmarks/pretrain_throughput.py --quick --no-write   # smoke run, seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from matmul_peak import QUICK_SIZES, SIZES, matmul_peak  # noqa: E402
from model_throughput import Shape, hf_model  # noqa: E402
from pretrain_quality import prepare_corpus  # noqa: E402

SECTION = "pretrain_throughput"
OBJECTIVES = ("mlm", "clm", "t5")
#: issue 4 targets: lmlab text tokens/s over the reference's
#: at least as fast as the reference (issue 26: 1.0x, not 1.2x; plain PyTorch models, simplicity first)
TARGETS = {("mlm", "transformers"): 1.0, ("t5", "transformers"): 1.0, ("clm", "plain PyTorch"): 1.0}
MFU_TARGET = 0.70
NUM_SENTINELS = 100
NOISE, MEAN_SPAN = 0.15, 3.0

FULL = Shape(batch=8, seq=256, d_model=384, layers=6, heads=6, d_ff=1536, vocab=8192)
QUICK = Shape(batch=2, seq=32, d_model=64, layers=2, heads=4, d_ff=256, vocab=512)


# --------------------------------------------------------------------------- nanoGPT-style reference
class Block(nn.Module):
    def __init__(self, d: int, heads: int, d_ff: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.out = nn.Linear(d, d_ff), nn.Linear(d_ff, d)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class PlainGPT(nn.Module):
    """GPT-2 in the style of nanoGPT: what a from-scratch PyTorch training loop looks like."""

    def __init__(self, vocab: int, context: int, d: int, layers: int, heads: int, d_ff: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.ModuleList(Block(d, heads, d_ff) for _ in range(layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied
        for name, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "out.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx, targets):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), targets.view(-1), ignore_index=-1)


def plain_optimizer(model: nn.Module) -> torch.optim.AdamW:
    """nanoGPT's ``configure_optimizers``: decay every matrix (embeddings too), not vectors."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95))


# --------------------------------------------------------------------------- span corruption for transformers
def noise_mask(length: int, rng: np.random.Generator, density: float = NOISE,
               mean_span: float = MEAN_SPAN) -> np.ndarray:
    """T5's ``random_spans_noise_mask``: alternating kept / noise segments, kept first."""
    n_noise = min(max(round(length * density), 1), length - 1)
    n_spans = max(round(n_noise / mean_span), 1)

    def segments(n: int) -> np.ndarray:
        cuts = np.sort(rng.permutation(n - 1)[: n_spans - 1] + 1)
        return np.diff(np.concatenate([[0], cuts, [n]]))

    lengths = np.stack([segments(length - n_noise), segments(n_noise)], axis=1).reshape(-1)
    is_noise = np.tile([False, True], n_spans)
    return np.repeat(is_noise, lengths)


def span_corrupt(ids: np.ndarray, rng: np.random.Generator, first_sentinel: int, eos: int) -> tuple:
    """Rows of ``ids`` -> ``(inputs, labels)`` arrays: each noise span becomes one sentinel in the
    input (``first_sentinel - k``, T5's ``<extra_id_k>`` order); the labels list each sentinel
    followed by its span, a final sentinel and EOS."""
    sources, targets = [], []
    for row in ids:
        mask = noise_mask(len(row), rng)
        start = mask & ~np.concatenate([[False], mask[:-1]])
        sentinel = first_sentinel - (np.cumsum(start) - 1)
        sources.append(np.concatenate([np.where(start, sentinel, row)[~mask | start], [eos]]))
        spans = np.flatnonzero(start[mask])
        body = np.insert(row[mask], spans, sentinel[start])
        targets.append(np.concatenate([body, [first_sentinel - len(spans), eos]]))
    return np.stack(sources), np.stack(targets)


def nominal_t5_lengths(seq: int) -> tuple[int, int]:
    """Source and target length of one corrupted window of ``seq`` tokens."""
    n_noise = min(max(round(seq * NOISE), 1), seq - 1)
    n_spans = max(round(n_noise / MEAN_SPAN), 1)
    return seq - n_noise + n_spans + 1, n_noise + n_spans + 2


# --------------------------------------------------------------------------- the timed sides
@dataclass
class Runner:
    """One side of a comparison: ``step()`` runs one whole training step on the next batch."""

    name: str
    step_fn: Callable[[], None]
    parameters: int
    times: list[float] = field(default_factory=list)

    def step(self) -> float:
        t0 = time.perf_counter()
        self.step_fn()
        return time.perf_counter() - t0


def lmlab_trainer(objective: str, s: Shape, corpus, threads: int, run_dir: Path, dropout: float):
    """A set-up ``Trainer`` for ``objective`` at shape ``s`` (its ``train_step`` is timed)."""
    from lmlab.train import distributed as dist_
    from lmlab.train import load_config
    from lmlab.train.loop import Trainer

    preset = {"mlm": "bert-tiny", "clm": "gpt2-tiny", "t5": "t5-tiny"}[objective]
    model = {"d_model": s.d_model, "n_layers": s.layers, "n_heads": s.heads, "d_ff": s.d_ff,
             "dropout": dropout}
    if objective != "t5":
        model.update(max_positions=s.seq, attn_dropout=dropout)
    config = {
        "model": {"preset": preset, **model},
        "objective": {"name": objective},
        "data": {"train": [str(corpus.train)], "val": [str(corpus.val)]},
        "train": {"max_steps": 10**6, "batch_size": s.batch, "seq_len": s.seq, "lr": 1e-4, "warmup_steps": 0,
                  "clip": 1.0, "threads": threads, "precision": "fp32", "device": "cpu", "progress": "off",
                  "seed": 0, "eval_at_start": False},
    }
    trainer = Trainer(load_config(config), run_dir, False, lambda msg: None)
    trainer.info = dist_.DistInfo()
    trainer.setup()
    return trainer


def hf_step(model: nn.Module, batch_fn: Callable[[], dict]) -> Callable[[], None]:
    """A transformers training step: the batch from its data path, forward, backward, clip, AdamW."""
    from lmlab.train.config import TrainConfig
    from lmlab.train.optim import build_optimizer

    optimizer = build_optimizer([model], TrainConfig())
    params = [p for g in optimizer.param_groups for p in g["params"]]
    model.train()

    def step():
        loss = model(**batch_fn()).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def count(model: nn.Module) -> int:
    """Distinct parameters (a tied matrix once)."""
    return sum(p.numel() for p in model.parameters())


def hf_tokenizer(corpus):
    """lmlab's tokenizer, loaded by transformers from its exported ``tokenizer.json``."""
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast(tokenizer_file=str(corpus.train / "tokenizer" / "tokenizer.json"),
                                   pad_token="[PAD]", mask_token="[MASK]", unk_token="[UNK]",
                                   cls_token="[CLS]", sep_token="[SEP]")


def setup_objective(objective: str, s: Shape, corpus, stream_corpus, threads: int, tmp: Path,
                    args) -> tuple[list[Runner], dict[str, Any]]:
    """The runners of one objective and what the report needs to know about them."""
    from lmlab.data.packing import PackedWindows
    from lmlab.data.shards import TokenShards
    from lmlab.models.flops import training_flops

    windows = PackedWindows(TokenShards(corpus.train, "train"), s.seq, seed=1)
    position = [0]

    def next_ids() -> torch.Tensor:  # the reference sides read the same packed windows
        ids = windows.batch(position[0], s.batch).input_ids
        position[0] += s.batch
        return ids

    trainer = lmlab_trainer(objective, s, corpus, threads, tmp / objective, args.dropout)
    cfg = trainer.model_config
    runners = [Runner("lmlab", trainer.train_step, trainer.model.num_parameters())]
    info: dict[str, Any] = {"objective": objective, "vocab": cfg.vocab_size, "seq": s.seq,
                            "dropout": args.dropout}
    shape = dataclasses.replace(s, vocab=cfg.vocab_size)

    if objective == "mlm":
        from transformers import DataCollatorForLanguageModeling

        collator = DataCollatorForLanguageModeling(hf_tokenizer(corpus), mlm_probability=0.15)

        def mlm_batch():  # what run_mlm.py's dataset rows look like after group_texts
            rows = next_ids().tolist()
            zeros = [0] * s.seq
            examples = [{"input_ids": r, "attention_mask": [1] * s.seq, "special_tokens_mask": zeros}
                        for r in rows]
            return dict(collator(examples))

        model = hf_model("bert", shape, args.dropout)
        runners.append(Runner("transformers", hf_step(model, mlm_batch), count(model)))
        flops = training_flops(cfg, s.seq, s.batch, logit_positions=round(0.15 * s.seq))
    elif objective == "clm":
        model = hf_model("gpt2", shape, args.dropout)

        def clm_batch():
            ids = next_ids()
            return {"input_ids": ids, "labels": ids}

        runners.append(Runner("transformers", hf_step(model, clm_batch), count(model)))
        torch.manual_seed(0)
        plain = PlainGPT(cfg.vocab_size, s.seq, s.d_model, s.layers, s.heads, s.d_ff)
        opt = plain_optimizer(plain)

        def plain_step():
            x = next_ids()
            y = torch.cat([x[:, 1:], torch.full_like(x[:, :1], -1)], dim=1)
            loss = plain(x, y)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(plain.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)

        runners.append(Runner("plain PyTorch", plain_step, count(plain)))
        if stream_corpus is not None:
            stream = lmlab_trainer("clm", s, stream_corpus, threads, tmp / "clm-stream", args.dropout)
            runners.insert(1, Runner("lmlab, one stream", stream.train_step, stream.model.num_parameters()))
        flops = training_flops(cfg, s.seq, s.batch)
    else:
        tok = trainer.objective.tokenizer
        first_sentinel = tok.token_to_id["<extra_id_0>"]
        eos = tok.eos_id if tok.eos_id is not None else 1
        rng = np.random.default_rng(0)
        src_len, tgt_len = nominal_t5_lengths(s.seq)
        shape = dataclasses.replace(shape, dec=tgt_len)
        model = hf_model("t5", shape, args.dropout)

        def t5_batch():
            # T5 orders sentinels downwards from the top id; lmlab appends them upwards: either
            # way 100 ids. Use ids counting down from the top so both models see in-range ids.
            src, tgt = span_corrupt(next_ids().numpy(), rng, cfg.vocab_size - 1, eos)
            return {"input_ids": torch.from_numpy(src), "labels": torch.from_numpy(tgt)}

        runners.append(Runner("transformers", hf_step(model, t5_batch), count(model)))
        flops = training_flops(cfg, src_len, s.batch, decoder_len=tgt_len)
        info.update(src_len=src_len, tgt_len=tgt_len, first_sentinel=first_sentinel)
    info["model_flops_per_step"] = flops
    return runners, info


def run_objective(objective: str, s: Shape, corpus, stream_corpus, threads: int, args,
                  peaks: list[dict]) -> dict[str, Any]:
    """Set up every side, warm up, then time interleaved rounds; after each round a short matmul
    probe is added to ``peaks`` (on a shared machine the CPU share drifts: a peak measured only
    before and after can be lower than the rate the steps themselves reached)."""
    with tempfile.TemporaryDirectory() as tmp:
        runners, info = setup_objective(objective, s, corpus, stream_corpus, threads, Path(tmp), args)
        for r in runners:
            for _ in range(args.warmup):
                r.step()
        for rnd in range(args.steps):
            for r in (runners if rnd % 2 == 0 else runners[::-1]):
                r.times.append(r.step())
            peaks.append(matmul_peak(args.probe_sizes, seconds=args.probe_seconds / 2, repeats=2))
    tokens = s.batch * s.seq
    info["tokens_per_step"] = tokens
    info["rows"] = {}
    for r in runners:
        med = statistics.median(r.times)
        info["rows"][r.name] = {"step_s": med, "tokens_per_s": tokens / med, "parameters": r.parameters,
                                "model_flops_per_s": info["model_flops_per_step"] / med, "times": r.times}
    return info


# --------------------------------------------------------------------------- report
NAMES = {"mlm": "MLM 15% (BERT)", "clm": "CLM (GPT-2)", "t5": "T5 span corruption"}
DATA_PATH = {
    ("mlm", "lmlab"): "trainer: packed docs, block-diagonal mask, dynamic masking",
    ("mlm", "transformers"): "DataCollatorForLanguageModeling",
    ("clm", "lmlab"): "trainer: packed docs, block-diagonal mask where a row has a boundary",
    ("clm", "lmlab, one stream"): "trainer: each file one document (no masks, like the others)",
    ("clm", "transformers"): "labels = input_ids",
    ("clm", "plain PyTorch"): "nanoGPT-style loop, is_causal SDPA",
    ("t5", "lmlab"): "trainer: span corruption per document, padded to the longest row",
    ("t5", "transformers"): "NumPy span corruption (fixed lengths, no padding)",
}


def report(results: list[dict], peak: float, header: str) -> str:
    headers = ["objective", "implementation", "data path", "params", "text tokens/s", "ms/step", "lmlab vs",
               "target", "verdict", "MFU", f"MFU ≥{MFU_TARGET:.0%}"]
    rows, notes = [], []
    for res in results:
        obj = res["objective"]
        if "error" in res:
            rows.append([NAMES[obj], "failed", *["—"] * 6, "n/a", "—", "n/a"])
            notes.append(f"- {obj}: failed: {res['error']}")
            continue
        ref_rows = {k: v for k, v in res["rows"].items() if not k.startswith("lmlab")}
        for name, row in res["rows"].items():
            is_lmlab = name.startswith("lmlab")
            ratios, targets, verdicts = [], [], []
            if is_lmlab:
                for ref, ref_row in ref_rows.items():
                    ratio = row["tokens_per_s"] / ref_row["tokens_per_s"]
                    ratios.append(f"{ratio:.2f}x {ref}")
                    target = TARGETS.get((obj, ref))
                    if target is not None:
                        targets.append(f"≥{target}x {ref}")
                        verdicts.append(common.verdict(ratio, target, higher_is_better=True))
            mfu = row["model_flops_per_s"] / peak
            mfu_verdict = common.verdict(mfu, MFU_TARGET, higher_is_better=True) if is_lmlab else "—"
            if is_lmlab and mfu > 1.0:  # impossible: the probes ran at a lower CPU share than the steps
                mfu_verdict = "n/a (peak under-measured)"
            rows.append([
                NAMES[obj], name, DATA_PATH.get((obj, name), ""), f"{row['parameters'] / 1e6:.2f}M",
                f"{row['tokens_per_s']:,.0f}", f"{row['step_s'] * 1e3:.0f}", "; ".join(ratios) or "—",
                "; ".join(targets) or "—", "; ".join(verdicts) or "—", f"{mfu:.0%}", mfu_verdict,
            ])
        counts = {r["parameters"] for r in res["rows"].values()}
        if len(counts) > 1:
            notes.append(f"- {obj}: parameter counts differ: "
                         + ", ".join(f"{k} {v['parameters']:,}" for k, v in res["rows"].items()))
        if obj == "t5":
            notes.append(f"- t5: vocabulary {res['vocab']:,} (tokenizer + {NUM_SENTINELS} sentinels); "
                         f"nominal source/target lengths {res['src_len']}/{res['tgt_len']} tokens per "
                         f"{res['seq']}-token window (the MFU numerator)")
            if res.get("dropout") == 0:
                notes.append("- t5 at dropout 0: both sides run the same matmuls at the same speed (op-level "
                             "profile), so this ratio is the data path and the non-matmul remainder; "
                             "lmlab's T5 lead in `model_throughput.py` is mostly its cheaper "
                             "dropout masks, which dropout 0 turns off")
    table = common.markdown_table(headers, rows)
    return "\n".join(["## Pretraining step throughput (`benchmarks/pretrain_throughput.py`)", "", header, "",
                      table, "", *notes, "" if notes else "", LEGEND.strip(), ""])


LEGEND = """
**text tokens/s** = batch x context tokens of text consumed per training step / median step
time over the timed steps (the same count for every side, whatever the objective feeds the model);
a step is everything a training loop does per batch: read the windows, the data path named in the
row, forward, loss, backward, clip to norm 1.0, AdamW, zero_grad. **lmlab vs** = lmlab's tokens/s
over each reference in the same run. **MFU** = model FLOPs per step (`lmlab.models.flops`: 6 x
matmul parameters per token + attention; the MLM vocabulary projection only at the 15% labelled
positions; T5 at its nominal source/target lengths) / step time / the best fp32 matmul rate
measured in the same process (before, between the timed rounds and after). A whole step also
spends time in embeddings, norms, softmax, masking and the optimizer, which the numerator does
not count. MFU above 100% means the probes caught a smaller CPU share than the steps did (a
loaded machine): its verdict is then `n/a`.
"""


def header_lines(args, threads_reason: str, peaks: list[dict], s: Shape, load_start: tuple,
                 started: float) -> str:
    import importlib.metadata as md

    load_end = os.getloadavg()
    busy = max(load_start[0], load_end[0]) > (os.cpu_count() or 1)
    peak = max(p["flops"] for p in peaks)
    rates = [p["flops"] / 1e9 for p in peaks]
    spread = (f"before {rates[0]:.1f}, after {rates[-1]:.1f}, {len(rates) - 2} probes between rounds "
              f"{min(rates[1:-1], default=0):.1f}-{max(rates[1:-1], default=0):.1f}")
    lines = [
        ("**Measured under load** (load average above the core count; other jobs shared the cores): treat "
         "absolute figures as rough, compare ratios. " if busy else "")
        + f"Machine: {common.machine_line().split('; Python')[0]}, load {load_end[0]:.2f} at the end; "
        f"torch {torch.__version__}, transformers {md.version('transformers')}.",
        f"Shape: batch {s.batch}, context {s.seq}, d_model {s.d_model}, {s.layers} layers (per stack), "
        f"{s.heads} heads, d_ff {s.d_ff}, vocabulary {s.vocab:,} (T5: + {NUM_SENTINELS} sentinels); "
        f"dropout {args.dropout}; fp32; text: english-mix, byte-level BPE; {args.warmup} warm-up + "
        f"{args.steps} timed steps per side, interleaved.",
        f"Threads: {threads_reason}. fp32 matmul rate (same process, same threads, best of all probes): "
        f"{peak / 1e9:.1f} GFLOP/s ({spread} GFLOP/s). "
        f"Run took {time.time() - started:.0f} s.",
        f"Re-run on a quiet machine: `{args.command}`",
    ]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="tiny shapes and text, 1+2 steps: a smoke run")
    ap.add_argument("--objectives", default=",".join(OBJECTIVES), help="comma-separated subset of mlm,clm,t5")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per side (default 5; quick 2)")
    ap.add_argument("--warmup", type=int, default=None, help="warm-up steps per side (default 2; quick 1)")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None, help="intra-op threads (default: auto)")
    ap.add_argument("--dropout", type=float, default=0.0, help="every dropout, all sides (default 0)")
    ap.add_argument("--no-stream-row", dest="stream_row", action="store_false",
                    help="skip the extra lmlab CLM row on one-stream data (saves tokenising the text twice)")
    ap.add_argument("--cache", type=Path, default=None, help="tokenizer/shard cache (as pretrain_quality.py)")
    ap.add_argument("--markdown", type=Path, default=common.BENCHMARKS_MD, help="report file")
    ap.add_argument("--no-write", action="store_true", help="print the report only")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw results here")
    args = ap.parse_args(argv)
    given = argv if argv is not None else sys.argv[1:]
    args.command = " ".join(["python benchmarks/pretrain_throughput.py", *given])
    args.steps = args.steps or (2 if args.quick else 5)
    args.warmup = args.warmup or (1 if args.quick else 2)
    return args


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    started, load_start = time.time(), os.getloadavg()
    from lmlab.runtime import choose_threads, set_threads

    threads, threads_reason = choose_threads(args.threads)
    set_threads(threads)
    s = dataclasses.replace(QUICK if args.quick else FULL)
    if args.batch:
        s.batch = args.batch
    objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    corpus = prepare_corpus("english-mix", args.quick, "blank-line", args.cache)
    stream = (prepare_corpus("english-mix", args.quick, "file", args.cache)
              if args.stream_row and "clm" in objectives else None)
    s.vocab = corpus.vocab_size
    sizes, seconds = (QUICK_SIZES, 0.05) if args.quick else (SIZES, 0.4)
    args.probe_sizes, args.probe_seconds = (sizes, seconds) if args.quick else ((1024,), seconds)
    peaks = [matmul_peak(sizes, seconds=seconds)]
    print(f"{threads_reason}\nfp32 matmul: {peaks[0]['flops'] / 1e9:.1f} GFLOP/s", flush=True)
    results = []
    for objective in objectives:
        t0 = time.time()
        try:
            res = run_objective(objective, s, corpus, stream, threads, args, peaks)
        except Exception as err:  # one broken objective costs its rows, not the run
            res = {"objective": objective, "error": f"{type(err).__name__}: {err}"[:300]}
        rates = {k: round(v["tokens_per_s"]) for k, v in res.get("rows", {}).items()}
        print(f"{objective}: {rates or res.get('error')} ({time.time() - t0:.0f} s)", flush=True)
        results.append(res)
    peaks.append(matmul_peak(sizes, seconds=seconds))
    peak = max(p["flops"] for p in peaks)
    text = report(results, peak, header_lines(args, threads_reason, peaks, s, load_start, started))
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"peaks": peaks, "results": results}, indent=1))
    if not args.no_write:
        common.update_section(SECTION, text, args.markdown)
        print(f"wrote section {SECTION} of {args.markdown}")
    return results


if __name__ == "__main__":
    main()
